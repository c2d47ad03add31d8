//! A subscriber that may not read a channel's history (`history = false`,
//! the `room` namespace of the tests) gets no stored message through any
//! subscription path: SSE and WebSocket start at the head, a resume point
//! older than `history_resume_window` is answered with `history_withheld`
//! and the head, and Centrifugo's recovery (`subscribe` with `recover`,
//! the `subs` of `connect`) answers `recovered: false` without
//! publications. Within the window a reconnecting client loses nothing.
//! Each check looks at which offsets arrive, not only at the status.

use std::time::Duration;

use futures::SinkExt;
use herald_testkit::sse::SseClient;
use herald_testkit::ws::{ws_next, Ws};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as Frame;

use crate::centrifugo::client::Client;
use crate::centrifugo::offsets;
use crate::{assert_refused, get, on_both_backends, Backend, Creds, Node, Place, Role};

/// A holder whose `history_resume_window` is `window`, with the tests'
/// credentials.
async fn node_with_window(place: &Place, creds: &Creds, window: Duration) -> Node {
    let mut config = creds.config();
    config.auth.history_resume_window = Some(window);
    Node::start(place, "node-a", Role::Holder, config).await
}

/// Publishes `data` to `channel` with the publisher key; asserts 201.
async fn publish(node: &Node, creds: &Creds, channel: &str, data: Value) {
    let publisher = Creds::bearer(&creds.publisher);
    let answer = node
        .publish_with(channel, &[("authorization", publisher.as_str())], data)
        .await;
    assert_eq!(answer.0, 201, "{}", answer.2);
}

/// Opens the SSE stream of `channel` with `query`; asserts 200.
async fn sse(node: &Node, channel: &str, query: &str) -> SseClient {
    let url = format!("{}/v1/channels/{channel}/events{query}", node.base);
    let client = SseClient::connect(&node.client, &url, None).await;
    assert_eq!(client.status, 200);
    client
}

/// The next event of `stream` (comments skipped) as (type, id, data).
async fn sse_event(stream: &mut SseClient) -> (String, Option<String>, Value) {
    let event = herald_testkit::within("the next SSE event", herald_testkit::WAIT, async {
        stream.next_event().await
    })
    .await
    .expect("the SSE stream ended");
    let data = serde_json::from_str(&event.data).expect("event data is JSON");
    (event.event.unwrap_or_default(), event.id, data)
}

/// The next frame of `ws` as JSON.
async fn ws_frame(ws: &mut Ws) -> Value {
    let mut closed = None;
    herald_testkit::within("the next WebSocket frame", herald_testkit::WAIT, async {
        ws_next(ws, &mut closed).await
    })
    .await
    .unwrap_or_else(|| panic!("the WebSocket closed with {closed:?}"))
}

