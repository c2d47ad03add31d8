//! A token whose `exp` is the current second is refused by every
//! Centrifugo command that takes one (RFC 7519 §4.1.4): `connect`,
//! `subscribe` with a subscription token, `refresh` and `sub_refresh`.
//! Accepted, each would answer with its result; refused, with error 109
//! or a close (3005, 3006), which the SDKs answer by fetching a new token.

use serde_json::{json, Value};

use super::client::Client;
use crate::{now_s, refused_at_exp, Backend, Creds, Node, Place, Role};

/// Sends `method` with `params` and returns its reply, or `None` when the
/// server closed the connection instead.
async fn answer(c: &mut Client, method: &str, params: Value) -> Option<Value> {
    let id = c.id();
    let mut command = json!({ "id": id });
    command[method] = params;
    c.send_text(&command.to_string()).await;
    while let Some(lines) = c.frame().await {
        if let Some(reply) = lines.into_iter().find(|l| l["id"] == id) {
            return Some(reply);
        }
    }
    None
}

/// `true` when `reply` is no `method` result: an error, or a close.
fn refused(reply: Option<&Value>, method: &str) -> bool {
    reply.is_none_or(|r| r.get(method).is_none() && r["error"]["code"].is_u64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_at_its_exp_second_is_refused_by_every_centrifugo_command() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let mut failures: Vec<String> = Vec::new();
    let long = creds.token_for("bob", json!({"channels": ["news:*"]}));
    let until = |exp: u64, claims: Value| {
        let mut all = json!({"sub": "bob", "exp": exp});
        for (k, v) in claims.as_object().unwrap() {
            all[k] = v.clone();
        }
        creds.token(all)
    };

    let r = refused_at_exp("connect", |exp| {
        let token = until(exp, json!({"channels": ["news:*"]}));
        let node = &node;
        async move {
            let mut c = Client::open(node).await;
            let reply = answer(&mut c, "connect", json!({ "token": token })).await;
            refused(reply.as_ref(), "connect")
        }
    })
    .await;
    failures.extend(r.err());

    let r = refused_at_exp("subscribe with a subscription token", |exp| {
        let token = until(exp, json!({"channel": "news:s"}));
        let (node, long) = (&node, long.clone());
        async move {
            let (mut c, _) = Client::connect(node, &long).await;
            let reply = answer(
                &mut c,
                "subscribe",
                json!({"channel": "news:s", "token": token}),
            )
            .await;
            refused(reply.as_ref(), "subscribe")
        }
    })
    .await;
    failures.extend(r.err());

    let r = refused_at_exp("refresh", |exp| {
        let token = until(exp, json!({"channels": ["news:*"]}));
        let (node, long) = (&node, long.clone());
        async move {
            let (mut c, _) = Client::connect(node, &long).await;
            let reply = answer(&mut c, "refresh", json!({ "token": token })).await;
            refused(reply.as_ref(), "refresh")
        }
    })
    .await;
    failures.extend(r.err());

    let sub_long = creds.token(json!({"sub": "bob", "exp": now_s() + 300, "channel": "news:s"}));
    let r = refused_at_exp("sub_refresh", |exp| {
        let token = until(exp, json!({"channel": "news:s"}));
        let (node, long, sub_long) = (&node, long.clone(), sub_long.clone());
        async move {
            let (mut c, _) = Client::connect(node, &long).await;
            let subscribed = answer(
                &mut c,
                "subscribe",
                json!({"channel": "news:s", "token": sub_long}),
            )
            .await;
            assert!(
                subscribed
                    .as_ref()
                    .is_some_and(|r| r["subscribe"].is_object()),
                "{subscribed:?}"
            );
            let reply = answer(
                &mut c,
                "sub_refresh",
                json!({"channel": "news:s", "token": token}),
            )
            .await;
            refused(reply.as_ref(), "sub_refresh")
        }
    })
    .await;
    failures.extend(r.err());
    assert!(failures.is_empty(), "{failures:#?}");
}
