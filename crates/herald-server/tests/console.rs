//! The web console's server side (`docs/console.md`), on SQLite and
//! PostgreSQL: its pages only when enabled, with the headers of an admin
//! page; the admin routes it is driven by (a page of channels, the
//! cluster as JSON and as an event stream, the rates). The pages in a
//! browser against a cluster: `crates/herald/tests/console.rs`.

use futures::SinkExt;
use herald_server::{ConsoleConfig, ServerConfig};
use herald_testkit::node::{Node, Role};
use herald_testkit::place::{Backend, Place};
use herald_testkit::sse::{SseClient, SseItem};
use herald_testkit::ws::ws_next;
use herald_testkit::{within, NODE_WAIT, POLL, WAIT};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message as Frame;

fn enabled() -> ServerConfig {
    ServerConfig {
        console: ConsoleConfig {
            enabled: true,
            ..ConsoleConfig::default()
        },
        ..ServerConfig::default()
    }
}

async fn pages_are_served_only_when_enabled(backend: Backend) {
    let place = Place::new(backend).await;
    let off = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let (status, _, body) = off.call("GET", "/console/", &[], None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    // The admin routes are part of the API either way.
    assert_eq!(off.get("/v1/admin/cluster").await.0, 200);

    let on = Node::start(&place, "node-b", Role::Standby, enabled()).await;
    let redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(on.url("/console"))
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 308);
    assert_eq!(redirect.headers()["location"], "/console/");
    let (status, headers, body) = on.call("GET", "/console/", &[], None).await;
    assert_eq!(status, 200);
    assert!(
        body.as_str().is_some_and(|html| html.contains("app.js")),
        "{body}"
    );
    for (name, value) in [
        ("content-type", "text/html; charset=utf-8"),
        (
            "content-security-policy",
            "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cache-control", "no-cache"),
    ] {
        assert_eq!(headers[name], value, "{name}");
    }
    let (status, headers, _) = on.call("GET", "/console/app.js", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    assert_eq!(
        on.call("GET", "/console/missing.js", &[], None).await.0,
        404
    );
}

async fn channels_are_paged_searched_and_checked(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    for i in 0..12 {
        let channel = format!("room:{i:02}");
        let (status, body) = node.publish(&channel, json!({ "i": i })).await;
        assert_eq!(status, 201, "{body}");
    }
    node.publish("other:x", json!(1)).await;

    // Pages of 5, resumed after the last name, until `next_after` is null.
    let mut after = String::new();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let (status, page) = node
            .get(&format!(
                "/v1/admin/channels?search=room&limit=5&after={after}"
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        for c in page["channels"].as_array().unwrap() {
            seen.push(c["name"].as_str().unwrap().to_owned());
        }
        match page["next_after"].as_str() {
            Some(next) => after = next.to_owned(),
            None => break,
        }
    }
    let expected: Vec<String> = (0..12).map(|i| format!("room:{i:02}")).collect();
    assert_eq!(seen, expected);
    assert_eq!(pages, 3);

    let (_, page) = node.get("/v1/admin/channels?search=:07").await;
    let row = &page["channels"][0];
    assert_eq!(page["channels"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(row["name"], "room:07");
    assert_eq!(
        (&row["head"], &row["earliest"], &row["messages"]),
        (&json!(1), &json!(1), &json!(1))
    );
    assert_eq!(row["bytes"], r#"{"i":7}"#.len());
    assert!(row["last_published_at"].is_string(), "{row}");
    assert_eq!(row["retention"], Value::Null);
    assert_eq!(row["stream"], Value::Null);
    assert_eq!(page["next_after"], Value::Null);

    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "after=bad%20name%7F",
        "search=a&search=b",
    ] {
        let (status, body) = node.get(&format!("/v1/admin/channels?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_query", "{bad}: {body}");
    }
}

async fn the_cluster_is_shown_and_streamed(backend: Backend) {
    let place = Place::new(backend).await;
    let holder = Node::start(&place, "node-a", Role::Holder, enabled()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, enabled()).await;

    let (status, view) = standby.get("/v1/admin/cluster").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["observed_by"], "node-b");
    assert_eq!(view["lease"]["holder"], "node-a", "{view}");
    assert_eq!(view["lease"]["exact"], false, "{view}");
    let token = view["lease"]["token"].as_u64().unwrap();
    assert_eq!(view["takeovers"][0]["token"], token, "{view}");
    assert_eq!(view["takeovers"][0]["to"], "node-a", "{view}");
    let (_, own) = holder.get("/v1/admin/cluster").await;
    assert_eq!(own["lease"]["exact"], true, "{own}");
    assert!(
        own["lease"]["safety_deadline_in_ms"].as_i64().unwrap() > 0,
        "{own}"
    );

    // Both nodes appear once each has reported itself.
    let deadline = Instant::now() + NODE_WAIT;
    loop {
        let (_, view) = standby.get("/v1/admin/cluster").await;
        let nodes: Vec<(&str, &str)> = view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["node_id"].as_str().unwrap(), n["role"].as_str().unwrap()))
            .collect();
        if nodes == [("node-a", "holder"), ("node-b", "standby")] {
            assert_eq!(view["nodes"][0]["url"], holder.url(""), "{view}");
            break;
        }
        assert!(Instant::now() < deadline, "{view}");
        // Pacing between two reads.
        tokio::time::sleep(POLL).await;
    }

    // The event stream sends the same view at once, then every second.
    let mut events = SseClient::connect(
        &standby.client,
        &standby.url("/v1/admin/cluster/events"),
        None,
    )
    .await;
    assert_eq!(events.status, 200);
    for _ in 0..2 {
        let event = loop {
            match within("a cluster event", WAIT, events.next_item()).await {
                Some(SseItem::Event(event)) => break event,
                Some(SseItem::Comment(_)) => {}
                None => panic!("the stream ended"),
            }
        };
        assert_eq!(event.event.as_deref(), Some("cluster"));
        let view: Value = serde_json::from_str(&event.data).unwrap();
        assert_eq!(view["lease"]["holder"], "node-a", "{view}");
    }
}

/// The rates' subscribers are this node's own (its hub's), unlike the
/// metric counters, which every node of this test process shares: a
/// subscription opened here shows in a later sample, and goes when it
/// ends. (The publish and delivery rates are checked per process in
/// `crates/herald/tests/console.rs`.)
async fn rates_count_the_nodes_subscribers(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let latest = |rates: &Value| rates["samples"].as_array().unwrap().last().cloned();
    let wait_subscribers = |n: u64| {
        let node = &node;
        async move {
            let deadline = Instant::now() + NODE_WAIT;
            loop {
                let (status, rates) = node.get("/v1/admin/rates").await;
                assert_eq!(status, 200, "{rates}");
                assert_eq!(rates["interval_ms"], 1000);
                if latest(&rates).is_some_and(|s| s["subscribers"] == n) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "no sample with {n} subscribers: {rates}"
                );
                // Pacing between two reads; a sample is taken every second.
                tokio::time::sleep(POLL).await;
            }
        }
    };
    wait_subscribers(0).await;
    let sse = SseClient::connect(
        &node.client,
        &node.url("/v1/channels/news:rates/events"),
        None,
    )
    .await;
    assert_eq!(sse.status, 200);
    wait_subscribers(1).await;
    drop(sse);
    wait_subscribers(0).await;
}

/// The `connections` of every node, the one that answers included, are
/// those of its node report (the report Centrifugo's `info` reads): a
/// Centrifugo connection shows on both nodes once reported, and goes once
/// it closed and the next report is written.
async fn connections_come_from_the_node_reports(backend: Backend) {
    let place = Place::new(backend).await;
    let holder = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, ServerConfig::default()).await;
    let connections = |view: &Value, node_id: &str| {
        view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node_id"] == node_id)
            .and_then(|n| n["connections"].as_u64())
    };
    let wait_connections = |n: u64| {
        let (holder, standby) = (&holder, &standby);
        async move {
            let deadline = Instant::now() + NODE_WAIT;
            loop {
                let (_, own) = holder.get("/v1/admin/cluster").await;
                let (_, other) = standby.get("/v1/admin/cluster").await;
                if connections(&own, "node-a") == Some(n)
                    && connections(&other, "node-a") == Some(n)
                {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "node-a never showed {n} connections: {own} / {other}"
                );
                // Pacing between two reads; a node reports every 3 s.
                tokio::time::sleep(POLL).await;
            }
        }
    };
    wait_connections(0).await;
    let mut ws = holder.ws("/connection/websocket", &[]).await.unwrap();
    ws.send(Frame::text(r#"{"id":1,"connect":{}}"#))
        .await
        .unwrap();
    let mut closed = None;
    let reply = within("the connect reply", WAIT, ws_next(&mut ws, &mut closed))
        .await
        .expect("a connect reply");
    assert!(reply["connect"].is_object(), "{reply}");
    wait_connections(1).await;
    ws.close(None).await.unwrap();
    while ws_next(&mut ws, &mut closed).await.is_some() {}
    wait_connections(0).await;
}

use herald_testkit::on_both_backends;

on_both_backends!(pages_are_served_only_when_enabled: pages_sqlite, pages_postgres);
on_both_backends!(channels_are_paged_searched_and_checked: channels_sqlite, channels_postgres);
on_both_backends!(the_cluster_is_shown_and_streamed: cluster_sqlite, cluster_postgres);
on_both_backends!(rates_count_the_nodes_subscribers: rates_sqlite, rates_postgres);
on_both_backends!(
    connections_come_from_the_node_reports: connections_sqlite,
    connections_postgres
);
