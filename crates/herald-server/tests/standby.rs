//! Two nodes on one data directory: the standby refuses writes with the
//! holder's URL, feeds its subscribers with what the holder commits, and
//! takes over when the holder drains.

mod common;

use common::{publish_n, within, Node, Role, SseClient};
use herald_lease::LeaseState;
use herald_server::ServerConfig;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_redirects_writes_and_follows_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    publish_n(&holder, "feed", 1, 2).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;

    // Writes: 503 not_holder with the holder's URL and Retry-After.
    let response = standby
        .client
        .post(standby.url("/v1/channels/feed/messages"))
        .json(&json!({ "data": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_holder");
    assert_eq!(body["error"]["holder_url"], holder.base.as_str());
    assert_eq!(holder.head("feed").await, 2);

    let (_, status) = standby.get("/v1/status").await;
    assert_eq!(status["role"], "standby");
    assert_eq!(status["node_id"], "node-b");
    assert_eq!(status["lease"]["holder"], "node-a");

    // Reads and live subscriptions work on the standby.
    let mut sse = SseClient::connect(
        &standby.client,
        &standby.url("/v1/channels/feed/events?after=1"),
        None,
    )
    .await;
    assert_eq!(sse.status, 200);
    assert_eq!(
        within("history on standby", sse.next_message())
            .await
            .unwrap()["offset"],
        2
    );
    publish_n(&holder, "feed", 3, 3).await;
    for offset in 3..=5u64 {
        let m = within("holder's commits on the standby", sse.next_message())
            .await
            .unwrap();
        assert_eq!(m["offset"], offset);
        assert_eq!(m["data"], json!({ "i": offset }));
    }

    // The holder drains and releases; the standby takes over and its
    // subscriber goes on without a gap.
    let holder_url = holder.base.clone();
    holder.stop().await;
    let became = within(
        "standby takes over",
        standby
            .lease
            .wait_for(|s| matches!(s, LeaseState::Holder { .. })),
    )
    .await;
    assert!(became.is_some());
    let (status, body) = standby.publish("feed", json!({ "i": 6 })).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["offset"], 6);
    let m = within("own commit on the new holder", sse.next_message())
        .await
        .unwrap();
    assert_eq!(m["offset"], 6);
    let (_, status) = standby.get("/v1/status").await;
    assert_eq!(status["role"], "holder");
    assert_ne!(status["lease"]["holder_url"], holder_url.as_str());
    standby.stop().await;
}
