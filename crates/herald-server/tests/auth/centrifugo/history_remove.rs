//! The server API's `history_remove`: every stored message up to the head
//! goes (a fenced trim), the head and the epoch stay. On a standby it is
//! forwarded to the holder. A recovery from a removed offset says
//! `recovered: false`; a subscriber that had everything goes on; a live
//! subscriber that had not got every removed message yet is closed with
//! 3010, as after a retention trim.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use herald_core::ChannelName;
use herald_storage::Storage;
use herald_testkit::storage::{Hooked, StorageHooks};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use super::client::Client;
use super::{api, holder_and_standby, offsets};
use crate::{Backend, Creds, Node, Place, Role};

/// The channel's `(head, earliest, messages)` in `GET /v1/channels`.
async fn stats(node: &Node, admin: &str, channel: &str) -> (Value, Value, Value) {
    let bearer = Creds::bearer(admin);
    let (status, _, body) = node
        .call(
            "GET",
            "/v1/channels",
            &[("authorization", bearer.as_str())],
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let row = body["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == channel)
        .unwrap_or_else(|| panic!("{channel} is not listed: {body}"))
        .clone();
    (
        row["head"].clone(),
        row["earliest"].clone(),
        row["messages"].clone(),
    )
}

async fn history_remove(backend: Backend) {
    let (_place, creds, holder, standby) = holder_and_standby(backend).await;
    let backend_key = creds.backend.as_str();
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    for i in 1..=3 {
        assert_eq!(holder.publish_with("news:h", &key, json!(i)).await.0, 201);
    }
    let token = creds.token_for("hugo", json!({"channels": ["news:*"]}));
    // A subscriber that has every message.
    let (mut live, _) = Client::connect(&holder, &token).await;
    let sub = live
        .command("subscribe", json!({"channel": "news:h"}))
        .await;
    let epoch = sub["subscribe"]["epoch"].as_str().unwrap().to_owned();
    assert_eq!(sub["subscribe"]["offset"], 3);

    // A key without `admin` may not.
    let r = api(
        &standby,
        "history_remove",
        &creds.publisher,
        json!({"channel": "news:h"}),
    )
    .await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    // A call that claims to come from a node needs the cluster secret,
    // whatever else it carries.
    for secret in [None, Some("not-the-secret")] {
        let mut headers = vec![
            ("herald-forwarded-by", "node-x"),
            ("x-api-key", backend_key),
        ];
        headers.extend(secret.map(|s| ("herald-cluster-secret", s)));
        let (status, _, body) = holder
            .call(
                "POST",
                "/api/history_remove",
                &headers,
                Some(json!({"channel": "news:h"})),
            )
            .await;
        assert_eq!(status, 401, "{secret:?}: {body}");
    }
    assert_eq!(stats(&holder, &creds.admin, "news:h").await.2, 3);
    // On the standby: forwarded to the holder, which removes it.
    let r = api(
        &standby,
        "history_remove",
        backend_key,
        json!({"channel": "news:h"}),
    )
    .await;
    assert_eq!(r, json!({"result": {}}));
    assert_eq!(
        stats(&holder, &creds.admin, "news:h").await,
        (json!(3), json!(4), json!(0))
    );
    let h = api(
        &holder,
        "history",
        backend_key,
        json!({"channel": "news:h", "limit": 10}),
    )
    .await;
    assert_eq!(offsets(&h["result"]["publications"]), Vec::<u64>::new());
    assert_eq!(h["result"]["offset"], 3, "the head is kept");
    assert_eq!(h["result"]["epoch"], epoch.as_str(), "the epoch is kept");

    // Recovery from a removed offset: not recovered; from the head: yes.
    let (mut c, _) = Client::connect(&standby, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:h", "recover": true, "epoch": epoch, "offset": 1}),
        )
        .await;
    assert!(r["subscribe"].get("recovered").is_none(), "{r}");
    assert_eq!(r["subscribe"]["was_recovering"], true, "{r}");
    assert_eq!(r["subscribe"]["offset"], 3);
    let (mut c, _) = Client::connect(&holder, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:h", "recover": true, "epoch": epoch, "offset": 3}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");

    // The sequence goes on after the kept head; the subscriber that had
    // everything was not disconnected.
    assert_eq!(
        holder.publish_with("news:h", &key, json!(4)).await.2["offset"],
        4
    );
    assert_eq!(live.push().await["pub"]["offset"], 4);
    assert_eq!(c.push().await["pub"]["offset"], 4);
    let h = api(
        &holder,
        "history",
        backend_key,
        json!({"channel": "news:h", "limit": 10}),
    )
    .await;
    assert_eq!(offsets(&h["result"]["publications"]), vec![4]);

    // On the holder; an empty channel, an unknown one: `{}` all the same.
    for channel in ["news:h", "news:h", "news:never"] {
        let r = api(
            &holder,
            "history_remove",
            backend_key,
            json!({ "channel": channel }),
        )
        .await;
        assert_eq!(r, json!({"result": {}}), "{channel}");
    }
    assert_eq!(
        stats(&holder, &creds.admin, "news:h").await,
        (json!(4), json!(5), json!(0))
    );
    let r = api(
        &holder,
        "history_remove",
        backend_key,
        json!({"channel": "no spaces"}),
    )
    .await;
    assert_eq!(r["error"]["code"], 107, "{r}");
    // In a batch, as any method.
    let r = api(
        &standby,
        "batch",
        backend_key,
        json!({"commands": [{"history_remove": {"channel": "news:h"}}]}),
    )
    .await;
    assert_eq!(r, json!({"replies": [{"history_remove": {}}]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_remove_keeps_the_position_on_sqlite() {
    history_remove(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_remove_keeps_the_position_on_postgres() {
    history_remove(Backend::Postgres).await;
}

/// Once armed, holds the next read of `channel` until the test lets it
/// go, and tells when that read is waiting.
struct HoldArmedRead {
    channel: ChannelName,
    armed: AtomicBool,
    waiting: watch::Sender<bool>,
    gate: Semaphore,
}

#[async_trait]
impl StorageHooks for HoldArmedRead {
    async fn before_read(&self, channel: &ChannelName) -> herald_storage::Result<()> {
        if *channel == self.channel && self.armed.swap(false, Ordering::SeqCst) {
            self.waiting.send_replace(true);
            let _permit = self.gate.acquire().await.expect("the gate stays open");
        }
        Ok(())
    }
}

/// A subscriber on a standby reads the messages it is told of from the
/// storage; when `history_remove` removes them before that read, it is
/// closed with 3010 "insufficient state" (never a silent gap), and its
/// recovery then says `recovered: false`.
async fn a_subscriber_behind_is_closed(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let hooks = Arc::new(HoldArmedRead {
        channel: ChannelName::new("news:b").unwrap(),
        armed: AtomicBool::new(false),
        waiting: watch::channel(false).0,
        gate: Semaphore::new(0),
    });
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start_with(&place, "node-b", Role::Standby, creds.config(), {
        let hooks = Arc::clone(&hooks);
        move |s: Arc<dyn Storage>| Hooked::wrap(s, hooks)
    })
    .await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    for i in 1..=2 {
        assert_eq!(holder.publish_with("news:b", &key, json!(i)).await.0, 201);
    }
    let token = creds.token_for("bea", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&standby, &token).await;
    let sub = c.command("subscribe", json!({"channel": "news:b"})).await;
    let epoch = sub["subscribe"]["epoch"].as_str().unwrap().to_owned();
    assert_eq!(sub["subscribe"]["offset"], 2);

    // Offset 3 is committed; the standby's read of it waits until the
    // history is removed.
    hooks.armed.store(true, Ordering::SeqCst);
    let mut waiting = hooks.waiting.subscribe();
    assert_eq!(holder.publish_with("news:b", &key, json!(3)).await.0, 201);
    within("the subscriber's read", NODE_WAIT, waiting.wait_for(|w| *w))
        .await
        .unwrap();
    let r = api(
        &holder,
        "history_remove",
        &creds.backend,
        json!({"channel": "news:b"}),
    )
    .await;
    assert_eq!(r, json!({"result": {}}));
    hooks.gate.add_permits(1);
    assert_eq!(c.closed_with().await, Some(3010));

    let (mut c, _) = Client::connect(&standby, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:b", "recover": true, "epoch": epoch, "offset": 2}),
        )
        .await;
    assert!(r["subscribe"].get("recovered").is_none(), "{r}");
    assert_eq!(r["subscribe"]["offset"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_remove_closes_a_subscriber_behind_on_sqlite() {
    a_subscriber_behind_is_closed(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_remove_closes_a_subscriber_behind_on_postgres() {
    a_subscriber_behind_is_closed(Backend::Postgres).await;
}
