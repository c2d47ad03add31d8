//! Property-based test of Centrifugo's client protocol at
//! `/connection/websocket` (proptest, stable toolchain), over a real
//! socket against a node on SQLite with JWT access control: sessions of
//! random frames, each of newline-separated lines that are commands of
//! every method with any value in every field (the right JSON type or
//! not, offsets near `u64::MAX`, negative and huge limits, epochs of odd
//! lengths, channel names too long or with control characters, ids that
//! are negative, fractional, strings, beyond `u32`), garbage, truncated
//! JSON, binary frames and text frames that are not UTF-8; commands
//! before `connect`, a second `connect`, subscribes to a channel already
//! subscribed, unsubscribes of channels never subscribed; and pipelined
//! frames of up to 400 copies of one command (a `history` of a channel of
//! 1000 messages of 1000 bytes among them), below and above the 256
//! commands a frame may hold.
//!
//! The contract, checked after every frame (`docs/centrifugo.md`):
//! - each line is answered as the protocol says: a command with an id
//!   gets exactly one reply with that id, a result named after its method
//!   or an `error` with Centrifugo's code and message for what it asked;
//!   a command without an id is a pong and gets nothing; a line that is
//!   not a command, a field of the wrong JSON type, a command before
//!   `connect`, a second `connect` close the connection with 3501, a
//!   token that does not verify with 3500, `send` with 3508, and nothing
//!   follows a close; replies come in command order;
//! - the connection never hangs: after every frame a `ping` (or, before
//!   `connect`, a `connect`) in a frame of its own is answered;
//! - the storage changes only as the replies say: a channel's head moves
//!   by one for each `publish` answered `{}` and never otherwise, and the
//!   presence rows of the connection are exactly its subscriptions in the
//!   namespace with presence;
//! - a frame of more than 256 commands is not run: no reply, a 3013
//!   close;
//! - the process's resident memory stays within [`MEMORY_BOUND`] of what
//!   it was once the node started (replies are written as they are
//!   ready: a frame of 256 `history` commands of the large channel once
//!   buffered 256 MB of replies, twice);
//! - no panic anywhere in the process.
//!
//! Cases are bounded ([`SESSIONS`]); failures are not persisted to files
//! (proptest prints the minimal session it found).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use futures::{SinkExt, StreamExt};
use herald_auth::{
    AuthConfig, JwtConfig, NamespaceRule, NamespacesConfig, OneOrMany, PublishRule, Secret,
    SubscribeRule,
};
use herald_core::{ChannelName, Offset};
use herald_server::{CentrifugoConfig, ServerConfig};
use herald_testkit::memory::PeakRss;
use herald_testkit::node::{Node, Role};
use herald_testkit::place::{Backend, Place};
use herald_testkit::ws::Ws;
use herald_testkit::{within, NODE_WAIT};
use jsonwebtoken::{encode, EncodingKey, Header};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame as RawFrame;
use tokio_tungstenite::tungstenite::Message as Frame;

/// Sessions (proptest cases) per run.
const SESSIONS: u32 = 256;

/// How much the process's resident memory may grow during the run.
const MEMORY_BOUND: usize = 128 << 20;

/// The most commands a frame may hold (the node's `channel_limit` is
/// the default, 128).
const COMMANDS_PER_FRAME: usize = 256;

/// A channel of 1000 messages of about 1000 bytes, published before the
/// sessions: a `history` of it answers 1 MB.
const BIG_CHANNEL: &str = "room:big";

/// `max_message_bytes` of the node: publications around it reach 106.
const MAX_MESSAGE_BYTES: usize = 1024;

/// The channels whose heads and presence rows are checked: `room` is the
/// namespace where tokens publish and presence is on.
const CHANNELS: [&str; 4] = ["room:a", "room:b", "open:a", "news:a"];
/// The channels of [`CHANNELS`] with presence.
const PRESENCE_CHANNELS: [&str; 2] = ["room:a", "room:b"];

/// Set by the panic hook: a panic on one of this test's runtime threads
/// (the node's tasks included; tokio would otherwise swallow them).
static PANICKED: AtomicBool = AtomicBool::new(false);
/// The name of this test's runtime threads.
const THREAD_NAME: &str = "centrifugo-fuzz";

fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(THREAD_NAME) {
                PANICKED.store(true, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

// ---------------------------------------------------------------------
// What is generated.

/// How a field's value relates to the JSON type the protocol declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Typing {
    /// The declared type (or the field absent where that is allowed).
    Good,
    /// `null`, or a type that Centrifugo's decoder and Herald's may judge
    /// differently: a reply, nothing or a 3501 close are all allowed.
    Lenient,
    /// Another JSON type: the command does not decode, 3501.
    Bad,
}

/// A token a command may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// None (`""`): anonymous.
    Empty,
    /// Alice's connection token: `room:*`, `open:*`, `news:*`, publishes
    /// to `room:*`.
    Alice,
    /// Eve's, another user with no channels.
    Eve,
    /// Alice's subscription token for `room:a`.
    AliceSub,
    /// Alice's, expired: 109.
    Expired,
    /// Alice's with its signature altered: 3500.
    Forged,
    /// Not a JWT: 3500.
    Garbage,
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        1 => Just(Token::Empty),
        3 => Just(Token::Alice),
        1 => Just(Token::Eve),
        1 => Just(Token::AliceSub),
        1 => Just(Token::Expired),
        1 => Just(Token::Forged),
        1 => Just(Token::Garbage),
    ]
}

/// A field's strategy: `None` leaves the field out.
type FieldStrategy = BoxedStrategy<Option<(Field, Typing)>>;

/// A field value, resolved when the session runs: some depend on the
/// channel's epoch and head then.
#[derive(Debug, Clone)]
enum Field {
    Json(Value),
    Token(Token),
    /// The epoch of the request's channel ("" when it has none).
    Epoch,
    /// The head of the request's channel plus this (at least 0).
    Head(i8),
}

