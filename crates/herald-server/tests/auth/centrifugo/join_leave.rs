//! Presence and join/leave per namespace, with the hand-written protocol
//! client: `presence` answers 108 in a namespace without presence and
//! works in one with it, whatever the node's default; join and leave
//! pushes go to the subscribers that asked (or all of them where the
//! namespace forces them), carry the tokens' `info` claims, follow an
//! unsubscribe, a disconnect and the server API's `unsubscribe`, and (on
//! PostgreSQL) reach the other node, in order, with an `info` too long
//! for a notification left out, and when the node drains.

use herald_auth::NamespaceRule;
use herald_server::{CentrifugoConfig, ServerConfig};
use serde_json::{json, Value};

use super::api;
use super::client::Client;
use crate::{on_both_backends, Backend, Creds, Node, Place, Role};

/// The test's config with namespaces `chat` (presence and join/leave),
/// `forced` (join/leave pushed to every subscriber) and `quiet` (no
/// presence, whatever the default).
fn namespaced(creds: &Creds) -> ServerConfig {
    let mut config = creds.config();
    let rule = |presence, join_leave, force_push_join_leave| NamespaceRule {
        presence,
        join_leave,
        force_push_join_leave,
        ..NamespaceRule::default()
    };
    let namespaces = &mut config.namespaces;
    namespaces.insert("chat".to_owned(), rule(Some(true), Some(true), None));
    namespaces.insert("forced".to_owned(), rule(None, Some(true), Some(true)));
    namespaces.insert("quiet".to_owned(), rule(Some(false), None, None));
    config
}

/// The client id of a connect result.
fn id(connected: &Value) -> String {
    connected["client"].as_str().unwrap().to_owned()
}

/// Subscribes `client` to `channel` asking for its joins and leaves
/// (`join_leave: true`); asserts the subscription succeeded.
async fn subscribe_with_joins(client: &mut Client, channel: &str) {
    let r = client
        .command("subscribe", json!({"channel": channel, "join_leave": true}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
}

/// Checks `presence` and `presence_stats` of `channel` on `node`, through
/// the client protocol and the server API: answered with `clients`
/// clients, or (`None`) error 108.
async fn check_presence(
    client: &mut Client,
    node: &Node,
    creds: &Creds,
    channel: &str,
    clients: Option<usize>,
) {
    for method in ["presence", "presence_stats"] {
        let r = client.command(method, json!({ "channel": channel })).await;
        let api = api(node, method, &creds.backend, json!({ "channel": channel })).await;
        match clients {
            None => {
                assert_eq!(r["error"]["code"], 108, "{method} {channel}: {r}");
                assert_eq!(api["error"]["code"], 108, "{method} {channel}: {api}");
            }
            Some(n) => {
                let (seen, via_api) = if method == "presence" {
                    (
                        r["presence"]["presence"].as_object().map(|m| m.len()),
                        api["result"]["presence"].as_object().map(|m| m.len()),
                    )
                } else {
                    (
                        r["presence_stats"]["num_clients"]
                            .as_u64()
                            .map(|n| n as usize),
                        api["result"]["num_clients"].as_u64().map(|n| n as usize),
                    )
                };
                assert_eq!(seen, Some(n), "{method} {channel}: {r}");
                assert_eq!(via_api, Some(n), "{method} {channel}: {api}");
            }
        }
    }
}

/// Node a has presence on by default, node b off by default; `chat`
/// has it and `quiet` has not on both.
async fn presence_per_namespace(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let on = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            ..CentrifugoConfig::default()
        },
        ..namespaced(&creds)
    };
    let a = Node::start(&place, "node-a", Role::Holder, on).await;
    let b = Node::start(&place, "node-b", Role::Standby, namespaced(&creds)).await;
    let token = creds.token_for("ann", json!({"channels": ["chat:*", "news:*", "quiet:*"]}));
    let (mut on_a, _) = Client::connect(&a, &token).await;
    let (mut on_b, _) = Client::connect(&b, &token).await;
    for channel in ["chat:p", "news:p", "quiet:p"] {
        let r = on_a
            .command("subscribe", json!({ "channel": channel }))
            .await;
        assert!(r["subscribe"].is_object(), "{r}");
    }
    check_presence(&mut on_a, &a, &creds, "chat:p", Some(1)).await;
    check_presence(&mut on_a, &a, &creds, "news:p", Some(1)).await;
    check_presence(&mut on_a, &a, &creds, "quiet:p", None).await;
    // On node b, whose default is off, only `chat` has presence; it sees
    // node a's subscriber.
    check_presence(&mut on_b, &b, &creds, "chat:p", Some(1)).await;
    check_presence(&mut on_b, &b, &creds, "news:p", None).await;
    check_presence(&mut on_b, &b, &creds, "quiet:p", None).await;
    // An invalid channel name is still a bad request.
    let r = on_b
        .command("presence", json!({"channel": "bad name"}))
        .await;
    assert_eq!(r["error"]["code"], 107, "{r}");
    b.stop().await;
    a.stop().await;
}

