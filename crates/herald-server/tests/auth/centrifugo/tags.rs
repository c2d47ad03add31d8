//! Publication tags: the server API's `publish` and `broadcast` take
//! `tags` (a map of strings), which are stored with the message and come
//! back on the publication (`pub.tags`) in pushes, history and recovery,
//! also after every node restarted; a publish forwarded from a standby
//! keeps them. Herald's own publish takes `tags` too and its history shows
//! them. An idempotency key repeated with other tags is a reuse of the key.

use serde_json::{json, Value};

use super::client::Client;
use super::{api, holder_and_standby, offsets};
use crate::{Backend, Creds, Node, Role};

async fn tags(backend: Backend) {
    let (place, creds, holder, standby) = holder_and_standby(backend).await;
    let key = creds.backend.as_str();
    let token = creds.token_for("tess", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&standby, &token).await;
    let sub = c.command("subscribe", json!({"channel": "news:t"})).await;
    let epoch = sub["subscribe"]["epoch"].as_str().unwrap().to_owned();

    // publish on the standby (forwarded to the holder), broadcast, and a
    // publish without tags.
    let first = json!({"kind": "order", "region": "eu west", "ü": "✓ \"q\""});
    let r = api(
        &standby,
        "publish",
        key,
        json!({"channel": "news:t", "data": {"n": 1}, "tags": first}),
    )
    .await;
    assert_eq!(r["result"]["offset"], 1, "{r}");
    let r = api(
        &holder,
        "broadcast",
        key,
        json!({"channels": ["news:t", "news:u"], "data": {"n": 2}, "tags": {"kind": "all"}}),
    )
    .await;
    assert_eq!(r["result"]["responses"][0]["result"]["offset"], 2, "{r}");
    let r = api(
        &holder,
        "publish",
        key,
        json!({"channel": "news:t", "data": {"n": 3}, "tags": null}),
    )
    .await;
    assert_eq!(r["result"]["offset"], 3, "{r}");
    let pushed: Vec<Value> = [c.push().await, c.push().await, c.push().await]
        .into_iter()
        .map(|p| p["pub"].clone())
        .collect();
    assert_eq!(pushed[0]["tags"], first, "{pushed:?}");
    assert_eq!(pushed[1]["tags"], json!({"kind": "all"}));
    assert!(pushed[2].get("tags").is_none(), "{pushed:?}");

    // History (client protocol and server API) and Herald's own history.
    let h = c
        .command("history", json!({"channel": "news:t", "limit": 10}))
        .await;
    let tags_of = |pubs: &Value| -> Vec<Value> {
        pubs.as_array()
            .unwrap()
            .iter()
            .map(|p| p.get("tags").cloned().unwrap_or(Value::Null))
            .collect()
    };
    let expected = vec![first.clone(), json!({"kind": "all"}), Value::Null];
    assert_eq!(tags_of(&h["history"]["publications"]), expected);
    let h = api(
        &holder,
        "history",
        key,
        json!({"channel": "news:t", "limit": 10}),
    )
    .await;
    assert_eq!(tags_of(&h["result"]["publications"]), expected);
    let bearer = Creds::bearer(&creds.backend);
    let auth = [("authorization", bearer.as_str())];
    let (status, _, own) = holder
        .call("GET", "/v1/channels/news:t/messages", &auth, None)
        .await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(tags_of(&own["messages"]), expected);

    // Herald's own publish takes tags; the same key with other tags is a
    // reuse of the key.
    let tagged = json!({"data": {"n": 4}, "tags": {"via": "herald"}});
    let publish = |body: Value, idempotency_key: &'static str| {
        let node = &holder;
        async move {
            let headers = [auth[0], ("idempotency-key", idempotency_key)];
            node.call("POST", "/v1/channels/news:t/messages", &headers, Some(body))
                .await
        }
    };
    let (status, _, r) = publish(tagged.clone(), "k4").await;
    assert_eq!((status, r["offset"].clone()), (201, json!(4)), "{r}");
    let (status, _, r) = publish(tagged, "k4").await;
    assert_eq!((status, r["offset"].clone()), (200, json!(4)), "{r}");
    let (status, _, r) = publish(json!({"data": {"n": 4}, "tags": {"via": "other"}}), "k4").await;
    assert_eq!(status, 422, "{r}");
    let (status, _, r) = publish(json!({"data": {"n": 4}}), "k4").await;
    assert_eq!(status, 422, "{r}");
    assert_eq!(c.push().await["pub"]["tags"], json!({"via": "herald"}));

    // Tags that are not a map of strings: parameters that do not decode,
    // HTTP 400 with 107, as Centrifugo answers a field of another type.
    let (status, _, r) = holder
        .call(
            "POST",
            "/api/publish",
            &[("x-api-key", key)],
            Some(json!({"channel": "news:t", "data": 1, "tags": {"n": 1}})),
        )
        .await;
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (400, json!(107)),
        "{r}"
    );
    let (status, _, r) = publish(json!({"data": 1, "tags": ["x"]}), "k5").await;
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (400, json!("invalid_body")),
        "{r}"
    );
    // Tags count toward max_message_bytes (64 KiB here).
    let r = api(
        &holder,
        "publish",
        key,
        json!({"channel": "news:t", "data": 1, "tags": {"big": "x".repeat(64 * 1024)}}),
    )
    .await;
    assert_eq!(r["error"]["code"], 106, "{r}");
    drop(c);

    // Every node restarts: the tags come back from the storage, in
    // history and in a recovery.
    standby.stop().await;
    holder.stop().await;
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let h = api(
        &node,
        "history",
        key,
        json!({"channel": "news:t", "limit": 10}),
    )
    .await;
    assert_eq!(
        tags_of(&h["result"]["publications"]),
        [expected.clone(), vec![json!({"via": "herald"})]].concat()
    );
    let (mut c, _) = Client::connect(&node, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:t", "recover": true, "epoch": epoch, "offset": 0}),
        )
        .await;
    let r = &r["subscribe"];
    assert_eq!(r["recovered"], true, "{r}");
    assert_eq!(offsets(&r["publications"]), vec![1, 2, 3, 4]);
    assert_eq!(r["publications"][0]["tags"], first);
    let h = api(
        &node,
        "history",
        key,
        json!({"channel": "news:u", "limit": 10}),
    )
    .await;
    assert_eq!(
        h["result"]["publications"][0]["tags"],
        json!({"kind": "all"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_stored_and_delivered_on_sqlite() {
    tags(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_stored_and_delivered_on_postgres() {
    tags(Backend::Postgres).await;
}
