//! Property-based test of the Durable Streams wing's appends and reads
//! (proptest, stable toolchain), against a holder on SQLite with the
//! default limits (messages of at most `max_message_bytes`, 64 KiB;
//! appends of at most `durable_streams.max_append_bytes`, 16 MiB, each
//! message weighing its length and 32 bytes; reads of at most
//! `read_budget_bytes`, 8 MiB). Each case appends bodies of any shape (a
//! JSON array of many tiny elements, of elements at or over the message
//! limit, a lone JSON value, a body of bytes, a creation with a body) and
//! reads the stream back through the Durable Streams read and Herald's
//! history. It checks that:
//! - an append is taken whole or refused whole: `204` and the head moves
//!   by its messages (a byte stream's body in messages of at most the
//!   limit), or `413 payload_too_large` (a JSON message over the limit,
//!   messages weighing more than the append's bytes, a body over them)
//!   and nothing is stored;
//! - a history page holds at most `read_budget_bytes` of message data and
//!   at least one message, and paging by its last offset reaches the
//!   head;
//! - the process's resident memory stays within [`MEMORY_BOUND`] of what
//!   it was once the node started (an append of messages of 16 MiB, read
//!   back 24 at a time, once took a node from 47 to 969 MB);
//! - no panic anywhere in the process.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

use herald_server::ServerConfig;
use herald_testkit::memory::PeakRss;
use herald_testkit::node::{Node, Role};
use herald_testkit::place::{Backend, Place};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

/// Cases per run.
const CASES: u32 = 24;

/// How much the process's resident memory may grow during the run.
const MEMORY_BOUND: usize = 256 << 20;

/// The node's limits (the defaults).
const MAX_MESSAGE_BYTES: usize = 64 * 1024;
const MAX_APPEND_BYTES: usize = 16 * 1024 * 1024;
const READ_BUDGET_BYTES: usize = 8 * 1024 * 1024;
/// What a message weighs in an append beyond its bytes.
const MESSAGE_OVERHEAD_BYTES: usize = 32;

/// Set by the panic hook.
static PANICKED: AtomicBool = AtomicBool::new(false);

fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// One append's body.
#[derive(Debug, Clone)]
enum Body {
    /// A JSON array of `count` strings of `len` bytes each (quotes
    /// included; at least 2).
    Array { count: usize, len: usize },
    /// One JSON string of `len` bytes (quotes included).
    Value { len: usize },
    /// `len` bytes, to a byte stream.
    Bytes { len: usize },
}

impl Body {
    /// Whether it goes to the JSON stream.
    fn json(&self) -> bool {
        !matches!(self, Self::Bytes { .. })
    }

    fn render(&self) -> Vec<u8> {
        let string = |len: usize| format!("\"{}\"", "x".repeat(len.max(2) - 2));
        match *self {
            Self::Array { count, len } => {
                let one = string(len);
                let mut out = Vec::with_capacity(count * (one.len() + 1) + 2);
                out.push(b'[');
                for i in 0..count {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(one.as_bytes());
                }
                out.push(b']');
                out
            }
            Self::Value { len } => string(len).into_bytes(),
            Self::Bytes { len } => vec![b'y'; len],
        }
    }

    /// The messages it appends when taken, or `None` when the node must
    /// refuse it with 413.
    fn taken(&self, body_len: usize) -> Option<u64> {
        if body_len > MAX_APPEND_BYTES {
            return None;
        }
        match *self {
            Self::Array { count, len } => {
                let len = len.max(2);
                let weight = count * (len + MESSAGE_OVERHEAD_BYTES);
                (len <= MAX_MESSAGE_BYTES && weight <= MAX_APPEND_BYTES).then_some(count as u64)
            }
            Self::Value { len } => (len.max(2) <= MAX_MESSAGE_BYTES).then_some(1),
            Self::Bytes { len } => {
                // Consecutive messages of at most the limit.
                let pieces = len.div_ceil(MAX_MESSAGE_BYTES);
                (len + pieces * MESSAGE_OVERHEAD_BYTES <= MAX_APPEND_BYTES).then_some(pieces as u64)
            }
        }
    }
}

/// A message length around the limits.
fn message_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..64,
        64usize..4096,
        Just(MAX_MESSAGE_BYTES),
        Just(MAX_MESSAGE_BYTES + 1),
        (MAX_MESSAGE_BYTES - 16)..(MAX_MESSAGE_BYTES + 16),
        Just(1 << 20),
        Just(MAX_APPEND_BYTES - 16),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        // Many tiny elements: tens of thousands (a client's burst) up to
        // far more than the append's weight allows.
        (
            prop_oneof![1usize..100, 10_000usize..40_000, 500_000usize..600_000],
            2usize..16
        )
            .prop_map(|(count, len)| Body::Array { count, len }),
        // Few elements around the message limit.
        (1usize..300, message_len()).prop_map(|(count, len)| Body::Array {
            count: count.min(MAX_APPEND_BYTES / len.max(2) + 2),
            len
        }),
        message_len().prop_map(|len| Body::Value { len }),
        message_len().prop_map(|len| Body::Bytes { len }),
    ]
}

/// The head of `channel`, from Herald's history.
async fn head(node: &Node, channel: &str) -> u64 {
    let (status, page) = node
        .get(&format!("/v1/channels/{channel}/messages?limit=1"))
        .await;
    assert_eq!(status, 200, "{page}");
    page["head"].as_u64().expect("a head")
}

