//! End-to-end tests of connection handling: clients that never finish a
//! request head are disconnected after the header read timeout, while
//! requests, event streams and WebSockets that take longer are not cut.

use std::time::{Duration, Instant};

use futures::StreamExt;
use herald_server::ServerConfig;
use herald_testkit::node::{Node, Role};
use herald_testkit::sse::SseClient;
use herald_testkit::ws::ws_connect;
use herald_testkit::{within, NODE_WAIT};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The header read timeout of these tests' nodes.
const TIMEOUT: Duration = Duration::from_millis(300);

/// How much later than due a closed connection may be noticed.
const SLACK: Duration = Duration::from_secs(2);

/// A holder whose header read timeout is [`TIMEOUT`].
async fn node(dir: &std::path::Path) -> Node {
    Node::start(
        dir,
        "node-a",
        Role::Holder,
        ServerConfig {
            header_read_timeout: TIMEOUT,
            ..ServerConfig::default()
        },
    )
    .await
}

/// Opens a raw TCP connection to `node`.
async fn connect(node: &Node) -> TcpStream {
    let addr = node.base.trim_start_matches("http://");
    TcpStream::connect(addr).await.expect("connect")
}

/// Reads until the server closes `stream` (end of stream or reset), for at
/// most `limit`; returns what was read. Panics when the connection is
/// still open after `limit`.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the connection is still open after {limit:?}; read so far: {:?}",
        String::from_utf8_lossy(&got)
    );
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_request_head_is_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    // Taken before connecting: the server's timer starts at its accept,
    // which follows the connect, however late this task runs afterwards.
    let started = Instant::now();
    let mut stream = connect(&node).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: herald\r\n")
        .await
        .unwrap();
    let got = read_until_closed(&mut stream, TIMEOUT + SLACK).await;
    let took = started.elapsed();
    assert!(took >= TIMEOUT, "closed after {took:?}, before the timeout");
    assert!(
        got.is_empty(),
        "the connection is closed without an answer, got {:?}",
        String::from_utf8_lossy(&got)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    // Taken before connecting: the server's timer starts at its accept,
    // which follows the connect, however late this task runs afterwards.
    let started = Instant::now();
    let mut stream = connect(&node).await;
    read_until_closed(&mut stream, TIMEOUT + SLACK).await;
    assert!(started.elapsed() >= TIMEOUT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_http2_preface_is_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    // Taken before connecting: the server's timer starts at its accept,
    // which follows the connect, however late this task runs afterwards.
    let started = Instant::now();
    let mut stream = connect(&node).await;
    stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    read_until_closed(&mut stream, TIMEOUT + SLACK).await;
    assert!(started.elapsed() >= TIMEOUT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let mut stream = connect(&node).await;
    // Taken before the request: the server's idle timer starts once it has
    // answered, which follows this, however late this task reads the answer.
    let asked = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 4096];
    let n = within("the answer", NODE_WAIT, stream.read(&mut first))
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&first[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("connection: close"),
        "the connection should be kept alive: {answer}"
    );
    read_until_closed(&mut stream, TIMEOUT + SLACK).await;
    let idle = asked.elapsed();
    assert!(idle >= TIMEOUT, "closed {idle:?} after the request");
    // Counted (the metrics are the process's: other tests' closes count
    // there too; run alone, only this one does).
    let text = node.metrics().await;
    assert!(
        text.contains("herald_idle_connections_closed_total "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_requests_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let (status, body) = node.get("/v1/status").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["role"], "holder");
    let (status, body) = node
        .publish("conn", serde_json::json!({ "hello": "world" }))
        .await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let stream = connect(&node).await;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("HTTP/2 handshake");
    let driver = tokio::spawn(conn);
    let request = hyper::Request::get(node.url("/v1/status"))
        .body(axum::body::Body::empty())
        .unwrap();
    let response = within("HTTP/2 answer", NODE_WAIT, sender.send_request(request))
        .await
        .expect("HTTP/2 request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    drop(sender);
    drop(response);
    let _ = within("HTTP/2 connection ends", NODE_WAIT, driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_that_answers_no_ping_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let mut stream = connect(&node).await;
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // A PING after the timeout, unanswered for the timeout again.
    read_until_closed(&mut stream, TIMEOUT * 2 + SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_last_longer_than_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;

    let mut sse =
        SseClient::connect(&node.client, &node.url("/v1/channels/long/events"), None).await;
    assert_eq!(sse.status, 200);
    let mut ws = ws_connect(&node.ws_url("/v1/channels/long/ws")).await;

    tokio::time::sleep(TIMEOUT * 3).await;
    let (status, body) = node.publish("long", serde_json::json!("late")).await;
    assert_eq!(status, 201, "{body}");

    let event = within("SSE event after the timeout", NODE_WAIT, sse.next_message())
        .await
        .expect("the SSE stream was cut");
    assert_eq!(event["offset"], 1);
    assert_eq!(event["data"], "late");
    let frame = within("WebSocket message after the timeout", NODE_WAIT, ws.next())
        .await
        .expect("the WebSocket was closed")
        .expect("WebSocket frame");
    let message: serde_json::Value =
        serde_json::from_str(frame.to_text().expect("a text frame")).unwrap();
    assert_eq!(message["offset"], 1);
    assert_eq!(message["data"], "late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_returns_with_idle_and_unfinished_connections_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(
        dir.path(),
        "node-a",
        Role::Holder,
        ServerConfig {
            // Longer than any wait here: the drain must not rely on it.
            header_read_timeout: Duration::from_secs(60),
            ..ServerConfig::default()
        },
    )
    .await;
    let mut idle = connect(&node).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 4096];
    let n = within("the answer", NODE_WAIT, idle.read(&mut first))
        .await
        .unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    let mut silent = connect(&node).await;
    // Let the server accept the silent connection before draining.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    node.drain().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the drain waited {:?} for idle connections",
        started.elapsed()
    );
    read_until_closed(&mut idle, SLACK).await;
    read_until_closed(&mut silent, SLACK).await;
    // Nothing accepts any more.
    let addr = node.base.trim_start_matches("http://").to_owned();
    assert!(TcpStream::connect(addr).await.is_err());
}

/// Reads from `stream` until what was read contains `needle`, for at most
/// [`NODE_WAIT`]; returns everything read.
async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut got = Vec::new();
    within("the expected bytes", NODE_WAIT, async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(needle) {
            let n = stream.read(&mut buf).await.expect("a read");
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8(got).expect("UTF-8")
}

/// An SSE subscription is served outside hyper (`sse_connection.rs`): over
/// a raw socket its events come as chunks of a chunked body; when the
/// stream ends (the channel is deleted) the last chunk follows and the
/// server closes the connection, where hyper would keep it open for
/// another request. An error answer on that route is whole, with
/// `connection: close`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_subscription_comes_as_chunks_and_its_connection_closes_after() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let (status, body) = node.publish("raw", serde_json::json!("first")).await;
    assert_eq!(status, 201, "{body}");
    let host = node.url("").trim_start_matches("http://").to_owned();

    let mut stream = connect(&node).await;
    let head = format!(
        "GET /v1/channels/raw/events?after=0 HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let opening = read_until(&mut stream, "\"first\"").await;
    assert!(opening.starts_with("HTTP/1.1 200 OK\r\n"), "{opening}");
    assert!(
        opening.contains("transfer-encoding: chunked\r\n"),
        "{opening}"
    );
    // This connection closes when the stream ends, and says so.
    assert!(opening.contains("connection: close\r\n"), "{opening}");
    assert!(
        opening.contains("content-type: text/event-stream"),
        "{opening}"
    );
    assert!(opening.contains("\r\nid: 1\n"), "{opening}");

    let (status, _, body) = node.call("DELETE", "/v1/channels/raw", &[], None).await;
    assert!(status < 300, "{status} {body}");
    let rest = read_until_closed(&mut stream, NODE_WAIT).await;
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("event: deleted"), "{rest}");
    assert!(rest.ends_with("\r\n0\r\n\r\n"), "{rest}");

    let mut stream = connect(&node).await;
    let head = format!("GET /v1/channels/raw/events?after=x HTTP/1.1\r\nHost: {host}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut stream, NODE_WAIT).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    assert!(answer.contains("\"code\":"), "{answer}");
}

/// A request with two `Host` fields is answered `400 invalid_host`
/// (RFC 9112 §3.2), on a route hyper serves and on the SSE route served
/// outside it (`sse_connection.rs`), over raw sockets; with one `Host`
/// the same requests are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_fields_are_refused_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path()).await;
    let (status, body) = node.publish("hosts", serde_json::json!("first")).await;
    assert_eq!(status, 201, "{body}");
    let host = node.url("").trim_start_matches("http://").to_owned();
    let targets = [
        ("/healthz", "connection: close\r\n"),
        (
            "/v1/channels/hosts/events?after=0",
            "accept: text/event-stream\r\n",
        ),
    ];
    for (target, extra) in targets {
        let mut stream = connect(&node).await;
        let head =
            format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nHost: other.example\r\n{extra}\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let opening = read_until(&mut stream, "\r\n\r\n").await;
        assert!(
            opening.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{target}: {opening}"
        );
        let rest = read_until_closed(&mut stream, NODE_WAIT).await;
        let answer = format!("{opening}{}", String::from_utf8_lossy(&rest));
        assert!(answer.contains("\"code\":\"invalid_host\""), "{answer}");

        // One `Host`: served.
        let mut stream = connect(&node).await;
        let head = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let opening = read_until(&mut stream, "\r\n\r\n").await;
        assert!(opening.starts_with("HTTP/1.1 200 OK\r\n"), "{opening}");
    }
}
