//! Property-based tests of Centrifugo's server API, `POST /api/<method>`
//! (proptest, stable toolchain), against the router and the in-memory
//! storage: any method name, any API key (or none) in any of its three
//! places, and bodies that are the method's parameters with any value in
//! any field (the right JSON type or not, `null`), `b64data` that is not
//! base64 or not JSON, idempotency keys too long or not ASCII, batches of
//! commands that are garbage, `null`, nested batches or several methods
//! at once, bodies cut short, random bytes, JSON that is not an object,
//! bodies over the limit.
//!
//! The contract (`docs/centrifugo.md`), for every request:
//! - an unknown method is 404; then a missing or unknown key 401 (before
//!   the body is read); then a body over the limit 413; then a body that
//!   is not a JSON object of the method's parameters (a field of another
//!   JSON type) 400; each with `{"error": {"code", "message"}}` in
//!   Centrifugo's codes; every other answer is 200 with `{"result": ...}`
//!   or `{"error": ...}` (`batch`: `{"replies": [...]}`), never a panic or
//!   a 5xx;
//! - the storage changes only by the publications the answer reports: each
//!   new message is one a `publish`, `broadcast` or `batch` answered with
//!   its offset, and each offset answered is stored.
//!
//! Cases are bounded ([`CASES`]); failures are not persisted to files.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use herald_auth::{api_key_sha256, generate_api_key, ApiKeyConfig, AuthConfig, Permission};
use herald_core::FencingToken;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::app;
use crate::config::ServerConfig;
use crate::state::AppState;
use herald_node::testing::{FakeLease, MemoryStorage};

/// Cases per property.
const CASES: u32 = 512;

/// `max_batch_body_bytes`, the server API's body limit.
const BODY_LIMIT: usize = 8192;

/// How a value relates to the JSON type the parameter declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Typing {
    /// The declared type, or absent.
    Good,
    /// `null`: Centrifugo's decoder reads it as absent, Herald's may refuse
    /// it (400) or not.
    Lenient,
    /// Another JSON type: the body does not decode, 400.
    Bad,
}

/// A field's strategy: its value and typing, or `None` to leave it out.
type FieldStrategy = BoxedStrategy<Option<(Value, Typing)>>;

