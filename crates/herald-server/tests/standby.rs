//! Two nodes on one data directory: the standby forwards writes to the
//! holder (and refuses a forwarded one with the holder's URL), feeds its
//! subscribers with what the holder commits, and takes over when the holder
//! drains.

use herald_lease::LeaseState;
use herald_server::ServerConfig;
use herald_testkit::node::{publish_n, Node, Role};
use herald_testkit::sse::SseClient;
use herald_testkit::{within, NODE_WAIT};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_forwards_writes_and_follows_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    publish_n(&holder, "feed", 1, 2).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;

    // A plain publish to the standby is committed by the holder.
    let (status, body) = standby.publish("feed", json!({ "i": 3 })).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["offset"], 3);
    assert_eq!(body["channel"], "feed");
    assert_eq!(holder.head("feed").await, 3);

    // A publish that was already forwarded once is refused: 503 not_holder
    // with the holder's URL and Retry-After, and nothing is stored.
    let response = standby
        .client
        .post(standby.url("/v1/channels/feed/messages"))
        .header("herald-forwarded-by", "node-c")
        .json(&json!({ "data": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_holder");
    assert_eq!(body["error"]["holder_url"], holder.base.as_str());
    assert_eq!(holder.head("feed").await, 3);

    let (_, status) = standby.get("/v1/status").await;
    assert_eq!(status["role"], "standby");
    assert_eq!(status["node_id"], "node-b");
    assert_eq!(status["lease"]["holder"], "node-a");
    let holder_view = json!({ "node_id": "node-a", "url": holder.base });
    assert_eq!(status["holder"], holder_view);
    let (_, status) = holder.get("/v1/status").await;
    assert_eq!(status["holder"], holder_view);

    // Reads and live subscriptions work on the standby.
    let mut sse = SseClient::connect(
        &standby.client,
        &standby.url("/v1/channels/feed/events?after=1"),
        None,
    )
    .await;
    assert_eq!(sse.status, 200);
    for offset in 2..=3u64 {
        assert_eq!(
            within("history on standby", NODE_WAIT, sse.next_message())
                .await
                .unwrap()["offset"],
            offset
        );
    }
    publish_n(&holder, "feed", 4, 3).await;
    for offset in 4..=6u64 {
        let m = within(
            "holder's commits on the standby",
            NODE_WAIT,
            sse.next_message(),
        )
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
        NODE_WAIT,
        standby
            .lease
            .wait_for(|s| matches!(s, LeaseState::Holder { .. })),
    )
    .await;
    assert!(became.is_some());
    let (status, body) = standby.publish("feed", json!({ "i": 7 })).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["offset"], 7);
    let m = within(
        "own commit on the new holder",
        NODE_WAIT,
        sse.next_message(),
    )
    .await
    .unwrap();
    assert_eq!(m["offset"], 7);
    let (_, status) = standby.get("/v1/status").await;
    assert_eq!(status["role"], "holder");
    assert_ne!(status["lease"]["holder_url"], holder_url.as_str());
    assert_eq!(
        status["holder"],
        json!({ "node_id": "node-b", "url": standby.base })
    );
    standby.stop().await;
}
