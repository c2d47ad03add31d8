//! What Herald does not serve of Centrifugo's client protocol is refused
//! as Centrifugo refuses it, never taken for something else (raw frames,
//! one per field and value): a map or shared poll subscription, a map
//! publish, track and untrack are answered 108; a field the protocol does
//! not have, a map's paging fields on a stream subscription, an unknown
//! delta type or subscription type and a malformed tags filter close the
//! connection with 3501. What Herald serves of the same requests: a tags
//! filter on live and recovered publications, `delta: "fossil"` answered
//! without delta, and `rejectUnrecovered` (error 112).

use herald_server::ServerConfig;
use serde_json::{json, Value};

use super::client::Client;
use super::offsets;
use crate::{Backend, Node, Place, Role};

/// A node without access control (anonymous connections) on SQLite.
async fn open_node() -> (Place, Node) {
    let place = Place::new(Backend::Sqlite).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    (place, node)
}

/// Publishes `data` with `tags` through the server API; its offset.
async fn publish(node: &Node, channel: &str, data: Value, tags: Value) -> u64 {
    let (status, _, r) = node
        .call(
            "POST",
            "/api/publish",
            &[],
            Some(json!({"channel": channel, "data": data, "tags": tags})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    r["result"]["offset"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unserved_requests_are_answered_108() {
    let (_place, node) = open_node().await;
    let (mut c, _) = Client::connect(&node, "").await;
    for (method, params) in [
        ("subscribe", json!({"channel": "m", "type": 1})),
        ("subscribe", json!({"channel": "m", "type": 2})),
        ("subscribe", json!({"channel": "m", "type": 3})),
        ("subscribe", json!({"channel": "m", "type": 4})),
        (
            "publish",
            json!({"channel": "m", "data": {}, "type": 1, "key": "k"}),
        ),
        ("publish", json!({"channel": "m", "data": {}, "key": "k"})),
        (
            "publish",
            json!({"channel": "m", "data": {}, "type": 1, "removed": true}),
        ),
        (
            "sub_refresh",
            json!({"channel": "m", "type": 1, "track": [{"signature": "s"}]}),
        ),
        (
            "sub_refresh",
            json!({"channel": "m", "type": 2, "untrack": ["k"]}),
        ),
        ("rpc", json!({"method": "m", "data": {}})),
    ] {
        let r = c.command(method, params.clone()).await;
        assert_eq!(r["error"]["code"], 108, "{method} {params}: {r}");
    }
    // An unknown method alone is 104, as before; with a `null` request
    // beside it, too.
    let r = c.command("teleport", json!({})).await;
    assert_eq!(r["error"]["code"], 104, "{r}");
    c.send_text(r#"{"id":77,"subscribe":null,"teleport":{}}"#)
        .await;
    assert_eq!(c.reply(77).await["error"]["code"], 104);
    // None of them subscribed or published anything.
    let r = c
        .command("history", json!({"channel": "m", "limit": -1}))
        .await;
    assert_eq!(r["history"]["publications"], json!([]), "{r}");
    let r = c.command("subscribe", json!({"channel": "m"})).await;
    assert!(
        r["subscribe"].is_object(),
        "a stream subscription still works: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_that_change_the_meaning_close_with_3501() {
    let (_place, node) = open_node().await;
    for frame in [
        // Fields client.proto does not have.
        json!({"id": 1, "subscribe": {"channel": "a", "tags_filter": {}}}),
        json!({"id": 1, "publish": {"channel": "a", "data": {}, "tags": {"x": "y"}}}),
        json!({"id": 1, "history": {"channel": "a", "filter": "x"}}),
        json!({"id": 1, "history": {"channel": "a", "since": {"offset": 1, "epoch": "e", "x": 1}}}),
        json!({"id": 1, "presence": {"channel": "a", "map": true}}),
        json!({"id": 1, "unsubscribe": {"channel": "a", "key": "k"}}),
        json!({"id": 1, "refresh": {"token": "t", "x": 1}}),
        // A field beside the request, and two requests in one command.
        json!({"id": 1, "publish": {"channel": "a", "data": {}}, "tags": {"x": "y"}}),
        json!({"id": 1, "subscribe": {"channel": "a"}, "history": {"channel": "a"}}),
        json!({"id": 1, "publish": {"channel": "a", "data": {}}, "teleport": {}}),
        // A map's paging on a stream subscription.
        json!({"id": 1, "subscribe": {"channel": "a", "phase": 1}}),
        json!({"id": 1, "subscribe": {"channel": "a", "cursor": "c"}}),
        json!({"id": 1, "subscribe": {"channel": "a", "limit": 5}}),
        json!({"id": 1, "subscribe": {"channel": "a", "asc": true}}),
        // Unknown values.
        json!({"id": 1, "subscribe": {"channel": "a", "type": 9}}),
        json!({"id": 1, "subscribe": {"channel": "a", "delta": "xdelta"}}),
        json!({"id": 1, "publish": {"channel": "a", "data": {}, "type": 7}}),
        json!({"id": 1, "sub_refresh": {"channel": "a", "type": 3}}),
        json!({"id": 1, "sub_refresh": {"channel": "a", "untrack": ["k"]}}),
        json!({"id": 1, "subscribe": {"channel": ""}}),
        // Malformed tags filters.
        json!({"id": 1, "subscribe": {"channel": "a", "tf": {"key": "team", "cmp": "like", "val": "x"}}}),
        json!({"id": 1, "subscribe": {"channel": "a", "tf": {"op": "not", "nodes": []}}}),
        json!({"id": 1, "subscribe": {"channel": "a", "tf": {"key": "team", "cmp": "eq"}}}),
        json!({"id": 1, "subscribe": {"channel": "a", "tf": {"key": "t", "cmp": "eq", "val": "x", "y": 1}}}),
        json!({"id": 1, "subscribe": {"channel": "a", "tf": ["team", "eq", "x"]}}),
    ] {
        let (mut c, _) = Client::connect(&node, "").await;
        c.send_text(&frame.to_string()).await;
        assert_eq!(c.closed_with().await, Some(3501), "{frame}");
    }
    // Nothing was subscribed or published.
    let (mut c, _) = Client::connect(&node, "").await;
    let r = c
        .command("history", json!({"channel": "a", "limit": -1}))
        .await;
    assert_eq!(r["history"]["publications"], json!([]), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_herald_serves_or_ignores_as_centrifugo_does() {
    let (_place, node) = open_node().await;
    let (mut c, _) = Client::connect(&node, "").await;
    // Every field of client.proto's connect is known.
    let mut raw = Client::open(&node).await;
    let connect = json!({"id": 1, "connect": {
        "token": "", "data": {"x": 1}, "subs": {}, "name": "js", "version": "5",
        "headers": {"a": "b"}, "flag": 1, "profile": "p", "dict": "d"
    }});
    raw.send_text(&connect.to_string()).await;
    let r = raw.reply(1).await;
    assert!(r["connect"]["client"].is_string(), "{r}");
    // Every field of a stream subscribe: compaction is ignored (pushes
    // name the channel), fossil delta is answered without delta.
    let r = c
        .command(
            "subscribe",
            json!({"channel": "s", "token": "", "recover": false, "epoch": "", "offset": 0,
                   "data": {"x": 1}, "positioned": true, "recoverable": true,
                   "join_leave": false, "delta": "fossil", "flag": 1, "type": 0}),
        )
        .await;
    let sub = &r["subscribe"];
    assert_eq!(sub["recoverable"], true, "{r}");
    assert_eq!(sub["delta"], json!(null), "no delta negotiated: {r}");
    assert_eq!(sub["id"], json!(null), "no channel compaction: {r}");
    publish(&node, "s", json!({"v": 1}), json!({})).await;
    let push = c.push().await;
    assert_eq!(push["channel"], "s", "{push}");
    assert_eq!(push["pub"]["data"], json!({"v": 1}), "full data: {push}");
    assert_eq!(push["pub"]["delta"], json!(null), "{push}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tags_filter_holds_for_live_and_recovered_publications() {
    let (_place, node) = open_node().await;
    let (mut c, _) = Client::connect(&node, "").await;
    let tf = json!({"op": "or", "nodes": [
        {"key": "team", "cmp": "eq", "val": "eng"},
        {"op": "and", "nodes": [
            {"key": "level", "cmp": "gte", "val": "10"},
            {"key": "team", "cmp": "nex"}
        ]}
    ]});
    let r = c
        .command("subscribe", json!({"channel": "f", "tf": tf}))
        .await;
    let epoch = r["subscribe"]["epoch"].as_str().unwrap().to_owned();
    let published = [
        json!({"team": "ops"}),
        json!({"team": "eng"}),
        json!({"level": "9.5"}),
        json!({"level": "10.0"}),
        json!({"level": "11", "team": "ops"}),
    ];
    for (i, tags) in published.iter().enumerate() {
        publish(&node, "f", json!({"i": i}), tags.clone()).await;
    }
    publish(&node, "f", json!({"i": "last"}), json!({"team": "eng"})).await;
    let mut live = Vec::new();
    while live.last() != Some(&6) {
        let push = c.push().await;
        live.push(push["pub"]["offset"].as_u64().unwrap());
    }
    assert_eq!(
        live,
        vec![2, 4, 6],
        "team eng, or level ≥ 10 without a team"
    );
    // Recovery from offset 0 in a new connection: the same filter.
    let (mut c, _) = Client::connect(&node, "").await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "f", "tf": tf, "recover": true, "epoch": epoch, "offset": 0}),
        )
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(
        offsets(&r["subscribe"]["publications"]),
        vec![2, 4, 6],
        "{r}"
    );
    assert_eq!(
        r["subscribe"]["offset"], 6,
        "the position is the channel's: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_unrecovered_answers_112_and_leaves_nothing() {
    let (_place, node) = open_node().await;
    for i in 1..=3 {
        publish(&node, "r", json!({"n": i}), json!({})).await;
    }
    let (mut c, _) = Client::connect(&node, "").await;
    // Bit 1 of `flag`: a failed recovery is an error.
    let r = c
        .command(
            "subscribe",
            json!({"channel": "r", "recover": true, "epoch": "other", "offset": 1, "flag": 3}),
        )
        .await;
    assert_eq!(
        r["error"],
        json!({"code": 112, "message": "unrecoverable position"}),
        "{r}"
    );
    // Not subscribed: subscribing again is no 105.
    let r = c
        .command(
            "subscribe",
            json!({"channel": "r", "recover": true, "epoch": "other", "offset": 1}),
        )
        .await;
    assert_eq!(
        r["subscribe"]["recovered"],
        json!(null),
        "without the flag: {r}"
    );
    assert_eq!(r["subscribe"]["was_recovering"], true, "{r}");
    let epoch = r["subscribe"]["epoch"].as_str().unwrap().to_owned();
    let (mut c, _) = Client::connect(&node, "").await;
    let r = c
        .command(
            "subscribe",
            json!({"channel": "r", "recover": true, "epoch": epoch, "offset": 1, "flag": 2}),
        )
        .await;
    assert_eq!(
        r["subscribe"]["recovered"], true,
        "a recovery that succeeds: {r}"
    );
    assert_eq!(offsets(&r["subscribe"]["publications"]), vec![2, 3], "{r}");
}

/// A WebSocket client that asks for the binary protocol (subprotocol
/// `centrifuge-protobuf`) gets it named in the upgrade and is answered in
/// binary frames of delimited replies; a text frame there is not the
/// protocol (3501). One that also lists `centrifuge-json` gets that named
/// and is served JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subprotocol_chooses_the_encoding() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message as Frame;

    let (_place, node) = open_node().await;
    let url = format!("{}/connection/websocket", node.ws_base);
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "centrifuge-protobuf".parse().unwrap(),
    );
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "centrifuge-protobuf"
    );
    // A delimited Command: id 1 (field 1), an empty connect (field 4).
    let connect = vec![0x04, 0x08, 0x01, 0x22, 0x00];
    socket.send(Frame::Binary(connect.into())).await.unwrap();
    let reply = match socket.next().await {
        Some(Ok(Frame::Binary(bytes))) => bytes,
        other => panic!("no binary reply: {other:?}"),
    };
    // Its length, then id 1, then the connect result (field 5, length
    // delimited).
    assert_eq!(usize::from(reply[0]), reply.len() - 1, "{reply:?}");
    assert_eq!(&reply[1..4], &[0x08, 0x01, 0x2a], "{reply:?}");
    socket
        .send(Frame::Text(r#"{"id":2,"ping":{}}"#.into()))
        .await
        .unwrap();
    let closed = loop {
        match socket.next().await {
            Some(Ok(Frame::Close(frame))) => break frame.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    assert_eq!(closed, Some(3501), "a text frame on the binary protocol");
    // Listing JSON too: JSON is named and served.
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "centrifuge-protobuf, centrifuge-json".parse().unwrap(),
    );
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "centrifuge-json"
    );
    socket
        .send(Frame::Text(r#"{"id":1,"connect":{}}"#.into()))
        .await
        .unwrap();
    match socket.next().await {
        Some(Ok(Frame::Text(text))) => assert!(text.contains("\"connect\""), "{text}"),
        other => panic!("no JSON reply: {other:?}"),
    }
}
