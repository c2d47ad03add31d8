//! Writes on any node: two nodes on one data directory, a publish to the
//! standby is forwarded once to the holder and answered with the holder's
//! answer; without a reachable holder the standby answers `no_holder`; a
//! forward to a frozen holder ends when the standby takes the lease over.

use std::time::Duration;

use herald_lease::{LeaseState, Release, StopReason};
use herald_server::ServerConfig;
use herald_testkit::node::{FakeHolder, Node, Role};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// POSTs `body` to `channel` on `node` with an optional idempotency key;
/// returns (status, Retry-After, body).
async fn post(
    node: &Node,
    channel: &str,
    body: &'static str,
    key: Option<&str>,
) -> (u16, Option<String>, Value) {
    post_to(
        node.client.clone(),
        node.url(&format!("/v1/channels/{channel}/messages")),
        body,
        key,
    )
    .await
}

/// [`post`] in a task of its own, so that the test can act while the
/// publish waits for its answer.
fn spawn_post(
    node: &Node,
    channel: &str,
    body: &'static str,
    key: Option<&str>,
) -> JoinHandle<(u16, Option<String>, Value)> {
    let url = node.url(&format!("/v1/channels/{channel}/messages"));
    tokio::spawn(post_to(
        node.client.clone(),
        url,
        body,
        key.map(str::to_owned),
    ))
}

async fn post_to(
    client: reqwest::Client,
    url: String,
    body: &'static str,
    key: Option<impl AsRef<str>>,
) -> (u16, Option<String>, Value) {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key.as_ref());
    }
    let response = request.send().await.expect("publish request");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, response.json().await.expect("JSON"))
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
    // The same key for another message: 422 through either node.
    for node in [&standby, &holder] {
        let (status, _, body) = post(node, "orders", r#"{"data": 7}"#, Some("order-7")).await;
        assert_eq!(status, 422, "{} answered {body}", node.node_id);
        assert_eq!(body["error"]["code"], "idempotency_key_reused");
    }
    let stored = holder.stored("orders").await;
    assert_eq!(stored.len(), 2, "stored once");
    assert_eq!(
        stored[1].data.to_json_text(),
        r#"{"b": 1.50, "a": [true, null]}"#
    );

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

    let text = standby.metrics().await;
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
    let text = standby.metrics().await;
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

/// The forward timeout of the nodes in the takeover tests: long, so that an
/// answer within [`NODE_WAIT`] cannot come from a forward that waited it out.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);
const _: () = assert!(NODE_WAIT.as_secs() * 2 <= FORWARD_TIMEOUT.as_secs());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_to_a_frozen_holder_ends_when_the_standby_takes_the_lease_over() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        forward_timeout: FORWARD_TIMEOUT,
        ..ServerConfig::default()
    };
    // The holder advertises a URL where requests are read and never
    // answered: a frozen holder, as far as forwards can tell.
    let frozen = FakeHolder::start().await;
    let holder = Node::start_advertising(
        dir.path(),
        "node-a",
        Role::Holder,
        config.clone(),
        &frozen.url,
    )
    .await;
    // The holder stored this one before it froze.
    let (status, _, body) = post(&holder, "c", r#"{"data": "early"}"#, Some("k-early")).await;
    assert_eq!((status, body["offset"].clone()), (201, json!(1)), "{body}");
    let standby = Node::start(dir.path(), "node-b", Role::Standby, config).await;
    let (_, status) = standby.get("/v1/status").await;
    assert_eq!(status["holder"]["url"], frozen.url.as_str(), "{status}");

    let without_key = spawn_post(&standby, "c", r#"{"data": "plain"}"#, None);
    let stored_before = spawn_post(&standby, "c", r#"{"data": "early"}"#, Some("k-early"));
    let new_key = spawn_post(&standby, "c", r#"{"data": "new"}"#, Some("k-new"));
    let reused = spawn_post(&standby, "c", r#"{"data": "other"}"#, Some("k-early"));
    frozen.wait_requests(4).await;
    for publish in [&without_key, &stored_before, &new_key, &reused] {
        assert!(!publish.is_finished(), "answered before the takeover");
    }

    // The holder goes; the standby takes the lease over.
    holder.stop().await;
    within(
        "the standby takes the lease over",
        NODE_WAIT,
        standby
            .lease
            .wait_for(|s| matches!(s, LeaseState::Holder { .. })),
    )
    .await
    .expect("supervisor running");

    // Every publish is answered within NODE_WAIT of the takeover, well before
    // the forward timeout: without a key, no_holder, retry at once...
    let (status, retry_after, body) =
        within("no_holder after the takeover", NODE_WAIT, without_key)
            .await
            .unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_holder", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert_eq!(retry_after.as_deref(), Some("1"));
    // ...with a key, committed by the new holder itself: the key the old
    // holder stored answers the original message, a new key is stored once.
    let (status, _, body) = within(
        "the stored key after the takeover",
        NODE_WAIT,
        stored_before,
    )
    .await
    .unwrap();
    assert_eq!((status, body["offset"].clone()), (200, json!(1)), "{body}");
    let (status, _, body) = within("the new key after the takeover", NODE_WAIT, new_key)
        .await
        .unwrap();
    assert_eq!((status, body["offset"].clone()), (201, json!(2)), "{body}");
    // The old holder's key for another message: refused after the
    // takeover as on the old holder, since the digest is stored with it.
    let (status, _, body) = within("the reused key after the takeover", NODE_WAIT, reused)
        .await
        .unwrap();
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "idempotency_key_reused");
    let stored: Vec<String> = standby
        .stored("c")
        .await
        .iter()
        .map(|m| m.data.to_json_text().into_owned())
        .collect();
    assert_eq!(stored, [r#""early""#, r#""new""#]);
    let text = standby.metrics().await;
    assert!(
        text.contains("herald_forwarded_writes_total{result=\"takeover\"}"),
        "{text}"
    );
    standby.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_standby_lets_its_forwards_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        forward_timeout: FORWARD_TIMEOUT,
        ..ServerConfig::default()
    };
    let slow = FakeHolder::start().await;
    let holder = Node::start_advertising(
        dir.path(),
        "node-a",
        Role::Holder,
        config.clone(),
        &slow.url,
    )
    .await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, config).await;
    let publish = spawn_post(&standby, "c", r#"{"data": 1}"#, None);
    slow.wait_requests(1).await;

    // The standby drains as `herald serve` does: the server first, then
    // the lease supervisor, while the forward is still waiting.
    standby.shutdown.cancel();
    standby.stop_lease();
    within(
        "the standby's supervisor stops",
        NODE_WAIT,
        standby.lease.wait_for(|s| {
            *s == LeaseState::Stopped {
                reason: StopReason::Drained {
                    release: Release::NotHeld,
                },
            }
        }),
    )
    .await
    .expect("the supervisor stopped by drain");
    assert!(!publish.is_finished(), "answered before the holder did");

    // The holder it forwarded to is unchanged: its answer comes back.
    let answer = r#"{"channel":"c","offset":7,"published_at":"2026-11-21T18:50:34.123Z"}"#;
    slow.answer(201, answer);
    let (status, _, body) = within("the holder's answer", NODE_WAIT, publish)
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    assert_eq!(body, serde_json::from_str::<Value>(answer).unwrap());
    standby.stop().await;
    holder.stop().await;
}
