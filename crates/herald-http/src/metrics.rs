//! Prometheus metrics: the process-wide recorder, which describes every
//! family (the core's, named in `herald_node::metrics`, and the server's
//! own, named here), and the connection and protocol metrics' recorders.
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `herald_publishes_total` | counter | `result` | publish requests by outcome: `created`, `duplicate` or the error code |
//! | `herald_publish_duration_seconds` | histogram | | time from request to answer of a publish, seconds |
//! | `herald_writer_batch_messages` | histogram | | messages per group commit |
//! | `herald_writer_queue_depth` | gauge | | publish requests waiting in the writer's queue |
//! | `herald_subscribers` | gauge | `transport` (`sse`, `ws`, `centrifugo`) | live subscriptions |
//! | `herald_lease_role` | gauge | | 1 while this node is holder, else 0 (set at scrape time, proven on the lease row as `/v1/status`'s `role`) |
//! | `herald_lease_token` | gauge | | fencing token as this node last saw it (set at scrape time) |
//! | `herald_forwarded_writes_total` | counter | `result` (`ok`, `error`, `no_holder`, `takeover`) | publishes a standby handed to the holder, by outcome (`takeover`: this node took the lease over before the holder answered) |
//! | `herald_notify_lag_seconds` | histogram | | on a standby: wall clock at a commit signal minus the commit time |
//! | `herald_catchup_reads_total` | counter | | subscription reads from storage that fill a gap or a lag |
//! | `herald_publish_rate_limited_total` | counter | `credential` (`key`, `token`) | publish requests refused with 429 `rate_limited`, by the kind of credential whose rate was used up |
//! | `herald_subscription_read_retries_total` | counter | | subscription reads from storage that failed transiently; each is tried again after a pause |
//! | `herald_connections_refused_total` | counter | `reason` (`per_ip`) | connections (or proxied requests) answered `429 too_many_connections` |
//! | `herald_idle_connections_closed_total` | counter | | connections closed because no request head arrived within the header read timeout |
//! | `herald_ws_messages_too_big_total` | counter | | WebSocket sessions closed with 1009 for a client message over the limit |
//! | `herald_retention_trimmed_messages_total` | counter | | messages removed by retention (trims and channel deletions) on this node |
//! | `herald_retention_trimmed_bytes_total` | counter | | bytes of message data removed by retention on this node |
//! | `herald_retention_trim_duration_seconds` | histogram | | time of one trim transaction (bounded rows), seconds |
//! | `herald_retention_backlog_messages` | gauge | | on the holder, at the start of the last sweep: messages beyond `max_messages` summed over channels (age and size backlogs are not counted: they need a read per channel) |
//! | `herald_retention_channels_beyond_policy` | gauge | | on the holder, at the start of the last sweep: channels with more messages or bytes than their policy allows |
//! | `herald_subscriptions_truncated_total` | counter | | `truncated` events sent: a subscriber resumed (or fell) below the channel's earliest offset |
//! | `herald_centrifugo_channels_unreported` | gauge | | subscribed channels this node left out of its last node report (beyond its cap; other nodes' `channels` miss them) |
//! | `herald_lease_takeovers_recorded_total` | counter | `reason` (`fresh`, `released`, `expired`, `holder_gone`, `reclaimed`) | acquisitions of the writer lease recorded in the database, by every node over the database's life (read at scrape time) |
//! | `herald_build_info` | gauge | `version`, `commit` | 1, labelled with the running binary's version and the commit it was built from (`unknown` when built outside a git checkout without `HERALD_COMMIT`) |
//! | `herald_stream_appends_waiting` | gauge | | Durable Streams appends waiting, on the node that writes, for their idempotent producer's earlier appends (an append ahead of its turn waits up to `durable_streams.producer_gap_wait`) |
//!
//! Every family above, and the lease supervisor's (`herald_lease_*`), is
//! registered when the recorder is installed (counters and gauges at 0,
//! with each of their documented labels; histograms with no samples), so
//! each is on `/metrics` from the start and an alert on it reads 0, not
//! "no data", until its first event.

use std::sync::OnceLock;

