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

on_both_backends!(streams_follow_channel_rights: stream_rights_on_sqlite, stream_rights_on_postgres);
