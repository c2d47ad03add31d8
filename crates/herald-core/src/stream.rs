//! A channel with properties, in the log's terms: a channel may be given
//! properties (a content type, a closure that ends its log, an expiry),
//! take appends in writer sessions (a writer's id, its epoch and its
//! sequence number: exactly once per sequence number), be made as a copy
//! of another channel's log up to an offset (a fork), and refuse an
//! append whose guards fail (closed, expired, another content type, a
//! sequence gap or a stale epoch, a conditional sequence that does not
//! grow). The storage decides and writes them inside its fenced
//! transactions; the node's writer group-commits the appends with
//! publishes.
//!
//! The types keep the names of the one wing that speaks of them today,
//! Durable Streams (a stream, a producer, `Stream-Seq`; `PROTOCOL.md` of
//! durable-streams/durable-streams, mapped in `docs/durable-streams.md`):
//! a "stream" is such a channel, a "producer" a writer session.

use crate::channel::ChannelName;
use crate::message::Offset;
use crate::payload::Payload;

/// The media type of a `Content-Type` value as streams compare it: the
/// part before any `;` parameter, trimmed, in ASCII lowercase
/// (RFC 9110, section 8.3.1: type and subtype are case-insensitive).
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Whether a stream of `content_type` is in JSON mode (its media type is
/// `application/json`): appends are JSON values, one message each, and
/// reads answer a JSON array.
pub fn is_json_media(content_type: &str) -> bool {
    media_type(content_type) == "application/json"
}

/// An idempotent producer's position, as an append presents it
/// (`Producer-Id`, `Producer-Epoch`, `Producer-Seq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Producer {
    /// The producer's id, chosen by the client (not empty).
    pub id: String,
    /// Its epoch: a restarted producer writes in a larger one, fencing off
    /// its older self.
    pub epoch: u64,
    /// Its sequence number in the epoch, from 0.
    pub seq: u64,
}

/// What a stream is created with, and what a repeated creation must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// The `Content-Type` the stream was created with, as sent.
    pub content_type: String,
    /// Sliding time to live in seconds (`Stream-TTL`), if any.
    pub ttl_s: Option<u64>,
    /// Absolute expiry in ms since the Unix epoch (`Stream-Expires-At`), if
    /// any.
    pub expires_at_ms: Option<i64>,
}

/// A stream as the storage holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The channel that is the stream.
    pub channel: ChannelName,
    /// Its configuration at creation.
    pub config: StreamConfig,
    /// Whether it was closed: no append is accepted any more.
    pub closed: bool,
    /// The channel's head: the offset of its last message (0 if none ever).
    pub head: Offset,
    /// The channel's earliest stored offset (`head + 1` when none is
    /// stored).
    pub earliest: Offset,
    /// When the stream expires, in ms since the Unix epoch, on the
    /// storage's clock: the sooner of `expires_at_ms` and the last write
    /// plus `ttl_s`; `None` for never.
    pub expires_at_ms: Option<i64>,
    /// The stream this one was forked from, if any.
    pub fork_of: Option<ChannelName>,
    /// The sub-offset of the fork that created it (0 when none).
    pub fork_sub_offset: u64,
    /// Being deleted (marked before its messages are removed; or, by an
    /// older version, deleted while live forks of it remained): its URL
    /// answers "gone" until its deletion ends.
    pub soft_deleted: bool,
    /// Its live forks (not deleted, not expired), as counted by
    /// `Storage::stream_info`; other answers carry 0.
    pub live_forks: u64,
}

/// A request to create a stream (`PUT`).
#[derive(Debug, Clone)]
pub struct StreamCreate {
    /// The channel to make a stream.
    pub channel: ChannelName,
    /// Its configuration.
    pub config: StreamConfig,
    /// Create it closed.
    pub closed: bool,
    /// Its initial messages, in order (may be empty); with a fork, after
    /// what it inherits.
    pub messages: Vec<Payload>,
    /// Create it as a fork of another stream.
    pub fork: Option<Fork>,
    /// Whether the caller may make a channel that already holds messages
    /// (written through Herald's API or Centrifugo) a stream: deleting or
    /// closing the stream later takes the channel from its other writers,
    /// so this needs `admin`. The storage checks the channel inside its
    /// fenced creation: without this, a channel holding messages is
    /// answered [`StreamCreated::ChannelHasMessages`] and nothing changes.
    pub may_convert: bool,
}

/// A fork: a new stream that starts with another stream's messages up to
/// an offset, as its own copy (the same offsets), then goes its own way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fork {
    /// The stream forked.
    pub source: ChannelName,
    /// The source's messages up to this offset are the fork's.
    pub offset: Offset,
    /// More of the source than `offset`: in a byte stream, the first
    /// `sub_offset` bytes of the message after `offset`; in a JSON stream,
    /// the `sub_offset` messages after it. 0: nothing more.
    pub sub_offset: u64,
    /// What one fork may copy and how many forks its source may have.
    pub limits: ForkLimits,
}

/// The bounds of a fork, checked by the storage inside the fenced
/// creation before anything is copied (a fork copies its source's
/// messages in one transaction, which holds the writer meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkLimits {
    /// Most messages one fork may copy from its source.
    pub max_messages: u64,
    /// Most bytes (of message payloads) one fork may copy.
    pub max_bytes: u64,
    /// Most live forks (not deleted, not expired) one source may have.
    pub max_forks: u64,
}

