//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! The lease supervisor: one implementation of the writer lease's timing
//! policy for every storage backend.
//!
//! A node runs one [`Supervisor`]. As a standby it tries to acquire the lease
//! every acquire interval. As holder it renews every renew interval, retries
//! a failed renewal every second, and keeps a **safety deadline**: the send
//! instant of the last successful renewal + ttl − safety margin, measured on
//! a clock that never goes back and keeps counting through suspend
//! ([`BootClock`]). The **watchdog** stops the node when the deadline passes
//! without a successful renewal; a renewal that finds the lease lost stops it
//! at once. On drain the supervisor releases the lease.
//!
//! The storage side (lock modes, fencing) is `herald-storage`; the design is
//! in `docs/storage.md`. Time is read only through [`Clock`] and waited on
//! only through tokio's timer, so tests run under a paused clock.
//!
//! The feature `fault-switches` (test-only, never shipped) compiles in the
//! fault switches of `herald_core::fault_switches`; one acts here:
//! `zombie_holder` (`supervisor.rs`, `state.rs`), a holder that never gives
//! up on its own. `FaultSwitch::ZombieHolder` explains it.

mod clock;
mod config;
mod state;
mod supervisor;

pub use clock::{BootClock, Clock, ClockInstant, TokioClock};
pub use config::{
    default_renew_statement_timeout, default_retry_interval, default_safety_margin, LeaseConfig,
    LeaseConfigError, RENEW_ATTEMPT_SLACK, SHORTEST_DERIVED_TTL,
};
pub use state::{LeaseHandle, LeaseState, Release, StopReason, WatchdogRecord};
pub use supervisor::Supervisor;
