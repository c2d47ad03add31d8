-- Version 10: why each lease was acquired, counted in the database.
--
-- Every acquisition adds one to the row of its lease and reason (`fresh`,
-- `released`, `expired`, `holder_gone`, `reclaimed`), in the acquire's
-- own transaction. Counters kept in a process are gone after the restart
-- that follows a watchdog stop; these survive every restart, so a node
-- can show the takeovers by reason from its first scrape on
-- (`herald_lease_takeovers_recorded`). A holder that its watchdog stopped
-- shows up here as the next holder's `expired` takeover.
CREATE TABLE lease_takeovers (
    name TEXT NOT NULL,
    reason TEXT NOT NULL,
    takeovers INTEGER NOT NULL CHECK (takeovers >= 0),
    last_token INTEGER NOT NULL,
    last_at_ms INTEGER NOT NULL,
    PRIMARY KEY (name, reason)
) STRICT;
