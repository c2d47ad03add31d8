//! A live subscription ends when its token expires (SSE: a last
//! `token_expired` event; WebSocket: close 3005), and the client resumes
//! with a fresh token from its last offset without a gap.

use herald_testkit::sse::SseClient;
use herald_testkit::ws::ws_next;
use herald_testkit::{within, NODE_WAIT};
use serde_json::json;

use crate::{now_s, on_both_backends, publish_as, Backend, Creds, Node, Place, Role};

/// A token for `news:*` that expires in 2 s.
fn short_lived(creds: &Creds) -> String {
    creds.token(json!({"sub": "u1", "exp": now_s() + 2, "channels": ["news:*"]}))
}

async fn publish(node: &Node, creds: &Creds, i: u64) {
    let key = Creds::bearer(&creds.publisher);
    let answer = publish_as(node, "news:live", &key, json!(i)).await;
    assert_eq!(answer.0, 201, "{}", answer.2);
}

async fn sse_expires_and_resumes(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let url = |token: &str| format!("{}/v1/channels/news:live/events?token={token}", node.base);
    let mut sse = SseClient::open(&node.client, &url(&short_lived(&creds)), &[])
        .await
        .unwrap();
    assert_eq!(sse.status, 200);
    publish(&node, &creds, 1).await;
    publish(&node, &creds, 2).await;
    // Whatever arrived before the expiry, then the final event.
    let mut seen = Vec::new();
    within("token_expired event", NODE_WAIT, async {
        loop {
            let event = sse
                .next_event()
                .await
                .expect("the stream ends with token_expired");
            match event.event.as_deref() {
                Some("message") => seen.push(event.id.unwrap().parse::<u64>().unwrap()),
                Some("token_expired") => break,
                other => panic!("unexpected event {other:?}"),
            }
        }
    })
    .await;
    assert!(
        sse.next_event().await.is_none(),
        "the stream ends after token_expired"
    );
    publish(&node, &creds, 3).await;
    publish(&node, &creds, 4).await;
    // A fresh token, from the last offset seen.
    let last = seen.last().copied().unwrap_or(0).to_string();
    let fresh = creds.token_for("u1", json!({"channels": ["news:*"]}));
    let mut sse = SseClient::open(&node.client, &url(&fresh), &[("last-event-id", &last)])
        .await
        .unwrap();
    assert_eq!(sse.status, 200);
    while seen.len() < 4 {
        seen.push(
            within("resumed message", NODE_WAIT, sse.expect_message())
                .await
                .0,
        );
    }
    assert_eq!(seen, [1, 2, 3, 4], "every message once, in order");
}

async fn ws_expires_and_resumes(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let token = short_lived(&creds);
    let mut ws = node
        .ws(
            "/v1/channels/news:live/ws",
            &[("authorization", &Creds::bearer(&token))],
        )
        .await
        .unwrap();
    publish(&node, &creds, 1).await;
    publish(&node, &creds, 2).await;
    let mut seen = Vec::new();
    let mut closed = None;
    within("close on expiry", NODE_WAIT, async {
        while let Some(frame) = ws_next(&mut ws, &mut closed).await {
            seen.push(frame["offset"].as_u64().unwrap());
        }
    })
    .await;
    assert_eq!(closed, Some(3005), "closed with 3005 token expired");
    publish(&node, &creds, 3).await;
    publish(&node, &creds, 4).await;
    let last = seen.last().copied().unwrap_or(0);
    let fresh = creds.token_for("u1", json!({"channels": ["news:*"]}));
    let mut ws = node
        .ws(
            &format!("/v1/channels/news:live/ws?after={last}&token={fresh}"),
            &[],
        )
        .await
        .unwrap();
    while seen.len() < 4 {
        let frame = within("resumed message", NODE_WAIT, ws_next(&mut ws, &mut closed)).await;
        seen.push(frame.expect("a message")["offset"].as_u64().unwrap());
    }
    assert_eq!(seen, [1, 2, 3, 4], "every message once, in order");
}

on_both_backends!(
    sse_expires_and_resumes: sse_ends_at_token_expiry_and_resumes_on_sqlite,
    sse_ends_at_token_expiry_and_resumes_on_postgres
);

on_both_backends!(
    ws_expires_and_resumes: ws_closes_at_token_expiry_and_resumes_on_sqlite,
    ws_closes_at_token_expiry_and_resumes_on_postgres
);
