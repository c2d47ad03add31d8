//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! Herald's fault-injection harness.
//!
//! A run drives a real cluster (several `herald serve` nodes on one
//! database) through faults while clients publish and subscribe. Every
//! client records what it did and what it saw as a [`history::Event`], and
//! so do the harness's observers: the faults injected, the takeovers the
//! nodes report, and the writer lease's row as read straight from the
//! database; after the run the database's contents are read into a
//! [`history::FinalState`]. The [`checker`] then judges the record: it
//! never trusts the nodes, only what the clients and observers saw and
//! what the database holds. Besides the safety guarantees it judges one
//! liveness rule (live subscriptions keep up), only away from faults. Each node's
//! database connections can go through a [`proxy::FaultProxy`] that cuts,
//! black-holes or delays them.
//!
//! The crate's `herald-chaos` binary runs all of this end to end
//! (docs/testing.md). This crate is not shipped with the server.
//!
//! It keeps its own clients, process handling and PostgreSQL cluster on
//! purpose, apart from the test-support crate `herald-testkit` that the
//! other crates' tests share: it judges Herald from the outside, depends
//! on no Herald crate, and a change to the shared test helpers can never
//! change what it observes.

pub mod checker;
pub mod history;
pub mod proxy;

pub use checker::{check, Report, RunSettings, Violation};
pub use history::{Event, FinalState, PublishResult, StoredMessage, StreamPosition};
