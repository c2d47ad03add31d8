//! What a web page can make a visitor's browser send to a node the
//! visitor reaches (a developer's loopback node included), over a real
//! listener: a cross-site `POST` with a body type that needs no CORS
//! preflight, a WebSocket handshake from a foreign or `null` origin, and a
//! request through a name of the page's own that resolves to loopback (DNS
//! rebinding). Each is refused; the same requests as a legitimate client
//! sends them pass.

use herald_server::{CorsConfig, ServerConfig};
use herald_testkit::node::{Node, Role};
use reqwest::header::{CONTENT_TYPE, HOST, ORIGIN};
use serde_json::{json, Value};

const ALLOWED: &str = "https://app.example.com";
const FOREIGN: &str = "https://evil.example.net";

/// `POST`s `body` to `path` with `content_type` (none when `None`);
/// returns the status and the answer's JSON.
async fn post(node: &Node, path: &str, content_type: Option<&str>, body: &str) -> (u16, Value) {
    let mut request = node
        .client
        .post(node.url(path))
        .header(ORIGIN, FOREIGN)
        .body(body.to_owned());
    if let Some(content_type) = content_type {
        request = request.header(CONTENT_TYPE, content_type);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A page's `fetch` with a "simple" body type (`text/plain`, a form) or
/// none is sent without a preflight: the JSON routes refuse it with 415,
/// before anything runs, on Herald's API and on Centrifugo's server API;
/// with `application/json` the same request runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_a_json_content_type_is_refused_415() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Role::Holder, ServerConfig::default()).await;
    let publish = r#"{"data":"forged"}"#;
    let batch = r#"{"messages":[{"channel":"c","data":"forged"}]}"#;
    let api = r#"{"channel":"c","data":"forged"}"#;
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        for (path, body) in [
            ("/v1/channels/c/messages", publish),
            ("/v1/messages", batch),
        ] {
            let (status, answer) = post(&node, path, content_type, body).await;
            assert_eq!(status, 415, "{path} {content_type:?}: {answer}");
            assert_eq!(
                answer["error"]["code"], "unsupported_media_type",
                "{answer}"
            );
            assert!(answer["error"]["message"].is_string(), "{answer}");
        }
        for method in ["publish", "disconnect", "history_remove"] {
            let (status, answer) = post(&node, &format!("/api/{method}"), content_type, api).await;
            assert_eq!(status, 415, "{method} {content_type:?}: {answer}");
            assert_eq!(answer["error"]["code"], 107, "{answer}");
        }
    }
    assert_eq!(node.head("c").await, 0, "a refused request published");
    // The same requests as JSON run.
    let json = Some("application/json");
    assert_eq!(
        post(&node, "/v1/channels/c/messages", json, publish)
            .await
            .0,
        201
    );
    assert_eq!(post(&node, "/v1/messages", json, batch).await.0, 201);
    let (status, answer) = post(
        &node,
        "/api/publish",
        Some("application/json; charset=utf-8"),
        api,
    )
    .await;
    assert_eq!(
        (status, answer["result"]["offset"].as_u64()),
        (200, Some(3)),
        "{answer}"
    );
    assert_eq!(node.head("c").await, 3);
    node.stop().await;
}

/// Every WebSocket route checks the handshake's `Origin` against the CORS
/// allow-list: the node's own origin, a listed one and a request without
/// `Origin` (not a browser) upgrade; a foreign origin and `null` get
/// `403 origin_not_allowed`; with `*`, every origin but `null` upgrades.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_check_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let allowing = |origins: &[&str]| ServerConfig {
        cors: CorsConfig {
            allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            ..CorsConfig::default()
        },
        ..ServerConfig::default()
    };
    let node = Node::start(dir.path(), "node-a", Role::Holder, allowing(&[ALLOWED])).await;
    let own = node.base.clone();
    for path in ["/v1/channels/c/ws", "/connection/websocket"] {
        for origin in [Some(ALLOWED), Some(own.as_str()), None] {
            let headers: Vec<(&str, &str)> = origin.iter().map(|o| ("origin", *o)).collect();
            assert!(
                node.ws(path, &headers).await.is_ok(),
                "{path} from {origin:?} was refused"
            );
        }
        for origin in [FOREIGN, "null", "http://127.0.0.1:1", "file://"] {
            let refused = node.ws(path, &[("origin", origin)]).await.err();
            assert_eq!(refused, Some(403), "{path} from {origin}");
        }
    }
    // The refusal is the JSON error answer.
    let answer = node
        .client
        .get(node.url("/connection/websocket"))
        .header(ORIGIN, FOREIGN)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "origin_not_allowed", "{body}");
    node.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Role::Holder, allowing(&["*"])).await;
    for path in ["/v1/channels/c/ws", "/connection/websocket"] {
        assert!(
            node.ws(path, &[("origin", FOREIGN)]).await.is_ok(),
            "{path}"
        );
        assert_eq!(node.ws(path, &[("origin", "null")]).await.err(), Some(403));
    }
    node.stop().await;
}

/// A node without access control that serves loopback only
/// (`loopback_hosts_only`, as `herald serve` sets it) answers requests for
/// loopback names and refuses any other `Host` with
/// `403 host_not_allowed` before anything runs: a page whose own name
/// resolves to 127.0.0.1 can neither publish, read nor open a WebSocket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_node_without_auth_answers_loopback_host_names_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        loopback_hosts_only: true,
        ..ServerConfig::default()
    };
    let node = Node::start(dir.path(), "node-a", Role::Holder, config).await;
    let port = node.base.rsplit(':').next().unwrap().to_owned();
    let host = |name: &str| format!("{name}:{port}");
    for name in [
        "rebind.evil.example",
        "127.0.0.1.nip.io",
        "localhost.evil.example",
    ] {
        let forged = node
            .client
            .post(node.url("/v1/channels/c/messages"))
            .header(HOST, host(name))
            .json(&json!({"data": "forged"}))
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status().as_u16(), 403, "{name}");
        let body: Value = forged.json().await.unwrap();
        assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
        let read = node
            .client
            .get(node.url("/v1/channels/c/messages"))
            .header(HOST, host(name))
            .send()
            .await
            .unwrap();
        assert_eq!(read.status().as_u16(), 403, "{name}");
        let refused = node.ws("/v1/channels/c/ws", &[("host", &host(name))]).await;
        assert_eq!(refused.err(), Some(403), "{name}");
    }
    assert_eq!(node.head("c").await, 0, "a refused request published");
    for name in ["127.0.0.1", "localhost", "app.localhost", "[::1]"] {
        let ok = node
            .client
            .post(node.url("/v1/channels/c/messages"))
            .header(HOST, host(name))
            .json(&json!({"data": name}))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status().as_u16(), 201, "{name}");
    }
    assert_eq!(node.head("c").await, 4);
    node.stop().await;

    // Off (a node with access control, or `--insecure-no-auth`): any name.
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), "node-a", Role::Holder, ServerConfig::default()).await;
    let ok = node
        .client
        .get(node.url("/healthz"))
        .header(HOST, "herald.example")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    node.stop().await;
}
