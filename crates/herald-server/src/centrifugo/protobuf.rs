//! The binary (protobuf) form of Centrifugo's client protocol: the
//! messages of `client.proto` (centrifugal/protocol; field numbers and
//! types as published there), declared for `prost`, and the transcoding
//! between that form and the JSON form every session speaks (`session.rs`,
//! `commands.rs`). A protobuf frame holds messages each prefixed with its
//! length as a varint (protobuf's "delimited" form); a ping is an empty
//! `Reply`, a pong an empty `Command`.
//!
//! A client's frame is decoded into `Command`s and written as JSON lines;
//! the session's JSON replies and pushes are read back into `Reply`s and
//! encoded. The `bytes` fields that carry application data (`data`,
//! `conn_info`, `chan_info`) hold the JSON text of the value, as they do in
//! Centrifugo when JSON clients and protobuf clients share a channel:
//! Herald's channels hold JSON, so a protobuf client's `data` must be JSON
//! text (else the frame is not the protocol: 3501).

use std::collections::BTreeMap;

use serde::de::Deserializer;
use serde::ser::{Error as _, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// `true` for a field's default value, which the JSON form leaves out.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Writes JSON text held in bytes as that JSON value. A raw line break
/// (only whitespace between tokens in valid JSON) becomes a space: one
/// JSON line holds one command.
///
/// # Errors
/// When the bytes are not JSON text.
fn raw_json<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    let text = std::str::from_utf8(bytes).map_err(S::Error::custom)?;
    let text = text.replace(['\n', '\r'], " ");
    let raw: Box<RawValue> = serde_json::from_str(&text).map_err(S::Error::custom)?;
    raw.serialize(serializer)
}

/// Reads a JSON value as its text, into bytes.
fn json_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let raw: Box<RawValue> = Deserialize::deserialize(deserializer)?;
    Ok(raw.get().as_bytes().to_vec())
}

// ---------------------------------------------------------------------
// Client to server.

/// `Command`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct Command {
    #[prost(uint32, tag = "1")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) id: u32,
    #[prost(message, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) connect: Option<ConnectRequest>,
    #[prost(message, optional, tag = "5")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) subscribe: Option<SubscribeRequest>,
    #[prost(message, optional, tag = "6")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unsubscribe: Option<ChannelRequest>,
    #[prost(message, optional, tag = "7")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) publish: Option<PublishRequest>,
    #[prost(message, optional, tag = "8")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) presence: Option<ChannelRequest>,
    #[prost(message, optional, tag = "9")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) presence_stats: Option<ChannelRequest>,
    #[prost(message, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<HistoryRequest>,
    #[prost(message, optional, tag = "11")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ping: Option<Empty>,
    #[prost(message, optional, tag = "12")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) send: Option<SendRequest>,
    #[prost(message, optional, tag = "13")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rpc: Option<RpcRequest>,
    #[prost(message, optional, tag = "14")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) refresh: Option<RefreshRequest>,
    #[prost(message, optional, tag = "15")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sub_refresh: Option<SubRefreshRequest>,
}

/// A message without fields (`PingRequest`, and the empty results).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub(crate) struct Empty {}

/// `ConnectRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct ConnectRequest {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) token: String,
    #[prost(bytes = "vec", tag = "2")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) data: Vec<u8>,
    #[prost(btree_map = "string, message", tag = "3")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) subs: BTreeMap<String, SubscribeRequest>,
    #[prost(string, tag = "4")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) name: String,
    #[prost(string, tag = "5")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) version: String,
    #[prost(btree_map = "string, string", tag = "6")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) headers: BTreeMap<String, String>,
    #[prost(int64, tag = "7")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) flag: i64,
    #[prost(string, tag = "8")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) dict: String,
    #[prost(string, tag = "9")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) profile: String,
}

