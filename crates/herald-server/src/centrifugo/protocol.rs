//! Centrifugo's client protocol v2 (`client.proto` of
//! centrifugal/protocol): the client's commands, as one set of types for
//! both of its forms. Each message derives serde (the JSON form) and
//! `prost::Message` (the protobuf form, field numbers and types as
//! published in `client.proto`); the replies and pushes are in
//! `replies.rs`, the framing of each form in `codec.rs`.
//!
//! In the JSON form a frame holds one or more JSON objects separated by
//! newlines, both ways. A command carries an `id` and one request field
//! named after its method; the reply carries the same `id` and a result
//! field of the same name, or `error`. Pushes have no `id`. An empty
//! object is a ping (server to client) or a pong (client to server).
//!
//! Every field of `client.proto`'s requests is known here, and each is
//! either acted on, refused where Herald does not serve what it asks for
//! (`commands/`: Centrifugo's error or disconnect for it), or ignored
//! where Centrifugo ignores it too without the part of its setup that
//! reads it (a connect or subscribe proxy, dictionaries). A JSON request
//! that holds a field `client.proto` does not have does not decode: the
//! connection closes with 3501 "bad request", so that a newer SDK's
//! feature is never taken for something else (in protobuf, unknown field
//! numbers are skipped, as protobuf decoders do).
//!
//! The `bytes` fields that carry application data (`data`) hold JSON
//! text in both forms: in the JSON form the value itself, kept as its
//! exact text; in protobuf the bytes of that text, as in Centrifugo when
//! JSON clients and protobuf clients share a channel. Herald's channels
//! hold JSON, so a protobuf command whose `data` is not JSON text is not
//! the protocol (`codec.rs`: 3501).

use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::tags_filter::FilterNode;

/// One command of a client frame (`Command`).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub(crate) struct Command {
    /// Matches the reply to the command; 0 (or none) for a pong, which is
    /// never run whatever else it holds, or a `send`, which gets no reply.
    #[serde(default)]
    #[prost(uint32, tag = "1")]
    pub(crate) id: u32,
    /// `connect`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "4")]
    pub(crate) connect: Option<ConnectRequest>,
    /// `subscribe`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "5")]
    pub(crate) subscribe: Option<SubscribeRequest>,
    /// `unsubscribe`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "6")]
    pub(crate) unsubscribe: Option<ChannelRequest>,
    /// `publish`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "7")]
    pub(crate) publish: Option<PublishRequest>,
    /// `presence`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "8")]
    pub(crate) presence: Option<ChannelRequest>,
    /// `presence_stats`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "9")]
    pub(crate) presence_stats: Option<ChannelRequest>,
    /// `history`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "10")]
    pub(crate) history: Option<HistoryRequest>,
    /// `ping` (its request has no fields; any JSON value is taken).
    #[serde(default, deserialize_with = "present")]
    #[prost(message, optional, tag = "11")]
    pub(crate) ping: Option<Empty>,
    /// `send` (refused: its content is not read).
    #[serde(default, deserialize_with = "present")]
    #[prost(message, optional, tag = "12")]
    pub(crate) send: Option<SendRequest>,
    /// `rpc` (refused: its content is not read).
    #[serde(default, deserialize_with = "present")]
    #[prost(message, optional, tag = "13")]
    pub(crate) rpc: Option<RpcRequest>,
    /// `refresh`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "14")]
    pub(crate) refresh: Option<RefreshRequest>,
    /// `sub_refresh`.
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "15")]
    pub(crate) sub_refresh: Option<SubRefreshRequest>,
}

impl Command {
    /// How many requests the command holds (a command that runs holds
    /// exactly one; none is an unknown method, answered 104).
    pub(crate) fn requests(&self) -> usize {
        [
            self.connect.is_some(),
            self.subscribe.is_some(),
            self.unsubscribe.is_some(),
            self.publish.is_some(),
            self.presence.is_some(),
            self.presence_stats.is_some(),
            self.history.is_some(),
            self.ping.is_some(),
            self.send.is_some(),
            self.rpc.is_some(),
            self.refresh.is_some(),
            self.sub_refresh.is_some(),
        ]
        .into_iter()
        .filter(|&set| set)
        .count()
    }