/// A request: its fields (absent ones are left out), or a value that is
/// not an object.
#[derive(Debug, Clone)]
enum Request {
    Object(Vec<(&'static str, Field)>),
    Other(Value),
}

/// One generated command.
#[derive(Debug, Clone)]
struct Command {
    /// `None`: no `id` field; `Some(Json(n))` with a positive number is
    /// replaced by a fresh id when the session runs, so that ids are unique.
    id: Option<Value>,
    /// Methods and their requests (usually one).
    methods: Vec<(&'static str, Request)>,
    /// The worst typing among its fields.
    typing: Typing,
}

/// One line of a text frame.
#[derive(Debug, Clone)]
enum Line {
    Command(Command),
    /// Any text (no newline): garbage, JSON that is not an object.
    Text(String),
    /// A command's text cut short.
    Truncated(Command, usize),
}

/// One frame of a session.
#[derive(Debug, Clone)]
enum GenFrame {
    /// Lines joined by `\n` (`\r\n` when `crlf`).
    Text { lines: Vec<Line>, crlf: bool },
    /// A binary frame: not the JSON protocol.
    Binary(Vec<u8>),
    /// A text frame whose payload is not UTF-8 (raw bytes with an invalid
    /// sequence in them).
    NotUtf8(Vec<u8>),
    /// `count` copies of one command, pipelined in one frame.
    Pipelined { command: Command, count: usize },
}

#[derive(Debug, Clone)]
struct Session {
    /// Starts with a `connect` with Alice's token as its first line.
    connect_first: bool,
    frames: Vec<GenFrame>,
}

fn typed(value: Value, typing: Typing) -> (Field, Typing) {
    (Field::Json(value), typing)
}

/// A value of a JSON type other than string (or `null`).
fn not_a_string() -> impl Strategy<Value = (Field, Typing)> {
    prop_oneof![
        Just(typed(Value::Null, Typing::Lenient)),
        any::<i64>().prop_map(|n| typed(json!(n), Typing::Bad)),
        any::<bool>().prop_map(|b| typed(json!(b), Typing::Bad)),
        Just(typed(json!([]), Typing::Bad)),
        Just(typed(json!({"a": 1}), Typing::Bad)),
        Just(typed(json!(1.5), Typing::Bad)),
    ]
}

/// Any string: printable, control characters, very long, any Unicode.
fn any_string() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,12}",
        "[\\x00-\\x1f]{1,4}",
        "[a-z:]{0,4}[\\x00-\\x1f\\x7f ][a-z]{0,4}",
        (129usize..3000).prop_map(|n| "x".repeat(n)),
        any::<String>(),
    ]
}

fn channel_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    let odd = vec![
        "keyonly:x".to_owned(),
        String::new(),
        "room:".to_owned(),
        ":x".to_owned(),
        "room:a ".to_owned(),
        "x".repeat(128),
    ];
    let good = prop_oneof![
        6 => proptest::sample::select(CHANNELS.to_vec()).prop_map(str::to_owned),
        1 => proptest::sample::select(odd),
        2 => any_string(),
    ];
    prop_oneof![
        12 => good.prop_map(|s| Some(typed(json!(s), Typing::Good))),
        // A channel is required: without one the command does not decode.
        1 => Just(None),
        2 => not_a_string().prop_map(Some),
    ]
}

fn string_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    prop_oneof![
        3 => Just(None),
        6 => any_string().prop_map(|s| Some(typed(json!(s), Typing::Good))),
        1 => not_a_string().prop_map(Some),
    ]
}

fn token_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    prop_oneof![
        6 => Just(None),
        4 => token().prop_map(|t| Some((Field::Token(t), Typing::Good))),
        1 => not_a_string().prop_map(Some),
    ]
}

fn bool_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    prop_oneof![
        3 => Just(None),
        6 => any::<bool>().prop_map(|b| Some(typed(json!(b), Typing::Good))),
        1 => Just(Some(typed(Value::Null, Typing::Lenient))),
        1 => prop_oneof![Just(json!(1)), Just(json!("true")), Just(json!([]))]
            .prop_map(|v| Some(typed(v, Typing::Bad))),
    ]
}

/// An offset (`uint64`): small, at the head, near `i64::MAX` and
/// `u64::MAX`; or negative, fractional, a string.
fn offset_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    let good = prop_oneof![
        (0u64..4).prop_map(|n| Field::Json(json!(n))),
        (-2i8..=2).prop_map(Field::Head),
        (0u64..3).prop_map(|k| Field::Json(json!(u64::MAX - k))),
        (0u64..3).prop_map(|k| Field::Json(json!(i64::MAX as u64 - 1 + k))),
    ];
    prop_oneof![
        2 => Just(None),
        8 => good.prop_map(|f| Some((f, Typing::Good))),
        1 => Just(Some(typed(Value::Null, Typing::Lenient))),
        2 => prop_oneof![
            Just(json!(-1)),
            Just(json!(1.5)),
            Just(json!("3")),
            Just(json!(1e30)),
            Just(json!(true)),
        ]
        .prop_map(|v| Some(typed(v, Typing::Bad))),
    ]
}

/// A history limit (`int32`): 0, negative, above the server's bound; or
/// beyond `int32` (Herald reads an `i64`), fractional, a string.
fn limit_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    let good = prop_oneof![
        -3i64..=3,
        Just(i64::from(i32::MIN)),
        Just(i64::from(i32::MAX)),
        Just(1000),
        Just(1001),
    ];
    prop_oneof![
        2 => Just(None),
        8 => good.prop_map(|n| Some(typed(json!(n), Typing::Good))),
        1 => prop_oneof![Just(json!(i64::MAX)), Just(json!(i64::MIN)), Just(Value::Null)]
            .prop_map(|v| Some(typed(v, Typing::Lenient))),
        1 => prop_oneof![Just(json!(u64::MAX)), Just(json!(2.5)), Just(json!("10")), Just(json!({}))]
            .prop_map(|v| Some(typed(v, Typing::Bad))),
    ]
}

/// An epoch: the channel's, another of any length, empty.
fn epoch_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    let good = prop_oneof![
        3 => Just(Field::Epoch),
        1 => Just(Field::Json(json!(""))),
        2 => "[0-9a-f]{1,17}".prop_map(|s| Field::Json(json!(s))),
        1 => any_string().prop_map(|s| Field::Json(json!(s))),
    ];
    prop_oneof![
        2 => Just(None),
        8 => good.prop_map(|f| Some((f, Typing::Good))),
        1 => not_a_string().prop_map(Some),
    ]
}

/// Publication data: any JSON, sometimes around `max_message_bytes`.
fn data_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,20}".prop_map(Value::String),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{0,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop_oneof![
        8 => value.prop_map(|v| Some(typed(v, Typing::Good))),
        2 => (MAX_MESSAGE_BYTES - 8..MAX_MESSAGE_BYTES + 8)
            .prop_map(|n| Some(typed(json!("d".repeat(n - 2)), Typing::Good))),
        // A publish needs data: Herald refuses the command without it.
        1 => Just(None),
    ]
}

/// `since`: a position (its fields any of the above), or not an object.
fn since_field() -> impl Strategy<Value = Option<(Field, Typing)>> {
    let position = (offset_field(), epoch_field()).prop_map(|(offset, epoch)| {
        let mut fields = Vec::new();
        let mut typing = Typing::Good;
        for (name, field) in [("offset", offset), ("epoch", epoch)] {
            if let Some((field, t)) = field {
                fields.push((name, field));
                typing = typing.max(t);
            }
        }
        (fields, typing)
    });
    prop_oneof![
        3 => Just(None),
        6 => position.prop_map(|(fields, typing)| Some((Field::Json(nested(fields)), typing))),
        1 => Just(Some(typed(Value::Null, Typing::Good))),
        1 => prop_oneof![Just(json!(5)), Just(json!("since")), Just(json!([]))]
            .prop_map(|v| Some(typed(v, Typing::Bad))),
    ]
}

