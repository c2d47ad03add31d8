-- Herald's SQLite schema, version 1.
--
-- Every time is an integer number of milliseconds since the Unix epoch,
-- computed by SQLite (`CAST(unixepoch('subsec') * 1000 AS INTEGER)`), never by
-- a node. Tables are STRICT so that a value of the wrong type is an error
-- instead of being stored as something else.

-- The writer lease: one row per lease name (normally `writer`).
-- `token` is the fencing token: it grows by one on every acquisition and is
-- never reset, also not on release. `holder_session` names the session lock
-- file (`sessions/<holder_session>.lock`) of the holder's process.
-- `expires_at_ms` and `renewed_at_ms` must stay out of every unique index.
CREATE TABLE storage_leases (
    name TEXT PRIMARY KEY NOT NULL,
    holder TEXT,
    holder_url TEXT,
    holder_session TEXT,
    token INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    renewed_at_ms INTEGER NOT NULL
) STRICT;

-- One row per channel that has at least one message; `head` is the offset of
-- its newest message.
CREATE TABLE channels (
    name TEXT PRIMARY KEY NOT NULL,
    head INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
) STRICT;

-- Every message. `id` is the global commit order (AUTOINCREMENT: an id is
-- never handed out twice, so a change cursor never goes back); `data` is the
-- publisher's JSON text, byte for byte; `token` is the fencing token of the
-- writer that stored the row.
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    data TEXT NOT NULL,
    published_at_ms INTEGER NOT NULL,
    idempotency_key TEXT,
    token INTEGER NOT NULL,
    UNIQUE (channel, "offset")
) STRICT;

CREATE UNIQUE INDEX messages_idempotency_key
    ON messages (channel, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
