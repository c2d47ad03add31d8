//! Writes on any node: two nodes on one data directory, a publish to the
//! standby is forwarded once to the holder and answered with the holder's
//! answer; without a reachable holder the standby answers `no_holder`.

mod common;

use common::{Node, Role};
use herald_server::ServerConfig;
use serde_json::{json, Value};

/// POSTs `body` to `channel` on `node` with an optional idempotency key;
/// returns (status, Retry-After, body).
async fn post(
    node: &Node,
    channel: &str,
    body: &'static str,
    key: Option<&str>,
) -> (u16, Option<String>, Value) {
    let mut request = node
        .client
        .post(node.url(&format!("/v1/channels/{channel}/messages")))
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("publish request");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, response.json().await.expect("JSON"))
}

async fn metrics(node: &Node) -> String {
    node.client
        .get(node.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_the_standby_is_committed_once_by_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;
    let (status, _, body) = post(&holder, "orders", r#"{"data": 0}"#, None).await;
    assert_eq!(status, 201, "{body}");

    // The holder's answer comes back: 201 with the next offset. The body's
    // exact bytes reach the holder (whitespace and number format kept).
    let raw = r#"{"data": {"b": 1.50, "a": [true, null]}}"#;
    let (status, _, body) = post(&standby, "orders", raw, Some("order-7")).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["channel"], "orders");
    assert_eq!(body["offset"], 2);
    let published_at = body["published_at"].clone();
    assert!(published_at.is_string(), "{body}");

    // The same key again, through either node: the original message.
    for node in [&standby, &holder] {
        let (status, _, body) = post(node, "orders", raw, Some("order-7")).await;
        assert_eq!(status, 200, "{} answered {body}", node.node_id);
        assert_eq!(body["offset"], 2);
        assert_eq!(body["published_at"], published_at);
    }
    let stored = holder.stored("orders").await;
    assert_eq!(stored.len(), 2, "stored once");
    assert_eq!(stored[1].data.get(), r#"{"b": 1.50, "a": [true, null]}"#);

    // A key first used on the holder is a duplicate through the standby too.
    let (status, _, body) = post(&holder, "orders", r#"{"data": 3}"#, Some("k-3")).await;
    assert_eq!((status, body["offset"].clone()), (201, json!(3)));
    let (status, _, body) = post(&standby, "orders", r#"{"data": 3}"#, Some("k-3")).await;
    assert_eq!((status, body["offset"].clone()), (200, json!(3)));
    assert_eq!(holder.head("orders").await, 3);

    // The holder's errors come back unchanged too.
    let (status, _, body) = post(&standby, "orders", r#"{"data": 1, "x": 2}"#, None).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_body");

    let text = metrics(&standby).await;
    assert!(
        text.contains("herald_forwarded_writes_total{result=\"ok\"}"),
        "{text}"
    );
    standby.stop().await;
    holder.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_answers_no_holder_when_the_holder_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut holder = Node::holder(dir.path()).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;
    let (status, _, body) = post(&standby, "c", r#"{"data": 1}"#, None).await;
    assert_eq!(status, 201, "{body}");

    // The holder's server is gone but it still holds the lease: the
    // standby knows a holder whose URL does not answer.
    holder.drain().await;
    let (_, status) = standby.get("/v1/status").await;
    assert_eq!(status["role"], "standby");
    assert_eq!(
        status["holder"],
        json!({ "node_id": "node-a", "url": holder.base })
    );
    let (status, retry_after, body) = post(&standby, "c", r#"{"data": 2}"#, Some("k")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_holder");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(holder.head("c").await, 1, "nothing stored");
    let text = metrics(&standby).await;
    assert!(
        text.contains("herald_forwarded_writes_total{result=\"error\"}"),
        "{text}"
    );
    standby.stop().await;
    holder.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_for_the_holder_role_is_ready_only_on_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;

    let (status, body) = holder.get("/readyz?role=holder").await;
    assert_eq!((status, body), (200, json!({ "status": "ready" })));
    let (status, body) = standby.get("/readyz?role=holder").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "not_holder");
    assert_eq!(body["error"]["holder_url"], holder.base.as_str());
    // Plain readiness: both can serve.
    for node in [&holder, &standby] {
        let (status, _) = node.get("/readyz").await;
        assert_eq!(status, 200);
    }
    let (status, body) = standby.get("/readyz?role=standby").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_query");
    standby.stop().await;
    holder.stop().await;
}