/// A holder on the in-memory storage with access control: `backend` may
/// do everything, `reader` reads `news:*`.
struct Harness {
    rt: tokio::runtime::Runtime,
    storage: Arc<MemoryStorage>,
    state: AppState,
    shutdown: CancellationToken,
    backend: String,
    reader: String,
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
        let backend = generate_api_key();
        let reader = generate_api_key();
        let key =
            |name: &str, key: &str, permissions, channels: Option<Vec<String>>| ApiKeyConfig {
                name: name.to_owned(),
                sha256: api_key_sha256(key),
                permissions,
                channels,
                publish_rate_per_s: Some(0.0),
                publish_burst: None,
            };
        let config = ServerConfig {
            max_message_bytes: 2048,
            max_batch_body_bytes: BODY_LIMIT,
            auth: AuthConfig {
                api_keys: vec![
                    key(
                        "backend",
                        &backend,
                        vec![Permission::Publish, Permission::Read, Permission::Admin],
                        None,
                    ),
                    key(
                        "reader",
                        &reader,
                        vec![Permission::Read],
                        Some(vec!["news:*".to_owned()]),
                    ),
                ],
                publish_rate_per_s: Some(0.0),
                ..AuthConfig::default()
            },
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
        // A channel with a head and a stored key to collide with.
        storage.append_as_other_node("news:a", "1");
        rt.block_on(async {
            let request = api_request(
                "publish",
                &Key::Backend,
                Carrier::XApiKey,
                &json!({"channel": "news:a", "data": 2, "idempotency_key": "k"}).to_string(),
                &backend,
                &reader,
            );
            let response = app(state.clone()).oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        });
        Self {
            rt,
            storage,
            state,
            shutdown,
            backend,
            reader,
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.rt.block_on(self.state.stopped());
    }
}

/// Which key a request carries.
#[derive(Debug, Clone)]
enum Key {
    Backend,
    Reader,
    None,
    Other(String),
}

/// Where the key goes.
#[derive(Debug, Clone, Copy)]
enum Carrier {
    XApiKey,
    Authorization,
    Query,
}

fn api_request(
    method: &str,
    key: &Key,
    carrier: Carrier,
    body: &str,
    backend: &str,
    reader: &str,
) -> Request<Body> {
    try_request(
        "POST",
        method,
        key,
        carrier,
        body.as_bytes().to_vec(),
        backend,
        reader,
    )
    .unwrap()
}

fn try_request(
    http_method: &str,
    method: &str,
    key: &Key,
    carrier: Carrier,
    body: Vec<u8>,
    backend: &str,
    reader: &str,
) -> Option<Request<Body>> {
    let key = match key {
        Key::Backend => Some(backend.to_owned()),
        Key::Reader => Some(reader.to_owned()),
        Key::None => None,
        Key::Other(k) => Some(k.clone()),
    };
    let mut uri = format!("/api/{method}");
    let mut builder = Request::builder().method(http_method);
    if let Some(key) = key {
        match carrier {
            Carrier::XApiKey => builder = builder.header("x-api-key", key),
            Carrier::Authorization => {
                builder = builder.header("authorization", format!("apikey {key}"));
            }
            Carrier::Query => {
                let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
                uri.push_str(&format!("?api_key={encoded}"));
            }
        }
    }
    builder
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .ok()
}

// ---------------------------------------------------------------------
// Generated values.

/// A small JSON value of any type.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value of another JSON type than `kind` (`null`: lenient).
fn other_type(kind: &'static str) -> impl Strategy<Value = (Value, Typing)> {
    let candidates: Vec<Value> = [
        json!(1),
        json!(-1),
        json!(1.5),
        json!("x"),
        json!(true),
        json!([]),
        json!(["a"]),
        json!({"a": 1}),
    ]
    .into_iter()
    .filter(|v| match kind {
        "string" => !v.is_string(),
        "bool" => !v.is_boolean(),
        "u64" | "i64" => {
            !(v.is_i64() || v.is_u64()) || (kind == "u64" && v.is_i64() && v.as_i64() < Some(0))
        }
        "array" => !v.is_array(),
        "object" => !v.is_object(),
        _ => true,
    })
    .collect();
    prop_oneof![
        1 => Just((Value::Null, Typing::Lenient)),
        4 => proptest::sample::select(candidates).prop_map(|v| (v, Typing::Bad)),
    ]
}

fn channel_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(vec!["news:a", "news:b", "room:a", "other"]).prop_map(str::to_owned),
        1 => proptest::sample::select(vec!["", "news:", ":x", "a b", "news:a\u{0}"]).prop_map(str::to_owned),
        1 => (129usize..400).prop_map(|n| "x".repeat(n)),
        1 => ".{0,10}",
    ]
}

fn good_or_bad(good: impl Strategy<Value = Value> + 'static, kind: &'static str) -> FieldStrategy {
    prop_oneof![
        3 => Just(None),
        12 => good.prop_map(|v| Some((v, Typing::Good))),
        2 => other_type(kind).prop_map(Some),
    ]
    .boxed()
}

fn channel_field() -> FieldStrategy {
    good_or_bad(channel_name().prop_map(Value::String), "string")
}

fn data_field() -> FieldStrategy {
    prop_oneof![
        2 => Just(None),
        8 => json_value().prop_map(|v| Some((v, Typing::Good))),
        1 => (2040usize..2060).prop_map(|n| Some((json!("d".repeat(n)), Typing::Good))),
    ]
    .boxed()
}

fn b64data_field() -> FieldStrategy {
    let engine = || base64::engine::general_purpose::STANDARD;
    let good = prop_oneof![
        json_value().prop_map(move |v| engine().encode(v.to_string())),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(move |b| engine().encode(b)),
        "[A-Za-z0-9+/=]{0,12}",
        ".{0,8}",
    ];
    prop_oneof![
        6 => Just(None),
        3 => good.prop_map(|s| Some((json!(s), Typing::Good))),
        1 => other_type("string").prop_map(Some),
    ]
    .boxed()
}

fn idempotency_key_field() -> FieldStrategy {
    let good = prop_oneof![
        proptest::sample::select(vec!["k", "j", ""]).prop_map(str::to_owned),
        "[ -~]{0,12}",
        ".{1,6}",
        (250usize..260).prop_map(|n| "k".repeat(n)),
    ];
    good_or_bad(good.prop_map(Value::String), "string")
}

