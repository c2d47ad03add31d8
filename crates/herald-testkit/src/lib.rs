//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! Test support for Herald's integration tests, one place for what they
//! share: disposable databases, the `herald serve` process harness and its
//! HTTP client, an in-process node, an SSE client, a WebSocket client,
//! bounded waits and a storage wrapper with hooks.
//!
//! - [`database`]: a fresh PostgreSQL database per test ([`TestDatabase`],
//!   re-exported from `herald_storage::testing`) and a PostgreSQL cluster of
//!   a test's own ([`database::PrivateCluster`]), for faults that would
//!   disturb other tests.
//! - [`process`]: `herald serve` as a child process ([`process::Server`]),
//!   killed when dropped, with its JSON log.
//! - [`api`]: a client of one node's HTTP API ([`api::Api`]).
//! - [`auth`]: a config file with an API key, a token secret and a cluster
//!   secret, and tokens signed with it.
//! - [`balancer`]: a TCP front for several nodes that sends each new
//!   connection to the first that accepts it, as a load balancer would.
//! - [`clients`]: where the real client libraries are (Node.js and
//!   Python).
//! - [`sdk`]: Centrifugo's client SDKs (centrifuge-js, centrifuge-python)
//!   as child processes behind one driver, so that a scenario runs with
//!   either.
//! - [`node`]: a node built in-process as the binary builds it (its
//!   storage, the lease supervisor, `herald_server::serve` on a real
//!   listener), with a stand-in for a frozen holder.
//! - [`place`]: where such a node keeps its messages, SQLite or PostgreSQL,
//!   so that one scenario runs on both backends.
//! - [`sse`] and [`ws`]: the one SSE client and the one WebSocket client.
//! - [`tls`]: a certificate authority of the test's own that issues server
//!   certificates, and a probe of the certificate a server presents.
//! - [`storage`]: [`storage::Hooked`], a `Storage` that passes every call on
//!   to another one and lets hooks delay or fail reads and appends, and the
//!   hooks the tests use.
//!
//! A dev-dependency only, never published. The crate depends on the
//! library crates whose integration tests use it, so their unit tests
//! cannot (they would see a second copy of their own crate's types): the
//! unit tests of `herald-server` keep their in-memory storage in that
//! crate's `testing` module, and `herald-storage`'s tests use
//! `herald_storage::testing` directly. `herald-chaos` keeps its own client
//! and process code on purpose: it judges Herald from the outside and
//! depends on no Herald crate.

use std::future::Future;
use std::time::Duration;

pub mod api;
pub mod auth;
pub mod balancer;
pub mod clients;
pub mod database;
pub mod memory;
pub mod node;
pub mod place;
pub mod process;
pub mod sdk;
pub mod sse;
pub mod storage;
pub mod tls;
pub mod ws;

pub use database::TestDatabase;
pub use herald_storage::testing::{candidate, keyed, msg};

/// Default bound of one wait on another process (a `herald serve` child, a
/// database) or on a node's answer: 10 s. Tests also use it as the bound of
/// what must happen "promptly" at that scale (a takeover, an exit).
pub const WAIT: Duration = Duration::from_secs(10);

/// Bound of one wait in the in-process node tests ([`node::Node`]): 20 s.
/// Longer than [`WAIT`] because there the nodes, their storage threads and
/// the test's clients share the test's runtime.
pub const NODE_WAIT: Duration = Duration::from_secs(20);

/// Pause between two looks at something another process changes: 20 ms.
pub const POLL: Duration = Duration::from_millis(20);

/// Awaits `future`, failing the test after `limit` with a message that
/// names `what` was awaited.
///
/// # Panics
/// When `future` is not ready within `limit`.
pub async fn within<T>(what: &str, limit: Duration, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// A small deterministic pseudo-random sequence (xorshift64*), seeded per
/// test run; the seed is printed so that a failure can be replayed with
/// [`Rng::from_seed`].
pub struct Rng(u64);

impl Rng {
    /// A sequence seeded from the system clock; prints `rng seed <seed>`.
    pub fn from_time() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let rng = Self::from_seed(seed);
        println!("rng seed {}", rng.0);
        rng
    }

    /// The sequence of `seed` (made odd: xorshift needs a non-zero state).
    pub fn from_seed(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next number, in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
