//! Property-based tests of every request parser (proptest, stable
//! toolchain): channel names and percent-encoded paths, publish and batch
//! bodies, `Idempotency-Key`, `Last-Event-ID` and query parameters. The
//! property, for every generated request: the answer is a `2xx`, or a `4xx`
//! with the JSON error shape; never a panic or a `5xx`; and a refused
//! request changes nothing in the storage (its snapshot before and after
//! are equal). WebSocket frames are fuzzed over a real socket in
//! `tests/fuzz_ws.rs`.
//!
//! The number of cases per property is bounded ([`CASES`]) so the whole
//! set runs in seconds; failures are not persisted to files (the seed is
//! printed instead).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use herald_core::FencingToken;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::app;
use crate::config::ServerConfig;
use crate::state::AppState;
use herald_node::testing::{FakeLease, MemoryStorage};

/// Cases per property.
const CASES: u32 = 256;

/// A holder on the in-memory storage, with small limits so that generated
/// inputs reach them.
struct Harness {
    rt: tokio::runtime::Runtime,
    storage: Arc<MemoryStorage>,
    state: AppState,
    shutdown: CancellationToken,
}

impl Harness {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let storage = MemoryStorage::new();
        let shutdown = CancellationToken::new();
        let config = ServerConfig {
            max_message_bytes: 2048,
            max_batch_body_bytes: 8192,
            ..ServerConfig::default()
        };
        let state = rt
            .block_on(AppState::start_with(
                storage.clone(),
                FakeLease::holder(FencingToken(1)),
                config,
                shutdown.clone(),
            ))
            .unwrap();
        // Something to read and to collide with: a channel with a head and
        // a stored key.
        storage.append_as_other_node("seeded", "1");
        Self {
            rt,
            storage,
            state,
            shutdown,
        }
    }

    /// Sends `request` and checks the property; `Ok` for a 2xx or a
    /// well-formed 4xx that left the storage as it was.
    fn check(&self, request: Request<Body>) -> Result<(), TestCaseError> {
        let before = self.storage.snapshot();
        let described = format!("{} {}", request.method(), request.uri());
        let (status, body) = self.rt.block_on(async {
            let response = app(self.state.clone()).oneshot(request).await.unwrap();
            let status = response.status();
            let is_stream = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            // An event stream never ends: its status says enough.
            let bytes = if is_stream {
                Default::default()
            } else {
                axum::body::to_bytes(response.into_body(), 1 << 22)
                    .await
                    .unwrap()
            };
            (status, bytes)
        });
        prop_assert!(
            status.is_success() || status.is_client_error(),
            "{described}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        if status.is_client_error() {
            let json: Value = serde_json::from_slice(&body).map_err(|e| {
                TestCaseError::fail(format!("{described}: {status} body is not JSON: {e}"))
            })?;
            prop_assert!(
                json["error"]["code"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
                    && json["error"]["message"].is_string(),
                "{described}: {status} {json}"
            );
            prop_assert_eq!(
                &before,
                &self.storage.snapshot(),
                "{} changed storage",
                described
            );
        }
        Ok(())
    }

    fn run<S: Strategy>(&self, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
    where
        S::Value: std::fmt::Debug,
    {
        let mut runner = TestRunner::new(Config {
            cases: CASES,
            failure_persistence: None,
            ..Config::default()
        });
        runner.run(&strategy, test).unwrap();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.rt.block_on(self.state.stopped());
    }
}

/// A path segment: any bytes, each written raw when it is a URI path
/// character and percent-encoded otherwise (or at random).
fn segment() -> impl Strategy<Value = String> {
    let byte = prop_oneof![
        4 => proptest::sample::select(b"abcAZ09-_.:~".to_vec()),
        1 => any::<u8>(),
    ];
    proptest::collection::vec((byte, any::<bool>()), 0..40).prop_map(|bytes| {
        bytes
            .into_iter()
            .map(|(b, encode)| {
                if !encode && (b.is_ascii_alphanumeric() || b"-_.:~".contains(&b)) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    })
}

/// A JSON value, small.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bytes that are sometimes JSON, sometimes almost, sometimes not at all.
fn body_bytes(valid: impl Strategy<Value = Value>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => valid.prop_map(|v| v.to_string().into_bytes()),
        // A valid body cut short or with bytes appended.
        2 => (json_value(), any::<usize>(), proptest::collection::vec(any::<u8>(), 0..8))
            .prop_map(|(v, cut, tail)| {
                let mut b = serde_json::json!({ "data": v }).to_string().into_bytes();
                b.truncate(cut % (b.len() + 1));
                b.extend(tail);
                b
            }),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
        // Around the size limit (2048 bytes here).
        1 => (2030usize..2060).prop_map(|n| format!(r#"{{"data":"{}"}}"#, "x".repeat(n)).into_bytes()),
        // Deep nesting around the depth limit.
        1 => (100usize..140).prop_map(|n| format!(r#"{{"data":{}1{}}}"#, "[".repeat(n), "]".repeat(n)).into_bytes()),
    ]
}

/// A header value: any bytes the HTTP layer lets through.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => "[ -~]{0,40}".prop_map(String::into_bytes),
        1 => "[0-9+ -]{0,24}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

fn request(
    method: Method,
    uri: &str,
    headers: &[(&str, &[u8])],
    body: Vec<u8>,
) -> Option<Request<Body>> {
    // A JSON body's type, unless the case gives one: the JSON routes
    // refuse other types before the body is looked at.
    let typed = headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
    let json = method == Method::POST && !typed;
    let mut builder = Request::builder().method(method).uri(uri);
    if json {
        builder = builder.header("content-type", "application/json");
    }
    for (name, value) in headers {
        builder = builder.header(*name, axum::http::HeaderValue::from_bytes(value).ok()?);
    }
    builder.body(Body::from(body)).ok()
}

#[test]
fn channel_paths_are_answered_2xx_or_4xx() {
    let h = Harness::new();
    let route = proptest::sample::select(vec!["messages", "events", "messages?after=0&limit=2"]);
    h.run(
        (segment(), route, any::<bool>()),
        |(segment, route, post)| {
            let uri = format!("/v1/channels/{segment}/{route}");
            let method = if post { Method::POST } else { Method::GET };
            let Some(req) = request(method, &uri, &[], br#"{"data":1}"#.to_vec()) else {
                return Ok(());
            };
            h.check(req)
        },
    );
}

#[test]
fn publish_bodies_and_idempotency_keys_are_answered_2xx_or_4xx() {
    let h = Harness::new();
    let valid = json_value().prop_map(|v| serde_json::json!({ "data": v }));
    let key = prop_oneof![
        2 => Just(None),
        1 => Just(Some(b"k".to_vec())),
        2 => header_bytes().prop_map(Some),
    ];
    h.run((body_bytes(valid), key), |(body, key)| {
        let headers: Vec<(&str, &[u8])> = key
            .iter()
            .map(|k| ("idempotency-key", k.as_slice()))
            .collect();
        let Some(req) = request(Method::POST, "/v1/channels/seeded/messages", &headers, body)
        else {
            return Ok(());
        };
        h.check(req)
    });
}

#[test]
fn batch_bodies_are_answered_2xx_or_4xx() {
    let h = Harness::new();
    let channel = prop_oneof![
        3 => proptest::sample::select(vec!["seeded", "b", "c:1"]).prop_map(str::to_owned),
        1 => ".{0,12}",
    ];
    let key = prop_oneof![
        Just(None),
        proptest::sample::select(vec!["k", "j"]).prop_map(|k| Some(k.to_owned())),
        "[ -~]{0,10}".prop_map(Some),
    ];
    let entry = (channel, json_value(), key).prop_map(|(channel, data, key)| {
        let mut e = serde_json::json!({ "channel": channel, "data": data });
        if let Some(key) = key {
            e["idempotency_key"] = Value::String(key);
        }
        e
    });
    let valid =
        proptest::collection::vec(entry, 0..6).prop_map(|m| serde_json::json!({ "messages": m }));
    h.run(body_bytes(valid), |body| {
        let Some(req) = request(Method::POST, "/v1/messages", &[], body) else {
            return Ok(());
        };
        h.check(req)
    });
}

#[test]
fn resume_points_and_query_parameters_are_answered_2xx_or_4xx() {
    let h = Harness::new();
    let name = proptest::sample::select(vec!["after", "limit", "role", "x", "after%00"]);
    // Values: offsets around the seeded channel's head (1), any integer,
    // or any percent-encoded bytes.
    let value = prop_oneof![
        2 => (0u64..4).prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        2 => segment(),
    ];
    let pair = (name, value).prop_map(|(n, v)| format!("{n}={v}"));
    let query = proptest::collection::vec(pair, 0..4).prop_map(|p| p.join("&"));
    let route = proptest::sample::select(vec![
        "/v1/channels/seeded/messages",
        "/v1/channels/seeded/events",
        "/v1/channels/seeded/ws",
        "/readyz",
    ]);
    let last_event_id = prop_oneof![
        Just(None),
        (0u64..4).prop_map(|n| Some(n.to_string().into_bytes())),
        header_bytes().prop_map(Some),
    ];
    h.run((route, query, last_event_id), |(route, query, id)| {
        let headers: Vec<(&str, &[u8])> =
            id.iter().map(|v| ("last-event-id", v.as_slice())).collect();
        let Some(req) = request(
            Method::GET,
            &format!("{route}?{query}"),
            &headers,
            Vec::new(),
        ) else {
            return Ok(());
        };
        h.check(req)
    });
}

/// The harness itself can fail: a 5xx is caught.
#[test]
fn the_property_catches_a_server_error() {
    let h = Harness::new();
    h.storage.fail_reads(true);
    let req = request(Method::GET, "/v1/channels/seeded/messages", &[], Vec::new()).unwrap();
    let outcome = h.check(req);
    let message = format!("{:?}", outcome.expect_err("a 503 must fail the property"));
    assert!(
        message.contains(StatusCode::SERVICE_UNAVAILABLE.as_str()),
        "{message}"
    );
}
