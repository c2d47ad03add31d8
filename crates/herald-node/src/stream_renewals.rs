//! Reads restart a stream's TTL. The Durable Streams protocol
//! (`PROTOCOL.md` of durable-streams/durable-streams) expires a stream
//! with `Stream-TTL` after that many seconds without access, reads
//! included; every node serves reads, but only the holder writes. So a
//! node notes the streams it read ([`StreamRenewals::note_read`], which
//! never waits and never fails) and sends them, coalesced, as one
//! renewal batch at a time, at most one per [`RENEWAL_INTERVAL`]:
//!
//! - on the holder, a fenced storage write (`Storage::renew_streams`);
//! - on a standby, forwarded once to the holder's
//!   [`STREAM_RENEWALS_PATH`] (with the cluster secret, like every
//!   forward), whose handler renews them the same way
//!   ([`StreamRenewals::renew_forwarded`]).
//!
//! The batch goes as soon as a read is noted when none went in the last
//! interval, so a stream's TTL restarts within one interval (plus a
//! forward) of the read. A renewal that reaches the storage after the
//! stream expired does not revive it (the storage decides, on its clock).
//! At most [`MAX_PENDING_RENEWALS`] distinct streams wait for the next
//! batch; reads of others in the same interval are not noted (counted in
//! `herald_stream_renewals_total{result="dropped"}`). A failed batch is logged and
//! dropped: the next read notes its stream again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use herald_core::{ChannelName, StreamInfo};
use herald_storage::Storage;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Method};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::forward::{CarriedHeaders, ForwardRequest, Forwarded, Forwarder, HolderView};
use crate::metrics;
use crate::node_error::{NodeError, NodeResult, StorageFailure};
use crate::role::LeaseView;

/// Shortest time between two renewal batches of one node (250 ms): a
/// quarter of the shortest TTL a stream can have (1 s), so that a stream
/// read before the last quarter of its TTL is renewed before it ends.
pub const RENEWAL_INTERVAL: Duration = Duration::from_millis(250);

/// Most distinct streams waiting for the next renewal batch of one node,
/// and in one forwarded batch (4096; a batch of names of at most 128
/// bytes stays well under [`MAX_RENEWAL_BODY_BYTES`]).
pub const MAX_PENDING_RENEWALS: usize = 4096;

/// Largest body the holder takes at [`STREAM_RENEWALS_PATH`], in bytes
/// (1 MiB).
pub const MAX_RENEWAL_BODY_BYTES: usize = 1024 * 1024;

/// The holder's route that takes a standby's renewal batch: `POST` with
/// the JSON body `{"streams": ["<channel>", ...]}` (at most
/// [`MAX_PENDING_RENEWALS`] names), a forwarded request only.
pub const STREAM_RENEWALS_PATH: &str = "/v1/cluster/stream-renewals";

/// A forwarded renewal batch's body, as [`STREAM_RENEWALS_PATH`] takes it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RenewalBatch {
    /// The streams read, by channel name (the holder checks each name).
    pub streams: Vec<String>,
}

/// The streams this node read since its last renewal batch, and what it
/// needs to send the next one. One per node ([`crate::Node`]).
pub struct StreamRenewals {
    storage: Arc<dyn Storage>,
    lease: Arc<dyn LeaseView>,
    forwarder: Forwarder,
    /// This node's advertised URL: a lease row naming it is stale.
    advertise_url: String,
    /// Streams read since the last batch, at most
    /// [`MAX_PENDING_RENEWALS`].
    pending: Mutex<HashSet<ChannelName>>,
    /// Woken by the first read noted after a batch.
    noted: Notify,
}

impl std::fmt::Debug for StreamRenewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamRenewals")
            .field("pending", &self.pending_count())
            .finish_non_exhaustive()
    }
}

impl StreamRenewals {
    /// Renewals sent with `storage` while holder, else forwarded with
    /// `forwarder` to the holder `lease` names (never to
    /// `advertise_url`, this node's own).
    pub fn new(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        forwarder: Forwarder,
        advertise_url: &str,
    ) -> Self {
        Self {
            storage,
            lease,
            forwarder,
            advertise_url: advertise_url.trim_end_matches('/').to_owned(),
            pending: Mutex::new(HashSet::new()),
            noted: Notify::new(),
        }
    }

