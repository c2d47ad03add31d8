//! End-to-end tests of live subscriptions (SSE and WebSocket), the switch
//! from history to live, and drain.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use herald_server::ServerConfig;
use herald_testkit::node::{publish_n, Node, Role};
use herald_testkit::sse::SseClient;
use herald_testkit::storage::{AppendGate, SlowReads};
use herald_testkit::ws::{ws_connect, ws_next};
use herald_testkit::{within, Rng, NODE_WAIT};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message as Frame;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_from_last_event_id_or_after_then_goes_live() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "news", 1, 5).await;
    let url = node.url("/v1/channels/news/events");

    let mut by_header =
        SseClient::connect(&node.client, &format!("{url}?after=4"), Some("2")).await;
    assert_eq!(by_header.status, 200);
    assert!(by_header.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(by_header.headers["cache-control"], "no-cache, no-transform");
    assert_eq!(by_header.headers["x-accel-buffering"], "no");
    let mut by_query = SseClient::connect(&node.client, &format!("{url}?after=4"), None).await;
    let mut from_start = SseClient::connect(&node.client, &url, None).await;

    for offset in 3..=5u64 {
        let m = within("history", NODE_WAIT, by_header.next_message())
            .await
            .unwrap();
        assert_eq!(m["offset"], offset);
        assert_eq!(m["data"], json!({ "i": offset }));
        assert!(m["published_at"].is_string());
    }
    // The stream named its reconnection time before its first event.
    assert_eq!(by_header.retry_ms, Some(1000));
    assert_eq!(
        within("history", NODE_WAIT, by_query.next_message())
            .await
            .unwrap()["offset"],
        5
    );
    for offset in 1..=5u64 {
        assert_eq!(
            within("history", NODE_WAIT, from_start.next_message())
                .await
                .unwrap()["offset"],
            offset
        );
    }
    publish_n(&node, "news", 6, 2).await;
    for client in [&mut by_header, &mut by_query, &mut from_start] {
        for offset in 6..=7u64 {
            let m = within("live", NODE_WAIT, client.next_message())
                .await
                .unwrap();
            assert_eq!(m["offset"], offset);
            assert_eq!(m["data"], json!({ "i": offset }));
        }
    }
    let bad = SseClient::connect(&node.client, &url, Some("abc")).await;
    assert_eq!(bad.status, 400);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_resumes_answers_pings_and_closes() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "ws", 1, 3).await;
    let mut ws = ws_connect(&node.ws_url("/v1/channels/ws/ws?after=1")).await;
    let mut closed = None;
    for offset in 2..=3u64 {
        let m = within("history", NODE_WAIT, ws_next(&mut ws, &mut closed))
            .await
            .unwrap();
        assert_eq!(m["offset"], offset);
        assert_eq!(m["data"], json!({ "i": offset }));
    }
    publish_n(&node, "ws", 4, 1).await;
    assert_eq!(
        within("live", NODE_WAIT, ws_next(&mut ws, &mut closed))
            .await
            .unwrap()["offset"],
        4
    );

    // Ping → Pong with the same payload; a data frame is ignored.
    ws.send(Frame::Text("ignored".into())).await.unwrap();
    ws.send(Frame::Ping(b"hello".to_vec().into()))
        .await
        .unwrap();
    let pong = within("pong", NODE_WAIT, ws.next())
        .await
        .expect("socket open")
        .expect("frame");
    let Frame::Pong(pong) = pong else {
        panic!("expected a pong, got {pong:?}");
    };
    assert_eq!(&pong[..], b"hello");
    publish_n(&node, "ws", 5, 1).await;
    assert_eq!(
        within("live after ping", NODE_WAIT, ws_next(&mut ws, &mut closed))
            .await
            .unwrap()["offset"],
        5
    );

    // A client Close is answered with a Close and the stream ends.
    ws.close(None).await.unwrap();
    let rest = within("close reply", NODE_WAIT, async {
        let mut frames = Vec::new();
        while let Some(Ok(frame)) = ws.next().await {
            frames.push(frame);
        }
        frames
    })
    .await;
    assert!(
        rest.iter().any(|f| matches!(f, Frame::Close(_))),
        "{rest:?}"
    );
    node.stop().await;
}

/// Subscribers connect at random points while publishers run; each must
/// see exactly `after+1..=final`, in order, once. With the default live
/// buffer nobody lags, so this checks the switch itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_from_history_to_live_loses_and_repeats_nothing() {
    switch_scenario(ServerConfig::default().subscriber_buffer).await;
}

