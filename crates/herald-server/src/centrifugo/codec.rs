//! The two encodings of Centrifugo's client protocol on the wire, over
//! the one set of message types (`protocol.rs` the commands,
//! `replies.rs` the replies and pushes):
//!
//! - **JSON**: a frame holds JSON objects separated by `\n`, both ways;
//!   each reply or push is written on one line (`serde_json`, compact;
//!   stored values on one line, `replies::one_line`).
//! - **Protobuf**: a frame holds messages each prefixed with its length
//!   as a varint (protobuf's "delimited" form); a ping is an empty
//!   `Reply`, a pong an empty `Command`.
//!
//! A connection decodes its client's frames into typed [`Command`]s and
//! encodes its replies and pushes straight into its own encoding
//! ([`Encoded`], gathered into a [`Batch`] per write): nothing is written
//! as JSON to be read back.

use prost::Message as _;

use super::protocol::{Command, Shape};
use super::replies::Reply;

/// The form of the protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// JSON (text frames).
    Json,
    /// Protobuf (binary frames, decoded here).
    Protobuf,
}

/// A client's frame of commands, as its transport delivered it.
#[derive(Debug)]
pub(crate) enum ClientFrame {
    /// JSON lines, each decoded when its turn comes (a line that is not
    /// a command closes the connection with 3501 after the replies to the
    /// lines before it).
    Json(String),
    /// Delimited protobuf commands, decoded; `None` at the place of one
    /// that is not a command Herald runs (see [`decode_protobuf`]).
    Protobuf(Vec<Option<Command>>),
    /// Delimited protobuf commands, more of them than a frame may hold:
    /// counted, never decoded, so that a frame refused for its count
    /// (3013) costs no more than reading it.
    TooMany(usize),
}

impl ClientFrame {
    /// How many commands the frame holds (a JSON frame's blank lines are
    /// not commands).
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Json(text) => json_lines(text).count(),
            Self::Protobuf(commands) => commands.len(),
            Self::TooMany(count) => *count,
        }
    }

    /// The frame's commands, in order, taken out of it; `None` for one
    /// that is not a command.
    pub(crate) fn commands(&mut self) -> Box<dyn Iterator<Item = Option<Command>> + Send + '_> {
        match self {
            Self::Json(text) => Box::new(json_lines(text).map(decode_json_line)),
            Self::Protobuf(commands) => Box::new(commands.drain(..)),
            Self::TooMany(_) => Box::new(std::iter::empty()),
        }
    }
}

/// The non-blank lines of a JSON frame, trimmed.
fn json_lines(text: &str) -> impl Iterator<Item = &str> + Clone + Send {
    text.split('\n').map(str::trim).filter(|l| !l.is_empty())
}

/// The command of one JSON line: a JSON object (serde would also take an
/// array of its fields' values) that decodes, holding one request and no
/// field the protocol lacks when it runs (a pong, `id` 0, runs nothing).
pub(crate) fn decode_json_line(line: &str) -> Option<Command> {
    let command = line
        .starts_with('{')
        .then(|| serde_json::from_str::<Command>(line).ok())
        .flatten()?;
    (command.id == 0 || !Shape::of(line).is_some_and(Shape::ambiguous)).then_some(command)
}

/// A binary frame that is not a run of delimited `Command`s whose `data`
/// fields are JSON text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not Centrifugo's protobuf protocol: {0}")]
pub(crate) struct NotTheProtocol(String);

