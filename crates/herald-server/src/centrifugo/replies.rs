//! The server's side of Centrifugo's client protocol v2 (`client.proto`
//! of centrifugal/protocol): the `Reply` to a command, the pushes it
//! carries, and the ping, as one set of types for both forms. Each
//! message derives serde (the JSON form: `{"id":N,"<method>":<result>}`,
//! `{"id":N,"error":{...}}`, `{"push":{...}}`, `{}` a ping) and
//! `prost::Message` (the protobuf form, field numbers and types as
//! published in `client.proto`); `codec.rs` writes them for a
//! connection's encoding. A field's default value is left out of the
//! JSON form except where Centrifugo's JSON always writes it (noted).
//!
//! Application data keeps its bytes: a publication's `data` is the
//! stored JSON value, written as that value in the JSON form and as its
//! exact text's bytes in protobuf; a Fossil delta is a JSON string in the
//! JSON form and its own bytes in protobuf (`Data`). Nothing is written
//! as JSON text to be read back.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use herald_core::{Message, Payload, Tags};
use herald_storage::{PresenceEvent, PresenceEventKind};
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use serde::ser::{Error as _, SerializeStruct, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;

use super::codes::ReplyError;
use super::protocol::Empty;

/// `true` for `false`, which the JSON form leaves out.
fn is_false(value: &bool) -> bool {
    !*value
}

/// `true` for 0, which the JSON form leaves out.
fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Writes bytes holding JSON text (checked where they were made) as that
/// JSON value.
///
/// # Errors
/// When the bytes are not JSON text (a bug: the reply is not written).
fn raw_json<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    let raw: &RawValue = serde_json::from_slice(bytes).map_err(S::Error::custom)?;
    raw.serialize(serializer)
}

/// `Reply`: the answer to command `id` (one result field, or `error`), a
/// push (`id` 0), or, empty, a ping.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct Reply {
    /// The command answered; 0 for a push or a ping.
    #[prost(uint32, tag = "1")]
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) id: u32,
    /// The command failed.
    #[prost(message, optional, tag = "2")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<Error>,
    /// A push.
    #[prost(message, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) push: Option<Push>,
    /// `connect`'s result.
    #[prost(message, optional, tag = "5")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) connect: Option<ConnectResult>,
    /// `subscribe`'s result.
    #[prost(message, optional, tag = "6")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) subscribe: Option<SubscribeResult>,
    /// `unsubscribe`'s result.
    #[prost(message, optional, tag = "7")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unsubscribe: Option<Empty>,
    /// `publish`'s result.
    #[prost(message, optional, tag = "8")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) publish: Option<Empty>,
    /// `presence`'s result.
    #[prost(message, optional, tag = "9")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) presence: Option<PresenceResult>,
    /// `presence_stats`'s result.
    #[prost(message, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) presence_stats: Option<PresenceStatsResult>,
    /// `history`'s result.
    #[prost(message, optional, tag = "11")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<HistoryResult>,
    /// `ping`'s result.
    #[prost(message, optional, tag = "12")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ping: Option<Empty>,
    /// `refresh`'s result.
    #[prost(message, optional, tag = "14")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) refresh: Option<RefreshResult>,
    /// `sub_refresh`'s result.
    #[prost(message, optional, tag = "15")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sub_refresh: Option<SubRefreshResult>,
}

impl Reply {
    /// The error reply to command `id`.
    pub(crate) fn error(id: u32, error: &ReplyError) -> Self {
        Self {
            id,
            error: Some(Error::from(error)),
            ..Self::default()
        }
    }

    /// A push.
    pub(crate) fn push(push: Push) -> Self {
        Self {
            push: Some(push),
            ..Self::default()
        }
    }
}

/// `Error`: a command's error, with Centrifugo's code (`codes.rs`).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct Error {
    /// The code, 100–112.
    #[prost(uint32, tag = "1")]
    pub(crate) code: u32,
    /// Centrifugo's message for the code.
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    /// Set for the codes a client may retry at once.
    #[prost(bool, tag = "3")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) temporary: bool,
}

impl From<&ReplyError> for Error {
    fn from(e: &ReplyError) -> Self {
        Self {
            code: e.code,
            message: e.message.clone(),
            temporary: e.temporary,
        }
    }
}