/// A nested object whose fields are resolved later: marked so that
/// [`resolve`] finds them (only `since` nests).
fn nested(fields: Vec<(&'static str, Field)>) -> Value {
    let mut object = Map::new();
    for (name, field) in fields {
        let value = match field {
            Field::Json(v) => v,
            Field::Epoch => json!(EPOCH_MARK),
            Field::Head(d) => json!(format!("{HEAD_MARK}{d}")),
            Field::Token(_) => unreachable!("no token in a nested object"),
        };
        object.insert(name.to_owned(), value);
    }
    Value::Object(object)
}

const EPOCH_MARK: &str = "\u{0}epoch";
const HEAD_MARK: &str = "\u{0}head";

/// The request of `method`: its fields, each present or not.
fn request(method: &'static str) -> BoxedStrategy<(Request, Typing)> {
    let fields: Vec<(&'static str, FieldStrategy)> = match method {
        "connect" => vec![
            ("token", token_field().boxed()),
            ("name", string_field().boxed()),
            ("version", string_field().boxed()),
        ],
        "subscribe" => vec![
            ("channel", channel_field().boxed()),
            ("token", token_field().boxed()),
            ("recover", bool_field().boxed()),
            ("epoch", epoch_field().boxed()),
            ("offset", offset_field().boxed()),
            ("join_leave", bool_field().boxed()),
        ],
        "unsubscribe" | "presence" | "presence_stats" => {
            vec![("channel", channel_field().boxed())]
        }
        "publish" => vec![
            ("channel", channel_field().boxed()),
            ("data", data_field().boxed()),
        ],
        "history" => vec![
            ("channel", channel_field().boxed()),
            ("limit", limit_field().boxed()),
            ("since", since_field().boxed()),
            ("reverse", bool_field().boxed()),
        ],
        "refresh" => vec![(
            "token",
            prop_oneof![
                3 => Just(Some((Field::Token(Token::Alice), Typing::Good))),
                1 => token_field(),
            ]
            .boxed(),
        )],
        "sub_refresh" => vec![
            ("channel", channel_field().boxed()),
            ("token", token_field().boxed()),
        ],
        // ping, rpc, send and unknown methods: what they carry is not read.
        _ => vec![("data", string_field().boxed())],
    };
    // What `ping`, `rpc`, `send` and unknown methods carry is not read:
    // any value of their fields passes.
    let unread = !matches!(
        method,
        "connect"
            | "subscribe"
            | "unsubscribe"
            | "presence"
            | "presence_stats"
            | "publish"
            | "history"
            | "refresh"
            | "sub_refresh"
    );
    let names: Vec<&'static str> = fields.iter().map(|(n, _)| *n).collect();
    let values: Vec<_> = fields.into_iter().map(|(_, s)| s).collect();
    let object = values.prop_map(move |values| {
        let mut out = Vec::new();
        let mut typing = Typing::Good;
        for (name, value) in names.iter().zip(values) {
            match value {
                Some((field, t)) => {
                    out.push((*name, field));
                    if !unread {
                        typing = typing.max(t);
                    }
                }
                // A missing channel, or a publish without data, does not
                // decode in Herald (Centrifugo closes with 3501 too).
                None if *name == "channel" || (*name == "data" && method == "publish") => {
                    typing = typing.max(Typing::Bad);
                }
                None => {}
            }
        }
        (Request::Object(out), typing)
    });
    // Herald does not read what `ping`, `rpc` and `send` carry, so any
    // value passes there, where Centrifugo's decoder wants an object; an
    // unknown method's value is ignored by both.
    let other_typing = match method {
        "ping" | "rpc" | "send" => Typing::Lenient,
        "teleport" => Typing::Good,
        _ => Typing::Bad,
    };
    let null_typing = if method == "teleport" {
        Typing::Good
    } else {
        Typing::Lenient
    };
    prop_oneof![
        12 => object,
        1 => Just((Request::Other(Value::Null), null_typing)),
        1 => prop_oneof![Just(json!(1)), Just(json!("x")), Just(json!([1]))]
            .prop_map(move |v| (Request::Other(v), other_typing)),
    ]
    .boxed()
}

const METHODS: [&str; 13] = [
    "connect",
    "subscribe",
    "unsubscribe",
    "publish",
    "history",
    "presence",
    "presence_stats",
    "refresh",
    "sub_refresh",
    "ping",
    "rpc",
    "send",
    "teleport",
];

fn id() -> impl Strategy<Value = (Option<Value>, Typing)> {
    prop_oneof![
        // A positive id: replaced by a fresh one when the session runs.
        16 => Just((Some(json!(1)), Typing::Good)),
        1 => Just((Some(json!(u32::MAX)), Typing::Good)),
        1 => Just((Some(json!(0)), Typing::Good)),
        1 => Just((None, Typing::Good)),
        1 => Just((Some(Value::Null), Typing::Lenient)),
        2 => prop_oneof![
            Just(json!(-1)),
            Just(json!(u64::from(u32::MAX) + 1)),
            Just(json!(u64::MAX)),
            Just(json!(1.5)),
            Just(json!(2.0)),
            Just(json!("7")),
            Just(json!(true)),
            Just(json!({})),
        ]
        .prop_map(|v| (Some(v), Typing::Bad)),
    ]
}

/// A command: mostly well typed, so that sessions go on long enough to
/// reach subscriptions, publishes and repeated commands.
fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        12 => well_typed_command(),
        1 => any_command(),
    ]
}

/// The method of a command: `connect` and `send` close a connected
/// session, so they come seldom.
fn method() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![
        1 => Just("connect"),
        1 => Just("send"),
        40 => proptest::sample::select(METHODS[1..11].to_vec()),
        2 => Just("teleport"),
    ]
}

/// One method, its request well typed (each method as often as the
/// others, however many fields it has), with an id (or seldom none).
fn well_typed_command() -> impl Strategy<Value = Command> {
    let one = method().prop_flat_map(|m| {
        request(m)
            .prop_filter("well typed", |(_, t)| *t == Typing::Good)
            .prop_map(move |(r, _)| (m, r))
    });
    let id = prop_oneof![
        18 => Just(Some(json!(1))),
        1 => Just(Some(json!(0))),
        1 => Just(None),
    ];
    (id, one).prop_map(|(id, one)| Command {
        id,
        methods: vec![one],
        typing: Typing::Good,
    })
}

fn any_command() -> impl Strategy<Value = Command> {
    let one = method().prop_flat_map(|m| request(m).prop_map(move |(r, t)| (m, r, t)));
    let methods = prop_oneof![
        12 => proptest::collection::vec(one.clone(), 1..=1),
        1 => proptest::collection::vec(one, 0..=2),
    ];
    (id(), methods).prop_map(|((id, id_typing), methods)| {
        let mut typing = id_typing;
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (m, r, t) in methods {
            if seen.insert(m) {
                typing = typing.max(t);
                out.push((m, r));
            }
        }
        Command {
            id,
            methods: out,
            typing,
        }
    })
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        40 => command().prop_map(Line::Command),
        1 => prop_oneof![
            any_string(),
            proptest::sample::select(vec!["[]", "5", "\"x\"", "null", "true", "{", "}", " ", "{}}", "[{}]"])
                .prop_map(str::to_owned),
        ]
        .prop_map(|s| Line::Text(s.replace('\n', ""))),
        1 => (command(), any::<usize>()).prop_map(|(c, cut)| Line::Truncated(c, cut)),
    ]
}