    /// The `data` fields of the command that hold application data
    /// (`connect`'s and its `subs`', `subscribe`'s, `publish`'s, `send`'s,
    /// `rpc`'s), for the protobuf form's check that they are JSON text.
    pub(crate) fn data_fields(&self) -> impl Iterator<Item = &[u8]> {
        let connect = self.connect.iter().flat_map(|c| {
            std::iter::once(c.data.as_slice()).chain(c.subs.values().map(|s| s.data.as_slice()))
        });
        connect
            .chain(self.subscribe.iter().map(|s| s.data.as_slice()))
            .chain(self.publish.iter().map(|p| p.data.as_slice()))
            .chain(self.send.iter().map(|s| s.data.as_slice()))
            .chain(self.rpc.iter().map(|r| r.data.as_slice()))
    }
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

/// What a JSON command line holds besides its `id`: how many request
/// fields that are not `null`, and whether any field a command does not
/// have. A command that runs holds exactly one request and nothing
/// unknown (a line with none is an unknown method, answered 104).
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

/// A request whose content is not read: any JSON value but `null` is a
/// request (its fields left at their defaults), `null` is none.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Default,
{
    Ok(Option::<IgnoredAny>::deserialize(deserializer)?.map(|_| T::default()))
}

/// A field Herald ignores in the JSON form: any JSON value is taken and
/// read as the field's default.
fn ignored<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default,
{
    IgnoredAny::deserialize(deserializer)?;
    Ok(T::default())
}

/// A JSON value as its exact text, into bytes (the protobuf form's `data`
/// holds the same text).
fn json_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let raw: Box<RawValue> = Deserialize::deserialize(deserializer)?;
    Ok(raw.get().as_bytes().to_vec())
}

/// An integer of the JSON form read into the protobuf form's `int32`,
/// clamped to its range (for `history`'s `limit`, where any negative
/// value means "as many as allowed" and any value past the server's
/// bound means the bound).
fn clamped_i32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    let value = i64::deserialize(deserializer)?;
    Ok(i32::try_from(value).unwrap_or(if value < 0 { i32::MIN } else { i32::MAX }))
}

/// A message without fields (`PingRequest`, and the empty results).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
pub(crate) struct Empty {}

/// `connect`: the connection token, the client's name and version, and
/// the recovery it asks for its server-side subscriptions.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectRequest {
    /// The connection JWT (empty: anonymous).
    #[serde(default)]
    #[prost(string, tag = "1")]
    pub(crate) token: String,
    /// Data for a connect proxy: ignored, as Centrifugo does without one
    /// (in protobuf it must still be JSON text).
    #[serde(default, deserialize_with = "ignored")]
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) data: Vec<u8>,
    /// Per channel of a server-side subscription it had on its previous
    /// connection: where to recover from (`ConnectRequest.subs` of
    /// `client.proto`, a map of `SubscribeRequest`s of which only
    /// `recover`, `epoch` and `offset` are read). Channels that are not
    /// server-side subscriptions of this connection are ignored.
    #[serde(default)]
    #[prost(btree_map = "string, message", tag = "3")]
    pub(crate) subs: BTreeMap<String, SubscribeRequest>,
    /// The client's name (`js`, `python` ...), for logs.
    #[serde(default)]
    #[prost(string, tag = "4")]
    pub(crate) name: String,
    /// The client's version, for logs.
    #[serde(default)]
    #[prost(string, tag = "5")]
    pub(crate) version: String,
    /// Headers for a connect proxy (headers emulation): ignored, as
    /// Centrifugo does without a proxy.
    #[serde(default, deserialize_with = "ignored")]
    #[prost(btree_map = "string, string", tag = "6")]
    pub(crate) headers: BTreeMap<String, String>,
    /// The client's connect flags: none changes what Herald answers.
    #[serde(default, deserialize_with = "ignored")]
    #[prost(int64, tag = "7")]
    pub(crate) flag: i64,
    /// The compression dictionary the client holds: ignored, as
    /// Centrifugo does without dictionaries configured.
    #[serde(default, deserialize_with = "ignored")]
    #[prost(string, tag = "8")]
    pub(crate) dict: String,
    /// A compression profile the client asks for: ignored, as above.
    #[serde(default, deserialize_with = "ignored")]
    #[prost(string, tag = "9")]
    pub(crate) profile: String,
}