/// `SubscribeRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct SubscribeRequest {
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) token: String,
    #[prost(bool, tag = "3")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) recover: bool,
    #[prost(string, tag = "6")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) epoch: String,
    #[prost(uint64, tag = "7")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) offset: u64,
    #[prost(bytes = "vec", tag = "8")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) data: Vec<u8>,
    #[prost(bool, tag = "9")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) positioned: bool,
    #[prost(bool, tag = "10")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) recoverable: bool,
    #[prost(bool, tag = "11")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) join_leave: bool,
    #[prost(string, tag = "12")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) delta: String,
    #[prost(message, optional, tag = "13")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tf: Option<FilterNode>,
    #[prost(int64, tag = "14")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) flag: i64,
    #[prost(int32, tag = "15")]
    #[serde(skip_serializing_if = "is_default", rename = "type")]
    pub(crate) kind: i32,
    #[prost(int32, tag = "16")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) phase: i32,
    #[prost(string, tag = "17")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) cursor: String,
    #[prost(int32, tag = "18")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) limit: i32,
    #[prost(bool, tag = "19")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) asc: bool,
}

/// `FilterNode`: a tags filter (`tags_filter.rs`).
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct FilterNode {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) op: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) key: String,
    #[prost(string, tag = "3")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) cmp: String,
    #[prost(string, tag = "4")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) val: String,
    #[prost(string, repeated, tag = "5")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) vals: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<FilterNode>,
}

/// `UnsubscribeRequest`, `PresenceRequest`, `PresenceStatsRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct ChannelRequest {
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
}

/// `PublishRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct PublishRequest {
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    #[prost(bytes = "vec", tag = "2")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) data: Vec<u8>,
    #[prost(int32, tag = "3")]
    #[serde(skip_serializing_if = "is_default", rename = "type")]
    pub(crate) kind: i32,
    #[prost(string, tag = "4")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) key: String,
    #[prost(bool, tag = "5")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) removed: bool,
}

/// `HistoryRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct HistoryRequest {
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    #[prost(int32, tag = "7")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) limit: i32,
    #[prost(message, optional, tag = "8")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) since: Option<StreamPosition>,
    #[prost(bool, tag = "9")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) reverse: bool,
}

/// `StreamPosition`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct StreamPosition {
    #[prost(uint64, tag = "1")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) offset: u64,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) epoch: String,
}

/// `SendRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct SendRequest {
    #[prost(bytes = "vec", tag = "1")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) data: Vec<u8>,
}

/// `RPCRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct RpcRequest {
    #[prost(bytes = "vec", tag = "1")]
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "raw_json")]
    pub(crate) data: Vec<u8>,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) method: String,
}

/// `RefreshRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct RefreshRequest {
    #[prost(string, tag = "1")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) token: String,
}

/// `SubRefreshRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct SubRefreshRequest {
    #[prost(string, tag = "1")]
    pub(crate) channel: String,
    #[prost(string, tag = "2")]
    #[serde(skip_serializing_if = "is_default")]
    pub(crate) token: String,
    #[prost(int32, tag = "3")]
    #[serde(skip_serializing_if = "is_default", rename = "type")]
    pub(crate) kind: i32,
    #[prost(message, repeated, tag = "4")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) track: Vec<TrackBatch>,
    #[prost(string, repeated, tag = "5")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) untrack: Vec<String>,
}

/// `TrackBatch` (keyed subscriptions; refused, see `commands.rs`).
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct TrackBatch {
    #[prost(string, tag = "1")]
    pub(crate) signature: String,
    #[prost(message, repeated, tag = "2")]
    pub(crate) items: Vec<KeyedItem>,
}

/// `KeyedItem`.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub(crate) struct KeyedItem {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(uint64, tag = "2")]
    pub(crate) version: u64,
}

/// `EmulationRequest`: an `/emulation` body in the binary form; `data`
/// holds the session's commands, delimited.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EmulationRequest {
    #[prost(string, tag = "1")]
    pub(crate) node: String,
    #[prost(string, tag = "2")]
    pub(crate) session: String,
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) data: Vec<u8>,
}

