//! The holder's trimming task: removes the history beyond each channel's
//! retention policy, in small fenced transactions, paced so that publishes
//! and lease renewals never wait long behind it.
//!
//! Every [`TrimPacing::interval`] the task, while this node is holder,
//! reads every channel's head, earliest offset and size
//! ([`MessageLog::channel_stats`](herald_storage::MessageLog::channel_stats),
//! one query of the channels table, no message read), and trims each channel that is beyond its policy (more
//! messages or bytes than allowed; with a `max_age`, every channel that
//! stores messages) in transactions of at most [`TrimPacing::batch`]
//! messages, with a pause of [`TrimPacing::pause`] after each transaction
//! that removed something. Policies are read at the start of each sweep
//! from the [`RetentionHandle`], so a reload takes effect at the next
//! sweep. A trim that finds the lease lost stops the sweep and reports
//! the loss, as the writer does.
//!
//! Before each sweep, whatever the policies, the task deletes the streams
//! that have expired (`Stream-TTL` or `Stream-Expires-At` passed;
//! [`StreamStore::expired_streams`](herald_storage::StreamStore::expired_streams),
//! at most [`EXPIRED_STREAMS_PER_SWEEP`] a time) as any channel is deleted ([`super::delete_channel`]): their
//! messages are removed, the deletion recorded, and their live
//! subscriptions end with a `deleted` event. Until then an expired stream
//! already reads as deleted (`Storage::read`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::{ChannelName, Lease};
use herald_storage::{ChannelStats, Storage, TrimLimits, Trimmed};
use tokio_util::sync::CancellationToken;

use super::policy::{RetentionConfig, RetentionHandle, RetentionPolicy};
use crate::hub::Hub;
use crate::metrics;
use crate::role::LeaseView;

/// Most expired streams one sweep deletes; the next sweep goes on.
pub(crate) const EXPIRED_STREAMS_PER_SWEEP: usize = 100;

/// How the trimming task paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimPacing {
    /// Time between two sweeps over every channel (default 1 s).
    pub interval: Duration,
    /// Most messages removed by one trim transaction (default 500).
    pub batch: usize,
    /// Pause after each trim transaction that removed something, before
    /// the next one (default 10 ms): bounds the share of the storage's
    /// time that trimming takes, whatever the backlog.
    pub pause: Duration,
}

impl Default for TrimPacing {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            batch: 500,
            pause: Duration::from_millis(10),
        }
    }
}

/// The trimming task of one node (it trims only while holder).
pub(crate) struct Trimmer {
    /// Where the messages are trimmed.
    pub(crate) storage: Arc<dyn Storage>,
    /// The node's role: it trims only while holder, fenced by its token.
    pub(crate) lease: Arc<dyn LeaseView>,
    /// The policies in force (replaced whole on a reload).
    pub(crate) retention: RetentionHandle,
    /// How much one trim transaction removes and how often sweeps run.
    pub(crate) pacing: TrimPacing,
    /// The node's hub: an expired stream's deletion ends its live
    /// subscriptions here.
    pub(crate) hub: Arc<Hub>,
}

/// Whether a sweep trims `channel` under `policy`: it holds more messages
/// or bytes than allowed, or the policy bounds age and it stores messages.
fn needs_trim(channel: &ChannelStats, policy: &RetentionPolicy) -> bool {
    policy.max_messages.is_some_and(|m| channel.messages > m)
        || policy.max_bytes.is_some_and(|b| channel.bytes > b)
        || (policy.max_age.is_some() && channel.messages > 0)
}

/// Messages of `channel` beyond its `max_messages` (0 without one).
fn backlog(channel: &ChannelStats, policy: &RetentionPolicy) -> u64 {
    policy
        .max_messages
        .map_or(0, |m| channel.messages.saturating_sub(m))
}

