-- Version 12: what the web console shows of the cluster.
--
-- `lease_history`: one row per acquisition of a lease (its takeover
-- timeline), written in the acquire's own transaction, so it survives
-- every restart and every node reads the same one. `token` is the new
-- fencing token, `holder` the node that acquired, `previous_holder` the
-- node named in the row before (NULL after a release or on the first
-- acquisition), `reason` as in `lease_takeovers`. The acquire that adds a
-- row deletes the rows 1000 tokens or more older, so it stays small.
CREATE TABLE lease_history (
    name text NOT NULL,
    token bigint NOT NULL,
    holder text NOT NULL,
    previous_holder text,
    reason text NOT NULL,
    acquired_at timestamptz NOT NULL,
    PRIMARY KEY (name, token)
);

-- A node's report also says where it is reached (`url`, its advertised
-- URL), how many live subscriptions it serves over every protocol
-- (`subscriptions`) and when it was written (`reported_at`); each
-- reported channel also counts its subscriptions over every protocol
-- (`num_subscribers`), where `num_clients` counts Centrifugo connections.
ALTER TABLE cluster_nodes ADD COLUMN url text NOT NULL DEFAULT '';
ALTER TABLE cluster_nodes ADD COLUMN subscriptions bigint NOT NULL DEFAULT 0;
ALTER TABLE cluster_nodes ADD COLUMN reported_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE cluster_channels ADD COLUMN num_subscribers bigint NOT NULL DEFAULT 0;

-- The console's channel list sums a channel's subscribers over the node
-- reports: one index lookup per channel of a page, however many nodes
-- and channels the reports hold.
CREATE INDEX cluster_channels_channel ON cluster_channels (channel);