/// The outcome of creating a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamCreated {
    /// The stream is new; its initial messages have offsets
    /// `info.head - messages + 1 ..= info.head`.
    Created {
        /// The stream as created.
        info: StreamInfo,
        /// Commit time in ms since the Unix epoch, on the storage's clock.
        published_at_ms: i64,
    },
    /// A live stream was there already, or a channel whose stored messages
    /// are JSON while the request's content type is not; nothing changed.
    /// The caller compares the configuration with the request's.
    Exists(StreamInfo),
    /// An expired stream is there: delete it, then create again.
    Expired,
    /// The fork's source is not a live stream; nothing changed.
    SourceNotFound,
    /// The fork's source was deleted while forks of it remained; nothing
    /// changed.
    SourceGone,
    /// The fork's offset or sub-offset is beyond what the source holds, or
    /// before what it still stores; nothing changed.
    ForkOutOfRange,
    /// The fork would copy more than [`ForkLimits::max_messages`]
    /// messages or [`ForkLimits::max_bytes`] bytes; nothing changed.
    ForkTooLarge {
        /// Messages it would copy (counted up to one past the limit).
        messages: u64,
        /// Bytes it would copy (counted over those messages).
        bytes: u64,
    },
    /// The source has [`ForkLimits::max_forks`] live forks already;
    /// nothing changed.
    TooManyForks {
        /// Its live forks.
        forks: u64,
    },
    /// The channel holds messages but is not a stream, and the request
    /// may not convert it ([`StreamCreate::may_convert`]); nothing changed.
    ChannelHasMessages,
}

/// A request to append to a stream, close it, or both (`POST`).
#[derive(Debug, Clone)]
pub struct StreamAppend {
    /// The stream.
    pub channel: ChannelName,
    /// The request's `Content-Type`, compared by [`media_type`] with the
    /// stream's; `None` for a close without messages, which has none to
    /// compare.
    pub content_type: Option<String>,
    /// The messages to append, in order (empty for a close only).
    pub messages: Vec<Payload>,
    /// The idempotent producer, if the request names one.
    pub producer: Option<Producer>,
    /// The request's `Stream-Seq`: must be greater, as bytes, than the last
    /// one the stream accepted.
    pub stream_seq: Option<String>,
    /// Close the stream after appending.
    pub close: bool,
    /// The bounds on the stream's producer state this append is held to.
    pub producer_limits: ProducerLimits,
}

/// The bounds on a stream's stored producer state (one row per
/// `Producer-Id`, PROTOCOL.md of durable-streams/durable-streams,
/// "Idempotent producers"), so that neither many producers nor idle ones
/// keep storage without end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLimits {
    /// Most producers one stream keeps state for; an append of one more
    /// (a new `Producer-Id`, while this many are not idle) is refused
    /// ([`StreamAppended::TooManyProducers`]).
    pub max_per_stream: u64,
    /// How long, in ms, a producer's state outlives its last append: once
    /// idle longer, it is forgotten (the producer is new again: its next
    /// append must carry `Producer-Seq` 0) and its row is removed.
    pub idle_ms: u64,
}

impl Default for ProducerLimits {
    /// 1000 producers per stream, each forgotten after 7 days idle.
    fn default() -> Self {
        Self {
            max_per_stream: 1000,
            idle_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

/// The outcome of a [`StreamAppend`]; every outcome but `Appended` and
/// `Duplicate` changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamAppended {
    /// Committed: the messages have offsets `first..=head` (none when
    /// `first > head`, a close only).
    Appended {
        /// Offset of the first message appended.
        first: Offset,
        /// The channel's head after the append.
        head: Offset,
        /// Commit time in ms since the Unix epoch, on the storage's clock.
        published_at_ms: i64,
        /// Whether the stream is closed now.
        closed: bool,
    },
    /// The producer's sequence number was appended already (or this is the
    /// retry of the append that closed the stream): nothing added.
    Duplicate {
        /// The channel's head.
        head: Offset,
        /// The highest sequence number the producer appended in its epoch.
        last_seq: u64,
        /// Whether the stream is closed.
        closed: bool,
    },
    /// No live stream has this name.
    NotFound,
    /// The stream was deleted while forks of it remained.
    Gone,
    /// The stream is closed; `head` is its final offset.
    Closed {
        /// The final head.
        head: Offset,
    },
    /// The request's content type is not the stream's.
    ContentTypeMismatch {
        /// The stream's content type.
        content_type: String,
    },
    /// The producer's epoch is older than the one the stream knows.
    StaleEpoch {
        /// The producer's current epoch.
        epoch: u64,
    },
    /// A new epoch must start at sequence number 0.
    EpochWithoutSeqZero,
    /// The sequence number skips ahead.
    SeqGap {
        /// The next sequence number the stream expects.
        expected: u64,
        /// The one the request carried.
        received: u64,
    },
    /// The `Stream-Seq` is not greater than the last one accepted.
    StreamSeqConflict,
    /// The append has no message and does not close the stream: nothing
    /// to do, and no producer sequence number is used up.
    Empty,
    /// The producer is new to the stream, which keeps state for as many
    /// producers as [`ProducerLimits::max_per_stream`] already.
    TooManyProducers {
        /// The limit.
        limit: u64,
    },
}