fn frame() -> impl Strategy<Value = GenFrame> {
    prop_oneof![
        30 => (proptest::collection::vec(line(), 1..6), any::<bool>())
            .prop_map(|(lines, crlf)| GenFrame::Text { lines, crlf }),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(GenFrame::Binary),
        1 => (proptest::collection::vec(any::<u8>(), 0..20), 0xf8u8..=0xff)
            .prop_map(|(mut bytes, bad)| {
                bytes.push(bad);
                GenFrame::NotUtf8(bytes)
            }),
        2 => (
            prop_oneof![Just(big_history()), well_typed_command()],
            prop_oneof![
                1usize..=COMMANDS_PER_FRAME,
                Just(COMMANDS_PER_FRAME),
                COMMANDS_PER_FRAME + 1..=400,
            ],
        )
            .prop_map(|(command, count)| GenFrame::Pipelined { command, count }),
    ]
}

/// `history` of all of [`BIG_CHANNEL`] (1000 publications, 1 MB).
fn big_history() -> Command {
    Command {
        id: Some(json!(1)),
        methods: vec![(
            "history",
            Request::Object(vec![
                ("channel", Field::Json(json!(BIG_CHANNEL))),
                ("limit", Field::Json(json!(1000))),
            ]),
        )],
        typing: Typing::Good,
    }
}

fn session() -> impl Strategy<Value = Session> {
    (
        proptest::bool::weighted(0.8),
        proptest::collection::vec(frame(), 1..8),
    )
        .prop_map(|(connect_first, frames)| Session {
            connect_first,
            frames,
        })
}

// ---------------------------------------------------------------------
// Running a session.

/// The node and the tokens of the test.
struct Fixture {
    node: Node,
    tokens: BTreeMap<&'static str, String>,
}

fn fixture_config(secret: &str) -> ServerConfig {
    let mut namespaces = NamespacesConfig::new();
    namespaces.insert(
        "room".to_owned(),
        NamespaceRule {
            subscribe: SubscribeRule::Token,
            publish: PublishRule::Token,
            history: true,
            presence: Some(true),
            ..NamespaceRule::default()
        },
    );
    namespaces.insert(
        "open".to_owned(),
        NamespaceRule {
            subscribe: SubscribeRule::Public,
            ..NamespaceRule::default()
        },
    );
    namespaces.insert(
        "keyonly".to_owned(),
        NamespaceRule {
            subscribe: SubscribeRule::Key,
            ..NamespaceRule::default()
        },
    );
    ServerConfig {
        max_message_bytes: MAX_MESSAGE_BYTES,
        auth: AuthConfig {
            jwt: Some(JwtConfig {
                hs256_secret: OneOrMany::One(Secret::new(secret)),
                ..JwtConfig::default()
            }),
            publish_rate_per_s: Some(0.0),
            ..AuthConfig::default()
        },
        namespaces,
        // The sessions connect with and without a token; the refusal of
        // an anonymous connect when this is off is tested in
        // `auth/centrifugo/protocol.rs`.
        centrifugo: CentrifugoConfig {
            anonymous_connect: true,
            ..CentrifugoConfig::default()
        },
        ..ServerConfig::default()
    }
}

fn now_s() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn tokens(secret: &str) -> BTreeMap<&'static str, String> {
    let sign = |claims: Value| {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let exp = now_s() + 3600;
    let alice = sign(json!({
        "sub": "alice", "exp": exp,
        "channels": ["room:*", "open:*", "news:*"], "publish": ["room:*"],
    }));
    let mut forged = alice.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    BTreeMap::from([
        ("alice", alice),
        ("eve", sign(json!({"sub": "eve", "exp": exp}))),
        (
            "alice_sub",
            sign(json!({"sub": "alice", "exp": exp, "channel": "room:a"})),
        ),
        (
            "expired",
            sign(json!({"sub": "alice", "exp": now_s() - 100, "channels": ["room:*"]})),
        ),
        ("forged", forged),
    ])
}

impl Fixture {
    /// Publishes [`BIG_CHANNEL`]'s 1000 messages, in batches of 100.
    async fn fill_big_channel(&self) {
        let bearer = format!("Bearer {}", self.tokens["alice"]);
        let data = "b".repeat(MAX_MESSAGE_BYTES - 24);
        for _ in 0..10 {
            let messages: Vec<Value> = (0..100)
                .map(|_| json!({"channel": BIG_CHANNEL, "data": data}))
                .collect();
            let (status, _, body) = self
                .node
                .call(
                    "POST",
                    "/v1/messages",
                    &[("authorization", bearer.as_str())],
                    Some(json!({ "messages": messages })),
                )
                .await;
            assert_eq!(status, 201, "{body}");
        }
    }

    fn token(&self, t: Token) -> String {
        match t {
            Token::Empty => String::new(),
            Token::Alice => self.tokens["alice"].clone(),
            Token::Eve => self.tokens["eve"].clone(),
            Token::AliceSub => self.tokens["alice_sub"].clone(),
            Token::Expired => self.tokens["expired"].clone(),
            Token::Forged => self.tokens["forged"].clone(),
            Token::Garbage => "not.a.token".to_owned(),
        }
    }

    async fn head(&self, channel: &str) -> Offset {
        self.node
            .storage
            .read(&ChannelName::new(channel).unwrap(), Offset::MAX, 1)
            .await
            .expect("storage read")
            .head
    }

    async fn epoch(&self, channel: &str) -> String {
        self.node
            .storage
            .channel_epoch(&ChannelName::new(channel).unwrap())
            .await
            .expect("channel epoch")
    }

    /// The channels of [`PRESENCE_CHANNELS`] where `client` has a presence
    /// row.
    async fn presence_of(&self, client: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for channel in PRESENCE_CHANNELS {
            let entries = self
                .node
                .storage
                .presence(&ChannelName::new(channel).unwrap())
                .await
                .expect("presence read");
            if entries.iter().any(|e| e.client == client) {
                out.insert(channel.to_owned());
            }
        }
        out
    }
}

/// What the model knows of the connection.
#[derive(Debug, Default, Clone)]
struct Model {
    connected: bool,
    /// The client id of the connect reply.
    client: Option<String>,
    subscribed: BTreeSet<String>,
    heads: BTreeMap<String, Offset>,
    epochs: BTreeMap<String, String>,
    next_id: u64,
}

impl Model {
    /// Follows the effect `reply` says `sent` had.
    fn follow(&mut self, sent: &Sent, reply: &Value) {
        if let Some(result) = reply.get("connect") {
            self.connected = true;
            self.client = result["client"].as_str().map(str::to_owned);
        }
        let Kind::Command { methods, .. } = &sent.kind else {
            return;
        };
        let channel_of = |m: &str| {
            methods
                .iter()
                .find(|(name, _)| *name == m)
                .and_then(|(_, r)| r["channel"].as_str().map(str::to_owned))
        };
        if let Some(channel) = reply.get("subscribe").and(channel_of("subscribe")) {
            self.subscribed.insert(channel);
        }
        if let Some(channel) = reply.get("unsubscribe").and(channel_of("unsubscribe")) {
            self.subscribed.remove(&channel);
        }
        if let Some(channel) = reply.get("publish").and(channel_of("publish")) {
            *self.heads.entry(channel).or_insert(0) += 1;
        }
    }
}

