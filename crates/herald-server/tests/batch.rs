//! Batch publish, `POST /v1/messages`: all entries in one transaction or
//! none, answered in order; duplicates inside a batch and across batches;
//! forwarded from a standby like a single publish.

use herald_server::ServerConfig;
use herald_testkit::node::{Node, Role};
use serde_json::{json, Value};

async fn post_batch(node: &Node, body: &Value) -> (u16, Value) {
    let response = node
        .client
        .post(node.url("/v1/messages"))
        .json(body)
        .send()
        .await
        .expect("batch request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

fn entry(channel: &str, data: Value, key: Option<&str>) -> Value {
    match key {
        Some(key) => json!({ "channel": channel, "data": data, "idempotency_key": key }),
        None => json!({ "channel": channel, "data": data }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_committed_in_order_and_answered_per_entry() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let body = json!({ "messages": [
        entry("a", json!(1), None),
        entry("b", json!({"x": 2}), Some("k-b")),
        entry("a", json!(3), Some("k-a")),
        // The same key on the same channel later in the batch, with the
        // same data (a retry): a duplicate of the entry above, nothing
        // stored.
        entry("a", json!(3), Some("k-a")),
        entry("a", json!(5), None),
    ]});
    let (status, answer) = post_batch(&holder, &body).await;
    assert_eq!(status, 201, "{answer}");
    let results = answer["results"].as_array().unwrap();
    let got: Vec<(String, u64, bool)> = results
        .iter()
        .map(|r| {
            (
                r["channel"].as_str().unwrap().to_owned(),
                r["offset"].as_u64().unwrap(),
                r["duplicate"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a".into(), 1, false),
            ("b".into(), 1, false),
            ("a".into(), 2, false),
            ("a".into(), 2, true),
            ("a".into(), 3, false),
        ]
    );
    // One transaction: one commit time for the whole batch.
    let times: Vec<&Value> = results.iter().map(|r| &r["published_at"]).collect();
    assert!(times.iter().all(|t| *t == times[0]), "{answer}");
    let stored: Vec<String> = holder
        .stored("a")
        .await
        .iter()
        .map(|m| m.data.to_json_text().into_owned())
        .collect();
    assert_eq!(stored, ["1", "3", "5"]);

    // Across batches: keys already used answer the original message; a
    // batch of duplicates only is 200.
    let again = json!({ "messages": [
        entry("b", json!({"x": 2}), Some("k-b")),
        entry("a", json!(3), Some("k-a")),
    ]});
    let (status, answer) = post_batch(&holder, &again).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["offset"], 1);
    assert_eq!(answer["results"][1]["offset"], 2);
    assert!(answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["duplicate"] == true));
    assert_eq!(holder.head("a").await, 3);
    assert_eq!(holder.head("b").await, 1);
    holder.stop().await;
}

/// One invalid entry refuses the whole batch, names the entry, and stores
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_invalid_entry_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let body = json!({ "messages": [
        entry("a", json!(1), None),
        entry("b", json!(2), None),
        entry("not a channel", json!(3), None),
    ]});
    let (status, answer) = post_batch(&holder, &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_channel");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("messages[2]: "), "{message}");
    assert_eq!(holder.head("a").await, 0);
    assert_eq!(holder.head("b").await, 0);

    let (status, answer) = post_batch(&holder, &json!({ "messages": [] })).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_body");
    holder.stop().await;
}

/// An entry that reuses a key for another message refuses the whole batch
/// with `422 idempotency_key_reused` naming the entry, on the holder and
/// through a standby alike; nothing of the batch is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_for_another_message_refuses_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;
    let first = json!({ "messages": [entry("a", json!(1), Some("k"))] });
    let (status, answer) = post_batch(&holder, &first).await;
    assert_eq!(status, 201, "{answer}");
    let cases = [
        // Reuses a stored key.
        json!({ "messages": [entry("b", json!(1), None), entry("a", json!(2), Some("k"))] }),
        // Reuses a key of an earlier entry of the same batch.
        json!({ "messages": [
            entry("b", json!(1), None),
            entry("c", json!(1), Some("j")),
            entry("c", json!(2), Some("j")),
        ]}),
    ];
    for node in [&holder, &standby] {
        for (body, index) in cases.iter().zip([1, 2]) {
            let (status, answer) = post_batch(node, body).await;
            assert_eq!(status, 422, "{} answered {answer}", node.node_id);
            assert_eq!(answer["error"]["code"], "idempotency_key_reused");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("messages[{index}]: ")),
                "{message}"
            );
        }
    }
    for (channel, head) in [("a", 1), ("b", 0), ("c", 0)] {
        assert_eq!(holder.head(channel).await, head, "{channel}");
    }
    standby.stop().await;
    holder.stop().await;
}

/// A batch sent to a standby is forwarded once to the holder, and the
/// holder's answer comes back unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_to_a_standby_is_forwarded_to_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Node::holder(dir.path()).await;
    let standby = Node::start(dir.path(), "node-b", Role::Standby, ServerConfig::default()).await;
    let body = json!({ "messages": [
        entry("f", json!(1), Some("k-1")),
        entry("g", json!(2), None),
    ]});
    let (status, answer) = post_batch(&standby, &body).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["results"][0]["offset"], 1);
    assert_eq!(answer["results"][1]["offset"], 1);
    let (status, answer) = post_batch(&standby, &body).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["results"][0]["duplicate"], true);
    assert_eq!(answer["results"][1]["offset"], 2);
    assert_eq!(holder.head("f").await, 1);
    assert_eq!(holder.head("g").await, 2);
    standby.stop().await;
    holder.stop().await;
}
