-- Version 5: presence, for Centrifugo's presence and presence_stats.
--
-- One row per (channel, client) subscribed on some node. `session` names
-- the node process that wrote it; that process renews its rows' expiry
-- while it runs, so the rows of a node that died expire by themselves.
-- Readers skip expired rows; writers delete them.
CREATE TABLE presence (
    channel TEXT NOT NULL,
    client TEXT NOT NULL,
    user TEXT NOT NULL,
    session TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (channel, client)
) STRICT;

CREATE INDEX presence_session ON presence (session);