// ---------------------------------------------------------------------
// Server to client: read back from the JSON form Herald writes.

/// `Reply` (also a ping, when empty, and a push's envelope).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct Reply {
    #[prost(uint32, tag = "1")]
    pub(crate) id: u32,
    #[prost(message, optional, tag = "2")]
    pub(crate) error: Option<ReplyError>,
    #[prost(message, optional, tag = "4")]
    pub(crate) push: Option<Push>,
    #[prost(message, optional, tag = "5")]
    pub(crate) connect: Option<ConnectResult>,
    #[prost(message, optional, tag = "6")]
    pub(crate) subscribe: Option<SubscribeResult>,
    #[prost(message, optional, tag = "7")]
    pub(crate) unsubscribe: Option<Empty>,
    #[prost(message, optional, tag = "8")]
    pub(crate) publish: Option<Empty>,
    #[prost(message, optional, tag = "9")]
    pub(crate) presence: Option<PresenceResult>,
    #[prost(message, optional, tag = "10")]
    pub(crate) presence_stats: Option<PresenceStatsResult>,
    #[prost(message, optional, tag = "11")]
    pub(crate) history: Option<HistoryResult>,
    #[prost(message, optional, tag = "12")]
    pub(crate) ping: Option<Empty>,
    #[prost(message, optional, tag = "14")]
    pub(crate) refresh: Option<RefreshResult>,
    #[prost(message, optional, tag = "15")]
    pub(crate) sub_refresh: Option<SubRefreshResult>,
}

/// `Error`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct ReplyError {
    #[prost(uint32, tag = "1")]
    pub(crate) code: u32,
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    #[prost(bool, tag = "3")]
    pub(crate) temporary: bool,
}

/// `Push`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct Push {
    #[prost(string, tag = "2")]
    pub(crate) channel: String,
    #[prost(message, optional, tag = "4")]
    #[serde(rename = "pub")]
    pub(crate) publication: Option<Publication>,
    #[prost(message, optional, tag = "5")]
    pub(crate) join: Option<JoinLeave>,
    #[prost(message, optional, tag = "6")]
    pub(crate) leave: Option<JoinLeave>,
    #[prost(message, optional, tag = "7")]
    pub(crate) unsubscribe: Option<Unsubscribe>,
    #[prost(message, optional, tag = "11")]
    pub(crate) disconnect: Option<Disconnect>,
}

/// `ClientInfo`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct ClientInfo {
    #[prost(string, tag = "1")]
    pub(crate) user: String,
    #[prost(string, tag = "2")]
    pub(crate) client: String,
    #[prost(bytes = "vec", tag = "3")]
    #[serde(deserialize_with = "json_bytes")]
    pub(crate) conn_info: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    #[serde(deserialize_with = "json_bytes")]
    pub(crate) chan_info: Vec<u8>,
}

/// `Publication`: `data` is the value's JSON text, or, with `delta`, the
/// delta itself (the JSON form carries it as a JSON string).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(from = "PublicationJson")]
pub(crate) struct Publication {
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) data: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub(crate) info: Option<ClientInfo>,
    #[prost(uint64, tag = "6")]
    pub(crate) offset: u64,
    #[prost(btree_map = "string, string", tag = "7")]
    pub(crate) tags: BTreeMap<String, String>,
    #[prost(bool, tag = "8")]
    pub(crate) delta: bool,
    #[prost(int64, tag = "9")]
    pub(crate) time: i64,
}

/// A publication as the JSON form writes it.
#[derive(Default, Deserialize)]
#[serde(default)]
struct PublicationJson {
    data: Option<Box<RawValue>>,
    info: Option<ClientInfo>,
    offset: u64,
    tags: BTreeMap<String, String>,
    delta: bool,
    time: i64,
}

