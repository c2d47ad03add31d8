//! The channel limit (`--centrifugo-channel-limit`): a connection holds at
//! most that many subscriptions; a subscribe beyond it answers 106 and
//! changes nothing (no presence row, no subscription), an unsubscribe
//! frees a slot, and a connect whose token's `subs` name more channels
//! closes with 3505 before any of them starts.

use herald_core::ChannelName;
use herald_server::{CentrifugoConfig, ServerConfig};
use serde_json::{json, Value};

use super::client::Client;
use crate::{on_both_backends, Backend, Creds, Node, Place, Role};

/// The client ids with a presence row in `channel`.
async fn present(node: &Node, channel: &str) -> Vec<String> {
    let channel = ChannelName::new(channel).unwrap();
    let rows = node.storage.presence(&channel).await.unwrap();
    rows.into_iter().map(|r| r.client).collect()
}

/// The server API's `channels` of `news:*` on `node`.
async fn channels(node: &Node, creds: &Creds) -> Value {
    let admin = [("x-api-key", creds.admin.as_str())];
    let (_, _, r) = node
        .call(
            "POST",
            "/api/channels",
            &admin,
            Some(json!({"pattern": "news:*"})),
        )
        .await;
    r["result"]["channels"].clone()
}

async fn channel_limit(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            channel_limit: 2,
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut c, info) = Client::connect(&node, &token).await;
    let client = info["client"].as_str().unwrap().to_owned();

    // Up to the limit: subscribed.
    for channel in ["news:1", "news:2"] {
        let r = c.command("subscribe", json!({ "channel": channel })).await;
        assert!(r["subscribe"].is_object(), "{r}");
    }
    // One more: 106, and nothing of it exists.
    let r = c.command("subscribe", json!({"channel": "news:3"})).await;
    assert_eq!(
        r["error"],
        json!({"code": 106, "message": "limit exceeded"}),
        "{r}"
    );
    assert!(present(&node, "news:3").await.is_empty());
    let subscribed = channels(&node, &creds).await;
    assert_eq!(subscribed["news:1"]["num_clients"], 1, "{subscribed}");
    assert_eq!(subscribed["news:2"]["num_clients"], 1, "{subscribed}");
    assert!(subscribed.get("news:3").is_none(), "{subscribed}");
    // "Already subscribed" comes before the limit, as in Centrifugo.
    let r = c.command("subscribe", json!({"channel": "news:2"})).await;
    assert_eq!(r["error"]["code"], 105, "{r}");

    // An unsubscribe frees a slot: the refused channel is subscribed now,
    // and the limit holds again.
    let r = c.command("unsubscribe", json!({"channel": "news:1"})).await;
    assert_eq!(r["unsubscribe"], json!({}), "{r}");
    let r = c.command("subscribe", json!({"channel": "news:3"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    assert_eq!(present(&node, "news:3").await, [client]);
    let r = c.command("subscribe", json!({"channel": "news:1"})).await;
    assert_eq!(r["error"]["code"], 106, "{r}");
    assert!(present(&node, "news:1").await.is_empty());

    // Server-side subscriptions count too: a token whose `subs` fill the
    // limit connects, and a client-side subscribe on top is refused.
    let two = creds.token_for(
        "erin",
        json!({"channels": ["news:*"], "subs": {"news:s1": {}, "news:s2": {}}}),
    );
    let (mut full, connected) = Client::connect(&node, &two).await;
    assert_eq!(connected["subs"].as_object().unwrap().len(), 2);
    let r = full
        .command("subscribe", json!({"channel": "news:x"}))
        .await;
    assert_eq!(r["error"]["code"], 106, "{r}");
    // A token whose `subs` exceed it: closed with 3505 "channel limit",
    // no subscription started.
    let three = creds.token_for(
        "erin",
        json!({"subs": {"news:t1": {}, "news:t2": {}, "news:t3": {}}}),
    );
    let mut over = Client::open(&node).await;
    over.send_text(&json!({"id": 1, "connect": {"token": three}}).to_string())
        .await;
    assert_eq!(over.closed_with().await, Some(3505));
    for channel in ["news:t1", "news:t2", "news:t3"] {
        assert!(present(&node, channel).await.is_empty(), "{channel}");
    }
    let subscribed = channels(&node, &creds).await;
    assert!(subscribed.get("news:t1").is_none(), "{subscribed}");
    node.stop().await;
}

on_both_backends!(channel_limit: channel_limit_on_sqlite, channel_limit_on_postgres);
