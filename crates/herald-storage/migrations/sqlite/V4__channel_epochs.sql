-- Version 4: channel epochs.
--
-- A channel's epoch names one unbroken history of the channel: a client
-- that recovers from an offset also presents the epoch it saw, and
-- recovery is refused when the epoch differs (the offsets then belong to
-- another history, such as a fresh database). The row is created the
-- first time any node asks for the channel's epoch (before or after its
-- first message) and never changes; every node reads the same row. A
-- table of its own, so that the fenced write is unchanged.
CREATE TABLE channel_epochs (
    name TEXT PRIMARY KEY NOT NULL,
    epoch TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
) STRICT;
