//! Client tokens and namespace rules: `?token=`, `Authorization: Bearer`,
//! a WebSocket's first frame, subscription tokens, expired and forged
//! tokens, and the `open`, `keyonly` and `room` namespaces.

use futures::SinkExt;
use herald_testkit::sse::SseClient;
use herald_testkit::ws::ws_next;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message as Frame;

use crate::{
    assert_refused, get, now_s, on_both_backends, publish_as, Backend, Creds, Node, Place, Role,
};

/// The status an SSE request to `channel` with `query` and `headers` gets.
async fn sse_status(node: &Node, channel: &str, query: &str, headers: &[(&str, &str)]) -> u16 {
    let url = format!("{}/v1/channels/{channel}/events{query}", node.base);
    SseClient::open(&node.client, &url, headers)
        .await
        .unwrap()
        .status
}

async fn tokens_and_namespaces(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let publisher = Creds::bearer(&creds.publisher);
    let key = [("authorization", publisher.as_str())];
    assert_eq!(node.publish_with("news:a", &key, json!(1)).await.0, 201);

    let token = creds.token_for("u1", json!({"channels": ["news:*"], "publish": ["room:*"]}));
    let bearer = Creds::bearer(&token);
    // Subscribe with ?token= (EventSource) or the header.
    assert_eq!(
        sse_status(&node, "news:a", &format!("?token={token}"), &[]).await,
        200
    );
    assert_eq!(
        sse_status(&node, "news:a", "", &[("authorization", &bearer)]).await,
        200
    );
    // Not a channel the token grants: 403.
    assert_eq!(
        sse_status(&node, "other", &format!("?token={token}"), &[]).await,
        403
    );
    // History with the token (history is on in the default namespace).
    let history = get(
        &node,
        "/v1/channels/news:a/messages",
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(history.0, 200, "{}", history.2);
    // Publishing: the default namespace takes keys only; `room` tokens too,
    // on the channels of the token's `publish` claim.
    assert_refused(
        &publish_as(&node, "news:a", &bearer, json!(2)).await,
        403,
        "forbidden",
    );
    assert_eq!(publish_as(&node, "room:1", &bearer, json!(1)).await.0, 201);
    let reader_token = Creds::bearer(&creds.token_for("u2", json!({"channels": ["room:*"]})));
    assert_refused(
        &publish_as(&node, "room:1", &reader_token, json!(2)).await,
        403,
        "forbidden",
    );

    // `room`: subscribers may not read history (history = false).
    assert_eq!(
        sse_status(&node, "room:1", "", &[("authorization", &reader_token)]).await,
        200
    );
    assert_refused(
        &get(
            &node,
            "/v1/channels/room:1/messages",
            &[("authorization", &reader_token)],
        )
        .await,
        403,
        "forbidden",
    );
    // `open`: anyone subscribes, without credentials; history too.
    assert_eq!(sse_status(&node, "open:x", "", &[]).await, 200);
    assert_eq!(get(&node, "/v1/channels/open:x/messages", &[]).await.0, 200);
    // `keyonly`: a token granting every channel of it is still refused.
    let everything = creds.token_for("u3", json!({"channels": ["keyonly:*"]}));
    assert_eq!(
        sse_status(&node, "keyonly:x", &format!("?token={everything}"), &[]).await,
        403
    );
    // The default namespace without credentials: 401.
    assert_eq!(sse_status(&node, "news:a", "", &[]).await, 401);

    // A subscription token: its one channel only.
    let sub_token = creds.token_for("u4", json!({"channel": "news:solo"}));
    assert_eq!(
        sse_status(&node, "news:solo", &format!("?token={sub_token}"), &[]).await,
        200
    );
    assert_eq!(
        sse_status(&node, "news:a", &format!("?token={sub_token}"), &[]).await,
        403
    );

    // Expired: 401 token_expired, on every route.
    let expired = creds.token(json!({"sub": "u1", "exp": now_s() - 10, "channels": ["news:*"]}));
    let url = format!("{}/v1/channels/news:a/events?token={expired}", node.base);
    let answer = node.client.get(&url).send().await.unwrap();
    assert_eq!(answer.status(), 401);
    assert!(answer.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("invalid_token"));
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "token_expired");
    let expired_bearer = Creds::bearer(&expired);
    assert_refused(
        &get(
            &node,
            "/v1/channels/news:a/messages",
            &[("authorization", &expired_bearer)],
        )
        .await,
        401,
        "token_expired",
    );
    // Signed with another secret: 401 unauthorized.
    let forged = Creds {
        jwt_secret: "x".repeat(43),
        ..Creds::new()
    }
    .token_for("u1", json!({"channels": ["news:*"]}));
    assert_eq!(
        sse_status(&node, "news:a", &format!("?token={forged}"), &[]).await,
        401
    );
    // A token and a header at once: 401.
    assert_eq!(
        sse_status(
            &node,
            "news:a",
            &format!("?token={token}"),
            &[("authorization", &bearer)]
        )
        .await,
        401
    );

    // WebSocket: ?token=, then the first frame.
    let mut closed = None;
    let mut ws = node
        .ws(&format!("/v1/channels/news:a/ws?token={token}"), &[])
        .await
        .unwrap();
    assert_eq!(ws_next(&mut ws, &mut closed).await.unwrap()["offset"], 1);
    let mut ws = node.ws("/v1/channels/news:a/ws", &[]).await.unwrap();
    ws.send(Frame::text(json!({"token": token}).to_string()))
        .await
        .unwrap();
    assert_eq!(ws_next(&mut ws, &mut closed).await.unwrap()["offset"], 1);
    // A forged token in the first frame: closed 4401; a token for other
    // channels: 4403; an expired one: 3005.
    for (frame_token, code) in [(&forged, 4401), (&sub_token, 4403), (&expired, 3005)] {
        let mut ws = node.ws("/v1/channels/news:a/ws", &[]).await.unwrap();
        ws.send(Frame::text(json!({"token": frame_token}).to_string()))
            .await
            .unwrap();
        let mut closed = None;
        assert!(ws_next(&mut ws, &mut closed).await.is_none());
        assert_eq!(closed, Some(code));
    }
    // Not a token frame: 4401.
    let mut ws = node.ws("/v1/channels/news:a/ws", &[]).await.unwrap();
    ws.send(Frame::text("hello")).await.unwrap();
    let mut closed = None;
    assert!(ws_next(&mut ws, &mut closed).await.is_none());
    assert_eq!(closed, Some(4401));
    // A header credential that is refused is an HTTP answer.
    assert_eq!(
        node.ws(&format!("/v1/channels/other/ws?token={token}"), &[])
            .await
            .err(),
        Some(403)
    );
}