/// The same with a one-notice live buffer: subscribers lag while they read
/// history and must catch up from the storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_with_lagging_subscribers_loses_and_repeats_nothing() {
    switch_scenario(1).await;
}

async fn switch_scenario(subscriber_buffer: usize) {
    const PUBLISHERS: u64 = 4;
    const PER_PUBLISHER: u64 = 400;
    const TOTAL: u64 = PUBLISHERS * PER_PUBLISHER;
    const SUBSCRIBERS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        subscriber_buffer,
        ..ServerConfig::default()
    };
    // History reads that return late widen the switch window and make
    // receivers lag while they read.
    let node = Arc::new(
        Node::start_with(dir.path(), "node-a", Role::Holder, config, |s| {
            SlowReads::wrap(s, Duration::from_millis(3))
        })
        .await,
    );
    let mut rng = Rng::from_time();
    // How many publishes were acknowledged so far.
    let (progress_tx, progress) = watch::channel(0u64);
    let progress_tx = Arc::new(progress_tx);

    let mut subscribers = Vec::new();
    for i in 0..SUBSCRIBERS {
        let start_at = rng.below(TOTAL);
        let after_fraction = rng.below(101);
        let node = node.clone();
        let mut progress = progress.clone();
        subscribers.push(tokio::spawn(async move {
            let seen_when_starting = *progress.wait_for(|n| *n >= start_at).await.unwrap();
            let after = seen_when_starting * after_fraction / 100;
            let path = "/v1/channels/switch";
            let mut offsets = Vec::new();
            if i % 2 == 0 {
                let url = node.url(&format!("{path}/events"));
                let mut sse = if i % 4 == 0 {
                    SseClient::connect(&node.client, &url, Some(&after.to_string())).await
                } else {
                    SseClient::connect(&node.client, &format!("{url}?after={after}"), None).await
                };
                assert_eq!(sse.status, 200);
                while offsets.last() != Some(&TOTAL) {
                    let m = sse.next_message().await.expect("SSE stream ended early");
                    offsets.push(m["offset"].as_u64().unwrap());
                }
            } else {
                let mut ws = ws_connect(&node.ws_url(&format!("{path}/ws?after={after}"))).await;
                let mut closed = None;
                while offsets.last() != Some(&TOTAL) {
                    let m = ws_next(&mut ws, &mut closed)
                        .await
                        .expect("WebSocket ended early");
                    offsets.push(m["offset"].as_u64().unwrap());
                }
            }
            (i, after, offsets)
        }));
    }

    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let node = node.clone();
        let progress_tx = progress_tx.clone();
        publishers.push(tokio::spawn(async move {
            for n in 0..PER_PUBLISHER {
                let (status, body) = node.publish("switch", json!({ "p": p, "n": n })).await;
                assert_eq!(status, 201, "{body}");
                progress_tx.send_modify(|c| *c += 1);
            }
        }));
    }
    for p in publishers {
        within("publishers", NODE_WAIT, p).await.unwrap();
    }
    assert_eq!(node.head("switch").await, TOTAL);
    for s in subscribers {
        let (i, after, offsets) = within("subscriber sees the final offset", NODE_WAIT, s)
            .await
            .unwrap();
        let want: Vec<u64> = (after + 1..=TOTAL).collect();
        assert_eq!(offsets, want, "subscriber {i} (after {after})");
    }
    Arc::into_inner(node)
        .expect("no other holders")
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_ends_streams_and_never_acknowledges_a_lost_publish() {
    let dir = tempfile::tempdir().unwrap();
    let gate = AppendGate::new();
    let mut node = Node::start_with(
        dir.path(),
        "node-a",
        Role::Holder,
        ServerConfig::default(),
        |s| gate.wrap(s),
    )
    .await;
    gate.open();
    publish_n(&node, "d", 1, 2).await;
    let mut sse = SseClient::connect(&node.client, &node.url("/v1/channels/d/events"), None).await;
    for offset in 1..=2u64 {
        assert_eq!(
            within("history", NODE_WAIT, sse.next_message())
                .await
                .unwrap()["offset"],
            offset
        );
    }
    let mut ws = ws_connect(&node.ws_url("/v1/channels/d/ws")).await;
    let mut closed = None;
    for offset in 1..=2u64 {
        assert_eq!(
            within("ws history", NODE_WAIT, ws_next(&mut ws, &mut closed))
                .await
                .unwrap()["offset"],
            offset
        );
    }

    // Hold the writer in the middle of a commit, with publishes in flight.
    gate.close();
    let started_before = gate.started();
    let mut publishes = Vec::new();
    for k in 0..40u64 {
        let client = node.client.clone();
        let url = node.url("/v1/channels/d/messages");
        publishes.push(tokio::spawn(async move {
            let response = client
                .post(&url)
                .json(&json!({ "data": { "k": k } }))
                .send()
                .await;
            match response {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body: Value = r.json().await.unwrap_or(Value::Null);
                    (k, Some(status), body)
                }
                Err(_) => (k, None, Value::Null),
            }
        }));
    }
    gate.wait_started(started_before + 1).await;
    node.shutdown.cancel();

    // While a commit is still held: the SSE body finishes and the
    // WebSocket gets 1001 going away.
    let end = within("SSE stream ends", NODE_WAIT, sse.next_message()).await;
    assert!(end.is_none(), "no message was committed yet, got {end:?}");
    while within("WebSocket closes", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .is_some()
    {}
    assert_eq!(closed, Some(u16::from(CloseCode::Away)));

    // Let the writer commit what it holds and what is queued.
    gate.open();
    node.drain().await;

    let stored = node.stored("d").await;
    let offsets: Vec<u64> = stored.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (1..=stored.len() as u64).collect::<Vec<_>>());
    let mut acknowledged = std::collections::BTreeSet::new();
    let mut refused = 0;
    for p in publishes {
        let (k, status, body) = within("publish outcome", NODE_WAIT, p).await.unwrap();
        match status {
            Some(201) => {
                let offset = body["offset"].as_u64().unwrap();
                let m = stored
                    .iter()
                    .find(|m| m.offset == offset)
                    .unwrap_or_else(|| panic!("acknowledged offset {offset} is not stored"));
                let data: Value = serde_json::from_str(&m.data.to_json_text()).unwrap();
                assert_eq!(data, json!({ "k": k }));
                acknowledged.insert(offset);
            }
            Some(503) => {
                refused += 1;
                assert_eq!(body["error"]["code"], "draining", "{body}");
            }
            Some(other) => panic!("publish {k}: unexpected status {other}: {body}"),
            None => {} // refused at the socket: the listener was closed
        }
    }
    println!(
        "drain: {} acknowledged, {refused} refused with draining",
        acknowledged.len()
    );
    // The publish held in the commit was answered after the drain began,
    // and nothing was stored without being acknowledged.
    assert!(!acknowledged.is_empty());
    let after_start: std::collections::BTreeSet<u64> =
        offsets.into_iter().filter(|o| *o > 2).collect();
    assert_eq!(after_start, acknowledged);
    node.stop().await;
}

