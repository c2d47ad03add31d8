//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! Herald's storage: one trait, [`Storage`], that every backend implements,
//! the embedded SQLite backend ([`sqlite::SqliteStorage`]) and the
//! PostgreSQL backend ([`postgres::PostgresStorage`]).
//!
//! The contract of every method, and above all of the writer lease, is in
//! `docs/storage.md` (the design it follows is the writer-lease brief). In
//! short: exactly one node at a time holds the lease; every acquisition gets
//! a larger fencing token; every write transaction proves, inside itself,
//! that the writer's token is still current and that the lease has not
//! expired on the storage's clock, or it fails with [`Error::LeaseLost`].
//!
//! It is the only crate that speaks SQL. It knows nothing of HTTP or of
//! the lease's timing policy (when to renew, when to give up): that is
//! `herald-lease`.
//!
//! The feature `testing` adds test support: the module `conformance` (the
//! suite every backend passes unchanged) and the module `testing` (a
//! throwaway PostgreSQL database per test, and a fake connection pooler).
//!
//! The feature `fault-switches` (test-only, never shipped) compiles in the
//! fault switches of `herald_core::fault_switches`; three act here, on the
//! PostgreSQL backend only: `skip_fencing_check` (`postgres/ops.rs`, the
//! prelude every fenced write runs), `drop_notify` (`postgres/ops.rs`) and
//! `renew_expired` (`postgres/renewal.rs`).
//! `FaultSwitch` explains each. The SQLite backend is unchanged by them.

pub mod cluster;
mod decode;
mod digest;
mod epoch;
mod error;
pub mod postgres;
pub mod sqlite;
mod stream_rules;
mod traits;
mod trim;

#[cfg(feature = "testing")]
pub mod conformance;
#[cfg(feature = "testing")]
pub mod testing;

pub use cluster::ClusterEvent;
pub use digest::{idempotency_digest, IdempotencyDigest};
pub use error::{Cause, Error, PoolerEvidence, Refusal, Result};
pub use traits::{
    Acquire, ChangeFeed, ChangeFeedReader, ChangeSignal, ChannelClients, ChannelSummary,
    ClientInfo, ClusterView, Deletion, Deletions, LeaseStore, LeaseTakeover, MessageLog,
    NodeReport, Page, PresenceEntry, PresenceEvent, PresenceEventKind, PresenceStore, Storage,
    StreamStore, TakeoverCount, TakeoverReason, MAX_CHANNEL_PAGE, MAX_LEASE_HISTORY,
};
pub use trim::{ChannelStats, TrimLimits, Trimmed};
