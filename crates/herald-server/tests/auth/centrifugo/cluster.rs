//! What one node does for every node: a channel deleted on the holder
//! ends the subscriptions to it on a standby (SSE, WebSocket and
//! Centrifugo's client protocol), whether the standby learns of it from
//! the deletion's change notice or from the stored deletions (a standby
//! that missed the notice, or one on SQLite, which has none); and the
//! server API's `unsubscribe` and `disconnect` called on one node reach
//! the user's clients on another (PostgreSQL), `info` on one node
//! lists every node with its connections, and `channels` on one node
//! counts the subscribers of every node (both backends).

use std::sync::Arc;

use async_trait::async_trait;
use herald_storage::Storage;
use herald_testkit::sse::SseClient;
use herald_testkit::storage::{Hooked, StorageHooks};
use herald_testkit::ws::{ws_connect, ws_next};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};

use super::client::Client;
use super::holder_and_standby;
use crate::{Backend, Creds, Node, Place, Role};

/// How the standby of [`deletion_reaches_a_standby`] may learn of the
/// deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Only from its change notice: the standby's reads of the stored
    /// deletions fail.
    Notice,
    /// Only from the stored deletions: the standby gets no change signals
    /// and polls (as on SQLite, or as a standby that missed every notice).
    Stored,
}

/// The standby's storage hooks for a [`Way`].
struct Only(Way);

#[async_trait]
impl StorageHooks for Only {
    async fn before_deletions_since(&self, _cursor: u64) -> herald_storage::Result<()> {
        match self.0 {
            Way::Notice => Err(herald_storage::Error::unavailable(
                "the test hides the stored deletions",
            )),
            Way::Stored => Ok(()),
        }
    }

    fn change_signals(&self) -> bool {
        self.0 == Way::Notice
    }
}

/// The next publication pushed to `client` on `channel`: its offset.
async fn next_pub(client: &mut Client, channel: &str) -> u64 {
    let push = client.push().await;
    assert_eq!(push["channel"], channel, "{push}");
    push["pub"]["offset"].as_u64().expect("a publication")
}

async fn deletion_reaches_a_standby(backend: Backend, way: Way) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start_with(
        &place,
        "node-b",
        Role::Standby,
        creds.config(),
        move |s: Arc<dyn Storage>| Hooked::wrap(s, Arc::new(Only(way))),
    )
    .await;
    let publisher = Creds::bearer(&creds.publisher);
    let publish = |n: u64| {
        let (holder, publisher) = (&holder, &publisher);
        async move {
            let (status, _, body) = holder
                .publish_with(
                    "open:gone",
                    &[("authorization", publisher.as_str())],
                    json!({ "n": n }),
                )
                .await;
            assert_eq!((status, &body["offset"]), (201, &json!(n)), "{body}");
        }
    };
    publish(1).await;
    publish(2).await;

    // Three subscribers on the standby, each shown live by message 3.
    let mut sse = SseClient::connect(
        &standby.client,
        &standby.url("/v1/channels/open:gone/events"),
        None,
    )
    .await;
    assert_eq!(sse.status, 200);
    let mut ws = ws_connect(&standby.ws_url("/v1/channels/open:gone/ws?after=2")).await;
    let token = creds.token_for("ann", json!({"channels": ["open:*"]}));
    let (mut centrifugo, _) = Client::connect(&standby, &token).await;
    let r = centrifugo
        .command("subscribe", json!({"channel": "open:gone"}))
        .await;
    assert_eq!(r["subscribe"]["offset"], 2, "{r}");
    publish(3).await;
    for offset in 1..=3 {
        assert_eq!(sse.expect_message().await.0, offset);
    }
    let mut closed = None;
    let frame = within("a message", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .expect("a frame");
    assert_eq!(frame["offset"], 3, "{frame}");
    assert_eq!(next_pub(&mut centrifugo, "open:gone").await, 3);

    // Deleted on the holder.
    let admin = [("x-api-key", creds.admin.as_str())];
    let (status, _, body) = holder
        .call("DELETE", "/v1/channels/open:gone", &admin, None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["head"], 3, "{body}");

    // Each subscriber on the standby gets the end: `deleted` and the end
    // of the stream (SSE), a `deleted` frame and Close 1000 (WebSocket),
    // Close 3010 "insufficient state" (Centrifugo).
    let event = within("deleted event", NODE_WAIT, sse.next_event())
        .await
        .expect("an event");
    assert_eq!(event.event.as_deref(), Some("deleted"), "{event:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&event.data).unwrap(),
        json!({"head": 3})
    );
    assert!(within("the stream ends", NODE_WAIT, sse.next_event())
        .await
        .is_none());
    let frame = within("deleted frame", NODE_WAIT, ws_next(&mut ws, &mut closed)).await;
    assert_eq!(frame, Some(json!({"type": "deleted", "head": 3})));
    assert!(within("close", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .is_none());
    assert_eq!(closed, Some(1000));
    assert_eq!(centrifugo.closed_with().await, Some(3010));

    // The channel goes on at head + 1, and a subscription made on the
    // standby after the deletion follows it.
    let mut after = SseClient::connect(
        &standby.client,
        &standby.url("/v1/channels/open:gone/events"),
        Some("3"),
    )
    .await;
    publish(4).await;
    assert_eq!(after.expect_message().await.0, 4);
}

/// The deletion's change notice alone ends the standby's subscriptions
/// (the test fails without the `NOTIFY` of `Storage::record_deletion`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_reaches_a_standby_by_its_notice_on_postgres() {
    deletion_reaches_a_standby(Backend::Postgres, Way::Notice).await;
}

