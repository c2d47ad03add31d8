//! End-to-end tests of the limits against abuse over real sockets: the
//! final answer to `Expect: 100-continue` when the headers decide it,
//! connections per client address (directly and through a trusted proxy),
//! and the WebSocket message size.

use futures::SinkExt;
use herald_server::ServerConfig;
use herald_testkit::node::{Node, Role};
use herald_testkit::sse::SseClient;
use herald_testkit::ws::{ws_connect, ws_next};
use herald_testkit::{within, NODE_WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message as Frame;

async fn holder(dir: &std::path::Path, config: ServerConfig) -> Node {
    Node::start(dir, "node-a", Role::Holder, config).await
}

/// Opens a raw TCP connection to `node`.
async fn connect(node: &Node) -> TcpStream {
    let addr = node.base.trim_start_matches("http://");
    TcpStream::connect(addr).await.expect("connect")
}

/// Reads from `stream` until a whole response head (through the blank
/// line) has arrived; returns it.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    within("a response head", NODE_WAIT, async {
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.expect("read");
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.push(byte[0]);
        }
    })
    .await;
    String::from_utf8(got).expect("ASCII head")
}

/// A client that waits for `100 Continue` gets the final `4xx` at once when
/// the path or the headers decide it, and no `100 Continue` before it (so
/// it never sends the body); a valid request gets `100 Continue` first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_gets_the_final_answer_when_the_headers_decide() {
    let dir = tempfile::tempdir().unwrap();
    let node = holder(dir.path(), ServerConfig::default()).await;
    for (path, extra, length, status) in [
        ("/v1/channels/c/messages", "", 1_000_000, "413"),
        ("/v1/channels/c/messages", "", 65_537, "413"),
        ("/v1/channels/-bad/messages", "", 10, "400"),
        (
            "/v1/channels/c/messages",
            "Idempotency-Key: a b\r\n",
            10,
            "400",
        ),
        ("/v1/messages", "", 5_000_000, "413"),
    ] {
        let mut stream = connect(&node).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: herald\r\n{extra}Content-Type: application/json\r\n\
             Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let answer = read_head(&mut stream).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{path} {length}: {answer}"
        );
    }
    // A valid one: 100 Continue, then the body, then 201.
    let mut stream = connect(&node).await;
    let body = br#"{"data":1}"#;
    let head = format!(
        "POST /v1/channels/c/messages HTTP/1.1\r\nHost: herald\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let interim = read_head(&mut stream).await;
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
    stream.write_all(body).await.unwrap();
    let answer = read_head(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 201 "), "{answer}");
    assert_eq!(node.head("c").await, 1);
    node.stop().await;
}

/// Sends `GET /healthz` on `stream` and returns the answer's head.
async fn healthz(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n")
        .await
        .unwrap();
    read_head(stream).await
}

/// A client address with `max_connections_per_ip` connections open gets
/// `429 too_many_connections` (and `Connection: close`) on the next one,
/// and a connection again once one of its own has closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_per_address_are_answered_429() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        max_connections_per_ip: 2,
        ..ServerConfig::default()
    };
    let node = holder(dir.path(), config).await;
    let mut first = connect(&node).await;
    let mut second = connect(&node).await;
    assert!(healthz(&mut first).await.starts_with("HTTP/1.1 200 "));
    assert!(healthz(&mut second).await.starts_with("HTTP/1.1 200 "));
    let mut third = connect(&node).await;
    let refused = healthz(&mut third).await;
    assert!(refused.starts_with("HTTP/1.1 429 "), "{refused}");
    let lower = refused.to_ascii_lowercase();
    assert!(lower.contains("connection: close"), "{refused}");
    assert!(lower.contains("retry-after: 1"), "{refused}");
    let mut body = Vec::new();
    third.read_to_end(&mut body).await.unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("too_many_connections"), "{body}");

    // Once one closes, its place is free again (the server notices the
    // close in its own time: try until it has).
    drop(first);
    let mut again = within("a place frees up", NODE_WAIT, async {
        loop {
            let mut again = connect(&node).await;
            if healthz(&mut again).await.starts_with("HTTP/1.1 200 ") {
                return again;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The metrics, on that connection (a new one could still be over the
    // limit while the server has not yet noticed the last close).
    again
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: herald\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = Vec::new();
    again.read_to_end(&mut text).await.unwrap();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("herald_connections_refused_total{reason=\"per_ip\"}"),
        "{text}"
    );
    drop(second);
    node.stop().await;
}

/// Through a trusted proxy, each request is counted by the client address
/// in `X-Forwarded-For`, for as long as its answer lasts: a second event
/// stream of one client is refused, another client's is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_trusted_proxy_the_forwarded_client_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        max_connections_per_ip: 1,
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..ServerConfig::default()
    };
    let node = holder(dir.path(), config).await;
    let url = node.url("/v1/channels/c/events");
    let open = |client: &'static str| {
        node.client
            .get(url.clone())
            .header("x-forwarded-for", format!("{client}, 127.0.0.1"))
            .send()
    };
    let first = open("192.0.2.1").await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let _first = SseClient::from_response(first);
    let second = open("192.0.2.1").await.unwrap();
    assert_eq!(second.status().as_u16(), 429);
    let body: serde_json::Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections");
    let other = open("192.0.2.2").await.unwrap();
    assert_eq!(other.status().as_u16(), 200);
    // A WebSocket session holds its client's place for as long as it runs,
    // past the end of its upgrade answer.
    let mut upgrade = node
        .ws_url("/v1/channels/c/ws")
        .into_client_request()
        .unwrap();
    upgrade
        .headers_mut()
        .insert("x-forwarded-for", "192.0.2.3".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(upgrade).await.unwrap();
    let (status, _) = node.publish("c", serde_json::json!(1)).await;
    assert_eq!(status, 201);
    let mut closed = None;
    let m = within("the session runs", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .unwrap();
    assert_eq!(m["offset"], 1);
    let refused = open("192.0.2.3").await.unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    // The proxy's own connections are not limited: many requests over
    // several connections of the one proxy address pass.
    for _ in 0..3 {
        let (status, _) = node.get("/healthz").await;
        assert_eq!(status, 200);
    }
    node.stop().await;
}

/// A Centrifugo WebSocket (`/connection/websocket`) holds its client's
/// place for the session's whole life, not only until its `101` answer:
/// directly (its TCP connection) and through a trusted proxy (its
/// `X-Forwarded-For` address), a second connection of the same client is
/// refused while the session runs, and allowed once it closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_centrifugo_session_holds_its_place_for_its_whole_life() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        max_connections_per_ip: 1,
        trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        ..ServerConfig::default()
    };
    let node = holder(dir.path(), config).await;
    let events = node.url("/v1/channels/c/events");
    let open = |client: &'static str| {
        node.client
            .get(events.clone())
            .header("x-forwarded-for", client)
            .send()
    };
    let client = "192.0.2.7";
    let mut ws = node
        .ws("/connection/websocket", &[("x-forwarded-for", client)])
        .await
        .expect("the upgrade");
    // The session runs: it answers its connect (so the 101 is long sent).
    ws.send(Frame::Text(r#"{"id":1,"connect":{}}"#.into()))
        .await
        .unwrap();
    let mut closed = None;
    let reply = within(
        "the connect reply",
        NODE_WAIT,
        ws_next(&mut ws, &mut closed),
    )
    .await
    .expect("a reply");
    assert!(reply["connect"]["client"].is_string(), "{reply}");
    let refused = open(client).await.unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections");
    // Once the session ended, its place is free (the server notices the
    // close in its own time: try until it has).
    ws.close(None).await.unwrap();
    while ws_next(&mut ws, &mut closed).await.is_some() {}
    within("the place frees up", NODE_WAIT, async {
        loop {
            let answer = open(client).await.unwrap();
            if answer.status().as_u16() == 200 {
                return;
            }
            assert_eq!(answer.status().as_u16(), 429);
            tokio::task::yield_now().await;
        }
    })
    .await;
    node.stop().await;
}

/// A client message over `ws_max_message_bytes` closes the session with
/// 1009 "message too big" (RFC 6455 §7.4.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_message_over_the_limit_is_closed_with_1009() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        ws_max_message_bytes: 1024,
        ..ServerConfig::default()
    };
    let node = holder(dir.path(), config).await;
    let mut ws = ws_connect(&node.ws_url("/v1/channels/c/ws")).await;
    // Within the limit: ignored, the session goes on.
    ws.send(Frame::Text("x".repeat(1000).into())).await.unwrap();
    let (status, _) = node.publish("c", serde_json::json!(1)).await;
    assert_eq!(status, 201);
    let mut closed = None;
    let m = within("a message", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .unwrap();
    assert_eq!(m["offset"], 1);
    ws.send(Frame::Text("x".repeat(2000).into())).await.unwrap();
    let end = within("the close", NODE_WAIT, ws_next(&mut ws, &mut closed)).await;
    assert!(end.is_none(), "{end:?}");
    assert_eq!(closed, Some(1009));
    let text = node.metrics().await;
    assert!(text.contains("herald_ws_messages_too_big_total"), "{text}");
    node.stop().await;
}

