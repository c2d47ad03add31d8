//! Access control of the Durable Streams wing: the stream's channel
//! decides, with the same keys and tokens (docs/security.md): appending
//! needs the right to publish to it; creating, closing and deleting that
//! too, and `admin` unless the namespace has `streams = true`; reading its
//! content the right to read its history; live reads the right to
//! subscribe. Creations and forks count against the publish rate, forks
//! are bounded, and a fork never pins its source.

use herald_auth::{api_key_sha256, generate_api_key, ApiKeyConfig, NamespaceRule, Permission};
use herald_server::ServerConfig;
use serde_json::Value;

use crate::{on_both_backends, Backend, Creds, Node, Place, Role};

/// The keys these tests add to [`Creds`].
struct StreamKeys {
    /// `publish` and `read` on `news:*`, no rate limit.
    forker: String,
    /// `publish` and `read` on `news:*`, 3 at once then one per 1000 s.
    slow: String,
}

/// [`Creds::config`] with `streams = true` in the namespace `news` (and
/// its other rules the default ones), and the keys of [`StreamKeys`].
fn streams_config(creds: &Creds) -> (ServerConfig, StreamKeys) {
    let mut config = creds.config();
    config.namespaces.insert(
        "news".to_owned(),
        NamespaceRule {
            streams: Some(true),
            ..NamespaceRule::default()
        },
    );
    let keys = StreamKeys {
        forker: generate_api_key(),
        slow: generate_api_key(),
    };
    for (name, key, rate) in [
        ("forker", &keys.forker, None),
        ("slow", &keys.slow, Some(0.001)),
    ] {
        config.auth.api_keys.push(ApiKeyConfig {
            name: name.to_owned(),
            sha256: api_key_sha256(key),
            permissions: vec![Permission::Publish, Permission::Read],
            channels: Some(vec!["news:*".to_owned()]),
            publish_rate_per_s: rate,
            publish_burst: rate.map(|_| 3),
        });
    }
    (config, keys)
}