/// `Push`: one of a publication, a join, a leave, an unsubscribe (each
/// of `channel`) or a disconnect.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct Push {
    /// The channel (none for a disconnect).
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) channel: String,
    /// A publication.
    #[prost(message, optional, tag = "4")]
    #[serde(rename = "pub", skip_serializing_if = "Option::is_none")]
    pub(crate) publication: Option<Publication>,
    /// A join.
    #[prost(message, optional, tag = "5")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) join: Option<JoinLeave>,
    /// A leave.
    #[prost(message, optional, tag = "6")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) leave: Option<JoinLeave>,
    /// The subscription ended.
    #[prost(message, optional, tag = "7")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unsubscribe: Option<Unsubscribe>,
    /// The connection ends (the end of an emulation transport's stream).
    #[prost(message, optional, tag = "11")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) disconnect: Option<Disconnect>,
}

/// `ClientInfo`: a client in a join, a leave or a presence result;
/// `conn_info` and `chan_info` hold JSON text (checked, on one line), or
/// nothing.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct ClientInfo {
    /// The user (empty: anonymous).
    #[prost(string, tag = "1")]
    pub(crate) user: String,
    /// The client id.
    #[prost(string, tag = "2")]
    pub(crate) client: String,
    /// The connection token's `info`.
    #[prost(bytes = "vec", tag = "3")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) conn_info: Vec<u8>,
    /// The subscription token's `info`.
    #[prost(bytes = "vec", tag = "4")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) chan_info: Vec<u8>,
}

/// `Join` and `Leave`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct JoinLeave {
    /// Who joined or left.
    #[prost(message, optional, tag = "1")]
    pub(crate) info: Option<ClientInfo>,
}

/// `Unsubscribe` (push).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct Unsubscribe {
    /// The code (2000 a server unsubscribe).
    #[prost(uint32, tag = "2")]
    pub(crate) code: u32,
    /// Why.
    #[prost(string, tag = "3")]
    pub(crate) reason: String,
}

/// `Disconnect` (push).
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct Disconnect {
    /// The disconnect code (`codes.rs`).
    #[prost(uint32, tag = "1")]
    pub(crate) code: u32,
    /// Its reason.
    #[prost(string, tag = "2")]
    pub(crate) reason: String,
}

/// `ConnectResult`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct ConnectResult {
    /// The client id.
    #[prost(string, tag = "1")]
    pub(crate) client: String,
    /// The server's version.
    #[prost(string, tag = "2")]
    pub(crate) version: String,
    /// The connection token expires.
    #[prost(bool, tag = "3")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) expires: bool,
    /// Seconds until it does (at least 1 when it does).
    #[prost(uint32, tag = "4")]
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) ttl: u32,
    /// The ping interval, s (always written).
    #[prost(uint32, tag = "7")]
    pub(crate) ping: u32,
    /// The client is to answer pings (always written).
    #[prost(bool, tag = "8")]
    pub(crate) pong: bool,
    /// An emulation transport's session id, for its `/emulation`
    /// requests.
    #[prost(string, tag = "9")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) session: String,
    /// The node the session runs on, with `session`.
    #[prost(string, tag = "10")]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) node: String,
    /// The server-side subscriptions, by channel.
    #[prost(btree_map = "string, message", tag = "6")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) subs: BTreeMap<String, SubscribeResult>,
}

/// `SubscribeResult` (also a server-side subscription's `subs` entry of
/// the connect result).
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct SubscribeResult {
    /// A subscription token expires.
    #[prost(bool, tag = "1")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) expires: bool,
    /// Seconds until it does.
    #[prost(uint32, tag = "2")]
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) ttl: u32,
    /// Always `true` (always written).
    #[prost(bool, tag = "3")]
    pub(crate) recoverable: bool,
    /// Always `true` (always written).
    #[prost(bool, tag = "10")]
    pub(crate) positioned: bool,
    /// The channel's epoch (always written).
    #[prost(string, tag = "6")]
    pub(crate) epoch: String,
    /// Live publications continue after this offset (always written).
    #[prost(uint64, tag = "9")]
    pub(crate) offset: u64,
    /// The recovered publications.
    #[prost(message, repeated, tag = "7")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) publications: Vec<Publication>,
    /// The recovery asked for succeeded.
    #[prost(bool, tag = "8")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) recovered: bool,
    /// A recovery was asked for.
    #[prost(bool, tag = "12")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) was_recovering: bool,
    /// Publications come as Fossil deltas (`fossil_delta.rs`).
    #[prost(bool, tag = "13")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) delta: bool,
    /// The `data` of a server-side subscription's entry: JSON text on
    /// one line, or nothing.
    #[prost(bytes = "vec", tag = "11")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) data: Vec<u8>,
}