use herald_auth::metrics::RATE_LIMITED;
use herald_node::metrics::register_publish_handles;
use herald_node::metrics::{
    BATCH_MESSAGES, CATCHUP_READS, CHANNELS_BEYOND_POLICY, DELIVERED, FORWARDED_WRITES, LEASE_ROLE,
    LEASE_SINCE_RENEWAL, LEASE_TOKEN, NOTIFY_LAG, PUBLISHES, PUBLISH_DURATION, QUEUE_DEPTH,
    RETENTION_BACKLOG, STREAM_RENEWALS, SUBSCRIBERS, SUBSCRIPTIONS_TRUNCATED,
    SUBSCRIPTION_READ_RETRIES, TAKEOVERS_RECORDED, TRIMMED_BYTES, TRIMMED_MESSAGES, TRIM_DURATION,
};
use metrics::Unit;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Counter: connections (or proxied requests) refused over the per-IP limit.
pub const CONNECTIONS_REFUSED: &str = "herald_connections_refused_total";
/// Counter: connections closed for no request head within the timeout.
pub const IDLE_CONNECTIONS_CLOSED: &str = "herald_idle_connections_closed_total";
/// Counter: WebSocket sessions closed with 1009 for a message over the limit.
pub const WS_MESSAGES_TOO_BIG: &str = "herald_ws_messages_too_big_total";
/// Gauge: subscribed channels left out of this node's last report.
pub const CHANNELS_UNREPORTED: &str = "herald_centrifugo_channels_unreported";
/// Gauge: Durable Streams appends waiting for their turn on this node.
pub const APPENDS_WAITING: &str = "herald_stream_appends_waiting";
/// Emitted by the lease supervisor (herald-lease).
const LEASE_RENEWALS: &str = "herald_lease_renewals_total";
const LEASE_RENEWAL_DURATION: &str = "herald_lease_renewal_duration_seconds";
const LEASE_ACQUISITIONS: &str = "herald_lease_acquisitions_total";
const LEASE_WATCHDOG_STOPS: &str = "herald_lease_watchdog_stops_total";

/// Upper bounds of the publish duration buckets, in seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the batch size buckets, in messages.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder on the first call and
/// returns a handle that renders the text exposition format; later calls
/// return the same handle, so several servers in one process share it.
///
/// Histograms are rendered as real Prometheus histograms (`_bucket`,
/// `_sum`, `_count`), never as summaries. If another recorder was installed
/// globally before, the metrics go there and this handle renders only what
/// is recorded into it (nothing); the conflict is logged.
pub fn install_metrics_recorder() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = builder().build_recorder();
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                tracing::warn!(error = %e, "another metrics recorder is installed; /metrics will be empty");
            }
            describe();
            register_at_zero();
            register_publish_handles();
            metrics_process::Collector::default().describe();
            handle
        })
        .clone()
}

/// `herald_build_info`.
const BUILD_INFO: &str = "herald_build_info";

/// Sets `herald_build_info{version, commit}` to 1: which binary this node
/// runs, for dashboards that compare nodes during a rolling upgrade.
pub fn record_build_info(version: &str, commit: &str) {
    describe_gauge!(
        BUILD_INFO,
        "1, labelled with the version of the running binary and the commit it was built from."
    );
    gauge!(BUILD_INFO, "version" => version.to_owned(), "commit" => commit.to_owned()).set(1.0);
}

/// Updates the process gauges (`process_resident_memory_bytes`,
/// `process_cpu_seconds_total`, `process_open_fds`, ... as the Prometheus
/// client libraries name them: "Writing client libraries", "Process
/// metrics"), read from the OS by the `metrics-process` crate. Called
/// before each `/metrics` render.
pub fn collect_process() {
    metrics_process::Collector::default().collect();
}

fn builder() -> PrometheusBuilder {
    let with_buckets = |b: PrometheusBuilder, name: &str, buckets: &[f64]| {
        // Only an empty bucket list is refused; ours are constants.
        b.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .expect("bucket lists are not empty")
    };
    let b = PrometheusBuilder::new()
        .set_buckets(DURATION_BUCKETS)
        .expect("bucket lists are not empty");
    let b = with_buckets(b, PUBLISH_DURATION, DURATION_BUCKETS);
    with_buckets(b, BATCH_MESSAGES, BATCH_BUCKETS)
}

