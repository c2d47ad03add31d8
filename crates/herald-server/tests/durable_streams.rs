//! The Durable Streams wing end to end, on SQLite and PostgreSQL: a stream
//! is a channel, so what one protocol writes the others read, and a
//! stream's closure and content type bind Herald's API too. The
//! protocol's own suite runs in `crates/herald/tests/durable_streams.rs`.

use herald_server::ServerConfig;
use herald_testkit::node::{Node, Role};
use herald_testkit::place::{Backend, Place};
use herald_testkit::sse::SseClient;
use herald_testkit::{within, NODE_WAIT};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// Sends `method` to `path` with `headers` and a raw `body`; returns
/// status, headers and the body's text.
async fn send(
    node: &Node,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, HeaderMap, String) {
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
    let headers = response.headers().clone();
    (status, headers, response.text().await.expect("a body"))
}

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
const TEXT: [(&str, &str); 1] = [("content-type", "text/plain")];

async fn one_log_for_every_protocol(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    let created = send(&node, "PUT", "/ds/app/feed", &JSON, b"[]").await;
    assert_eq!(created.0, 201, "{}", created.2);
    let appended = send(
        &node,
        "POST",
        "/ds/app/feed",
        &JSON,
        br#"[{"n":1},{"n":2}]"#,
    )
    .await;
    assert_eq!(appended.0, 204, "{}", appended.2);
    assert_eq!(
        appended.1["stream-next-offset"],
        "0000000000000000_0000000000000002"
    );
    // Herald's API publishes to the stream's channel, `app:feed`.
    let (status, body) = node.publish("app:feed", json!({"n": 3})).await;
    assert_eq!((status, &body["offset"]), (201, &json!(3)), "{body}");
    let read = send(&node, "GET", "/ds/app/feed?offset=-1", &[], b"").await;
    assert_eq!(read.0, 200);
    let items: Value = serde_json::from_str(&read.2).unwrap();
    assert_eq!(items, json!([{"n": 1}, {"n": 2}, {"n": 3}]));
    let (status, history) = node.get("/v1/channels/app:feed/messages").await;
    assert_eq!(status, 200);
    let data: Vec<&Value> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["data"])
        .collect();
    assert_eq!(data, [&json!({"n": 1}), &json!({"n": 2}), &json!({"n": 3})]);
}

async fn closure_and_content_type_bind_herald_publishes(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    assert_eq!(send(&node, "PUT", "/ds/app/done", &JSON, b"").await.0, 201);
    let closed = send(
        &node,
        "POST",
        "/ds/app/done",
        &[("stream-closed", "true")],
        b"",
    )
    .await;
    assert_eq!(closed.0, 204, "{}", closed.2);
    assert_eq!(closed.1["stream-closed"], "true");
    let (status, body) = node.publish("app:done", json!(1)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("channel_closed")),
        "{body}"
    );
    let late = send(&node, "POST", "/ds/app/done", &JSON, b"1").await;
    assert_eq!(late.0, 409);
    assert_eq!(late.1["stream-closed"], "true");
    assert_eq!(
        late.1["stream-next-offset"],
        "0000000000000000_0000000000000000"
    );

    // A byte stream takes no JSON publish, and Herald's API shows its
    // bytes as base64.
    assert_eq!(send(&node, "PUT", "/ds/app/log", &TEXT, b"hi").await.0, 201);
    let (status, body) = node.publish("app:log", json!("x")).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("content_type_mismatch")),
        "{body}"
    );
    let (_, history) = node.get("/v1/channels/app:log/messages").await;
    assert_eq!(history["messages"][0]["data_base64"], "aGk=");
    let read = send(&node, "GET", "/ds/app/log", &[], b"").await;
    assert_eq!((read.0, read.2.as_str()), (200, "hi"));
}

