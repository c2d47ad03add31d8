-- Version 13: when each stream producer last appended (see the
-- PostgreSQL migration of the same version), so that idle producers are
-- forgotten and a stream keeps state for a bounded number of them.
-- Producers known before this version count from the migration's time.
ALTER TABLE stream_producers ADD COLUMN last_append_at_ms INTEGER NOT NULL DEFAULT 0;
UPDATE stream_producers SET last_append_at_ms = CAST(strftime('%s', 'now') AS INTEGER) * 1000;
CREATE INDEX stream_producers_idle ON stream_producers (channel, last_append_at_ms);
