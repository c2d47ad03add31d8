-- Version 11: Durable Streams' properties of a channel, bytes payloads and
-- idempotent producers.
--
-- A channel becomes a stream when it is created with a content type
-- (`content_type` not NULL); a channel written only through Herald's API
-- or Centrifugo keeps NULL (JSON). `closed`: no append is accepted any
-- more. `expires_at`: the stream is gone from then on (NULL: never);
-- `ttl_s`: a sliding time to live, counted from `touched_at` (its
-- creation, last append or close). `json`: its messages are JSON (every
-- channel but a stream of another content type); Herald's API and
-- Centrifugo publish only to those. `closed_by`, `closed_by_epoch`,
-- `closed_by_seq`: the idempotent producer whose append closed the stream,
-- if one did (its retry is a duplicate, not a conflict). `stream_seq`: the
-- last `Stream-Seq` an append carried (compared as bytes, COLLATE "C"). A
-- deletion clears them all with its producers.
ALTER TABLE channels ADD COLUMN content_type text;
ALTER TABLE channels ADD COLUMN closed boolean NOT NULL DEFAULT false;
ALTER TABLE channels ADD COLUMN expires_at timestamptz;
ALTER TABLE channels ADD COLUMN touched_at timestamptz;
ALTER TABLE channels ADD COLUMN json boolean NOT NULL DEFAULT true;
ALTER TABLE channels ADD COLUMN ttl_s bigint;
ALTER TABLE channels ADD COLUMN stream_seq text COLLATE "C";
ALTER TABLE channels ADD COLUMN closed_by text;
ALTER TABLE channels ADD COLUMN closed_by_epoch bigint;
ALTER TABLE channels ADD COLUMN closed_by_seq bigint;

-- A fork: the stream it was forked from (`fork_of`) and the sub-offset it
-- was created with; `soft_deleted`: deleted while live forks of it
-- remained, so its URL answers "gone" until the last of them is deleted.
ALTER TABLE channels ADD COLUMN fork_of text COLLATE "C";
ALTER TABLE channels ADD COLUMN fork_sub_offset bigint;
ALTER TABLE channels ADD COLUMN soft_deleted boolean NOT NULL DEFAULT false;
CREATE INDEX channels_fork_of ON channels (fork_of) WHERE fork_of IS NOT NULL;

-- A message whose payload is bytes keeps them in `body`, byte for byte,
-- and `data` NULL; a JSON message keeps `body` NULL.
ALTER TABLE messages ALTER COLUMN data DROP NOT NULL;
ALTER TABLE messages ADD COLUMN body bytea;

-- Each idempotent producer of a stream: the epoch it writes in and the
-- last sequence number it appended, updated in the append's own fenced
-- transaction.
CREATE TABLE stream_producers (
    channel text COLLATE "C" NOT NULL,
    producer text COLLATE "C" NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 0),
    last_seq bigint NOT NULL CHECK (last_seq >= 0),
    PRIMARY KEY (channel, producer)
);