impl From<PublicationJson> for Publication {
    fn from(p: PublicationJson) -> Self {
        let raw = p.data.as_deref().map_or("", RawValue::get);
        let data = if p.delta {
            // The delta's text, unquoted.
            serde_json::from_str::<String>(raw)
                .map_or_else(|_| raw.as_bytes().to_vec(), String::into_bytes)
        } else {
            raw.as_bytes().to_vec()
        };
        Self {
            data,
            info: p.info,
            offset: p.offset,
            tags: p.tags,
            delta: p.delta,
            time: p.time,
        }
    }
}

/// `Join` and `Leave`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct JoinLeave {
    #[prost(message, optional, tag = "1")]
    pub(crate) info: Option<ClientInfo>,
}

/// `Unsubscribe` (push).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct Unsubscribe {
    #[prost(uint32, tag = "2")]
    pub(crate) code: u32,
    #[prost(string, tag = "3")]
    pub(crate) reason: String,
}

/// `Disconnect` (push).
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct Disconnect {
    #[prost(uint32, tag = "1")]
    pub(crate) code: u32,
    #[prost(string, tag = "2")]
    pub(crate) reason: String,
}

/// `ConnectResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct ConnectResult {
    #[prost(string, tag = "1")]
    pub(crate) client: String,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
    #[prost(bool, tag = "3")]
    pub(crate) expires: bool,
    #[prost(uint32, tag = "4")]
    pub(crate) ttl: u32,
    #[prost(btree_map = "string, message", tag = "6")]
    pub(crate) subs: BTreeMap<String, SubscribeResult>,
    #[prost(uint32, tag = "7")]
    pub(crate) ping: u32,
    #[prost(bool, tag = "8")]
    pub(crate) pong: bool,
    #[prost(string, tag = "9")]
    pub(crate) session: String,
    #[prost(string, tag = "10")]
    pub(crate) node: String,
}

/// `SubscribeResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct SubscribeResult {
    #[prost(bool, tag = "1")]
    pub(crate) expires: bool,
    #[prost(uint32, tag = "2")]
    pub(crate) ttl: u32,
    #[prost(bool, tag = "3")]
    pub(crate) recoverable: bool,
    #[prost(string, tag = "6")]
    pub(crate) epoch: String,
    #[prost(message, repeated, tag = "7")]
    pub(crate) publications: Vec<Publication>,
    #[prost(bool, tag = "8")]
    pub(crate) recovered: bool,
    #[prost(uint64, tag = "9")]
    pub(crate) offset: u64,
    #[prost(bool, tag = "10")]
    pub(crate) positioned: bool,
    #[prost(bytes = "vec", tag = "11")]
    #[serde(deserialize_with = "json_bytes")]
    pub(crate) data: Vec<u8>,
    #[prost(bool, tag = "12")]
    pub(crate) was_recovering: bool,
    #[prost(bool, tag = "13")]
    pub(crate) delta: bool,
}

/// `PresenceResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct PresenceResult {
    #[prost(btree_map = "string, message", tag = "1")]
    pub(crate) presence: BTreeMap<String, ClientInfo>,
}

/// `PresenceStatsResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct PresenceStatsResult {
    #[prost(uint32, tag = "1")]
    pub(crate) num_clients: u32,
    #[prost(uint32, tag = "2")]
    pub(crate) num_users: u32,
}

/// `HistoryResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct HistoryResult {
    #[prost(message, repeated, tag = "1")]
    pub(crate) publications: Vec<Publication>,
    #[prost(string, tag = "2")]
    pub(crate) epoch: String,
    #[prost(uint64, tag = "3")]
    pub(crate) offset: u64,
}

/// `RefreshResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct RefreshResult {
    #[prost(string, tag = "1")]
    pub(crate) client: String,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
    #[prost(bool, tag = "3")]
    pub(crate) expires: bool,
    #[prost(uint32, tag = "4")]
    pub(crate) ttl: u32,
}

/// `SubRefreshResult`.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub(crate) struct SubRefreshResult {
    #[prost(bool, tag = "1")]
    pub(crate) expires: bool,
    #[prost(uint32, tag = "2")]
    pub(crate) ttl: u32,
}

