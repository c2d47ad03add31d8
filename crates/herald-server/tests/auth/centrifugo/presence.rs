//! Presence, when enabled: cluster-wide (a client on one node is seen
//! from another), through the client protocol and the server API; an
//! unsubscribe removes the client; the rows of a node that stopped
//! renewing them expire while the live nodes' rows are kept by their
//! heartbeat.

use std::time::Duration;

use herald_server::{CentrifugoConfig, ServerConfig};
use herald_storage::PresenceEntry;
use herald_testkit::place::StorageAt;
use herald_testkit::{within, NODE_WAIT};
use serde_json::json;

use super::client::Client;
use crate::{Backend, Creds, Node, Place, Role};

async fn presence(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let ttl = Duration::from_millis(600);
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            presence_ttl: ttl,
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let holder = Node::start(&place, "node-a", Role::Holder, config.clone()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, config).await;
    let ann = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let bob = creds.token_for("bob", json!({"channels": ["news:*"]}));
    let (mut a, a_info) = Client::connect(&holder, &ann).await;
    let (mut b, b_info) = Client::connect(&standby, &bob).await;
    let a_id = a_info["client"].as_str().unwrap().to_owned();
    let b_id = b_info["client"].as_str().unwrap().to_owned();
    a.command("subscribe", json!({"channel": "news:p"})).await;
    b.command("subscribe", json!({"channel": "news:p"})).await;

    // Asked on the standby, the holder's client is there too.
    let r = b.command("presence", json!({"channel": "news:p"})).await;
    let seen = &r["presence"]["presence"];
    assert_eq!(seen[&a_id], json!({"client": a_id, "user": "ann"}), "{r}");
    assert_eq!(seen[&b_id], json!({"client": b_id, "user": "bob"}), "{r}");
    let r = a
        .command("presence_stats", json!({"channel": "news:p"}))
        .await;
    assert_eq!(
        r["presence_stats"],
        json!({"num_clients": 2, "num_users": 2}),
        "{r}"
    );
    // The server API, with a key that reads the channel.
    let reader = [("x-api-key", creds.reader.as_str())];
    let (_, _, r) = holder
        .call(
            "POST",
            "/api/presence",
            &reader,
            Some(json!({"channel": "news:p"})),
        )
        .await;
    assert_eq!(r["result"]["presence"].as_object().unwrap().len(), 2, "{r}");
    // Not subscribable with this token: 103.
    let r = a.command("presence", json!({"channel": "keyonly:x"})).await;
    assert_eq!(r["error"]["code"], 103, "{r}");

    // An unsubscribe removes the client.
    a.command("unsubscribe", json!({"channel": "news:p"})).await;
    let r = b
        .command("presence_stats", json!({"channel": "news:p"}))
        .await;
    assert_eq!(r["presence_stats"]["num_clients"], 1, "{r}");

    // A row of a node process that no longer renews it (as a node that
    // died leaves) expires; the live node's row is kept by its heartbeat
    // though it was written before, with the same ttl.
    let storage = StorageAt::from(&place).open().await;
    let gone = PresenceEntry {
        channel: herald_core::ChannelName::new("news:p").unwrap(),
        client: "gone-client".to_owned(),
        user: "zoe".to_owned(),
    };
    storage.presence_add("dead-node", &gone, ttl).await.unwrap();
    let r = b
        .command("presence_stats", json!({"channel": "news:p"}))
        .await;
    assert_eq!(r["presence_stats"]["num_clients"], 2, "{r}");
    within("the dead node's row to expire", NODE_WAIT, async {
        loop {
            let r = b.command("presence", json!({"channel": "news:p"})).await;
            if r["presence"]["presence"].get("gone-client").is_none() {
                assert!(r["presence"]["presence"].get(&b_id).is_some(), "{r}");
                break;
            }
            // Polled: an expiry is no event the test can await.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    standby.stop().await;
    holder.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_cluster_wide_and_expires_on_sqlite() {
    presence(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_cluster_wide_and_expires_on_postgres() {
    presence(Backend::Postgres).await;
}