async fn refusals_change_nothing(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    for path in ["/ds/a:b", "/ds/a%20b", "/ds/_x", "/ds/a//b"] {
        let answer = send(&node, "PUT", path, &TEXT, b"x").await;
        assert_eq!(answer.0, 400, "{path}: {}", answer.2);
        assert!(answer.2.contains("invalid_stream_request"), "{}", answer.2);
    }
    assert_eq!(send(&node, "PUT", "/ds/app/s", &TEXT, b"").await.0, 201);
    // A page of another origin cannot write, whatever the type it sends.
    let forged = send(
        &node,
        "POST",
        "/ds/app/s",
        &[
            ("content-type", "text/plain"),
            ("origin", "https://evil.example"),
        ],
        b"x",
    )
    .await;
    assert_eq!(forged.0, 403, "{}", forged.2);
    let bad_producer = send(
        &node,
        "POST",
        "/ds/app/s",
        &[("content-type", "text/plain"), ("producer-id", "p")],
        b"x",
    )
    .await;
    assert_eq!(bad_producer.0, 400);
    let head = send(&node, "HEAD", "/ds/app/s", &[], b"").await;
    assert_eq!(head.0, 200);
    assert_eq!(
        head.1["stream-next-offset"],
        "0000000000000000_0000000000000000"
    );
    assert_eq!(head.1["x-content-type-options"], "nosniff");
    let missing = send(&node, "GET", "/ds/app/nothing", &[], b"").await;
    assert_eq!(missing.0, 404);
    assert_eq!(missing.1["x-content-type-options"], "nosniff");
}

/// An SSE reader of a stream that is deleted while a fork of it lives
/// ends at the deletion, without waiting for the periodic look at the
/// stream: the fork keeps its own copy, and the source is gone (`404`).
async fn soft_deletion_ends_sse_readers(backend: Backend) {
    let place = Place::new(backend).await;
    let mut config = ServerConfig::default();
    // Far beyond the test's wait: only the deletion can end the reader.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    assert_eq!(send(&node, "PUT", "/ds/app/src", &TEXT, b"a").await.0, 201);
    let fork = send(
        &node,
        "PUT",
        "/ds/app/fork",
        &[
            ("content-type", "text/plain"),
            ("stream-forked-from", "app/src"),
        ],
        b"",
    )
    .await;
    assert_eq!(fork.0, 201, "{}", fork.2);
    let url = node.url("/ds/app/src?offset=-1&live=sse");
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    // Read up to date: the data, then its control.
    within("the stream's data", NODE_WAIT, async {
        loop {
            let event = sse.next_event().await.expect("an event");
            if event.event.as_deref() == Some("control") && event.data.contains("upToDate") {
                break;
            }
        }
    })
    .await;
    assert_eq!(send(&node, "DELETE", "/ds/app/src", &[], b"").await.0, 204);
    assert_eq!(send(&node, "GET", "/ds/app/src", &[], b"").await.0, 404);
    let rest = within("the end of the stream", NODE_WAIT, async {
        let mut rest = Vec::new();
        while let Some(event) = sse.next_event().await {
            rest.push(event);
        }
        rest
    })
    .await;
    assert!(
        rest.iter().all(|e| e.event.as_deref() != Some("data")),
        "{rest:?}"
    );
}

/// The next offset a stream's `HEAD` shows, or its status when it has
/// none.
async fn next_offset(node: &Node, path: &str) -> Result<String, u16> {
    let (status, headers, _) = send(node, "HEAD", path, &[], b"").await;
    match headers.get("stream-next-offset") {
        Some(v) if status == 200 => Ok(v.to_str().unwrap().to_owned()),
        _ => Err(status),
    }
}

