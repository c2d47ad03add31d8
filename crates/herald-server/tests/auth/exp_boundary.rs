//! A token whose `exp` is the current second is refused (RFC 7519
//! §4.1.4: not accepted "on or after" its expiration time) on Herald's
//! own routes: HTTP history, SSE and WebSocket, each answering 401 where
//! a token it accepted would be answered 200 or 101. (A WebSocket's
//! first-frame token at `exp` ends with 3005 whether refused or accepted
//! and ended at once, so it shows nothing here; it goes through the same
//! check.) Centrifugo's commands are in `centrifugo/exp_boundary.rs`.

use serde_json::json;

use crate::{get, refused_at_exp, Backend, Creds, Node, Place, Role};

/// A token for `news:*` expiring at `exp`.
fn token_until(creds: &Creds, exp: u64) -> String {
    creds.token(json!({"sub": "u1", "exp": exp, "channels": ["news:*"]}))
}

#[tokio::test]
async fn a_token_at_its_exp_second_is_refused_on_http_sse_and_websocket() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let mut failures: Vec<String> = Vec::new();

    let r = refused_at_exp("GET history with Bearer", |exp| {
        let bearer = Creds::bearer(&token_until(&creds, exp));
        let node = &node;
        async move {
            let answer = get(
                node,
                "/v1/channels/news:a/messages",
                &[("authorization", &bearer)],
            )
            .await;
            answer.0 == 401 && answer.2["error"]["code"] == "token_expired"
        }
    })
    .await;
    failures.extend(r.err());

    let r = refused_at_exp("SSE with ?token=", |exp| {
        let url = format!(
            "{}/v1/channels/news:a/events?token={}",
            node.base,
            token_until(&creds, exp)
        );
        let client = node.client.clone();
        async move {
            // Only the status line: an accepted stream stays open.
            let answer = client.get(&url).send().await.unwrap();
            answer.status() == 401
        }
    })
    .await;
    failures.extend(r.err());

    let r = refused_at_exp("WebSocket with ?token=", |exp| {
        let path = format!("/v1/channels/news:a/ws?token={}", token_until(&creds, exp));
        let node = &node;
        async move { node.ws(&path, &[]).await.err() == Some(401) }
    })
    .await;
    failures.extend(r.err());
    assert!(failures.is_empty(), "{failures:#?}");
}
