-- Herald's SQLite schema, version 8: every node's subscribed channels, for
-- the server API's `channels` across processes on the data directory.
--
-- `cluster_channels`: one row per node (by node id) and channel that has
-- subscribers on it, with their count, written with the node's row of
-- `cluster_nodes` in one transaction (the node's rows are replaced at each
-- report). A row has no expiry of its own: it lives as long as its node's
-- report, so readers join `cluster_nodes` and skip expired reports, and
-- the writer that deletes an expired report deletes its rows too.
CREATE TABLE cluster_channels (
    node_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    num_clients INTEGER NOT NULL,
    PRIMARY KEY (node_id, channel)
) STRICT;
