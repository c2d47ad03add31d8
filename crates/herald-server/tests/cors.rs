//! CORS over HTTP on a real listener: preflights for the API, SSE and
//! WebSocket endpoints from allowed and refused origins, simple requests
//! with `Origin`, and the default that allows nothing.

use std::time::Duration;

use herald_server::{CorsConfig, ServerConfig};
use herald_testkit::node::{Node, Role};
use reqwest::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ORIGIN,
};
use reqwest::{Method, Response};
use serde_json::json;

const ALLOWED: &str = "https://app.example.com";
const REFUSED: &str = "https://evil.example.net";

/// A holder that allows [`ALLOWED`], preflights cached for 2 minutes.
async fn node_allowing(dir: &std::path::Path) -> Node {
    Node::start(
        dir,
        "node-a",
        Role::Holder,
        ServerConfig {
            cors: CorsConfig {
                allowed_origins: vec![ALLOWED.to_owned()],
                max_age: Duration::from_secs(120),
            },
            ..ServerConfig::default()
        },
    )
    .await
}

/// A browser's preflight for `method` on `path` from `origin`, asking to
/// send `headers`.
async fn preflight(node: &Node, path: &str, origin: &str, method: &str, headers: &str) -> Response {
    node.client
        .request(Method::OPTIONS, node.url(path))
        .header(ORIGIN, origin)
        .header("Access-Control-Request-Method", method)
        .header("Access-Control-Request-Headers", headers)
        .send()
        .await
        .unwrap()
}

/// A simple request (no preflight) from `origin`: the history of
/// `orders`.
async fn history_from(node: &Node, origin: &str) -> Response {
    node.client
        .get(node.url("/v1/channels/orders/messages?after=0"))
        .header(ORIGIN, origin)
        .send()
        .await
        .unwrap()
}

fn header<'a>(response: &'a Response, name: &reqwest::header::HeaderName) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_from_an_allowed_origin_is_answered_on_every_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_allowing(dir.path()).await;
    for (path, method, headers) in [
        (
            "/v1/channels/orders/messages",
            "POST",
            "content-type,idempotency-key,authorization",
        ),
        (
            "/v1/channels/orders/events",
            "GET",
            "last-event-id,x-api-key",
        ),
        ("/v1/channels/orders/ws", "GET", "authorization"),
        ("/v1/messages", "POST", "content-type"),
    ] {
        let response = preflight(&node, path, ALLOWED, method, headers).await;
        assert!(response.status().is_success(), "{path}: {response:?}");
        assert_eq!(
            header(&response, &ACCESS_CONTROL_ALLOW_ORIGIN),
            Some(ALLOWED),
            "{path}"
        );
        let methods = header(&response, &ACCESS_CONTROL_ALLOW_METHODS).unwrap();
        assert!(methods.contains(method), "{path}: {methods}");
        let allowed_headers = header(&response, &ACCESS_CONTROL_ALLOW_HEADERS)
            .unwrap()
            .to_ascii_lowercase();
        for asked in headers.split(',') {
            assert!(
                allowed_headers.contains(asked),
                "{path}: {asked} not in {allowed_headers}"
            );
        }
        assert_eq!(
            header(&response, &ACCESS_CONTROL_MAX_AGE),
            Some("120"),
            "{path}"
        );
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_from_another_origin_gets_no_allow_origin() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_allowing(dir.path()).await;
    let response = preflight(
        &node,
        "/v1/channels/orders/events",
        REFUSED,
        "GET",
        "last-event-id",
    )
    .await;
    assert_eq!(
        header(&response, &ACCESS_CONTROL_ALLOW_ORIGIN),
        None,
        "{response:?}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_request_with_an_allowed_origin_carries_allow_origin() {
    let dir = tempfile::tempdir().unwrap();
    let node = node_allowing(dir.path()).await;
    let (status, _) = node.publish("orders", json!(1)).await;
    assert_eq!(status, 201);
    let response = history_from(&node, ALLOWED).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, &ACCESS_CONTROL_ALLOW_ORIGIN),
        Some(ALLOWED)
    );
    assert!(header(&response, &reqwest::header::VARY)
        .unwrap()
        .to_ascii_lowercase()
        .contains("origin"));
    let refused = history_from(&node, REFUSED).await;
    assert_eq!(refused.status(), 200);
    assert_eq!(header(&refused, &ACCESS_CONTROL_ALLOW_ORIGIN), None);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_no_origin_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::holder(dir.path()).await;
    let response = preflight(&node, "/v1/channels/orders/events", ALLOWED, "GET", "").await;
    assert_eq!(
        header(&response, &ACCESS_CONTROL_ALLOW_ORIGIN),
        None,
        "{response:?}"
    );
    let response = history_from(&node, ALLOWED).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, &ACCESS_CONTROL_ALLOW_ORIGIN), None);
    node.stop().await;
}
