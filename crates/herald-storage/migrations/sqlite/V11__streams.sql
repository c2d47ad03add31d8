-- Version 11: Durable Streams' properties of a channel, bytes payloads and
-- idempotent producers.
--
-- A channel becomes a stream when it is created with a content type
-- (`content_type` not NULL); a channel written only through Herald's API
-- or Centrifugo keeps NULL (JSON). `closed` = 1: no append is accepted any
-- more. `expires_at_ms`: the stream is gone from then on (NULL: never);
-- `ttl_s`: a sliding time to live, counted from `touched_at_ms` (its
-- creation, last append or close). `json`: its messages are JSON (every
-- channel but a stream of another content type); Herald's API and
-- Centrifugo publish only to those. `closed_by`, `closed_by_epoch`,
-- `closed_by_seq`: the idempotent producer whose append closed the stream,
-- if one did (its retry is a duplicate, not a conflict). `stream_seq`: the
-- last `Stream-Seq` an append carried (compared as bytes). A deletion
-- clears them all with its producers.
ALTER TABLE channels ADD COLUMN content_type TEXT;
ALTER TABLE channels ADD COLUMN closed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE channels ADD COLUMN expires_at_ms INTEGER;
ALTER TABLE channels ADD COLUMN touched_at_ms INTEGER;
ALTER TABLE channels ADD COLUMN json INTEGER NOT NULL DEFAULT 1;
ALTER TABLE channels ADD COLUMN ttl_s INTEGER;
ALTER TABLE channels ADD COLUMN stream_seq TEXT;
ALTER TABLE channels ADD COLUMN closed_by TEXT;
ALTER TABLE channels ADD COLUMN closed_by_epoch INTEGER;
ALTER TABLE channels ADD COLUMN closed_by_seq INTEGER;

-- A fork: the stream it was forked from (`fork_of`) and the sub-offset it
-- was created with; `soft_deleted`: deleted while live forks of it
-- remained, so its URL answers "gone" until the last of them is deleted.
ALTER TABLE channels ADD COLUMN fork_of TEXT;
ALTER TABLE channels ADD COLUMN fork_sub_offset INTEGER;
ALTER TABLE channels ADD COLUMN soft_deleted INTEGER NOT NULL DEFAULT 0;
CREATE INDEX channels_fork_of ON channels (fork_of) WHERE fork_of IS NOT NULL;

-- A message whose payload is bytes keeps them in `body`, byte for byte,
-- and an empty `data` (SQLite cannot drop a column's NOT NULL without
-- copying the table); a JSON message keeps `body` NULL.
ALTER TABLE messages ADD COLUMN body BLOB;

-- Each idempotent producer of a stream: the epoch it writes in and the
-- last sequence number it appended, updated in the append's own fenced
-- transaction.
CREATE TABLE stream_producers (
    channel TEXT NOT NULL,
    producer TEXT NOT NULL,
    epoch INTEGER NOT NULL CHECK (epoch >= 0),
    last_seq INTEGER NOT NULL CHECK (last_seq >= 0),
    PRIMARY KEY (channel, producer)
) STRICT;
