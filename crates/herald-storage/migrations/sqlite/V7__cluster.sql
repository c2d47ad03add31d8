-- Herald's SQLite schema, version 7: what every node (process) on the
-- data directory reads of the others: channel deletions and node reports.
--
-- `channel_deletions`: one row per deleted channel: its latest deletion.
-- `deletion` numbers deletions from 1 across all channels, in commit order
-- (fenced writes, which record them, hold the database's write lock);
-- `head` is the channel's head when it was deleted (every message up to it
-- was removed). Standbys (other processes on the same data directory) read
-- the rows after the number they last saw, so that a deletion ends their
-- subscriptions to the channel; a subscriber compares a channel's number
-- with the deletion it hears of, so that only subscriptions that began
-- before the deletion end. A table of its own, so that the fenced append
-- and the `channels` table are unchanged.
CREATE TABLE channel_deletions (
    channel TEXT PRIMARY KEY,
    deletion INTEGER NOT NULL UNIQUE,
    head INTEGER NOT NULL,
    deleted_at_ms INTEGER NOT NULL
) STRICT;

-- `cluster_nodes`: one row per node (by node id), written by the node
-- itself every few seconds with its counts of Centrifugo connections, for
-- the server API's `info`; a row expires at `expires_at_ms` unless written
-- again, so a node that stopped drops out by itself. Readers skip expired
-- rows; writers delete them.
CREATE TABLE cluster_nodes (
    node_id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    uptime_s INTEGER NOT NULL,
    num_clients INTEGER NOT NULL,
    num_users INTEGER NOT NULL,
    num_subs INTEGER NOT NULL,
    num_channels INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
) STRICT;