fn describe() {
    describe_gauge!(
        APPENDS_WAITING,
        "Durable Streams appends waiting for their idempotent producer's earlier appends."
    );
    describe_counter!(
        PUBLISHES,
        "Publish requests by outcome (created, duplicate or the error code)."
    );
    describe_counter!(
        DELIVERED,
        "Messages handed to live subscriptions on this node (Herald's SSE and WebSocket, \
         Centrifugo's), history catch-up included."
    );
    describe_histogram!(
        PUBLISH_DURATION,
        Unit::Seconds,
        "Time from a publish request to its answer."
    );
    describe_histogram!(
        BATCH_MESSAGES,
        Unit::Count,
        "Messages committed per storage transaction (group commit)."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Publish requests waiting in the writer's queue."
    );
    describe_gauge!(SUBSCRIBERS, Unit::Count, "Live subscriptions by transport.");
    describe_gauge!(
        LEASE_ROLE,
        "1 while this node holds the writer lease, else 0."
    );
    describe_gauge!(
        LEASE_TOKEN,
        "The writer lease's fencing token as this node last saw it."
    );
    describe_gauge!(
        LEASE_SINCE_RENEWAL,
        Unit::Seconds,
        "While holder: time since the last successful renewal was sent (NaN on a standby)."
    );
    describe_counter!(
        FORWARDED_WRITES,
        "Publishes a standby handed to the holder, by result: ok, error, no_holder, takeover."
    );
    describe_counter!(
        STREAM_RENEWALS,
        "Durable Streams TTL renewals of streams read here, by result: renewed, forwarded, failed, dropped."
    );
    describe_histogram!(
        NOTIFY_LAG,
        Unit::Seconds,
        "On a standby: local wall clock when a commit signal arrived minus the commit time."
    );
    describe_counter!(
        CATCHUP_READS,
        "Subscription reads from the storage that fill a gap or a lag (not the history read)."
    );
    describe_counter!(
        SUBSCRIPTION_READ_RETRIES,
        "Subscription reads from the storage that failed transiently; each is tried again after a pause."
    );
    describe_counter!(
        RATE_LIMITED,
        "Publish requests refused with 429 rate_limited, by credential: key or token."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections (or requests through a trusted proxy) refused with 429 too_many_connections, by reason."
    );
    describe_counter!(
        IDLE_CONNECTIONS_CLOSED,
        "Connections closed because no complete request head arrived within the header read timeout."
    );
    describe_counter!(
        WS_MESSAGES_TOO_BIG,
        "WebSocket sessions closed with 1009 because the client sent a message over the limit."
    );
    describe_counter!(
        TRIMMED_MESSAGES,
        Unit::Count,
        "Messages removed by retention (trims and channel deletions) on this node."
    );
    describe_counter!(
        TRIMMED_BYTES,
        Unit::Bytes,
        "Bytes of message data removed by retention on this node."
    );
    describe_histogram!(
        TRIM_DURATION,
        Unit::Seconds,
        "Time of one trim transaction (a bounded number of rows)."
    );
    describe_gauge!(
        RETENTION_BACKLOG,
        Unit::Count,
        "On the holder at the last sweep: messages beyond max_messages, summed over channels."
    );
    describe_gauge!(
        CHANNELS_BEYOND_POLICY,
        Unit::Count,
        "On the holder at the last sweep: channels with more messages or bytes than their policy allows."
    );
    describe_counter!(
        SUBSCRIPTIONS_TRUNCATED,
        "Truncated events sent: a subscriber resumed or fell below the channel's earliest offset."
    );
    describe_gauge!(
        CHANNELS_UNREPORTED,
        Unit::Count,
        "Subscribed channels this node left out of its last node report (beyond the cap)."
    );
    // Emitted by the lease supervisor (herald-lease).
    describe_counter!(
        TAKEOVERS_RECORDED,
        Unit::Count,
        "Acquisitions of the writer lease recorded in the database by reason, by every node over the database's life."
    );
    describe_counter!(
        LEASE_RENEWALS,
        "Renewal attempts by result: ok, error, timeout (abandoned), lost."
    );
    describe_histogram!(
        LEASE_RENEWAL_DURATION,
        Unit::Seconds,
        "Time from sending a renewal to its answer or abandonment."
    );
    describe_counter!(
        LEASE_ACQUISITIONS,
        "Acquisitions of the writer lease by this node, by reason."
    );
    describe_counter!(
        LEASE_WATCHDOG_STOPS,
        "Times the watchdog stopped this node at its safety deadline."
    );
}

