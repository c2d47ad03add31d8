//! Router-level tests against the in-memory storage and a hand-driven
//! lease (the end-to-end suite against SQLite and the real supervisor is in
//! `tests/`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use herald_core::FencingToken;
use herald_lease::{LeaseState, StopReason};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::app;
use crate::config::ServerConfig;
use crate::serve_with;
use crate::state::AppState;
use herald_node::testing::{FakeLease, MemoryStorage};

struct Node {
    storage: Arc<MemoryStorage>,
    lease: Arc<FakeLease>,
    state: AppState,
    shutdown: CancellationToken,
}

impl Node {
    async fn start(config: ServerConfig) -> Self {
        let storage = MemoryStorage::new();
        let lease = FakeLease::holder(FencingToken(1));
        let shutdown = CancellationToken::new();
        let state = AppState::start_with(storage.clone(), lease.clone(), config, shutdown.clone())
            .await
            .unwrap();
        Self {
            storage,
            lease,
            state,
            shutdown,
        }
    }

    async fn call(&self, request: Request<Body>) -> (StatusCode, HeaderMap, Value) {
        let response = app(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, headers, body)
    }

    async fn get(&self, uri: &str) -> (StatusCode, HeaderMap, Value) {
        self.call(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn post(&self, uri: &str, body: impl Into<Body>) -> (StatusCode, HeaderMap, Value) {
        self.call(
            Request::post(uri)
                .header("content-type", "application/json")
                .body(body.into())
                .unwrap(),
        )
        .await
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.state.stopped().await;
    }
}

fn assert_error(status: StatusCode, body: &Value, want_status: StatusCode, code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn publish_then_read_history() {
    let node = Node::start(ServerConfig::default()).await;
    for i in 1..=3u64 {
        let (status, _, body) = node
            .post(
                "/v1/channels/orders/messages",
                json!({ "data": { "n": i } }).to_string(),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["channel"], "orders");
        assert_eq!(body["offset"], i);
        assert!(body["published_at"].as_str().unwrap().ends_with('Z'));
    }
    let (status, _, body) = node
        .get("/v1/channels/orders/messages?after=1&limit=10")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["head"], 3);
    assert_eq!(body["messages"][0]["offset"], 2);
    assert_eq!(body["messages"][0]["data"], json!({ "n": 2 }));
    assert_eq!(body["messages"].as_array().unwrap().len(), 2);
    let (_, _, body) = node.get("/v1/channels").await;
    assert_eq!(
        body,
        json!({ "channels": [{
            "name": "orders", "head": 3, "earliest": 1, "messages": 3, "bytes": 21
        }] })
    );
    node.stop().await;
}

#[tokio::test]
async fn data_is_stored_as_sent() {
    let node = Node::start(ServerConfig::default()).await;
    let raw = r#"{"data": {"b": 1.50, "a": [true, null]}}"#;
    let (status, _, _) = node.post("/v1/channels/raw/messages", raw).await;
    assert_eq!(status, StatusCode::CREATED);
    let response = app(node.state.clone())
        .oneshot(
            Request::get("/v1/channels/raw/messages")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        text.contains(r#""data":{"b": 1.50, "a": [true, null]}"#),
        "{text}"
    );
    node.stop().await;
}

#[tokio::test]
async fn idempotency_key_answers_the_original() {
    let node = Node::start(ServerConfig::default()).await;
    let request = |data: &str| {
        Request::post("/v1/channels/c/messages")
            .header("content-type", "application/json")
            .header("idempotency-key", "k-1")
            .body(Body::from(format!(r#"{{"data":{data}}}"#)))
            .unwrap()
    };
    let (s1, _, b1) = node.call(request("1")).await;
    let (s2, _, b2) = node.call(request("1")).await;
    assert_eq!(s1, StatusCode::CREATED);
    assert_eq!(s2, StatusCode::OK);
    assert_eq!(b1, b2);
    assert_eq!(node.storage.head("c"), 1);
    // The same key for another message: 422, nothing stored.
    let (status, _, body) = node.call(request("2")).await;
    assert_error(
        status,
        &body,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    );
    assert_eq!(node.storage.head("c"), 1);
    let (status, _, body) = node
        .call(
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .header("idempotency-key", "has space")
                .body(Body::from(r#"{"data":1}"#))
                .unwrap(),
        )
        .await;
    assert_error(
        status,
        &body,
        StatusCode::BAD_REQUEST,
        "invalid_idempotency_key",
    );
    assert_eq!(node.storage.head("c"), 1);
    node.stop().await;
}

#[tokio::test]
async fn bad_requests_have_the_error_shape_and_change_nothing() {
    let config = ServerConfig {
        max_message_bytes: 1024,
        ..ServerConfig::default()
    };
    let node = Node::start(config).await;
    let ok = r#"{"data":1}"#;
    let cases: Vec<(Request<Body>, StatusCode, &str)> = vec![
        (
            Request::post("/v1/channels/-bad/messages")
                .header("content-type", "application/json")
                .body(Body::from(ok))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_channel",
        ),
        (
            Request::post("/v1/channels/a%20b/messages")
                .header("content-type", "application/json")
                .body(Body::from(ok))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_channel",
        ),
        (
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .body(Body::from("{"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .body(Body::from(r#"{"data":1,"x":1}"#))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .body(Body::from(format!(r#"{{"data":"{}"}}"#, "x".repeat(1100))))
                .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .header(header::CONTENT_LENGTH, "5000")
                .body(Body::from(ok))
                .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            Request::get("/v1/nope").body(Body::empty()).unwrap(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Request::delete("/v1/channels/c/messages")
                .body(Body::empty())
                .unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Request::get("/v1/channels/c/messages?limit=0")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_query",
        ),
        (
            Request::get("/v1/channels/c/messages?limit=1001")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_query",
        ),
        (
            Request::get("/v1/channels/c/messages?after=x")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_query",
        ),
        (
            Request::get("/v1/channels/c/messages?after=-1")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_query",
        ),
        (
            Request::get("/v1/channels/c/events")
                .header("last-event-id", "x")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_last_event_id",
        ),
        (
            Request::get("/v1/channels/c/ws")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_upgrade",
        ),
    ];
    for (request, status, code) in cases {
        let what = format!("{} {}", request.method(), request.uri());
        let (got, headers, body) = node.call(request).await;
        assert_error(got, &body, status, code);
        if code == "method_not_allowed" {
            let allow = headers[header::ALLOW].to_str().unwrap();
            assert!(
                allow.contains("GET") && allow.contains("POST"),
                "{what}: {allow}"
            );
        }
    }
    assert_eq!(node.storage.head("c"), 0);
    let (status, _, body) = node.get("/v1/channels/c/messages?limit=1000").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({ "channel": "c", "head": 0, "earliest": 1, "truncated": false, "messages": [] })
    );
    node.stop().await;
}

#[tokio::test]
async fn a_standby_refuses_a_forwarded_publish_and_points_to_the_holder() {
    let node = Node::start(ServerConfig::default()).await;
    node.lease.set_standby(Some("http://holder:8080"));
    let (status, headers, body) = node
        .call(
            Request::post("/v1/channels/c/messages")
                .header("content-type", "application/json")
                .header("herald-forwarded-by", "node-x")
                .body(Body::from(r#"{"data":1}"#))
                .unwrap(),
        )
        .await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "not_holder");
    assert_eq!(body["error"]["holder_url"], "http://holder:8080");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (_, _, status_body) = node.get("/v1/status").await;
    assert_eq!(status_body["role"], "standby");
    assert_eq!(
        status_body["holder"],
        json!({ "node_id": "node-b", "url": "http://holder:8080" })
    );
    assert_eq!(node.storage.head("c"), 0);
    node.stop().await;
}

#[tokio::test]
async fn a_standby_without_a_reachable_holder_answers_no_holder() {
    let node = Node::start(ServerConfig::default()).await;
    // No holder known.
    node.lease.set_standby(None);
    let (status, headers, body) = node.post("/v1/channels/c/messages", r#"{"data":1}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "no_holder");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (_, _, status_body) = node.get("/v1/status").await;
    assert!(status_body["holder"].is_null(), "{status_body}");
    // A stale row naming this node's own URL: not forwarded to itself.
    node.lease
        .set_standby(Some(&format!("{}/", ServerConfig::default().advertise_url)));
    let (status, _, body) = node.post("/v1/channels/c/messages", r#"{"data":1}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "no_holder");
    // A holder URL where nothing listens.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    node.lease.set_standby(Some(&url));
    let (status, headers, body) = node.post("/v1/channels/c/messages", r#"{"data":1}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "no_holder");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    // Bad input is still refused here, before any forwarding.
    let (status, _, body) = node.post("/v1/channels/c/messages", "{").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    // A draining standby answers draining, without forwarding.
    node.shutdown.cancel();
    let (status, _, body) = node.post("/v1/channels/c/messages", r#"{"data":1}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "draining");
    assert_eq!(node.storage.head("c"), 0);
    let (_, _, metrics) = node.get("/metrics").await;
    let text = metrics.as_str().unwrap();
    for name in [
        "herald_forwarded_writes_total{result=\"no_holder\"}",
        "herald_forwarded_writes_total{result=\"error\"}",
    ] {
        assert!(text.contains(name), "{name} missing in:\n{text}");
    }
    node.stop().await;
}

/// Longest a test waits for an answer after a takeover; the forward timeout
/// of those tests is far longer, so such an answer did not wait it out.
const WAIT: Duration = Duration::from_secs(20);

/// A publish of `{"data":1}` on channel `c` (with `key`, if any) sent to
/// A node whose forwards would wait an hour, and a listener to stand for a
/// frozen holder: only a role change can end a forward to it.
async fn node_and_frozen_holder() -> (Node, tokio::net::TcpListener) {
    let node = Node::start(ServerConfig {
        forward_timeout: Duration::from_secs(3600),
        ..ServerConfig::default()
    })
    .await;
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    (node, frozen)
}

/// `node`, a standby whose holder is `frozen`: a listener whose
/// connections are read and never answered. Returns once the forwarded
/// request has reached `frozen`, with the publish's answer still to come
/// and the forward's connection, to keep it open.
async fn forward_to_frozen_holder(
    node: &Node,
    frozen: &tokio::net::TcpListener,
    key: Option<&'static str>,
) -> (
    tokio::task::JoinHandle<axum::response::Response>,
    tokio::net::TcpStream,
) {
    use tokio::io::AsyncReadExt;
    node.lease
        .set_standby(Some(&format!("http://{}", frozen.local_addr().unwrap())));
    let router = app(node.state.clone());
    let publish = tokio::spawn(async move {
        let mut request =
            Request::post("/v1/channels/c/messages").header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Body::from(r#"{"data":1}"#)).unwrap();
        router.oneshot(request).await.unwrap()
    });
    let (mut connection, _) = tokio::time::timeout(WAIT, frozen.accept())
        .await
        .expect("the forward connects")
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        let n = tokio::time::timeout(WAIT, connection.read(&mut byte))
            .await
            .expect("the forwarded request arrives")
            .unwrap();
        assert_eq!(n, 1, "the forward closed its connection");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("post /v1/channels/c/messages "), "{head}");
    assert!(!publish.is_finished(), "answered before the role changed");
    (publish, connection)
}

/// Awaits `publish` for at most [`WAIT`]; returns (status, Retry-After,
/// body).
async fn answer_of(
    publish: tokio::task::JoinHandle<axum::response::Response>,
) -> (StatusCode, HeaderMap, Value) {
    let response = tokio::time::timeout(WAIT, publish)
        .await
        .expect("answered before the forward timeout")
        .unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, headers, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn a_forward_ends_with_no_holder_when_this_node_stops_after_a_takeover() {
    let (node, frozen) = node_and_frozen_holder().await;
    // With a key too: this node is no holder any more, it cannot commit.
    let (publish, _connection) = forward_to_frozen_holder(&node, &frozen, Some("k")).await;
    // The node took the lease over (token 8) and lost it again before the
    // forward looked: the watch shows only the latest state.
    node.lease.set(LeaseState::Stopped {
        reason: StopReason::LeaseLost {
            token: FencingToken(8),
        },
    });
    let (status, headers, body) = answer_of(publish).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "no_holder");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    assert_eq!(node.storage.head("c"), 0);
    node.stop().await;
}

#[tokio::test]
async fn a_commit_refused_after_a_takeover_answers_no_holder() {
    let (node, frozen) = node_and_frozen_holder().await;
    let (publish, _connection) = forward_to_frozen_holder(&node, &frozen, Some("k")).await;
    // Holder with token 8, but the storage already knows token 9: the
    // commit is refused as lease_lost, which speaks only for this node.
    // The old holder's outcome is unknown: no_holder.
    node.storage.set_current_token(FencingToken(9));
    node.lease.set(FakeLease::holder_state(FencingToken(8)));
    let (status, headers, body) = answer_of(publish).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "no_holder");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    assert_eq!(node.storage.head("c"), 0);
    node.stop().await;
}

#[tokio::test]
async fn readyz_by_role() {
    let node = Node::start(ServerConfig::default()).await;
    let (status, _, _) = node.get("/readyz?role=holder").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = node.get("/readyz?role=leader").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
    node.lease.set_standby(Some("http://holder:8080"));
    let (status, headers, body) = node.get("/readyz?role=holder").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "not_holder");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (status, _, _) = node.get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    node.stop().await;
}

/// A node whose own view still says holder (its safety deadline has not
/// passed: it has not yet heard of the takeover) answers holder no
/// longer once the lease row names another token: `/readyz?role=holder`
/// and `/v1/status` prove the role on the lease row at each request.
#[tokio::test]
async fn the_holder_probe_follows_the_lease_row_not_only_the_nodes_view() {
    let node = Node::start(ServerConfig::default()).await;
    let (status, _, _) = node.get("/readyz?role=holder").await;
    assert_eq!(status, StatusCode::OK);
    let (_, _, body) = node.get("/v1/status").await;
    assert_eq!(body["role"], "holder", "{body}");

    // Another node took the lease over (token 2); this node's view is
    // unchanged, its deadline far away.
    node.storage.set_current_token(FencingToken(2));
    assert!(node.state.shared.node.lease().is_holder());
    let (status, headers, body) = node.get("/readyz?role=holder").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "not_holder");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    let (_, _, body) = node.get("/v1/status").await;
    assert_eq!(body["role"], "standby", "{body}");
    // Plain readiness is unaffected: the node still serves reads.
    let (status, _, _) = node.get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    node.stop().await;
}

#[tokio::test]
async fn a_full_queue_answers_queue_full() {
    let config = ServerConfig {
        queue_capacity: 1,
        ..ServerConfig::default()
    };
    let node = Node::start(config).await;
    let gate = node.storage.hold_appends().await;
    let publish = |node: &Node| {
        let router = app(node.state.clone());
        tokio::spawn(async move {
            router
                .oneshot(
                    Request::post("/v1/channels/q/messages")
                        .header("content-type", "application/json")
                        .body(Body::from(r#"{"data":1}"#))
                        .unwrap(),
                )
                .await
                .unwrap()
        })
    };
    // The first publish is taken by the writer and blocks in append; the
    // second fills the queue.
    let first = publish(&node);
    node.storage.wait_for_appends_started(1).await;
    let second = publish(&node);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while node.state.shared.node.writer().queued() < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "second publish never queued"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (status, headers, body) = node.post("/v1/channels/q/messages", r#"{"data":1}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "queue_full");
    assert_eq!(headers[header::RETRY_AFTER], "1");
    drop(gate);
    assert_eq!(first.await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(second.await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(node.storage.head("q"), 2);
    node.stop().await;
}

#[tokio::test]
async fn ops_routes() {
    let node = Node::start(ServerConfig {
        node_id: "n-1".to_owned(),
        ..ServerConfig::default()
    })
    .await;
    let (status, _, body) = node.get("/healthz").await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "status": "ok" })));
    let (status, _, _) = node.get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = node.get("/v1/status").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["node_id"], "n-1");
    assert_eq!(body["role"], "holder");
    assert_eq!(body["draining"], false);
    assert_eq!(body["backend"], "memory");
    assert_eq!(body["lease"]["name"], "writer");
    assert_eq!(body["lease"]["token"], 1);
    assert_eq!(
        body["holder"],
        json!({ "node_id": "n-1", "url": ServerConfig::default().advertise_url })
    );
    node.post("/v1/channels/m/messages", r#"{"data":1}"#).await;
    let (status, headers, body) = node.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = body.as_str().unwrap();
    for name in [
        "herald_publishes_total{result=\"created\"}",
        "herald_publish_duration_seconds_bucket",
        "herald_writer_batch_messages_sum",
        "herald_writer_batch_messages_count",
        "herald_lease_role",
        "herald_lease_token",
    ] {
        assert!(text.contains(name), "{name} missing in:\n{text}");
    }
    node.storage.fail_reads(true);
    let (status, _, body) = node.get("/readyz").await;
    assert_error(
        status,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "storage_unavailable",
    );
    node.storage.fail_reads(false);
    node.shutdown.cancel();
    let (status, _, body) = node.get("/readyz").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "draining");
    let (status, _, body) = node.post("/v1/channels/m/messages", r#"{"data":1}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "draining");
    node.stop().await;
}

#[tokio::test]
async fn real_listener_refuses_a_2_mib_body_with_json() {
    let storage = MemoryStorage::new();
    let lease = FakeLease::holder(FencingToken(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve_with(
        listener,
        storage.clone(),
        lease,
        ServerConfig::default(),
        shutdown.clone(),
        None,
    ));
    let client = reqwest::Client::new();
    let body = format!(r#"{{"data":"{}"}}"#, "x".repeat(2 << 20));
    let response = client
        .post(format!("{base}/v1/channels/big/messages"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(storage.head("big"), 0);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The log records of the calling thread, as JSON objects, while `guard`
/// lives (tests run on a current-thread runtime, so the server's tasks log
/// on that thread too).
fn capture_logs() -> (
    tracing::subscriber::DefaultGuard,
    Arc<std::sync::Mutex<Vec<u8>>>,
) {
    let buffer = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = {
        let buffer = Arc::clone(&buffer);
        move || LogWriter(Arc::clone(&buffer))
    };
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::WARN)
        .with_writer(writer)
        .finish();
    (tracing::subscriber::set_default(subscriber), buffer)
}

/// Appends log output to a shared buffer.
struct LogWriter(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Takes the records captured so far whose message is `message`.
fn take_records(buffer: &std::sync::Mutex<Vec<u8>>, message: &str) -> Vec<Value> {
    let bytes = std::mem::take(&mut *buffer.lock().unwrap());
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["message"] == message)
        .collect()
}

/// A storage failure is logged once, where it becomes the answer, with
/// what was asked and the storage's error.
#[tokio::test]
async fn a_storage_failure_is_logged_once_with_its_operation() {
    let (_guard, logs) = capture_logs();
    let node = Node::start(ServerConfig::default()).await;

    node.storage.fail_reads(true);
    let (status, _, body) = node.get("/v1/channels/c/messages").await;
    assert_error(
        status,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "storage_unavailable",
    );
    let records = take_records(&logs, "storage unavailable");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["level"], "WARN");
    assert_eq!(records[0]["operation"], "read");
    assert_eq!(records[0]["channel"], "c");
    assert_eq!(records[0]["error"], "storage unavailable: injected failure");

    let (status, _, _) = node.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let records = take_records(&logs, "storage unavailable");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["operation"], "ping");
    node.storage.fail_reads(false);

    node.storage.corrupt_reads(true);
    for uri in ["/v1/channels/c/messages", "/v1/channels/c/events"] {
        let (status, _, body) = node.get(uri).await;
        assert_error(
            status,
            &body,
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
        );
        let records = take_records(&logs, "storage failed");
        assert_eq!(records.len(), 1, "{uri}: {records:?}");
        assert_eq!(records[0]["level"], "ERROR");
        assert_eq!(records[0]["operation"], "read");
        assert_eq!(records[0]["error"], "corrupt data: injected damage");
    }
    node.storage.corrupt_reads(false);

    // A failed batch: logged once by the writer, for all its publishes.
    node.storage.fail_appends(true);
    let (status, _, body) = node.post("/v1/channels/c/messages", r#"{"data":1}"#).await;
    assert_error(
        status,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "storage_unavailable",
    );
    let records = take_records(&logs, "storage unavailable");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["operation"], "append");
    node.stop().await;
}

/// The server API's `unsubscribe` and `disconnect` go to the other nodes
/// as cluster events (Centrifugo's are cluster-wide); one too large for a
/// notification is refused with 107 and sends nothing.
#[tokio::test]
async fn server_api_unsubscribe_and_disconnect_are_sent_to_every_node() {
    use herald_storage::ClusterEvent;
    let node = Node::start(ServerConfig::default()).await;
    let (_, _, r) = node
        .post("/api/unsubscribe", r#"{"user": "ann", "channel": "news"}"#)
        .await;
    assert_eq!(r, json!({"result": {}}));
    let (_, _, r) = node
        .post(
            "/api/disconnect",
            r#"{"user": "ann", "disconnect": {"code": 3100}}"#,
        )
        .await;
    assert_eq!(r, json!({"result": {}}));
    let (_, _, r) = node.post("/api/disconnect", r#"{"user": "bob"}"#).await;
    assert_eq!(r, json!({"result": {}}));
    let sent = vec![
        ClusterEvent::Unsubscribe {
            user: "ann".to_owned(),
            channel: herald_core::ChannelName::new("news").unwrap(),
        },
        ClusterEvent::Disconnect {
            user: "ann".to_owned(),
            code: 3011,
        },
        ClusterEvent::Disconnect {
            user: "bob".to_owned(),
            code: 3503,
        },
    ];
    assert_eq!(node.storage.sent_events(), sent);

    let huge = json!({"user": "u".repeat(8000)}).to_string();
    let (status, _, r) = node.post("/api/disconnect", huge).await;
    assert_eq!(
        (status, &r["error"]["code"]),
        (StatusCode::OK, &json!(107)),
        "{r}"
    );
    assert_eq!(node.storage.sent_events(), sent);
    node.stop().await;
}
