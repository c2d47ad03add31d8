-- Version 14: who released a lease.
--
-- A release clears `holder`, so the acquisition that follows found no
-- previous holder to record and the takeover timeline said nothing of who
-- handed the lease over. A release now writes the releasing node into
-- `released_by`, and the next acquisition records it as the takeover's
-- `previous_holder` (reason `released`) and clears it. NULL on a lease
-- that was never released, or released before this version.
ALTER TABLE storage_leases ADD COLUMN released_by text;