/// The delimited `Command`s of `frame`, in order. A command that holds
/// more than one request (and runs: its `id` is not 0), or a `publish`
/// without `data`, is `None`: not a command, which closes the connection
/// with 3501 when its turn comes, as a JSON line that does not decode.
/// A frame of more than `max_commands` commands is only counted
/// ([`ClientFrame::TooMany`]): its length prefixes are walked, nothing of
/// it is decoded.
///
/// # Errors
/// [`NotTheProtocol`] when `frame` does not decode, or a `data` field
/// holds bytes that are not JSON text (Herald's channels hold JSON) or
/// JSON nested deeper than the JSON form allows (herald-http's
/// `extract::check_depth`): nothing of the frame runs.
pub(crate) fn decode_protobuf(
    mut frame: &[u8],
    max_commands: usize,
) -> Result<ClientFrame, NotTheProtocol> {
    let count = count_delimited(frame)?;
    if count > max_commands {
        return Ok(ClientFrame::TooMany(count));
    }
    let mut commands = Vec::with_capacity(count);
    while !frame.is_empty() {
        let command = Command::decode_length_delimited(&mut frame)
            .map_err(|e| NotTheProtocol(e.to_string()))?;
        for data in command.data_fields().filter(|d| !d.is_empty()) {
            let text = serde_json::from_slice::<&serde_json::value::RawValue>(data)
                .map_err(|e| NotTheProtocol(format!("data is not JSON text: {e}")))?;
            herald_http::extract::check_depth(text.get())
                .map_err(|e| NotTheProtocol(e.to_string()))?;
        }
        let runs = command.id == 0 || command.requests() <= 1;
        let has_data = command.publish.as_ref().is_none_or(|p| !p.data.is_empty());
        commands.push((runs && has_data).then_some(command));
    }
    Ok(ClientFrame::Protobuf(commands))
}

/// How many length-delimited messages `frame` holds, read from their
/// length prefixes alone (varints, as protobuf's delimited form writes
/// them).
///
/// # Errors
/// [`NotTheProtocol`] when a prefix is not a varint or a message is cut
/// short.
fn count_delimited(mut frame: &[u8]) -> Result<usize, NotTheProtocol> {
    let mut count = 0;
    while !frame.is_empty() {
        let len = prost::encoding::decode_varint(&mut frame)
            .map_err(|e| NotTheProtocol(e.to_string()))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|len| *len <= frame.len())
            .ok_or_else(|| NotTheProtocol("a command is cut short".to_owned()))?;
        frame = &frame[len..];
        count += 1;
    }
    Ok(count)
}

/// One reply or push encoded for a connection's encoding: a JSON object
/// (one line, no `\n`), or a delimited protobuf `Reply`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Encoded {
    /// The JSON form.
    Json(String),
    /// The protobuf form.
    Protobuf(Vec<u8>),
}

impl Encoded {
    /// `reply` in `encoding`. A reply whose JSON form cannot be written (a
    /// bug: every byte field is checked where it is made) is logged and
    /// written as `{}`.
    pub(crate) fn of(encoding: Encoding, reply: &Reply) -> Self {
        match encoding {
            Encoding::Json => Self::Json(serde_json::to_string(reply).unwrap_or_else(|e| {
                tracing::error!(error = %e, "a reply has no JSON form");
                "{}".to_owned()
            })),
            Encoding::Protobuf => Self::Protobuf(reply.encode_length_delimited_to_vec()),
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Json(text) => text.len(),
            Self::Protobuf(bytes) => bytes.len(),
        }
    }
}

/// Replies and pushes gathered for one write to the client, in order:
/// JSON objects separated by `\n`, or delimited protobuf messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Batch {
    /// The JSON form.
    Json(String),
    /// The protobuf form.
    Protobuf(Vec<u8>),
}

impl Batch {
    /// An empty batch of `encoding`.
    pub(crate) fn new(encoding: Encoding) -> Self {
        match encoding {
            Encoding::Json => Self::Json(String::new()),
            Encoding::Protobuf => Self::Protobuf(Vec::new()),
        }
    }

    /// A batch of one reply.
    pub(crate) fn of(encoding: Encoding, reply: &Reply) -> Self {
        let mut batch = Self::new(encoding);
        batch.push(&Encoded::of(encoding, reply));
        batch
    }

    /// The ping: `{}`, or an empty `Reply`.
    pub(crate) fn ping(encoding: Encoding) -> Self {
        Self::of(encoding, &Reply::default())
    }

    /// Appends `reply`, encoded.
    pub(crate) fn push_reply(&mut self, reply: &Reply) {
        let encoding = match self {
            Self::Json(_) => Encoding::Json,
            Self::Protobuf(_) => Encoding::Protobuf,
        };
        self.push(&Encoded::of(encoding, reply));
    }

