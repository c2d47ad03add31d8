//! Recovery on subscribe never lies: every missed publication with
//! `recovered: true` in the channel's epoch, then the live ones without a
//! gap; `recovered: false` for another epoch or an offset beyond the head.
//! The epoch is the same on a standby, which serves the subscription
//! itself and forwards a client's publish to the holder.

use serde_json::json;

use super::client::Client;
use super::{holder_and_standby, offsets};
use crate::{Backend, Creds, Node, Place, Role};

async fn recovery(backend: Backend) {
    let (_place, creds, holder, standby) = holder_and_standby(backend).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for(
        "carol",
        json!({"channels": ["news:*", "room:*"], "publish": ["room:*"]}),
    );
    for i in 1..=5 {
        assert_eq!(holder.publish_with("news:r", &key, json!(i)).await.0, 201);
    }
    let (mut first, _) = Client::connect(&holder, &token).await;
    let sub = first
        .command("subscribe", json!({"channel": "news:r"}))
        .await;
    let epoch = sub["subscribe"]["epoch"].as_str().unwrap().to_owned();
    assert_eq!(sub["subscribe"]["offset"], 5);

    // Recovering from offset 2 on the standby: 3, 4, 5, then live 6.
    let (mut c, _) = Client::connect(&standby, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:r", "recover": true, "epoch": epoch, "offset": 2}),
        )
        .await;
    let r = &r["subscribe"];
    assert_eq!(r["recovered"], true, "{r}");
    assert_eq!(r["was_recovering"], true);
    assert_eq!(r["epoch"], epoch.as_str());
    assert_eq!(offsets(&r["publications"]), vec![3, 4, 5]);
    assert_eq!(r["publications"][0]["data"], 3);
    assert_eq!(r["offset"], 5);
    assert_eq!(holder.publish_with("news:r", &key, json!(6)).await.0, 201);
    assert_eq!(c.push().await["pub"]["offset"], 6);
    assert_eq!(first.push().await["pub"]["offset"], 6);

    // Nothing missed: recovered, no publications.
    let (mut c, _) = Client::connect(&holder, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:r", "recover": true, "epoch": epoch, "offset": 6}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(offsets(&r["subscribe"]["publications"]), Vec::<u64>::new());

    // Another epoch: not recovered, no publications, position at the head.
    let (mut c, _) = Client::connect(&standby, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:r", "recover": true, "epoch": "0000000000000000", "offset": 2}),
        )
        .await;
    let r = &r["subscribe"];
    assert_ne!(r["recovered"], true, "{r}");
    assert_eq!(r["was_recovering"], true);
    assert!(r.get("publications").is_none(), "{r}");
    assert_eq!(r["offset"], 6);
    // An offset this history never had: not recovered.
    let (mut c, _) = Client::connect(&holder, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:r", "recover": true, "epoch": epoch, "offset": 60}),
        )
        .await;
    assert_ne!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(r["subscribe"]["offset"], 6);

    // A client publish on the standby reaches the holder's sequence.
    let (mut c, _) = Client::connect(&standby, &token).await;
    c.command("subscribe", json!({"channel": "room:s"})).await;
    let r = c
        .command(
            "publish",
            json!({"channel": "room:s", "data": "via standby"}),
        )
        .await;
    assert_eq!(r["publish"], json!({}), "{r}");
    let push = c.push().await;
    assert_eq!(push["pub"]["offset"], 1);
    assert_eq!(push["pub"]["data"], "via standby");
    assert_eq!(
        holder.publish_with("room:s", &key, json!(2)).await.2["offset"],
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_never_lies_on_sqlite() {
    recovery(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_never_lies_on_postgres() {
    recovery(Backend::Postgres).await;
}

/// A live subscriber whose channel is deleted (its messages removed, as
/// retention removes them) is disconnected with 3010 "insufficient
/// state", and its recovery then says `recovered: false` for the offsets
/// that are gone; never a silent skip.
async fn deletion(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let admin = Creds::bearer(&creds.admin);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for("carol", json!({"channels": ["news:*"]}));
    for i in 1..=3 {
        assert_eq!(holder.publish_with("news:d", &key, json!(i)).await.0, 201);
    }
    let (mut c, _) = Client::connect(&holder, &token).await;
    let sub = c.command("subscribe", json!({"channel": "news:d"})).await;
    let epoch = sub["subscribe"]["epoch"].as_str().unwrap().to_owned();
    assert_eq!(sub["subscribe"]["offset"], 3);

    let (status, _, deleted) = holder
        .call(
            "DELETE",
            "/v1/channels/news:d",
            &[("authorization", admin.as_str())],
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(c.closed_with().await, Some(3010));

    // Offsets 2 and 3 are gone: not recovered.
    let (mut c, _) = Client::connect(&holder, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:d", "recover": true, "epoch": epoch, "offset": 1}),
        )
        .await;
    assert_ne!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(r["subscribe"]["offset"], 3);
    // A client that had everything misses nothing: recovered, and the next
    // message continues after the kept head.
    let (mut c, _) = Client::connect(&holder, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:d", "recover": true, "epoch": epoch, "offset": 3}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(holder.publish_with("news:d", &key, json!(4)).await.0, 201);
    assert_eq!(c.push().await["pub"]["offset"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_channel_disconnects_its_subscribers_on_sqlite() {
    deletion(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_channel_disconnects_its_subscribers_on_postgres() {
    deletion(Backend::Postgres).await;
}
