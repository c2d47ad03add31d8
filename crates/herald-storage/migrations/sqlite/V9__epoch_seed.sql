-- Version 9: channel epochs without a row per channel.
--
-- Until version 8 a channel's epoch was a row of `channel_epochs`, made
-- by the first node that asked for it: a subscribe or a history read of a
-- new channel name wrote a row, which was never removed. From version 9
-- a read writes nothing: the epoch of a channel without a row is derived
-- from its name and this database's `seed` (SHA-256, in the storage's
-- code), the same on every node, before and after the channel's first
-- message, and different in another database. The one row here is drawn
-- once, by this migration. Rows of `channel_epochs` written before keep
-- their epochs; no new ones are written.
CREATE TABLE epoch_seed (
    id INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    seed TEXT NOT NULL
) STRICT;

INSERT INTO epoch_seed (id, seed) VALUES (1, lower(hex(randomblob(16))));