/// One line as sent, and what may answer it.
#[derive(Debug, Clone)]
struct Sent {
    text: String,
    /// Its id when it parsed to a positive `u32` (replies carry it).
    id: Option<u64>,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// A well-decoding command with these methods (and tokens), or a line
    /// whose outcome is not pinned (`lenient`).
    Command {
        methods: Vec<(&'static str, Value)>,
        typing: Typing,
        /// The token kinds of the request fields named `token`.
        tokens: BTreeMap<&'static str, Token>,
    },
    /// Not a command: 3501 (or nothing for a blank line).
    NotCommand { blank: bool },
    /// JSON text that is an object but was not built as a command (only
    /// garbage that happens to be one): anything but a hang.
    Unknown,
}

fn resolve_field(field: &Field, fixture: &Fixture, model: &Model, channel: &str) -> Value {
    match field {
        Field::Json(v) => resolve_marks(v, model, channel),
        Field::Token(t) => json!(fixture.token(*t)),
        Field::Epoch => json!(model.epochs.get(channel).cloned().unwrap_or_default()),
        Field::Head(d) => json!(head_plus(model, channel, *d)),
    }
}

fn head_plus(model: &Model, channel: &str, d: i8) -> u64 {
    let head = model.heads.get(channel).copied().unwrap_or(0);
    head.saturating_add_signed(i64::from(d))
}

fn resolve_marks(v: &Value, model: &Model, channel: &str) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), resolve_marks(v, model, channel)))
                .collect(),
        ),
        Value::String(s) if s == EPOCH_MARK => {
            json!(model.epochs.get(channel).cloned().unwrap_or_default())
        }
        Value::String(s) if s.starts_with(HEAD_MARK) => {
            let d: i8 = s[HEAD_MARK.len()..].parse().unwrap();
            json!(head_plus(model, channel, d))
        }
        other => other.clone(),
    }
}

/// Renders `c` to its JSON text with fresh ids and the session's values.
fn render(c: &Command, fixture: &Fixture, model: &mut Model) -> Sent {
    let mut object = Map::new();
    let mut id = None;
    if let Some(v) = &c.id {
        let v = match v.as_u64() {
            Some(n) if n > 0 && n < u64::from(u32::MAX) => {
                model.next_id += 1;
                json!(model.next_id)
            }
            _ => v.clone(),
        };
        id = v.as_u64().filter(|n| *n > 0 && *n <= u64::from(u32::MAX));
        object.insert("id".to_owned(), v);
    }
    let mut methods = Vec::new();
    let mut tokens = BTreeMap::new();
    for (method, request) in &c.methods {
        let value = match request {
            Request::Other(v) => v.clone(),
            Request::Object(fields) => {
                let channel = fields
                    .iter()
                    .find_map(|(name, f)| match (name, f) {
                        (&"channel", Field::Json(Value::String(s))) => Some(s.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                let mut request = Map::new();
                for (name, field) in fields {
                    if let Field::Token(t) = field {
                        tokens.insert(*method, *t);
                    }
                    request.insert(
                        (*name).to_owned(),
                        resolve_field(field, fixture, model, &channel),
                    );
                }
                Value::Object(request)
            }
        };
        object.insert((*method).to_owned(), value.clone());
        methods.push((*method, value));
    }
    Sent {
        text: Value::Object(object).to_string(),
        id,
        kind: Kind::Command {
            methods,
            typing: c.typing,
            tokens,
        },
    }
}

/// A line that was not built as a command, judged as the server does:
/// trimmed of white space first.
fn classify_text(text: &str) -> Kind {
    let text = text.trim();
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(_)) => Kind::Unknown,
        _ => Kind::NotCommand {
            blank: text.is_empty(),
        },
    }
}

/// Centrifugo's message for each error code Herald sends.
fn error_message(code: u64) -> Option<&'static str> {
    Some(match code {
        100 => "internal server error",
        101 => "unauthorized",
        103 => "permission denied",
        104 => "method not found",
        105 => "already subscribed",
        106 => "limit exceeded",
        107 => "bad request",
        108 => "not available",
        109 => "token expired",
        111 => "too many requests",
        112 => "unrecoverable position",
        _ => return None,
    })
}

/// The error codes a method may answer here (the storage is healthy, so
/// never 100).
fn error_codes(method: &str) -> &'static [u64] {
    match method {
        "connect" => &[109],
        // An expired token closes the connection (3005); 111 beyond the
        // connection's rate of reads and token checks.
        "refresh" => &[111],
        // 111: beyond the connection's rate of reads.
        "subscribe" => &[103, 105, 107, 109, 111],
        "unsubscribe" => &[107],
        "publish" => &[103, 106, 107],
        "history" => &[103, 107, 111, 112],
        "presence" | "presence_stats" => &[103, 107, 108, 111],
        // An expired token closes the connection (3006).
        "sub_refresh" => &[103, 107, 111],
        "rpc" => &[108],
        "ping" => &[],
        _ => &[104],
    }
}

/// How a line may be answered, given whether the connection was connected
/// before it.
#[derive(Debug)]
struct Outcomes {
    /// It may get a reply (with its id).
    reply: bool,
    /// It may get nothing, the connection staying open (a pong, a blank
    /// line).
    nothing: bool,
    /// The codes it may close the connection with.
    closes: BTreeSet<u16>,
}

