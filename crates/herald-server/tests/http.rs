//! End-to-end tests of the publish and read API on a real listener with
//! SQLite storage and the lease supervisor.

use std::collections::BTreeMap;

use herald_server::ServerConfig;
use herald_testkit::node::{publish_n, Node, Role};
use herald_testkit::storage::AppendGate;
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_gives_201_and_consecutive_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    for i in 1..=5u64 {
        let (status, body) = node.publish("orders", json!({ "n": i })).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["channel"], "orders");
        assert_eq!(body["offset"], i);
        let at = body["published_at"].as_str().unwrap();
        assert!(
            at.ends_with('Z') && at.len() == "2026-01-01T00:00:00.000Z".len(),
            "{at}"
        );
    }
    let (status, body) = node.get("/v1/channels").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({ "channels": [{
            "name": "orders", "head": 5, "earliest": 1, "messages": 5, "bytes": 35
        }] })
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_get_exactly_offsets_1_to_200() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    let mut tasks = Vec::new();
    for p in 0..8u64 {
        let client = node.client.clone();
        let url = node.url("/v1/channels/load/messages");
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for n in 0..25u64 {
                let data = json!({ "p": p, "n": n });
                let response = client
                    .post(&url)
                    .json(&json!({ "data": data }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status().as_u16(), 201);
                let body: Value = response.json().await.unwrap();
                got.push((body["offset"].as_u64().unwrap(), data));
            }
            got
        }));
    }
    let mut by_offset = BTreeMap::new();
    for task in tasks {
        for (offset, data) in within("publishers", NODE_WAIT, task).await.unwrap() {
            assert!(
                by_offset.insert(offset, data).is_none(),
                "offset {offset} given twice"
            );
        }
    }
    assert_eq!(
        by_offset.keys().copied().collect::<Vec<_>>(),
        (1..=200).collect::<Vec<_>>()
    );
    // Each publisher's messages kept its own order.
    for p in 0..8u64 {
        let ns: Vec<_> = by_offset
            .values()
            .filter(|d| d["p"] == p)
            .map(|d| d["n"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, (0..25).collect::<Vec<_>>());
    }
    let (status, body) = node.get("/v1/channels/load/messages?limit=1000").await;
    assert_eq!(status, 200);
    assert_eq!(body["head"], 200);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 200);
    for (i, m) in messages.iter().enumerate() {
        let offset = i as u64 + 1;
        assert_eq!(m["offset"], offset);
        assert_eq!(m["data"], by_offset[&offset]);
        assert!(m["published_at"].is_string());
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_twice_stores_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "pay", 1, 2).await;
    let send = |data: Value| {
        node.client
            .post(node.url("/v1/channels/pay/messages"))
            .header("idempotency-key", "payment-42")
            .json(&json!({ "data": data }))
            .send()
    };
    let first = send(json!("first")).await.unwrap();
    assert_eq!(first.status().as_u16(), 201);
    let first: Value = first.json().await.unwrap();
    // A retry (the same message) answers the original.
    let second = send(json!("first")).await.unwrap();
    assert_eq!(second.status().as_u16(), 200);
    let second: Value = second.json().await.unwrap();
    assert_eq!(first, second);
    assert_eq!(first["offset"], 3);
    assert_eq!(node.head("pay").await, 3);
    // The key for another message: 422 (IETF Idempotency-Key draft), and
    // the new body is not stored.
    let reused = send(json!("second")).await.unwrap();
    assert_eq!(reused.status().as_u16(), 422);
    let reused: Value = reused.json().await.unwrap();
    assert_eq!(reused["error"]["code"], "idempotency_key_reused");
    assert_eq!(node.head("pay").await, 3);
    let stored = node.stored("pay").await;
    assert_eq!(stored[2].data.to_json_text(), "\"first\"");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_answer_the_error_shape_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "c", 1, 1).await;
    let post = |path: &str, body: Vec<u8>| {
        node.client
            .post(node.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let big = format!(r#"{{"data":"{}"}}"#, "x".repeat(2 << 20)).into_bytes();
    let cases: Vec<(reqwest::Response, u16, &str)> = vec![
        (
            post(
                "/v1/channels/bad%20name/messages",
                br#"{"data":1}"#.to_vec(),
            )
            .await
            .unwrap(),
            400,
            "invalid_channel",
        ),
        (
            post("/v1/channels/c/messages", b"{\"data\":".to_vec())
                .await
                .unwrap(),
            400,
            "invalid_json",
        ),
        (
            post("/v1/channels/c/messages", br#"{"date":1}"#.to_vec())
                .await
                .unwrap(),
            400,
            "invalid_body",
        ),
        (
            post("/v1/channels/c/messages", br#"{}"#.to_vec())
                .await
                .unwrap(),
            400,
            "invalid_body",
        ),
        (
            post("/v1/channels/c/messages", big).await.unwrap(),
            413,
            "payload_too_large",
        ),
        (
            node.client
                .get(node.url("/v1/no/such/route"))
                .send()
                .await
                .unwrap(),
            404,
            "not_found",
        ),
        (
            node.client
                .put(node.url("/v1/channels/c/messages"))
                .send()
                .await
                .unwrap(),
            405,
            "method_not_allowed",
        ),
        (
            node.client
                .post(node.url("/v1/status"))
                .send()
                .await
                .unwrap(),
            405,
            "method_not_allowed",
        ),
    ];
    for (response, status, code) in cases {
        let url = response.url().clone();
        assert_eq!(response.status().as_u16(), status, "{url}");
        let allow = response.headers().get("allow").cloned();
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "application/json",
            "{url}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{url}: {body}");
        assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        if status == 405 {
            assert!(allow.is_some(), "{url}: 405 without Allow");
        }
    }
    assert_eq!(node.head("c").await, 1);
    let (_, body) = node.get("/v1/channels").await;
    assert_eq!(body["channels"].as_array().unwrap().len(), 1, "{body}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_limit_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "h", 1, 5).await;
    let (status, body) = node.get("/v1/channels/h/messages?after=1&limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(body["head"], 5);
    let offsets: Vec<_> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![2, 3]);
    let (status, body) = node.get("/v1/channels/h/messages?limit=1000").await;
    assert_eq!(status, 200);
    assert_eq!(body["messages"].as_array().unwrap().len(), 5);
    let (_, body) = node.get("/v1/channels/h/messages").await;
    assert_eq!(
        body["messages"].as_array().unwrap().len(),
        5,
        "default limit 100"
    );
    for bad in ["limit=0", "limit=1001", "limit=x", "after=-1", "after=abc"] {
        let (status, body) = node.get(&format!("/v1/channels/h/messages?{bad}")).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(body["error"]["code"], "invalid_query", "{bad}");
    }
    let (status, body) = node.get("/v1/channels/never-written/messages").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "channel": "never-written", "head": 0, "earliest": 1, "truncated": false,
            "messages": []
        })
    );
    node.stop().await;
}

/// Every query and path parameter of the API is refused in Herald's own
/// words: the parameter's name and the values it takes, never the
/// deserializer's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_are_refused_naming_the_parameter_and_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "p", 1, 2).await;
    let any_offset = format!("after must be an integer from 0 to {}", u64::MAX);
    let cases: Vec<(String, &str, String)> = [
        "/v1/channels/p/messages",
        "/v1/channels/p/events",
        "/v1/channels/p/ws",
    ]
    .into_iter()
    .flat_map(|route| {
        [
            (
                format!("{route}?after=-1"),
                "invalid_query",
                format!("{any_offset}, got \"-1\""),
            ),
            (
                format!("{route}?after=abc"),
                "invalid_query",
                format!("{any_offset}, got \"abc\""),
            ),
            (
                format!("{route}?after="),
                "invalid_query",
                format!("{any_offset}, got \"\""),
            ),
            (
                format!("{route}?after=18446744073709551616"),
                "invalid_query",
                any_offset.clone(),
            ),
            (
                format!("{route}?after=1&after=2"),
                "invalid_query",
                "after is given more than once; give it once".to_owned(),
            ),
        ]
    })
    .chain([
        (
            "/v1/channels/p/messages?limit=0".to_owned(),
            "invalid_query",
            "limit must be an integer from 1 to 1000, got \"0\"".to_owned(),
        ),
        (
            "/v1/channels/p/messages?limit=1001".to_owned(),
            "invalid_query",
            "limit must be an integer from 1 to 1000, got \"1001\"".to_owned(),
        ),
        (
            "/v1/channels/p/messages?limit=ten".to_owned(),
            "invalid_query",
            "limit must be an integer from 1 to 1000, got \"ten\"".to_owned(),
        ),
        (
            "/readyz?role=leader".to_owned(),
            "invalid_query",
            "role must be \"holder\" or left out, got \"leader\"".to_owned(),
        ),
        (
            "/v1/channels/p/messages?after=%FF".to_owned(),
            "invalid_query",
            any_offset.clone(),
        ),
        (
            "/v1/channels/%FF/messages".to_owned(),
            "invalid_channel",
            "a channel name is 1 to 128 bytes of ASCII letters, digits".to_owned(),
        ),
        (
            "/v1/channels/%FF/events".to_owned(),
            "invalid_channel",
            "a channel name is 1 to 128 bytes of ASCII letters, digits".to_owned(),
        ),
    ])
    .collect();
    for (path, code, words) in cases {
        let (status, body) = node.get(&path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&words),
            "{path}: {message:?} lacks {words:?}"
        );
        for framework_words in ["deserialize", "invalid digit", "Failed to"] {
            assert!(!message.contains(framework_words), "{path}: {message:?}");
        }
    }
    // Parameters a route does not know are ignored, as before.
    let (status, body) = node.get("/v1/channels/p/messages?after=1&x=y").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"].as_array().unwrap().len(), 1);
    // Nothing was written by any of it.
    assert_eq!(node.head("p").await, 2);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_health_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    publish_n(&node, "m", 1, 3).await;
    let (status, body) = node.get("/v1/status").await;
    assert_eq!(status, 200);
    assert_eq!(body["node_id"], "node-a");
    assert_eq!(body["role"], "holder");
    assert_eq!(body["draining"], false);
    assert_eq!(body["backend"], "sqlite");
    assert_eq!(body["lease"]["holder"], "node-a");
    assert_eq!(body["lease"]["holder_url"], node.base.as_str());
    assert!(body["lease"]["token"].as_u64().unwrap() >= 1);
    assert!(body["lease"]["expires_in_ms"].as_i64().unwrap() > 0);
    assert_eq!(node.get("/healthz").await, (200, json!({ "status": "ok" })));
    assert_eq!(node.get("/readyz").await.0, 200);
    let text = node.metrics().await;
    for name in [
        "herald_publishes_total{result=\"created\"}",
        "herald_publish_duration_seconds_bucket",
        "herald_writer_batch_messages_sum",
        "herald_writer_batch_messages_count",
        "herald_writer_queue_depth",
        "herald_lease_role 1",
        "herald_lease_token",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_queue_full_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let gate = AppendGate::new();
    let config = ServerConfig {
        queue_capacity: 1,
        ..ServerConfig::default()
    };
    let node = Node::start_with(dir.path(), "node-a", Role::Holder, config, |s| gate.wrap(s)).await;
    let send = |k: u64| {
        let request = node
            .client
            .post(node.url("/v1/channels/q/messages"))
            .json(&json!({ "data": k }));
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let body: Value = response.json().await.unwrap();
            (status, retry_after, body)
        })
    };
    // The writer holds the first publish in its commit; the queue then has
    // room for exactly one more, so three of the next four are refused.
    let first = send(0);
    gate.wait_started(1).await;
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    for k in 1..=4 {
        let task = send(k);
        let done_tx = done_tx.clone();
        tokio::spawn(async move {
            let _ = done_tx.send(task.await.unwrap());
        });
    }
    for _ in 0..3 {
        let (status, retry_after, body) = within("refusal", NODE_WAIT, done.recv()).await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "queue_full");
        assert_eq!(retry_after.unwrap(), "1");
    }
    gate.open();
    let (status, _, body) = within("queued publish", NODE_WAIT, done.recv())
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        within("first publish", NODE_WAIT, first).await.unwrap().0,
        201
    );
    assert_eq!(node.head("q").await, 2);
    node.stop().await;
}