/// The server pings an idle WebSocket subscription every heartbeat; a
/// client that answers (as every WebSocket library does) stays connected
/// however many pings go by, and still gets new messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_pings_keep_an_idle_subscription_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        heartbeat: Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let node = Node::start(dir.path(), "node-a", Role::Holder, config).await;
    let mut ws = ws_connect(&node.ws_url("/v1/channels/idle/ws")).await;
    let mut pings = 0;
    while pings < 5 {
        // Reading answers each ping with a pong (tungstenite does it).
        match within("a ping", NODE_WAIT, ws.next()).await {
            Some(Ok(Frame::Ping(_))) => pings += 1,
            other => panic!("expected pings on an idle subscription, got {other:?}"),
        }
    }
    // The client goes on reading (and so answering pings) while the
    // publish is in flight, as a live client does: a publish slower than
    // a heartbeat on a busy machine must not look like a vanished client.
    let mut closed = None;
    let ((), message) = tokio::join!(
        publish_n(&node, "idle", 1, 1),
        within(
            "a message after the pings",
            NODE_WAIT,
            ws_next(&mut ws, &mut closed),
        ),
    );
    let message = message.expect("the subscription is still open");
    assert_eq!(message["offset"], 1);
    node.stop().await;
}

/// A WebSocket client that never answers the pings (a peer that vanished
/// without closing) is disconnected after the next ping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_that_never_answers_a_ping_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        heartbeat: Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let node = Node::start(dir.path(), "node-a", Role::Holder, config).await;
    let addr = node.ws_base.trim_start_matches("ws://").to_owned();
    // A handshake by hand (RFC 6455 §4.1), then nothing but reads: no pong
    // is ever sent.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket
        .write_all(
            format!(
                "GET /v1/channels/silent/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 Sec-WebSocket-Version: 13\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut received = Vec::new();
    let closed = within(
        "the server to close the silent connection",
        NODE_WAIT,
        async {
            let mut buf = [0u8; 1024];
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => received.extend_from_slice(&buf[..n]),
                }
            }
        },
    );
    closed.await;
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    let head_end = text.find("\r\n\r\n").expect("a complete response head") + 4;
    // After the head: at least one Ping frame (FIN + opcode 0x9), and the
    // connection then ended without any message frame.
    let frames = &received[head_end..];
    assert_eq!(frames.first(), Some(&0x89), "frames: {frames:02x?}");
    assert!(
        !frames.contains(&0x81),
        "a text frame was sent: {frames:02x?}"
    );
    node.stop().await;
}

