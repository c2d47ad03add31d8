//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! Herald's node core: the group-commit writer, the live fan-out, the
//! subscriptions, the standby feed, forwarding to the holder, retention and
//! channel administration, and the one publish routine every protocol
//! wing calls. Herald's server (herald-server) puts its protocols (API v1
//! with SSE and WebSocket, Centrifugo) on top of it.
//!
//! Publishes go through one writer task per node (`writer.rs`): a bounded
//! queue, batches of up to `max_batch` messages appended in one fenced
//! transaction, answered only after the commit. Live subscribers follow a
//! per-channel live buffer (`hub.rs`) fed by the writer on the holder and by
//! the standby feed (`standby_feed.rs`) on a standby; `subscription.rs`
//! turns history plus live notices into one gap-free, repeat-free
//! sequence. `publish.rs` decides where a publish goes: committed here on
//! the holder, forwarded once to the holder from a standby (`forward.rs`,
//! the one place that speaks HTTP, node to holder), or committed here after
//! a takeover; it returns a typed outcome each wing maps to its own answer.
//! [`Node`] (`node.rs`) is the core as one value: [`Node::start`] takes a
//! storage, a lease view and a [`NodeConfig`] and starts the writer, the
//! standby feed and the trimming task; [`Node::stopped`] waits for them
//! after the drain. `stream_renewals.rs` restarts the TTL of the Durable
//! Streams a node reads (batched, on the holder). `retention/` holds the retention policies, the holder's trimming task,
//! history removal and channel deletion. `role.rs` is the node's view of
//! the lease, `node_error.rs` the core's errors, `metrics.rs` the core's
//! metric names and recorders.
//!
//! Invariants:
//! - a publish is acknowledged only after `Storage::append` returned Ok,
//!   which the storage does only after the commit;
//! - only the holder writes: the writer asks `LeaseView::writable_lease`
//!   before every batch, and the storage fences every write by token;
//! - a subscriber sees every offset after its resume point exactly once, in
//!   order;
//! - herald-node knows no route and no client wire format (no axum, no
//!   Centrifugo protocol types): each wing turns its requests into calls
//!   here and the outcomes into its own answers;
//! - it knows nothing of SQL or of the lease's timing policy.
//!
//! The feature `fault-switches` (test-only, never shipped) compiles in the
//! fault switches of `herald_core::fault_switches`; two act here:
//! `ack_before_commit` (`writer/fault.rs`, against the first invariant) and
//! `drop_notify` (`standby_feed.rs`). `FaultSwitch` explains each. The
//! feature `testing` (test-only) compiles in `testing`, an in-memory
//! storage and a lease view set by hand, for other crates' tests.

pub mod forward;
pub mod holder_write;
pub mod hub;
pub mod metrics;
pub mod node;
pub mod node_error;
pub mod publish;
pub mod retention;
pub mod role;
pub mod standby_feed;
pub mod stream_renewals;
pub mod streams;
pub mod subscription;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod writer;

pub use node::{Node, NodeConfig};
pub use node_error::{HolderWrite, NodeError, StartError, StorageFailure};
pub use retention::{duration_text, RetentionConfig, RetentionHandle, RetentionPolicy, TrimPacing};
