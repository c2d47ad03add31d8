//! API keys: each permission allowed and refused, on publish, batch,
//! history, SSE, WebSocket and the admin routes.

use herald_testkit::sse::SseClient;
use herald_testkit::ws::ws_next;
use serde_json::json;

use crate::{assert_refused, get, on_both_backends, Backend, Creds, Node, Place, Role};

async fn each_permission_is_allowed_and_refused(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let reader = Creds::bearer(&creds.reader);
    let admin = Creds::bearer(&creds.admin);
    let as_publisher = [("authorization", publisher.as_str())];
    let as_reader = [("authorization", reader.as_str())];
    let as_admin = [("authorization", admin.as_str())];

    // Publish: the publisher key, by either header.
    let ok = node.publish_with("news:a", &as_publisher, json!(1)).await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    let ok = node
        .publish_with(
            "news:a",
            &[("x-api-key", creds.publisher.as_str())],
            json!(2),
        )
        .await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    // No credentials: 401 with the bare challenge.
    let none = node.publish_with("news:a", &[], json!(3)).await;
    assert_refused(&none, 401, "unauthorized");
    assert_eq!(none.1["www-authenticate"], r#"Bearer realm="herald""#);
    // A wrong key: 401 invalid_token.
    let wrong = node
        .publish_with("news:a", &[("authorization", "Bearer nope")], json!(3))
        .await;
    assert_refused(&wrong, 401, "unauthorized");
    assert!(wrong.1["www-authenticate"]
        .to_str()
        .unwrap()
        .contains(r#"error="invalid_token""#));
    // A key without publish, or not for this channel: 403.
    assert_refused(
        &node.publish_with("news:a", &as_reader, json!(3)).await,
        403,
        "forbidden",
    );
    assert_refused(
        &node.publish_with("other", &as_publisher, json!(3)).await,
        403,
        "forbidden",
    );

    // A batch: every entry's channel must be allowed; nothing is stored
    // otherwise.
    let batch = json!({"messages": [
        {"channel": "news:b", "data": 1},
        {"channel": "other", "data": 2},
    ]});
    let refused = node
        .call("POST", "/v1/messages", &as_publisher, Some(batch))
        .await;
    assert_refused(&refused, 403, "forbidden");
    assert!(
        refused.2["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[1]: "),
        "{}",
        refused.2
    );
    let allowed = json!({"messages": [{"channel": "news:b", "data": 1}]});
    let ok = node
        .call("POST", "/v1/messages", &as_publisher, Some(allowed.clone()))
        .await;
    assert_eq!(ok.0, 201, "{}", ok.2);
    assert_refused(
        &node.call("POST", "/v1/messages", &[], Some(allowed)).await,
        401,
        "unauthorized",
    );

    // History: the reader key.
    let history = get(&node, "/v1/channels/news:a/messages", &as_reader).await;
    assert_eq!(history.0, 200, "{}", history.2);
    assert_eq!(history.2["head"], 2, "the refused publishes stored nothing");
    let batch_history = get(&node, "/v1/channels/news:b/messages", &as_reader).await;
    assert_eq!(
        batch_history.2["head"], 1,
        "the refused batch stored nothing"
    );
    assert_refused(
        &get(&node, "/v1/channels/news:a/messages", &as_publisher).await,
        403,
        "forbidden",
    );
    assert_refused(
        &get(&node, "/v1/channels/news:a/messages", &[]).await,
        401,
        "unauthorized",
    );

    // SSE: the reader key.
    let url = format!("{}/v1/channels/news:a/events", node.base);
    let mut sse = SseClient::open(&node.client, &url, &[("authorization", &reader)])
        .await
        .unwrap();
    assert_eq!(sse.status, 200);
    assert_eq!(sse.expect_message().await.0, 1);
    let refused = SseClient::open(&node.client, &url, &[("authorization", &publisher)])
        .await
        .unwrap();
    assert_eq!(refused.status, 403);
    let refused = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(refused.status, 401);

    // WebSocket: the reader key.
    let mut ws = node
        .ws("/v1/channels/news:a/ws", &[("x-api-key", &creds.reader)])
        .await
        .unwrap();
    let mut closed = None;
    assert_eq!(ws_next(&mut ws, &mut closed).await.unwrap()["offset"], 1);
    assert_eq!(
        node.ws("/v1/channels/news:a/ws", &[("x-api-key", &creds.publisher)])
            .await
            .err(),
        Some(403)
    );
    assert_eq!(
        node.ws("/v1/channels/news:a/ws", &[("x-api-key", "nope")])
            .await
            .err(),
        Some(401)
    );

    // Admin routes: the admin key only.
    for path in [
        "/v1/channels",
        "/metrics",
        "/v1/admin/cluster",
        "/v1/admin/channels",
        "/v1/admin/rates",
    ] {
        assert_eq!(get(&node, path, &as_admin).await.0, 200, "{path}");
        assert_refused(&get(&node, path, &as_reader).await, 403, "forbidden");
        assert_refused(&get(&node, path, &[]).await, 401, "unauthorized");
    }
    // The console's event stream: refused before it starts.
    assert_refused(
        &get(&node, "/v1/admin/cluster/events", &as_reader).await,
        403,
        "forbidden",
    );
    assert_refused(
        &get(&node, "/v1/admin/cluster/events", &[]).await,
        401,
        "unauthorized",
    );
    // Deleting a channel is an admin route too; a refusal deletes nothing.
    assert_refused(
        &node
            .call("DELETE", "/v1/channels/news:a", &as_reader, None)
            .await,
        403,
        "forbidden",
    );
    assert_refused(
        &node.call("DELETE", "/v1/channels/news:a", &[], None).await,
        401,
        "unauthorized",
    );
    let (status, _, page) = get(&node, "/v1/channels/news:a/messages", &as_reader).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(2), "{page}");
    let (status, _, deleted) = node
        .call("DELETE", "/v1/channels/news:a", &as_admin, None)
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["head"], 2, "{deleted}");
    // Status: details for the admin key, a summary for others.
    let details = get(&node, "/v1/status", &as_admin).await;
    assert_eq!(details.0, 200);
    assert!(details.2.get("backend").is_some(), "{}", details.2);
    let summary = get(&node, "/v1/status", &as_reader).await;
    assert_eq!(summary.0, 200);
    assert_eq!(summary.2["role"], "holder");
    assert!(
        summary.2.get("backend").is_none() && summary.2.get("lease").is_none(),
        "{}",
        summary.2
    );
    // Health and readiness stay open.
    assert_eq!(get(&node, "/healthz", &[]).await.0, 200);
    assert_eq!(get(&node, "/readyz", &[]).await.0, 200);
}

on_both_backends!(
    each_permission_is_allowed_and_refused: each_permission_is_allowed_and_refused_on_sqlite,
    each_permission_is_allowed_and_refused_on_postgres
);