fn bool_field() -> FieldStrategy {
    good_or_bad(any::<bool>().prop_map(Value::Bool), "bool")
}

fn limit_field() -> FieldStrategy {
    let good = prop_oneof![
        -3i64..=3,
        Just(i64::from(i32::MIN)),
        Just(i64::from(i32::MAX)),
        Just(1001),
    ];
    good_or_bad(good.prop_map(Value::from), "i64")
}

fn since_field() -> FieldStrategy {
    let offset = prop_oneof![
        (0u64..4).prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MAX as u64 + 1)),
    ];
    let epoch = prop_oneof![Just(String::new()), "[0-9a-f]{1,17}"].prop_map(Value::String);
    let position = (good_or_bad(offset, "u64"), good_or_bad(epoch, "string"))
        .prop_map(|fields| object(vec![("offset", fields.0), ("epoch", fields.1)]));
    prop_oneof![
        3 => Just(None),
        6 => position.prop_map(Some),
        1 => other_type("object").prop_map(Some),
    ]
    .boxed()
}

fn channels_field() -> FieldStrategy {
    let list = proptest::collection::vec(channel_name().prop_map(Value::String), 0..4)
        .prop_map(Value::Array);
    prop_oneof![
        2 => Just(None),
        8 => list.prop_map(|v| Some((v, Typing::Good))),
        1 => Just(Some((json!(["news:a", 5]), Typing::Bad))),
        1 => other_type("array").prop_map(Some),
    ]
    .boxed()
}

fn tags_field() -> FieldStrategy {
    prop_oneof![
        8 => Just(None),
        1 => Just(Some((json!({}), Typing::Good))),
        1 => Just(Some((json!({"a": "b"}), Typing::Good))),
        1 => other_type("object").prop_map(Some),
    ]
    .boxed()
}

fn disconnect_field() -> FieldStrategy {
    let code = prop_oneof![Just(3000u64), Just(3499), Just(3500), Just(4000), Just(0)]
        .prop_map(Value::from);
    // Herald does not read `reason`: any value passes.
    let reason = prop_oneof![
        Just(None),
        json_value().prop_map(|v| Some((v, Typing::Good))),
    ];
    let custom = (good_or_bad(code, "u64"), reason)
        .prop_map(|(code, reason)| object(vec![("code", code), ("reason", reason)]));
    prop_oneof![
        3 => Just(None),
        3 => custom.prop_map(Some),
        1 => other_type("object").prop_map(Some),
    ]
    .boxed()
}

