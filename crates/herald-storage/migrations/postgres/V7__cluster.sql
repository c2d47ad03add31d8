-- Version 7: what every node of a cluster reads of the others: channel
-- deletions and node reports.
--
-- `channel_deletions`: one row per deleted channel: its latest deletion.
-- `deletion` numbers deletions from 1 across all channels, in commit order
-- (fenced writes, which record them, are serialized by the lease's
-- advisory lock); `head` is the channel's head when it was deleted (every
-- message up to it was removed). Standbys read the rows after the number
-- they last saw, so that a deletion ends their subscriptions to the
-- channel even when they missed its notification; a subscriber compares a
-- channel's number with the deletion it hears of, so that only
-- subscriptions that began before the deletion end. A table of its own, so
-- that the fenced append and the `channels` table are unchanged.
CREATE TABLE channel_deletions (
    channel text COLLATE "C" PRIMARY KEY,
    deletion bigint NOT NULL UNIQUE,
    head bigint NOT NULL,
    deleted_at timestamptz NOT NULL
);

-- `cluster_nodes`: one row per node (by node id), written by the node
-- itself every few seconds with its counts of Centrifugo connections, for
-- the server API's `info`; a row expires `expires_at` unless written
-- again, so a node that stopped drops out by itself. Readers skip expired
-- rows; writers delete them.
CREATE TABLE cluster_nodes (
    node_id text COLLATE "C" PRIMARY KEY,
    version text NOT NULL,
    uptime_s bigint NOT NULL,
    num_clients bigint NOT NULL,
    num_users bigint NOT NULL,
    num_subs bigint NOT NULL,
    num_channels bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
