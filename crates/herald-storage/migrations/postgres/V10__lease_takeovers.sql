-- Version 10: why each lease was acquired, counted in the database.
--
-- Every acquisition adds one to the row of its lease and reason (`fresh`,
-- `released`, `expired`, `holder_gone`, `reclaimed`), in the acquire's
-- own transaction. Counters kept in a process are gone after the restart
-- that follows a watchdog stop; these survive every restart, so a node
-- can show the cluster's takeovers by reason from its first scrape on
-- (`herald_lease_takeovers_recorded`). A holder that its watchdog stopped
-- shows up here as the next holder's `expired` takeover.
CREATE TABLE lease_takeovers (
    name text NOT NULL,
    reason text NOT NULL,
    takeovers bigint NOT NULL CHECK (takeovers >= 0),
    last_token bigint NOT NULL,
    last_at timestamptz NOT NULL,
    PRIMARY KEY (name, reason)
);
