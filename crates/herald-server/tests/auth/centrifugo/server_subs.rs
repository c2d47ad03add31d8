//! Server-side subscriptions: the connection token's `subs` claim
//! subscribes the connection at connect; the connect reply's `subs` holds
//! each subscription's result (epoch, offset, `data`); the pushes are
//! ordinary publication pushes with `channel`; a reconnecting client's
//! `subs` recovers each one (`recovered: true` with every missed
//! publication, or `recovered: false`); the namespace rules still apply;
//! a refresh whose token changes `subs` closes with 3010; a storage
//! failure while they start closes with 3004.

use std::sync::Arc;

use herald_storage::Storage;
use herald_testkit::storage::{Hooked, ReadOutage};
use serde_json::{json, Value};

use super::client::Client;
use super::{holder_and_standby, offsets};
use crate::{Backend, Creds, Node, Place, Role};

/// Connects with `token` and `subs` (the recovery asked for); the whole
/// reply.
async fn connect_with(node: &Node, token: &str, subs: Value) -> (Client, Value) {
    let mut c = Client::open(node).await;
    let reply = c
        .command("connect", json!({ "token": token, "subs": subs }))
        .await;
    (c, reply)
}

async fn server_side_subscriptions(backend: Backend) {
    let (_place, creds, holder, standby) = holder_and_standby(backend).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    for i in 1..=2 {
        assert_eq!(
            holder.publish_with("news:s", &key, json!({"n": i})).await.0,
            201
        );
    }
    // No `channels` claim: `subs` alone grants its channels.
    let subs = json!({"news:s": {"data": {"welcome": true}}, "open:s": {}});
    let token = creds.token_for("erin", json!({ "subs": subs }));

    let (mut c, connected) = Client::connect(&holder, &token).await;
    let news = &connected["subs"]["news:s"];
    assert_eq!(news["recoverable"], true, "{connected}");
    assert_eq!(news["positioned"], true, "{connected}");
    let epoch = news["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16);
    assert_eq!(news["offset"], 2);
    assert_eq!(news["data"], json!({"welcome": true}));
    assert!(news.get("recovered").is_none(), "{connected}");
    assert!(news.get("was_recovering").is_none(), "{connected}");
    let open = &connected["subs"]["open:s"];
    assert_eq!(open["offset"].as_u64().unwrap_or(0), 0, "{connected}");
    assert!(open.get("data").is_none(), "{connected}");
    assert_eq!(connected["subs"].as_object().unwrap().len(), 2);

    // Publications arrive as ordinary pushes with their channel.
    assert_eq!(
        holder.publish_with("news:s", &key, json!({"n": 3})).await.0,
        201
    );
    let push = c.push().await;
    assert_eq!(push["channel"], "news:s");
    assert_eq!(push["pub"]["offset"], 3);
    assert_eq!(push["pub"]["data"], json!({"n": 3}));
    // A client-side subscribe to the same channel: already subscribed.
    let again = c.command("subscribe", json!({"channel": "news:s"})).await;
    assert_eq!(again["error"]["code"], 105, "{again}");
    // The token's own channels may be read, others not.
    let h = c
        .command("history", json!({"channel": "news:s", "limit": 10}))
        .await;
    assert_eq!(offsets(&h["history"]["publications"]), vec![1, 2, 3]);
    let denied = c.command("subscribe", json!({"channel": "news:t"})).await;
    assert_eq!(denied["error"]["code"], 103, "{denied}");
    drop(c);

    // Away while 4 and 5 are published: a reconnect (on the standby) that
    // asks to recover from 3 gets them, then 6 live.
    for i in 4..=5 {
        assert_eq!(
            holder.publish_with("news:s", &key, json!({"n": i})).await.0,
            201
        );
    }
    let (mut c, reply) = connect_with(
        &standby,
        &token,
        json!({"news:s": {"recover": true, "epoch": epoch, "offset": 3}}),
    )
    .await;
    let news = &reply["connect"]["subs"]["news:s"];
    assert_eq!(news["recovered"], true, "{reply}");
    assert_eq!(news["was_recovering"], true, "{reply}");
    assert_eq!(news["epoch"], epoch.as_str());
    assert_eq!(offsets(&news["publications"]), vec![4, 5], "{reply}");
    assert_eq!(news["publications"][1]["data"], json!({"n": 5}));
    assert_eq!(news["offset"], 5);
    // `open:s` asked for nothing: positioned at its head.
    assert!(
        reply["connect"]["subs"]["open:s"]
            .get("was_recovering")
            .is_none(),
        "{reply}"
    );
    assert_eq!(
        holder.publish_with("news:s", &key, json!({"n": 6})).await.0,
        201
    );
    let push = c.push().await;
    assert_eq!(
        (push["channel"].clone(), push["pub"]["offset"].clone()),
        (json!("news:s"), json!(6))
    );

    // Another epoch: not recovered, no publications, at the head.
    let (_, reply) = connect_with(
        &holder,
        &token,
        json!({"news:s": {"recover": true, "epoch": "0000000000000000", "offset": 3}}),
    )
    .await;
    let news = &reply["connect"]["subs"]["news:s"];
    assert!(news.get("recovered").is_none(), "{reply}");
    assert_eq!(news["was_recovering"], true, "{reply}");
    assert!(news.get("publications").is_none(), "{reply}");
    assert_eq!(news["offset"], 6);

    // The namespace rules still apply: `keyonly` takes API keys only, so
    // a token's `subs` cannot subscribe there (103, not connected).
    let keyonly = creds.token_for("erin", json!({"subs": {"news:s": {}, "keyonly:s": {}}}));
    let (mut c, reply) = connect_with(&holder, &keyonly, json!({})).await;
    assert_eq!(reply["error"]["code"], 103, "{reply}");
    c.send_text(r#"{"id":9,"ping":{}}"#).await;
    assert_eq!(c.closed_with().await, Some(3501), "not connected");
    // A `subs` key that is not a channel name: an invalid token.
    let bad = creds.token_for("erin", json!({"subs": {"no spaces": {}}}));
    let mut c = Client::open(&holder).await;
    c.send_text(&json!({"id": 1, "connect": {"token": bad}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3500));

    // Refresh with the same `subs`: refreshed; with other `subs`: closed
    // with 3010, so that the client reconnects with the new ones.
    let (mut c, _) = Client::connect(&holder, &token).await;
    let same = creds.token_for("erin", json!({ "subs": subs }));
    let r = c.command("refresh", json!({ "token": same })).await;
    assert_eq!(r["refresh"]["expires"], true, "{r}");
    let more = creds.token_for(
        "erin",
        json!({"subs": {"news:s": {}, "open:s": {}, "open:more": {}}}),
    );
    let id = c.id();
    c.send_text(&json!({"id": id, "refresh": {"token": more}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3010));
    let (mut c, _) = Client::connect(&holder, &token).await;
    let fewer = creds.token_for("erin", json!({"subs": {"news:s": {}}}));
    let id = c.id();
    c.send_text(&json!({"id": id, "refresh": {"token": fewer}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3010));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_subscriptions_on_sqlite() {
    server_side_subscriptions(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_subscriptions_on_postgres() {
    server_side_subscriptions(Backend::Postgres).await;
}

/// The storage fails while the server-side subscriptions of a `connect`
/// start: the connection is closed with 3004 (the SDK reconnects), and a
/// connect once the storage is back subscribes.
async fn a_storage_failure_at_connect_closes(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let outage = ReadOutage::new();
    let node = Node::start_with(&place, "node-a", Role::Holder, creds.config(), {
        let outage = Arc::clone(&outage);
        move |s: Arc<dyn Storage>| Hooked::wrap(s, outage)
    })
    .await;
    let token = creds.token_for("erin", json!({"subs": {"news:f": {}}}));
    outage.start();
    let mut c = Client::open(&node).await;
    c.send_text(&json!({"id": 1, "connect": {"token": token}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3004));
    outage.end();
    let (_, connected) = Client::connect(&node, &token).await;
    assert_eq!(
        connected["subs"]["news:f"]["recoverable"], true,
        "{connected}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_at_connect_closes_with_3004_on_sqlite() {
    a_storage_failure_at_connect_closes(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_at_connect_closes_with_3004_on_postgres() {
    a_storage_failure_at_connect_closes(Backend::Postgres).await;
}
