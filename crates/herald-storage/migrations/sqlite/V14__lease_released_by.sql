-- Version 14: who released a lease (see the PostgreSQL migration of the
-- same version).
ALTER TABLE storage_leases ADD COLUMN released_by TEXT;
