//! A Centrifugo session under attack, each attack bounded as
//! `docs/centrifugo.md` ("Limits of one connection") says: commands
//! pipelined past the token's `exp` (closed with 3005 or 3006 at `exp`,
//! nothing read after it), one frame of many `history` commands (3013
//! beyond the cap; below it, the replies are written as they are ready
//! and the node's resident memory stays bounded), a client that stops
//! reading (closed once a write waits longer than `write_timeout`), a
//! burst of `subscribe` and `history` commands (111), `presence` in a
//! loop (111, and no storage read for a refused one), a `refresh` with a
//! narrower token (what it no longer grants ends), and a `refresh` or
//! `sub_refresh` with an expired token (3005, 3006, so that the SDK gets a
//! new token and reconnects).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{SinkExt, StreamExt};
use herald_server::{CentrifugoConfig, ServerConfig};
use herald_testkit::memory::PeakRss;
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as Frame;

use super::api;
use super::client::Client;
use crate::{now_s, Backend, Creds, Node, Place, Role};

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Which token expires while the client pipelines.
#[derive(Debug, Clone, Copy)]
enum Expiring {
    /// The connection token: 3005.
    Connection,
    /// A subscription token: 3006.
    Subscription,
}

/// A client keeps frames of `history` commands always pending (up to
/// 16 frames of 100 ahead of their replies) across its token's `exp`; a message is
/// published once `exp` has passed. The connection must close with the
/// token's code within a second of `exp`, and no reply may carry the
/// message published after it.
async fn pipelining_past_exp(expiring: Expiring) {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    assert_eq!(
        node.publish_with("news:p", &key, json!({"before": true}))
            .await
            .0,
        201
    );
    let exp = now_s() + 3;
    let short = |claims: Value| {
        let mut claims = claims;
        claims["sub"] = json!("ann");
        claims["exp"] = json!(exp);
        creds.token(claims)
    };
    let (connection, code) = match expiring {
        Expiring::Connection => (short(json!({"channels": ["news:*"]})), 3005),
        Expiring::Subscription => (
            creds.token_for("ann", json!({"channels": ["news:*"]})),
            3006,
        ),
    };
    let mut first = json!({"id": 1, "connect": {"token": connection}}).to_string();
    if let Expiring::Subscription = expiring {
        let sub = short(json!({"channel": "news:p"}));
        first.push('\n');
        first.push_str(
            &json!({"id": 2, "subscribe": {"channel": "news:p", "token": sub}}).to_string(),
        );
    }
    let ws = node
        .ws("/connection/websocket", &[])
        .await
        .expect("upgrade");
    let (mut tx, mut rx) = ws.split();
    tx.send(Frame::Text(first.into())).await.unwrap();

    // One frame, sent again and again: cheap to send, and a hundred
    // commands for the node to run.
    const PER_FRAME: u64 = 100;
    const AHEAD: u64 = 16;
    let frame: String = (0..PER_FRAME)
        .map(|i| {
            json!({"id": 100 + i, "history": {"channel": "news:p", "limit": 1, "reverse": true}})
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n");
    let replies = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let notify = Arc::new(tokio::sync::Notify::new());
    let writer = {
        let (replies, done, notify) = (replies.clone(), done.clone(), notify.clone());
        tokio::spawn(async move {
            let mut frames = 0u64;
            while !done.load(Ordering::SeqCst) {
                // Up to AHEAD frames ahead of the replies.
                if frames >= AHEAD && replies.load(Ordering::SeqCst) < (frames - AHEAD) * PER_FRAME
                {
                    notify.notified().await;
                    continue;
                }
                if tx.send(Frame::Text(frame.clone().into())).await.is_err() {
                    return;
                }
                frames += 1;
            }
        })
    };
    let publish_after_exp = async {
        let wait = (exp * 1000).saturating_sub(now_ms());
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert_eq!(
            node.publish_with("news:p", &key, json!({"after": true}))
                .await
                .0,
            201
        );
    };
    let read = async {
        let mut leaked = Vec::new();
        let mut closed = None;
        within(
            "the close at exp",
            NODE_WAIT + Duration::from_secs(3),
            async {
                while let Some(frame) = rx.next().await {
                    match frame {
                        Ok(Frame::Text(text)) => {
                            let at = now_ms();
                            for line in text.split('\n') {
                                let reply: Value = serde_json::from_str(line).unwrap();
                                // Answered or refused (111 beyond the
                                // connection's rate of reads).
                                if reply.get("id").is_some() {
                                    replies.fetch_add(1, Ordering::SeqCst);
                                }
                                if line.contains("\"after\"") {
                                    leaked.push((at, reply));
                                }
                            }
                            notify.notify_one();
                        }
                        Ok(Frame::Close(frame)) => {
                            closed = Some((frame.map(|f| u16::from(f.code)), now_ms()));
                            break;
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            },
        )
        .await;
        (leaked, closed)
    };
    let ((leaked, closed), ()) = tokio::join!(read, publish_after_exp);
    done.store(true, Ordering::SeqCst);
    notify.notify_one();
    writer.abort();
    let answered = replies.load(Ordering::SeqCst);
    eprintln!(
        "DEBUG answered {answered} closed {closed:?} exp {}",
        exp * 1000
    );
    assert!(answered > 0, "nothing was answered");
    assert!(leaked.is_empty(), "read after exp: {leaked:?}");
    let (got, at) = closed.expect("a Close frame");
    assert_eq!(got, Some(code), "{expiring:?}");
    let exp_ms = exp * 1000;
    assert!(
        at + 100 >= exp_ms && at < exp_ms + 1000,
        "closed {} ms after exp ({answered} replies)",
        i128::from(at) - i128::from(exp_ms)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_pipelined_past_the_connection_tokens_exp_are_closed_with_3005() {
    pipelining_past_exp(Expiring::Connection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_pipelined_past_a_subscription_tokens_exp_are_closed_with_3006() {
    pipelining_past_exp(Expiring::Subscription).await;
}

/// Frames of `history` commands on a channel of 100 messages of 8 KB,
/// each command asking for all of them (800 KB a reply): a frame of 600
/// is refused whole (3013) and one of 250 is answered in full, reply
/// after reply, while the node's resident memory grows by less than
/// 150 MB (buffering the 250 replies and joining them took 400 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_of_history_commands_keeps_the_nodes_memory_bounded() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let big = "x".repeat(8000);
    for i in 0..100 {
        let status = node
            .publish_with("news:big", &key, json!({"n": i, "big": big}))
            .await
            .0;
        assert_eq!(status, 201);
    }
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let frame = |n: u32| {
        (1..=n)
            .map(|id| {
                json!({"id": id, "history": {"channel": "news:big", "limit": 100}}).to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let rss = PeakRss::start();

    let (mut c, _) = Client::connect(&node, &token).await;
    c.send_text(&frame(600)).await;
    assert_eq!(c.closed_with().await, Some(3013));

    let (mut c, _) = Client::connect(&node, &token).await;
    c.send_text(&frame(250)).await;
    let mut answered = Vec::new();
    while answered.len() < 250 {
        let Some(lines) = c.frame().await else { break };
        for reply in lines {
            let n = reply["history"]["publications"]
                .as_array()
                .map_or(0, Vec::len);
            answered.push((reply["id"].as_u64().unwrap_or(0), n));
        }
    }
    let grown = rss.growth();
    assert!(grown < 150 << 20, "the node grew by {} MB", grown >> 20);
    let expected: Vec<(u64, usize)> = (1..=250).map(|id| (id, 100)).collect();
    assert_eq!(answered, expected, "closed: {:?}", c.closed);
}

/// A client that subscribes and then stops reading while large messages
/// are published: once the TCP window is full and a write has waited
/// `write_timeout`, the session ends (its subscription is gone from the
/// server API's `channels`) instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_at_the_write_timeout() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            write_timeout: Duration::from_millis(500),
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&node, &token).await;
    let r = c.command("subscribe", json!({"channel": "news:w"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let subscribed = || async {
        let channels = api(&node, "channels", &creds.backend, json!({})).await;
        channels["result"]["channels"].get("news:w").is_some()
    };
    assert!(subscribed().await);
    // 24 MB of pushes, more than the socket buffers of both ends hold;
    // the client reads none of them.
    let big = "y".repeat(60_000);
    for i in 0..400 {
        let status = node
            .publish_with("news:w", &key, json!({"n": i, "big": big}))
            .await
            .0;
        assert_eq!(status, 201);
    }
    within("the stuck session's end", NODE_WAIT, async {
        while subscribed().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // The client finds its connection ended once it reads again.
    within("the client's end", NODE_WAIT, async {
        while c.frame().await.is_some() {}
    })
    .await;
}

/// A client that subscribes and then stops reading while large messages
/// are published: once the pushes queued for its connection would pass
/// `subscriber_queue_bytes` (256 KiB here, four pushes), the session
/// ends as a slow consumer, long before the write timeout (60 s here),
/// and the client, once it reads again, finds it closed with 3008
/// "slow", having got only what was written before, not the 36 MB
/// published. Without the byte budget the session queued 256 pushes of
/// 60 KB (15 MB) and waited on the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_queue_passes_its_byte_budget_is_closed_as_slow() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let config = ServerConfig {
        subscriber_queue_bytes: 256 * 1024,
        centrifugo: CentrifugoConfig {
            // Neither the write timeout nor a missed pong ends it first.
            write_timeout: Duration::from_secs(60),
            ping_interval: Duration::from_secs(300),
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&node, &token).await;
    let r = c.command("subscribe", json!({"channel": "news:s"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let subscribed = || async {
        let channels = api(&node, "channels", &creds.backend, json!({})).await;
        channels["result"]["channels"].get("news:s").is_some()
    };
    assert!(subscribed().await);
    // 36 MB of pushes, more than the socket buffers of both ends and the
    // queue's budget hold; the client reads none of them meanwhile.
    const PUBLISHED: u64 = 600;
    let big = "s".repeat(60_000);
    for i in 0..PUBLISHED {
        let status = node
            .publish_with("news:s", &key, json!({"n": i, "big": big}))
            .await
            .0;
        assert_eq!(status, 201);
    }
    within("the slow session's end", NODE_WAIT, async {
        while subscribed().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let mut pushed = 0u64;
    within("the client's end", NODE_WAIT, async {
        while let Some(values) = c.frame().await {
            pushed += values.iter().filter(|v| v.get("push").is_some()).count() as u64;
        }
    })
    .await;
    assert!(pushed < PUBLISHED, "every push was written ({pushed})");
    // The Close frame is tried for a second behind what the socket still
    // buffers: the client gets 3008, or sees the connection end.
    assert!(
        matches!(c.closed, Some(Some(3008) | None)),
        "closed with {:?}",
        c.closed
    );
}

/// A drain does not wait for a session whose write waits on a client
/// that stopped reading: the write is raced with the shutdown, and the
/// node stops long before the write timeout (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_does_not_wait_for_a_stuck_write() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            write_timeout: Duration::from_secs(60),
            ..CentrifugoConfig::default()
        },
        ..creds.config()
    };
    let mut node = Node::start(&place, "node-a", Role::Holder, config).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&node, &token).await;
    let r = c.command("subscribe", json!({"channel": "news:d"})).await;
    assert!(r["subscribe"].is_object(), "{r}");
    // 24 MB of pushes the client does not read: the session's write
    // waits on a full TCP window.
    let big = "z".repeat(60_000);
    for i in 0..400 {
        let status = node
            .publish_with("news:d", &key, json!({"n": i, "big": big}))
            .await
            .0;
        assert_eq!(status, 201);
    }
    // `drain` fails after NODE_WAIT (20 s), before the write timeout.
    node.drain().await;
    drop(c);
}

/// `subscribe` and `history` commands beyond the connection's burst (256
/// at the default `channel_limit`) and rate (20 per second) answer 111.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_history_are_rate_limited_per_connection() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let (mut c, _) = Client::connect(&node, &token).await;
    let started = std::time::Instant::now();
    let mut next_id = 10u32;
    let (mut passed, mut limited) = (0u32, 0u32);
    for _ in 0..3 {
        let lines: Vec<String> = (0..200)
            .map(|i| {
                next_id += 1;
                if i % 2 == 0 {
                    json!({"id": next_id, "history": {"channel": "news:r", "limit": 0}})
                } else {
                    json!({"id": next_id, "subscribe": {"channel": format!("news:r{next_id}")}})
                }
                .to_string()
            })
            .collect();
        c.send_text(&lines.join("\n")).await;
        let last = next_id;
        let mut seen = 0;
        while seen < 200 {
            let frame = c.frame().await.expect("replies");
            for reply in frame.iter().filter(|r| r.get("id").is_some()) {
                seen += 1;
                match reply["error"]["code"].as_u64() {
                    Some(111) => limited += 1,
                    // Beyond the channel limit: not rate limited.
                    Some(106) => passed += 1,
                    Some(code) => panic!("{code}: {reply}"),
                    None => passed += 1,
                }
                assert!(reply["id"].as_u64().unwrap() <= u64::from(last));
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = 256.0 + 20.0 * (elapsed + 1.0);
    assert!(limited > 0, "none of 600 was limited in {elapsed:.1} s");
    assert!(
        f64::from(passed) <= allowed,
        "{passed} passed in {elapsed:.1} s"
    );
    // The limited answer is temporary, as Centrifugo marks 111.
    let r = c
        .command("history", json!({"channel": "news:r", "limit": 0}))
        .await;
    if r["error"]["code"] == 111 {
        assert_eq!(r["error"]["temporary"], true, "{r}");
    }
}

/// Counts the storage's presence reads.
#[derive(Default)]
struct PresenceReads(AtomicUsize);

#[async_trait::async_trait]
impl herald_testkit::storage::StorageHooks for PresenceReads {
    async fn before_presence(
        &self,
        _channel: &herald_core::ChannelName,
    ) -> herald_storage::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One anonymous connection sending `presence` and `presence_stats` in a
/// loop (each a presence read of the storage, a query on PostgreSQL) is
/// held to the connection's burst (256 at the default `channel_limit`)
/// and rate (20 per second): past them it gets 111, and the storage is
/// read once per answered command, never for a refused one; `sub_refresh`
/// draws on the same bucket.
async fn presence_in_a_loop(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let config = creds.config();
    let config = ServerConfig {
        centrifugo: CentrifugoConfig {
            presence: true,
            anonymous_connect: true,
            ..config.centrifugo.clone()
        },
        ..config
    };
    let reads = Arc::new(PresenceReads::default());
    let hooks = Arc::clone(&reads);
    let node = Node::start_with(&place, "node-a", Role::Holder, config, move |s| {
        herald_testkit::storage::Hooked::wrap(s, hooks)
    })
    .await;
    let (mut c, _) = Client::connect(&node, "").await;
    let started = std::time::Instant::now();
    let mut next_id = 10u32;
    let (mut passed, mut limited) = (0usize, 0usize);
    for _ in 0..3 {
        let lines: Vec<String> = (0..200)
            .map(|i| {
                next_id += 1;
                let method = if i % 2 == 0 {
                    "presence"
                } else {
                    "presence_stats"
                };
                json!({"id": next_id, method: {"channel": "open:p"}}).to_string()
            })
            .collect();
        c.send_text(&lines.join("\n")).await;
        let mut seen = 0;
        while seen < 200 {
            let frame = c.frame().await.expect("replies");
            for reply in frame.iter().filter(|r| r.get("id").is_some()) {
                seen += 1;
                match reply["error"]["code"].as_u64() {
                    Some(111) => {
                        assert_eq!(reply["error"]["temporary"], true, "{reply}");
                        limited += 1;
                    }
                    Some(code) => panic!("{code}: {reply}"),
                    None => passed += 1,
                }
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = 256.0 + 20.0 * (elapsed + 1.0);
    assert!(limited > 0, "none of 600 was limited in {elapsed:.1} s");
    assert!(
        passed as f64 <= allowed,
        "{passed} passed in {elapsed:.1} s"
    );
    assert_eq!(
        reads.0.load(Ordering::SeqCst),
        passed,
        "one presence read per answered command, none for a refused one"
    );
    // `sub_refresh` (a token check) shares the bucket: past it, 111
    // before the token is looked at (103 here: no such subscription).
    let lines: Vec<String> = (0..200)
        .map(|_| {
            next_id += 1;
            json!({"id": next_id, "sub_refresh": {"channel": "open:p", "token": "x"}}).to_string()
        })
        .collect();
    c.send_text(&lines.join("\n")).await;
    let (mut seen, mut limited) = (0, 0);
    while seen < 200 {
        let frame = c.frame().await.expect("replies");
        for reply in frame.iter().filter(|r| r.get("id").is_some()) {
            seen += 1;
            match reply["error"]["code"].as_u64() {
                Some(111) => limited += 1,
                Some(103) => {}
                _ => panic!("{reply}"),
            }
        }
    }
    assert!(limited > 0, "no sub_refresh of 200 was limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_in_a_loop_is_rate_limited_per_connection_on_sqlite() {
    presence_in_a_loop(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_in_a_loop_is_rate_limited_per_connection_on_postgres() {
    presence_in_a_loop(Backend::Postgres).await;
}

/// A `refresh` whose token no longer grants a channel the connection
/// subscribed to on its credentials ends that subscription (an
/// `unsubscribe` push after the reply); the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_with_a_narrower_token_ends_what_it_no_longer_grants() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    let wide = creds.token_for("ann", json!({"channels": ["news:*", "room:*"]}));
    let narrow = creds.token_for("ann", json!({"channels": ["room:*"]}));
    let (mut c, _) = Client::connect(&node, &wide).await;
    for channel in ["news:a", "room:a"] {
        let r = c.command("subscribe", json!({"channel": channel})).await;
        assert!(r["subscribe"].is_object(), "{r}");
    }
    let r = c.command("refresh", json!({"token": narrow})).await;
    assert_eq!(r["refresh"]["expires"], true, "{r}");
    let push = c.push().await;
    assert_eq!(push["channel"], "news:a", "{push}");
    assert_eq!(push["unsubscribe"]["code"], 2000, "{push}");
    // news:a's publications no longer arrive; room:a's do.
    node.publish_with("news:a", &key, json!("secret")).await;
    node.publish_with("room:a", &key, json!("open")).await;
    let push = c.push().await;
    assert_eq!(push["channel"], "room:a", "{push}");
    assert_eq!(push["pub"]["data"], "open");
    // Subscribing again is refused.
    let r = c.command("subscribe", json!({"channel": "news:a"})).await;
    assert_eq!(r["error"]["code"], 103, "{r}");
}

/// `refresh` with an expired connection token closes with 3005 and
/// `sub_refresh` with an expired subscription token with 3006, as
/// Centrifugo does (an error 109 made centrifuge-js give up for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refreshing_with_an_expired_token_closes_with_the_expiry_code() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let live = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let expired = creds.token(json!({"sub": "ann", "exp": now_s() - 10, "channels": ["news:*"]}));

    let (mut c, _) = Client::connect(&node, &live).await;
    c.send_text(&json!({"id": 9, "refresh": {"token": expired}}).to_string())
        .await;
    assert_eq!(c.closed_with().await, Some(3005));

    let sub = creds.token_for("ann", json!({"channel": "news:s"}));
    let expired_sub = creds.token(json!({"sub": "ann", "exp": now_s() - 10, "channel": "news:s"}));
    let (mut c, _) = Client::connect(&node, &live).await;
    let r = c
        .command("subscribe", json!({"channel": "news:s", "token": sub}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    c.send_text(
        &json!({"id": 9, "sub_refresh": {"channel": "news:s", "token": expired_sub}}).to_string(),
    )
    .await;
    assert_eq!(c.closed_with().await, Some(3006));
}
