//! The PostgreSQL backend: several Herald nodes share one database, and the
//! writer lease decides which one of them writes.
//!
//! The design is in `docs/storage.md` ("Operations on PostgreSQL" with its
//! lock modes, connections, dead-holder detection and change notices, and
//! "The safety argument"); this code follows it, and changes to one go
//! with changes to the other. In short: a pool of connections for fenced
//! writes, acquire, release and reads, and dedicated connections for
//! renewal (`renewal.rs`), change notices (`listen.rs`), liveness
//! (`liveness.rs`) and the takeover watch (`takeover.rs`), reopened under
//! one policy (`reconnect.rs`). Join and leave events between nodes are
//! notifications too (`presence_events.rs`), heard by the same listener. A fenced write holds the lease row
//! `FOR KEY SHARE`, a renewal `FOR NO KEY UPDATE`, an acquire `FOR UPDATE`,
//! and every decision after a lock wait is a statement of its own on the
//! database clock (`ops.rs`). Every connection must be one server session
//! for its whole life: [`PostgresStorage::connect`] refuses a pooler that
//! breaks that (`pooler.rs`; docs/operations.md, "Connection poolers").
//!
//! The files: `connect.rs` opens a storage (the pool, the migrations, the
//! dedicated connections and their tasks); `storage.rs` implements
//! [`Storage`](crate::traits::Storage) and
//! [`LeaseStore`](crate::traits::LeaseStore) on it, one call of the SQL
//! modules per method; `session.rs` configures and opens single
//! connections (session settings, keepalives, timeouts); `names.rs` holds
//! what every node of one database must agree on (advisory lock keys and
//! notification channels).

mod cluster;
mod connect;
mod epoch;
mod listen;
mod liveness;
mod names;
mod nodes;
mod ops;
mod pooler;
mod presence;
mod presence_events;
mod reconnect;
mod renewal;
mod session;
mod storage;
mod streams;
mod takeover;
mod write;

pub use connect::{
    check_connection_string, PostgresSettings, PostgresStorage, CHANGE_SIGNAL_CAPACITY,
    CLUSTER_EVENT_CAPACITY,
};
pub use names::{
    fenced_write_lock_key, CHANGES_CHANNEL, CLUSTER_CHANNEL, LEASE_CHANNEL, MIGRATION_LOCK_KEY,
};
pub use presence_events::{MAX_PAYLOAD_BYTES, PRESENCE_CHANNEL, PRESENCE_EVENT_CAPACITY};
pub use session::{PostgresOptions, SessionSettings};