impl Trimmer {
    /// Sweeps every [`TrimPacing::interval`] until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.pacing.interval) => {}
            }
            let Some(lease) = self.lease.writable_lease() else {
                continue;
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.delete_expired_streams() => {}
            }
            let config = self.retention.current();
            if config.is_unbounded() {
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.sweep(&lease, &config) => {}
            }
        }
    }

    /// Deletes the streams that have expired, at most
    /// [`EXPIRED_STREAMS_PER_SWEEP`]; stops at the first failure (the
    /// next sweep tries again).
    async fn delete_expired_streams(&self) {
        let expired = match self
            .storage
            .expired_streams(EXPIRED_STREAMS_PER_SWEEP)
            .await
        {
            Ok(expired) => expired,
            Err(e) => {
                tracing::warn!(error = %e, "retention: listing the expired streams failed; next sweep tries again");
                return;
            }
        };
        for channel in &expired {
            let deleted = super::delete_channel(
                &*self.storage,
                &*self.lease,
                &self.hub,
                self.pacing.batch,
                channel,
            )
            .await;
            match deleted {
                Ok(head) => {
                    tracing::info!(channel = %channel, head, "retention: an expired stream was deleted");
                }
                Err(e) => {
                    tracing::warn!(channel = %channel, error = %e, "retention: deleting an expired stream failed; next sweep tries again");
                    return;
                }
            }
        }
    }

    /// One pass over every channel.
    async fn sweep(&self, lease: &Lease, config: &RetentionConfig) {
        let channels = match self.storage.channel_stats().await {
            Ok(channels) => channels,
            Err(e) => {
                tracing::warn!(error = %e, "retention: listing the channels failed; next sweep tries again");
                return;
            }
        };
        let (mut beyond, mut channels_beyond) = (0, 0);
        for channel in &channels {
            let policy = config.policy_for(&channel.name);
            beyond += backlog(channel, policy);
            let over = policy.max_messages.is_some_and(|m| channel.messages > m)
                || policy.max_bytes.is_some_and(|b| channel.bytes > b);
            channels_beyond += u64::from(over);
        }
        metrics::retention_backlog(beyond, channels_beyond);
        for channel in &channels {
            let policy = config.policy_for(&channel.name);
            if !needs_trim(channel, policy) {
                continue;
            }
            if self
                .trim_channel(lease, &channel.name, &policy.limits())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Trims `channel` until it is within `limits`, a transaction at a time.
    /// `Err` when the sweep must stop (lease lost, storage failing).
    async fn trim_channel(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &TrimLimits,
    ) -> Result<(), ()> {
        loop {
            // The lease is asked before each transaction, as the writer
            // does before each batch: past its safety deadline this node
            // trims nothing.
            if self.lease.writable_lease().is_none() {
                return Err(());
            }
            let t = trim_step(
                &*self.storage,
                &*self.lease,
                lease,
                channel,
                limits,
                self.pacing.batch,
            )
            .await
            .map_err(drop)?;
            if t.done {
                return Ok(());
            }
            if t.messages > 0 {
                tokio::time::sleep(self.pacing.pause).await;
            }
        }
    }
}

/// One trim transaction, measured; reports a lost lease to the
/// supervisor (as the writer does) and logs other failures.
///
/// # Errors
/// The storage's error.
pub(crate) async fn trim_step(
    storage: &dyn Storage,
    view: &dyn LeaseView,
    lease: &Lease,
    channel: &ChannelName,
    limits: &TrimLimits,
    batch: usize,
) -> herald_storage::Result<Trimmed> {
    let started = Instant::now();
    let result = storage.trim(lease, channel, limits, batch).await;
    match &result {
        Ok(t) => {
            metrics::trimmed(t.messages, t.bytes, started.elapsed().as_secs_f64());
            if t.messages > 0 {
                tracing::debug!(channel = %channel, messages = t.messages, bytes = t.bytes, earliest = t.earliest, "retention: trimmed");
            }
        }
        Err(herald_storage::Error::LeaseLost { token, .. }) => view.report_lease_lost(*token),
        Err(e) => {
            tracing::warn!(channel = %channel, error = %e, "retention: a trim failed");
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(messages: u64, bytes: u64) -> ChannelStats {
        ChannelStats {
            name: ChannelName::new("c").unwrap(),
            head: messages,
            earliest: 1,
            messages,
            bytes,
        }
    }

    #[test]
    fn only_channels_beyond_a_bound_are_trimmed() {
        let by_count = RetentionPolicy {
            max_messages: Some(10),
            ..RetentionPolicy::default()
        };
        assert!(!needs_trim(&stats(10, 1_000_000), &by_count));
        assert!(needs_trim(&stats(11, 0), &by_count));
        assert_eq!(backlog(&stats(15, 0), &by_count), 5);
        let by_size = RetentionPolicy {
            max_bytes: Some(100),
            ..RetentionPolicy::default()
        };
        assert!(!needs_trim(&stats(1000, 100), &by_size));
        assert!(needs_trim(&stats(1, 101), &by_size));
        let by_age = RetentionPolicy {
            max_age: Some(Duration::from_secs(1)),
            ..RetentionPolicy::default()
        };
        assert!(!needs_trim(&stats(0, 0), &by_age));
        assert!(needs_trim(&stats(1, 1), &by_age));
    }
}