/// Sends a request; returns its status and its body (JSON, or a JSON
/// string when it is not JSON).
async fn answer(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = node
        .client
        .request(method, node.url(path))
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("a request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("an answer's body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A Durable Streams offset of this server for the Herald offset `n`.
fn ds_offset(n: u64) -> String {
    format!("{:016}_{n:016}", 0)
}

async fn send(node: &Node, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> u16 {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = node
        .client
        .request(method, node.url(path))
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("a request").status().as_u16()
}

async fn streams_follow_channel_rights(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let (mut config, _) = streams_config(&creds);
    // A long-poll with nothing new answers 204 after this.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_millis(100);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let publisher = Creds::bearer(&creds.publisher);
    let reader = Creds::bearer(&creds.reader);
    let text = ("content-type", "text/plain");
    let as_publisher = [("authorization", publisher.as_str()), text];
    let as_reader = [("authorization", reader.as_str()), text];

    // Anonymous: nothing at all.
    assert_eq!(send(&node, "PUT", "/ds/news/s", &[text], b"").await, 401);
    assert_eq!(send(&node, "GET", "/ds/news/s", &[], b"").await, 401);
    // The publisher key (publish on news:*) creates and appends there only.
    assert_eq!(
        send(&node, "PUT", "/ds/news/s", &as_publisher, b"a").await,
        201
    );
    assert_eq!(
        send(&node, "POST", "/ds/news/s", &as_publisher, b"b").await,
        204
    );
    assert_eq!(
        send(&node, "PUT", "/ds/keyonly/s", &as_publisher, b"a").await,
        403
    );
    // The reader key (read on news:*) reads, and writes nothing.
    assert_eq!(
        send(&node, "GET", "/ds/news/s?offset=-1", &as_reader, b"").await,
        200
    );
    assert_eq!(
        send(&node, "HEAD", "/ds/news/s", &as_reader, b"").await,
        200
    );
    assert_eq!(
        send(&node, "POST", "/ds/news/s", &as_reader, b"c").await,
        403
    );
    assert_eq!(
        send(&node, "DELETE", "/ds/news/s", &as_reader, b"").await,
        403
    );
    // A token that may subscribe to room:* but not read its history
    // (namespace `room`, history off) follows from now only. (Streams
    // there are an admin's.)
    let backend = Creds::bearer(&creds.backend);
    assert_eq!(
        send(
            &node,
            "PUT",
            "/ds/room/r",
            &[("authorization", backend.as_str()), text],
            b"old"
        )
        .await,
        201
    );
    let token = Creds::bearer(&creds.token_for("u1", serde_json::json!({"channels": ["room:r"]})));
    let as_token = [("authorization", token.as_str())];
    assert_eq!(
        send(
            &node,
            "GET",
            "/ds/room/r?offset=now&live=long-poll",
            &as_token,
            b""
        )
        .await,
        204
    );
    assert_eq!(
        send(
            &node,
            "GET",
            "/ds/room/r?offset=-1&live=long-poll",
            &as_token,
            b""
        )
        .await,
        403
    );
    assert_eq!(
        send(&node, "GET", "/ds/room/r?offset=-1", &as_token, b"").await,
        403
    );
    // A channel written through Herald's API becomes a stream only with
    // `admin`: its writers could then delete it.
    let ok = node
        .publish_with(
            "news:plain",
            &[("authorization", publisher.as_str())],
            serde_json::json!(1),
        )
        .await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    let json = ("content-type", "application/json");
    assert_eq!(
        send(
            &node,
            "PUT",
            "/ds/news/plain",
            &[("authorization", publisher.as_str()), json],
            b""
        )
        .await,
        403
    );
    // The backend key may publish there and is `admin`.
    let admin = Creds::bearer(&creds.backend);
    assert_eq!(
        send(
            &node,
            "PUT",
            "/ds/news/plain",
            &[("authorization", admin.as_str()), json],
            b""
        )
        .await,
        201
    );
    // Appends count against the publish rate: the `limited` key has a
    // burst of 3.
    let limited = Creds::bearer(&creds.limited);
    let as_limited = [("authorization", limited.as_str()), text];
    for _ in 0..3 {
        assert_eq!(
            send(&node, "POST", "/ds/news/s", &as_limited, b"r").await,
            204
        );
    }
    assert_eq!(
        send(&node, "POST", "/ds/news/s", &as_limited, b"r").await,
        429
    );
    // Refused writes changed nothing.
    let head = node.head("news:s").await;
    assert_eq!(head, 5);
    assert_eq!(
        send(&node, "DELETE", "/ds/news/s", &as_publisher, b"").await,
        204
    );
}

/// What a reader gets of `channel` on every read path but the Durable
/// Streams wing: Herald's history, the first event of Herald's SSE from
/// the start, Centrifugo's history (server API) and a Centrifugo
/// subscription recovering from the start.
async fn reads_of(node: &Node, creds: &Creds, channel: &str) -> Vec<serde_json::Value> {
    use herald_testkit::sse::SseClient;
    use herald_testkit::{within, NODE_WAIT};
    use serde_json::json;

    let backend = Creds::bearer(&creds.backend);
    let (status, _, history) = node
        .call(
            "GET",
            &format!("/v1/channels/{channel}/messages"),
            &[("authorization", backend.as_str())],
            None,
        )
        .await;
    assert_eq!(status, 200, "{history}");
    let url = node.url(&format!("/v1/channels/{channel}/events?after=0"));
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    let first = within("the first SSE event", NODE_WAIT, sse.next_event())
        .await
        .expect("an event");
    let api = crate::centrifugo::api(
        node,
        "history",
        &creds.backend,
        json!({"channel": channel, "limit": 10}),
    )
    .await;
    let token = creds.token_for("u1", json!({"channels": ["open:*"]}));
    let (mut client, _) = crate::centrifugo::client::Client::connect(node, &token).await;
    let epoch = api["result"]["epoch"].clone();
    let subscribed = client
        .command(
            "subscribe",
            json!({"channel": channel, "recover": true, "epoch": epoch, "offset": 0}),
        )
        .await;
    let subscribed = &subscribed["subscribe"];
    vec![
        json!({"messages": history["messages"], "earliest": history["earliest"]}),
        json!({"event": first.event, "data": first.data}),
        json!({"publications": api["result"]["publications"], "offset": api["result"]["offset"]}),
        json!({"recovered": subscribed["recovered"], "publications": subscribed["publications"]}),
    ]
}

/// A stream whose TTL has passed reads, through Herald's API and
/// Centrifugo, as a deleted stream does, before any sweep deletes it.
async fn expired_streams_read_as_deleted(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    // No sweep during the test: what is checked is the read.
    config.trim_pacing.interval = std::time::Duration::from_secs(3600);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    // Streams in `open:` are an admin's to create and delete.
    let owner = Creds::bearer(&creds.backend);
    let text = ("content-type", "text/plain");
    let write = [("authorization", owner.as_str()), text];
    // `Stream-TTL: 0`: expired as soon as created.
    let expiring = [("authorization", owner.as_str()), text, ("stream-ttl", "0")];
    assert_eq!(
        send(&node, "PUT", "/ds/open/gone", &expiring, b"secret").await,
        201
    );
    let backend_key = Creds::bearer(&creds.backend);
    let as_backend = [("authorization", backend_key.as_str())];
    assert_eq!(
        send(&node, "HEAD", "/ds/open/gone", &as_backend, b"").await,
        404
    );
    assert_eq!(
        send(&node, "PUT", "/ds/open/deleted", &write, b"secret").await,
        201
    );
    assert_eq!(
        send(&node, "DELETE", "/ds/open/deleted", &write, b"").await,
        204
    );
    assert_eq!(
        send(&node, "PUT", "/ds/open/kept", &write, b"secret").await,
        201
    );

    let expired = reads_of(&node, &creds, "open:gone").await;
    let deleted = reads_of(&node, &creds, "open:deleted").await;
    let kept = reads_of(&node, &creds, "open:kept").await;
    assert_eq!(expired, deleted);
    assert_eq!(expired[0]["messages"], serde_json::json!([]), "{expired:?}");
    assert_ne!(kept, deleted, "a live stream is read: {kept:?}");
}

/// The holder's sweep deletes an expired stream as any channel is
/// deleted: its messages go, and its live subscribers get `deleted`.
async fn expired_streams_are_swept(backend: Backend) {
    use herald_testkit::sse::SseClient;
    use herald_testkit::{within, NODE_WAIT};

    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    config.trim_pacing.interval = std::time::Duration::from_millis(100);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    // Streams in `open:` are an admin's to create and delete.
    let owner = Creds::bearer(&creds.backend);
    // Subscribed before the stream exists: it sees it live, then its end.
    let url = node.url("/v1/channels/open:swept/events");
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    // The smallest TTL that lets the stream be live first: 1 s.
    let expiring = [
        ("authorization", owner.as_str()),
        ("content-type", "text/plain"),
        ("stream-ttl", "1"),
    ];
    assert_eq!(
        send(&node, "PUT", "/ds/open/swept", &expiring, b"secret").await,
        201
    );
    let mut events = Vec::new();
    within("the deleted event", NODE_WAIT, async {
        while let Some(event) = sse.next_event().await {
            let last = event.event.as_deref() == Some("deleted");
            events.push(event);
            if last {
                break;
            }
        }
    })
    .await;
    assert_eq!(
        events.last().and_then(|e| e.event.as_deref()),
        Some("deleted"),
        "{events:?}"
    );
    assert!(node.stored("open:swept").await.is_empty());
}

on_both_backends!(streams_follow_channel_rights: stream_rights_on_sqlite, stream_rights_on_postgres);
on_both_backends!(
    expired_streams_read_as_deleted: expired_streams_read_as_deleted_on_sqlite,
    expired_streams_read_as_deleted_on_postgres
);
on_both_backends!(
    expired_streams_are_swept: expired_streams_are_swept_on_sqlite,
    expired_streams_are_swept_on_postgres
);

/// The right to publish does not give a stream's lifecycle: outside a
/// namespace with `streams = true`, a publisher may not make a channel a
/// stream (which it could then close, refusing every `/v1` and Centrifugo
/// publish, or delete with everyone's messages), close one or delete one;
/// it still appends. An `admin` key may; in `news` (`streams = true`) the
/// publisher may too.
async fn stream_lifecycle_is_a_right_of_its_own(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let (config, _) = streams_config(&creds);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let publisher = Creds::bearer(&creds.publisher);
    let admin = Creds::bearer(&creds.backend);
    let json = ("content-type", "application/json");
    let as_publisher = [("authorization", publisher.as_str()), json];
    let as_admin = [("authorization", admin.as_str()), json];
    let closing = [
        ("authorization", publisher.as_str()),
        ("stream-closed", "true"),
    ];

    // `open:*` takes the publisher's publishes, not its streams.
    let refused = answer(&node, "PUT", "/ds/open/taken", &as_publisher, b"").await;
    assert_eq!(refused.0, 403, "{}", refused.1);
    assert_eq!(refused.1["error"]["code"], "forbidden", "{}", refused.1);
    let ok = node
        .publish_with(
            "open:taken",
            &[("authorization", publisher.as_str())],
            serde_json::json!(1),
        )
        .await;
    assert_eq!(ok.0, 201, "the channel is still everyone's: {}", ok.2);
    // A stream there is an admin's; its publishers append, no more.
    assert_eq!(
        answer(&node, "PUT", "/ds/open/s", &as_admin, b"").await.0,
        201
    );
    assert_eq!(
        answer(&node, "POST", "/ds/open/s", &as_publisher, b"[1]")
            .await
            .0,
        204
    );
    assert_eq!(
        answer(&node, "POST", "/ds/open/s", &closing, b"").await.0,
        403
    );
    assert_eq!(
        answer(&node, "DELETE", "/ds/open/s", &as_publisher, b"")
            .await
            .0,
        403
    );
    assert_eq!(
        node.stored("open:s").await.len(),
        1,
        "nothing was closed or deleted"
    );
    let open = node
        .publish_with(
            "open:s",
            &[("authorization", publisher.as_str())],
            serde_json::json!(2),
        )
        .await;
    assert_eq!(open.0, 201, "the stream is not closed: {}", open.2);
    assert_eq!(
        answer(&node, "DELETE", "/ds/open/s", &as_admin, b"")
            .await
            .0,
        204
    );
    // Where the namespace says streams = true, publishers manage them.
    assert_eq!(
        answer(&node, "PUT", "/ds/news/own", &as_publisher, b"")
            .await
            .0,
        201
    );
    let close_own = [
        ("authorization", publisher.as_str()),
        ("stream-closed", "true"),
    ];
    assert_eq!(
        answer(&node, "POST", "/ds/news/own", &close_own, b"")
            .await
            .0,
        204
    );
    assert_eq!(
        answer(&node, "DELETE", "/ds/news/own", &as_publisher, b"")
            .await
            .0,
        204
    );
}

on_both_backends!(stream_lifecycle_is_a_right_of_its_own: stream_lifecycle_on_sqlite, stream_lifecycle_on_postgres);

/// A creation's messages, and a fork's copies, count against the caller's
/// publish rate, one per message, as appends do: a key with a burst of 3
/// writes no 4 messages in a `PUT`, and copies no 4 in a fork. Refused,
/// nothing is created.
async fn creations_and_forks_count_against_the_publish_rate(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let (config, keys) = streams_config(&creds);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let slow = Creds::bearer(&keys.slow);
    let admin = Creds::bearer(&creds.backend);
    let json = ("content-type", "application/json");
    let as_slow = [("authorization", slow.as_str()), json];
    let as_admin = [("authorization", admin.as_str()), json];

    let many = answer(&node, "PUT", "/ds/news/many", &as_slow, b"[1,2,3,4]").await;
    assert_eq!(many.0, 429, "{}", many.1);
    assert_eq!(
        answer(&node, "HEAD", "/ds/news/many", &as_slow, b"")
            .await
            .0,
        404
    );
    assert_eq!(
        answer(&node, "PUT", "/ds/news/src", &as_admin, b"[1,2,3,4]")
            .await
            .0,
        201
    );
    let fork = [
        ("authorization", slow.as_str()),
        json,
        ("stream-forked-from", "/ds/news/src"),
    ];
    let copied = answer(&node, "PUT", "/ds/news/copy", &fork, b"").await;
    assert_eq!(copied.0, 429, "{}", copied.1);
    assert_eq!(
        answer(&node, "HEAD", "/ds/news/copy", &as_slow, b"")
            .await
            .0,
        404
    );
    // Within the burst: three messages, then none left.
    assert_eq!(
        answer(&node, "PUT", "/ds/news/few", &as_slow, b"[1,2,3]")
            .await
            .0,
        201
    );
    assert_eq!(
        answer(&node, "PUT", "/ds/news/more", &as_slow, b"[1]")
            .await
            .0,
        429
    );
}

on_both_backends!(creations_and_forks_count_against_the_publish_rate: creation_rate_on_sqlite, creation_rate_on_postgres);

/// A fork copies at most `max_fork_messages` messages and
/// `max_fork_bytes` bytes (413 `fork_too_large`, naming the setting), and
/// a stream has at most `max_forks_per_source` live forks (409).
async fn forks_are_bounded(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let (mut config, keys) = streams_config(&creds);
    config.durable_streams.max_fork_messages = 2;
    config.durable_streams.max_fork_bytes = 1000;
    config.durable_streams.max_forks_per_source = 2;
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let forker = Creds::bearer(&keys.forker);
    let json = ("content-type", "application/json");
    let as_forker = [("authorization", forker.as_str()), json];
    assert_eq!(
        answer(&node, "PUT", "/ds/news/src", &as_forker, b"[1,2,3]")
            .await
            .0,
        201
    );
    let whole = [
        ("authorization", forker.as_str()),
        ("stream-forked-from", "/ds/news/src"),
    ];
    let large = answer(&node, "PUT", "/ds/news/f1", &whole, b"").await;
    assert_eq!(large.0, 413, "{}", large.1);
    assert_eq!(large.1["error"]["code"], "fork_too_large", "{}", large.1);
    assert!(
        large.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_fork_messages")),
        "{}",
        large.1
    );
    assert_eq!(
        answer(&node, "HEAD", "/ds/news/f1", &as_forker, b"")
            .await
            .0,
        404
    );
    let two = ds_offset(2);
    let part = [
        ("authorization", forker.as_str()),
        ("stream-forked-from", "/ds/news/src"),
        ("stream-fork-offset", two.as_str()),
    ];
    assert_eq!(answer(&node, "PUT", "/ds/news/f1", &part, b"").await.0, 201);
    assert_eq!(node.stored("news:f1").await.len(), 2);
    let big = format!("[\"{}\"]", "x".repeat(2000));
    assert_eq!(
        answer(&node, "PUT", "/ds/news/big", &as_forker, big.as_bytes())
            .await
            .0,
        201
    );
    let heavy = [
        ("authorization", forker.as_str()),
        ("stream-forked-from", "/ds/news/big"),
    ];
    let heavy = answer(&node, "PUT", "/ds/news/f2", &heavy, b"").await;
    assert_eq!(heavy.0, 413, "{}", heavy.1);
    assert!(
        heavy.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_fork_bytes")),
        "{}",
        heavy.1
    );
    assert_eq!(answer(&node, "PUT", "/ds/news/f2", &part, b"").await.0, 201);
    let third = answer(&node, "PUT", "/ds/news/f3", &part, b"").await;
    assert_eq!(third.0, 409, "{}", third.1);
    assert!(
        third.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_forks_per_source")),
        "{}",
        third.1
    );
    // A deleted fork frees its place.
    assert_eq!(
        answer(&node, "DELETE", "/ds/news/f2", &as_forker, b"")
            .await
            .0,
        204
    );
    assert_eq!(answer(&node, "PUT", "/ds/news/f3", &part, b"").await.0, 201);
}

on_both_backends!(forks_are_bounded: forks_are_bounded_on_sqlite, forks_are_bounded_on_postgres);

/// A reader that forks a stream (even at offset 0, copying nothing) does
/// not keep it: its owner's `DELETE` removes its messages (no longer
/// readable through `/v1` history), the owner creates it again at once,
/// and the fork lives on with its own copy.
async fn a_fork_does_not_pin_its_source(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let (config, keys) = streams_config(&creds);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let owner = Creds::bearer(&creds.publisher);
    let forker = Creds::bearer(&keys.forker);
    let reader = Creds::bearer(&creds.reader);
    let text = ("content-type", "text/plain");
    let as_owner = [("authorization", owner.as_str()), text];
    let as_forker = [("authorization", forker.as_str())];
    assert_eq!(
        answer(&node, "PUT", "/ds/news/mine", &as_owner, b"secret")
            .await
            .0,
        201
    );
    let zero = ds_offset(0);
    let one = ds_offset(1);
    for (fork, at) in [
        ("/ds/news/pin", zero.as_str()),
        ("/ds/news/copy", one.as_str()),
    ] {
        let headers = [
            ("authorization", forker.as_str()),
            ("stream-forked-from", "/ds/news/mine"),
            ("stream-fork-offset", at),
        ];
        assert_eq!(
            answer(&node, "PUT", fork, &headers, b"").await.0,
            201,
            "{fork}"
        );
    }
    assert_eq!(
        answer(&node, "DELETE", "/ds/news/mine", &as_owner, b"")
            .await
            .0,
        204
    );
    let history = node
        .call(
            "GET",
            "/v1/channels/news:mine/messages",
            &[("authorization", reader.as_str())],
            None,
        )
        .await;
    assert_eq!(
        history.2["messages"].as_array().map(Vec::len),
        Some(0),
        "the deleted messages are gone: {}",
        history.2
    );
    assert_eq!(
        answer(&node, "PUT", "/ds/news/mine", &as_owner, b"")
            .await
            .0,
        201
    );
    assert_eq!(
        answer(&node, "HEAD", "/ds/news/pin", &as_forker, b"")
            .await
            .0,
        200
    );
    let copy = answer(&node, "GET", "/ds/news/copy?offset=-1", &as_forker, b"").await;
    assert_eq!(copy, (200, Value::String("secret".to_owned())));
}

on_both_backends!(a_fork_does_not_pin_its_source: fork_does_not_pin_on_sqlite, fork_does_not_pin_on_postgres);

/// A fork or a conversion sent to a standby is decided with the client's
/// rights, not the cluster's: a fork of a stream its client may read (in a
/// namespace that is not public) and an admin's conversion succeed through
/// the standby; a publisher's conversion is refused there, and the header
/// that carries the standby's decision is believed of forwarded requests
/// only.
async fn rights_of_forwarded_forks_and_conversions(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let (config, keys) = streams_config(&creds);
    let holder = Node::start(&place, "node-a", Role::Holder, config.clone()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, config).await;
    let forker = Creds::bearer(&keys.forker);
    let publisher = Creds::bearer(&creds.publisher);
    let admin = Creds::bearer(&creds.backend);
    let json = ("content-type", "application/json");
    let as_forker = [("authorization", forker.as_str()), json];
    assert_eq!(
        answer(&standby, "PUT", "/ds/news/src", &as_forker, b"[1,2]")
            .await
            .0,
        201
    );
    let fork = [
        ("authorization", forker.as_str()),
        ("stream-forked-from", "/ds/news/src"),
    ];
    let forked = answer(&standby, "PUT", "/ds/news/fork", &fork, b"").await;
    assert_eq!(forked.0, 201, "{}", forked.1);
    assert_eq!(holder.stored("news:fork").await.len(), 2);
    // A channel written through Herald's API.
    let ok = holder
        .publish_with(
            "news:plain",
            &[("authorization", publisher.as_str())],
            serde_json::json!(1),
        )
        .await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    let spoofed = [
        ("authorization", publisher.as_str()),
        json,
        ("herald-forwarded-may-convert", "1"),
    ];
    for node in [&standby, &holder] {
        let refused = answer(node, "PUT", "/ds/news/plain", &spoofed, b"").await;
        assert_eq!(refused.0, 403, "{}", refused.1);
    }
    let as_admin = [("authorization", admin.as_str()), json];
    let converted = answer(&standby, "PUT", "/ds/news/plain", &as_admin, b"").await;
    assert_eq!(converted.0, 201, "{}", converted.1);
}

on_both_backends!(rights_of_forwarded_forks_and_conversions: forwarded_stream_rights_on_sqlite, forwarded_stream_rights_on_postgres);