/// Whether a command holds more than one request that is not `null`, or
/// one beside a field that is not a request (an unknown method).
fn ambiguous(methods: &[(&'static str, Value)]) -> bool {
    const REQUESTS: [&str; 12] = [
        "connect",
        "subscribe",
        "unsubscribe",
        "publish",
        "presence",
        "presence_stats",
        "history",
        "ping",
        "send",
        "rpc",
        "refresh",
        "sub_refresh",
    ];
    let requests = methods
        .iter()
        .filter(|(m, v)| REQUESTS.contains(m) && !v.is_null())
        .count();
    let unknown = methods.iter().any(|(m, _)| !REQUESTS.contains(m));
    requests > 1 || (requests == 1 && unknown)
}

fn outcomes(sent: &Sent, connected: bool) -> Outcomes {
    let close = |codes: &[u16]| Outcomes {
        reply: false,
        nothing: false,
        closes: codes.iter().copied().collect(),
    };
    let Kind::Command {
        methods,
        typing,
        tokens,
    } = &sent.kind
    else {
        return match sent.kind {
            Kind::NotCommand { blank: true } => Outcomes {
                reply: false,
                nothing: true,
                closes: BTreeSet::new(),
            },
            Kind::NotCommand { blank: false } => close(&[3501]),
            _ => Outcomes {
                reply: true,
                nothing: true,
                closes: BTreeSet::from([3500, 3501, 3508]),
            },
        };
    };
    let names: Vec<&str> = methods.iter().map(|(m, _)| *m).collect();
    match typing {
        Typing::Bad => close(&[3501]),
        Typing::Lenient => Outcomes {
            reply: sent.id.is_some(),
            nothing: true,
            closes: BTreeSet::from([3005, 3006, 3500, 3501, 3508]),
        },
        // More than one request, or one with a field the protocol lacks
        // (an unknown method beside it): not the protocol.
        Typing::Good if sent.id.is_some() && ambiguous(methods) => close(&[3501]),
        Typing::Good if !connected => {
            // Before `connect` only a `connect` with an id is taken.
            if sent.id.is_none() || !names.contains(&"connect") {
                return close(&[3501]);
            }
            match tokens.get("connect") {
                Some(Token::Forged | Token::Garbage) => close(&[3500]),
                _ => Outcomes {
                    reply: true,
                    nothing: false,
                    closes: BTreeSet::new(),
                },
            }
        }
        Typing::Good => {
            if sent.id.is_none() {
                // A pong, whatever else it holds, unless it is a `send`.
                return if names.contains(&"send") {
                    close(&[3508])
                } else {
                    Outcomes {
                        reply: false,
                        nothing: true,
                        closes: BTreeSet::new(),
                    }
                };
            }
            if names.contains(&"connect") {
                return close(&[3501]);
            }
            // A subscribe without a channel: 3501, as Centrifugo closes it.
            let no_channel = methods
                .iter()
                .any(|(m, r)| *m == "subscribe" && r["channel"] == json!(""));
            if no_channel {
                return close(&[3501]);
            }
            let mut closes = BTreeSet::new();
            if names.contains(&"send") {
                closes.insert(3508);
            }
            if tokens.get("subscribe").is_some_and(|t| *t != Token::Empty)
                || names.contains(&"refresh")
                || names.contains(&"sub_refresh")
            {
                closes.insert(3500);
            }
            // A refresh with an expired token: 3005 (3006 for a
            // subscription's), as Centrifugo, so that the SDK fetches
            // another.
            if names.contains(&"refresh") {
                closes.insert(3005);
            }
            if names.contains(&"sub_refresh") {
                closes.insert(3006);
            }
            Outcomes {
                reply: names != ["send"],
                nothing: false,
                closes,
            }
        }
    }
}

/// The outcome of one frame as the client saw it: the reply lines in
/// order, and the close code if the connection closed (`Some(None)`: it
/// ended without a close frame).
struct Observed {
    replies: Vec<Value>,
    closed: Option<Option<u16>>,
}

/// Explains `observed` by the lines, in order: each line was answered by
/// the next reply, got nothing, or closed the connection (and then
/// nothing followed). The model follows each reply as it is matched.
fn explain(lines: &[Sent], observed: &Observed, model: &mut Model) -> Result<(), String> {
    let mut next = 0;
    for (i, sent) in lines.iter().enumerate() {
        let connected = model.connected;
        let o = outcomes(sent, connected);
        let reply = observed.replies.get(next);
        if let Some(reply) = reply.filter(|r| sent.id.is_some() && r["id"] == json!(sent.id)) {
            if !o.reply {
                return Err(format!("line {i} ({o:?}) was answered {reply}"));
            }
            check_reply(sent, reply, connected, model)
                .map_err(|e| format!("line {i}: {e}: {reply}"))?;
            model.follow(sent, reply);
            next += 1;
            continue;
        }
        if next == observed.replies.len() {
            if let Some(Some(code)) = observed.closed {
                if o.closes.contains(&code) {
                    return Ok(());
                }
            }
        }
        if !o.nothing {
            return Err(format!(
                "line {i} ({o:?}, connected: {connected}) got neither its reply nor an \
                 allowed close: next reply {reply:?}, closed {:?}",
                observed.closed
            ));
        }
    }
    if next != observed.replies.len() {
        return Err(format!(
            "replies no line explains: {:?}",
            &observed.replies[next..]
        ));
    }
    if let Some(closed) = observed.closed {
        return Err(format!("closed ({closed:?}) though no line closes it"));
    }
    Ok(())
}

fn is_valid_channel(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| ChannelName::new(*s).is_ok())
}

/// Checks one reply against its line.
fn check_reply(sent: &Sent, reply: &Value, connected: bool, model: &Model) -> Result<(), String> {
    let object = reply.as_object().ok_or("not an object")?;
    if object.len() != 2 {
        return Err("a reply has exactly `id` and one result or `error`".to_owned());
    }
    if !connected && reply.get("connect").is_none() && reply["error"]["code"] != 109 {
        return Err("before connect, only a connect is answered".to_owned());
    }
    let Kind::Command {
        methods,
        typing,
        tokens,
    } = &sent.kind
    else {
        return Ok(());
    };
    let names: Vec<&str> = methods.iter().map(|(m, _)| *m).collect();
    if let Some(error) = object.get("error") {
        let code = error["code"].as_u64().ok_or("error without a code")?;
        let message = error_message(code).ok_or(format!("unknown code {code}"))?;
        if error["message"] != message {
            return Err(format!("code {code} with another message"));
        }
        if *typing != Typing::Good {
            return Ok(());
        }
        let allowed: BTreeSet<u64> = if names.is_empty() {
            BTreeSet::from([104])
        } else {
            names
                .iter()
                .flat_map(|m| error_codes(m).iter().copied())
                .collect()
        };
        if !allowed.contains(&code) {
            return Err(format!("code {code} is not one {names:?} answers"));
        }
        // Pinned: a single command's error where the model knows better.
        if let [(method, request)] = methods.as_slice() {
            let channel = &request["channel"];
            let pinned = match *method {
                "connect" => match tokens.get("connect") {
                    Some(Token::Expired) => Some(109),
                    _ => Some(0),
                },
                "subscribe"
                    if is_valid_channel(channel).is_some_and(|c| model.subscribed.contains(c)) =>
                {
                    Some(105)
                }
                "unsubscribe" if is_valid_channel(channel).is_some() => Some(0),
                "unsubscribe" => Some(107),
                "presence" | "presence_stats"
                    if is_valid_channel(channel).is_some_and(|c| !c.starts_with("room:")) =>
                {
                    Some(108)
                }
                _ => None,
            };
            match pinned {
                Some(0) => return Err(format!("{method} must succeed")),
                // A read beyond the connection's rate answers 111 first.
                Some(105 | 108) if code == 111 => {}
                Some(expected) if expected != code => {
                    return Err(format!("{method} must answer {expected}"))
                }
                _ => {}
            }
        }
        return Ok(());
    }
    let (method, result) = object.iter().find(|(k, _)| *k != "id").ok_or("no result")?;
    if !names.contains(&method.as_str()) {
        return Err(format!("result named {method}, not one of {names:?}"));
    }
    if !result.is_object() {
        return Err("a result is an object".to_owned());
    }
    if *typing != Typing::Good {
        return Ok(());
    }
    let request = &methods.iter().find(|(m, _)| m == method).unwrap().1;
    let channel = &request["channel"];
    match method.as_str() {
        "connect" => {
            if matches!(tokens.get("connect"), Some(Token::Expired)) {
                return Err("an expired token connected".to_owned());
            }
            if !result["client"].is_string() {
                return Err("connect without a client id".to_owned());
            }
        }
        "subscribe" if is_valid_channel(channel).is_some_and(|c| model.subscribed.contains(c)) => {
            return Err("subscribed twice to one channel".to_owned());
        }
        "unsubscribe" | "ping" if result != &json!({}) => {
            return Err(format!("{method} answers {{}}"));
        }
        "presence" | "presence_stats"
            if !channel.as_str().is_some_and(|c| c.starts_with("room:")) =>
        {
            return Err("presence answered without presence".to_owned());
        }
        "history" => {
            let c = channel.as_str().unwrap_or_default();
            if let (Some(head), Some(epoch)) = (model.heads.get(c), model.epochs.get(c)) {
                if result["offset"].as_u64().unwrap_or(0) != *head {
                    return Err(format!("history's offset is not the head {head}"));
                }
                if result["epoch"] != json!(epoch) {
                    return Err("history's epoch is not the channel's".to_owned());
                }
            }
            let publications = result["publications"].as_array();
            if publications.is_some_and(|p| p.len() > 1000) {
                return Err("more than 1000 publications".to_owned());
            }
        }
        "rpc" => return Err("rpc succeeded".to_owned()),
        "send" => return Err("send answered".to_owned()),
        _ => {}
    }
    Ok(())
}

/// The client side of one session.
struct Conn {
    ws: Ws,
    closed: Option<Option<u16>>,
    /// The channels of the `unsubscribe` pushes read (a `refresh` with a
    /// token that no longer grants them).
    unsubscribed: Vec<String>,
}

impl Conn {
    async fn send(&mut self, frame: Frame) {
        // The server may have closed already: a failed send is not an
        // answer, the read that follows sees the close.
        let _ = self.ws.send(frame).await;
    }

    /// Reads frames until one holds replies (returned) or the connection
    /// ends.
    async fn first_replies(&mut self) -> Result<Vec<Value>, String> {
        let (replies, _) = self.read(None, true).await?;
        Ok(replies)
    }

    /// Reads frames until a reply with `id` arrives (returned apart) or the
    /// connection ends; the reply lines read before it.
    async fn until(&mut self, id: Option<u64>) -> Result<(Vec<Value>, Option<Value>), String> {
        self.read(id, false).await
    }

    async fn read(
        &mut self,
        id: Option<u64>,
        first: bool,
    ) -> Result<(Vec<Value>, Option<Value>), String> {
        let mut replies = Vec::new();
        while self.closed.is_none() {
            if first && !replies.is_empty() {
                return Ok((replies, None));
            }
            let next = within("a frame from the server", NODE_WAIT, self.ws.next()).await;
            match next {
                Some(Ok(Frame::Text(text))) => {
                    for line in text.split('\n') {
                        let value: Value = serde_json::from_str(line).map_err(|e| {
                            format!("the server sent a line that is not JSON: {e}: {line:?}")
                        })?;
                        if value == json!({}) {
                            continue;
                        }
                        if value.get("push").is_some() {
                            if value.as_object().map(Map::len) != Some(1) {
                                return Err(format!("a push with more: {value}"));
                            }
                            if value["push"].get("unsubscribe").is_some() {
                                let channel = value["push"]["channel"].as_str().unwrap_or_default();
                                self.unsubscribed.push(channel.to_owned());
                            }
                            continue;
                        }
                        if value.get("id").is_none() {
                            return Err(format!("neither a reply nor a push: {value}"));
                        }
                        let mut value = value;
                        if let Some(publications) = value
                            .get_mut("history")
                            .and_then(|h| h.get_mut("publications"))
                        {
                            // Checked here, and not kept: the memory
                            // bound is the node's, not this client's.
                            if publications.as_array().is_some_and(|p| p.len() > 1000) {
                                return Err("more than 1000 publications".to_owned());
                            }
                            *publications = json!([]);
                        }
                        if id.is_some() && value["id"] == json!(id) {
                            return Ok((replies, Some(value)));
                        }
                        replies.push(value);
                    }
                }
                Some(Ok(Frame::Close(frame))) => {
                    self.closed = Some(frame.map(|f| u16::from(f.code)));
                }
                Some(Ok(Frame::Binary(_))) => {
                    return Err("a binary frame from the server".to_owned())
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => self.closed = Some(None),
            }
        }
        // Drain what follows the close (nothing should).
        let _ = within("the end of the connection", NODE_WAIT, async {
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
        Ok((replies, None))
    }
}

/// A `connect` with Alice's token.
fn connect_line(fixture: &Fixture, model: &mut Model) -> Sent {
    model.next_id += 1;
    let token = fixture.token(Token::Alice);
    Sent {
        text: json!({"id": model.next_id, "connect": {"token": token}}).to_string(),
        id: Some(model.next_id),
        kind: Kind::Command {
            methods: vec![("connect", json!({"token": token}))],
            typing: Typing::Good,
            tokens: BTreeMap::from([("connect", Token::Alice)]),
        },
    }
}

/// The largest client frame the node takes: `max_message_bytes` and
/// 16 KiB for the command around it; a larger one closes with 3501.
const MAX_FRAME_BYTES: usize = MAX_MESSAGE_BYTES + 16 * 1024;

async fn run_session(fixture: &Fixture, session: &Session) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    for channel in CHANNELS {
        model
            .heads
            .insert(channel.to_owned(), fixture.head(channel).await);
        model
            .epochs
            .insert(channel.to_owned(), fixture.epoch(channel).await);
    }
    let ws = fixture
        .node
        .ws("/connection/websocket", &[])
        .await
        .map_err(|s| TestCaseError::fail(format!("upgrade refused: {s}")))?;
    let mut conn = Conn {
        ws,
        closed: None,
        unsubscribed: Vec::new(),
    };
    for (n, frame) in session.frames.iter().enumerate() {
        let (sent, payload): (Vec<Sent>, Frame) = match frame {
            GenFrame::Text { lines, crlf } => {
                let mut sent = Vec::new();
                if n == 0 && session.connect_first {
                    sent.push(connect_line(fixture, &mut model));
                }
                for line in lines {
                    sent.push(match line {
                        Line::Command(c) => render(c, fixture, &mut model),
                        Line::Text(t) => Sent {
                            text: t.clone(),
                            id: None,
                            kind: classify_text(t),
                        },
                        Line::Truncated(c, cut) => {
                            let full = render(c, fixture, &mut model).text;
                            let mut cut = cut % full.len().max(1);
                            while !full.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            let text = full[..cut].to_owned();
                            Sent {
                                kind: classify_text(&text),
                                text,
                                id: None,
                            }
                        }
                    });
                }
                let separator = if *crlf { "\r\n" } else { "\n" };
                let text = sent
                    .iter()
                    .map(|s| s.text.as_str())
                    .collect::<Vec<_>>()
                    .join(separator);
                (sent, Frame::Text(text.into()))
            }
            GenFrame::Pipelined { command, count } => {
                let mut sent = Vec::new();
                if n == 0 && session.connect_first {
                    sent.push(connect_line(fixture, &mut model));
                }
                sent.extend((0..*count).map(|_| render(command, fixture, &mut model)));
                let text = sent
                    .iter()
                    .map(|s| s.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                (sent, Frame::Text(text.into()))
            }
            GenFrame::Binary(bytes) => (Vec::new(), Frame::Binary(bytes.clone().into())),
            GenFrame::NotUtf8(bytes) => (
                Vec::new(),
                Frame::Frame(RawFrame::message(
                    bytes.clone(),
                    OpCode::Data(Data::Text),
                    true,
                )),
            ),
        };
        let too_big = matches!(&payload, Frame::Text(t) if t.len() > MAX_FRAME_BYTES);
        conn.send(payload).await;
        if too_big {
            let (replies, _) = conn.until(None).await.map_err(TestCaseError::fail)?;
            prop_assert!(replies.is_empty(), "{} replies", replies.len());
            prop_assert_eq!(conn.closed, Some(Some(3501)), "a frame over the limit");
            return Ok(());
        }
        if sent.len() > COMMANDS_PER_FRAME {
            // Too many commands: none runs, the connection closes.
            let (replies, _) = conn.until(None).await.map_err(TestCaseError::fail)?;
            prop_assert!(replies.is_empty(), "{} replies", replies.len());
            prop_assert_eq!(conn.closed, Some(Some(3013)), "{} commands", sent.len());
            return Ok(());
        }
        if !matches!(frame, GenFrame::Text { .. } | GenFrame::Pipelined { .. }) {
            // Not the protocol: the connection is closed with 3501.
            let (replies, _) = conn.until(None).await.map_err(TestCaseError::fail)?;
            prop_assert!(replies.is_empty(), "{replies:?}");
            prop_assert_eq!(conn.closed, Some(Some(3501)), "frame {:?}", frame);
            return Ok(());
        }
        // Whether the frame connected shows in its replies: before
        // `connect`, each line that is not blank is answered or closes, so
        // a frame of replies or a close follows.
        let connected_before = model.connected;
        let mut replies = Vec::new();
        let mut connected_now = connected_before;
        if !connected_before
            && sent
                .iter()
                .any(|s| !matches!(s.kind, Kind::NotCommand { blank: true }))
        {
            replies = conn.first_replies().await.map_err(TestCaseError::fail)?;
            connected_now = replies.iter().any(|r| r.get("connect").is_some());
        }
        // Then a frame of its own that must be answered unless the frame
        // closed the connection: a ping, or a connect when not connected.
        let mut sentinel_reply = None;
        if conn.closed.is_none() {
            model.next_id += 1;
            let sentinel = model.next_id;
            let text = if connected_now {
                json!({"id": sentinel, "ping": {}})
            } else {
                json!({"id": sentinel, "connect": {"token": fixture.token(Token::Alice)}})
            };
            conn.send(Frame::Text(text.to_string().into())).await;
            let (rest, reply) = conn
                .until(Some(sentinel))
                .await
                .map_err(TestCaseError::fail)?;
            replies.extend(rest);
            sentinel_reply = reply;
        }
        let closed = conn.closed;
        for channel in conn.unsubscribed.drain(..) {
            model.subscribed.remove(&channel);
        }
        let observed = Observed { replies, closed };
        explain(&sent, &observed, &mut model).map_err(|e| {
            TestCaseError::fail(format!(
                "frame {n}: {e}\nsent: {:#?}",
                sent.iter().map(|s| &s.text).collect::<Vec<_>>()
            ))
        })?;
        if let Some(reply) = &sentinel_reply {
            if let Some(result) = reply.get("connect") {
                model.connected = true;
                model.client = result["client"].as_str().map(str::to_owned);
            }
        }
        // The storage follows the replies.
        for channel in CHANNELS {
            let head = fixture.head(channel).await;
            prop_assert_eq!(
                head,
                model.heads[channel],
                "frame {}: the head of {} is not what the replies said; sent {:#?}",
                n,
                channel,
                sent.iter().map(|s| &s.text).collect::<Vec<_>>()
            );
        }
        if conn.closed.is_some() {
            return Ok(());
        }
        if let Some(client) = &model.client {
            let rows = fixture.presence_of(client).await;
            let expected: BTreeSet<String> = model
                .subscribed
                .iter()
                .filter(|c| PRESENCE_CHANNELS.contains(&c.as_str()))
                .cloned()
                .collect();
            prop_assert_eq!(rows, expected, "frame {}: presence rows", n);
        }
        prop_assert!(
            sentinel_reply.is_some(),
            "frame {n}: the sentinel was not answered"
        );
    }
    let _ = conn.ws.close(None).await;
    let _ = within("the end of the connection", NODE_WAIT, async {
        while let Some(Ok(_)) = conn.ws.next().await {}
    })
    .await;
    prop_assert!(!PANICKED.load(Ordering::SeqCst), "a panic");
    Ok(())
}

#[test]
fn client_protocol_answers_every_command_or_closes_as_documented() {
    watch_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()
        .unwrap();
    let secret = herald_auth::generate_api_key();
    let place = rt.block_on(Place::new(Backend::Sqlite));
    let node = rt.block_on(Node::start(
        &place,
        "node-a",
        Role::Holder,
        fixture_config(&secret),
    ));
    let fixture = Fixture {
        node,
        tokens: tokens(&secret),
    };
    rt.block_on(fixture.fill_big_channel());
    let rss = PeakRss::start();
    let mut runner = TestRunner::new(Config {
        cases: SESSIONS,
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&session(), |s| rt.block_on(run_session(&fixture, &s)));
    let grown = rss.growth();
    rt.block_on(fixture.node.stop());
    drop(place);
    assert!(
        grown < MEMORY_BOUND,
        "the process grew by {} MB (bound {} MB)",
        grown >> 20,
        MEMORY_BOUND >> 20
    );
    outcome.unwrap();
    assert!(!PANICKED.load(Ordering::SeqCst), "a panic");
}

/// The checker refuses what the contract forbids: a reply to a pong, a
/// command left unanswered or answered twice, a close no line explains, an
/// error code the method does not answer.
#[test]
fn the_checker_refuses_what_the_contract_forbids() {
    let connected = Model {
        connected: true,
        ..Model::default()
    };
    let ping = |id: Option<u64>| Sent {
        text: String::new(),
        id,
        kind: Kind::Command {
            methods: vec![("ping", json!({}))],
            typing: Typing::Good,
            tokens: BTreeMap::new(),
        },
    };
    let check = |lines: &[Sent], replies: Vec<Value>, closed: Option<Option<u16>>| {
        explain(lines, &Observed { replies, closed }, &mut connected.clone())
    };
    let answered = |id: u64| json!({"id": id, "ping": {}});
    assert_eq!(check(&[ping(Some(1))], vec![answered(1)], None), Ok(()));
    assert_eq!(check(&[ping(None)], vec![], None), Ok(()));
    // A pong answered.
    assert!(check(&[ping(None)], vec![json!({"id": 0, "ping": {}})], None).is_err());
    // A command unanswered, or answered twice.
    assert!(check(&[ping(Some(1))], vec![], None).is_err());
    assert!(check(&[ping(Some(1))], vec![answered(1), answered(1)], None).is_err());
    // Replies out of order.
    let two = [ping(Some(1)), ping(Some(2))];
    assert!(check(&two, vec![answered(2), answered(1)], None).is_err());
    // A close that no line explains.
    assert!(check(&[ping(Some(1))], vec![], Some(Some(3501))).is_err());
    assert!(check(&[ping(Some(1))], vec![answered(1)], Some(None)).is_err());
    // An error a ping never answers.
    let error = json!({"id": 1, "error": {"code": 107, "message": "bad request"}});
    assert!(check(&[ping(Some(1))], vec![error], None).is_err());
}
