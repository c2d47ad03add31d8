//! The JSON form of Centrifugo's client protocol v2 (`client.proto` of
//! centrifugal/protocol): a frame holds one or more JSON objects separated
//! by newlines, both ways. A command carries an `id` and one request field
//! named after its method; the reply carries the same `id` and a result
//! field of the same name, or `error`. Pushes have no `id`. An empty
//! object is a ping (server to client) or a pong (client to server).
//!
//! Every field of `client.proto`'s requests is known here, and each is
//! either acted on, refused where Herald does not serve what it asks for
//! (`commands.rs`: Centrifugo's error or disconnect for it), or ignored
//! where Centrifugo ignores it too without the part of its setup that
//! reads it (a connect or subscribe proxy, dictionaries). A request that
//! holds a field `client.proto` does not have does not decode: the
//! connection closes with 3501 "bad request", so that a newer SDK's
//! feature is never taken for something else.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use herald_core::{Message, Tags};
use herald_storage::{PresenceEvent, PresenceEventKind};
use serde::de::value::MapAccessDeserializer;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::codes::ReplyError;

/// One command of a client frame.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Command {
    /// Matches the reply to the command; 0 (or none) for a pong, which is
    /// never run whatever else it holds, or a `send`, which gets no reply.
    #[serde(default)]
    pub(crate) id: u32,
    #[serde(default, deserialize_with = "object")]
    pub(crate) connect: Option<ConnectRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) subscribe: Option<SubscribeRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) unsubscribe: Option<ChannelRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) publish: Option<PublishRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) presence: Option<ChannelRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) presence_stats: Option<ChannelRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) history: Option<HistoryRequest>,
    pub(crate) ping: Option<serde::de::IgnoredAny>,
    pub(crate) send: Option<serde::de::IgnoredAny>,
    pub(crate) rpc: Option<serde::de::IgnoredAny>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) refresh: Option<RefreshRequest>,
    #[serde(default, deserialize_with = "object")]
    pub(crate) sub_refresh: Option<SubRefreshRequest>,
}

/// The request fields of a command (`Command` of `client.proto`, besides
/// `id`).
const METHODS: [&str; 12] = [
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

/// What a command line holds besides its `id`: how many request fields
/// that are not `null`, and whether any field a command does not have.
/// A command that runs holds exactly one request and nothing unknown (a
/// line with none is an unknown method, answered 104).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Request fields that are not `null`.
    pub(crate) requests: usize,
    /// Fields that are neither `id` nor a request.
    pub(crate) unknown: bool,
}

impl Shape {
    /// The shape of `line`, a JSON object (`None` when it is not one).
    pub(crate) fn of(line: &str) -> Option<Self> {
        let fields: BTreeMap<String, &RawValue> = serde_json::from_str(line).ok()?;
        let mut shape = Self {
            requests: 0,
            unknown: false,
        };
        for (name, value) in &fields {
            if METHODS.contains(&name.as_str()) {
                shape.requests += usize::from(value.get() != "null");
            } else if name != "id" {
                shape.unknown = true;
            }
        }
        Some(shape)
    }

    /// Whether the command asks for more than one thing, or for one
    /// thing with fields the protocol does not have: not the protocol.
    pub(crate) fn ambiguous(self) -> bool {
        self.requests > 1 || (self.requests == 1 && self.unknown)
    }
}

/// An optional request from `null` or a JSON object, and nothing else:
/// serde's derived structs also take an array of their fields' values
/// (`"since": [5, "e"]`), which is not the protocol; Centrifugo's decoder
/// refuses it, so such a command does not decode (the connection closes
/// with 3501, the server API answers 400).
pub(crate) fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOrNull<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOrNull<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object or null")
        }

        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(Some)
        }
    }
    deserializer.deserialize_option(ObjectOrNull(PhantomData))
}

