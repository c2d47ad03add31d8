//! A live subscription ends when its token expires (SSE: a last
//! `token_expired` event; WebSocket: close 3005), and the client resumes
//! with a fresh token from its last offset without a gap. A Durable
//! Streams reader too: its SSE ends with `token_expired`, its long-poll
//! answers `401 token_expired`.

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

/// Sends `method` to `path` on `node` with `headers` and `body`; returns
/// the status and the body's text.
async fn send(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
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
    (status, response.text().await.expect("a body"))
}

/// A Durable Streams SSE reader with a token is followed until the token
/// expires, however busy the stream: then a last `token_expired` event,
/// and the answer ends. Nothing appended after the expiry reaches it.
async fn ds_sse_expires(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    // No periodic look at the stream before the test's end: only the
    // token's expiry can end the reader.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    // Streams in `news:` are an admin's to create (publish alone appends).
    let owner = Creds::bearer(&creds.backend);
    let write = [
        ("authorization", owner.as_str()),
        ("content-type", "text/plain"),
    ];
    assert_eq!(
        send(&node, "PUT", "/ds/news/follow", &write, b"a").await.0,
        201
    );
    let token = short_lived(&creds);
    let url = node.url(&format!("/ds/news/follow?offset=-1&live=sse&token={token}"));
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    // A writer that keeps the stream busy across the expiry.
    let busy = {
        let node_url = node.url("/ds/news/follow");
        let client = node.client.clone();
        let publisher = owner.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_millis(100));
            loop {
                every.tick().await;
                let _ = client
                    .post(&node_url)
                    .header("authorization", &publisher)
                    .header("content-type", "text/plain")
                    .body("b")
                    .send()
                    .await;
            }
        })
    };
    let mut data = 0;
    within("token_expired event", NODE_WAIT, async {
        loop {
            let event = sse
                .next_event()
                .await
                .expect("the stream ends with token_expired");
            match event.event.as_deref() {
                Some("data") => data += 1,
                Some("control") => {}
                Some("token_expired") => {
                    assert_eq!(event.data, r#"{"code":"token_expired"}"#);
                    break;
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
    })
    .await;
    assert!(data >= 1, "what came before the expiry was sent");
    assert!(
        within("the end of the stream", NODE_WAIT, sse.next_event())
            .await
            .is_none(),
        "the stream ends after token_expired"
    );
    busy.abort();
}

/// A Durable Streams long-poll with a token waits no longer than the
/// token lives: it answers `401 token_expired` then, not data.
async fn ds_long_poll_expires(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let mut config = creds.config();
    // Far beyond the test's wait: only the token's expiry ends the wait.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    // Streams in `news:` are an admin's to create (publish alone appends).
    let owner = Creds::bearer(&creds.backend);
    let write = [
        ("authorization", owner.as_str()),
        ("content-type", "text/plain"),
    ];
    assert_eq!(
        send(&node, "PUT", "/ds/news/poll", &write, b"a").await.0,
        201
    );
    let token = short_lived(&creds);
    let path = format!("/ds/news/poll?offset=now&live=long-poll&token={token}");
    let (status, body) = within(
        "the long-poll's answer",
        NODE_WAIT,
        send(&node, "GET", &path, &[], b""),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("token_expired"), "{body}");
}

on_both_backends!(
    ds_sse_expires: ds_sse_ends_at_token_expiry_on_sqlite,
    ds_sse_ends_at_token_expiry_on_postgres
);

on_both_backends!(
    ds_long_poll_expires: ds_long_poll_ends_at_token_expiry_on_sqlite,
    ds_long_poll_ends_at_token_expiry_on_postgres
);

on_both_backends!(
    sse_expires_and_resumes: sse_ends_at_token_expiry_and_resumes_on_sqlite,
    sse_ends_at_token_expiry_and_resumes_on_postgres
);

on_both_backends!(
    ws_expires_and_resumes: ws_closes_at_token_expiry_and_resumes_on_sqlite,
    ws_closes_at_token_expiry_and_resumes_on_postgres
);