/// Every stored message is held to `max_message_bytes`, whatever wrote
/// it: a Durable Streams JSON element or value, in an append or a
/// creation's body, Herald's publish and batch are refused with 413
/// `payload_too_large` one byte over it, and nothing is stored; at the
/// limit they are taken. A byte stream's append over it is stored as
/// consecutive messages of at most the limit, which read back as the
/// same bytes.
async fn messages_over_the_limit_are_refused_on_every_write_path(backend: Backend) {
    const LIMIT: usize = 1024;
    let place = Place::new(backend).await;
    let config = ServerConfig {
        max_message_bytes: LIMIT,
        ..ServerConfig::default()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let bytes = [("content-type", "application/octet-stream")];
    assert_eq!(send(&node, "PUT", "/ds/app/j", &JSON, b"[]").await.0, 201);
    assert_eq!(send(&node, "PUT", "/ds/app/b", &bytes, b"").await.0, 201);
    // A JSON string of `len` bytes, quotes included.
    let string = |len: usize| format!("\"{}\"", "x".repeat(len - 2));
    let over = string(LIMIT + 1);
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let refusals: [(&str, &str, Headers, Vec<u8>); 3] = [
        (
            "POST",
            "/ds/app/j",
            &JSON,
            format!("[1,{over}]").into_bytes(),
        ),
        ("POST", "/ds/app/j", &JSON, over.clone().into_bytes()),
        ("PUT", "/ds/app/j2", &JSON, format!("[{over}]").into_bytes()),
    ];
    for (method, path, headers, body) in refusals {
        let (status, _, text) = send(&node, method, path, headers, &body).await;
        assert_eq!(status, 413, "{method} {path}: {text}");
        let error: Value = serde_json::from_str(&text).expect("a JSON error");
        assert_eq!(error["error"]["code"], "payload_too_large", "{text}");
    }
    let empty = "0000000000000000_0000000000000000";
    assert_eq!(next_offset(&node, "/ds/app/j").await.as_deref(), Ok(empty));
    assert_eq!(next_offset(&node, "/ds/app/j2").await, Err(404));
    // Herald's API holds its publishes to the same limit.
    let data: Value = serde_json::from_str(&over).unwrap();
    assert_eq!(node.publish("app:j", data.clone()).await.0, 413);
    let batch = json!({"messages": [{"channel": "app:j", "data": data}]});
    let (status, _, text) = send(
        &node,
        "POST",
        "/v1/messages",
        &JSON,
        batch.to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(next_offset(&node, "/ds/app/j").await.as_deref(), Ok(empty));
    // At the limit: taken.
    let most = string(LIMIT);
    let taken = send(
        &node,
        "POST",
        "/ds/app/j",
        &JSON,
        format!("[{most}]").as_bytes(),
    )
    .await;
    assert_eq!(taken.0, 204, "{}", taken.2);
    let taken = send(&node, "POST", "/ds/app/b", &bytes, &[b'y'; LIMIT]).await;
    assert_eq!(taken.0, 204, "{}", taken.2);
    // Bytes over it: two messages, the same bytes.
    let body: Vec<u8> = (0..LIMIT + 1).map(|i| (i % 251) as u8).collect();
    let taken = send(&node, "POST", "/ds/app/b", &bytes, &body).await;
    assert_eq!(taken.0, 204, "{}", taken.2);
    assert_eq!(
        next_offset(&node, "/ds/app/b").await.as_deref(),
        Ok("0000000000000000_0000000000000003")
    );
    let (_, history) = node.get("/v1/channels/app:b/messages").await;
    let sizes: Vec<usize> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data_base64"].as_str().unwrap().len() / 4 * 3)
        .collect();
    assert!(sizes.iter().all(|&n| n <= LIMIT + 2), "{sizes:?}");
    let read = node
        .client
        .get(node.url("/ds/app/b?offset=0000000000000000_0000000000000001"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.bytes().await.unwrap().to_vec(), body);
    let created = send(&node, "PUT", "/ds/app/b2", &bytes, &body).await;
    assert_eq!(created.0, 201, "{}", created.2);
    assert_eq!(
        next_offset(&node, "/ds/app/b2").await.as_deref(),
        Ok("0000000000000000_0000000000000002")
    );
}

/// A history page of large messages holds at most `read_budget_bytes` of
/// them (here 4 of 4 KiB, whatever `limit` asks), never none, and paging
/// on from its last offset until the head reads every message once, in
/// order.
async fn history_pages_stay_within_the_read_budget(backend: Backend) {
    const MESSAGE: usize = 4096;
    const BUDGET: usize = 4 * MESSAGE;
    let place = Place::new(backend).await;
    let config = ServerConfig {
        max_message_bytes: MESSAGE,
        read_budget_bytes: BUDGET,
        ..ServerConfig::default()
    };
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    let big = "z".repeat(MESSAGE - 64);
    for n in 0..10 {
        let (status, body) = node.publish("app:big", json!({"n": n, "big": big})).await;
        assert_eq!(status, 201, "{body}");
    }
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let (status, page) = node
            .get(&format!(
                "/v1/channels/app:big/messages?after={after}&limit=24"
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        let messages = page["messages"].as_array().unwrap();
        let bytes: usize = messages.iter().map(|m| m["data"].to_string().len()).sum();
        assert!(bytes <= BUDGET, "a page of {bytes} bytes, budget {BUDGET}");
        assert!(messages.len() <= 4, "{} messages", messages.len());
        let Some(last) = messages.last() else {
            assert_eq!(after, page["head"], "an empty page before the head");
            break;
        };
        after = last["offset"].as_u64().unwrap();
        seen.extend(messages.iter().map(|m| m["data"]["n"].as_u64().unwrap()));
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
}

use herald_testkit::on_both_backends;

/// Counts the storage's message reads (`Storage::read`, tried or not), so
/// that a test can await a number of them.
struct ReadCount {
    reads: tokio::sync::watch::Sender<usize>,
}

impl ReadCount {
    fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            reads: tokio::sync::watch::channel(0).0,
        })
    }

    fn reads(&self) -> usize {
        *self.reads.borrow()
    }

    /// Waits until `n` reads were made in total.
    async fn wait_reads(&self, n: usize) {
        let mut reads = self.reads.subscribe();
        within(
            &format!("{n} reads"),
            NODE_WAIT,
            reads.wait_for(|r| *r >= n),
        )
        .await
        .unwrap();
    }
}

#[async_trait::async_trait]
impl herald_testkit::storage::StorageHooks for ReadCount {
    async fn before_read(&self, _channel: &herald_core::ChannelName) -> herald_storage::Result<()> {
        self.reads.send_modify(|r| *r += 1);
        Ok(())
    }
}

/// Reads `sse`'s events until a control whose `streamNextOffset` is
/// `next`; returns the data events' texts.
async fn data_until(sse: &mut SseClient, next: &str) -> Vec<String> {
    within(&format!("a control at {next}"), NODE_WAIT, async {
        let mut data = Vec::new();
        loop {
            let event = sse.next_event().await.expect("an event");
            match event.event.as_deref() {
                Some("data") => data.push(event.data),
                Some("control") if event.data.contains(next) => return data,
                _ => {}
            }
        }
    })
    .await
}

/// Live readers (SSE and long-poll) take the messages each append's notice
/// carries: after their first read of the stream they read no more
/// messages from the storage, however many appends they follow.
async fn live_readers_take_what_notices_carry(backend: Backend) {
    let place = Place::new(backend).await;
    let mut config = ServerConfig::default();
    // No periodic look at the stream during the test.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let count = ReadCount::new();
    let node = Node::start_with(&place, "node-a", Role::Holder, config, |s| {
        herald_testkit::storage::Hooked::wrap(s, count.clone())
    })
    .await;
    assert_eq!(send(&node, "PUT", "/ds/app/live", &TEXT, b"a").await.0, 201);
    let url = node.url("/ds/app/live?offset=-1&live=sse");
    let mut readers = Vec::new();
    for _ in 0..3 {
        let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
        assert_eq!(sse.status, 200);
        assert_eq!(data_until(&mut sse, "_0000000000000001").await, ["a"]);
        readers.push(sse);
    }
    let before = count.reads();
    for n in 2..=11u64 {
        let text = format!("m{n}");
        let appended = send(&node, "POST", "/ds/app/live", &TEXT, text.as_bytes()).await;
        assert_eq!(appended.0, 204, "{}", appended.2);
        let next = format!("_{n:016}");
        for sse in &mut readers {
            assert_eq!(data_until(sse, &next).await, [text.as_str()]);
        }
    }
    assert_eq!(
        count.reads(),
        before,
        "an SSE reader read what a notice carried"
    );
    // A long-poll at the tail reads once, when it begins.
    let poll = tokio::spawn({
        let client = node.client.clone();
        let url = node.url("/ds/app/live?offset=0000000000000000_0000000000000011&live=long-poll");
        async move {
            let answer = client.get(url).send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap())
        }
    });
    count.wait_reads(before + 1).await;
    let appended = send(&node, "POST", "/ds/app/live", &TEXT, b"last").await;
    assert_eq!(appended.0, 204, "{}", appended.2);
    let answer = within("the long-poll's answer", NODE_WAIT, poll)
        .await
        .unwrap();
    assert_eq!(answer, (200, "last".to_owned()));
    assert_eq!(
        count.reads(),
        before + 1,
        "a long-poll read what a notice carried"
    );
    for sse in &mut readers {
        assert_eq!(data_until(sse, "_0000000000000012").await, ["last"]);
    }
}

/// A live reader whose reads of the stream fail while the storage is
/// unavailable waits them out and goes on, rather than ending.
async fn a_live_reader_waits_out_a_read_outage(backend: Backend) {
    let place = Place::new(backend).await;
    let outage = herald_testkit::storage::ReadOutage::new();
    let node = Node::start_with(
        &place,
        "node-a",
        Role::Holder,
        ServerConfig::default(),
        |s| outage.wrap(s),
    )
    .await;
    assert_eq!(send(&node, "PUT", "/ds/app/out", &TEXT, b"a").await.0, 201);
    outage.start();
    let url = node.url("/ds/app/out?offset=-1&live=sse");
    let mut sse = SseClient::open(&node.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    // A long-poll too, from the start, while reads fail.
    let poll = tokio::spawn({
        let client = node.client.clone();
        let url = node.url("/ds/app/out?offset=-1&live=long-poll");
        async move {
            let answer = client.get(url).send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap())
        }
    });
    // Both readers try again after a failure (one that gave up would
    // have made one try each).
    outage.wait_failed("app:out", 3).await;
    let appended = send(&node, "POST", "/ds/app/out", &TEXT, b"b").await;
    assert_eq!(appended.0, 204, "{}", appended.2);
    outage.end();
    let data = data_until(&mut sse, "_0000000000000002").await.concat();
    assert_eq!(data, "ab");
    let answer = within("the long-poll's answer", NODE_WAIT, poll)
        .await
        .unwrap();
    assert_eq!(answer, (200, "ab".to_owned()));
    // It goes on live.
    let appended = send(&node, "POST", "/ds/app/out", &TEXT, b"c").await;
    assert_eq!(appended.0, 204, "{}", appended.2);
    assert_eq!(data_until(&mut sse, "_0000000000000003").await, ["c"]);
}

/// An SSE reader on a PostgreSQL standby sees the stream's close that
/// comes with its last append as the holder made it: the data, then the
/// control with `streamClosed`, and the end, without waiting for the
/// periodic look at the stream.
#[tokio::test]
async fn a_standby_reader_sees_the_close_with_the_last_append() {
    let place = Place::new(Backend::Postgres).await;
    let mut config = ServerConfig::default();
    // Far beyond the test's wait: only the notice can tell the close.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let holder = Node::start(&place, "node-a", Role::Holder, config.clone()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, config).await;
    assert_eq!(
        send(&holder, "PUT", "/ds/app/fin", &TEXT, b"a").await.0,
        201
    );
    let url = standby.url("/ds/app/fin?offset=-1&live=sse");
    let mut sse = SseClient::open(&standby.client, &url, &[]).await.unwrap();
    assert_eq!(sse.status, 200);
    assert_eq!(data_until(&mut sse, "_0000000000000001").await, ["a"]);
    let closed = send(
        &holder,
        "POST",
        "/ds/app/fin",
        &[("content-type", "text/plain"), ("stream-closed", "true")],
        b"z",
    )
    .await;
    assert_eq!(closed.0, 204, "{}", closed.2);
    let rest = within("the end of the stream", NODE_WAIT, async {
        let mut rest = Vec::new();
        while let Some(event) = sse.next_event().await {
            rest.push(event);
        }
        rest
    })
    .await;
    let last = rest.last().expect("events after the close");
    assert_eq!(last.event.as_deref(), Some("control"), "{rest:?}");
    assert!(last.data.contains("\"streamClosed\":true"), "{rest:?}");
    let data: String = rest
        .iter()
        .filter(|e| e.event.as_deref() == Some("data"))
        .map(|e| e.data.as_str())
        .collect();
    assert_eq!(data, "z");
}

/// Durable Streams' live readers on `node` (the gauge
/// `herald_subscribers{transport="durable_streams"}`).
async fn ds_subscribers(node: &Node) -> f64 {
    node.metrics()
        .await
        .lines()
        .find_map(|line| line.strip_prefix("herald_subscribers{transport=\"durable_streams\"} "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A long-poll on a PostgreSQL standby at a stream's tail answers the
/// next append with its data, when the standby's notice of it carries
/// only the new head (the reader reads the message from the storage).
#[tokio::test]
async fn a_standby_long_poll_answers_the_next_append() {
    let place = Place::new(Backend::Postgres).await;
    let mut config = ServerConfig::default();
    // Far beyond the test's wait: only the append can answer it.
    config.durable_streams.long_poll_timeout = std::time::Duration::from_secs(60);
    let _holder = Node::start(&place, "node-a", Role::Holder, config.clone()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, config).await;
    assert_eq!(
        send(&standby, "PUT", "/ds/app/tail", &TEXT, b"a").await.0,
        201
    );
    let poll = tokio::spawn({
        let client = standby.client.clone();
        let url =
            standby.url("/ds/app/tail?offset=0000000000000000_0000000000000001&live=long-poll");
        async move {
            let answer = client.get(url).send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap())
        }
    });
    // Appended once the long-poll waits (it counts as a subscriber).
    within("the long-poll's subscription", NODE_WAIT, async {
        while ds_subscribers(&standby).await < 1.0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let appended = send(&standby, "POST", "/ds/app/tail", &TEXT, b"b").await;
    assert_eq!(appended.0, 204, "{}", appended.2);
    let answer = within("the long-poll's answer", NODE_WAIT, poll)
        .await
        .unwrap();
    assert_eq!(answer, (200, "b".to_owned()));
}

on_both_backends!(
    live_readers_take_what_notices_carry: notices_feed_live_readers_on_sqlite,
    notices_feed_live_readers_on_postgres
);
on_both_backends!(
    a_live_reader_waits_out_a_read_outage: live_reader_outage_on_sqlite,
    live_reader_outage_on_postgres
);

/// The producer headers of `id`, epoch 0, sequence `seq`, with `Content-Type:
/// application/json`.
fn producer<'a>(id: &'a str, seq: &'a str) -> [(&'a str, &'a str); 4] {
    [
        ("content-type", "application/json"),
        ("producer-id", id),
        ("producer-epoch", "0"),
        ("producer-seq", seq),
    ]
}

/// A JSON append of nothing but whitespace is refused, with producer
/// headers too, and uses up no sequence number: the real append with that
/// number is stored, not taken for a duplicate.
async fn a_blank_append_uses_up_no_sequence_number(backend: Backend) {
    let place = Place::new(backend).await;
    let node = Node::start(&place, "node-a", Role::Holder, ServerConfig::default()).await;
    assert_eq!(send(&node, "PUT", "/ds/app/blank", &JSON, b"").await.0, 201);
    let blank = send(
        &node,
        "POST",
        "/ds/app/blank",
        &producer("p", "0"),
        b" \n\t ",
    )
    .await;
    assert_eq!(blank.0, 400, "{}", blank.2);
    assert!(blank.2.contains("invalid_stream_request"), "{}", blank.2);
    let real = send(
        &node,
        "POST",
        "/ds/app/blank",
        &producer("p", "0"),
        br#"{"n":0}"#,
    )
    .await;
    assert_eq!(real.0, 200, "{}", real.2);
    let read = send(&node, "GET", "/ds/app/blank?offset=-1", &[], b"").await;
    let items: Value = serde_json::from_str(&read.2).unwrap();
    assert_eq!(items, json!([{"n": 0}]));
}

/// A stream keeps state for a bounded number of producers, each of a
/// bounded `Producer-Id`, and a bounded `Stream-Seq`: past them an append
/// is refused and stores nothing.
async fn producer_state_is_bounded(backend: Backend) {
    let place = Place::new(backend).await;
    let mut config = ServerConfig::default();
    config.durable_streams.max_producers_per_stream = 2;
    let node = Node::start(&place, "node-a", Role::Holder, config).await;
    assert_eq!(send(&node, "PUT", "/ds/app/many", &JSON, b"").await.0, 201);
    let long_id = "p".repeat(257);
    let refused = send(
        &node,
        "POST",
        "/ds/app/many",
        &producer(&long_id, "0"),
        b"1",
    )
    .await;
    assert_eq!(refused.0, 400, "{}", refused.2);
    let long_seq = "9".repeat(257);
    let refused = send(
        &node,
        "POST",
        "/ds/app/many",
        &[
            ("content-type", "application/json"),
            ("stream-seq", &long_seq),
        ],
        b"1",
    )
    .await;
    assert_eq!(refused.0, 400, "{}", refused.2);
    for id in ["a", "b"] {
        let answer = send(&node, "POST", "/ds/app/many", &producer(id, "0"), b"1").await;
        assert_eq!(answer.0, 200, "{id}: {}", answer.2);
    }
    let third = send(&node, "POST", "/ds/app/many", &producer("c", "0"), b"1").await;
    assert_eq!(third.0, 409, "{}", third.2);
    assert!(third.2.contains("too_many_producers"), "{}", third.2);
    // The producers it knows go on.
    let known = send(&node, "POST", "/ds/app/many", &producer("a", "1"), b"2").await;
    assert_eq!(known.0, 200, "{}", known.2);
    let read = send(&node, "GET", "/ds/app/many?offset=-1", &[], b"").await;
    let items: Value = serde_json::from_str(&read.2).unwrap();
    assert_eq!(items, json!([1, 1, 2]));
}

/// How many appends wait for their producer's turn in this process (the
/// gauge `herald_stream_appends_waiting`).
async fn appends_waiting(node: &Node) -> f64 {
    node.metrics()
        .await
        .lines()
        .find_map(|line| line.strip_prefix("herald_stream_appends_waiting "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A pipelining producer's appends that reach the holder out of order,
/// through a standby on PostgreSQL: sequence number 2 arrives before 1 and
/// waits for it; both are stored in order, and neither is answered 409.
#[tokio::test]
async fn pipelined_appends_are_stored_in_order_through_a_postgres_standby() {
    let place = Place::new(Backend::Postgres).await;
    let mut config = ServerConfig::default();
    // The longest allowed, far above what the test needs.
    config.durable_streams.producer_gap_wait = std::time::Duration::from_secs(4);
    let holder = Node::start(&place, "node-a", Role::Holder, config).await;
    let standby = Node::start(&place, "node-b", Role::Standby, ServerConfig::default()).await;
    let standby = std::sync::Arc::new(standby);
    assert_eq!(
        send(&standby, "PUT", "/ds/app/piped", &JSON, b"").await.0,
        201
    );
    let first = send(&standby, "POST", "/ds/app/piped", &producer("p", "0"), b"0").await;
    assert_eq!(first.0, 200, "{}", first.2);
    let ahead = tokio::spawn({
        let standby = std::sync::Arc::clone(&standby);
        async move { send(&standby, "POST", "/ds/app/piped", &producer("p", "2"), b"2").await }
    });
    // Sequence number 1 is sent once 2 waits on the holder (or 2 was
    // answered, which the assertion below shows).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while appends_waiting(&holder).await < 1.0 && !ahead.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "no append waits");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let turn = send(&standby, "POST", "/ds/app/piped", &producer("p", "1"), b"1").await;
    let ahead = ahead.await.unwrap();
    assert_eq!(ahead.0, 200, "seq 2: {}", ahead.2);
    assert_eq!(turn.0, 200, "seq 1: {}", turn.2);
    let read = send(&standby, "GET", "/ds/app/piped?offset=-1", &[], b"").await;
    let items: Value = serde_json::from_str(&read.2).unwrap();
    assert_eq!(items, json!([0, 1, 2]));
}

on_both_backends!(
    soft_deletion_ends_sse_readers: soft_deletion_ends_sse_on_sqlite,
    soft_deletion_ends_sse_on_postgres
);

on_both_backends!(one_log_for_every_protocol: one_log_on_sqlite, one_log_on_postgres);
on_both_backends!(
    closure_and_content_type_bind_herald_publishes: closure_binds_publishes_on_sqlite,
    closure_binds_publishes_on_postgres
);
on_both_backends!(refusals_change_nothing: refusals_on_sqlite, refusals_on_postgres);
on_both_backends!(
    a_blank_append_uses_up_no_sequence_number: blank_append_on_sqlite,
    blank_append_on_postgres
);
on_both_backends!(
    producer_state_is_bounded: producers_bounded_on_sqlite,
    producers_bounded_on_postgres
);
on_both_backends!(
    messages_over_the_limit_are_refused_on_every_write_path: oversized_refused_on_sqlite,
    oversized_refused_on_postgres
);
on_both_backends!(
    history_pages_stay_within_the_read_budget: history_budget_on_sqlite,
    history_budget_on_postgres
);