/// `connect`: the connection token, the client's name and version, and
/// the recovery it asks for its server-side subscriptions.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectRequest {
    /// The connection JWT (empty: anonymous).
    #[serde(default)]
    pub(crate) token: String,
    /// The client's name (`js`, `python` ...), for logs.
    #[serde(default)]
    pub(crate) name: String,
    /// The client's version, for logs.
    #[serde(default)]
    pub(crate) version: String,
    /// Per channel of a server-side subscription it had on its previous
    /// connection: where to recover from (`ConnectRequest.subs` of
    /// `client.proto`, a map of `SubscribeRequest`s of which only
    /// `recover`, `epoch` and `offset` are read). Channels that are not
    /// server-side subscriptions of this connection are ignored.
    #[serde(default)]
    pub(crate) subs: BTreeMap<String, SubscribeRequest>,
    /// Data for a connect proxy: ignored, as Centrifugo does without one.
    #[serde(default, rename = "data")]
    pub(crate) _data: Option<IgnoredAny>,
    /// Headers for a connect proxy (headers emulation): ignored, as
    /// Centrifugo does without a proxy.
    #[serde(default, rename = "headers")]
    pub(crate) _headers: Option<IgnoredAny>,
    /// The client's connect flags: none changes what Herald answers.
    #[serde(default, rename = "flag")]
    pub(crate) _flag: Option<IgnoredAny>,
    /// A compression profile the client asks for: ignored, as Centrifugo
    /// does without dictionaries configured.
    #[serde(default, rename = "profile")]
    pub(crate) _profile: Option<IgnoredAny>,
    /// The compression dictionary the client holds: ignored, as above.
    #[serde(default, rename = "dict")]
    pub(crate) _dict: Option<IgnoredAny>,
}

/// `subscribe` (also the value of `connect`'s `subs` map, where its
/// `channel` is the map's key).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubscribeRequest {
    /// The channel (empty: a protocol error, 3501).
    #[serde(default)]
    pub(crate) channel: String,
    /// A subscription JWT for this channel (empty: the connection's
    /// credentials decide).
    #[serde(default)]
    pub(crate) token: String,
    /// Recover the publications after `offset` of `epoch`.
    #[serde(default)]
    pub(crate) recover: bool,
    /// The epoch the client last saw.
    #[serde(default)]
    pub(crate) epoch: String,
    /// The offset of the last publication the client received.
    #[serde(default)]
    pub(crate) offset: u64,
    /// Push joins and leaves of the channel to this subscriber, where
    /// its namespace has `join_leave`.
    #[serde(default)]
    pub(crate) join_leave: bool,
    /// Data for a subscribe proxy: ignored, as Centrifugo does without one.
    #[serde(default, rename = "data")]
    pub(crate) _data: Option<IgnoredAny>,
    /// The client asks for a positioned subscription: every Herald
    /// subscription is.
    #[serde(default, rename = "positioned")]
    pub(crate) _positioned: Option<IgnoredAny>,
    /// The client asks for a recoverable subscription: every Herald
    /// subscription is.
    #[serde(default, rename = "recoverable")]
    pub(crate) _recoverable: Option<IgnoredAny>,
    /// The delta encoding asked for: `""` none, `"fossil"` not negotiated
    /// (the result says `delta: false`, as Centrifugo's does where the
    /// namespace allows no delta), anything else 3501.
    #[serde(default)]
    pub(crate) delta: String,
    /// A filter on the publications' tags (see `tags_filter.rs`).
    #[serde(default, deserialize_with = "object")]
    pub(crate) tf: Option<super::tags_filter::FilterNode>,
    /// Subscription flags: bit 0, channel compaction (ignored: pushes
    /// always name the channel, as Centrifugo's do where the namespace
    /// does not allow compaction), and
    /// [`SUBSCRIPTION_FLAG_REJECT_UNRECOVERED`]; other bits are ignored,
    /// as Centrifugo does.
    #[serde(default)]
    pub(crate) flag: i64,
    /// The subscription type: 0 stream; 1, 2, 3 map (of keys, clients,
    /// users) and 4 shared poll are refused (108).
    #[serde(default, rename = "type")]
    pub(crate) kind: i32,
    /// A map subscription's phase: only with a map type.
    #[serde(default)]
    pub(crate) phase: i32,
    /// A map subscription's page cursor: only with a map type.
    #[serde(default)]
    pub(crate) cursor: String,
    /// A map subscription's page size: only with a map type.
    #[serde(default)]
    pub(crate) limit: i32,
    /// A map subscription's order: only with a map type.
    #[serde(default)]
    pub(crate) asc: bool,
}

