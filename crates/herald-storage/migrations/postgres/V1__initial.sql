-- Herald's PostgreSQL schema, version 1.
--
-- Every time is a `timestamptz` computed by PostgreSQL (`clock_timestamp()`),
-- never by a node, so nodes never compare their wall clocks with each other.
-- Names are compared and sorted by their bytes (`COLLATE "C"`), whatever
-- the database's default collation is.

-- The writer lease: one row per lease name (normally `writer`).
--
-- `token` is the fencing token: it grows by one on every acquisition and is
-- never reset, also not on release. `holder`, `holder_url` and
-- `holder_session` are NULL after a release.
--
-- `expires_at` and `renewed_at` must stay out of every unique index (and so
-- out of the primary key). PostgreSQL counts a column that is part of a
-- unique index as a key column for row locking: an UPDATE that changes only
-- non-key columns takes a FOR NO KEY UPDATE row lock, which does not conflict
-- with the FOR KEY SHARE lock every fenced write holds on this row; an UPDATE
-- that changes a key column takes FOR UPDATE, which does. A renewal (it
-- changes only `expires_at` and `renewed_at`) therefore never waits behind a
-- fenced write, however long that write takes. Indexing either column with
-- a unique index would silently make every renewal wait for every write in
-- flight. (PostgreSQL documentation, "Explicit Locking", section
-- "Row-Level Locks".)
CREATE TABLE storage_leases (
    name text COLLATE "C" PRIMARY KEY,
    holder text,
    holder_url text,
    holder_session text,
    token bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL
);

-- One row per channel that has at least one message; `head` is the offset of
-- its newest message.
CREATE TABLE channels (
    name text COLLATE "C" PRIMARY KEY,
    head bigint NOT NULL,
    created_at timestamptz
);

-- Every message.
--
-- `id` is the global commit order: fenced writes of a lease are serialized
-- by a transaction-level advisory lock held until their commit, so ids are
-- handed out in commit order and a change cursor never skips a row.
-- `data` is the publisher's JSON text byte for byte: `text`, because
-- `jsonb` would reformat it (key order, whitespace, number spellings,
-- duplicate keys). `token` is the fencing token of the writer that stored
-- the row.
CREATE TABLE messages (
    id bigserial PRIMARY KEY,
    channel text COLLATE "C" NOT NULL,
    "offset" bigint NOT NULL,
    data text NOT NULL,
    published_at timestamptz NOT NULL,
    idempotency_key text COLLATE "C",
    token bigint NOT NULL,
    UNIQUE (channel, "offset")
);

CREATE UNIQUE INDEX messages_idempotency_key
    ON messages (channel, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