on_both_backends!(presence_per_namespace: presence_per_namespace_on_sqlite, presence_per_namespace_on_postgres);

/// Expects `push` to be a `kind` push (`join` or `leave`) of `channel`
/// whose `info` is `info`.
fn assert_join_leave(push: &Value, kind: &str, channel: &str, info: &Value) {
    assert_eq!(push["channel"], channel, "{push}");
    assert_eq!(&push[kind]["info"], info, "{push}");
}

/// One node: who gets which pushes, with which infos.
async fn join_leave_pushes(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, namespaced(&creds)).await;
    let key = [("x-api-key", creds.backend.as_str())];
    let channels = json!(["chat:*", "news:*", "forced:*"]);
    let ann = creds.token_for("ann", json!({ "channels": channels }));
    let bob = creds.token_for(
        "bob",
        json!({ "channels": channels, "info": {"name": "Bob"} }),
    );
    let (mut w1, c1) = Client::connect(&node, &ann).await;
    let (mut w2, c2) = Client::connect(&node, &bob).await;
    let (id1, id2) = (id(&c1), id(&c2));
    let ann_info = json!({"user": "ann", "client": id1});
    let bob_info = json!({"user": "bob", "client": id2, "conn_info": {"name": "Bob"}});

    // w1 asks for joins and leaves: it gets its own join first.
    subscribe_with_joins(&mut w1, "chat:a").await;
    assert_join_leave(&w1.push().await, "join", "chat:a", &ann_info);

    // w2 subscribes with a subscription token whose `info` is the
    // channel info, without asking: w1 gets its join, w2 none (its next
    // push is the publication made afterwards).
    let sub_token = creds.token_for("bob", json!({"channel": "chat:a", "info": {"seat": 3}}));
    let r = w2
        .command(
            "subscribe",
            json!({"channel": "chat:a", "token": sub_token}),
        )
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let mut bob_in_chat = bob_info.clone();
    bob_in_chat["chan_info"] = json!({"seat": 3});
    assert_join_leave(&w1.push().await, "join", "chat:a", &bob_in_chat);
    assert_eq!(
        node.publish_with("chat:a", &key, json!({"n": 1})).await.0,
        201
    );
    assert_eq!(w2.push().await["pub"]["data"], json!({"n": 1}));
    assert_eq!(w1.push().await["pub"]["data"], json!({"n": 1}));

    // w2 unsubscribes: w1 gets its leave, with the same infos.
    let r = w2
        .command("unsubscribe", json!({"channel": "chat:a"}))
        .await;
    assert_eq!(r["unsubscribe"], json!({}), "{r}");
    assert_join_leave(&w1.push().await, "leave", "chat:a", &bob_in_chat);

    // `news` has no join_leave: asking changes nothing (w1's next push
    // is the publication).
    for w in [&mut w1, &mut w2] {
        subscribe_with_joins(w, "news:a").await;
    }
    assert_eq!(
        node.publish_with("news:a", &key, json!({"n": 2})).await.0,
        201
    );
    for w in [&mut w1, &mut w2] {
        let push = w.push().await;
        assert_eq!(
            (push["channel"].clone(), push["pub"]["data"].clone()),
            (json!("news:a"), json!({"n": 2})),
            "{push}"
        );
    }

    // `forced` pushes to every subscriber, asked or not.
    let r = w2
        .command("subscribe", json!({"channel": "forced:a"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    assert_join_leave(&w2.push().await, "join", "forced:a", &bob_info);
    let r = w1
        .command("subscribe", json!({"channel": "forced:a"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    assert_join_leave(&w1.push().await, "join", "forced:a", &ann_info);
    assert_join_leave(&w2.push().await, "join", "forced:a", &ann_info);

    // The server API's unsubscribe of ann: w2 gets her leave.
    let admin = [("x-api-key", creds.admin.as_str())];
    let (status, _, r) = node
        .call(
            "POST",
            "/api/unsubscribe",
            &admin,
            Some(json!({"user": "ann", "channel": "forced:a"})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(w1.push().await["unsubscribe"]["code"], 2000);
    assert_join_leave(&w2.push().await, "leave", "forced:a", &ann_info);
    let r = w1
        .command("subscribe", json!({"channel": "forced:a"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    assert_join_leave(&w1.push().await, "join", "forced:a", &ann_info);
    assert_join_leave(&w2.push().await, "join", "forced:a", &ann_info);

    // w2 disconnects: w1 gets its leave of `forced:a` (the one channel
    // with join_leave it was still in).
    drop(w2);
    assert_join_leave(&w1.push().await, "leave", "forced:a", &bob_info);
    node.stop().await;
}

on_both_backends!(join_leave_pushes: join_leave_pushes_on_sqlite, join_leave_pushes_on_postgres);

/// Two nodes on PostgreSQL: a subscriber on the holder gets the joins and
/// leaves of a client on the standby in order (a subscribe and an
/// unsubscribe in one frame), an `info` too long for a notification is
/// left out there while the standby's own subscriber gets it, and the
/// leaves of the standby's clients arrive when it drains.
#[tokio::test]
async fn joins_and_leaves_cross_nodes_on_postgres() {
    let place = Place::new(Backend::Postgres).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, namespaced(&creds)).await;
    let mut standby = Node::start(&place, "node-b", Role::Standby, namespaced(&creds)).await;
    let channels = json!(["chat:*"]);
    let ann = creds.token_for("ann", json!({ "channels": channels }));
    let long = "x".repeat(9000);
    let bob = creds.token_for("bob", json!({ "channels": channels, "info": long }));
    let cid = creds.token_for("cid", json!({ "channels": channels, "info": {"n": 1} }));
    let (mut far, _) = Client::connect(&holder, &ann).await;
    let (mut near, _) = Client::connect(&standby, &ann).await;
    for w in [&mut far, &mut near] {
        subscribe_with_joins(w, "chat:x").await;
        assert_eq!(w.push().await["join"]["info"]["user"], "ann");
    }
    // `near`'s join reached the holder too.
    assert_eq!(far.push().await["join"]["info"]["user"], "ann");

    let (mut b, b_info) = Client::connect(&standby, &bob).await;
    let b_id = id(&b_info);
    let subscribe = json!({"id": 10, "subscribe": {"channel": "chat:x"}});
    let unsubscribe = json!({"id": 11, "unsubscribe": {"channel": "chat:x"}});
    b.send_text(&format!("{subscribe}\n{unsubscribe}")).await;
    assert!(b.reply(10).await["subscribe"].is_object());
    assert_eq!(b.reply(11).await["unsubscribe"], json!({}));
    let local = json!({"user": "bob", "client": b_id, "conn_info": long});
    assert_join_leave(&near.push().await, "join", "chat:x", &local);
    assert_join_leave(&near.push().await, "leave", "chat:x", &local);
    let remote = json!({"user": "bob", "client": b_id});
    assert_join_leave(&far.push().await, "join", "chat:x", &remote);
    assert_join_leave(&far.push().await, "leave", "chat:x", &remote);

    // A client of the standby that is subscribed when the standby
    // drains: the holder's subscriber gets its leave (and `near`'s).
    let (mut c, c_info) = Client::connect(&standby, &cid).await;
    let r = c.command("subscribe", json!({"channel": "chat:x"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let cid_info = json!({"user": "cid", "client": id(&c_info), "conn_info": {"n": 1}});
    assert_join_leave(&far.push().await, "join", "chat:x", &cid_info);
    standby.drain().await;
    let mut left = Vec::new();
    for _ in 0..2 {
        let push = far.push().await;
        assert_eq!(push["channel"], "chat:x", "{push}");
        left.push(push["leave"]["info"]["user"].as_str().unwrap().to_owned());
    }
    left.sort();
    assert_eq!(left, ["ann", "cid"]);
    standby.stop().await;
    holder.stop().await;
}
