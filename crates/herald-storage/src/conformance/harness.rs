//! What the conformance cases share: the [`Harness`] a backend provides,
//! the [`Cluster`] of nodes it makes, and the helpers and timings every
//! case uses.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use herald_core::{Appended, Candidate, ChannelName, Lease};

use crate::error::Error;
use crate::testing;
use crate::traits::{Acquire, Storage, TakeoverReason};

/// Nodes that share one database, made by a [`Harness`].
pub struct Cluster {
    /// The nodes, each acting as a separate Herald process (its own
    /// connections, and its own session where the backend has one).
    pub nodes: Vec<Arc<dyn Storage>>,
    /// Whatever must outlive the nodes (a temporary directory, a throwaway
    /// database). Dropped after `nodes`.
    pub guard: Box<dyn Any + Send + Sync>,
}

impl Cluster {
    /// Node `i`.
    ///
    /// # Panics
    /// When the cluster has fewer than `i + 1` nodes.
    pub fn node(&self, i: usize) -> &Arc<dyn Storage> {
        &self.nodes[i]
    }
}

/// What a backend's tests provide to run the suite.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// `n` storages sharing one new, empty database, each acting as a
    /// separate node (process). Panics on failure: this is test code.
    async fn cluster(&self, n: usize) -> Cluster;

    /// The rows of every table of `cluster`'s database, by table name,
    /// counted directly in the database (not through [`Storage`]): the
    /// cases that check that a read writes nothing compare two of these.
    async fn row_counts(&self, cluster: &Cluster) -> BTreeMap<String, u64>;
}

/// Lease ttl for cases that do not wait for expiry, in ms (60 s).
pub(super) const LONG_TTL: Duration = Duration::from_secs(60);
/// Lease ttl for cases that wait for expiry (100 ms).
pub(super) const SHORT_TTL: Duration = Duration::from_millis(100);
/// Longest a case polls for an expiry before it fails (10 s).
pub(super) const EXPIRY_WAIT: Duration = Duration::from_secs(10);
/// Longest a case retries an acquire over a holder whose storage was
/// dropped (5 s): the storage may need a moment to notice that the holder's
/// session has closed. Far below [`LONG_TTL`], so that only the detection of
/// the gone holder can explain a takeover.
pub(super) const HOLDER_GONE_WAIT: Duration = Duration::from_secs(5);

/// Candidate `i`: node id `node-<i>`, lease [`DEFAULT_LEASE_NAME`].
pub(super) fn candidate(i: usize) -> Candidate {
    testing::candidate(&format!("node-{i}"))
}

/// The channel named `name` (a valid name).
pub(super) fn channel(name: &str) -> ChannelName {
    ChannelName::new(name).expect("valid test channel name")
}

/// Acquires for candidate `i` and expects success.
pub(super) async fn acquire(
    node: &Arc<dyn Storage>,
    i: usize,
    ttl: Duration,
) -> (Lease, TakeoverReason) {
    match node.acquire(&candidate(i), ttl).await.expect("acquire") {
        Acquire::Acquired { lease, reason } => (lease, reason),
        Acquire::Held(info) => {
            panic!("node-{i} expected to acquire, but the lease is held: {info:?}")
        }
    }
}

/// Polls until the lease has expired on the storage's clock.
pub(super) async fn wait_expired(node: &Arc<dyn Storage>, name: &str) {
    let deadline = Instant::now() + EXPIRY_WAIT;
    loop {
        let info = node
            .lease_info(name)
            .await
            .expect("lease_info")
            .expect("lease exists");
        if info.expires_in_ms <= 0 {
            return;
        }
        assert!(Instant::now() < deadline, "lease never expired: {info:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts that `result` is `LeaseLost` for `lease` (its name and token).
pub(super) fn assert_lost<T: std::fmt::Debug>(result: crate::error::Result<T>, lease: &Lease) {
    match result {
        Err(Error::LeaseLost { name, token }) => {
            assert_eq!(name, lease.name);
            assert_eq!(token, lease.token);
        }
        other => panic!("expected LeaseLost for {lease:?}, got {other:?}"),
    }
}

/// The offsets of `appended`, in order.
pub(super) fn offsets(appended: &[Appended]) -> Vec<u64> {
    appended.iter().map(|a| a.offset).collect()
}