/// `subscribe` (also the value of `connect`'s `subs` map, where its
/// `channel` is the map's key).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubscribeRequest {
    /// The channel (empty: a protocol error, 3501).
    #[serde(default)]
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    /// A subscription JWT for this channel (empty: the connection's
    /// credentials decide).
    #[serde(default)]
    #[prost(string, tag = "2")]
    pub(crate) token: String,
    /// Recover the publications after `offset` of `epoch`.
    #[serde(default)]
    #[prost(bool, tag = "3")]
    pub(crate) recover: bool,
    /// The epoch the client last saw.
    #[serde(default)]
    #[prost(string, tag = "6")]
    pub(crate) epoch: String,
    /// The offset of the last publication the client received.
    #[serde(default)]
    #[prost(uint64, tag = "7")]
    pub(crate) offset: u64,
    /// Data for a subscribe proxy: ignored, as Centrifugo does without
    /// one (in protobuf it must still be JSON text).
    #[serde(default, deserialize_with = "ignored")]
    #[prost(bytes = "vec", tag = "8")]
    pub(crate) data: Vec<u8>,
    /// The client asks for a positioned subscription: every Herald
    /// subscription is.
    #[serde(default, deserialize_with = "ignored")]
    #[prost(bool, tag = "9")]
    pub(crate) positioned: bool,
    /// The client asks for a recoverable subscription: every Herald
    /// subscription is.
    #[serde(default, deserialize_with = "ignored")]
    #[prost(bool, tag = "10")]
    pub(crate) recoverable: bool,
    /// Push joins and leaves of the channel to this subscriber, where
    /// its namespace has `join_leave`.
    #[serde(default)]
    #[prost(bool, tag = "11")]
    pub(crate) join_leave: bool,
    /// The delta encoding asked for: `""` none, `"fossil"` not negotiated
    /// (the result says `delta: false`, as Centrifugo's does where the
    /// namespace allows no delta), anything else 3501.
    #[serde(default)]
    #[prost(string, tag = "12")]
    pub(crate) delta: String,
    /// A filter on the publications' tags (see `tags_filter.rs`).
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "13")]
    pub(crate) tf: Option<FilterNode>,
    /// Subscription flags: bit 0, channel compaction (ignored: pushes
    /// always name the channel, as Centrifugo's do where the namespace
    /// does not allow compaction), and
    /// [`SUBSCRIPTION_FLAG_REJECT_UNRECOVERED`]; other bits are ignored,
    /// as Centrifugo does.
    #[serde(default)]
    #[prost(int64, tag = "14")]
    pub(crate) flag: i64,
    /// The subscription type: 0 stream; 1, 2, 3 map (of keys, clients,
    /// users) and 4 shared poll are refused (108).
    #[serde(default, rename = "type")]
    #[prost(int32, tag = "15")]
    pub(crate) kind: i32,
    /// A map subscription's phase: only with a map type.
    #[serde(default)]
    #[prost(int32, tag = "16")]
    pub(crate) phase: i32,
    /// A map subscription's page cursor: only with a map type.
    #[serde(default)]
    #[prost(string, tag = "17")]
    pub(crate) cursor: String,
    /// A map subscription's page size: only with a map type.
    #[serde(default)]
    #[prost(int32, tag = "18")]
    pub(crate) limit: i32,
    /// A map subscription's order: only with a map type.
    #[serde(default)]
    #[prost(bool, tag = "19")]
    pub(crate) asc: bool,
}

/// `SubscribeRequest.flag` bit 1: a recovery that fails is answered with
/// error 112 "unrecoverable position" instead of `recovered: false`, so
/// that the SDK reloads the state itself (centrifuge-js's `getState`).
pub(crate) const SUBSCRIPTION_FLAG_REJECT_UNRECOVERED: i64 = 2;

/// A request naming only a channel (`unsubscribe`, `presence`,
/// `presence_stats`).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChannelRequest {
    /// The channel.
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
}