/// A standby that missed the notice learns of the deletion from the
/// stored deletions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_reaches_a_standby_that_missed_the_notice_on_postgres() {
    deletion_reaches_a_standby(Backend::Postgres, Way::Stored).await;
}

/// On SQLite a standby (another process on the same data directory)
/// polls, and learns of the deletion from the stored deletions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_reaches_a_standby_on_sqlite() {
    deletion_reaches_a_standby(Backend::Sqlite, Way::Stored).await;
}

/// `unsubscribe` and `disconnect` called on the holder act on the user's
/// connections on the standby too, and on the holder's own; a code a
/// client reconnects after becomes 3011 there as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_and_disconnect_reach_every_node_on_postgres() {
    let place = Place::new(Backend::Postgres).await;
    let creds = Creds::new();
    let a = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let b = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    let admin = [("x-api-key", creds.admin.as_str())];
    let dave = creds.token_for("dave", json!({"channels": ["news:*"]}));
    let eve = creds.token_for("eve", json!({"channels": ["news:*"]}));
    let (mut dave_b, _) = Client::connect(&b, &dave).await;
    let (mut dave_a, _) = Client::connect(&a, &dave).await;
    let (mut eve_b, _) = Client::connect(&b, &eve).await;
    for channel in ["news:a", "news:b"] {
        let r = dave_b
            .command("subscribe", json!({"channel": channel}))
            .await;
        assert!(r["subscribe"].is_object(), "{r}");
    }
    for client in [&mut dave_a, &mut eve_b] {
        let r = client
            .command("subscribe", json!({"channel": "news:a"}))
            .await;
        assert!(r["subscribe"].is_object(), "{r}");
    }

    let (_, _, r) = a
        .call(
            "POST",
            "/api/unsubscribe",
            &admin,
            Some(json!({"user": "dave", "channel": "news:a"})),
        )
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    for client in [&mut dave_b, &mut dave_a] {
        let push = client.push().await;
        assert_eq!(push["channel"], "news:a", "{push}");
        assert_eq!(push["unsubscribe"]["code"], 2000, "{push}");
    }
    // dave's other subscription on node-b stays; eve's is untouched.
    let r = dave_b
        .command("subscribe", json!({"channel": "news:b"}))
        .await;
    assert_eq!(r["error"]["code"], 105, "still subscribed: {r}");
    let r = eve_b
        .command("subscribe", json!({"channel": "news:a"}))
        .await;
    assert_eq!(r["error"]["code"], 105, "still subscribed: {r}");

    let (_, _, r) = a
        .call(
            "POST",
            "/api/disconnect",
            &admin,
            Some(json!({"user": "dave"})),
        )
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    assert_eq!(dave_b.closed_with().await, Some(3503));
    assert_eq!(dave_a.closed_with().await, Some(3503));

    // Called on the standby, for a node's client elsewhere, with a code a
    // client reconnects after.
    let (mut eve_a, _) = Client::connect(&a, &eve).await;
    let (_, _, r) = b
        .call(
            "POST",
            "/api/disconnect",
            &admin,
            Some(json!({"user": "eve", "disconnect": {"code": 3100, "reason": "x"}})),
        )
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    assert_eq!(eve_a.closed_with().await, Some(3011));
    assert_eq!(eve_b.closed_with().await, Some(3011));
}

