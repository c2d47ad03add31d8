//! The client protocol over HTTP streaming and SSE, with the client's
//! commands posted to `/emulation` (raw HTTP): the connect reply names the
//! session and the node; replies and pushes stream as lines or SSE events;
//! a frame that is not the protocol ends the stream with a disconnect
//! push (3501), a drain with 3001; a session that does not run is 404, a
//! body that is not the protocol 400 (the binary form on SSE 415), an SSE
//! request without `cf_connect` 400; and an
//! emulation request that reaches another node than the session's is
//! forwarded there.

use std::time::Duration;

use herald_server::ServerConfig;
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};

use super::holder_and_standby;
use crate::{Backend, Node, Place, Role};

/// An HTTP streaming or SSE session read as it streams.
struct Stream {
    response: reqwest::Response,
    buffer: String,
    sse: bool,
}

impl Stream {
    /// Starts an HTTP stream on `base` with `frame` as its first frame.
    async fn http_stream(client: &reqwest::Client, base: &str, frame: Value) -> Self {
        let response = client
            .post(format!("{base}/connection/http_stream"))
            .header("content-type", "application/json")
            .body(frame.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        Self {
            response,
            buffer: String::new(),
            sse: false,
        }
    }

    /// Starts an SSE session on `base` with `frame` in `cf_connect`.
    async fn sse(client: &reqwest::Client, base: &str, frame: Value) -> Self {
        let url = reqwest::Url::parse_with_params(
            &format!("{base}/connection/sse"),
            &[("cf_connect", frame.to_string())],
        )
        .unwrap();
        let response = client.get(url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream; charset=utf-8"
        );
        Self {
            response,
            buffer: String::new(),
            sse: true,
        }
    }

    /// The next JSON object of the stream, skipping pings; `None` when
    /// the stream ended.
    async fn next(&mut self) -> Option<Value> {
        let separator = if self.sse { "\n\n" } else { "\n" };
        loop {
            if let Some(at) = self.buffer.find(separator) {
                let item: String = self.buffer.drain(..at + separator.len()).collect();
                let line = item.trim_end();
                let line = if self.sse {
                    line.strip_prefix("data: ").expect("an SSE data line")
                } else {
                    line
                };
                let value: Value = serde_json::from_str(line).unwrap();
                if value == json!({}) {
                    continue;
                }
                return Some(value);
            }
            let chunk = within("the stream", NODE_WAIT, self.response.chunk()).await;
            match chunk.ok().flatten() {
                Some(bytes) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => return None,
            }
        }
    }
}

/// Posts `frame` to `session` on `node_id` through `base`'s `/emulation`.
async fn emulate(
    client: &reqwest::Client,
    base: &str,
    node_id: &str,
    session: &str,
    frame: &str,
) -> (u16, Value) {
    let response = client
        .post(format!("{base}/emulation"))
        .header("content-type", "application/json")
        .body(json!({"node": node_id, "session": session, "data": frame}).to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

async fn publish(node: &Node, channel: &str, n: u64) {
    let (status, _, r) = node
        .call(
            "POST",
            "/api/publish",
            &[],
            Some(json!({"channel": channel, "data": {"n": n}})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
}

async fn a_session_runs_over(sse: bool) {
    let place = Place::new(Backend::Sqlite).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let client = reqwest::Client::new();
    let connect = json!({"id": 1, "connect": {"name": "raw"}});
    let mut stream = if sse {
        Stream::sse(&client, &node.base, connect).await
    } else {
        Stream::http_stream(&client, &node.base, connect).await
    };
    let connected = stream.next().await.unwrap();
    let result = &connected["connect"];
    assert_eq!(connected["id"], 1, "{connected}");
    assert_eq!(result["node"], node.node_id, "{connected}");
    let session = result["session"].as_str().unwrap().to_owned();
    assert_ne!(
        result["client"], result["session"],
        "the session is a secret"
    );
    let at = |frame: Value| frame.to_string();

    // Two commands in one posted frame; replies in order, then pushes.
    let frame = format!(
        "{}\n{}",
        at(json!({"id": 2, "subscribe": {"channel": "t"}})),
        at(json!({"id": 3, "history": {"channel": "t", "limit": 0}}))
    );
    let (status, _) = emulate(&client, &node.base, &node.node_id, &session, &frame).await;
    assert_eq!(status, 204);
    let subscribed = stream.next().await.unwrap();
    assert_eq!(subscribed["id"], 2, "{subscribed}");
    assert_eq!(subscribed["subscribe"]["recoverable"], true, "{subscribed}");
    assert_eq!(stream.next().await.unwrap()["id"], 3);
    for n in 1..=3 {
        publish(&node, "t", n).await;
    }
    for n in 1..=3 {
        let push = stream.next().await.unwrap();
        assert_eq!(push["push"]["pub"]["offset"], n, "{push}");
        assert_eq!(push["push"]["pub"]["data"], json!({"n": n}), "{push}");
    }
    // A pong (`{}`) is taken; nothing answers it.
    let (status, _) = emulate(&client, &node.base, "", &session, "{}").await;
    assert_eq!(status, 204, "the node may be left out");

    // Refusals that change nothing.
    let (status, body) = emulate(&client, &node.base, &node.node_id, "nope", "{}").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("session_not_found"))
    );
    let (status, _) = emulate(&client, &node.base, "node-z", &session, "{}").await;
    assert_eq!(status, 404, "a node no report names");
    let response = client
        .post(format!("{}/emulation", node.base))
        .header("content-type", "application/octet-stream")
        .body(vec![0x0au8, 0x05, 0x01])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "not an EmulationRequest");
    let response = client
        .post(format!("{}/emulation", node.base))
        .header("content-type", "application/json")
        .body(r#"{"session": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    // A frame that is not the protocol: the disconnect push, then the end.
    let (status, _) = emulate(&client, &node.base, &node.node_id, &session, "{nope").await;
    assert_eq!(status, 204);
    let disconnect = stream.next().await.unwrap();
    assert_eq!(
        disconnect,
        json!({"push": {"disconnect": {"code": 3501, "reason": "bad request"}}})
    );
    assert_eq!(stream.next().await, None, "the stream ends");
    let (status, _) = emulate(&client, &node.base, &node.node_id, &session, "{}").await;
    assert_eq!(status, 404, "the session is gone");

    // A drain ends a stream with 3001.
    let mut stream = if sse {
        Stream::sse(&client, &node.base, json!({"id": 1, "connect": {}})).await
    } else {
        Stream::http_stream(&client, &node.base, json!({"id": 1, "connect": {}})).await
    };
    assert_eq!(stream.next().await.unwrap()["id"], 1);
    node.stop().await;
    let drained = stream.next().await.unwrap();
    assert_eq!(drained["push"]["disconnect"]["code"], 3001, "{drained}");
    assert_eq!(stream.next().await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_over_http_streaming() {
    a_session_runs_over(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_over_sse() {
    a_session_runs_over(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_starts_are_refused() {
    let place = Place::new(Backend::Sqlite).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let client = reqwest::Client::new();
    // Each refusal is a JSON error with its code.
    let refused = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        (status, body["error"]["code"].as_str().map(str::to_owned))
    };
    let code = |status: u16, code: &str| (status, Some(code.to_owned()));
    let sse = |query: &[(&str, String)]| {
        reqwest::Url::parse_with_params(&format!("{}/connection/sse", node.base), query).unwrap()
    };
    let get = client.get(format!("{}/connection/sse", node.base));
    assert_eq!(
        refused(get.send().await.unwrap()).await,
        code(400, "invalid_query"),
        "no cf_connect"
    );
    let connect = json!({"id": 1, "connect": {}}).to_string();
    let twice = sse(&[
        ("cf_connect", connect.clone()),
        ("cf_connect", connect.clone()),
    ]);
    assert_eq!(
        refused(client.get(twice).send().await.unwrap()).await,
        code(400, "invalid_query")
    );
    // A GET any page can make (an image) may connect, and run nothing
    // else: a publish beside the connect is refused, and stores nothing.
    let publish = json!({"id": 2, "publish": {"channel": "csrf", "data": {}}}).to_string();
    let sneaky = sse(&[("cf_connect", format!("{connect}\n{publish}"))]);
    assert_eq!(
        refused(client.get(sneaky).send().await.unwrap()).await,
        code(400, "invalid_query")
    );
    // A page of a foreign origin is refused, as for a WebSocket.
    let foreign = client
        .get(sse(&[("cf_connect", connect.clone())]))
        .header("origin", "https://evil.example");
    assert_eq!(
        refused(foreign.send().await.unwrap()).await,
        code(403, "origin_not_allowed")
    );
    // POSTs take only what a page sends after a CORS preflight.
    for (path, body) in [
        ("/connection/http_stream", format!("{connect}\n{publish}")),
        ("/connection/sse", connect.clone()),
        (
            "/emulation",
            json!({"session": "s", "data": "{}"}).to_string(),
        ),
    ] {
        let plain = client
            .post(format!("{}{path}", node.base))
            .header("content-type", "text/plain")
            .body(body.clone());
        assert_eq!(
            refused(plain.send().await.unwrap()).await,
            code(415, "unsupported_media_type"),
            "{path}"
        );
        let foreign = client
            .post(format!("{}{path}", node.base))
            .header("content-type", "application/json")
            .header("origin", "https://evil.example")
            .body(body);
        assert_eq!(
            refused(foreign.send().await.unwrap()).await,
            code(403, "origin_not_allowed"),
            "{path}"
        );
    }
    let (status, _, history) = node
        .call(
            "POST",
            "/api/history",
            &[],
            Some(json!({"channel": "csrf", "limit": -1})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        history["result"]["offset"], 0,
        "nothing was published: {history}"
    );
    // Bodies over the frame limit: 413 in JSON.
    let huge = "x".repeat(2 << 20);
    for path in ["/connection/http_stream", "/emulation"] {
        let post = client
            .post(format!("{}{path}", node.base))
            .header("content-type", "application/json")
            .body(huge.clone());
        assert_eq!(
            refused(post.send().await.unwrap()).await,
            code(413, "payload_too_large"),
            "{path}"
        );
    }
    let post = client
        .post(format!("{}/connection/http_stream", node.base))
        .header("content-type", "application/octet-stream")
        .body(vec![0x0a, 0x02]);
    assert_eq!(
        refused(post.send().await.unwrap()).await,
        code(400, "invalid_body"),
        "a cut protobuf command"
    );
    let post = client
        .post(format!("{}/connection/sse", node.base))
        .header("content-type", "application/octet-stream")
        .body(vec![0x04, 0x08, 0x01, 0x22, 0x00]);
    assert_eq!(
        refused(post.send().await.unwrap()).await,
        code(415, "unsupported_media_type"),
        "SSE is text"
    );
    let post = client
        .post(format!("{}/connection/http_stream", node.base))
        .header("content-type", "application/json");
    assert_eq!(
        refused(post.send().await.unwrap()).await,
        code(400, "invalid_body"),
        "an empty body"
    );
    let get = client.get(format!("{}/connection/http_stream", node.base));
    assert_eq!(get.send().await.unwrap().status(), 405);
    // A first frame that is not a connect closes at once.
    let mut stream = Stream::http_stream(
        &client,
        &node.base,
        json!({"id": 1, "subscribe": {"channel": "a"}}),
    )
    .await;
    let closed = stream.next().await.unwrap();
    assert_eq!(closed["push"]["disconnect"]["code"], 3501, "{closed}");
    assert_eq!(stream.next().await, None);
}

/// A value published pretty-printed (raw line breaks between its tokens)
/// reaches an SSE and an HTTP-streaming subscriber as one event, one line:
/// the same value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pretty_printed_data_keeps_to_one_line() {
    let place = Place::new(Backend::Sqlite).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let client = reqwest::Client::new();
    let connect = json!({"id": 1, "connect": {}});
    let mut streams = vec![
        Stream::sse(&client, &node.base, connect.clone()).await,
        Stream::http_stream(&client, &node.base, connect).await,
    ];
    for stream in &mut streams {
        let session = stream.next().await.unwrap()["connect"]["session"]
            .as_str()
            .unwrap()
            .to_owned();
        let frame = json!({"id": 2, "subscribe": {"channel": "pretty"}}).to_string();
        let (status, _) = emulate(&client, &node.base, "", &session, &frame).await;
        assert_eq!(status, 204);
        assert_eq!(stream.next().await.unwrap()["id"], 2);
    }
    let body =
        "{\"channel\": \"pretty\", \"data\": {\n  \"a\": [\r\n    1,\n    \"x\\ny\"\n  ]\n}}";
    let response = client
        .post(format!("{}/api/publish", node.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    for stream in &mut streams {
        let push = stream.next().await.unwrap();
        assert_eq!(
            push["push"]["pub"]["data"],
            json!({"a": [1, "x\ny"]}),
            "{push}"
        );
    }
}

/// On PostgreSQL the session's stream is on the standby; its commands are
/// posted to the holder, which forwards them to the standby it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulation_requests_are_forwarded_to_the_sessions_node() {
    let (_place, creds, holder, standby) = holder_and_standby(Backend::Postgres).await;
    let client = reqwest::Client::new();
    let token = creds.token_for("ann", json!({"channels": ["news:*"]}));
    let connect = json!({"id": 1, "connect": {"token": token}});
    let mut stream = Stream::http_stream(&client, &standby.base, connect).await;
    let connected = stream.next().await.unwrap();
    let session = connected["connect"]["session"].as_str().unwrap().to_owned();
    assert_eq!(connected["connect"]["node"], standby.node_id);
    // The holder learns the standby's URL from its node report.
    within("the standby's report", NODE_WAIT, async {
        loop {
            let reports = holder.storage.node_reports().await.unwrap();
            if reports
                .iter()
                .any(|r| r.node_id == standby.node_id && !r.url.is_empty())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let frame = json!({"id": 2, "subscribe": {"channel": "news:x"}}).to_string();
    let (status, body) = emulate(&client, &holder.base, &standby.node_id, &session, &frame).await;
    assert_eq!(status, 204, "{body}");
    let subscribed = stream.next().await.unwrap();
    assert_eq!(subscribed["id"], 2, "{subscribed}");
    assert!(subscribed["subscribe"]["epoch"].is_string(), "{subscribed}");
    // One hop: a request that says it was forwarded already is not.
    let response = client
        .post(format!("{}/emulation", holder.base))
        .header("content-type", "application/json")
        .header("herald-forwarded-by", "node-q")
        .body(json!({"node": standby.node_id, "session": session, "data": "{}"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}