/// Appends each body to a fresh stream of case `case`, checking every
/// answer and head, then reads the streams back.
async fn run_case(node: &Node, case: usize, bodies: &[Body]) -> Result<(), TestCaseError> {
    let json_path = format!("/ds/fuzz/j{case}");
    let bytes_path = format!("/ds/fuzz/b{case}");
    for (path, content_type) in [
        (&json_path, "application/json"),
        (&bytes_path, "application/octet-stream"),
    ] {
        let created = node
            .client
            .put(node.url(path))
            .header("content-type", content_type)
            .send()
            .await
            .expect("a PUT");
        prop_assert_eq!(created.status().as_u16(), 201);
    }
    for body in bodies {
        let (path, channel, content_type) = if body.json() {
            (&json_path, format!("fuzz:j{case}"), "application/json")
        } else {
            (
                &bytes_path,
                format!("fuzz:b{case}"),
                "application/octet-stream",
            )
        };
        let before = head(node, &channel).await;
        let rendered = body.render();
        let over_body_limit = rendered.len() > MAX_APPEND_BYTES;
        let expected = body.taken(rendered.len());
        // A client of its own: a connection the node closed under a body
        // over the limit is never reused for the next request.
        let answer = reqwest::Client::new()
            .post(node.url(path))
            .header("content-type", content_type)
            .body(rendered)
            .send()
            .await;
        let (status, text) = match answer {
            Ok(answer) => (
                answer.status().as_u16(),
                answer.text().await.unwrap_or_default(),
            ),
            // A body over the limit is answered 413 from its
            // Content-Length, unread: the client may find the connection
            // closed while it still sends.
            Err(e) if over_body_limit => (413, format!("payload_too_large ({e})")),
            Err(e) => return Err(TestCaseError::fail(format!("a POST: {e}"))),
        };
        let after = head(node, &channel).await;
        match expected {
            Some(n) => {
                prop_assert_eq!(status, 204, "{:?}: {}", body, text);
                prop_assert_eq!(after, before + n, "{:?}", body);
            }
            None => {
                prop_assert_eq!(status, 413, "{:?}: {}", body, text);
                prop_assert!(text.contains("payload_too_large"), "{}", text);
                prop_assert_eq!(after, before, "a refused append stored something");
            }
        }
    }
    // Herald's history, paged at the largest limit: every page within the
    // read budget, and paging reaches the head.
    for channel in [format!("fuzz:j{case}"), format!("fuzz:b{case}")] {
        let mut after = 0;
        loop {
            let (status, page) = node
                .get(&format!(
                    "/v1/channels/{channel}/messages?after={after}&limit=1000"
                ))
                .await;
            prop_assert_eq!(status, 200, "{}", page);
            let messages = page["messages"].as_array().expect("messages");
            let data: usize = messages.iter().map(message_bytes).sum();
            prop_assert!(
                data <= READ_BUDGET_BYTES,
                "a page of {} bytes (budget {})",
                data,
                READ_BUDGET_BYTES
            );
            let head = page["head"].as_u64().expect("a head");
            let Some(last) = messages.last() else {
                prop_assert_eq!(after, head, "an empty page before the head");
                break;
            };
            after = last["offset"].as_u64().expect("an offset");
        }
        let read = node
            .client
            .get(node.url(&format!("/ds/fuzz/{}?offset=-1", &channel[5..])))
            .send()
            .await
            .expect("a GET");
        prop_assert_eq!(read.status().as_u16(), 200);
        drop(read.bytes().await);
    }
    prop_assert!(!PANICKED.load(Ordering::SeqCst), "a panic");
    Ok(())
}

/// The bytes of a history message's data as the storage holds them
/// (about: the JSON text, or the base64 of the bytes decoded).
fn message_bytes(m: &Value) -> usize {
    match (m.get("data"), m["data_base64"].as_str()) {
        (Some(data), _) => data.to_string().len(),
        (None, Some(b64)) => b64.len() / 4 * 3,
        (None, None) => 0,
    }
}

#[test]
fn appends_are_held_to_the_limits_and_reads_to_the_budget() {
    watch_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let place = rt.block_on(Place::new(Backend::Sqlite));
    let config = ServerConfig::default();
    assert_eq!(config.max_message_bytes, MAX_MESSAGE_BYTES);
    assert_eq!(config.durable_streams.max_append_bytes, MAX_APPEND_BYTES);
    assert_eq!(config.read_budget_bytes, READ_BUDGET_BYTES);
    let node = rt.block_on(Node::start(&place, "node-a", Role::Holder, config));
    let rss = PeakRss::start();
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&proptest::collection::vec(body(), 1..4), |bodies| {
        let n = case.fetch_add(1, Ordering::SeqCst);
        rt.block_on(run_case(&node, n, &bodies))
    });
    let grown = rss.growth();
    eprintln!("resident memory grew by {} MB", grown >> 20);
    rt.block_on(node.stop());
    drop(place);
    outcome.unwrap();
    assert!(
        grown < MEMORY_BOUND,
        "the process grew by {} MB (bound {} MB)",
        grown >> 20,
        MEMORY_BOUND >> 20
    );
    assert!(!PANICKED.load(Ordering::SeqCst), "a panic");
}
