//! The server API at `/api/<method>` with Herald's API keys: publish (one
//! channel sequence with Herald's own publish), idempotency, `b64data`,
//! broadcast, history, batch, channels, info, disconnect, unsubscribe,
//! and its errors.

use base64::Engine;
use serde_json::{json, Value};

use super::client::Client;
use super::{holder_and_standby, offsets};
use crate::{Backend, Creds, Node};

async fn api(node: &Node, method: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let (status, _, body) = node
        .call("POST", &format!("/api/{method}"), headers, Some(body))
        .await;
    (status, body)
}

async fn server_api(backend: Backend) {
    let (_place, creds, holder, node) = holder_and_standby(backend).await;
    let publisher = [("x-api-key", creds.publisher.as_str())];
    let apikey = format!("apikey {}", creds.publisher);
    let admin = [("x-api-key", creds.admin.as_str())];
    let reader = [("x-api-key", creds.reader.as_str())];

    // Publishes through the server API (on a standby: forwarded) and
    // through Herald's own route land in one sequence.
    let (status, r) = api(
        &node,
        "publish",
        &publisher,
        json!({"channel": "news:a", "data": {"n": 1}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(r["result"]["offset"], 1, "{r}");
    let epoch = r["result"]["epoch"].as_str().unwrap().to_owned();
    let bearer = Creds::bearer(&creds.publisher);
    let own = holder
        .publish_with(
            "news:a",
            &[("authorization", bearer.as_str())],
            json!({"n": 2}),
        )
        .await;
    assert_eq!(own.2["offset"], 2);
    let (_, r) = api(
        &holder,
        "publish",
        &[("authorization", apikey.as_str())],
        json!({"channel": "news:a", "data": {"n": 3}}),
    )
    .await;
    assert_eq!(r["result"]["offset"], 3, "{r}");
    assert_eq!(r["result"]["epoch"], epoch.as_str());
    let query = format!("/api/publish?api_key={}", creds.publisher);
    let (_, _, r) = node
        .call(
            "POST",
            &query,
            &[],
            Some(json!({"channel": "news:a", "data": {"n": 4}})),
        )
        .await;
    assert_eq!(r["result"]["offset"], 4, "{r}");
    // Idempotency key: the second publish stores nothing.
    let keyed = json!({"channel": "news:a", "data": {"n": 5}, "idempotency_key": "k-5"});
    let (_, first) = api(&node, "publish", &publisher, keyed.clone()).await;
    let (_, again) = api(&holder, "publish", &publisher, keyed).await;
    assert_eq!(first["result"]["offset"], 5, "{first}");
    assert_eq!(again["result"]["offset"], 5, "{again}");
    // b64data: base64 of JSON text.
    let b64 = base64::engine::general_purpose::STANDARD.encode(br#"{"n":6}"#);
    let (_, r) = api(
        &holder,
        "publish",
        &publisher,
        json!({"channel": "news:a", "b64data": b64}),
    )
    .await;
    assert_eq!(r["result"]["offset"], 6, "{r}");
    let not_json = base64::engine::general_purpose::STANDARD.encode([0xff, 0x00]);
    let (status, r) = api(
        &holder,
        "publish",
        &publisher,
        json!({"channel": "news:a", "b64data": not_json}),
    )
    .await;
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (200, json!(107)),
        "{r}"
    );

    // History with a reader key, in Centrifugo's shape.
    let (_, h) = api(
        &node,
        "history",
        &reader,
        json!({"channel": "news:a", "limit": 100}),
    )
    .await;
    assert_eq!(
        offsets(&h["result"]["publications"]),
        vec![1, 2, 3, 4, 5, 6],
        "{h}"
    );
    assert_eq!(h["result"]["publications"][5]["data"], json!({"n": 6}));
    assert_eq!(h["result"]["epoch"], epoch.as_str());
    assert_eq!(h["result"]["offset"], 6);
    let (_, h) = api(&node, "history", &reader, json!({"channel": "news:a"})).await;
    assert_eq!(offsets(&h["result"]["publications"]), Vec::<u64>::new());
    assert_eq!(h["result"]["offset"], 6);

    // Keys and permissions: none or unknown → 401; not allowed → 103.
    assert_eq!(
        api(
            &node,
            "publish",
            &[],
            json!({"channel": "news:a", "data": 1})
        )
        .await
        .0,
        401
    );
    assert_eq!(
        api(
            &node,
            "publish",
            &[("x-api-key", "nope")],
            json!({"channel": "news:a", "data": 1})
        )
        .await
        .0,
        401
    );
    let (_, r) = api(
        &node,
        "publish",
        &reader,
        json!({"channel": "news:a", "data": 1}),
    )
    .await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    let (_, r) = api(&node, "info", &publisher, json!({})).await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    // Not available, unknown, malformed.
    let (_, r) = api(&node, "presence", &admin, json!({"channel": "news:a"})).await;
    assert_eq!(r["error"]["code"], 108, "{r}");
    let (_, r) = api(&node, "teleport", &admin, json!({})).await;
    assert_eq!(r["error"]["code"], 104, "{r}");
    let (_, r) = api(&node, "publish", &publisher, json!({"channel": "news:a"})).await;
    assert_eq!(r["error"]["code"], 107, "{r}");

    // Broadcast: one answer per channel.
    let (_, r) = api(
        &node,
        "broadcast",
        &publisher,
        json!({"channels": ["news:a", "news:b", "keyonly:z"], "data": "all"}),
    )
    .await;
    let responses = r["result"]["responses"].as_array().unwrap();
    assert_eq!(responses[0]["result"]["offset"], 7, "{r}");
    assert_eq!(responses[1]["result"]["offset"], 1, "{r}");
    assert_eq!(responses[2]["error"]["code"], 103, "{r}");

    // Batch: replies named by method, errors in place.
    let (_, r) = api(
        &node,
        "batch",
        &publisher,
        json!({"commands": [
            {"publish": {"channel": "news:b", "data": 2}},
            {"history": {"channel": "news:b", "limit": 10}},
        ]}),
    )
    .await;
    assert_eq!(r["replies"][0]["publish"]["offset"], 2, "{r}");
    assert_eq!(r["replies"][1]["error"]["code"], 103, "{r}");

    // channels, info, unsubscribe, disconnect (this node's connections;
    // `cluster.rs` has the other nodes').
    let token = creds.token_for("dave", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&node, &token).await;
    c.command("subscribe", json!({"channel": "news:a"})).await;
    c.command("subscribe", json!({"channel": "news:b"})).await;
    let (_, r) = api(&node, "channels", &admin, json!({"pattern": "news:*"})).await;
    assert_eq!(r["result"]["channels"]["news:a"]["num_clients"], 1, "{r}");
    assert!(r["result"]["channels"].get("keyonly:z").is_none(), "{r}");
    let (_, r) = api(&node, "info", &admin, json!({})).await;
    let nodes = r["result"]["nodes"].as_array().expect("nodes");
    let this = nodes
        .iter()
        .find(|n| n["uid"] == "node-b")
        .unwrap_or_else(|| panic!("this node is listed: {r}"));
    assert_eq!(this["num_clients"], 1, "{r}");
    let (_, r) = api(
        &node,
        "unsubscribe",
        &admin,
        json!({"user": "dave", "channel": "news:a"}),
    )
    .await;
    assert_eq!(r["result"], json!({}), "{r}");
    let push = c.push().await;
    assert_eq!(push["channel"], "news:a");
    assert_eq!(push["unsubscribe"]["code"], 2000, "{push}");
    let (_, r) = api(&node, "disconnect", &admin, json!({"user": "dave"})).await;
    assert_eq!(r["result"], json!({}), "{r}");
    assert_eq!(c.closed_with().await, Some(3503));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_api_on_sqlite() {
    server_api(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_api_on_postgres() {
    server_api(Backend::Postgres).await;
}