/// Registers every metric family, so that `/metrics` shows each from the
/// start (a rate or an alert on it reads 0, not "no data", until its first
/// event, also after a restart): counters and gauges at 0 with each of
/// their documented labels, histograms with no samples. The publish
/// results registered are `created` and `duplicate`; error codes appear
/// with their first occurrence.
fn register_at_zero() {
    for name in [
        CATCHUP_READS,
        SUBSCRIPTION_READ_RETRIES,
        IDLE_CONNECTIONS_CLOSED,
        WS_MESSAGES_TOO_BIG,
        TRIMMED_MESSAGES,
        TRIMMED_BYTES,
        SUBSCRIPTIONS_TRUNCATED,
        LEASE_WATCHDOG_STOPS,
    ] {
        counter!(name).increment(0);
    }
    let labelled: [(&str, &str, &[&'static str]); 7] = [
        (PUBLISHES, "result", &["created", "duplicate"]),
        (
            FORWARDED_WRITES,
            "result",
            &["ok", "error", "no_holder", "takeover"],
        ),
        (
            STREAM_RENEWALS,
            "result",
            &["renewed", "forwarded", "failed", "dropped"],
        ),
        (RATE_LIMITED, "credential", &["key", "token"]),
        (CONNECTIONS_REFUSED, "reason", &["per_ip"]),
        (
            LEASE_RENEWALS,
            "result",
            &["ok", "error", "timeout", "lost"],
        ),
        (
            LEASE_ACQUISITIONS,
            "reason",
            &["fresh", "released", "expired", "holder_gone", "reclaimed"],
        ),
    ];
    for (name, label, values) in labelled {
        for value in values {
            counter!(name, label => *value).increment(0);
        }
    }
    for transport in ["sse", "ws", "centrifugo"] {
        gauge!(SUBSCRIBERS, "transport" => transport).set(0.0);
    }
    for reason in herald_storage::TakeoverReason::ALL {
        counter!(TAKEOVERS_RECORDED, "reason" => reason.as_str()).absolute(0);
    }
    for name in [
        QUEUE_DEPTH,
        LEASE_ROLE,
        LEASE_TOKEN,
        RETENTION_BACKLOG,
        CHANNELS_BEYOND_POLICY,
        CHANNELS_UNREPORTED,
        APPENDS_WAITING,
    ] {
        gauge!(name).set(0.0);
    }
    gauge!(LEASE_SINCE_RENEWAL).set(f64::NAN);
    for name in [
        PUBLISH_DURATION,
        BATCH_MESSAGES,
        NOTIFY_LAG,
        TRIM_DURATION,
        LEASE_RENEWAL_DURATION,
    ] {
        // Registered, never recorded: rendered with empty buckets.
        let _ = histogram!(name);
    }
}

/// Sets how many subscribed channels the last node report left out.
pub fn channels_unreported(channels: u64) {
    gauge!(CHANNELS_UNREPORTED).set(channels as f64);
}

/// Counts one connection (or proxied request) refused for `reason`
/// (`per_ip`).
pub fn connection_refused(reason: &'static str) {
    counter!(CONNECTIONS_REFUSED, "reason" => reason).increment(1);
}

/// Counts one connection closed for sending no request head in time.
pub fn idle_connection_closed() {
    counter!(IDLE_CONNECTIONS_CLOSED).increment(1);
}

/// Counts one WebSocket session closed with 1009.
pub fn ws_message_too_big() {
    counter!(WS_MESSAGES_TOO_BIG).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_node::metrics::batch_committed;

    #[test]
    fn batch_sizes_render_as_a_histogram() {
        let handle = install_metrics_recorder();
        let again = install_metrics_recorder();
        batch_committed(3);
        let text = again.render();
        assert!(
            text.contains("herald_writer_batch_messages_bucket{le=\"4\"}"),
            "{text}"
        );
        assert!(text.contains("herald_writer_batch_messages_sum"), "{text}");
        assert!(
            text.contains("herald_writer_batch_messages_count"),
            "{text}"
        );
        drop(handle);
    }
}
