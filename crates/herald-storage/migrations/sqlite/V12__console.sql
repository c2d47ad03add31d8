-- Version 12: what the web console shows of the cluster (see the
-- PostgreSQL migration of the same version for each column).
CREATE TABLE lease_history (
    name TEXT NOT NULL,
    token INTEGER NOT NULL,
    holder TEXT NOT NULL,
    previous_holder TEXT,
    reason TEXT NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    PRIMARY KEY (name, token)
) STRICT;

ALTER TABLE cluster_nodes ADD COLUMN url TEXT NOT NULL DEFAULT '';
ALTER TABLE cluster_nodes ADD COLUMN subscriptions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cluster_nodes ADD COLUMN reported_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cluster_channels ADD COLUMN num_subscribers INTEGER NOT NULL DEFAULT 0;

CREATE INDEX cluster_channels_channel ON cluster_channels (channel);