/// `SubscribeRequest.flag` bit 1: a recovery that fails is answered with
/// error 112 "unrecoverable position" instead of `recovered: false`, so
/// that the SDK reloads the state itself (centrifuge-js's `getState`).
pub(crate) const SUBSCRIPTION_FLAG_REJECT_UNRECOVERED: i64 = 2;

/// A request naming only a channel (`unsubscribe`, `presence`,
/// `presence_stats`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChannelRequest {
    /// The channel.
    pub(crate) channel: String,
}

/// `publish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishRequest {
    /// The channel.
    pub(crate) channel: String,
    /// The JSON value to publish, kept as its exact text.
    pub(crate) data: Box<RawValue>,
    /// 0 a stream publish; 1 a map publish, refused (108).
    #[serde(default, rename = "type")]
    pub(crate) kind: i32,
    /// A map publish's key: refused (108).
    #[serde(default)]
    pub(crate) key: String,
    /// A map publish's removal of its key: refused (108).
    #[serde(default)]
    pub(crate) removed: bool,
}

/// A stream position, `since` of `history`.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamPosition {
    /// An offset.
    #[serde(default)]
    pub(crate) offset: u64,
    /// The epoch the offset belongs to.
    #[serde(default)]
    pub(crate) epoch: String,
}

/// `history`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryRequest {
    /// The channel.
    pub(crate) channel: String,
    /// Publications wanted: 0 only the stream position, negative as many
    /// as allowed (bounded by the server).
    #[serde(default)]
    pub(crate) limit: i64,
    /// Only publications after this position (before it with `reverse`).
    #[serde(default, deserialize_with = "object")]
    pub(crate) since: Option<StreamPosition>,
    /// Newest first.
    #[serde(default)]
    pub(crate) reverse: bool,
}

/// `refresh`: a new connection token.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefreshRequest {
    /// The new connection JWT.
    #[serde(default)]
    pub(crate) token: String,
}

/// `sub_refresh`: a new subscription token.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubRefreshRequest {
    /// The channel.
    pub(crate) channel: String,
    /// The new subscription JWT.
    #[serde(default)]
    pub(crate) token: String,
    /// 0 a token refresh; 1 track and 2 untrack (keyed subscriptions) are
    /// refused (108).
    #[serde(default, rename = "type")]
    pub(crate) kind: i32,
    /// Keys to track: only with type 1.
    #[serde(default)]
    pub(crate) track: Vec<serde::de::IgnoredAny>,
    /// Keys to untrack: only with type 2.
    #[serde(default)]
    pub(crate) untrack: Vec<String>,
}

/// A publication as the protocol shows it: `{"data":...,"offset":N}`
/// (`time`, ms since the Unix epoch, is Herald's commit time), with
/// `"tags":{...}` when the message has tags (`Publication.tags` of
/// `client.proto`).
#[derive(Debug, Serialize)]
pub(crate) struct Publication<'a> {
    /// The published JSON value, byte for byte; a message whose payload is
    /// bytes (a Durable Streams byte stream) as a JSON string of their
    /// base64 (`docs/centrifugo.md`).
    pub(crate) data: std::borrow::Cow<'a, RawValue>,
    /// Its offset in the channel.
    pub(crate) offset: u64,
    /// Commit time, ms since the Unix epoch.
    pub(crate) time: i64,
    /// The tags published with it.
    #[serde(skip_serializing_if = "Tags::is_empty")]
    pub(crate) tags: &'a Tags,
    /// `data` is a Fossil delta of the subscriber's previous publication
    /// (`fossil_delta.rs`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) delta: bool,
}

/// How a publication's `data` is written.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DataForm<'d> {
    /// The value itself.
    Plain,
    /// The value's JSON text as a JSON string: a JSON subscriber with
    /// delta on gets every whole publication so (centrifuge-js parses it).
    Wrapped,
    /// A Fossil delta, as a JSON string, with `delta: true`.
    Delta(&'d str),
}