    /// Notes that `stream` was read (a `GET` of any kind): its TTL, if it
    /// has one, is restarted by the next batch. Never waits, never fails;
    /// a stream without a TTL, or one more stream than
    /// [`MAX_PENDING_RENEWALS`] wait already, is not noted.
    pub fn note_read(&self, stream: &StreamInfo) {
        if stream.config.ttl_s.is_none() {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.contains(&stream.channel) {
            return;
        }
        if pending.len() >= MAX_PENDING_RENEWALS {
            metrics::stream_renewals("dropped", 1);
            return;
        }
        let first = pending.is_empty();
        pending.insert(stream.channel.clone());
        drop(pending);
        if first {
            self.noted.notify_one();
        }
    }

    /// Streams waiting for the next batch.
    pub fn pending_count(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Renews a standby's forwarded batch here, as holder: a fenced
    /// storage write. Returns how many streams were renewed.
    ///
    /// # Errors
    /// [`NodeError::NotHolder`] when this
    /// node is not holder (the standby drops the batch);
    /// [`NodeError::LeaseLost`] when the fencing check failed;
    /// [`NodeError::Storage`] when the storage failed.
    pub async fn renew_forwarded(&self, streams: &[ChannelName]) -> NodeResult<u64> {
        let Some(lease) = self.lease.writable_lease() else {
            return Err(NodeError::NotHolder {
                request: None,
                holder_url: self.lease.state().holder_url().map(str::to_owned),
            });
        };
        match self.storage.renew_streams(&lease, streams).await {
            Ok(renewed) => Ok(renewed),
            Err(herald_storage::Error::LeaseLost { token, .. }) => {
                self.lease.report_lease_lost(token);
                Err(NodeError::LeaseLost)
            }
            Err(e) => Err(StorageFailure::new("renew_streams", None, e).into()),
        }
    }

    /// Sends a batch whenever reads were noted, at most one per
    /// [`RENEWAL_INTERVAL`], until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.noted.notified() => {}
            }
            let batch: Vec<ChannelName> =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
                    .into_iter()
                    .collect();
            if !batch.is_empty() {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = self.send(&batch) => {}
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RENEWAL_INTERVAL) => {}
            }
        }
    }

    /// Renews `batch` here while holder, else forwards it to the holder.
    /// Failures are logged and the batch dropped.
    async fn send(&self, batch: &[ChannelName]) {
        if self.lease.is_holder() {
            match self.renew_forwarded(batch).await {
                Ok(renewed) => {
                    metrics::stream_renewals("renewed", renewed);
                }
                Err(e) => {
                    metrics::stream_renewals("failed", batch.len() as u64);
                    tracing::warn!(error = %e, streams = batch.len(), "stream TTL renewals failed");
                }
            }
            return;
        }
        let state = self.lease.state();
        let Some(holder) = HolderView::from_lease_row(&state)
            .filter(|h| h.url.trim_end_matches('/') != self.advertise_url)
        else {
            metrics::stream_renewals("failed", batch.len() as u64);
            tracing::debug!(
                streams = batch.len(),
                "no holder known: stream TTL renewals dropped"
            );
            return;
        };
        let body = match serde_json::to_vec(&RenewalBatch {
            streams: batch.iter().map(|c| c.as_str().to_owned()).collect(),
        }) {
            Ok(body) => Bytes::from(body),
            Err(e) => {
                tracing::error!(error = %e, "cannot encode stream TTL renewals");
                return;
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let request = ForwardRequest {
            method: Method::POST,
            path: STREAM_RENEWALS_PATH.to_owned(),
            body,
            headers: &headers,
            carry: CarriedHeaders::NONE,
        };
        match self
            .forwarder
            .forward(&holder.url, request, self.lease.subscribe())
            .await
        {
            Ok(Forwarded::Answer(answer)) if answer.status().is_success() => {
                metrics::stream_renewals("forwarded", batch.len() as u64);
            }
            Ok(Forwarded::Answer(answer)) => {
                metrics::stream_renewals("failed", batch.len() as u64);
                tracing::warn!(
                    holder_url = %holder.url,
                    status = answer.status().as_u16(),
                    streams = batch.len(),
                    "the holder refused forwarded stream TTL renewals"
                );
            }
            Ok(Forwarded::TakenOver) | Err(_) => {
                // The forwarder logged why; the next read notes its
                // stream again.
                metrics::stream_renewals("failed", batch.len() as u64);
            }
        }
    }
}
