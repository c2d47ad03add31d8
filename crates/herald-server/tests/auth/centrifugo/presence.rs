//! Presence, when enabled: cluster-wide (a client on one node is seen
//! from another), through the client protocol and the server API; an
//! unsubscribe removes the client; the rows of a node that stopped
//! renewing them expire while the live nodes' rows are kept by their
//! heartbeat; a refused subscribe leaves no row; a row whose removal
//! failed is not kept alive by the heartbeat.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herald_core::ChannelName;
use herald_server::{CentrifugoConfig, ServerConfig};
use herald_storage::PresenceEntry;
use herald_testkit::place::StorageAt;
use herald_testkit::storage::{Hooked, StorageHooks};
use herald_testkit::{within, NODE_WAIT};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message as Frame;

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

/// Fails `channel_epoch` while on, as a database that went down between
/// a subscribe's presence row and its epoch.
struct EpochOutage(AtomicBool);

#[async_trait::async_trait]
impl StorageHooks for EpochOutage {
    async fn before_epoch(&self, _channel: &ChannelName) -> herald_storage::Result<()> {
        if self.0.load(Ordering::SeqCst) {
            return Err(herald_storage::Error::unavailable("injected outage"));
        }
        Ok(())
    }
}

/// A subscribe refused after its presence row was written (here: the
/// channel's epoch could not be read) leaves no presence row: its reply
/// comes once the row is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscribe_leaves_no_presence_row() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let outage = Arc::new(EpochOutage(AtomicBool::new(true)));
    let hooks = Arc::clone(&outage);
    let node = Node::start_with(&place, "node-a", Role::Holder, config, move |s| {
        Hooked::wrap(s, hooks)
    })
    .await;
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut c, info) = Client::connect(&node, &token).await;
    let client = info["client"].as_str().unwrap().to_owned();
    let channel = ChannelName::new("news:p").unwrap();

    let r = c.command("subscribe", json!({"channel": "news:p"})).await;
    assert_eq!(r["error"]["code"], 100, "{r}");
    let rows = node.storage.presence(&channel).await.unwrap();
    assert!(rows.is_empty(), "{rows:?}");

    // Once the storage answers, the same subscribe is there.
    outage.0.store(false, Ordering::SeqCst);
    let r = c.command("subscribe", json!({"channel": "news:p"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let rows = node.storage.presence(&channel).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].client, client);
}

/// Fails `presence_remove` while on, as a database that went down while
/// clients unsubscribed or disconnected; reports whose removals it
/// refused.
struct RemoveOutage {
    on: AtomicBool,
    refused: tokio::sync::watch::Sender<BTreeSet<String>>,
}

#[async_trait::async_trait]
impl StorageHooks for RemoveOutage {
    async fn before_presence_remove(
        &self,
        _channel: &ChannelName,
        client: &str,
    ) -> herald_storage::Result<()> {
        if self.on.load(Ordering::SeqCst) {
            self.refused.send_modify(|r| {
                r.insert(client.to_owned());
            });
            return Err(herald_storage::Error::unavailable("injected outage"));
        }
        Ok(())
    }
}

/// The client ids with a presence row in `channel`.
async fn rows_of(storage: &dyn herald_storage::Storage, channel: &ChannelName) -> BTreeSet<String> {
    let rows = storage.presence(channel).await.unwrap();
    rows.into_iter().map(|r| r.client).collect()
}

/// A presence row whose removal failed (the storage down when its client
/// unsubscribed, or disconnected) is not renewed for ever by the node's
/// heartbeat: once the storage answers again it is gone. A client that
/// subscribed again meanwhile keeps its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_presence_removal_leaves_no_row_behind() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            presence_ttl: Duration::from_millis(300),
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let outage = Arc::new(RemoveOutage {
        on: AtomicBool::new(false),
        refused: tokio::sync::watch::Sender::new(BTreeSet::new()),
    });
    let hooks = Arc::clone(&outage);
    let node = Node::start_with(&place, "node-a", Role::Holder, config, move |s| {
        Hooked::wrap(s, hooks)
    })
    .await;
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let channel = ChannelName::new("news:p").unwrap();
    // `gone` unsubscribes, `closed` disconnects, `back` unsubscribes and
    // subscribes again, all while removals fail.
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (mut c, info) = Client::connect(&node, &token).await;
        let r = c.command("subscribe", json!({"channel": "news:p"})).await;
        assert!(r["subscribe"].is_object(), "{r}");
        clients.push((c, info["client"].as_str().unwrap().to_owned()));
    }
    let (mut back, back_id) = clients.pop().unwrap();
    let (mut closed, closed_id) = clients.pop().unwrap();
    let (mut gone, gone_id) = clients.pop().unwrap();
    let all = BTreeSet::from([gone_id.clone(), closed_id.clone(), back_id.clone()]);
    assert_eq!(rows_of(node.storage.as_ref(), &channel).await, all);

    outage.on.store(true, Ordering::SeqCst);
    let r = gone
        .command("unsubscribe", json!({"channel": "news:p"}))
        .await;
    assert_eq!(r["unsubscribe"], json!({}), "{r}");
    let r = back
        .command("unsubscribe", json!({"channel": "news:p"}))
        .await;
    assert_eq!(r["unsubscribe"], json!({}), "{r}");
    closed.send_frame(Frame::Close(None)).await;
    let mut refused = outage.refused.subscribe();
    within("the three removals refused", NODE_WAIT, async {
        refused
            .wait_for(|r| r.len() == 3)
            .await
            .expect("the hook lives")
    })
    .await;
    let r = back
        .command("subscribe", json!({"channel": "news:p"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    // The removals failed: every row is still there.
    assert_eq!(rows_of(node.storage.as_ref(), &channel).await, all);

    // The storage answers again: the rows of the ended subscriptions go
    // (the heartbeat would otherwise renew them as long as the node
    // runs), the live one stays.
    outage.on.store(false, Ordering::SeqCst);
    within("the ended subscriptions' rows to go", NODE_WAIT, async {
        loop {
            if rows_of(node.storage.as_ref(), &channel).await == BTreeSet::from([back_id.clone()]) {
                break;
            }
            // Polled: a removal by the heartbeat is no event the test
            // can await.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let r = back.command("presence", json!({"channel": "news:p"})).await;
    let seen = r["presence"]["presence"].as_object().unwrap();
    assert_eq!(seen.keys().collect::<Vec<_>>(), [&back_id], "{r}");
    node.stop().await;
}
