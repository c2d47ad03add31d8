//! End-to-end tests of retention: a resume point below a channel's
//! earliest offset gets an explicit answer over history, SSE and
//! WebSocket; a subscriber overtaken by trimming while it reads from the
//! storage gets it too; the holder's trimming task applies the policies;
//! deleting a channel keeps its head and ends live subscriptions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald_core::ChannelName;
use herald_server::{RetentionConfig, RetentionHandle, RetentionPolicy, ServerConfig, TrimPacing};
use herald_storage::{Storage, TrimLimits};
use herald_testkit::node::{publish_n, Node, Role};
use herald_testkit::sse::SseClient;
use herald_testkit::storage::{Hooked, StorageHooks};
use herald_testkit::ws::{ws_connect, ws_next};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

/// Trims `channel` on `node`'s storage with its lease, keeping the newest
/// `keep` messages.
async fn trim_keeping(node: &Node, channel: &str, keep: u64) {
    let lease = node
        .lease
        .writable_lease()
        .expect("the node holds the lease");
    let limits = TrimLimits {
        max_messages: Some(keep),
        ..TrimLimits::default()
    };
    loop {
        let t = node
            .storage
            .trim(&lease, &ChannelName::new(channel).unwrap(), &limits, 1000)
            .await
            .unwrap();
        if t.done {
            return;
        }
    }
}

/// Appends `n` messages `{"i": k}` to `channel` straight into the storage
/// (fast; no live notice).
async fn append_n(node: &Node, channel: &str, n: u64) {
    let lease = node
        .lease
        .writable_lease()
        .expect("the node holds the lease");
    let batch: Vec<_> = (1..=n)
        .map(|k| herald_testkit::msg(channel, &json!({ "i": k }).to_string()))
        .collect();
    node.storage.append(&lease, &batch).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_below_earliest_answers_from_earliest_and_says_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "t", 1, 10).await;
    trim_keeping(&node, "t", 3).await;

    let (status, body) = node.get("/v1/channels/t/messages?after=2").await;
    assert_eq!(status, 200);
    assert_eq!(body["truncated"], true);
    assert_eq!(
        (body["earliest"].as_u64(), body["head"].as_u64()),
        (Some(8), Some(10))
    );
    let offsets: Vec<u64> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [8, 9, 10]);

    // From earliest − 1 on, nothing was lost: not truncated.
    let (_, body) = node.get("/v1/channels/t/messages?after=7").await;
    assert_eq!(body["truncated"], false);
    assert_eq!(body["messages"].as_array().unwrap().len(), 3);

    let (_, list) = node.get("/v1/channels").await;
    assert_eq!(
        list["channels"][0],
        json!({"name": "t", "head": 10, "earliest": 8, "messages": 3,
               "bytes": 3 * json!({"i": 1}).to_string().len() + 1})
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_below_earliest_sends_truncated_then_goes_on_at_earliest() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "t", 1, 10).await;
    trim_keeping(&node, "t", 3).await;

    let url = node.url("/v1/channels/t/events");
    let mut sse = SseClient::connect(&node.client, &url, Some("2")).await;
    assert_eq!(sse.status, 200);
    let event = within("truncated event", NODE_WAIT, sse.next_event())
        .await
        .expect("an event");
    assert_eq!(event.event.as_deref(), Some("truncated"));
    assert_eq!(event.id.as_deref(), Some("7"));
    let data: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(data, json!({"requested_after": 2, "earliest": 8}));
    for offset in 8..=10 {
        assert_eq!(sse.expect_message().await.0, offset);
    }
    // Live messages follow.
    publish_n(&node, "t", 11, 1).await;
    assert_eq!(sse.expect_message().await.0, 11);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_below_earliest_sends_a_truncated_frame_then_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "t", 1, 10).await;
    trim_keeping(&node, "t", 3).await;

    let mut ws = ws_connect(&node.ws_url("/v1/channels/t/ws?after=0")).await;
    let mut closed = None;
    let first = within("truncated frame", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .expect("a frame");
    assert_eq!(
        first,
        json!({"type": "truncated", "requested_after": 0, "earliest": 8})
    );
    for offset in 8..=10u64 {
        let m = within("message", NODE_WAIT, ws_next(&mut ws, &mut closed))
            .await
            .expect("a frame");
        assert_eq!(m["offset"], offset);
    }
    node.stop().await;
}

/// Holds the second read of a channel until the test lets it go, and
/// tells when that read is waiting.
struct HoldSecondRead {
    reads: AtomicUsize,
    waiting: watch::Sender<bool>,
    gate: Semaphore,
}

