-- Version 8: every node's subscribed channels, for the server API's
-- `channels` across the cluster.
--
-- `cluster_channels`: one row per node (by node id) and channel that has
-- subscribers on it, with their count, written with the node's row of
-- `cluster_nodes` in one transaction (at each report the node's rows are
-- brought to its counts of now: rows of channels it no longer serves are
-- deleted, changed counts updated, unchanged rows left alone). A row has
-- no expiry of its own: it lives as long as its node's report, so readers
-- join `cluster_nodes` and skip expired reports, and the statement that
-- deletes an expired report deletes its rows too.
CREATE TABLE cluster_channels (
    node_id text COLLATE "C" NOT NULL,
    channel text COLLATE "C" NOT NULL,
    num_clients bigint NOT NULL,
    PRIMARY KEY (node_id, channel)
);
