//! Access control of the Durable Streams wing: the stream's channel
//! decides, with the same keys and tokens (docs/security.md): creating,
//! appending, closing and deleting need the right to publish to it;
//! reading its content the right to read its history; live reads the right
//! to subscribe.

use crate::{on_both_backends, Backend, Creds, Node, Place, Role};

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
    let mut config = creds.config();
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
    // (namespace `room`, history off) follows from now only.
    assert_eq!(
        send(
            &node,
            "PUT",
            "/ds/room/r",
            &[("authorization", publisher.as_str()), text],
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
    let publisher = Creds::bearer(&creds.publisher);
    let text = ("content-type", "text/plain");
    let write = [("authorization", publisher.as_str()), text];
    // `Stream-TTL: 0`: expired as soon as created.
    let expiring = [
        ("authorization", publisher.as_str()),
        text,
        ("stream-ttl", "0"),
    ];
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
    let publisher = Creds::bearer(&creds.publisher);
    // Subscribed before the stream exists: it sees it live, then its end.
    let url = node.url("/v1/channels/open:swept/events");
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    // The smallest TTL that lets the stream be live first: 1 s.
    let expiring = [
        ("authorization", publisher.as_str()),
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