/// `publish`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishRequest {
    /// The channel.
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    /// The JSON text of the value to publish, exact (in the JSON form the
    /// value itself; required: a publish without it is not a command).
    #[serde(deserialize_with = "json_text")]
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) data: Vec<u8>,
    /// 0 a stream publish; 1 a map publish, refused (108).
    #[serde(default, rename = "type")]
    #[prost(int32, tag = "3")]
    pub(crate) kind: i32,
    /// A map publish's key: refused (108).
    #[serde(default)]
    #[prost(string, tag = "4")]
    pub(crate) key: String,
    /// A map publish's removal of its key: refused (108).
    #[serde(default)]
    #[prost(bool, tag = "5")]
    pub(crate) removed: bool,
}

/// A stream position, `since` of `history`.
#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamPosition {
    /// An offset.
    #[serde(default)]
    #[prost(uint64, tag = "1")]
    pub(crate) offset: u64,
    /// The epoch the offset belongs to.
    #[serde(default)]
    #[prost(string, tag = "2")]
    pub(crate) epoch: String,
}

/// `history`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryRequest {
    /// The channel.
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    /// Publications wanted: 0 only the stream position, negative as many
    /// as allowed (bounded by the server).
    #[serde(default, deserialize_with = "clamped_i32")]
    #[prost(int32, tag = "7")]
    pub(crate) limit: i32,
    /// Only publications after this position (before it with `reverse`).
    #[serde(default, deserialize_with = "object")]
    #[prost(message, optional, tag = "8")]
    pub(crate) since: Option<StreamPosition>,
    /// Newest first.
    #[serde(default)]
    #[prost(bool, tag = "9")]
    pub(crate) reverse: bool,
}

/// `send`: an asynchronous message, refused (3508).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SendRequest {
    /// Its data (in protobuf, JSON text).
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) data: Vec<u8>,
}

/// `rpc`: refused (108).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RpcRequest {
    /// Its data (in protobuf, JSON text).
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) data: Vec<u8>,
    /// The method called.
    #[prost(string, tag = "2")]
    pub(crate) method: String,
}

/// `refresh`: a new connection token.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefreshRequest {
    /// The new connection JWT.
    #[serde(default)]
    #[prost(string, tag = "1")]
    pub(crate) token: String,
}

/// `sub_refresh`: a new subscription token.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubRefreshRequest {
    /// The channel.
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    /// The new subscription JWT.
    #[serde(default)]
    #[prost(string, tag = "2")]
    pub(crate) token: String,
    /// 0 a token refresh; 1 track and 2 untrack (keyed subscriptions) are
    /// refused (108).
    #[serde(default, rename = "type")]
    #[prost(int32, tag = "3")]
    pub(crate) kind: i32,
    /// Keys to track: only with type 1 (their content is not read).
    #[serde(default, deserialize_with = "batches")]
    #[prost(message, repeated, tag = "4")]
    pub(crate) track: Vec<TrackBatch>,
    /// Keys to untrack: only with type 2.
    #[serde(default)]
    #[prost(string, repeated, tag = "5")]
    pub(crate) untrack: Vec<String>,
}

/// A JSON array whose items are not read, as that many empty batches.
fn batches<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<TrackBatch>, D::Error> {
    let items: Vec<IgnoredAny> = Deserialize::deserialize(deserializer)?;
    Ok(vec![TrackBatch::default(); items.len()])
}

/// `TrackBatch` (keyed subscriptions; refused, see `commands/`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TrackBatch {
    /// The batch's signature.
    #[prost(string, tag = "1")]
    pub(crate) signature: String,
    /// The keys.
    #[prost(message, repeated, tag = "2")]
    pub(crate) items: Vec<KeyedItem>,
}

/// `KeyedItem`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyedItem {
    /// The key.
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    /// Its version.
    #[prost(uint64, tag = "2")]
    pub(crate) version: u64,
}

/// `EmulationRequest`: an `/emulation` body in the binary form; `data`
/// holds the session's commands, delimited.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EmulationRequest {
    /// The node the session runs on.
    #[prost(string, tag = "1")]
    pub(crate) node: String,
    /// The session.
    #[prost(string, tag = "2")]
    pub(crate) session: String,
    /// The commands.
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) data: Vec<u8>,
}

#[cfg(test)]
mod tests {
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
        assert_eq!(c.publish.unwrap().data, br#"[1, {"x": 2}]"#);
        let c = parse(r#"{"id":7}"#).unwrap();
        assert!(c.connect.is_none() && c.history.is_none());
    }
}