impl<'a> Publication<'a> {
    /// `m` with its `data` written in `form`.
    pub(crate) fn with_form(m: &'a Message, form: DataForm<'_>) -> Self {
        let as_string = |text: &str| {
            let quoted = serde_json::to_string(text).expect("a string serializes");
            std::borrow::Cow::Owned(RawValue::from_string(quoted).expect("a JSON string is JSON"))
        };
        match form {
            DataForm::Plain => Self::from(m),
            DataForm::Wrapped => Self {
                data: as_string(&m.data.to_json_text()),
                ..Self::from(m)
            },
            DataForm::Delta(delta) => Self {
                data: as_string(delta),
                delta: true,
                ..Self::from(m)
            },
        }
    }
}

impl<'a> From<&'a Message> for Publication<'a> {
    fn from(m: &'a Message) -> Self {
        Self {
            data: match &m.data {
                herald_core::Payload::Json(json) => one_line(json),
                herald_core::Payload::Bytes(_) => std::borrow::Cow::Owned(
                    RawValue::from_string(m.data.to_json_text().into_owned())
                        .expect("a base64 JSON string is JSON"),
                ),
            },
            offset: m.offset,
            time: m.published_at_ms,
            tags: &m.tags,
            delta: false,
        }
    }
}

/// `raw` on one line: a raw line break in JSON text can only be
/// whitespace between tokens (inside a string JSON escapes it), so it
/// becomes a space. Stored values keep the bytes they were published
/// with, and a pretty-printed one must not split the JSON lines of a
/// frame, an SSE event or a protobuf transcoding.
pub(crate) fn one_line(raw: &RawValue) -> std::borrow::Cow<'_, RawValue> {
    let text = raw.get();
    if text.contains(['\n', '\r']) {
        let flat = text.replace(['\n', '\r'], " ");
        std::borrow::Cow::Owned(RawValue::from_string(flat).expect("whitespace changed only"))
    } else {
        std::borrow::Cow::Borrowed(raw)
    }
}

/// The publications of a list, serialized in order.
pub(crate) fn publications(messages: &[Message]) -> Vec<Publication<'_>> {
    messages.iter().map(Publication::from).collect()
}

/// `{"id":N,"<method>":<result>}`.
pub(crate) fn reply(id: u32, method: &str, result: &impl Serialize) -> String {
    let result = serde_json::to_string(result).unwrap_or_else(|_| "{}".to_owned());
    format!("{{\"id\":{id},\"{method}\":{result}}}")
}

/// `{"id":N,"error":{...}}`.
pub(crate) fn error_reply(id: u32, error: &ReplyError) -> String {
    reply(id, "error", error)
}

/// A publication push: `{"push":{"channel":"...","pub":{...}}}`.
pub(crate) fn publication_push(channel: &str, message: &Message) -> String {
    publication_push_with(channel, message, DataForm::Plain)
}

/// [`publication_push`] with its `data` in `form`.
pub(crate) fn publication_push_with(
    channel: &str,
    message: &Message,
    form: DataForm<'_>,
) -> String {
    #[derive(Serialize)]
    struct Push<'a> {
        channel: &'a str,
        #[serde(rename = "pub")]
        publication: Publication<'a>,
    }
    let push = Push {
        channel,
        publication: Publication::with_form(message, form),
    };
    reply_push(&push)
}

/// An unsubscribe push: `{"push":{"channel":"...","unsubscribe":{"code":N,"reason":"..."}}}`.
pub(crate) fn unsubscribe_push(channel: &str, code: u32, reason: &str) -> String {
    reply_push(&serde_json::json!({
        "channel": channel,
        "unsubscribe": {"code": code, "reason": reason},
    }))
}

/// A disconnect push, the end of an emulation transport's stream:
/// `{"push":{"disconnect":{"code":N,"reason":"..."}}}`.
pub(crate) fn disconnect_push(code: u16, reason: &str) -> String {
    reply_push(&serde_json::json!({
        "disconnect": {"code": code, "reason": reason},
    }))
}

