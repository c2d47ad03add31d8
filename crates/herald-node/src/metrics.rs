//! The core's metrics: the names of the families the node's core records
//! (publishes, the writer, subscriptions, forwarding, the standby feed,
//! retention, the lease gauges set at scrape time) and their recorders.
//! They go to whatever `metrics` recorder the process installed (Herald's
//! server installs a Prometheus one and describes every family, these
//! included); with none installed they are dropped.

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

/// `herald_publishes_total`.
pub const PUBLISHES: &str = "herald_publishes_total";
/// `herald_messages_delivered_total`.
pub const DELIVERED: &str = "herald_messages_delivered_total";
/// `herald_publish_duration_seconds`.
pub const PUBLISH_DURATION: &str = "herald_publish_duration_seconds";
/// `herald_writer_batch_messages`.
pub const BATCH_MESSAGES: &str = "herald_writer_batch_messages";
/// `herald_writer_queue_depth`.
pub const QUEUE_DEPTH: &str = "herald_writer_queue_depth";
/// `herald_subscribers`.
pub const SUBSCRIBERS: &str = "herald_subscribers";
/// `herald_lease_role`.
pub const LEASE_ROLE: &str = "herald_lease_role";
/// `herald_lease_token`.
pub const LEASE_TOKEN: &str = "herald_lease_token";
/// `herald_lease_seconds_since_renewal`.
pub const LEASE_SINCE_RENEWAL: &str = "herald_lease_seconds_since_renewal";
/// `herald_forwarded_writes_total`.
pub const FORWARDED_WRITES: &str = "herald_forwarded_writes_total";
/// `herald_notify_lag_seconds`.
pub const NOTIFY_LAG: &str = "herald_notify_lag_seconds";
/// `herald_catchup_reads_total`.
pub const CATCHUP_READS: &str = "herald_catchup_reads_total";
/// `herald_subscription_read_retries_total`.
pub const SUBSCRIPTION_READ_RETRIES: &str = "herald_subscription_read_retries_total";
/// `herald_retention_trimmed_messages_total`.
pub const TRIMMED_MESSAGES: &str = "herald_retention_trimmed_messages_total";
/// `herald_retention_trimmed_bytes_total`.
pub const TRIMMED_BYTES: &str = "herald_retention_trimmed_bytes_total";
/// `herald_retention_trim_duration_seconds`.
pub const TRIM_DURATION: &str = "herald_retention_trim_duration_seconds";
/// `herald_retention_backlog_messages`.
pub const RETENTION_BACKLOG: &str = "herald_retention_backlog_messages";
/// `herald_retention_channels_beyond_policy`.
pub const CHANNELS_BEYOND_POLICY: &str = "herald_retention_channels_beyond_policy";
/// `herald_subscriptions_truncated_total`.
pub const SUBSCRIPTIONS_TRUNCATED: &str = "herald_subscriptions_truncated_total";
/// `herald_lease_takeovers_recorded_total`.
pub const TAKEOVERS_RECORDED: &str = "herald_lease_takeovers_recorded_total";
/// `herald_stream_renewals_total`.
pub const STREAM_RENEWALS: &str = "herald_stream_renewals_total";

/// Sets the counter `herald_lease_takeovers_recorded_total` from the
/// database's record (`LeaseStore::takeover_counts`), which only grows;
/// reasons without a record read 0.
pub fn takeovers_recorded(counts: &[herald_storage::TakeoverCount]) {
    for reason in herald_storage::TakeoverReason::ALL {
        let takeovers = counts
            .iter()
            .find(|c| c.reason == reason)
            .map_or(0, |c| c.takeovers);
        counter!(TAKEOVERS_RECORDED, "reason" => reason.as_str()).absolute(takeovers);
    }
}

/// The handles of the families recorded on every publish, taken once
/// from the recorder in force when [`register_publish_handles`] ran, so
/// that a publish does not look its families up by name and labels.
struct PublishHandles {
    created: Counter,
    duplicate: Counter,
    forwarded: Counter,
    duration: Histogram,
    batch: Histogram,
    queue_depth: Gauge,
    delivered: Counter,
}

static PUBLISH_HANDLES: OnceLock<PublishHandles> = OnceLock::new();

/// Takes the handles of the per-publish families from the recorder
/// installed now; call it once the process's recorder is installed
/// (Herald's server does when it installs its own). Until then, and for
/// the families' other labels, each record looks its family up.
pub fn register_publish_handles() {
    PUBLISH_HANDLES.get_or_init(|| PublishHandles {
        created: counter!(PUBLISHES, "result" => "created"),
        duplicate: counter!(PUBLISHES, "result" => "duplicate"),
        forwarded: counter!(PUBLISHES, "result" => "forwarded"),
        duration: histogram!(PUBLISH_DURATION),
        batch: histogram!(BATCH_MESSAGES),
        queue_depth: gauge!(QUEUE_DEPTH),
        delivered: counter!(DELIVERED),
    });
}

