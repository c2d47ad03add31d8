//! This node process's presence session (`presence.rs` has the rows it
//! writes): its id, its heartbeat, and the rows whose removal failed,
//! retried by the heartbeat. Held by the registry, below the session and
//! the server API.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use herald_core::ChannelName;
use herald_storage::Storage;
use tokio_util::sync::CancellationToken;

/// A presence row's key: its channel and client id.
pub(super) type RowKey = (ChannelName, String);

/// This node process's presence session: its id, whether its heartbeat
/// runs, and the rows whose removal failed.
#[derive(Debug)]
pub(crate) struct PresenceSession {
    /// Random per process, so that a restarted node never renews the rows
    /// of its previous run.
    pub(super) id: String,
    heartbeat: AtomicBool,
    /// Rows of ended subscriptions that may still be in the storage: their
    /// removal failed (or an add failed, which may have written the row).
    /// Each heartbeat removes them before it renews the session's rows.
    pending: Mutex<BTreeSet<RowKey>>,
    /// Held by the heartbeat while it retries the pending removals, and
    /// by a subscribe whose row was pending while it writes the row again,
    /// so that a retried removal never lands after that write.
    pub(super) retrying: tokio::sync::Mutex<()>,
}

impl Default for PresenceSession {
    fn default() -> Self {
        let bits: u128 = rand::random();
        Self {
            id: format!("{bits:032x}"),
            heartbeat: AtomicBool::new(false),
            pending: Mutex::default(),
            retrying: tokio::sync::Mutex::new(()),
        }
    }
}

impl PresenceSession {
    pub(super) fn pending(&self) -> MutexGuard<'_, BTreeSet<RowKey>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the heartbeat once: every third of the ttl, retry the
    /// pending removals, then renew this session's rows, until the node
    /// drains.
    pub(super) fn ensure_heartbeat(
        self: &Arc<Self>,
        storage: Arc<dyn Storage>,
        ttl: std::time::Duration,
        shutdown: CancellationToken,
    ) {
        if self.heartbeat.swap(true, Ordering::SeqCst) {
            return;
        }
        let session = Arc::clone(self);
        tokio::spawn(async move {
            let mut beats = tokio::time::interval(ttl / 3);
            beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = beats.tick() => {
                        session.retry_removals(storage.as_ref()).await;
                        if let Err(e) = storage.presence_touch(&session.id, ttl).await {
                            herald_node::node_error::StorageFailure::new("presence_touch", None, e).log();
                        }
                    }
                }
            }
        });
    }

    /// Removes the pending rows, in order, until one fails (logged; it and
    /// the rest are tried at the next heartbeat).
    async fn retry_removals(&self, storage: &dyn Storage) {
        let _retrying = self.retrying.lock().await;
        let keys: Vec<RowKey> = self.pending().iter().cloned().collect();
        for key in keys {
            let (channel, client) = &key;
            if let Err(e) = storage.presence_remove(channel, client).await {
                herald_node::node_error::StorageFailure::new("presence_remove", Some(channel), e)
                    .log();
                return;
            }
            self.pending().remove(&key);
        }
    }

    /// Removes `client`'s row of `channel`; when that fails (logged), the
    /// row is a pending removal.
    pub(super) async fn remove(&self, storage: &dyn Storage, channel: &ChannelName, client: &str) {
        if let Err(e) = storage.presence_remove(channel, client).await {
            herald_node::node_error::StorageFailure::new("presence_remove", Some(channel), e).log();
            self.pending().insert((channel.clone(), client.to_owned()));
        }
    }
}
