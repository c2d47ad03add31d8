//! Subscriptions during a storage outage: a transient read failure (the
//! storage's `Unavailable`) neither refuses an SSE request or a WebSocket
//! upgrade nor ends a running subscription. The subscription waits, with
//! heartbeats, and delivers every message once, in order, when the storage
//! answers again.

use std::time::Duration;

use herald_server::ServerConfig;
use herald_testkit::node::{publish_n, Node, Role};
use herald_testkit::sse::{SseClient, SseItem};
use herald_testkit::storage::ReadOutage;
use herald_testkit::ws::{ws_connect, ws_next, Ws};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A heartbeat short enough to be seen within a test.
fn quick_heartbeats() -> ServerConfig {
    ServerConfig {
        heartbeat: Duration::from_millis(100),
        ..ServerConfig::default()
    }
}

/// A WebSocket read all along by a task of its own, so that the server's
/// pings are answered while the test waits for something else.
struct WsFollower(
    mpsc::UnboundedReceiver<Value>,
    tokio::task::JoinHandle<Option<u16>>,
);

impl WsFollower {
    fn new(mut ws: Ws) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut closed = None;
            while let Some(message) = ws_next(&mut ws, &mut closed).await {
                if tx.send(message).is_err() {
                    break;
                }
            }
            closed
        });
        Self(rx, task)
    }

    /// The next message's offset; fails the test when the socket closed.
    async fn next_offset(&mut self) -> u64 {
        match within("a WebSocket message", NODE_WAIT, self.0.recv()).await {
            Some(message) => message["offset"].as_u64().expect("an offset"),
            None => {
                let closed = (&mut self.1).await.unwrap();
                panic!("the WebSocket closed (close code {closed:?})")
            }
        }
    }
}

/// `GET path` with `headers`; returns the status and the JSON error code.
async fn refused(node: &Node, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = node.client.get(node.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("an error body");
    (status, body["error"]["code"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_opened_during_a_storage_outage_wait_for_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let outage = ReadOutage::new();
    let node = Node::start_with(
        dir.path(),
        "node-a",
        Role::Holder,
        quick_heartbeats(),
        |s| outage.wrap(s),
    )
    .await;
    publish_n(&node, "news", 1, 3).await;
    publish_n(&node, "feed", 1, 3).await;
    outage.start();

    // The outage is real: a history read is answered 503.
    assert_eq!(
        refused(&node, "/v1/channels/news/messages", &[]).await,
        (503, json!("storage_unavailable"))
    );
    // Bad input is still refused before any read.
    assert_eq!(
        refused(&node, "/v1/channels/bad%20name/events", &[]).await,
        (400, json!("invalid_channel"))
    );
    assert_eq!(
        refused(&node, "/v1/channels/news/events", &[("last-event-id", "x")]).await,
        (400, json!("invalid_last_event_id"))
    );
    assert_eq!(
        refused(&node, "/v1/channels/feed/ws?after=-1", &[]).await,
        (400, json!("invalid_query"))
    );

    // A valid subscription is accepted although its first read failed.
    let mut sse =
        SseClient::connect(&node.client, &node.url("/v1/channels/news/events"), None).await;
    assert_eq!(
        sse.status, 200,
        "an EventSource gives up on any other status"
    );
    assert!(sse.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut ws = WsFollower::new(ws_connect(&node.ws_url("/v1/channels/feed/ws?after=1")).await);

    // Both read again and again (the history read above failed once too);
    // the event stream carries heartbeats meanwhile, and no event.
    outage.wait_failed("news", 4).await;
    outage.wait_failed("feed", 3).await;
    for _ in 0..2 {
        let item = within("a heartbeat", NODE_WAIT, sse.next_item()).await;
        assert!(
            matches!(item, Some(SseItem::Comment(_))),
            "a heartbeat, not {item:?} (None: the stream ended)"
        );
    }

    // The storage is back: the history, then live messages, each once.
    outage.end();
    for offset in 1..=3u64 {
        let m = within("history after the outage", NODE_WAIT, sse.next_message())
            .await
            .expect("the stream goes on");
        assert_eq!(m["offset"], offset);
        assert_eq!(m["data"], json!({ "i": offset }));
    }
    for offset in 2..=3u64 {
        assert_eq!(ws.next_offset().await, offset);
    }
    publish_n(&node, "news", 4, 1).await;
    publish_n(&node, "feed", 4, 1).await;
    assert_eq!(
        within("live", NODE_WAIT, sse.next_message()).await.unwrap()["offset"],
        4
    );
    assert_eq!(ws.next_offset().await, 4);
    node.stop().await;
}

/// On a standby every live notice is a moved head that the subscription
/// reads from the storage, so an outage hits running subscriptions there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_fails_mid_stream_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let outage = ReadOutage::new();
    let standby = Node::start_with(
        dir.path(),
        "node-b",
        Role::Standby,
        quick_heartbeats(),
        |s| outage.wrap(s),
    )
    .await;
    publish_n(&holder, "news", 1, 2).await;
    publish_n(&holder, "feed", 1, 2).await;
    let mut sse = SseClient::connect(
        &standby.client,
        &standby.url("/v1/channels/news/events"),
        None,
    )
    .await;
    assert_eq!(sse.status, 200);
    let mut ws = WsFollower::new(ws_connect(&standby.ws_url("/v1/channels/feed/ws?after=0")).await);
    for offset in 1..=2u64 {
        assert_eq!(
            within("history", NODE_WAIT, sse.next_message())
                .await
                .unwrap()["offset"],
            offset
        );
        assert_eq!(ws.next_offset().await, offset);
    }

    outage.start();
    publish_n(&holder, "news", 3, 3).await;
    publish_n(&holder, "feed", 3, 3).await;
    // Both subscriptions' reads of the new messages fail; the event stream
    // goes on with heartbeats, and the reads are tried again.
    outage.wait_failed("news", 1).await;
    outage.wait_failed("feed", 1).await;
    for _ in 0..2 {
        let item = within("a heartbeat", NODE_WAIT, sse.next_item()).await;
        assert!(
            matches!(item, Some(SseItem::Comment(_))),
            "a heartbeat, not {item:?} (None: the stream ended)"
        );
    }
    outage.wait_failed("news", 2).await;
    outage.wait_failed("feed", 2).await;

    outage.end();
    for offset in 3..=5u64 {
        let m = within("after the outage", NODE_WAIT, sse.next_message())
            .await
            .expect("the stream goes on");
        assert_eq!(m["offset"], offset);
        assert_eq!(m["data"], json!({ "i": offset }));
        assert_eq!(ws.next_offset().await, offset);
    }
    publish_n(&holder, "news", 6, 1).await;
    assert_eq!(
        within("live", NODE_WAIT, sse.next_message()).await.unwrap()["offset"],
        6
    );
    standby.stop().await;
    holder.stop().await;
}
