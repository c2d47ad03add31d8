//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! Herald's domain: what a channel, an offset, a message and a lease are.
//!
//! This crate knows nothing of HTTP, SQL, files or the clock: it holds the
//! types every other crate agrees on and the rules for validating client
//! input. Everything here is pure and cheap to test.
//!
//! The module [`fault_switches`] holds the test-only switches that break one
//! protection each; they exist only with the cargo feature `fault-switches`
//! (without it, [`fault_switches::enabled`] is always `false`).

mod channel;
pub mod fault_switches;
mod idempotency;
mod lease;
#[cfg(feature = "testing")]
pub mod log_capture;
mod message;
mod payload;
mod stream;
mod tags;
mod time;
mod write;

pub use channel::{ChannelHead, ChannelName, InvalidChannelName, MAX_CHANNEL_NAME_BYTES};
pub use idempotency::{IdempotencyKey, InvalidIdempotencyKey, MAX_IDEMPOTENCY_KEY_BYTES};
pub use lease::{Candidate, FencingToken, Lease, LeaseInfo, DEFAULT_LEASE_NAME};
pub use message::{Appended, Message, NewMessage, Offset};
pub use payload::Payload;
pub use stream::{
    is_json_media, media_type, Fork, ForkLimits, Producer, ProducerLimits, StreamAppend,
    StreamAppended, StreamConfig, StreamCreate, StreamCreated, StreamInfo,
};

pub use tags::Tags;
pub use time::format_rfc3339_ms;
pub use write::{WriteOutcome, WriteRequest};
