//! The client protocol: connect, subscribe, pushes, client publish,
//! history, errors, several commands per frame, bad frames, ping/pong,
//! token expiry and refresh.

use std::time::Duration;

use herald_server::{CentrifugoConfig, ServerConfig};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message as Frame;

use super::client::Client;
use super::offsets;
use crate::{now_s, Backend, Creds, Node, Place, Role};

async fn subscribe_publish_history(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for(
        "alice",
        json!({"channels": ["news:*", "room:*"], "publish": ["room:*"]}),
    );

    let (mut c, connected) = Client::connect(&node, &token).await;
    assert!(!connected["client"].as_str().unwrap().is_empty());
    assert_eq!(connected["ping"], 25);
    assert_eq!(connected["pong"], true);
    assert_eq!(connected["expires"], true);
    assert!(connected["ttl"].as_u64().unwrap() > 200, "{connected}");

    let sub = c.command("subscribe", json!({"channel": "news:a"})).await;
    let sub = &sub["subscribe"];
    assert_eq!(sub["recoverable"], true, "{sub}");
    let epoch = sub["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16);
    assert_eq!(sub["offset"].as_u64().unwrap_or(0), 0);

    for i in 1..=3 {
        assert_eq!(
            node.publish_with("news:a", &key, json!({"n": i})).await.0,
            201
        );
    }
    for i in 1..=3u64 {
        let push = c.push().await;
        assert_eq!(push["channel"], "news:a");
        assert_eq!(push["pub"]["offset"], i);
        assert_eq!(push["pub"]["data"], json!({"n": i}));
    }

    // Client publish: refused where the namespace takes keys only,
    // accepted in `room` (publish = "token") on the token's channels.
    let refused = c
        .command("publish", json!({"channel": "news:a", "data": 1}))
        .await;
    assert_eq!(refused["error"]["code"], 103, "{refused}");
    c.command("subscribe", json!({"channel": "room:1"})).await;
    let published = c
        .command("publish", json!({"channel": "room:1", "data": {"hi": 1}}))
        .await;
    assert_eq!(published["publish"], json!({}), "{published}");
    let push = c.push().await;
    assert_eq!(push["channel"], "room:1");
    assert_eq!(push["pub"]["data"], json!({"hi": 1}));
    // It is in the channel's sequence as any publish.
    assert_eq!(
        node.publish_with("room:1", &key, json!(2)).await.2["offset"],
        2
    );

    // History: all, since a position, reverse, wrong epoch.
    let h = c
        .command("history", json!({"channel": "news:a", "limit": 10}))
        .await;
    assert_eq!(offsets(&h["history"]["publications"]), vec![1, 2, 3]);
    assert_eq!(h["history"]["epoch"], epoch);
    assert_eq!(h["history"]["offset"], 3);
    let h = c
        .command(
            "history",
            json!({"channel": "news:a", "limit": 10, "since": {"offset": 1, "epoch": epoch}}),
        )
        .await;
    assert_eq!(offsets(&h["history"]["publications"]), vec![2, 3]);
    let h = c
        .command(
            "history",
            json!({"channel": "news:a", "limit": 2, "reverse": true}),
        )
        .await;
    assert_eq!(offsets(&h["history"]["publications"]), vec![3, 2]);
    let h = c
        .command(
            "history",
            json!({"channel": "news:a", "limit": 10, "since": {"offset": 1, "epoch": "other"}}),
        )
        .await;
    assert_eq!(h["error"]["code"], 112, "{h}");
    // `room` keeps its history from tokens.
    let h = c
        .command("history", json!({"channel": "room:1", "limit": 10}))
        .await;
    assert_eq!(h["error"]["code"], 103, "{h}");

    // Errors with Centrifugo's codes.
    let again = c.command("subscribe", json!({"channel": "news:a"})).await;
    assert_eq!(again["error"]["code"], 105, "{again}");
    let denied = c
        .command("subscribe", json!({"channel": "keyonly:x"}))
        .await;
    assert_eq!(denied["error"]["code"], 103, "{denied}");
    for method in ["presence", "presence_stats", "rpc"] {
        let r = c.command(method, json!({"channel": "news:a"})).await;
        assert_eq!(r["error"]["code"], 108, "{method}: {r}");
    }
    let unknown = c.command("teleport", json!({})).await;
    assert_eq!(unknown["error"]["code"], 104, "{unknown}");
    let ping = c.command("ping", json!({})).await;
    assert_eq!(ping["ping"], json!({}));

    // After unsubscribe, nothing more of news:a arrives: the next push is
    // room:1's, published after news:a's.
    let un = c.command("unsubscribe", json!({"channel": "news:a"})).await;
    assert_eq!(un["unsubscribe"], json!({}));
    node.publish_with("news:a", &key, json!(4)).await;
    node.publish_with("room:1", &key, json!(3)).await;
    let push = c.push().await;
    assert_eq!(push["channel"], "room:1", "{push}");
    assert_eq!(push["pub"]["offset"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_publish_and_history_on_sqlite() {
    subscribe_publish_history(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_publish_and_history_on_postgres() {
    subscribe_publish_history(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_commands_per_frame_and_bad_frames() {
    let place = Place::new(Backend::Sqlite).await;
    let config = ServerConfig {
        max_message_bytes: 1024,
        centrifugo: CentrifugoConfig {
            connect_timeout: Duration::from_millis(300),
            ..CentrifugoConfig::default()
        },
        ..ServerConfig::default()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;

    // Three commands in one frame: three replies in one frame, in order.
    let mut c = Client::open(&node).await;
    c.send_text(
        "{\"id\":1,\"connect\":{}}\n{\"id\":2,\"subscribe\":{\"channel\":\"a\"}}\n{\"id\":3,\"history\":{\"channel\":\"a\"}}",
    )
    .await;
    let frame = c.frame().await.unwrap();
    let ids: Vec<_> = frame.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2, 3], "{frame:?}");
    assert!(frame[1]["subscribe"]["epoch"].is_string());
    assert_eq!(frame[2]["history"]["epoch"], frame[1]["subscribe"]["epoch"]);

    // Not JSON: 3501 "bad request".
    let (mut c, _) = Client::connect(&node, "").await;
    c.send_text("{not json").await;
    assert_eq!(c.closed_with().await, Some(3501));
    // A request that is a JSON array (of its fields' values), not an
    // object: 3501, as Centrifugo's decoder refuses it.
    let (mut c, _) = Client::connect(&node, "").await;
    c.send_text("{\"id\":2,\"history\":{\"channel\":\"a\",\"since\":[0,\"\"]}}")
        .await;
    assert_eq!(c.closed_with().await, Some(3501));
    // A command before connect: 3501.
    let mut c = Client::open(&node).await;
    c.send_text("{\"id\":1,\"subscribe\":{\"channel\":\"a\"}}")
        .await;
    assert_eq!(c.closed_with().await, Some(3501));
    // A binary frame (this is the JSON protocol): 3501.
    let (mut c, _) = Client::connect(&node, "").await;
    c.send_frame(Frame::Binary(vec![1, 2, 3].into())).await;
    assert_eq!(c.closed_with().await, Some(3501));
    // A frame over the limit ends the connection.
    let (mut c, _) = Client::connect(&node, "").await;
    let big = format!(
        "{{\"id\":1,\"publish\":{{\"channel\":\"a\",\"data\":\"{}\"}}}}",
        "x".repeat(64 * 1024)
    );
    c.send_text(&big).await;
    assert!(
        c.frame().await.is_none(),
        "the oversized frame was answered"
    );
    // No connect in time: 3502 "stale".
    let mut c = Client::open(&node).await;
    assert_eq!(c.closed_with().await, Some(3502));
    // The node serves on.
    let (mut c, _) = Client::connect(&node, "").await;
    let r = c.command("subscribe", json!({"channel": "a"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_pong_and_no_pong() {
    let place = Place::new(Backend::Sqlite).await;
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            ping_interval: Duration::from_secs(1),
            pong_timeout: Duration::from_millis(500),
            ..CentrifugoConfig::default()
        },
        ..ServerConfig::default()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let (mut quiet, connected) = Client::connect(&node, "").await;
    assert_eq!(connected["ping"], 1);
    quiet.pong = false;
    let (mut answering, _) = Client::connect(&node, "").await;
    // The client that does not answer is closed with 3012 "no pong"; the
    // one that answers (read meanwhile) sees three pings and stays.
    let answered = async {
        while answering.pings < 3 {
            let frame = answering.frame().await;
            assert!(frame.is_some(), "closed: {:?}", answering.closed);
        }
    };
    let (code, ()) = tokio::join!(quiet.closed_with(), answered);
    assert_eq!(code, Some(3012));
    assert!(quiet.pings >= 1);
    let r = answering.command("history", json!({"channel": "p"})).await;
    assert!(r["history"].is_object(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_expiry_refresh_and_bad_tokens() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            ping_interval: Duration::from_secs(1),
            pong_timeout: Duration::from_millis(500),
            anonymous_connect: true,
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let exp = now_s() + 2;
    let short = creds.token(json!({"sub": "bob", "exp": exp, "channels": ["news:*"]}));
    let long = creds.token_for("bob", json!({"channels": ["news:*"]}));

    // Not refreshed: closed with 3005 at `exp`.
    let (mut lapsing, connected) = Client::connect(&node, &short).await;
    assert_eq!(connected["expires"], true);
    assert!(connected["ttl"].as_u64().unwrap() <= 2, "{connected}");
    // Refreshed: stays connected past the first token's `exp`.
    let (mut refreshed, _) = Client::connect(&node, &short).await;
    let r = refreshed.command("refresh", json!({"token": long})).await;
    assert_eq!(r["refresh"]["expires"], true, "{r}");
    assert!(r["refresh"]["ttl"].as_u64().unwrap() > 200, "{r}");
    // Both read at once, so that the refreshed one answers its pings.
    let stays = async {
        while now_s() <= exp + 1 {
            assert!(refreshed.frame().await.is_some(), "{:?}", refreshed.closed);
        }
    };
    let (code, ()) = tokio::join!(lapsing.closed_with(), stays);
    assert_eq!(code, Some(3005));
    let r = refreshed
        .command("subscribe", json!({"channel": "news:a"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    // A refresh for another user is refused: 3500.
    let other = creds.token_for("eve", json!({}));
    refreshed
        .send_text(&json!({"id": 99, "refresh": {"token": other}}).to_string())
        .await;
    assert_eq!(refreshed.closed_with().await, Some(3500));

    // An expired token: error 109 (the SDK asks for a new one).
    let expired = creds.token(json!({"sub": "bob", "exp": now_s() - 10}));
    let mut c = Client::open(&node).await;
    let r = c.command("connect", json!({"token": expired})).await;
    assert_eq!(r["error"]["code"], 109, "{r}");
    // A forged one: 3500 "invalid token".
    let forged = format!("{}x", long);
    c.send_text(&json!({"id": 5, "connect": {"token": forged}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3500));

    // A subscription token: its `exp` ends the subscription with 3006
    // unless refreshed.
    let (mut c, _) = Client::connect(&node, "").await;
    let sub_token = creds.token(json!({"sub": "", "exp": now_s() + 2, "channel": "news:s"}));
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:s", "token": sub_token}),
        )
        .await;
    assert_eq!(r["subscribe"]["expires"], true, "{r}");
    assert_eq!(c.closed_with().await, Some(3006));
}

/// A command without an id is the client's pong (Centrifugo's rule):
/// whatever method it holds is never run and gets no reply; before
/// `connect` it is a protocol error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_without_an_id_are_pongs_and_never_run() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let token = creds.token_for(
        "alice",
        json!({"channels": ["room:*"], "publish": ["room:*"]}),
    );
    let (mut c, _) = Client::connect(&node, &token).await;
    c.send_text(concat!(
        "{\"publish\":{\"channel\":\"room:1\",\"data\":1}}\n",
        "{\"id\":0,\"subscribe\":{\"channel\":\"room:1\"}}\n",
        "{\"id\":5,\"ping\":{}}",
    ))
    .await;
    // Only the command with an id is answered.
    let frame = c.frame().await.expect("the ping's reply");
    assert_eq!(frame, vec![json!({"id": 5, "ping": {}})]);
    // Nothing was published, nothing subscribed.
    assert_eq!(node.head("room:1").await, 0);
    let r = c.command("subscribe", json!({"channel": "room:1"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    // A `send` needs no id: it closes the connection (3508), and what
    // else the line holds is not run.
    c.send_text("{\"send\":{},\"publish\":{\"channel\":\"room:1\",\"data\":1}}")
        .await;
    assert_eq!(c.closed_with().await, Some(3508));
    assert_eq!(node.head("room:1").await, 0);

    // Before `connect`, even a `connect` without an id is refused.
    let mut c = Client::open(&node).await;
    c.send_text(&json!({"connect": {"token": token}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3501));
}

/// A token of another user than the connection's closes it with 3500
/// "invalid token", an anonymous connection's (user "") included, as in
/// Centrifugo: a `refresh` cannot turn an anonymous connection into a
/// user's, and a subscription token names the connection's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_another_user_than_the_connections_are_refused() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, anonymous(&creds)).await;
    let alice = creds.token_for("alice", json!({"channels": ["news:*"]}));

    let (mut c, _) = Client::connect(&node, "").await;
    c.send_text(&json!({"id": 7, "refresh": {"token": alice}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3500));

    let sub = creds.token_for("alice", json!({"channel": "news:s"}));
    let (mut c, _) = Client::connect(&node, "").await;
    c.send_text(&json!({"id": 7, "subscribe": {"channel": "news:s", "token": sub}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3500));

    // The same subscription token on alice's connection is taken, and one
    // for user "" on an anonymous connection.
    let (mut c, _) = Client::connect(&node, &alice).await;
    let r = c
        .command("subscribe", json!({"channel": "news:s", "token": sub}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let anonymous = creds.token_for("", json!({"channel": "news:s"}));
    let (mut c, _) = Client::connect(&node, "").await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "news:s", "token": anonymous}),
        )
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
}

/// `creds.config()` with anonymous connects allowed.
fn anonymous(creds: &Creds) -> ServerConfig {
    let config = creds.config();
    ServerConfig {
        centrifugo: CentrifugoConfig {
            anonymous_connect: true,
            ..config.centrifugo.clone()
        },
        ..config
    }
}

/// With access control on, a `connect` without a token is closed with
/// 3501 "bad request" (Centrifugo's default), so an anonymous client
/// subscribes to nothing, not even a public namespace; with
/// `anonymous_connect` it connects and may subscribe to public
/// namespaces only. A node without access control takes every connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_without_a_token_needs_anonymous_connect() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    for connect in [json!({}), json!({"token": ""}), json!({"name": "js"})] {
        let mut c = Client::open(&node).await;
        c.send_text(&json!({"id": 1, "connect": connect}).to_string())
            .await;
        assert_eq!(c.closed_with().await, Some(3501), "{connect}");
    }
    // A token still connects.
    let alice = creds.token_for("alice", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&node, &alice).await;
    let r = c.command("subscribe", json!({"channel": "news:a"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    node.stop().await;

    let node = Node::start(&place, "node-b", Role::Holder, anonymous(&creds)).await;
    let (mut c, connected) = Client::connect(&node, "").await;
    assert!(connected["client"].is_string(), "{connected}");
    let r = c.command("subscribe", json!({"channel": "open:a"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let r = c.command("subscribe", json!({"channel": "news:a"})).await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    node.stop().await;

    let node = Node::start(&place, "node-c", Role::Holder, ServerConfig::default()).await;
    let (mut c, _) = Client::connect(&node, "").await;
    let r = c.command("subscribe", json!({"channel": "news:a"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
}
