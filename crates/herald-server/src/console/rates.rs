//! The node's rates of the last minutes, for the console's charts: every
//! second the node reads its own metrics (the Prometheus exposition it
//! serves at `/metrics`) and keeps one sample: publishes and deliveries
//! per second over that second, the mean renewal latency of the renewals
//! in it (the last one's when none), and its live subscriptions.
//! `GET /v1/admin/rates` answers the last [`KEPT`] samples; the cluster's
//! event stream carries each new one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use herald_node::hub::Hub;
use herald_node::subscription::wall_clock_ms;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::ConsoleState;
use herald_http::auth_extract::Caller;
use herald_http::error::Result;

/// One sample per this interval.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// Samples kept: the last five minutes.
pub(crate) const KEPT: usize = 300;

/// One second of the node's activity.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Sample {
    /// When it was taken, ms since the Unix epoch (the node's clock).
    pub(crate) at_ms: i64,
    /// Publishes answered per second (`herald_publishes_total`, every
    /// outcome).
    pub(crate) publishes_per_s: f64,
    /// Messages handed to live subscriptions per second
    /// (`herald_messages_delivered_total`).
    pub(crate) deliveries_per_s: f64,
    /// Mean duration of the lease renewals in the interval, in ms
    /// (`herald_lease_renewal_duration_seconds`); the last known when the
    /// interval had none; `None` before the node's first renewal.
    pub(crate) renewal_ms: Option<f64>,
    /// Live subscriptions on this node, every protocol.
    pub(crate) subscribers: u64,
}

/// The totals read from one exposition.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    publishes: f64,
    delivered: f64,
    renewal_seconds: f64,
    renewals: f64,
}

impl Totals {
    /// Sums each family's samples over its label sets in `text` (the
    /// Prometheus text format: `name{labels} value` per line).
    fn read(text: &str) -> Self {
        let mut totals = Self::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or(series);
            let slot = match name {
                "herald_publishes_total" => &mut totals.publishes,
                "herald_messages_delivered_total" => &mut totals.delivered,
                "herald_lease_renewal_duration_seconds_sum" => &mut totals.renewal_seconds,
                "herald_lease_renewal_duration_seconds_count" => &mut totals.renewals,
                _ => continue,
            };
            if value.is_finite() {
                *slot += value;
            }
        }
        totals
    }
}

/// The samples of the last [`KEPT`] intervals, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    samples: Mutex<VecDeque<Sample>>,
}

impl Rates {
    /// The samples kept, oldest first.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        self.lock().iter().copied().collect()
    }

    /// The newest sample, if one was taken.
    pub(crate) fn latest(&self) -> Option<Sample> {
        self.lock().back().copied()
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.lock();
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.samples.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a sample every [`INTERVAL`] from `metrics` and `hub` until
    /// `shutdown` is cancelled.
    pub(crate) async fn run(
        self: Arc<Self>,
        metrics: PrometheusHandle,
        hub: Arc<Hub>,
        shutdown: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval(INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<(Totals, tokio::time::Instant)> = None;
        let mut renewal_ms = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let totals = Totals::read(&metrics.render());
            let now = tokio::time::Instant::now();
            if let Some((before, then)) = last {
                let seconds = now.duration_since(then).as_secs_f64().max(1e-3);
                let renewals = totals.renewals - before.renewals;
                if renewals > 0.0 {
                    renewal_ms =
                        Some((totals.renewal_seconds - before.renewal_seconds) / renewals * 1e3);
                }
                self.push(Sample {
                    at_ms: wall_clock_ms(),
                    publishes_per_s: (totals.publishes - before.publishes).max(0.0) / seconds,
                    deliveries_per_s: (totals.delivered - before.delivered).max(0.0) / seconds,
                    renewal_ms,
                    subscribers: hub.subscriber_total() as u64,
                });
            }
            last = Some((totals, now));
        }
    }
}

/// The answer of `GET /v1/admin/rates`.
#[derive(Debug, Serialize)]
pub(crate) struct RatesView {
    /// The sampling interval, in ms.
    interval_ms: u64,
    /// The samples, oldest first.
    samples: Vec<Sample>,
}

/// `GET /v1/admin/rates`: the node's samples of the last five minutes.
/// Needs `admin`.
pub(crate) async fn rates(
    State(state): State<ConsoleState>,
    Caller(who): Caller,
) -> Result<Json<RatesView>> {
    state.shared.auth().may_admin(&who)?;
    Ok(Json(RatesView {
        interval_ms: INTERVAL.as_millis() as u64,
        samples: state.rates.samples(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_every_label_set_of_each_family() {
        let text = "# HELP herald_publishes_total x\n\
                    # TYPE herald_publishes_total counter\n\
                    herald_publishes_total{result=\"created\"} 7\n\
                    herald_publishes_total{result=\"duplicate\"} 2\n\
                    herald_messages_delivered_total 30\n\
                    herald_lease_renewal_duration_seconds_sum 0.25\n\
                    herald_lease_renewal_duration_seconds_count 5\n\
                    herald_lease_renewal_duration_seconds_bucket{le=\"0.1\"} 5\n\
                    herald_publishes_totalx 100\n";
        assert_eq!(
            Totals::read(text),
            Totals {
                publishes: 9.0,
                delivered: 30.0,
                renewal_seconds: 0.25,
                renewals: 5.0,
            }
        );
    }

    #[test]
    fn only_the_last_samples_are_kept() {
        let rates = Rates::default();
        for i in 0..(KEPT as i64 + 5) {
            rates.push(Sample {
                at_ms: i,
                publishes_per_s: 0.0,
                deliveries_per_s: 0.0,
                renewal_ms: None,
                subscribers: 0,
            });
        }
        let samples = rates.samples();
        assert_eq!(samples.len(), KEPT);
        assert_eq!(samples[0].at_ms, 5);
        assert_eq!(rates.latest().map(|s| s.at_ms), Some(KEPT as i64 + 4));
    }
}