/// A resume point beyond the channel's head, read from the database (on
/// the holder and on a standby alike), is `409 offset_beyond_head` with
/// the head, on history, SSE and WebSocket; at the head it is fine; a
/// `Last-Event-ID` that is not exactly digits is `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_point_beyond_the_head_is_refused_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;
    publish_n(&holder, "ten", 1, 10).await;
    for node in [&holder, &standby] {
        let who = &node.node_id;
        let get = |path: &str, last_event_id: Option<&str>| {
            let mut request = node.client.get(node.url(path));
            if let Some(id) = last_event_id {
                request = request.header("last-event-id", id);
            }
            async move {
                let response = request.send().await.expect("request");
                let status = response.status().as_u16();
                // An event stream never ends: its status says enough.
                if status == 200 {
                    let stream = response
                        .headers()
                        .get("content-type")
                        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    if stream {
                        return (status, Value::Null);
                    }
                }
                let body: Value = response.json().await.unwrap_or(Value::Null);
                (status, body)
            }
        };
        for (path, id, head) in [
            ("/v1/channels/ten/messages?after=11", None, 10),
            ("/v1/channels/none/messages?after=5", None, 0),
            ("/v1/channels/ten/events", Some("50"), 10),
            ("/v1/channels/none/events?after=5", None, 0),
            ("/v1/channels/ten/events?after=1", Some("11"), 10),
        ] {
            let (status, body) = get(path, id).await;
            assert_eq!(status, 409, "{who} {path} {id:?}: {body}");
            assert_eq!(body["error"]["code"], "offset_beyond_head", "{body}");
            assert_eq!(body["error"]["head"], head, "{body}");
        }
        let (status, body) = get("/v1/channels/ten/messages?after=10", None).await;
        assert_eq!((status, body["head"].clone()), (200, json!(10)), "{who}");
        let at_head = SseClient::connect(
            &node.client,
            &node.url("/v1/channels/ten/events"),
            Some("10"),
        )
        .await;
        assert_eq!(at_head.status, 200, "{who}");
        for id in ["+7", "7 7", "-0", "0x1"] {
            let (status, body) = get("/v1/channels/ten/events", Some(id)).await;
            assert_eq!(status, 400, "{who} {id:?}: {body}");
            assert_eq!(body["error"]["code"], "invalid_last_event_id");
        }
        let (status, body) = get("/v1/channels/ten/messages?after=+7", None).await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (400, json!("invalid_query"))
        );

        match tokio_tungstenite::connect_async(node.ws_url("/v1/channels/ten/ws?after=11")).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status().as_u16(), 409, "{who}");
                let body: Value =
                    serde_json::from_slice(response.body().as_deref().unwrap_or_default()).unwrap();
                assert_eq!(body["error"]["code"], "offset_beyond_head");
                assert_eq!(body["error"]["head"], 10);
            }
            Err(other) => panic!("{who}: expected a 409 answer, got {other}"),
            Ok(_) => panic!("{who}: upgraded a WebSocket resuming beyond the head"),
        }
        let mut ws = ws_connect(&node.ws_url("/v1/channels/ten/ws?after=9")).await;
        let mut closed = None;
        let m = within("ws at the head", NODE_WAIT, ws_next(&mut ws, &mut closed))
            .await
            .unwrap();
        assert_eq!(m["offset"], 10, "{who}");
    }
    assert_eq!(holder.head("ten").await, 10);
    standby.stop().await;
    holder.stop().await;
}