/// An HTTP/2 connection announces `max_streams_per_connection` as its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`, which bounds the requests (SSE
/// subscriptions among them) that one connection carries at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_announce_the_stream_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        max_streams_per_connection: 7,
        ..ServerConfig::default()
    };
    let node = holder(dir.path(), config).await;
    let mut stream = connect(&node).await;
    // The client connection preface (RFC 9113 §3.4) and an empty SETTINGS
    // frame: length 0, type 0x4, flags 0, stream 0.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    // The server's preface is a SETTINGS frame (RFC 9113 §3.4): a 9-byte
    // header, then 6 bytes per setting (16-bit id, 32-bit value).
    let settings = within("the server's SETTINGS", NODE_WAIT, async {
        let mut header = [0u8; 9];
        stream
            .read_exact(&mut header)
            .await
            .expect("a frame header");
        assert_eq!(header[3], 0x4, "the first frame is SETTINGS: {header:?}");
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).await.expect("its payload");
        payload
            .chunks_exact(6)
            .map(|s| {
                (
                    u16::from_be_bytes([s[0], s[1]]),
                    u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                )
            })
            .collect::<Vec<_>>()
    })
    .await;
    // SETTINGS_MAX_CONCURRENT_STREAMS is 0x3 (RFC 9113 §6.5.2).
    assert!(
        settings.contains(&(0x3, 7)),
        "no SETTINGS_MAX_CONCURRENT_STREAMS = 7 in {settings:?}"
    );
}