/// An object of the fields that are present, and its worst typing.
fn object(fields: Vec<(&'static str, Option<(Value, Typing)>)>) -> (Value, Typing) {
    let mut map = Map::new();
    let mut typing = Typing::Good;
    for (name, field) in fields {
        if let Some((value, t)) = field {
            map.insert(name.to_owned(), value);
            typing = typing.max(t);
        }
    }
    (Value::Object(map), typing)
}

const METHODS: [&str; 10] = [
    "publish",
    "broadcast",
    "history",
    "channels",
    "info",
    "unsubscribe",
    "disconnect",
    "presence",
    "presence_stats",
    "history_remove",
];

/// The parameters of `method`, each field present or not.
fn params(method: &'static str) -> BoxedStrategy<(Value, Typing)> {
    let fields: Vec<(&'static str, FieldStrategy)> = match method {
        "publish" | "broadcast" => vec![
            if method == "publish" {
                ("channel", channel_field())
            } else {
                ("channels", channels_field())
            },
            ("data", data_field()),
            ("b64data", b64data_field()),
            ("idempotency_key", idempotency_key_field()),
            ("tags", tags_field()),
            ("skip_history", bool_field()),
        ],
        "history" => vec![
            ("channel", channel_field()),
            ("limit", limit_field()),
            ("since", since_field()),
            ("reverse", bool_field()),
        ],
        "channels" => vec![(
            "pattern",
            good_or_bad(".{0,6}".prop_map(Value::String), "string"),
        )],
        "unsubscribe" => vec![
            (
                "user",
                good_or_bad("[a-z]{0,4}".prop_map(Value::String), "string"),
            ),
            ("channel", channel_field()),
        ],
        "disconnect" => vec![
            (
                "user",
                good_or_bad("[a-z]{0,4}".prop_map(Value::String), "string"),
            ),
            ("disconnect", disconnect_field()),
        ],
        "presence" | "presence_stats" => vec![("channel", channel_field())],
        // Not served (108): whether its parameters are decoded first is
        // left open.
        "history_remove" => vec![(
            "channel",
            channel_field()
                .prop_map(|f| f.map(|(v, t)| (v, t.min(Typing::Lenient))))
                .boxed(),
        )],
        _ => vec![],
    };
    let names: Vec<&'static str> = fields.iter().map(|(n, _)| *n).collect();
    let values: Vec<_> = fields.into_iter().map(|(_, s)| s).collect();
    let known = values.prop_map(move |values| object(names.iter().copied().zip(values).collect()));
    // Fields the method does not know are ignored, whatever they hold.
    let extra = (json_value(), any::<bool>());
    let any = (known, extra).prop_map(|((mut value, typing), (extra, add))| {
        if add {
            value["extra_field"] = extra;
        }
        (value, typing)
    });
    match method {
        // Mostly publishes that go through, so that keys collide and the
        // storage moves.
        "publish" | "broadcast" => prop_oneof![2 => any, 3 => publish_params(method)].boxed(),
        _ => any.boxed(),
    }
}

/// Parameters of a publish or broadcast that is likely taken: channels of
/// the harness, any data, a key that other cases reuse (or none).
fn publish_params(method: &'static str) -> impl Strategy<Value = (Value, Typing)> {
    let channel = || proptest::sample::select(vec!["news:a", "news:b", "room:a", "other"]);
    let key = prop_oneof![
        2 => Just(None),
        1 => proptest::sample::select(vec!["k", "j", "k2"]).prop_map(Some),
    ];
    (
        channel(),
        proptest::collection::vec(channel(), 1..4),
        json_value(),
        key,
    )
        .prop_map(move |(channel, channels, data, key)| {
            let mut params = json!({ "data": data });
            if method == "publish" {
                params["channel"] = json!(channel);
            } else {
                params["channels"] = json!(channels);
            }
            if let Some(key) = key {
                params["idempotency_key"] = json!(key);
            }
            (params, Typing::Good)
        })
}

/// A batch's `commands`: each one method and its parameters, sometimes
/// several methods, `null`, a nested batch, an unknown method, or not an
/// object at all.
fn commands() -> BoxedStrategy<(Value, Typing)> {
    let method = proptest::sample::select(METHODS.to_vec());
    let one = method.prop_flat_map(|m| params(m).prop_map(move |(p, _)| json!({ m: p })));
    let command = prop_oneof![
        12 => one.clone(),
        1 => (one.clone(), one).prop_map(|(mut a, b)| {
            for (k, v) in b.as_object().unwrap() {
                a[k] = v.clone();
            }
            a
        }),
        1 => Just(Value::Null),
        1 => Just(json!({"batch": {"commands": []}})),
        1 => Just(json!({"teleport": {}})),
        1 => Just(json!({"aaa": 1, "publish": {"channel": "news:b", "data": 1}})),
        1 => Just(json!({})),
    ];
    let list =
        proptest::collection::vec(command, 0..5).prop_map(|c| (Value::Array(c), Typing::Good));
    prop_oneof![
        8 => list,
        1 => Just((json!([5]), Typing::Bad)),
        1 => other_type("array"),
    ]
    .boxed()
}

fn batch_params() -> BoxedStrategy<(Value, Typing)> {
    (
        commands(),
        good_or_bad(any::<bool>().prop_map(Value::Bool), "bool"),
    )
        .prop_map(|(commands, parallel)| {
            object(vec![("commands", Some(commands)), ("parallel", parallel)])
        })
        .boxed()
}

/// A request's body: the parameters (well typed or not), or bytes that
/// are not them at all.
#[derive(Debug, Clone)]
enum BodyKind {
    /// JSON parameters with their typing.
    Params(Value, Typing),
    /// Empty, or white space only: read as `{}`.
    Blank(String),
    /// Not a JSON object (not JSON, or another JSON value).
    NotAnObject(Vec<u8>),
    /// Over the limit.
    Oversized(Vec<u8>),
}

fn body(method: &'static str) -> BoxedStrategy<BodyKind> {
    let params = if method == "batch" {
        batch_params()
    } else {
        params(method)
    };
    let cut = (params.clone(), any::<usize>()).prop_filter_map("cut short", |((v, _), cut)| {
        let text = v.to_string();
        let cut = cut % text.len();
        (cut > 0).then(|| BodyKind::NotAnObject(text.as_bytes()[..cut].to_vec()))
    });
    prop_oneof![
        16 => params.prop_map(|(v, t)| BodyKind::Params(v, t)),
        1 => proptest::sample::select(vec!["", " ", "\n\t"]).prop_map(|s| BodyKind::Blank(s.to_owned())),
        2 => cut,
        1 => proptest::collection::vec(any::<u8>(), 1..40)
            .prop_filter_map("not an object", |b| {
                let blank = b.iter().all(u8::is_ascii_whitespace);
                let object = serde_json::from_slice::<Value>(&b).is_ok_and(|v| v.is_object());
                (!blank && !object).then_some(BodyKind::NotAnObject(b))
            }),
        1 => proptest::sample::select(vec!["[]", "5", "null", "\"x\"", "[\"news:a\", 10]", "{}}"])
            .prop_map(|s| BodyKind::NotAnObject(s.as_bytes().to_vec())),
        1 => (BODY_LIMIT - 20..BODY_LIMIT + 40).prop_map(|n| {
            let text = json!({"channel": "news:a", "data": "x".repeat(n)}).to_string();
            BodyKind::Oversized(text.into_bytes())
        }),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
struct Call {
    http_method: &'static str,
    method: String,
    key: Key,
    carrier: Carrier,
    body: BodyKind,
}

fn call() -> impl Strategy<Value = Call> {
    let method = prop_oneof![
        12 => proptest::sample::select(METHODS.to_vec()),
        3 => Just("batch"),
        1 => proptest::sample::select(vec!["teleport", "rpc", "subscribe", "Publish", "publish%00"]),
    ];
    let key = prop_oneof![
        8 => Just(Key::Backend),
        1 => Just(Key::Reader),
        1 => Just(Key::None),
        1 => "[ -~]{0,20}".prop_map(Key::Other),
    ];
    let carrier = prop_oneof![
        Just(Carrier::XApiKey),
        Just(Carrier::Authorization),
        Just(Carrier::Query),
    ];
    let http_method = prop_oneof![12 => Just("POST"), 1 => Just("GET")];
    (method, key, carrier, http_method).prop_flat_map(|(method, key, carrier, http_method)| {
        let known = METHODS.contains(&method) || method == "batch";
        let body = if known { body(method) } else { body("publish") };
        body.prop_map(move |body| Call {
            http_method,
            method: method.to_owned(),
            key: key.clone(),
            carrier,
            body,
        })
    })
}

// ---------------------------------------------------------------------
// The property.

/// Centrifugo's message for each error code the server API sends.
fn error_message(code: u64) -> Option<&'static str> {
    Some(match code {
        100 => "internal server error",
        101 => "unauthorized",
        103 => "permission denied",
        104 => "method not found",
        106 => "limit exceeded",
        107 => "bad request",
        108 => "not available",
        111 => "too many requests",
        112 => "unrecoverable position",
        _ => return None,
    })
}

/// Checks `{"error": {"code", "message"}}`: Centrifugo's message for the
/// code, which Herald may follow with `: ` and a detail.
fn check_error(error: &Value) -> Result<u64, String> {
    let code = error["code"].as_u64().ok_or(format!("no code: {error}"))?;
    let message = error_message(code).ok_or(format!("unknown code {code}"))?;
    let sent = error["message"].as_str().unwrap_or_default();
    let detail = sent.strip_prefix(message);
    if !detail.is_some_and(|rest| rest.is_empty() || rest.starts_with(": ")) {
        return Err(format!("code {code} with another message: {error}"));
    }
    Ok(code)
}

/// The publications an answer reports for a request: (channel, offset).
fn reported(
    method: &str,
    params: &Value,
    answer: &Value,
) -> Result<BTreeSet<(String, u64)>, String> {
    let mut out = BTreeSet::new();
    let result = &answer["result"];
    match method {
        "publish" => {
            if let Some(offset) = result["offset"].as_u64() {
                let channel = params["channel"]
                    .as_str()
                    .ok_or("published without a channel")?;
                out.insert((channel.to_owned(), offset));
            }
        }
        "broadcast" => {
            if let Some(responses) = result["responses"].as_array() {
                let channels = params["channels"].as_array().ok_or("no channels")?;
                if responses.len() != channels.len() {
                    return Err("one response per channel".to_owned());
                }
                for (channel, response) in channels.iter().zip(responses) {
                    if let Some(offset) = response["result"]["offset"].as_u64() {
                        out.insert((channel.as_str().unwrap().to_owned(), offset));
                    } else {
                        check_error(&response["error"])?;
                    }
                }
            }
        }
        "batch" => {
            let replies = answer["replies"]
                .as_array()
                .ok_or("batch without replies")?;
            let commands = params["commands"].as_array().ok_or("no commands")?;
            if replies.len() != commands.len() {
                return Err("one reply per command".to_owned());
            }
            for (command, reply) in commands.iter().zip(replies) {
                let reply = reply.as_object().ok_or("a reply is an object")?;
                if reply.len() != 1 {
                    return Err(format!("a reply has one field: {reply:?}"));
                }
                let (name, value) = reply.iter().next().unwrap();
                if name == "error" {
                    check_error(value)?;
                    continue;
                }
                if command.get(name).is_none() {
                    return Err(format!("a {name} reply to {command}"));
                }
                let inner = json!({ "result": value });
                out.extend(reported(name, &command[name], &inner)?);
            }
        }
        _ => {}
    }
    Ok(out)
}

/// Sends `call` and checks the property; `meddle` runs after the answer,
/// before the storage is compared (the self-test changes it there).
fn check(h: &Harness, call: &Call, meddle: impl FnOnce()) -> Result<(), TestCaseError> {
    let bytes = match &call.body {
        BodyKind::Params(v, _) => v.to_string().into_bytes(),
        BodyKind::Blank(s) => s.clone().into_bytes(),
        BodyKind::NotAnObject(b) | BodyKind::Oversized(b) => b.clone(),
    };
    let Some(request) = try_request(
        call.http_method,
        &call.method,
        &call.key,
        call.carrier,
        bytes,
        &h.backend,
        &h.reader,
    ) else {
        return Ok(());
    };
    let before = h.storage.snapshot();
    let (status, body) = h.rt.block_on(async {
        let response = app(h.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 22)
            .await
            .unwrap();
        (status, bytes)
    });
    meddle();
    let after = h.storage.snapshot();
    let text = String::from_utf8_lossy(&body).into_owned();
    let described = format!("{call:?} → {status} {text}");
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|e| TestCaseError::fail(format!("{described}: the body is not JSON: {e}")))?;
    let known = METHODS.contains(&call.method.as_str()) || call.method == "batch";
    let key_valid = matches!(call.key, Key::Backend | Key::Reader);
    // The status, in the order the checks are made.
    let expected: &[u16] = if call.http_method != "POST" {
        &[404, 405]
    } else if !known {
        &[404]
    } else if !key_valid {
        &[401]
    } else {
        match &call.body {
            BodyKind::Oversized(b) if b.len() > BODY_LIMIT => &[413],
            BodyKind::Oversized(_) => &[200, 400],
            BodyKind::NotAnObject(_) => &[400],
            BodyKind::Blank(_) => &[200],
            BodyKind::Params(_, Typing::Good) => &[200],
            BodyKind::Params(_, Typing::Lenient) => &[200, 400],
            BodyKind::Params(_, Typing::Bad) => &[400],
        }
    };
    prop_assert!(
        expected.contains(&status.as_u16()),
        "{described}: expected {expected:?}"
    );
    let object = answer
        .as_object()
        .ok_or_else(|| TestCaseError::fail(format!("{described}: not an object")))?;
    if status == StatusCode::METHOD_NOT_ALLOWED {
        // Herald's router answers it, in Herald's own error shape.
        prop_assert!(answer["error"]["code"].is_string(), "{described}");
    } else if status != StatusCode::OK || object.contains_key("error") {
        prop_assert_eq!(object.len(), 1, "{}", described);
        let code = check_error(&answer["error"])
            .map_err(|e| TestCaseError::fail(format!("{described}: {e}")))?;
        let status_code = match status.as_u16() {
            400 => Some(107),
            401 => Some(101),
            404 => Some(104),
            413 => Some(106),
            _ => None,
        };
        if let Some(expected) = status_code {
            prop_assert_eq!(code, expected, "{}", described);
        }
    } else if call.method == "batch" {
        prop_assert!(
            object.len() == 1 && object.contains_key("replies"),
            "{described}"
        );
    } else {
        prop_assert!(
            object.len() == 1 && object.contains_key("result"),
            "{described}"
        );
    }
    // Pinned: what Centrifugo refuses whatever else the call holds.
    if let (BodyKind::Params(params, Typing::Good), StatusCode::OK) = (&call.body, status) {
        let refused = match call.method.as_str() {
            "broadcast" => params["channels"].as_array().is_none_or(Vec::is_empty),
            "publish" | "history" | "presence" | "presence_stats" => {
                params["channel"].as_str().is_none_or(str::is_empty)
            }
            _ => false,
        };
        if refused {
            prop_assert_eq!(&answer["error"]["code"], 107, "{}", described);
        }
    }
    // The storage changed exactly by the publications reported.
    let reported = match (&call.body, status) {
        (BodyKind::Params(params, _), StatusCode::OK) => reported(&call.method, params, &answer)
            .map_err(|e| TestCaseError::fail(format!("{described}: {e}")))?,
        _ => BTreeSet::new(),
    };
    let existed: BTreeSet<(String, u64)> = before
        .iter()
        .map(|(name, offset, _)| (name.split(' ').next().unwrap().to_owned(), *offset))
        .collect();
    let new: BTreeSet<(String, u64)> = after
        .iter()
        .filter(|entry| !before.contains(entry))
        .map(|(name, offset, _)| (name.split(' ').next().unwrap().to_owned(), *offset))
        .collect();
    // Only a `history_remove` that succeeded removes, and only from its
    // channel: a publication the same batch reported and then removed is
    // not expected to stay.
    let cleared = match (&call.body, status) {
        (BodyKind::Params(params, _), StatusCode::OK) => cleared(&call.method, params, &answer),
        _ => BTreeSet::new(),
    };
    let kept: BTreeSet<(String, u64)> = after
        .iter()
        .map(|(name, offset, _)| (name.split(' ').next().unwrap().to_owned(), *offset))
        .collect();
    let expected_new: BTreeSet<(String, u64)> = reported
        .difference(&existed)
        .filter(|entry| !cleared.contains(&entry.0) || kept.contains(entry))
        .cloned()
        .collect();
    prop_assert_eq!(
        new,
        expected_new,
        "{} changed the storage otherwise",
        described
    );
    prop_assert!(
        before
            .iter()
            .all(|entry| after.contains(entry)
                || cleared.contains(entry.0.split(' ').next().unwrap())),
        "{described} removed something"
    );
    Ok(())
}

/// The channels whose history a successful `history_remove` in the call
/// removed: the call's own channel, or in a batch, the channel of each
/// command answered with a `history_remove` reply.
fn cleared(method: &str, params: &Value, answer: &Value) -> BTreeSet<String> {
    let channel = |p: &Value| p["channel"].as_str().map(str::to_owned);
    match method {
        "history_remove" if answer.get("result").is_some() => channel(params).into_iter().collect(),
        "batch" => {
            let commands = params["commands"].as_array().cloned().unwrap_or_default();
            let replies = answer["replies"].as_array().cloned().unwrap_or_default();
            commands
                .iter()
                .zip(&replies)
                .filter(|(_, reply)| reply.get("history_remove").is_some())
                .filter_map(|(command, _)| channel(&command["history_remove"]))
                .collect()
        }
        _ => BTreeSet::new(),
    }
}

#[test]
fn server_api_answers_as_centrifugo_and_stores_only_what_it_reports() {
    let h = Harness::new();
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&call(), |c| check(&h, &c, || {})).unwrap();
}

/// The property catches a call that stores what its answer does not
/// report (here: a message stored meanwhile, as if by the call).
#[test]
fn the_property_catches_a_change_the_answer_does_not_report() {
    let h = Harness::new();
    let call = Call {
        http_method: "POST",
        method: "history".to_owned(),
        key: Key::Backend,
        carrier: Carrier::XApiKey,
        body: BodyKind::Params(json!({"channel": "news:a"}), Typing::Good),
    };
    check(&h, &call, || {}).unwrap();
    let outcome = check(&h, &call, || {
        h.storage.append_as_other_node("news:z", "1");
    });
    let message = format!(
        "{:?}",
        outcome.expect_err("an unreported message must fail")
    );
    assert!(message.contains("changed the storage"), "{message}");
}
