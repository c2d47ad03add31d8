-- Herald's PostgreSQL schema, version 3: retention.
--
-- `trimmed_through`: every offset of the channel at or below it was
-- removed (trimmed by its retention policy, or the channel deleted); the
-- channel's earliest offset is `trimmed_through + 1`. The stored messages
-- are exactly the offsets `trimmed_through + 1 ..= head`. A trim never
-- moves `head`, and a deleted channel keeps its row, so offsets are never
-- reused.
--
-- `bytes`: the bytes of message data stored for the channel (the JSON
-- texts' UTF-8 lengths, `octet_length`), kept by every append and trim,
-- so that a trim by size and `herald channels` never add up the messages.
--
-- Adding a column with a constant default rewrites no rows (PostgreSQL
-- documentation, ALTER TABLE, "Notes"); the UPDATE reads every message
-- once, at migration time.
ALTER TABLE channels ADD COLUMN trimmed_through bigint NOT NULL DEFAULT 0;
ALTER TABLE channels ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
UPDATE channels SET bytes = COALESCE(
    (SELECT SUM(octet_length(m.data)) FROM messages AS m WHERE m.channel = channels.name), 0);
