//! A typical Centrifugo token (`sub` and `exp` only) subscribes in a
//! namespace with `subscribe = "authenticated"` (Centrifugo's
//! `allow_subscribe_for_client`), and is refused with 103 in a default
//! one, the reason logged (INFO `permission denied` with the client's
//! user, the channel and why).

use herald_auth::{NamespaceRule, SubscribeRule};
use serde_json::json;

use super::client::Client;
use crate::secrets::Captured;
use crate::{get, on_both_backends, Backend, Creds, Node, Place, Role};

async fn any_signed_in_user_subscribes(backend: Backend) {
    let log = Captured::default();
    // The nodes run on this (current-thread) runtime: their records are
    // this thread's.
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::INFO)
        .with_writer(log.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    config.namespaces.insert(
        "members".to_owned(),
        NamespaceRule {
            subscribe: SubscribeRule::Authenticated,
            ..NamespaceRule::default()
        },
    );
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let publisher = Creds::bearer(&creds.backend);
    let key = [("authorization", publisher.as_str())];
    assert_eq!(
        node.publish_with("members:lobby", &key, json!(1)).await.0,
        201
    );

    // The token a Centrifugo app signs: sub and exp, no channels.
    let token = creds.token_for("alice", json!({}));
    let (mut c, _) = Client::connect(&node, &token).await;
    let sub = c
        .command("subscribe", json!({"channel": "members:lobby"}))
        .await;
    assert!(sub["subscribe"].is_object(), "{sub}");
    assert_eq!(
        node.publish_with("members:lobby", &key, json!(2)).await.0,
        201
    );
    let push = c.push().await;
    assert_eq!(push["channel"], "members:lobby");
    assert_eq!(push["pub"]["data"], 2);
    // History follows the rule too, over HTTP as over Centrifugo.
    let h = c
        .command("history", json!({"channel": "members:lobby", "limit": 10}))
        .await;
    assert_eq!(h["history"]["offset"], 2, "{h}");
    let bearer = Creds::bearer(&token);
    let read = get(
        &node,
        "/v1/channels/members:lobby/messages",
        &[("authorization", bearer.as_str())],
    )
    .await;
    assert_eq!(read.0, 200, "{}", read.2);

    // The default namespace needs a token that lists the channel: 103,
    // and the node logs why.
    let refused = c.command("subscribe", json!({"channel": "news:a"})).await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    let records: Vec<_> = log
        .records()
        .into_iter()
        .filter(|r| r["message"] == "permission denied")
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record["level"], "INFO");
    assert_eq!(record["user"], "alice");
    assert_eq!(record["channel"], "news:a");
    assert_eq!(record["command"], "subscribe");
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("subscribing to news:a: this token does not grant news:a"),
        "{reason}"
    );
    assert!(!log.records().iter().any(|r| r.to_string().contains(&token)));
    // One client cannot flood the log: past 8 refusals of a connection,
    // the rest go to DEBUG.
    for _ in 0..20 {
        let refused = c.command("history", json!({"channel": "news:a"})).await;
        assert_eq!(refused["error"]["code"], 103, "{refused}");
    }
    let logged = log
        .records()
        .into_iter()
        .filter(|r| r["message"] == "permission denied")
        .count();
    assert_eq!(logged, 8, "INFO records of one connection's refusals");

    // Without a user (an empty sub) the namespace takes no token; nor does
    // it take an anonymous client.
    let nobody = creds.token_for("", json!({}));
    let (mut c, _) = Client::connect(&node, &nobody).await;
    let refused = c
        .command("subscribe", json!({"channel": "members:lobby"}))
        .await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    let answer = get(&node, "/v1/channels/members:lobby/messages", &[]).await;
    assert_eq!(answer.0, 401, "{}", answer.2);
    node.stop().await;
}

on_both_backends!(
    any_signed_in_user_subscribes: a_sub_and_exp_token_subscribes_to_an_authenticated_namespace_on_sqlite,
    a_sub_and_exp_token_subscribes_to_an_authenticated_namespace_on_postgres
);
