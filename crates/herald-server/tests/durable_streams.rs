//! The Durable Streams wing end to end, on SQLite and PostgreSQL: a stream
//! is a channel, so what one protocol writes the others read, and a
//! stream's closure and content type bind Herald's API too. The
//! protocol's own suite runs in `crates/herald/tests/durable_streams.rs`.

use herald_server::ServerConfig;
use herald_testkit::node::{Node, Role};
use herald_testkit::place::{Backend, Place};
use herald_testkit::sse::SseClient;
use herald_testkit::{within, NODE_WAIT};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// Sends `method` to `path` with `headers` and a raw `body`; returns
/// status, headers and the body's text.
async fn send(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, HeaderMap, String) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = node
        .client
        .request(method, node.url(path))
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("a request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.expect("a body"))
}

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
const TEXT: [(&str, &str); 1] = [("content-type", "text/plain")];

async fn one_log_for_every_protocol(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let created = send(&node, "PUT", "/ds/app/feed", &JSON, b"[]").await;
    assert_eq!(created.0, 201, "{}", created.2);
    let appended = send(
        &node,
        "POST",
        "/ds/app/feed",
        &JSON,
        br#"[{"n":1},{"n":2}]"#,
    )
    .await;
    assert_eq!(appended.0, 204, "{}", appended.2);
    assert_eq!(
        appended.1["stream-next-offset"],
        "0000000000000000_0000000000000002"
    );
    // Herald's API publishes to the stream's channel, `app:feed`.
    let (status, body) = node.publish("app:feed", json!({"n": 3})).await;
    assert_eq!((status, &body["offset"]), (201, &json!(3)), "{body}");
    let read = send(&node, "GET", "/ds/app/feed?offset=-1", &[], b"").await;
    assert_eq!(read.0, 200);
    let items: Value = serde_json::from_str(&read.2).unwrap();
    assert_eq!(items, json!([{"n": 1}, {"n": 2}, {"n": 3}]));
    let (status, history) = node.get("/v1/channels/app:feed/messages").await;
    assert_eq!(status, 200);
    let data: Vec<&Value> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["data"])
        .collect();
    assert_eq!(data, [&json!({"n": 1}), &json!({"n": 2}), &json!({"n": 3})]);
}

async fn closure_and_content_type_bind_herald_publishes(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    assert_eq!(send(&node, "PUT", "/ds/app/done", &JSON, b"").await.0, 201);
    let closed = send(
        &node,
        "POST",
        "/ds/app/done",
        &[("stream-closed", "true")],
        b"",
    )
    .await;
    assert_eq!(closed.0, 204, "{}", closed.2);
    assert_eq!(closed.1["stream-closed"], "true");
    let (status, body) = node.publish("app:done", json!(1)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("channel_closed")),
        "{body}"
    );
    let late = send(&node, "POST", "/ds/app/done", &JSON, b"1").await;
    assert_eq!(late.0, 409);
    assert_eq!(late.1["stream-closed"], "true");
    assert_eq!(
        late.1["stream-next-offset"],
        "0000000000000000_0000000000000000"
    );

    // A byte stream takes no JSON publish, and Herald's API shows its
    // bytes as base64.
    assert_eq!(send(&node, "PUT", "/ds/app/log", &TEXT, b"hi").await.0, 201);
    let (status, body) = node.publish("app:log", json!("x")).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("content_type_mismatch")),
        "{body}"
    );
    let (_, history) = node.get("/v1/channels/app:log/messages").await;
    assert_eq!(history["messages"][0]["data_base64"], "aGk=");
    let read = send(&node, "GET", "/ds/app/log", &[], b"").await;
    assert_eq!((read.0, read.2.as_str()), (200, "hi"));
}

async fn refusals_change_nothing(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    for path in ["/ds/a:b", "/ds/a%20b", "/ds/_x", "/ds/a//b"] {
        let answer = send(&node, "PUT", path, &TEXT, b"x").await;
        assert_eq!(answer.0, 400, "{path}: {}", answer.2);
        assert!(answer.2.contains("invalid_stream_request"), "{}", answer.2);
    }
    assert_eq!(send(&node, "PUT", "/ds/app/s", &TEXT, b"").await.0, 201);
    // A page of another origin cannot write, whatever the type it sends.
    let forged = send(
        &node,
        "POST",
        "/ds/app/s",
        &[
            ("content-type", "text/plain"),
            ("origin", "https://evil.example"),
        ],
        b"x",
    )
    .await;
    assert_eq!(forged.0, 403, "{}", forged.2);
    let bad_producer = send(
        &node,
        "POST",
        "/ds/app/s",
        &[("content-type", "text/plain"), ("producer-id", "p")],
        b"x",
    )
    .await;
    assert_eq!(bad_producer.0, 400);
    let head = send(&node, "HEAD", "/ds/app/s", &[], b"").await;
    assert_eq!(head.0, 200);
    assert_eq!(
        head.1["stream-next-offset"],
        "0000000000000000_0000000000000000"
    );
    assert_eq!(head.1["x-content-type-options"], "nosniff");
    let missing = send(&node, "GET", "/ds/app/nothing", &[], b"").await;
    assert_eq!(missing.0, 404);
    assert_eq!(missing.1["x-content-type-options"], "nosniff");
}

/// An SSE reader of a stream that is deleted while a fork of it lives
/// (soft-deleted: its URL answers `410`) ends as at a deletion, without
/// waiting for the periodic look at the stream.
async fn soft_deletion_ends_sse_readers(backend: Backend) {
    let place = Place::new(backend).await;
    let mut config = ServerConfig::default();
    // Far beyond the test's wait: only the deletion can end the reader.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    assert_eq!(send(&node, "PUT", "/ds/app/src", &TEXT, b"a").await.0, 201);
    let fork = send(
        &node,
        "PUT",
        "/ds/app/fork",
        &[
            ("content-type", "text/plain"),
            ("stream-forked-from", "app/src"),
        ],
        b"",
    )
    .await;
    assert_eq!(fork.0, 201, "{}", fork.2);
    let url = node.url("/ds/app/src?offset=-1&live=sse");
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    // Read up to date: the data, then its control.
    within("the stream's data", NODE_WAIT, async {
        loop {
            let event = sse.next_event().await.expect("an event");
            if event.event.as_deref() == Some("control") && event.data.contains("upToDate") {
                break;
            }
        }
    })
    .await;
    assert_eq!(send(&node, "DELETE", "/ds/app/src", &[], b"").await.0, 204);
    assert_eq!(send(&node, "GET", "/ds/app/src", &[], b"").await.0, 410);
    let rest = within("the end of the stream", NODE_WAIT, async {
        let mut rest = Vec::new();
        while let Some(event) = sse.next_event().await {
            rest.push(event);
        }
        rest
    })
    .await;
    assert!(
        rest.iter().all(|e| e.event.as_deref() != Some("data")),
        "{rest:?}"
    );
}

use herald_testkit::on_both_backends;

on_both_backends!(
    soft_deletion_ends_sse_readers: soft_deletion_ends_sse_on_sqlite,
    soft_deletion_ends_sse_on_postgres
);

on_both_backends!(one_log_for_every_protocol: one_log_on_sqlite, one_log_on_postgres);
on_both_backends!(
    closure_and_content_type_bind_herald_publishes: closure_binds_publishes_on_sqlite,
    closure_binds_publishes_on_postgres
);
on_both_backends!(refusals_change_nothing: refusals_on_sqlite, refusals_on_postgres);