/// `PresenceResult`: the channel's clients, by client id.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct PresenceResult {
    /// The clients.
    #[prost(btree_map = "string, message", tag = "1")]
    pub(crate) presence: BTreeMap<String, ClientInfo>,
}

/// `PresenceStatsResult`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct PresenceStatsResult {
    /// Connections subscribed.
    #[prost(uint32, tag = "1")]
    pub(crate) num_clients: u32,
    /// Distinct users among them.
    #[prost(uint32, tag = "2")]
    pub(crate) num_users: u32,
}

/// `HistoryResult` (every field always written).
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct HistoryResult {
    /// The publications.
    #[prost(message, repeated, tag = "1")]
    pub(crate) publications: Vec<Publication>,
    /// The channel's epoch.
    #[prost(string, tag = "2")]
    pub(crate) epoch: String,
    /// The channel's head offset.
    #[prost(uint64, tag = "3")]
    pub(crate) offset: u64,
}

/// `RefreshResult`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct RefreshResult {
    /// The client id.
    #[prost(string, tag = "1")]
    pub(crate) client: String,
    /// The server's version.
    #[prost(string, tag = "2")]
    pub(crate) version: String,
    /// The new token expires.
    #[prost(bool, tag = "3")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) expires: bool,
    /// Seconds until it does.
    #[prost(uint32, tag = "4")]
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) ttl: u32,
}

/// `SubRefreshResult`.
#[derive(Clone, PartialEq, Eq, prost::Message, Serialize)]
pub(crate) struct SubRefreshResult {
    /// The new token expires.
    #[prost(bool, tag = "1")]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) expires: bool,
    /// Seconds until it does.
    #[prost(uint32, tag = "2")]
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) ttl: u32,
}

/// A publication's `data`, kept as the bytes it travels as.
#[derive(Debug, Clone)]
pub(crate) enum Data {
    /// A JSON value: the value itself in the JSON form (a raw line break,
    /// only whitespace between tokens, as a space: one JSON line holds one
    /// reply), its exact text's bytes in protobuf. A message whose
    /// payload is bytes (a Durable Streams byte stream) is the JSON string
    /// of their base64 (`docs/centrifugo.md`).
    Json(Arc<RawValue>),
    /// Text that is a JSON string in the JSON form and its own bytes in
    /// protobuf: a Fossil delta, or a whole value's JSON text in a JSON
    /// delta subscription (centrifuge-js parses it).
    Text(String),
    /// Bytes read from the protobuf form (in the JSON form, as the JSON
    /// value they hold).
    Bytes(Vec<u8>),
}

impl Default for Data {
    fn default() -> Self {
        Self::Bytes(Vec::new())
    }
}

impl Data {
    /// The bytes of the protobuf form.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Json(raw) => raw.get().as_bytes(),
            Self::Text(text) => text.as_bytes(),
            Self::Bytes(bytes) => bytes,
        }
    }
}

impl PartialEq for Data {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

/// `Publication`: `data` at `offset`, committed at `time` (ms since the
/// Unix epoch, Herald's commit time), with its `tags`; `delta` when
/// `data` is a Fossil delta of the subscriber's previous publication.
/// The JSON form always writes `data`, `offset` and `time`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Publication {
    /// The data.
    pub(crate) data: Data,
    /// Its offset in the channel.
    pub(crate) offset: u64,
    /// Commit time, ms since the Unix epoch.
    pub(crate) time: i64,
    /// The tags published with it.
    pub(crate) tags: Tags,
    /// `data` is a Fossil delta.
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
    /// A Fossil delta, with `delta: true`.
    Delta(&'d str),
}

impl Publication {
    /// `m` with its `data` written in `form`.
    pub(crate) fn with_form(m: &Message, form: DataForm<'_>) -> Self {
        match form {
            DataForm::Plain => Self::from(m),
            DataForm::Wrapped => Self {
                data: Data::Text(m.data.to_json_text().into_owned()),
                ..Self::from(m)
            },
            DataForm::Delta(delta) => Self {
                data: Data::Text(delta.to_owned()),
                delta: true,
                ..Self::from(m)
            },
        }
    }
}

impl From<&Message> for Publication {
    fn from(m: &Message) -> Self {
        Self {
            data: match &m.data {
                Payload::Json(json) => Data::Json(Arc::clone(json)),
                Payload::Bytes(_) => Data::Json(Arc::from(
                    RawValue::from_string(m.data.to_json_text().into_owned())
                        .expect("a base64 JSON string is JSON"),
                )),
            },
            offset: m.offset,
            time: m.published_at_ms,
            tags: m.tags.clone(),
            delta: false,
        }
    }
}

impl Serialize for Publication {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Publication", 5)?;
        match &self.data {
            Data::Json(raw) => s.serialize_field("data", &*one_line(raw))?,
            Data::Text(text) => s.serialize_field("data", text)?,
            Data::Bytes(bytes) => {
                let raw: &RawValue = serde_json::from_slice(bytes).map_err(S::Error::custom)?;
                s.serialize_field("data", raw)?;
            }
        }
        s.serialize_field("offset", &self.offset)?;
        s.serialize_field("time", &self.time)?;
        if self.tags.is_empty() {
            s.skip_field("tags")?;
        } else {
            s.serialize_field("tags", &self.tags)?;
        }
        if self.delta {
            s.serialize_field("delta", &true)?;
        } else {
            s.skip_field("delta")?;
        }
        s.end()
    }
}

