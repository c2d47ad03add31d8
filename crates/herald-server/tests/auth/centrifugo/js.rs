//! centrifuge-js, Centrifugo's JavaScript SDK (npm `centrifuge` 5.x under
//! Node with the `ws` package, `tests/clients/centrifuge.mjs`), against
//! Herald unchanged: it connects with a JWT, subscribes, receives
//! publications, publishes where the namespace allows it, reads history,
//! recovers what it missed while it was disconnected, and recovers again
//! after the node restarts: every publication exactly once, in order,
//! `recovered: true`, the same epoch throughout. With `joinLeave` it sees
//! the joins and leaves of another client, on another node on
//! PostgreSQL. The same recovery holds for a server-side subscription (the
//! token's `subs`), whose publications, with their tags, the SDK reports
//! on the client object.
//!
//! The test command installs the packages (`npm ci` in `tests/clients`)
//! and names that directory in `HERALD_TEST_NODE_CLIENTS` (and `node` in
//! `HERALD_TEST_NODE`, else `node` on `PATH`).

use std::process::Stdio;

use herald_server::NamespaceRule;
use herald_testkit::clients::{node_bin, node_clients};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::{Backend, Creds, Node, Place, Role};

/// One `node centrifuge.mjs` process: commands in, reports out.
struct JsClient {
    child: Child,
    stdin: Option<ChildStdin>,
    reports: Lines<BufReader<ChildStdout>>,
    /// `(offset, data)` of every publication of the followed channel
    /// (client-side or server-side subscription), in arrival order.
    received: Vec<(u64, Value)>,
    /// The tags of each of `received` (`null` for none).
    received_tags: Vec<Value>,
    channel: &'static str,
    /// `connecting` reports for a lost connection (code 0 is the SDK's
    /// own `connect()` call).
    reconnects: usize,
}

impl JsClient {
    fn start(url: &str, token: &str, channel: &'static str) -> Self {
        let clients = node_clients(&["centrifuge", "ws"], &["centrifuge.mjs"]);
        let node = node_bin();
        let mut child = Command::new(&node)
            .arg(clients.join("centrifuge.mjs"))
            .arg(url)
            .arg(token)
            .current_dir(&clients)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", node.display()));
        let stdin = child.stdin.take();
        let reports = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            reports,
            received: Vec::new(),
            received_tags: Vec::new(),
            channel,
            reconnects: 0,
        }
    }

    async fn send(&mut self, command: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// Reads reports until one satisfies `wanted`; publications of the
    /// followed channel are recorded on the way; a failed command fails
    /// the test.
    async fn expect(&mut self, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        within(what, NODE_WAIT, async {
            loop {
                let line = self
                    .reports
                    .next_line()
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("centrifuge.mjs ended before {what}"));
                let report: Value = serde_json::from_str(&line).unwrap();
                assert_ne!(report["type"], "failed", "{report}");
                if report["type"] == "connecting" && report["code"] != 0 {
                    self.reconnects += 1;
                }
                if is_publication(&report) && report["channel"] == self.channel {
                    self.received
                        .push((report["offset"].as_u64().unwrap(), report["data"].clone()));
                    self.received_tags.push(report["tags"].clone());
                }
                if wanted(&report) {
                    return report;
                }
            }
        })
        .await
    }

    /// Waits until the followed channel's publications reach `offset`.
    async fn received_up_to(&mut self, offset: u64) {
        if self.received.last().is_some_and(|(o, _)| *o >= offset) {
            return;
        }
        let channel = self.channel;
        self.expect(&format!("publication {offset}"), |r| {
            is_publication(r) && r["channel"] == channel && r["offset"].as_u64() >= Some(offset)
        })
        .await;
    }

    async fn stop(mut self) {
        drop(self.stdin.take());
        let status = within("centrifuge.mjs exit", NODE_WAIT, self.child.wait())
            .await
            .unwrap();
        assert!(status.success(), "centrifuge.mjs: {status}");
    }
}

/// A publication of a client-side or a server-side subscription.
fn is_publication(report: &Value) -> bool {
    report["type"] == "publication" || report["type"] == "server_publication"
}

