//! Forwarding with access control: a standby checks the client's
//! credentials itself and forwards with the cluster secret; the holder
//! trusts a forwarded publish only with the right secret.

use herald_auth::Secret;
use herald_server::ServerConfig;
use serde_json::json;

use crate::{assert_refused, get, on_both_backends, publish_as, Backend, Creds, Node, Place, Role};

async fn forwarding(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    let key = Creds::bearer(&creds.publisher);
    let reader = Creds::bearer(&creds.reader);
    let as_reader = [("authorization", reader.as_str())];

    // Through the standby: the key is checked there, the publish lands on
    // the holder.
    let ok = publish_as(&standby, "news:f", &key, json!(1)).await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    assert_eq!(ok.2["offset"], 1);
    let history = get(&holder, "/v1/channels/news:f/messages", &as_reader).await;
    assert_eq!(history.2["head"], 1, "{}", history.2);
    // The standby refuses by itself what the client may not do.
    assert_refused(
        &standby.publish_with("news:f", &[], json!(2)).await,
        401,
        "unauthorized",
    );
    assert_refused(
        &standby.publish_with("news:f", &as_reader, json!(2)).await,
        403,
        "forbidden",
    );

    // At the holder: a forwarded request without the secret, or with a
    // wrong one, is refused, even with a valid client key (the forward
    // marker needs the secret); with the right one it is trusted.
    let forwarded: [&[(&str, &str)]; 3] = [
        &[("herald-forwarded-by", "node-x")],
        &[
            ("herald-forwarded-by", "node-x"),
            ("herald-cluster-secret", "not-the-secret"),
        ],
        &[
            ("herald-forwarded-by", "node-x"),
            ("authorization", key.as_str()),
        ],
    ];
    for headers in forwarded {
        assert_refused(
            &holder.publish_with("news:f", headers, json!(2)).await,
            401,
            "unauthorized",
        );
    }
    let right = [
        ("herald-forwarded-by", "node-x"),
        ("herald-cluster-secret", creds.cluster_secret.as_str()),
    ];
    assert_eq!(holder.publish_with("news:f", &right, json!(2)).await.0, 201);

    // A standby configured with another cluster secret: the holder refuses
    // its forwards, and the client gets that 401.
    let mut other = creds.config();
    other.auth.cluster_secret = Some(Secret::new("another-cluster-secret-0123456789"));
    let stranger = Node::start(&place, "node-c", Role::Standby, ServerConfig { ..other }).await;
    assert_refused(
        &publish_as(&stranger, "news:f", &key, json!(3)).await,
        401,
        "unauthorized",
    );
    let history = get(&holder, "/v1/channels/news:f/messages", &as_reader).await;
    assert_eq!(
        history.2["head"], 2,
        "refused forwards stored nothing: {}",
        history.2
    );
}

on_both_backends!(
    forwarding: forwarding_needs_the_cluster_secret_on_sqlite,
    forwarding_needs_the_cluster_secret_on_postgres
);

/// The head and earliest offset of `channel` on `node`, read with the
/// `Authorization` value `reader`.
async fn head(node: &Node, channel: &str, reader: &str) -> (u64, u64) {
    let path = format!("/v1/channels/{channel}/messages");
    let (status, _, body) = get(node, &path, &[("authorization", reader)]).await;
    assert_eq!(status, 200, "{body}");
    (
        body["head"].as_u64().unwrap(),
        body["earliest"].as_u64().unwrap(),
    )
}

/// Every write only the holder makes, sent to the standby as a client
/// behind a load balancer would: each is checked there and forwarded once
/// to the holder, whose answer comes back (`DELETE /v1/channels/{c}`, a
/// batch publish, Centrifugo's server API `publish`, `broadcast` and
/// `history_remove`); a refusal the standby makes by itself names the
/// request.
async fn every_holder_write_through_the_standby(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    let admin = Creds::bearer(&creds.admin);
    let as_admin = [("authorization", admin.as_str())];
    let publisher = Creds::bearer(&creds.publisher);
    let as_publisher = [("authorization", publisher.as_str())];
    let reader = Creds::bearer(&creds.reader);
    // A batch publish.
    let batch = json!({"messages": [
        {"channel": "news:d", "data": 1},
        {"channel": "news:d", "data": 2},
        {"channel": "news:e", "data": 3},
    ]});
    let (status, _, body) = standby
        .call("POST", "/v1/messages", &as_publisher, Some(batch))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(head(&holder, "news:d", &reader).await, (2, 1));

    // A channel's deletion: refused by the standby itself without admin,
    // then forwarded; the holder's answer comes back.
    assert_refused(
        &standby
            .call("DELETE", "/v1/channels/news:d", &as_publisher, None)
            .await,
        403,
        "forbidden",
    );
    assert_refused(
        &standby
            .call("DELETE", "/v1/channels/news:d", &[], None)
            .await,
        401,
        "unauthorized",
    );
    let (status, _, body) = standby
        .call("DELETE", "/v1/channels/news:d", &as_admin, None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"channel": "news:d", "head": 2, "earliest": 3}));
    assert_eq!(head(&holder, "news:d", &reader).await, (2, 3));

    // Centrifugo's server API: publish, broadcast, history_remove.
    let api = |method: &'static str, body: serde_json::Value| {
        let standby = &standby;
        let key = creds.backend.clone();
        async move {
            let (status, _, answer) = standby
                .call(
                    "POST",
                    &format!("/api/{method}"),
                    &[("x-api-key", key.as_str())],
                    Some(body),
                )
                .await;
            assert_eq!(status, 200, "{method}: {answer}");
            assert!(answer.get("error").is_none(), "{method}: {answer}");
            answer
        }
    };
    let published = api("publish", json!({"channel": "news:e", "data": 4})).await;
    assert_eq!(published["result"]["offset"], 2, "{published}");
    let broadcast = api(
        "broadcast",
        json!({"channels": ["news:e", "news:f"], "data": 5}),
    )
    .await;
    assert_eq!(
        broadcast["result"]["responses"][1]["result"]["offset"], 1,
        "{broadcast}"
    );
    assert_eq!(head(&holder, "news:e", &reader).await, (3, 1));
    api("history_remove", json!({"channel": "news:e"})).await;
    assert_eq!(head(&holder, "news:e", &reader).await, (3, 4));

    // A deletion another node forwarded already reaches a standby: it is
    // not forwarded again, and the refusal names the request.
    let secret = creds.cluster_secret.clone();
    let forwarded = [
        ("herald-forwarded-by", "node-x"),
        ("herald-cluster-secret", secret.as_str()),
    ];
    let refused = standby
        .call("DELETE", "/v1/channels/news:e", &forwarded, None)
        .await;
    assert_refused(&refused, 503, "not_holder");
    let message = refused.2["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("deleting channel news:e needs the holder"),
        "{message}"
    );
    assert_eq!(refused.2["error"]["holder_url"], holder.base);
    let refused = standby
        .call(
            "POST",
            "/v1/messages",
            &forwarded,
            Some(json!({"messages": [{"channel": "news:e", "data": 1}]})),
        )
        .await;
    assert_refused(&refused, 503, "not_holder");
    let message = refused.2["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("a batch publish needs the holder"),
        "{message}"
    );
    standby.stop().await;
    holder.stop().await;
}

on_both_backends!(
    every_holder_write_through_the_standby:
        every_holder_write_is_forwarded_by_a_standby_on_sqlite,
    every_holder_write_is_forwarded_by_a_standby_on_postgres
);
