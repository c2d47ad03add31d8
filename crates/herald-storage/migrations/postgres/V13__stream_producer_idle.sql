-- Version 13: when each stream producer last appended (the storage's
-- clock). A producer idle longer than the configured time is forgotten:
-- the next append that admits a new producer to the stream removes the
-- rows of the idle ones, and a stream keeps rows for at most the
-- configured number of producers. Producers known before this version
-- count from the migration's time.
ALTER TABLE stream_producers ADD COLUMN last_append_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX stream_producers_idle ON stream_producers (channel, last_append_at);
