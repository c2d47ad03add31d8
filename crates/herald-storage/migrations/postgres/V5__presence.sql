-- Version 5: presence, for Centrifugo's presence and presence_stats.
--
-- One row per (channel, client) subscribed on some node. `session` names
-- the node process that wrote it; that process renews its rows' expiry
-- while it runs, so the rows of a node that died expire by themselves.
-- Readers skip expired rows; writers delete them.
CREATE TABLE presence (
    channel text COLLATE "C" NOT NULL,
    client text COLLATE "C" NOT NULL,
    "user" text NOT NULL,
    session text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (channel, client)
);

CREATE INDEX presence_session ON presence (session);