/// `info` asked on one node lists every live node with its counts as of
/// its last report (this node's own as of now).
async fn info_lists_every_node(backend: Backend) {
    let (_place, creds, a, b) = holder_and_standby(backend).await;
    let admin = [("x-api-key", creds.admin.as_str())];
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut ann, _) = Client::connect(&b, &token).await;
    for channel in ["news:a", "news:b"] {
        let r = ann.command("subscribe", json!({"channel": channel})).await;
        assert!(r["subscribe"].is_object(), "{r}");
    }
    // node-b reports every few seconds: wait for a report made since.
    let wanted = json!({"num_clients": 1, "num_users": 1, "num_subs": 2, "num_channels": 2});
    let nodes = within("node-b's report reaches node-a's info", NODE_WAIT, async {
        loop {
            let (_, _, r) = a.call("POST", "/api/info", &admin, Some(json!({}))).await;
            let nodes = r["result"]["nodes"].as_array().cloned().unwrap_or_default();
            let counts = |n: &Value| {
                json!({"num_clients": n["num_clients"], "num_users": n["num_users"],
                       "num_subs": n["num_subs"], "num_channels": n["num_channels"]})
            };
            if nodes.len() == 2 && counts(&nodes[1]) == wanted {
                return nodes;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(nodes[0]["uid"], "node-a");
    assert_eq!(nodes[0]["num_clients"], 0);
    assert_eq!(nodes[1]["uid"], "node-b");
    assert_eq!(nodes[1]["name"], "node-b");
    assert_eq!(nodes[1]["version"], env!("CARGO_PKG_VERSION"));
    // Asked on node-b, its own counts are of now.
    let (_, _, r) = b.call("POST", "/api/info", &admin, Some(json!({}))).await;
    assert_eq!(r["result"]["nodes"][1]["num_subs"], 2, "{r}");
    assert_eq!(r["result"]["nodes"][0]["uid"], "node-a", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_lists_every_node_on_sqlite() {
    info_lists_every_node(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_lists_every_node_on_postgres() {
    info_lists_every_node(Backend::Postgres).await;
}

/// `channels` asked on node-a until it answers `wanted` (node-b's counts
/// are as of its last report, made every few seconds).
async fn channels_until(a: &Node, admin: &[(&str, &str)], params: Value, wanted: Value) {
    let what = format!("node-a's channels become {wanted}");
    within(&what, NODE_WAIT, async {
        loop {
            let (_, _, r) = a
                .call("POST", "/api/channels", admin, Some(params.clone()))
                .await;
            if r["result"]["channels"] == wanted {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// A client of `user` on `node`, subscribed to `channels`.
async fn subscribed(node: &Node, creds: &Creds, user: &str, channels: &[&str]) -> Client {
    let token = creds.token_for(user, json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(node, &token).await;
    for channel in channels {
        let r = c.command("subscribe", json!({"channel": channel})).await;
        assert!(r["subscribe"].is_object(), "{r}");
    }
    c
}

/// `channels` asked on one node lists the channels with subscribers on
/// any node, with `num_clients` summed over the nodes (another node's as
/// of its last report); a channel with history but no subscribers is not
/// listed, and `pattern` filters the names.
async fn channels_counts_every_node(backend: Backend) {
    let (_place, creds, a, b) = holder_and_standby(backend).await;
    let admin = [("x-api-key", creds.admin.as_str())];
    let publisher = Creds::bearer(&creds.publisher);
    let (status, _, _) = a
        .publish_with(
            "news:history-only",
            &[("authorization", publisher.as_str())],
            json!({"n": 1}),
        )
        .await;
    assert_eq!(status, 201);
    let _ann = subscribed(&a, &creds, "ann", &["news:a"]).await;
    let mut bob = subscribed(&b, &creds, "bob", &["news:a", "news:b"]).await;
    let _cat = subscribed(&b, &creds, "cat", &["news:b"]).await;

    channels_until(
        &a,
        &admin,
        json!({}),
        json!({"news:a": {"num_clients": 2}, "news:b": {"num_clients": 2}}),
    )
    .await;
    // The same counts on node-b, where node-a's are the reported ones.
    channels_until(
        &b,
        &admin,
        json!({}),
        json!({"news:a": {"num_clients": 2}, "news:b": {"num_clients": 2}}),
    )
    .await;
    let (_, _, r) = a
        .call(
            "POST",
            "/api/channels",
            &admin,
            Some(json!({"pattern": "news:b"})),
        )
        .await;
    assert_eq!(
        r["result"]["channels"],
        json!({"news:b": {"num_clients": 2}}),
        "{r}"
    );

    // node-b's next report replaces its channels.
    let r = bob
        .command("unsubscribe", json!({"channel": "news:b"}))
        .await;
    assert!(r["unsubscribe"].is_object(), "{r}");
    channels_until(
        &a,
        &admin,
        json!({}),
        json!({"news:a": {"num_clients": 2}, "news:b": {"num_clients": 1}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_counts_every_node_on_sqlite() {
    channels_counts_every_node(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_counts_every_node_on_postgres() {
    channels_counts_every_node(Backend::Postgres).await;
}
