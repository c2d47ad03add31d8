//! Centrifugo's client SDKs against Herald unchanged, each scenario with
//! both: centrifuge-js (npm `centrifuge` 5.x under Node with the `ws`
//! package, `tests/clients/centrifuge.mjs`) and centrifuge-python (PyPI
//! `centrifuge-python`, `tests/clients/python/centrifuge_follow.py`),
//! driven alike by `herald_testkit::sdk::SdkClient`. A client connects
//! with a JWT, subscribes, receives publications, publishes where the
//! namespace allows it (and is refused where it does not), reads history
//! and presence, recovers what it missed while it was disconnected, and
//! recovers again after the node restarts: every publication exactly once,
//! in order, `recovered: true`, the same epoch throughout. With
//! `joinLeave` it sees the joins and leaves of another client, on another
//! node on PostgreSQL. The same recovery holds for a server-side
//! subscription (the token's `subs`), whose publications, with their tags,
//! the SDK reports on the client object.
//!
//! The test command installs the SDKs (`npm ci` in `tests/clients`, a
//! virtualenv from `tests/clients/python/requirements.lock`) and names
//! them in `HERALD_TEST_NODE_CLIENTS` (and `node` in `HERALD_TEST_NODE`,
//! else `node` on `PATH`) and `HERALD_TEST_PYTHON`.

use herald_auth::NamespaceRule;
use herald_server::{CentrifugoConfig, ServerConfig};
use herald_testkit::sdk::{is, Sdk, SdkClient};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};

use super::holder_and_standby;
use crate::{Backend, Creds, Node, Place, Role};