#[async_trait]
impl StorageHooks for HoldSecondRead {
    async fn before_read(&self, _channel: &ChannelName) -> herald_storage::Result<()> {
        if self.reads.fetch_add(1, Ordering::SeqCst) == 1 {
            self.waiting.send_replace(true);
            let _permit = self.gate.acquire().await.expect("the gate stays open");
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_overtaken_by_trimming_gets_truncated_not_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = Arc::new(HoldSecondRead {
        reads: AtomicUsize::new(0),
        waiting: watch::channel(false).0,
        gate: Semaphore::new(0),
    });
    let node = Node::start_with(
        dir.path(),
        "node-a",
        Role::Holder,
        // Catch-up pages of 1000 messages: a read budget of 1000 of the
        // largest.
        ServerConfig {
            read_budget_bytes: 1000 * ServerConfig::default().max_message_bytes,
            ..ServerConfig::default()
        },
        {
            let hooks = Arc::clone(&hooks);
            move |s: Arc<dyn Storage>| Hooked::wrap(s, hooks)
        },
    )
    .await;
    append_n(&node, "slow", 1500).await;

    // The first page (1..=1000) is read when the stream starts; the second
    // read waits until the trim below has run.
    let url = node.url("/v1/channels/slow/events");
    let mut sse = SseClient::connect(&node.client, &url, None).await;
    let mut waiting = hooks.waiting.subscribe();
    within("the second read", NODE_WAIT, waiting.wait_for(|w| *w))
        .await
        .unwrap();
    trim_keeping(&node, "slow", 100).await;
    hooks.gate.add_permits(1);

    for offset in 1..=1000 {
        assert_eq!(sse.expect_message().await.0, offset);
    }
    let event = within("truncated event", NODE_WAIT, sse.next_event())
        .await
        .expect("an event");
    assert_eq!(event.event.as_deref(), Some("truncated"));
    let data: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(data, json!({"requested_after": 1000, "earliest": 1401}));
    for offset in 1401..=1500 {
        assert_eq!(sse.expect_message().await.0, offset);
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trimming_task_applies_the_namespace_policy_and_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let retention = RetentionHandle::new(RetentionConfig {
        default: RetentionPolicy::default(),
        namespaces: [(
            "chat".to_owned(),
            RetentionPolicy {
                max_messages: Some(2),
                ..RetentionPolicy::default()
            },
        )]
        .into(),
    });
    let config = ServerConfig {
        retention: retention.clone(),
        trim_pacing: TrimPacing {
            interval: Duration::from_millis(20),
            ..TrimPacing::default()
        },
        ..ServerConfig::default()
    };
    let node = Node::start(dir.path(), "node-a", Role::Holder, config).await;
    publish_n(&node, "chat:room", 1, 5).await;
    publish_n(&node, "news", 1, 5).await;

    let earliest = |path: &'static str| {
        let node = &node;
        async move { node.get(path).await.1["earliest"].as_u64().unwrap() }
    };
    within("chat trimmed to 2", NODE_WAIT, async {
        while earliest("/v1/channels/chat:room/messages").await != 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The default policy is unbounded: `news` keeps everything.
    assert_eq!(earliest("/v1/channels/news/messages").await, 1);

    retention.replace(RetentionConfig {
        default: RetentionPolicy {
            max_messages: Some(1),
            ..RetentionPolicy::default()
        },
        ..RetentionConfig::default()
    });
    within("news trimmed to 1 after the reload", NODE_WAIT, async {
        while earliest("/v1/channels/news/messages").await != 5 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let metrics = node.metrics().await;
    assert!(
        metrics.contains("herald_retention_trimmed_messages_total"),
        "{metrics}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_keeps_the_head_and_ends_live_subscriptions() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "gone", 1, 3).await;
    let mut sse =
        SseClient::connect(&node.client, &node.url("/v1/channels/gone/events"), None).await;
    for offset in 1..=3 {
        assert_eq!(sse.expect_message().await.0, offset);
    }
    let mut ws = ws_connect(&node.ws_url("/v1/channels/gone/ws?after=3")).await;

    let response = node
        .client
        .delete(node.url("/v1/channels/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({"channel": "gone", "head": 3, "earliest": 4}));

    let event = within("deleted event", NODE_WAIT, sse.next_event())
        .await
        .expect("an event");
    assert_eq!(event.event.as_deref(), Some("deleted"));
    assert_eq!(
        serde_json::from_str::<Value>(&event.data).unwrap(),
        json!({"head": 3})
    );
    assert!(within("the stream ends", NODE_WAIT, sse.next_event())
        .await
        .is_none());

    let mut closed = None;
    let frame = within("deleted frame", NODE_WAIT, ws_next(&mut ws, &mut closed)).await;
    assert_eq!(frame, Some(json!({"type": "deleted", "head": 3})));
    assert!(within("close", NODE_WAIT, ws_next(&mut ws, &mut closed))
        .await
        .is_none());
    assert_eq!(closed, Some(1000));

    let (_, body) = node.get("/v1/channels/gone/messages").await;
    assert_eq!(
        (body["head"].as_u64(), body["earliest"].as_u64()),
        (Some(3), Some(4))
    );
    assert!(body["messages"].as_array().unwrap().is_empty());
    // Offsets are never reused.
    let (status, answer) = node.publish("gone", json!({"again": true})).await;
    assert_eq!((status, answer["offset"].as_u64()), (201, Some(4)));
    node.stop().await;
}