/// Field numbers of `Publication` in `client.proto`.
mod publication_field {
    pub(super) const DATA: u32 = 4;
    pub(super) const OFFSET: u32 = 6;
    pub(super) const TAGS: u32 = 7;
    pub(super) const DELTA: u32 = 8;
    pub(super) const TIME: u32 = 9;
}

/// The encoded length of a length-delimited field `tag` of `len` bytes.
fn delimited_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + prost::encoding::encoded_len_varint(len as u64) + len
}

/// Writes a length-delimited field (`bytes`, `string`).
fn put_delimited(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    prost::encoding::encode_key(tag, WireType::LengthDelimited, buf);
    prost::encoding::encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

/// The length of a `map<string, string>` entry's message (an empty key
/// or value is left out, as protobuf leaves out default values).
fn tag_entry_len(key: &str, value: &str) -> usize {
    let field = |s: &str| {
        if s.is_empty() {
            0
        } else {
            delimited_len(1, s.len())
        }
    };
    field(key) + field(value)
}

/// `Publication` by hand, so that `data` is written from the bytes it is
/// held in ([`Data`]) without a copy; the same field numbers as the
/// derived messages' `client.proto`.
impl prost::Message for Publication {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        use publication_field as f;
        let data = self.data.bytes();
        if !data.is_empty() {
            put_delimited(f::DATA, data, buf);
        }
        if self.offset != 0 {
            prost::encoding::uint64::encode(f::OFFSET, &self.offset, buf);
        }
        for (key, value) in self.tags.iter() {
            prost::encoding::encode_key(f::TAGS, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(tag_entry_len(key, value) as u64, buf);
            if !key.is_empty() {
                put_delimited(1, key.as_bytes(), buf);
            }
            if !value.is_empty() {
                put_delimited(2, value.as_bytes(), buf);
            }
        }
        if self.delta {
            prost::encoding::bool::encode(f::DELTA, &self.delta, buf);
        }
        if self.time != 0 {
            prost::encoding::int64::encode(f::TIME, &self.time, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        use publication_field as f;
        match tag {
            f::DATA => {
                let mut bytes = Vec::new();
                prost::encoding::bytes::merge(wire_type, &mut bytes, buf, ctx)?;
                self.data = Data::Bytes(bytes);
                Ok(())
            }
            f::OFFSET => prost::encoding::uint64::merge(wire_type, &mut self.offset, buf, ctx),
            f::TAGS => {
                let mut map: BTreeMap<String, String> = self
                    .tags
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                prost::encoding::btree_map::merge(
                    prost::encoding::string::merge,
                    prost::encoding::string::merge,
                    &mut map,
                    buf,
                    ctx,
                )?;
                self.tags = Tags::new(map);
                Ok(())
            }
            f::DELTA => prost::encoding::bool::merge(wire_type, &mut self.delta, buf, ctx),
            f::TIME => prost::encoding::int64::merge(wire_type, &mut self.time, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        use publication_field as f;
        let data = self.data.bytes();
        let mut len = 0;
        if !data.is_empty() {
            len += delimited_len(f::DATA, data.len());
        }
        if self.offset != 0 {
            len += prost::encoding::uint64::encoded_len(f::OFFSET, &self.offset);
        }
        for (key, value) in self.tags.iter() {
            len += delimited_len(f::TAGS, tag_entry_len(key, value));
        }
        if self.delta {
            len += prost::encoding::bool::encoded_len(f::DELTA, &self.delta);
        }
        if self.time != 0 {
            len += prost::encoding::int64::encoded_len(f::TIME, &self.time);
        }
        len
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// `raw` on one line: a raw line break in JSON text can only be
/// whitespace between tokens (inside a string JSON escapes it), so it
/// becomes a space. Stored values keep the bytes they were published
/// with, and a pretty-printed one must not split the JSON lines of a
/// frame or an SSE event.
pub(crate) fn one_line(raw: &RawValue) -> Cow<'_, RawValue> {
    let text = raw.get();
    if text.contains(['\n', '\r']) {
        let flat = text.replace(['\n', '\r'], " ");
        Cow::Owned(RawValue::from_string(flat).expect("whitespace changed only"))
    } else {
        Cow::Borrowed(raw)
    }
}

/// `text`, when it is JSON, as bytes of its text on one line; else
/// nothing (an info that is not JSON is left out, as Centrifugo's JSON
/// form cannot carry it).
pub(crate) fn json_info(text: Option<&str>) -> Vec<u8> {
    text.and_then(|t| serde_json::from_str::<&RawValue>(t).ok())
        .map(|raw| one_line(raw).get().as_bytes().to_vec())
        .unwrap_or_default()
}

/// The publications of a list, in order.
pub(crate) fn publications(messages: &[Message]) -> Vec<Publication> {
    messages.iter().map(Publication::from).collect()
}

/// A publication push of `channel` (`{"push":{"channel":"...","pub":{...}}}`).
pub(crate) fn publication_push(channel: &str, publication: Publication) -> Reply {
    Reply::push(Push {
        channel: channel.to_owned(),
        publication: Some(publication),
        ..Push::default()
    })
}

/// An unsubscribe push:
/// `{"push":{"channel":"...","unsubscribe":{"code":N,"reason":"..."}}}`.
pub(crate) fn unsubscribe_push(channel: &str, code: u32, reason: &str) -> Reply {
    Reply::push(Push {
        channel: channel.to_owned(),
        unsubscribe: Some(Unsubscribe {
            code,
            reason: reason.to_owned(),
        }),
        ..Push::default()
    })
}

/// A disconnect push, the end of an emulation transport's stream:
/// `{"push":{"disconnect":{"code":N,"reason":"..."}}}`.
pub(crate) fn disconnect_push(code: u16, reason: &str) -> Reply {
    Reply::push(Push {
        disconnect: Some(Disconnect {
            code: u32::from(code),
            reason: reason.to_owned(),
        }),
        ..Push::default()
    })
}

/// A join or leave push:
/// `{"push":{"channel":"...","join":{"info":{"user","client","conn_info","chan_info"}}}}`
/// (`leave` instead of `join`). `user` and `client` are always there, as
/// Centrifugo writes them; an info is there when set and JSON text.
pub(crate) fn join_leave_push(event: &PresenceEvent) -> Reply {
    let body = JoinLeave {
        info: Some(ClientInfo {
            user: event.info.user.clone(),
            client: event.info.client.clone(),
            conn_info: json_info(event.info.conn_info.as_deref()),
            chan_info: json_info(event.info.chan_info.as_deref()),
        }),
    };
    let (join, leave) = match event.kind {
        PresenceEventKind::Join => (Some(body), None),
        PresenceEventKind::Leave => (None, Some(body)),
    };
    Reply::push(Push {
        channel: event.channel.as_str().to_owned(),
        join,
        leave,
        ..Push::default()
    })
}

#[cfg(test)]
mod tests {
    use herald_core::ChannelName;
    use herald_storage::ClientInfo as StoredClientInfo;
    use serde_json::json;

    use super::*;

    #[test]
    fn join_and_leave_pushes_have_centrifugos_shape() {
        let mut event = PresenceEvent {
            kind: PresenceEventKind::Join,
            channel: ChannelName::new("chat:a").unwrap(),
            info: StoredClientInfo {
                user: String::new(),
                client: "c-1".to_owned(),
                conn_info: Some(r#"{"name":"Ann"}"#.to_owned()),
                chan_info: None,
            },
        };
        let parsed = |reply: Reply| serde_json::to_value(&reply).unwrap();
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