// ---------------------------------------------------------------------
// Transcoding.

/// A binary frame that is not a run of delimited `Command`s whose JSON
/// fields are JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not Centrifugo's protobuf protocol: {0}")]
pub(crate) struct NotTheProtocol(String);

/// The JSON lines of the delimited `Command`s of `frame` (an empty
/// command, the client's pong, is `{}`).
///
/// # Errors
/// [`NotTheProtocol`] when `frame` does not decode, or a `data` field is
/// not JSON text.
pub(crate) fn commands_to_json(mut frame: &[u8]) -> Result<String, NotTheProtocol> {
    use prost::Message as _;
    let mut lines = String::new();
    while !frame.is_empty() {
        let command = Command::decode_length_delimited(&mut frame)
            .map_err(|e| NotTheProtocol(e.to_string()))?;
        let line = serde_json::to_string(&command).map_err(|e| NotTheProtocol(e.to_string()))?;
        if !lines.is_empty() {
            lines.push('\n');
        }
        lines.push_str(&line);
    }
    Ok(lines)
}

/// The delimited `Reply`s of the session's JSON frame `text` (objects
/// separated by `\n`; `{}` a ping).
///
/// # Errors
/// [`NotTheProtocol`] for a line that is not a reply (a bug: the session
/// writes only what `Reply` reads; logged): the connection is closed
/// rather than sent something else.
pub(crate) fn replies_to_protobuf(text: &str) -> Result<Vec<u8>, NotTheProtocol> {
    use prost::Message as _;
    let mut out = Vec::with_capacity(text.len());
    for line in text.split('\n') {
        let reply = serde_json::from_str::<Reply>(line).map_err(|e| {
            tracing::error!(error = %e, "a reply has no protobuf form; closing");
            NotTheProtocol(e.to_string())
        })?;
        // Writing into a Vec cannot fail.
        let _ = reply.encode_length_delimited(&mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use serde_json::{json, Value};

    use super::*;

    fn delimited(commands: &[Command]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in commands {
            c.encode_length_delimited(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn commands_become_the_json_lines_of_the_same_requests() {
        let frame = delimited(&[
            Command {
                id: 1,
                connect: Some(ConnectRequest {
                    token: "t".to_owned(),
                    data: b"{\n\"a\": 1}".to_vec(),
                    ..ConnectRequest::default()
                }),
                ..Command::default()
            },
            Command {
                id: 2,
                subscribe: Some(SubscribeRequest {
                    channel: "news".to_owned(),
                    recover: true,
                    offset: 7,
                    epoch: "e".to_owned(),
                    flag: 2,
                    tf: Some(FilterNode {
                        key: "team".to_owned(),
                        cmp: "eq".to_owned(),
                        val: "eng".to_owned(),
                        ..FilterNode::default()
                    }),
                    ..SubscribeRequest::default()
                }),
                ..Command::default()
            },
            Command {
                id: 3,
                publish: Some(PublishRequest {
                    channel: "news".to_owned(),
                    data: br#"{"x":[1,2]}"#.to_vec(),
                    ..PublishRequest::default()
                }),
                ..Command::default()
            },
            Command::default(),
        ]);
        let text = commands_to_json(&frame).unwrap();
        let lines: Vec<Value> = text
            .split('\n')
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            vec![
                json!({"id": 1, "connect": {"token": "t", "data": {"a": 1}}}),
                json!({"id": 2, "subscribe": {"channel": "news", "recover": true, "epoch": "e",
                    "offset": 7, "flag": 2, "tf": {"key": "team", "cmp": "eq", "val": "eng"}}}),
                json!({"id": 3, "publish": {"channel": "news", "data": {"x": [1, 2]}}}),
                json!({}),
            ]
        );
        assert!(
            text.split('\n').count() == 4,
            "one line per command: {text}"
        );
    }

    #[test]
    fn frames_that_are_not_commands_are_refused() {
        assert!(commands_to_json(&[0x05, 0x01]).is_err(), "cut short");
        let not_json = delimited(&[Command {
            id: 1,
            publish: Some(PublishRequest {
                channel: "a".to_owned(),
                data: b"\x00\x01".to_vec(),
                ..PublishRequest::default()
            }),
            ..Command::default()
        }]);
        assert!(
            commands_to_json(&not_json).is_err(),
            "data that is not JSON"
        );
    }

    #[test]
    fn replies_and_pushes_keep_every_field_herald_writes() {
        let text = [
            r#"{"id":1,"connect":{"client":"c","version":"1","expires":true,"ttl":60,"ping":25,"pong":true,"session":"s","node":"n","subs":{"feed":{"recoverable":true,"positioned":true,"epoch":"e","offset":3,"data":{"w":1}}}}}"#,
            r#"{"id":2,"subscribe":{"recoverable":true,"positioned":true,"epoch":"e","offset":5,"recovered":true,"was_recovering":true,"publications":[{"data":{"n":5},"offset":5,"time":9,"tags":{"k":"v"}}]}}"#,
            r#"{"id":3,"error":{"code":112,"message":"unrecoverable position"}}"#,
            r#"{"push":{"channel":"news","pub":{"data":[1, 2],"offset":6,"time":10}}}"#,
            r#"{"push":{"channel":"chat","join":{"info":{"user":"u","client":"c","conn_info":{"name":"Ann"}}}}}"#,
            r#"{"push":{"disconnect":{"code":3501,"reason":"bad request"}}}"#,
            r#"{"push":{"channel":"d","pub":{"data":"3\n1:x","offset":7,"delta":true}}}"#,
            "{}",
        ]
        .join("\n");
        let mut bytes: &[u8] = &replies_to_protobuf(&text).unwrap();
        let mut replies = Vec::new();
        while !bytes.is_empty() {
            replies.push(Reply::decode_length_delimited(&mut bytes).unwrap());
        }
        assert_eq!(replies.len(), 8);
        let connect = replies[0].connect.as_ref().unwrap();
        assert_eq!((connect.ttl, connect.ping, connect.pong), (60, 25, true));
        assert_eq!(
            (connect.session.as_str(), connect.node.as_str()),
            ("s", "n")
        );
        assert_eq!(connect.subs["feed"].data, br#"{"w":1}"#);
        let subscribe = replies[1].subscribe.as_ref().unwrap();
        assert!(subscribe.recovered && subscribe.was_recovering && subscribe.positioned);
        let publication = &subscribe.publications[0];
        assert_eq!(publication.data, br#"{"n":5}"#, "the data's JSON text");
        assert_eq!((publication.offset, publication.time), (5, 9));
        assert_eq!(publication.tags["k"], "v");
        assert_eq!(replies[2].error.as_ref().unwrap().code, 112);
        let push = replies[3].push.as_ref().unwrap();
        assert_eq!(push.channel, "news");
        assert_eq!(push.publication.as_ref().unwrap().data, b"[1, 2]");
        let join = replies[4].push.as_ref().unwrap().join.as_ref().unwrap();
        assert_eq!(join.info.as_ref().unwrap().conn_info, br#"{"name":"Ann"}"#);
        let disconnect = replies[5]
            .push
            .as_ref()
            .unwrap()
            .disconnect
            .as_ref()
            .unwrap();
        assert_eq!(disconnect.code, 3501);
        let delta = replies[6]
            .push
            .as_ref()
            .unwrap()
            .publication
            .as_ref()
            .unwrap();
        assert!(delta.delta);
        assert_eq!(delta.data, b"3\n1:x", "the delta's own bytes");
        assert_eq!(replies[7], Reply::default(), "a ping is an empty reply");
        assert_eq!(
            replies_to_protobuf("{}").unwrap(),
            vec![0],
            "its delimited form"
        );
        assert!(
            replies_to_protobuf("{\"id\":1,\"connect\":").is_err(),
            "cut"
        );
    }
}