/// The tests of a scenario `async fn(Sdk, Backend)`, one per SDK and
/// backend: `$js_sqlite`, `$js_postgres`, `$python_sqlite`,
/// `$python_postgres`.
macro_rules! with_each_sdk_on_both_backends {
    ($scenario:ident: $js_sqlite:ident, $js_postgres:ident, $python_sqlite:ident, $python_postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $js_sqlite() {
            $scenario(Sdk::Js, Backend::Sqlite).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $js_postgres() {
            $scenario(Sdk::Js, Backend::Postgres).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $python_sqlite() {
            $scenario(Sdk::Python, Backend::Sqlite).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $python_postgres() {
            $scenario(Sdk::Python, Backend::Postgres).await;
        }
    };
}

/// The `ws://` URL of the client protocol on `addr`.
fn ws_url(addr: impl std::fmt::Display) -> String {
    Transport::WebSocket.url(addr)
}

/// The client protocol's transports, as centrifuge-js picks them from the
/// URL (`tests/clients/centrifuge.mjs`), and its encoding.
#[derive(Debug, Clone, Copy)]
enum Transport {
    WebSocket,
    /// WebSocket, protobuf (the SDK's protobuf build).
    WebSocketProtobuf,
    /// HTTP streaming, protobuf, commands through `/emulation`.
    HttpStreamProtobuf,
    /// HTTP streaming, commands through `/emulation`.
    HttpStream,
    /// SSE, commands through `/emulation`.
    Sse,
}

impl Transport {
    /// The endpoint on `addr` (`host:port`).
    fn url(self, addr: impl std::fmt::Display) -> String {
        match self {
            Self::WebSocket | Self::WebSocketProtobuf => {
                format!("ws://{addr}/connection/websocket")
            }
            Self::HttpStream | Self::HttpStreamProtobuf => {
                format!("http://{addr}/connection/http_stream")
            }
            Self::Sse => format!("http://{addr}/connection/sse"),
        }
    }

    /// Starts `sdk`'s client over this transport (see [`SdkClient::start`]).
    fn start(
        self,
        sdk: Sdk,
        what: &str,
        addr: impl std::fmt::Display,
        token: &str,
        channel: &str,
    ) -> SdkClient {
        let what = format!("{what} over {self:?}");
        match self {
            Self::WebSocketProtobuf | Self::HttpStreamProtobuf => {
                SdkClient::start_protobuf(sdk, &what, &self.url(addr), token, channel)
            }
            _ => SdkClient::start(sdk, &what, &self.url(addr), token, channel),
        }
    }
}

/// The whole client-side scenario, with presence on: connect, subscribe,
/// publications, presence and its stats, a client publish (allowed in
/// `room`, 103 in `news`), history, recovery after a disconnect and after
/// the node restarts on the same address.
async fn channel_scenario(sdk: Sdk, backend: Backend) {
    channel_scenario_over(sdk, backend, Transport::WebSocket).await;
}

/// [`channel_scenario`] over `transport`.
async fn channel_scenario_over(sdk: Sdk, backend: Backend, transport: Transport) {
    sdk.check();
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, config.clone(), listener).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for(
        "ann",
        json!({"channels": ["news:*", "room:*"], "publish": ["room:*"]}),
    );
    let mut c = transport.start(sdk, "of news:s", addr, &token, "news:s");
    let me = c.expect("connected", is("connected", "")).await["client"].clone();

    c.send(json!({"op": "subscribe", "channel": "news:s"}))
        .await;
    let subscribed = c.expect("subscribed", is("subscribed", "news:s")).await;
    assert_eq!(subscribed["recoverable"], true, "{subscribed}");
    assert_eq!(subscribed["offset"], 0, "a new channel: {subscribed}");
    let epoch = subscribed["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16, "{subscribed}");
    for i in 1..=3 {
        assert_eq!(
            node.publish_with("news:s", &key, json!({"n": i})).await.0,
            201
        );
    }
    c.received_up_to(3).await;

    // Presence: this client alone.
    c.send(json!({"op": "presence", "channel": "news:s"})).await;
    let presence = c.expect("presence", is("presence", "news:s")).await;
    let mut alone = serde_json::Map::new();
    alone.insert(
        me.as_str().unwrap().to_owned(),
        json!({"client": me, "user": "ann", "connInfo": null, "chanInfo": null}),
    );
    assert_eq!(presence["clients"], Value::Object(alone), "{presence}");
    c.send(json!({"op": "presence_stats", "channel": "news:s"}))
        .await;
    let stats = c
        .expect("presence_stats", is("presence_stats", "news:s"))
        .await;
    assert_eq!(
        (&stats["numClients"], &stats["numUsers"]),
        (&json!(1), &json!(1)),
        "{stats}"
    );

    // Publish from the client: allowed in `room` (publish = "token"),
    // refused in `news` (publish = "key").
    c.send(json!({"op": "subscribe", "channel": "room:s"}))
        .await;
    c.expect("subscribed to room:s", is("subscribed", "room:s"))
        .await;
    c.send(json!({"op": "publish", "channel": "room:s", "data": {"from": "sdk"}}))
        .await;
    let (mut acknowledged, mut publication) = (false, None);
    while !acknowledged || publication.is_none() {
        let report = c
            .expect("the client's publish acknowledged and delivered", |r| {
                is("published", "room:s")(r) || is("publication", "room:s")(r)
            })
            .await;
        if report["type"] == "published" {
            acknowledged = true;
        } else {
            assert!(publication.is_none(), "delivered twice: {report}");
            publication = Some(report);
        }
    }
    let publication = publication.unwrap();
    assert_eq!(publication["data"], json!({"from": "sdk"}), "{publication}");
    assert_eq!(publication["offset"], 1, "{publication}");
    c.send(json!({"op": "publish", "channel": "news:s", "data": {"from": "sdk"}}))
        .await;
    let refused = c
        .expect("the refused publish", |r| {
            r["type"] == "failed" && r["op"] == "publish"
        })
        .await;
    assert_eq!(refused["code"], 103, "{refused}");

    // History.
    c.send(json!({"op": "history", "channel": "news:s", "limit": 10}))
        .await;
    let history = c.expect("history", is("history", "news:s")).await;
    assert_eq!(history["offsets"], json!([1, 2, 3]), "{history}");
    assert_eq!(history["offset"], 3, "{history}");
    assert_eq!(history["epoch"], epoch.as_str());

    // Disconnected while 4 and 5 are published: recovered on connect.
    c.send(json!({"op": "disconnect"})).await;
    c.expect("disconnected", is("disconnected", "")).await;
    for i in 4..=5 {
        assert_eq!(
            node.publish_with("news:s", &key, json!({"n": i})).await.0,
            201
        );
    }
    c.send(json!({"op": "connect"})).await;
    let again = c.expect("resubscribed", is("subscribed", "news:s")).await;
    assert_eq!(again["wasRecovering"], true, "{again}");
    assert_eq!(again["recovered"], true, "{again}");
    assert_eq!(again["epoch"], epoch.as_str());
    c.received_up_to(5).await;

    // The node restarts on the same address: the client reconnects by
    // itself and recovers, same epoch; 6 is published while it is away.
    node.stop().await;
    c.expect("reconnecting", is("connecting", "")).await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, config, listener).await;
    assert_eq!(
        node.publish_with("news:s", &key, json!({"n": 6})).await.0,
        201
    );
    let restarted = c
        .expect("resubscribed after the restart", is("subscribed", "news:s"))
        .await;
    assert_eq!(restarted["wasRecovering"], true, "{restarted}");
    assert_eq!(restarted["recovered"], true, "{restarted}");
    assert_eq!(restarted["epoch"], epoch.as_str());
    assert_eq!(
        node.publish_with("news:s", &key, json!({"n": 7})).await.0,
        201
    );
    c.received_up_to(7).await;

    // Every publication exactly once, in order, with its data; and the
    // client was subscribed three times, all in the one epoch.
    let expected: Vec<(u64, Value)> = (1..=7).map(|i| (i, json!({"n": i}))).collect();
    assert_eq!(c.received, expected);
    assert_eq!(c.subscribed.len(), 3, "{:?}", c.subscribed);
    c.stop().await;
    node.stop().await;
}

with_each_sdk_on_both_backends!(channel_scenario:
    centrifuge_js_on_sqlite,
    centrifuge_js_on_postgres,
    centrifuge_python_on_sqlite,
    centrifuge_python_on_postgres);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_over_http_stream_on_sqlite() {
    channel_scenario_over(Sdk::Js, Backend::Sqlite, Transport::HttpStream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_over_http_stream_on_postgres() {
    channel_scenario_over(Sdk::Js, Backend::Postgres, Transport::HttpStream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_over_websocket_on_sqlite() {
    channel_scenario_over(Sdk::Js, Backend::Sqlite, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_over_websocket_on_postgres() {
    channel_scenario_over(Sdk::Js, Backend::Postgres, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_python_protobuf_on_sqlite() {
    channel_scenario_over(Sdk::Python, Backend::Sqlite, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_python_protobuf_on_postgres() {
    channel_scenario_over(Sdk::Python, Backend::Postgres, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_over_http_stream_on_sqlite() {
    channel_scenario_over(Sdk::Js, Backend::Sqlite, Transport::HttpStreamProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_over_http_stream_on_postgres() {
    channel_scenario_over(Sdk::Js, Backend::Postgres, Transport::HttpStreamProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_over_sse_on_sqlite() {
    channel_scenario_over(Sdk::Js, Backend::Sqlite, Transport::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_over_sse_on_postgres() {
    channel_scenario_over(Sdk::Js, Backend::Postgres, Transport::Sse).await;
}

/// Publishes `data` to `channel` through the server API with `key` and
/// `tags`; returns its offset.
async fn publish_tagged(node: &Node, key: &str, channel: &str, data: Value, tags: Value) -> u64 {
    let body = json!({"channel": channel, "data": data, "tags": tags});
    let (status, _, r) = node
        .call("POST", "/api/publish", &[("x-api-key", key)], Some(body))
        .await;
    assert_eq!(status, 200, "{r}");
    r["result"]["offset"].as_u64().expect("an offset")
}

/// centrifuge-js over `transport`: a subscription with a tags filter
/// (`team eq eng`) gets only the publications it passes, live and in its
/// recovery after a reconnect; a subscription with `getState` whose first
/// position has an epoch the channel never had is answered 112 (the SDK
/// asks `rejectUnrecovered`), so the SDK calls `getState` again and
/// recovers from the second position, every later publication once.
async fn filters_and_state(backend: Backend, transport: Transport) {
    let sdk = Sdk::Js;
    sdk.check();
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let config = creds.config();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, config, listener).await;
    let key = creds.backend.as_str();
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let mut c = transport.start(sdk, "with a filter", addr, &token, "news:tf");
    c.expect("connected", is("connected", "")).await;
    let filter = json!({"key": "team", "cmp": "eq", "val": "eng"});
    c.send(json!({"op": "subscribe", "channel": "news:tf", "tagsFilter": filter}))
        .await;
    c.expect("subscribed", is("subscribed", "news:tf")).await;
    let mut eng = Vec::new();
    for (i, team) in ["ops", "eng", "ops", "eng"].into_iter().enumerate() {
        let offset = publish_tagged(
            &node,
            key,
            "news:tf",
            json!({"i": i}),
            json!({"team": team}),
        )
        .await;
        if team == "eng" {
            eng.push((offset, json!({"i": i})));
        }
    }
    c.received_up_to(eng.last().unwrap().0).await;
    c.send(json!({"op": "disconnect"})).await;
    c.expect("disconnected", is("disconnected", "")).await;
    for (i, team) in [(4, "eng"), (5, "ops"), (6, "eng")] {
        let offset = publish_tagged(
            &node,
            key,
            "news:tf",
            json!({"i": i}),
            json!({"team": team}),
        )
        .await;
        if team == "eng" {
            eng.push((offset, json!({"i": i})));
        }
    }
    c.send(json!({"op": "connect"})).await;
    let again = c.expect("resubscribed", is("subscribed", "news:tf")).await;
    assert_eq!(again["recovered"], true, "{again}");
    c.received_up_to(eng.last().unwrap().0).await;
    assert_eq!(c.received, eng, "only `team eq eng`, each once, in order");
    assert!(
        c.received_tags.iter().all(|t| t["team"] == "eng"),
        "{:?}",
        c.received_tags
    );
    c.stop().await;

    // getState: a stale position (an epoch the channel never had), then
    // the right one.
    for i in 1..=3 {
        publish_tagged(&node, key, "news:gs", json!({"n": i}), json!({})).await;
    }
    let (_, _, history) = node
        .call(
            "POST",
            "/api/history",
            &[("x-api-key", key)],
            Some(json!({"channel": "news:gs", "limit": 0})),
        )
        .await;
    let epoch = history["result"]["epoch"].as_str().unwrap().to_owned();
    let mut c = transport.start(sdk, "with getState", addr, &token, "news:gs");
    c.expect("connected", is("connected", "")).await;
    c.send(json!({"op": "states", "channel": "news:gs", "states": [
        {"offset": 2, "epoch": "not-this-epoch"},
        {"offset": 2, "epoch": epoch},
    ]}))
    .await;
    c.send(json!({"op": "subscribe", "channel": "news:gs", "getState": true}))
        .await;
    c.expect("the first getState", is("get_state", "news:gs"))
        .await;
    c.expect("the second getState, after 112", is("get_state", "news:gs"))
        .await;
    let subscribed = c.expect("subscribed", is("subscribed", "news:gs")).await;
    assert_eq!(subscribed["recovered"], true, "{subscribed}");
    assert_eq!(subscribed["epoch"], epoch.as_str(), "{subscribed}");
    publish_tagged(&node, key, "news:gs", json!({"n": 4}), json!({})).await;
    c.received_up_to(4).await;
    let expected: Vec<(u64, Value)> = (3..=4).map(|i| (i, json!({"n": i}))).collect();
    assert_eq!(c.received, expected, "recovered from offset 2, then live");
    c.stop().await;
    node.stop().await;
}

/// Asks the SDK for its counts of whole payloads and deltas on `delta:d`
/// and checks them.
async fn delta_stats_are(c: &mut SdkClient, full: u64, deltas: u64) {
    c.send(json!({"op": "delta_stats", "channel": "delta:d"}))
        .await;
    let stats = c.expect("delta stats", is("delta_stats", "delta:d")).await;
    assert_eq!(
        (&stats["full"], &stats["deltas"]),
        (&json!(full), &json!(deltas)),
        "{stats}"
    );
}

/// centrifuge-js over `transport`, subscribed with `delta: "fossil"` in a
/// namespace with `fossil_delta`: every publication arrives whole to the
/// application, once, in order, also those recovered after a reconnect,
/// and the SDK counts the live ones after the first as deltas, but for
/// one over the node's delta bound (16 KiB) and the one after it, which
/// come whole and which the SDK takes as its next base.
async fn fossil_delta(backend: Backend, transport: Transport) {
    let sdk = Sdk::Js;
    sdk.check();
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    config.namespaces.insert(
        "delta".to_owned(),
        NamespaceRule {
            fossil_delta: Some(true),
            ..NamespaceRule::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, config, listener).await;
    let key = creds.backend.as_str();
    let token = creds.token_for("ann", json!({"channels": ["delta:*"]}));
    let mut c = transport.start(sdk, "with delta", addr, &token, "delta:d");
    c.expect("connected", is("connected", "")).await;
    c.send(json!({"op": "subscribe", "channel": "delta:d", "delta": "fossil"}))
        .await;
    c.expect("subscribed", is("subscribed", "delta:d")).await;
    let pad = "x".repeat(400);
    // Publication 5 is over the delta bound.
    let large = "y".repeat(20 * 1024);
    let data = |i: u64| {
        let pad = if i == 5 { &large } else { &pad };
        json!({"i": i, "pad": pad, "note": "é ✓"})
    };
    for i in 1..=4 {
        publish_tagged(&node, key, "delta:d", data(i), json!({})).await;
    }
    c.received_up_to(4).await;
    delta_stats_are(&mut c, 1, 3).await;
    for i in 5..=7 {
        publish_tagged(&node, key, "delta:d", data(i), json!({})).await;
    }
    c.received_up_to(7).await;
    delta_stats_are(&mut c, 3, 4).await;
    c.send(json!({"op": "disconnect"})).await;
    c.expect("disconnected", is("disconnected", "")).await;
    for i in 8..=9 {
        publish_tagged(&node, key, "delta:d", data(i), json!({})).await;
    }
    c.send(json!({"op": "connect"})).await;
    let again = c.expect("resubscribed", is("subscribed", "delta:d")).await;
    assert_eq!(again["recovered"], true, "{again}");
    publish_tagged(&node, key, "delta:d", data(10), json!({})).await;
    c.received_up_to(10).await;
    let expected: Vec<(u64, Value)> = (1..=10).map(|i| (i, data(i))).collect();
    assert_eq!(
        c.received, expected,
        "every publication whole, once, in order"
    );
    c.stop().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_decodes_fossil_deltas_over_websocket_on_sqlite() {
    fossil_delta(Backend::Sqlite, Transport::WebSocket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_decodes_fossil_deltas_over_sse_on_postgres() {
    fossil_delta(Backend::Postgres, Transport::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_decodes_fossil_deltas_over_websocket_on_postgres() {
    fossil_delta(Backend::Postgres, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_filters_and_reloads_state_over_websocket_on_sqlite() {
    filters_and_state(Backend::Sqlite, Transport::WebSocket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_filters_and_reloads_state_over_http_stream_on_postgres() {
    filters_and_state(Backend::Postgres, Transport::HttpStream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_filters_and_reloads_state_over_sse_on_sqlite() {
    filters_and_state(Backend::Sqlite, Transport::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_filters_and_reloads_state_over_websocket_on_postgres() {
    filters_and_state(Backend::Postgres, Transport::WebSocketProtobuf).await;
}

/// Publishes `{"n": n}` with the tag `n` to `feed:s` through the server
/// API with `key`; it gets offset `n`.
async fn publish_feed(node: &Node, key: &str, n: u64) {
    let body = json!({"channel": "feed:s", "data": {"n": n}, "tags": {"n": n.to_string()}});
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
async fn server_side_subscription(sdk: Sdk, backend: Backend) {
    sdk.check();
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, creds.config(), listener).await;
    let token = creds.token_for(
        "ann",
        json!({"subs": {"feed:s": {"data": {"hello": "sdk"}}}}),
    );
    let mut c = SdkClient::start(sdk, "of feed:s", &ws_url(addr), &token, "feed:s");
    c.expect("connected", is("connected", "")).await;
    let subscribed = c
        .expect("server-side subscribed", is("server_subscribed", "feed:s"))
        .await;
    assert_eq!(subscribed["recoverable"], true, "{subscribed}");
    assert_eq!(subscribed["data"], json!({"hello": "sdk"}), "{subscribed}");
    let epoch = subscribed["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16);
    for n in 1..=2 {
        publish_feed(&node, &creds.backend, n).await;
    }
    c.received_up_to(2).await;

    // The node restarts on the same address: the client reconnects by
    // itself and its connect asks to recover the server-side subscription.
    // 3 is published while it is away (through another node, before the
    // address listens again), so it can only come by the recovery.
    node.stop().await;
    c.expect("reconnecting", is("connecting", "")).await;
    let other = Node::start(&place, "node-x", Role::Holder, creds.config()).await;
    publish_feed(&other, &creds.backend, 3).await;
    other.stop().await;
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, creds.config(), listener).await;
    let again = c
        .expect(
            "server-side subscribed after the restart",
            is("server_subscribed", "feed:s"),
        )
        .await;
    assert_eq!(again["wasRecovering"], true, "{again}");
    assert_eq!(again["recovered"], true, "{again}");
    assert_eq!(again["epoch"], epoch.as_str());
    assert_eq!(c.received.len(), 2, "3 came before the recovery");
    publish_feed(&node, &creds.backend, 4).await;
    c.received_up_to(4).await;

    let expected: Vec<(u64, Value)> = (1..=4).map(|n| (n, json!({"n": n}))).collect();
    assert_eq!(c.received, expected);
    let tags: Vec<Value> = (1..=4).map(|n| json!({"n": n.to_string()})).collect();
    assert_eq!(c.received_tags, tags);
    c.stop().await;
    node.stop().await;
}

with_each_sdk_on_both_backends!(server_side_subscription:
    centrifuge_js_server_side_subscription_on_sqlite,
    centrifuge_js_server_side_subscription_on_postgres,
    centrifuge_python_server_side_subscription_on_sqlite,
    centrifuge_python_server_side_subscription_on_postgres);

/// The holder stops (and releases the lease) while an SDK client follows
/// a channel on the standby: the standby takes over, the client stays
/// connected (no reconnect), and every publication, before and after the
/// takeover, arrives exactly once, in order.
async fn holder_failover(sdk: Sdk, backend: Backend) {
    holder_failover_over(sdk, backend, Transport::WebSocket).await;
}

/// [`holder_failover`] over `transport`.
async fn holder_failover_over(sdk: Sdk, backend: Backend, transport: Transport) {
    sdk.check();
    let (_place, creds, holder, standby) = holder_and_standby(backend).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let mut c = transport.start(
        sdk,
        "on the standby",
        standby.ws_base.trim_start_matches("ws://"),
        &token,
        "news:fo",
    );
    c.follow().await;
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
    c.received_up_to(3).await;
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
    c.received_up_to(6).await;
    let expected: Vec<(u64, Value)> = (1..=6).map(|i| (i, json!({"n": i}))).collect();
    assert_eq!(c.received, expected);
    assert_eq!(
        c.reconnects, 0,
        "the client was disconnected by the failover"
    );
    c.stop().await;
}

with_each_sdk_on_both_backends!(holder_failover:
    centrifuge_js_survives_holder_failover_on_sqlite,
    centrifuge_js_survives_holder_failover_on_postgres,
    centrifuge_python_survives_holder_failover_on_sqlite,
    centrifuge_python_survives_holder_failover_on_postgres);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_survives_holder_failover_over_http_stream_on_postgres() {
    holder_failover_over(Sdk::Js, Backend::Postgres, Transport::HttpStream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_survives_holder_failover_over_websocket_on_postgres() {
    holder_failover_over(Sdk::Js, Backend::Postgres, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_protobuf_survives_holder_failover_over_http_stream_on_postgres() {
    holder_failover_over(Sdk::Js, Backend::Postgres, Transport::HttpStreamProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_python_protobuf_survives_holder_failover_on_postgres() {
    holder_failover_over(Sdk::Python, Backend::Postgres, Transport::WebSocketProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_survives_holder_failover_over_sse_on_postgres() {
    holder_failover_over(Sdk::Js, Backend::Postgres, Transport::Sse).await;
}

/// An SDK client subscribed with `joinLeave` in a namespace with
/// `join_leave` sees its own join, then the join of another client of the
/// same SDK (with its connection token's `info` as `connInfo`), its leave
/// when it unsubscribes, and again a join and a leave when it subscribes
/// and disconnects. On PostgreSQL the other client is on the other node;
/// on SQLite both are on one node (its nodes are processes on one host
/// that do not pass joins and leaves to each other, see
/// docs/centrifugo.md).
async fn joins_and_leaves(sdk: Sdk, backend: Backend) {
    sdk.check();
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
    let mut watcher = SdkClient::start(
        sdk,
        "watcher",
        &format!("{}/connection/websocket", holder.ws_base),
        &ann,
        "chat:s",
    );
    let me = watcher.expect("connected", is("connected", "")).await["client"].clone();
    watcher
        .send(json!({"op": "subscribe", "channel": "chat:s", "joinLeave": true}))
        .await;
    watcher
        .expect("subscribed", is("subscribed", "chat:s"))
        .await;
    let own = watcher.expect("its own join", is("join", "chat:s")).await;
    assert_eq!(
        (&own["client"], &own["user"]),
        (&me, &json!("ann")),
        "{own}"
    );

    let mut other = SdkClient::start(
        sdk,
        "bob",
        &format!("{}/connection/websocket", other_node.ws_base),
        &bob,
        "chat:s",
    );
    let theirs = other.expect("connected", is("connected", "")).await["client"].clone();
    let event = |kind: &str| {
        json!({"type": kind, "channel": "chat:s", "client": theirs, "user": "bob",
               "connInfo": {"name": "Bob"}, "chanInfo": null})
    };
    other
        .send(json!({"op": "subscribe", "channel": "chat:s"}))
        .await;
    other.expect("subscribed", is("subscribed", "chat:s")).await;
    let join = watcher.expect("bob's join", is("join", "chat:s")).await;
    assert_eq!(join, event("join"));
    other
        .send(json!({"op": "unsubscribe", "channel": "chat:s"}))
        .await;
    other
        .expect("unsubscribed", is("unsubscribed", "chat:s"))
        .await;
    let leave = watcher.expect("bob's leave", is("leave", "chat:s")).await;
    assert_eq!(leave, event("leave"));

    // Subscribed again, then disconnected: a join, then a leave.
    other
        .send(json!({"op": "subscribe", "channel": "chat:s"}))
        .await;
    other.expect("subscribed", is("subscribed", "chat:s")).await;
    let join = watcher.expect("bob's join", is("join", "chat:s")).await;
    assert_eq!(join, event("join"));
    other.send(json!({"op": "disconnect"})).await;
    other.expect("disconnected", is("disconnected", "")).await;
    let leave = watcher.expect("bob's leave", is("leave", "chat:s")).await;
    assert_eq!(leave, event("leave"));
    other.stop().await;
    watcher.stop().await;
    if let Some(standby) = standby {
        standby.stop().await;
    }
    holder.stop().await;
}

with_each_sdk_on_both_backends!(joins_and_leaves:
    centrifuge_js_sees_joins_and_leaves_on_sqlite,
    centrifuge_js_sees_joins_and_leaves_across_nodes_on_postgres,
    centrifuge_python_sees_joins_and_leaves_on_sqlite,
    centrifuge_python_sees_joins_and_leaves_across_nodes_on_postgres);

/// Reads reports until `wanted`, letting through the SDK's reports of
/// error 109 (a token that expired, after which it asks `getToken` for
/// another).
async fn expect_past_109(c: &mut SdkClient, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    loop {
        let report = c
            .expect(what, |r| {
                wanted(r) || (r["type"] == "failed" && r["code"] == 109)
            })
            .await;
        if wanted(&report) {
            return report;
        }
    }
}

/// centrifuge-js whose `getToken` answers an expired token once, for the
/// connection and then for a subscription: Herald closes the connection
/// with 3005 at the `refresh` and with 3006 at the `sub_refresh`, as
/// Centrifugo does, and the SDK reconnects, gets the next token and
/// recovers; every publication arrives once, in order. (With error 109 in
/// reply, the SDK ended the connection, or the subscription, for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_survives_an_expired_token_from_get_token() {
    let sdk = Sdk::Js;
    sdk.check();
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let url = node.ws_url("/connection/websocket");
    let claims = |exp: u64, extra: Value| {
        let mut claims = json!({"sub": "ann", "exp": exp});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        creds.token(claims)
    };
    let channels = json!({"channels": ["news:*"]});
    let expired = claims(crate::now_s() - 10, channels.clone());
    let fresh = creds.token_for("ann", channels.clone());
    // A connection token that lasts 3 s: at its end the SDK asks getToken.
    let short = claims(crate::now_s() + 3, channels);
    let mut c = SdkClient::start_with_get_token(sdk, "with tokens", &url, &short, "news:t");
    c.send(json!({"op": "tokens", "tokens": [expired, fresh]}))
        .await;
    c.follow().await;
    node.publish_with("news:t", &key, json!({"n": 1})).await;
    c.received_up_to(1).await;
    c.expect("closed with 3005", |r| {
        r["type"] == "connecting" && r["code"] == 3005
    })
    .await;
    expect_past_109(&mut c, "connected again", is("connected", "")).await;
    let again = expect_past_109(&mut c, "subscribed again", is("subscribed", "news:t")).await;
    assert_eq!(again["recovered"], true, "{again}");
    node.publish_with("news:t", &key, json!({"n": 2})).await;
    c.received_up_to(2).await;
    let offsets: Vec<u64> = c.received.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, vec![1, 2]);

    // A subscription token that lasts 3 s, then an expired one, then a
    // fresh one.
    let channel = json!({"channel": "news:u"});
    let short = claims(crate::now_s() + 3, channel.clone());
    let expired = claims(crate::now_s() - 10, channel.clone());
    let fresh = creds.token_for("ann", channel);
    c.send(json!({"op": "tokens", "channel": "news:u", "tokens": [expired, fresh]}))
        .await;
    c.send(json!({"op": "subscribe", "channel": "news:u", "token": short}))
        .await;
    c.expect("subscribed to news:u", is("subscribed", "news:u"))
        .await;
    node.publish_with("news:u", &key, json!({"u": 1})).await;
    c.expect("news:u's first", is("publication", "news:u"))
        .await;
    c.expect("closed with 3006", |r| {
        r["type"] == "connecting" && r["code"] == 3006
    })
    .await;
    let again = expect_past_109(&mut c, "news:u again", is("subscribed", "news:u")).await;
    assert_eq!(again["recovered"], true, "{again}");
    node.publish_with("news:u", &key, json!({"u": 2})).await;
    let second = expect_past_109(&mut c, "news:u's second", is("publication", "news:u")).await;
    assert_eq!(second["offset"], 2, "{second}");
    c.stop().await;
}

/// centrifuge-js with a typical Centrifugo token (`sub` and `exp`, no
/// channels): it subscribes and receives in a namespace with
/// `subscribe = "authenticated"` (Centrifugo's
/// `allow_subscribe_for_client`), and its subscription in a default
/// namespace is refused with 103.
async fn a_plain_token_in_an_authenticated_namespace(backend: Backend) {
    let sdk = Sdk::Js;
    sdk.check();
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    config.namespaces.insert(
        "members".to_owned(),
        NamespaceRule {
            subscribe: herald_auth::SubscribeRule::Authenticated,
            ..NamespaceRule::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start_on(&place, "node-a", Role::Holder, config, listener).await;
    let backend_key = Creds::bearer(&creds.backend);
    let key = [("authorization", backend_key.as_str())];
    let token = creds.token_for("ann", json!({}));
    let mut c = SdkClient::start(sdk, "of members:s", &ws_url(addr), &token, "members:s");
    c.expect("connected", is("connected", "")).await;
    c.send(json!({"op": "subscribe", "channel": "members:s"}))
        .await;
    c.expect("subscribed", is("subscribed", "members:s")).await;
    assert_eq!(
        node.publish_with("members:s", &key, json!({"n": 1}))
            .await
            .0,
        201
    );
    c.received_up_to(1).await;
    c.send(json!({"op": "subscribe", "channel": "news:s"}))
        .await;
    let refused = c
        .expect("the subscription to news:s refused", |r| {
            r["channel"] == "news:s" && (r["type"] == "failed" || r["type"] == "unsubscribed")
        })
        .await;
    assert_eq!(refused["code"], 103, "{refused}");
    c.stop().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_subscribes_with_sub_and_exp_in_an_authenticated_namespace_on_sqlite() {
    a_plain_token_in_an_authenticated_namespace(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_subscribes_with_sub_and_exp_in_an_authenticated_namespace_on_postgres() {
    a_plain_token_in_an_authenticated_namespace(Backend::Postgres).await;
}