fn is(kind: &'static str, channel: &'static str) -> impl Fn(&Value) -> bool {
    move |r| r["type"] == kind && (channel.is_empty() || r["channel"] == channel)
}

async fn centrifuge_js(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, creds.config(), listener).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for(
        "js",
        json!({"channels": ["news:*", "room:*"], "publish": ["room:*"]}),
    );
    let mut js = JsClient::start(
        &format!("ws://{addr}/connection/websocket"),
        &token,
        "news:js",
    );
    js.expect("connected", is("connected", "")).await;

    js.send(json!({"op": "subscribe", "channel": "news:js"}))
        .await;
    let subscribed = js.expect("subscribed", is("subscribed", "news:js")).await;
    assert_eq!(subscribed["recoverable"], true, "{subscribed}");
    let epoch = subscribed["epoch"].as_str().unwrap().to_owned();
    for i in 1..=3 {
        assert_eq!(
            node.publish_with("news:js", &key, json!({"n": i})).await.0,
            201
        );
    }
    js.received_up_to(3).await;

    // Publish from the client, in `room` (publish = "token").
    js.send(json!({"op": "subscribe", "channel": "room:js"}))
        .await;
    js.expect("subscribed to room:js", is("subscribed", "room:js"))
        .await;
    js.send(json!({"op": "publish", "channel": "room:js", "data": {"from": "js"}}))
        .await;
    let publication = js
        .expect("the client's publication", is("publication", "room:js"))
        .await;
    assert_eq!(publication["data"], json!({"from": "js"}));
    assert_eq!(publication["offset"], 1);

    // History.
    js.send(json!({"op": "history", "channel": "news:js", "limit": 10}))
        .await;
    let history = js.expect("history", is("history", "news:js")).await;
    assert_eq!(history["offsets"], json!([1, 2, 3]), "{history}");
    assert_eq!(history["epoch"], epoch.as_str());

    // Disconnected while 4 and 5 are published: recovered on connect.
    js.send(json!({"op": "disconnect"})).await;
    js.expect("disconnected", is("disconnected", "")).await;
    for i in 4..=5 {
        assert_eq!(
            node.publish_with("news:js", &key, json!({"n": i})).await.0,
            201
        );
    }
    js.send(json!({"op": "connect"})).await;
    let again = js.expect("resubscribed", is("subscribed", "news:js")).await;
    assert_eq!(again["wasRecovering"], true, "{again}");
    assert_eq!(again["recovered"], true, "{again}");
    assert_eq!(again["epoch"], epoch.as_str());
    js.received_up_to(5).await;

    // The node restarts on the same address: the client reconnects by
    // itself and recovers, same epoch; 6 is published while it is away.
    node.stop().await;
    js.expect("reconnecting", is("connecting", "")).await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, creds.config(), listener).await;
    assert_eq!(
        node.publish_with("news:js", &key, json!({"n": 6})).await.0,
        201
    );
    let restarted = js
        .expect(
            "resubscribed after the restart",
            is("subscribed", "news:js"),
        )
        .await;
    assert_eq!(restarted["wasRecovering"], true, "{restarted}");
    assert_eq!(restarted["recovered"], true, "{restarted}");
    assert_eq!(restarted["epoch"], epoch.as_str());
    assert_eq!(
        node.publish_with("news:js", &key, json!({"n": 7})).await.0,
        201
    );
    js.received_up_to(7).await;

    // Every publication exactly once, in order, with its data.
    let expected: Vec<(u64, Value)> = (1..=7).map(|i| (i, json!({"n": i}))).collect();
    assert_eq!(js.received, expected);
    js.stop().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_on_sqlite() {
    centrifuge_js(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_on_postgres() {
    centrifuge_js(Backend::Postgres).await;
}

/// Publishes `{"n": n}` with the tag `n` to `feed:js` through the server
/// API with `key`; it gets offset `n`.
async fn publish_feed(node: &Node, key: &str, n: u64) {
    let body = json!({"channel": "feed:js", "data": {"n": n}, "tags": {"n": n.to_string()}});
    let (status, _, r) = node
        .call("POST", "/api/publish", &[("x-api-key", key)], Some(body))
        .await;
    assert_eq!(
        (status, r["result"]["offset"].clone()),
        (200, json!(n)),
        "{r}"
    );
}

/// A server-side subscription (the connection token's `subs`): the SDK
/// reports it subscribed at connect and its publications, tags included,
/// on the client object; it recovers after the node restarts on the same
/// address (`recovered: true`, the same epoch), and every publication
/// arrives exactly once, in order.
async fn server_side_subscription(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, creds.config(), listener).await;
    let token = creds.token_for(
        "js",
        json!({"subs": {"feed:js": {"data": {"hello": "js"}}}}),
    );
    let mut js = JsClient::start(
        &format!("ws://{addr}/connection/websocket"),
        &token,
        "feed:js",
    );
    js.expect("connected", is("connected", "")).await;
    let subscribed = js
        .expect("server-side subscribed", is("server_subscribed", "feed:js"))
        .await;
    assert_eq!(subscribed["recoverable"], true, "{subscribed}");
    assert_eq!(subscribed["data"], json!({"hello": "js"}), "{subscribed}");
    let epoch = subscribed["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16);
    for n in 1..=2 {
        publish_feed(&node, &creds.backend, n).await;
    }
    js.received_up_to(2).await;

    // The node restarts on the same address: the client reconnects by
    // itself and its connect asks to recover the server-side subscription.
    // 3 is published while it is away (through another node, before the
    // address listens again), so it can only come by the recovery.
    node.stop().await;
    js.expect("reconnecting", is("connecting", "")).await;
    let other = Node::start(&place, "node-x", Role::Holder, creds.config()).await;
    publish_feed(&other, &creds.backend, 3).await;
    other.stop().await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, creds.config(), listener).await;
    let again = js
        .expect(
            "server-side subscribed after the restart",
            is("server_subscribed", "feed:js"),
        )
        .await;
    assert_eq!(again["wasRecovering"], true, "{again}");
    assert_eq!(again["recovered"], true, "{again}");
    assert_eq!(again["epoch"], epoch.as_str());
    assert_eq!(js.received.len(), 2, "3 came before the recovery");
    publish_feed(&node, &creds.backend, 4).await;
    js.received_up_to(4).await;

    let expected: Vec<(u64, Value)> = (1..=4).map(|n| (n, json!({"n": n}))).collect();
    assert_eq!(js.received, expected);
    let tags: Vec<Value> = (1..=4).map(|n| json!({"n": n.to_string()})).collect();
    assert_eq!(js.received_tags, tags);
    js.stop().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_server_side_subscription_on_sqlite() {
    server_side_subscription(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_server_side_subscription_on_postgres() {
    server_side_subscription(Backend::Postgres).await;
}

/// The holder stops (and releases the lease) while a centrifuge-js client
/// follows a channel on the standby: the standby takes over, the client
/// stays connected (no reconnect), and every publication, before and
/// after the takeover, arrives exactly once, in order.
async fn holder_failover(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for("js", json!({"channels": ["news:*"]}));
    let mut js = JsClient::start(
        &format!("{}/connection/websocket", standby.ws_base),
        &token,
        "news:fo",
    );
    js.expect("connected", is("connected", "")).await;
    js.send(json!({"op": "subscribe", "channel": "news:fo"}))
        .await;
    js.expect("subscribed", is("subscribed", "news:fo")).await;
    for i in 1..=3 {
        // Through the standby: forwarded to the holder.
        assert_eq!(
            standby
                .publish_with("news:fo", &key, json!({"n": i}))
                .await
                .0,
            201
        );
    }
    js.received_up_to(3).await;
    holder.stop().await;
    // The standby takes the lease over; its publishes commit there.
    let took_over = within(
        "takeover",
        NODE_WAIT,
        standby
            .lease
            .wait_for(|s| matches!(s, herald_lease::LeaseState::Holder { .. })),
    )
    .await;
    assert!(took_over.is_some(), "the standby's supervisor ended");
    for i in 4..=6 {
        let (status, _, body) = standby.publish_with("news:fo", &key, json!({"n": i})).await;
        assert_eq!((status, body["offset"].clone()), (201, json!(i)), "{body}");
    }
    js.received_up_to(6).await;
    let expected: Vec<(u64, Value)> = (1..=6).map(|i| (i, json!({"n": i}))).collect();
    assert_eq!(js.received, expected);
    assert_eq!(
        js.reconnects, 0,
        "the client was disconnected by the failover"
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_survives_holder_failover_on_sqlite() {
    holder_failover(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_survives_holder_failover_on_postgres() {
    holder_failover(Backend::Postgres).await;
}

/// centrifuge-js subscribed with `joinLeave: true` in a namespace with
/// `join_leave` sees its own join, then the join of another client (with
/// its connection token's `info` as `connInfo`), its leave when it
/// unsubscribes, and again a join and a leave when it subscribes and
/// disconnects. On PostgreSQL the other client is on the other node; on
/// SQLite both are on one node (its nodes are processes on one host that
/// do not pass joins and leaves to each other, see docs/centrifugo.md).
async fn joins_and_leaves(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    config.namespaces.insert(
        "chat".to_owned(),
        NamespaceRule {
            join_leave: Some(true),
            ..NamespaceRule::default()
        },
    );
    let holder = Node::start(&place, "node-a", Role::Holder, config.clone()).await;
    let standby = match backend {
        Backend::Postgres => Some(Node::start(&place, "node-b", Role::Standby, config).await),
        Backend::Sqlite => None,
    };
    let other_node = standby.as_ref().unwrap_or(&holder);
    let ann = creds.token_for("ann", json!({"channels": ["chat:*"]}));
    let bob = creds.token_for(
        "bob",
        json!({"channels": ["chat:*"], "info": {"name": "Bob"}}),
    );
    let mut watcher = JsClient::start(
        &format!("{}/connection/websocket", holder.ws_base),
        &ann,
        "chat:js",
    );
    let me = watcher.expect("connected", is("connected", "")).await["client"].clone();
    watcher
        .send(json!({"op": "subscribe", "channel": "chat:js", "joinLeave": true}))
        .await;
    watcher
        .expect("subscribed", is("subscribed", "chat:js"))
        .await;
    let own = watcher.expect("its own join", is("join", "chat:js")).await;
    assert_eq!(
        (&own["client"], &own["user"]),
        (&me, &json!("ann")),
        "{own}"
    );

    let mut other = JsClient::start(
        &format!("{}/connection/websocket", other_node.ws_base),
        &bob,
        "chat:js",
    );
    let theirs = other.expect("connected", is("connected", "")).await["client"].clone();
    let event = |kind: &str| {
        json!({"type": kind, "channel": "chat:js", "client": theirs, "user": "bob",
               "connInfo": {"name": "Bob"}, "chanInfo": null})
    };
    other
        .send(json!({"op": "subscribe", "channel": "chat:js"}))
        .await;
    other
        .expect("subscribed", is("subscribed", "chat:js"))
        .await;
    let join = watcher.expect("bob's join", is("join", "chat:js")).await;
    assert_eq!(join, event("join"));
    other
        .send(json!({"op": "unsubscribe", "channel": "chat:js"}))
        .await;
    other
        .expect("unsubscribed", is("unsubscribed", "chat:js"))
        .await;
    let leave = watcher.expect("bob's leave", is("leave", "chat:js")).await;
    assert_eq!(leave, event("leave"));

    // Subscribed again, then disconnected: a join, then a leave.
    other
        .send(json!({"op": "subscribe", "channel": "chat:js"}))
        .await;
    other
        .expect("subscribed", is("subscribed", "chat:js"))
        .await;
    let join = watcher.expect("bob's join", is("join", "chat:js")).await;
    assert_eq!(join, event("join"));
    other.send(json!({"op": "disconnect"})).await;
    other.expect("disconnected", is("disconnected", "")).await;
    let leave = watcher.expect("bob's leave", is("leave", "chat:js")).await;
    assert_eq!(leave, event("leave"));
    other.stop().await;
    watcher.stop().await;
    if let Some(standby) = standby {
        standby.stop().await;
    }
    holder.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_sees_joins_and_leaves_on_sqlite() {
    joins_and_leaves(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_sees_joins_and_leaves_across_nodes_on_postgres() {
    joins_and_leaves(Backend::Postgres).await;
}