    /// Appends an encoded reply or push (of the batch's encoding; one of
    /// the other is a bug, logged and left out).
    pub(crate) fn push(&mut self, encoded: &Encoded) {
        match (self, encoded) {
            (Self::Json(batch), Encoded::Json(text)) => {
                if !batch.is_empty() {
                    batch.push('\n');
                }
                batch.push_str(text);
            }
            (Self::Protobuf(batch), Encoded::Protobuf(bytes)) => batch.extend_from_slice(bytes),
            _ => tracing::error!("a reply of another encoding than the connection's"),
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Json(text) => text.len(),
            Self::Protobuf(bytes) => bytes.len(),
        }
    }

    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes what it holds, leaving it empty.
    pub(crate) fn take(&mut self) -> Self {
        match self {
            Self::Json(text) => Self::Json(std::mem::take(text)),
            Self::Protobuf(bytes) => Self::Protobuf(std::mem::take(bytes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use herald_core::{Message, Payload, Tags};
    use serde_json::value::RawValue;

    use super::*;

    /// The commands of `frame` as a session sees them (no count limit
    /// reached).
    fn decoded(frame: &[u8]) -> Result<Vec<Option<Command>>, NotTheProtocol> {
        match decode_protobuf(frame, usize::MAX)? {
            ClientFrame::Protobuf(commands) => Ok(commands),
            other => panic!("not decoded: {} commands", other.len()),
        }
    }
    use crate::centrifugo::protocol::{ConnectRequest, PublishRequest, SubscribeRequest};
    use crate::centrifugo::replies::{
        self, ConnectResult, Data, DataForm, Publication, SubscribeResult,
    };
    use crate::centrifugo::tags_filter::FilterNode;

    fn delimited(commands: &[Command]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in commands {
            c.encode_length_delimited(&mut out).unwrap();
        }
        out
    }

    fn replies_of(mut bytes: &[u8]) -> Vec<Reply> {
        let mut replies = Vec::new();
        while !bytes.is_empty() {
            replies.push(Reply::decode_length_delimited(&mut bytes).unwrap());
        }
        replies
    }

    fn message(offset: u64, data: &str) -> Message {
        Message {
            offset,
            data: Payload::Json(Arc::from(RawValue::from_string(data.to_owned()).unwrap())),
            published_at_ms: 9,
            tags: Tags::default(),
        }
    }

    #[test]
    fn protobuf_commands_decode_into_the_same_requests_as_json_lines() {
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
        let commands: Vec<Command> = decoded(&frame)
            .unwrap()
            .into_iter()
            .map(Option::unwrap)
            .collect();
        let json = [
            r#"{"id":1,"connect":{"token":"t","data":{"a":1}}}"#,
            r#"{"id":2,"subscribe":{"channel":"news","recover":true,"epoch":"e","offset":7,"flag":2,"tf":{"key":"team","cmp":"eq","val":"eng"}}}"#,
            r#"{"id":3,"publish":{"channel":"news","data":{"x":[1,2]}}}"#,
            "{}",
        ];
        for (command, line) in commands.iter().zip(json) {
            let mut from_json = decode_json_line(line).unwrap();
            if let Some(c) = from_json.connect.as_mut() {
                // The JSON form ignores a connect's data; protobuf keeps
                // (and checks) its bytes.
                c.data = command.connect.as_ref().unwrap().data.clone();
            }
            assert_eq!(command, &from_json, "{line}");
        }
        assert_eq!(commands.len(), 4);
    }

    #[test]
    fn frames_that_are_not_commands_are_refused() {
        assert!(decoded(&[0x05, 0x01]).is_err(), "cut short");
        let publish = |data: &[u8]| Command {
            id: 1,
            publish: Some(PublishRequest {
                channel: "a".to_owned(),
                data: data.to_vec(),
                ..PublishRequest::default()
            }),
            ..Command::default()
        };
        assert!(
            decoded(&delimited(&[publish(b"\x00\x01")])).is_err(),
            "data that is not JSON"
        );
        assert_eq!(
            decoded(&delimited(&[publish(b"")])).unwrap(),
            vec![None],
            "a publish without data"
        );
        let two = Command {
            ping: Some(super::super::protocol::Empty {}),
            ..publish(b"1")
        };
        assert_eq!(
            decoded(&delimited(&[two])).unwrap(),
            vec![None],
            "two requests"
        );
        // Data the JSON form refuses (nested deeper than its limit) is
        // refused here too, before anything of the frame runs.
        let deep = format!("{}{}", "[".repeat(3000), "]".repeat(3000));
        assert!(
            decoded(&delimited(&[publish(deep.as_bytes())])).is_err(),
            "data nested 3000 levels deep"
        );
        let shallow = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(decoded(&delimited(&[publish(shallow.as_bytes())])).is_ok());
    }

    /// A frame of more commands than allowed is counted from its length
    /// prefixes, not decoded: 81,000 empty commands (an 80 KiB frame)
    /// become a count, not 81,000 decoded commands.
    #[test]
    fn a_frame_of_too_many_commands_is_counted_not_decoded() {
        let frame = vec![0u8; 81_000];
        match decode_protobuf(&frame, 256).unwrap() {
            ClientFrame::TooMany(count) => assert_eq!(count, 81_000),
            ClientFrame::Protobuf(commands) => {
                panic!("{} commands decoded", commands.len())
            }
            ClientFrame::Json(_) => unreachable!(),
        }
        let mut at_the_limit = decode_protobuf(&frame[..256], 256).unwrap();
        assert_eq!(at_the_limit.len(), 256);
        assert_eq!(at_the_limit.commands().count(), 256);
        assert!(
            decode_protobuf(
                &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
                256
            )
            .is_err(),
            "a length prefix that is not a varint"
        );
        assert!(
            decode_protobuf(&[0x7f, 0x00], 256).is_err(),
            "a command cut short"
        );
    }

    #[test]
    fn replies_and_pushes_keep_every_field_in_both_forms() {
        let subscribe = SubscribeResult {
            recoverable: true,
            positioned: true,
            epoch: "e".to_owned(),
            offset: 5,
            recovered: true,
            was_recovering: true,
            publications: vec![Publication {
                tags: Tags::new(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
                ..Publication::from(&message(5, r#"{"n":5}"#))
            }],
            ..SubscribeResult::default()
        };
        let connect = ConnectResult {
            client: "c".to_owned(),
            version: "1".to_owned(),
            expires: true,
            ttl: 60,
            ping: 25,
            pong: true,
            session: "s".to_owned(),
            node: "n".to_owned(),
            subs: BTreeMap::from([(
                "feed".to_owned(),
                SubscribeResult {
                    data: br#"{"w":1}"#.to_vec(),
                    ..subscribe.clone()
                },
            )]),
        };
        let all = [
            Reply {
                id: 1,
                connect: Some(connect),
                ..Reply::default()
            },
            Reply {
                id: 2,
                subscribe: Some(subscribe),
                ..Reply::default()
            },
            Reply::error(
                3,
                &crate::centrifugo::codes::ReplyError::unrecoverable_position(),
            ),
            replies::publication_push("news", Publication::from(&message(6, "[1,\n 2]"))),
            replies::disconnect_push(3501, "bad request"),
            replies::publication_push(
                "d",
                Publication::with_form(&message(7, "[3]"), DataForm::Delta("3\n1:x")),
            ),
            Reply::default(),
        ];
        let mut json = Batch::new(Encoding::Json);
        let mut protobuf = Batch::new(Encoding::Protobuf);
        for reply in &all {
            json.push_reply(reply);
            protobuf.push_reply(reply);
        }
        let Batch::Json(text) = json else { panic!() };
        let lines: Vec<serde_json::Value> = text
            .split('\n')
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            vec![
                serde_json::json!({"id":1,"connect":{"client":"c","version":"1","expires":true,"ttl":60,"ping":25,"pong":true,"session":"s","node":"n","subs":{"feed":{"recoverable":true,"positioned":true,"epoch":"e","offset":5,"publications":[{"data":{"n":5},"offset":5,"time":9,"tags":{"k":"v"}}],"recovered":true,"was_recovering":true,"data":{"w":1}}}}}),
                serde_json::json!({"id":2,"subscribe":{"recoverable":true,"positioned":true,"epoch":"e","offset":5,"recovered":true,"was_recovering":true,"publications":[{"data":{"n":5},"offset":5,"time":9,"tags":{"k":"v"}}]}}),
                serde_json::json!({"id":3,"error":{"code":112,"message":"unrecoverable position"}}),
                serde_json::json!({"push":{"channel":"news","pub":{"data":[1, 2],"offset":6,"time":9}}}),
                serde_json::json!({"push":{"disconnect":{"code":3501,"reason":"bad request"}}}),
                serde_json::json!({"push":{"channel":"d","pub":{"data":"3\n1:x","offset":7,"time":9,"delta":true}}}),
                serde_json::json!({}),
            ]
        );
        let Batch::Protobuf(bytes) = protobuf else {
            panic!()
        };
        let decoded = replies_of(&bytes);
        assert_eq!(decoded.len(), all.len());
        for (decoded, sent) in decoded.iter().zip(&all) {
            assert_eq!(decoded, sent, "the same reply, read back from protobuf");
        }
        let push = decoded[3].push.as_ref().unwrap();
        assert_eq!(
            push.publication.as_ref().unwrap().data.bytes(),
            b"[1,\n 2]",
            "the stored text, exact"
        );
        assert_eq!(Batch::ping(Encoding::Protobuf), Batch::Protobuf(vec![0]));
        assert_eq!(Batch::ping(Encoding::Json), Batch::Json("{}".to_owned()));
    }

    /// A protobuf push is written from the publication's bytes, never
    /// through JSON: a delta that is not JSON text (with its raw newline
    /// and control byte) reaches a protobuf client byte for byte, in the
    /// wire layout `client.proto` gives (`Reply.push` 4, `Push.channel`
    /// 2, `Push.pub` 4, `Publication.data` 4, `offset` 6, `delta` 8,
    /// `time` 9); so does a stored value's text with its line breaks,
    /// which a JSON round trip puts on one line.
    #[test]
    fn a_protobuf_push_carries_its_data_byte_exact_without_json() {
        let delta = "7\n\u{1}2:\"}{:;";
        assert!(serde_json::from_str::<serde_json::Value>(delta).is_err());
        let reply = replies::publication_push(
            "c",
            Publication::with_form(&message(3, "[1]"), DataForm::Delta(delta)),
        );
        let Encoded::Protobuf(bytes) = Encoded::of(Encoding::Protobuf, &reply) else {
            panic!()
        };
        let data = delta.as_bytes();
        let publication: Vec<u8> = [
            &[0x22, u8::try_from(data.len()).unwrap()][..],
            data,
            &[0x30, 3, 0x40, 1, 0x48, 9],
        ]
        .concat();
        let push: Vec<u8> = [
            &[
                0x12,
                1,
                b'c',
                0x22,
                u8::try_from(publication.len()).unwrap(),
            ][..],
            &publication,
        ]
        .concat();
        let expected: Vec<u8> = [
            &[u8::try_from(push.len() + 2).unwrap(), 0x22][..],
            &[u8::try_from(push.len()).unwrap()],
            &push,
        ]
        .concat();
        assert_eq!(bytes, expected);
        let read = Reply::decode_length_delimited(bytes.as_slice()).unwrap();
        let publication = read.push.unwrap().publication.unwrap();
        assert_eq!(publication.data, Data::Bytes(data.to_vec()));
        assert!(publication.delta);

        // A whole publication: its stored text exactly as published (a
        // JSON form would have put it on one line).
        let stored = "{\n\t\"a\": [1,\r\n 2]\n}";
        let reply = replies::publication_push("c", Publication::from(&message(4, stored)));
        let Encoded::Protobuf(bytes) = Encoded::of(Encoding::Protobuf, &reply) else {
            panic!()
        };
        let read = Reply::decode_length_delimited(bytes.as_slice()).unwrap();
        let publication = read.push.unwrap().publication.unwrap();
        assert_eq!(publication.data.bytes(), stored.as_bytes());
    }

    /// Protobuf publication pushes encoded per second on one core, the
    /// typed path against the transcoding one Herald had before (each
    /// push written as JSON text, read back into protobuf messages and
    /// encoded; kept here only to be measured): `cargo test -p
    /// herald-server --release --lib push_encoding_throughput --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn push_encoding_throughput() {
        use std::time::Instant;

        const N: u32 = 200_000;
        let text = r#"{"user":"ann","text":"the quick brown fox jumps over the lazy dog","n":12345,"ok":true}"#;
        let m = message(41_000, text);
        let channel = "chat:room-1";
        let per_s = |started: Instant| f64::from(N) / started.elapsed().as_secs_f64();

        let started = Instant::now();
        let mut bytes = 0;
        for _ in 0..N {
            let push = replies::publication_push(channel, Publication::from(&m));
            bytes += Encoded::of(Encoding::Protobuf, &push).len();
        }
        let typed = per_s(started);

        let started = Instant::now();
        let mut old_bytes = 0;
        for _ in 0..N {
            let push = replies::publication_push(channel, Publication::from(&m));
            let Encoded::Json(json) = Encoded::of(Encoding::Json, &push) else {
                unreachable!()
            };
            old_bytes += transcoded::replies_to_protobuf(&json).len();
        }
        let transcoded = per_s(started);

        let started = Instant::now();
        for _ in 0..N {
            let push = replies::publication_push(channel, Publication::from(&m));
            std::hint::black_box(Encoded::of(Encoding::Json, &push));
        }
        let json = per_s(started);

        assert_eq!(bytes, old_bytes, "the same bytes either way");
        println!(
            "protobuf pushes/s on one core: typed {typed:.0}, through JSON {transcoded:.0} \
             ({:.1}x); JSON pushes/s {json:.0}",
            typed / transcoded
        );
    }

    /// The transcoding a protobuf push went through before the typed
    /// messages, for publication pushes only: JSON text read back into
    /// `Reply` (`data` taken as its JSON text) and encoded.
    mod transcoded {
        use prost::Message as _;
        use serde::Deserialize;
        use serde_json::value::RawValue;

        #[derive(Clone, PartialEq, prost::Message, Deserialize)]
        #[serde(default)]
        pub(super) struct Reply {
            #[prost(uint32, tag = "1")]
            pub(super) id: u32,
            #[prost(message, optional, tag = "4")]
            pub(super) push: Option<Push>,
        }

        #[derive(Clone, PartialEq, prost::Message, Deserialize)]
        #[serde(default)]
        pub(super) struct Push {
            #[prost(string, tag = "2")]
            pub(super) channel: String,
            #[prost(message, optional, tag = "4")]
            #[serde(rename = "pub")]
            pub(super) publication: Option<Publication>,
        }

        #[derive(Clone, PartialEq, prost::Message, Deserialize)]
        #[serde(from = "PublicationJson")]
        pub(super) struct Publication {
            #[prost(bytes = "vec", tag = "4")]
            pub(super) data: Vec<u8>,
            #[prost(uint64, tag = "6")]
            pub(super) offset: u64,
            #[prost(btree_map = "string, string", tag = "7")]
            pub(super) tags: std::collections::BTreeMap<String, String>,
            #[prost(bool, tag = "8")]
            pub(super) delta: bool,
            #[prost(int64, tag = "9")]
            pub(super) time: i64,
        }

        #[derive(Default, Deserialize)]
        #[serde(default)]
        struct PublicationJson {
            data: Option<Box<RawValue>>,
            offset: u64,
            tags: std::collections::BTreeMap<String, String>,
            delta: bool,
            time: i64,
        }

        impl From<PublicationJson> for Publication {
            fn from(p: PublicationJson) -> Self {
                let raw = p.data.as_deref().map_or("", RawValue::get);
                let data = if p.delta {
                    serde_json::from_str::<String>(raw)
                        .map_or_else(|_| raw.as_bytes().to_vec(), String::into_bytes)
                } else {
                    raw.as_bytes().to_vec()
                };
                Self {
                    data,
                    offset: p.offset,
                    tags: p.tags,
                    delta: p.delta,
                    time: p.time,
                }
            }
        }

        pub(super) fn replies_to_protobuf(text: &str) -> Vec<u8> {
            let mut out = Vec::with_capacity(text.len());
            for line in text.split('\n') {
                let reply: Reply = serde_json::from_str(line).unwrap();
                reply.encode_length_delimited(&mut out).unwrap();
            }
            out
        }
    }
}