/// Counts one publish outcome and its duration.
pub fn publish_finished(result: &'static str, seconds: f64) {
    let Some(handles) = PUBLISH_HANDLES.get() else {
        counter!(PUBLISHES, "result" => result).increment(1);
        histogram!(PUBLISH_DURATION).record(seconds);
        return;
    };
    match result {
        "created" => handles.created.increment(1),
        "duplicate" => handles.duplicate.increment(1),
        "forwarded" => handles.forwarded.increment(1),
        _ => counter!(PUBLISHES, "result" => result).increment(1),
    }
    handles.duration.record(seconds);
}

/// Counts one message handed to a live subscription (Herald's SSE and
/// WebSocket, Centrifugo's, Durable Streams' long-poll and SSE), history
/// catch-up included.
pub(crate) fn delivered() {
    match PUBLISH_HANDLES.get() {
        Some(handles) => handles.delivered.increment(1),
        None => counter!(DELIVERED).increment(1),
    }
}

/// Records the size of one committed batch.
pub fn batch_committed(messages: usize) {
    match PUBLISH_HANDLES.get() {
        Some(handles) => handles.batch.record(messages as f64),
        None => histogram!(BATCH_MESSAGES).record(messages as f64),
    }
}

/// Sets the writer's queue depth.
pub(crate) fn queue_depth(depth: usize) {
    match PUBLISH_HANDLES.get() {
        Some(handles) => handles.queue_depth.set(depth as f64),
        None => gauge!(QUEUE_DEPTH).set(depth as f64),
    }
}

/// Sets the lease gauges (at scrape time).
pub fn lease(holder: bool, token: u64, since_renewal: Option<std::time::Duration>) {
    gauge!(LEASE_ROLE).set(if holder { 1.0 } else { 0.0 });
    gauge!(LEASE_TOKEN).set(token as f64);
    // Absent (NaN) on a standby: it renews nothing.
    gauge!(LEASE_SINCE_RENEWAL).set(since_renewal.map_or(f64::NAN, |d| d.as_secs_f64()));
}

/// Counts one forwarded publish by `result` (`ok`, `error`, `no_holder`,
/// `takeover`).
pub fn forwarded(result: &'static str) {
    counter!(FORWARDED_WRITES, "result" => result).increment(1);
}

/// Counts `streams` stream TTL renewals of this node by `result`:
/// `renewed` (restarted here as holder), `forwarded` (sent to the holder),
/// `failed` (the batch was dropped), `dropped` (a read not noted: too many
/// streams waited for the next batch).
pub(crate) fn stream_renewals(result: &'static str, streams: u64) {
    counter!(STREAM_RENEWALS, "result" => result).increment(streams);
}

/// Records the delay of one commit signal, in seconds (never negative).
pub(crate) fn notify_lag(seconds: f64) {
    histogram!(NOTIFY_LAG).record(seconds.max(0.0));
}

/// Counts one subscription read that fills a gap or a lag.
pub(crate) fn catchup_read() {
    counter!(CATCHUP_READS).increment(1);
}

/// Counts one subscription read that failed transiently and will be tried
/// again.
pub(crate) fn subscription_read_retry() {
    counter!(SUBSCRIPTION_READ_RETRIES).increment(1);
}

/// Counts one `truncated` event handed to a subscriber.
pub(crate) fn subscription_truncated() {
    counter!(SUBSCRIPTIONS_TRUNCATED).increment(1);
}

/// Records one trim transaction: what it removed and how long it took.
pub fn trimmed(messages: u64, bytes: u64, seconds: f64) {
    counter!(TRIMMED_MESSAGES).increment(messages);
    counter!(TRIMMED_BYTES).increment(bytes);
    histogram!(TRIM_DURATION).record(seconds);
}

/// Sets the retention backlog gauges at the start of a sweep.
pub(crate) fn retention_backlog(messages: u64, channels: u64) {
    gauge!(RETENTION_BACKLOG).set(messages as f64);
    gauge!(CHANNELS_BEYOND_POLICY).set(channels as f64);
}

/// Counts one live subscription for as long as it lives.
#[derive(Debug)]
pub(crate) struct SubscriberGauge {
    transport: &'static str,
}

impl SubscriberGauge {
    /// Counts a new subscription on `transport` (`"sse"`, `"ws"`,
    /// `"centrifugo"` or `"durable_streams"`).
    pub(crate) fn new(transport: &'static str) -> Self {
        gauge!(SUBSCRIBERS, "transport" => transport).increment(1.0);
        Self { transport }
    }
}

impl Drop for SubscriberGauge {
    fn drop(&mut self) {
        gauge!(SUBSCRIBERS, "transport" => self.transport).decrement(1.0);
    }
}