async fn no_stored_history_without_the_right(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let node = node_with_window(&place, &creds, Duration::ZERO).await;
    for i in 1..=3 {
        publish(&node, &creds, "room:1", json!(i)).await;
    }
    let token = creds.token_for("u1", json!({"channels": ["room:*"]}));
    let bearer = Creds::bearer(&token);
    // The history route refuses this token...
    assert_refused(
        &get(
            &node,
            "/v1/channels/room:1/messages",
            &[("authorization", &bearer)],
        )
        .await,
        403,
        "forbidden",
    );

    // ... and SSE without a resume point starts at the head: the first
    // event is the next publish, not offset 1.
    let mut fresh = sse(&node, "room:1", &format!("?token={token}")).await;
    publish(&node, &creds, "room:1", json!(4)).await;
    assert_eq!(fresh.expect_message().await.0, 4);
    // A resume point: withheld, then the stream goes on after the head.
    let mut resumed = sse(&node, "room:1", &format!("?token={token}&after=0")).await;
    let (kind, id, data) = sse_event(&mut resumed).await;
    assert_eq!(kind, "history_withheld", "{data}");
    assert_eq!(id.as_deref(), Some("4"));
    assert_eq!(data, json!({"requested_after": 0, "head": 4}));
    // Last-Event-ID, as a reconnecting EventSource sends it: the same.
    let url = format!("{}/v1/channels/room:1/events?token={token}", node.base);
    let mut reconnected = SseClient::connect(&node.client, &url, Some("2")).await;
    let (kind, _, data) = sse_event(&mut reconnected).await;
    assert_eq!(kind, "history_withheld", "{data}");
    publish(&node, &creds, "room:1", json!(5)).await;
    assert_eq!(resumed.expect_message().await.0, 5);
    assert_eq!(reconnected.expect_message().await.0, 5);
    assert_eq!(fresh.expect_message().await.0, 5);

    // WebSocket with ?token=: from the head, or withheld then the head.
    let mut ws = node
        .ws(&format!("/v1/channels/room:1/ws?token={token}"), &[])
        .await
        .unwrap();
    let mut ws_resumed = node
        .ws(
            &format!("/v1/channels/room:1/ws?token={token}&after=2"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        ws_frame(&mut ws_resumed).await,
        json!({"type": "history_withheld", "requested_after": 2, "head": 5})
    );
    // The token in the first frame: the same rule.
    let mut ws_frame_token = node
        .ws("/v1/channels/room:1/ws?after=1", &[])
        .await
        .unwrap();
    ws_frame_token
        .send(Frame::text(json!({"token": token}).to_string()))
        .await
        .unwrap();
    assert_eq!(
        ws_frame(&mut ws_frame_token).await,
        json!({"type": "history_withheld", "requested_after": 1, "head": 5})
    );
    publish(&node, &creds, "room:1", json!(6)).await;
    for socket in [&mut ws, &mut ws_resumed, &mut ws_frame_token] {
        assert_eq!(ws_frame(socket).await["offset"], 6);
    }

    // Centrifugo: subscribe with recover from the channel's epoch.
    let (mut c, _) = Client::connect(&node, &token).await;
    let plain = c.command("subscribe", json!({"channel": "room:1"})).await;
    let epoch = plain["subscribe"]["epoch"].as_str().unwrap().to_owned();
    assert_eq!(plain["subscribe"]["offset"], 6, "{plain}");
    let (mut c, _) = Client::connect(&node, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "room:1", "recover": true, "epoch": epoch, "offset": 0}),
        )
        .await;
    let r = &r["subscribe"];
    assert_ne!(r["recovered"], true, "{r}");
    assert_eq!(r["was_recovering"], true, "{r}");
    assert_eq!(offsets(&r["publications"]), Vec::<u64>::new(), "{r}");
    assert_eq!(r["offset"], 6, "{r}");
    // Server-side subscriptions recovered at connect: the same.
    let subs_token = creds.token_for("u1", json!({"subs": {"room:1": {}}}));
    let mut s = Client::open(&node).await;
    let connected = s
        .command(
            "connect",
            json!({"token": subs_token,
                   "subs": {"room:1": {"recover": true, "epoch": epoch, "offset": 0}}}),
        )
        .await;
    let sub = &connected["connect"]["subs"]["room:1"];
    assert_ne!(sub["recovered"], true, "{connected}");
    assert_eq!(
        offsets(&sub["publications"]),
        Vec::<u64>::new(),
        "{connected}"
    );
    assert_eq!(sub["offset"], 6, "{connected}");
    publish(&node, &creds, "room:1", json!(7)).await;
    assert_eq!(c.push().await["pub"]["offset"], 7);
    assert_eq!(s.push().await["pub"]["offset"], 7);

    // A key with `read` reads history, so it still gets every stored
    // message from the start.
    let url = format!("{}/v1/channels/room:1/events", node.base);
    let backend_bearer = Creds::bearer(&creds.backend);
    let mut keyed = SseClient::open(&node.client, &url, &[("authorization", &backend_bearer)])
        .await
        .unwrap();
    assert_eq!(keyed.status, 200);
    assert_eq!(keyed.expect_message().await.0, 1);
}

on_both_backends!(
    no_stored_history_without_the_right: no_stored_history_without_the_right_on_sqlite,
    no_stored_history_without_the_right_on_postgres
);

async fn a_resume_within_the_window_loses_nothing(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    // Far longer than the test: every message is inside it.
    let node = node_with_window(&place, &creds, Duration::from_secs(3600)).await;
    for i in 1..=3 {
        publish(&node, &creds, "room:2", json!(i)).await;
    }
    let token = creds.token_for("u1", json!({"channels": ["room:*"]}));
    // Without a resume point, still the head.
    let mut fresh = sse(&node, "room:2", &format!("?token={token}")).await;
    // A client that reconnects after offset 1 gets 2 and 3, then live.
    let mut resumed = sse(&node, "room:2", &format!("?token={token}&after=1")).await;
    assert_eq!(resumed.expect_message().await.0, 2);
    assert_eq!(resumed.expect_message().await.0, 3);
    let mut ws = node
        .ws(
            &format!("/v1/channels/room:2/ws?token={token}&after=2"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(ws_frame(&mut ws).await["offset"], 3);
    // Centrifugo recovers the same.
    let (mut c, _) = Client::connect(&node, &token).await;
    let plain = c.command("subscribe", json!({"channel": "room:2"})).await;
    let epoch = plain["subscribe"]["epoch"].as_str().unwrap().to_owned();
    let (mut c, _) = Client::connect(&node, &token).await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "room:2", "recover": true, "epoch": epoch, "offset": 1}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(offsets(&r["subscribe"]["publications"]), vec![2, 3]);
    publish(&node, &creds, "room:2", json!(4)).await;
    assert_eq!(fresh.expect_message().await.0, 4);
    assert_eq!(resumed.expect_message().await.0, 4);
    assert_eq!(ws_frame(&mut ws).await["offset"], 4);
    assert_eq!(c.push().await["pub"]["offset"], 4);
}

on_both_backends!(
    a_resume_within_the_window_loses_nothing: a_resume_within_the_window_loses_nothing_on_sqlite,
    a_resume_within_the_window_loses_nothing_on_postgres
);