/// A join or leave push:
/// `{"push":{"channel":"...","join":{"info":{"user","client","conn_info","chan_info"}}}}`
/// (`leave` instead of `join`). `user` and `client` are always there, as
/// Centrifugo writes them; an info is there when set and JSON text.
pub(crate) fn join_leave_push(event: &PresenceEvent) -> String {
    #[derive(Serialize)]
    struct Info<'a> {
        user: &'a str,
        client: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        conn_info: Option<Box<RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        chan_info: Option<Box<RawValue>>,
    }
    #[derive(Serialize)]
    struct Body<'a> {
        info: Info<'a>,
    }
    #[derive(Serialize)]
    struct Push<'a> {
        channel: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        join: Option<Body<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        leave: Option<Body<'a>>,
    }
    fn raw(text: Option<&str>) -> Option<Box<RawValue>> {
        text.and_then(|t| serde_json::from_str::<&RawValue>(t).ok())
            .map(|r| one_line(r).into_owned())
    }
    let body = Body {
        info: Info {
            user: &event.info.user,
            client: &event.info.client,
            conn_info: raw(event.info.conn_info.as_deref()),
            chan_info: raw(event.info.chan_info.as_deref()),
        },
    };
    let (join, leave) = match event.kind {
        PresenceEventKind::Join => (Some(body), None),
        PresenceEventKind::Leave => (None, Some(body)),
    };
    reply_push(&Push {
        channel: event.channel.as_str(),
        join,
        leave,
    })
}

fn reply_push(push: &impl Serialize) -> String {
    let push = serde_json::to_string(push).unwrap_or_else(|_| "{}".to_owned());
    format!("{{\"push\":{push}}}")
}

#[cfg(test)]
mod tests {
    use herald_core::ChannelName;
    use herald_storage::ClientInfo;
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn requests_decode_from_objects_only() {
        let parse = |line: &str| serde_json::from_str::<Command>(line);
        for array in [
            r#"{"id":1,"history":{"channel":"a","since":[5,"e"]}}"#,
            r#"{"id":1,"history":{"channel":"a","since":[]}}"#,
            r#"{"id":1,"subscribe":["a"]}"#,
            r#"{"id":1,"publish":["a",1]}"#,
        ] {
            assert!(parse(array).is_err(), "{array}");
        }
        let c = parse(r#"{"id":1,"history":{"channel":"a","since":null}}"#).unwrap();
        assert_eq!(c.history.unwrap().since, None);
        let c = parse(r#"{"id":1,"history":{"channel":"a","since":{"offset":5,"epoch":"e"}}}"#)
            .unwrap();
        let since = StreamPosition {
            offset: 5,
            epoch: "e".to_owned(),
        };
        assert_eq!(c.history.unwrap().since, Some(since));
        let c = parse(r#"{"id":1,"subscribe":null,"unsubscribe":{"channel":"a"}}"#).unwrap();
        assert!(c.subscribe.is_none());
        assert_eq!(c.unsubscribe.unwrap().channel, "a");
        let c = parse(r#"{"id":1,"publish":{"channel":"a","data":[1, {"x": 2}]}}"#).unwrap();
        assert_eq!(c.publish.unwrap().data.get(), r#"[1, {"x": 2}]"#);
        let c = parse(r#"{"id":7}"#).unwrap();
        assert!(c.connect.is_none() && c.history.is_none());
    }

    #[test]
    fn join_and_leave_pushes_have_centrifugos_shape() {
        let mut event = PresenceEvent {
            kind: PresenceEventKind::Join,
            channel: ChannelName::new("chat:a").unwrap(),
            info: ClientInfo {
                user: String::new(),
                client: "c-1".to_owned(),
                conn_info: Some(r#"{"name":"Ann"}"#.to_owned()),
                chan_info: None,
            },
        };
        let parsed = |text: String| serde_json::from_str::<Value>(&text).unwrap();
        assert_eq!(
            parsed(join_leave_push(&event)),
            json!({"push": {"channel": "chat:a", "join": {"info": {
                "user": "", "client": "c-1", "conn_info": {"name": "Ann"}
            }}}})
        );
        event.kind = PresenceEventKind::Leave;
        event.info.conn_info = Some("not json".to_owned());
        event.info.chan_info = Some("7".to_owned());
        assert_eq!(
            parsed(join_leave_push(&event)),
            json!({"push": {"channel": "chat:a", "leave": {"info": {
                "user": "", "client": "c-1", "chan_info": 7
            }}}})
        );
    }
}