on_both_backends!(
    tokens_and_namespaces: tokens_and_namespaces_on_sqlite,
    tokens_and_namespaces_on_postgres
);

/// The message of a refusal: `error.message` of the answer, after its
/// status and code are checked.
fn refusal(
    answer: &(u16, reqwest::header::HeaderMap, serde_json::Value),
    status: u16,
    code: &str,
) -> String {
    assert_refused(answer, status, code);
    answer.2["error"]["message"].as_str().unwrap().to_owned()
}

/// GETs `path` on `node` with `Authorization: Bearer <token>`.
async fn bearer_get(
    node: &Node,
    path: &str,
    token: &str,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    get(node, path, &[("authorization", &Creds::bearer(token))]).await
}

/// A refused token says what is wrong with it: the one claim that is
/// missing or of the wrong type, never a list of every claim; a refusal
/// for reading history says "reading the history of", not "subscribing";
/// a `?token=` on the history route says where `?token=` is taken.
#[tokio::test]
async fn refusals_name_the_claim_the_route_and_the_request() {
    let place = Place::new(Backend::Sqlite).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let history = "/v1/channels/news:a/messages";
    let cases = [
        (json!({"sub": "u"}), "the exp claim is missing"),
        (json!({"exp": now_s() + 60}), "the sub claim is missing"),
        (
            json!({"sub": 42, "exp": now_s() + 60}),
            "the sub claim must be a string (the user), not a number",
        ),
        (
            json!({"sub": "u", "exp": "tomorrow"}),
            "the exp claim must be a whole number of seconds since the epoch, not a string",
        ),
        (
            json!({"sub": "u", "exp": now_s() + 60, "channels": "news:a"}),
            "the channels claim must be a list of strings (channel names), not a string",
        ),
        (
            json!({"sub": "u", "exp": now_s() + 60, "nbf": 1.5}),
            "the nbf claim must be a whole number of seconds since the epoch, not a number with a fraction",
        ),
        (
            json!({"sub": "u", "exp": now_s() + 60, "subs": ["news:a"]}),
            "the subs claim must be an object of channel names to objects (their options), not a list",
        ),
    ];
    for (claims, expected) in cases {
        let message = refusal(
            &bearer_get(&node, history, &creds.token(claims.clone())).await,
            401,
            "unauthorized",
        );
        assert!(
            message.starts_with(&format!("invalid token: {expected}")),
            "{claims}: {message}"
        );
        // One claim named, not the list of every claim's type.
        for other in ["publish", "channel:", "subs:"] {
            if !expected.contains(other) {
                assert!(!message.contains(other), "{claims}: {message}");
            }
        }
    }

    // The right verb: reading history is not subscribing.
    let message = refusal(&get(&node, history, &[]).await, 401, "unauthorized");
    assert!(
        message.starts_with("reading the history of news:a needs a token"),
        "{message}"
    );
    let other = creds.token_for("u", json!({"channels": ["news:b"]}));
    let message = refusal(&bearer_get(&node, history, &other).await, 403, "forbidden");
    assert!(
        message.starts_with("reading the history of news:a: this token does not grant news:a"),
        "{message}"
    );
    let sse = format!("{}/v1/channels/news:a/events", node.base);
    let answer = node.client.get(&sse).send().await.unwrap();
    assert_eq!(answer.status(), 401);
    let body: serde_json::Value = answer.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("subscribing to news:a needs a token"),
        "{message}"
    );

    // A valid token in ?token= on the history route: refused, saying where
    // ?token= is taken and how to send it here; in the header it reads.
    let token = creds.token_for("u", json!({"channels": ["news:*"]}));
    let message = refusal(
        &get(&node, &format!("{history}?token={token}"), &[]).await,
        401,
        "unauthorized",
    );
    assert!(
        message.contains("?token= is taken only by the SSE and WebSocket routes"),
        "{message}"
    );
    assert!(message.contains("Authorization: Bearer"), "{message}");
    assert!(!message.contains(&token), "the token is never quoted");
    assert_eq!(bearer_get(&node, history, &token).await.0, 200);
    node.stop().await;
}
