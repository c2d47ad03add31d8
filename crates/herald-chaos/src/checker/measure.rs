//! The run's measures for the report: what happened (counts), how
//! available publishing was, and how fast publishes succeeded again after
//! each fault.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, FinalState, PublishResult};

use super::record::Attempt;
use super::report::{Availability, CentrifugoCounts, Counts, RecoveryStats};

/// Width of one availability bucket.
pub const BUCKET_MS: u64 = 100;

pub(super) fn counts(history: &[Event], attempts: &[Attempt<'_>], state: &FinalState) -> Counts {
    let mut c = Counts {
        publishes: attempts.len(),
        channels: state.channels.len(),
        stored: state.channels.values().map(Vec::len).sum(),
        lease_acquisitions: state.lease_history.as_ref().map(Vec::len),
        run_ms: history.iter().map(Event::last_ms).max().unwrap_or(0),
        ..Counts::default()
    };
    let mut messages = BTreeSet::new();
    for a in attempts {
        messages.insert((a.channel, a.id));
        match a.result {
            PublishResult::Acked { .. } => c.acked += 1,
            PublishResult::Failed { .. } => c.failed += 1,
            PublishResult::Indeterminate { .. } => c.indeterminate += 1,
        }
    }
    c.messages = messages.len();
    for event in history {
        match event {
            Event::Subscribe { .. } => c.subscribes += 1,
            Event::Delivery { .. } => c.deliveries += 1,
            Event::Fault { .. } => c.faults += 1,
            Event::Takeover { .. } => c.takeovers += 1,
            Event::Lease { .. } => c.lease_observations += 1,
            Event::Truncated { .. } => c.truncations += 1,
            Event::Publish { .. }
            | Event::CentrifugoSubscribed { .. }
            | Event::CentrifugoHistory { .. }
            | Event::CentrifugoClosed { .. } => {}
        }
    }
    c.centrifugo = centrifugo_counts(history);
    c.lease_tokens = history
        .iter()
        .filter_map(|e| match e {
            Event::Lease { token, .. } => Some(*token),
            _ => None,
        })
        .collect::<BTreeSet<u64>>()
        .len();
    c
}

pub(super) fn centrifugo_counts(history: &[Event]) -> CentrifugoCounts {
    let mut z = CentrifugoCounts::default();
    let mut subscribers = BTreeSet::new();
    for event in history {
        match event {
            Event::CentrifugoSubscribed {
                subscriber,
                recover_from,
                recovered,
                publications,
                ..
            } => {
                subscribers.insert(subscriber.as_str());
                z.subscribes += 1;
                match (recover_from, recovered) {
                    (None, _) => z.first_subscribes += 1,
                    (Some(_), true) => {
                        z.recovered += 1;
                        z.recovered_publications += publications;
                    }
                    (Some(_), false) => z.not_recovered += 1,
                }
            }
            Event::CentrifugoHistory { .. } => z.history_reloads += 1,
            Event::CentrifugoClosed { code, pongs, .. } => {
                z.connections += 1;
                z.pongs += pongs;
                let code = code.map_or_else(|| "none".to_owned(), |c| c.to_string());
                *z.closes.entry(code).or_insert(0) += 1;
            }
            _ => {}
        }
    }
    z.deliveries = history
        .iter()
        .filter(|e| matches!(e, Event::Delivery { subscriber, .. } if subscribers.contains(subscriber.as_str())))
        .count();
    z
}

pub(super) fn availability(attempts: &[Attempt<'_>]) -> Availability {
    let mut attempted = BTreeSet::new();
    let mut available = BTreeSet::new();
    for a in attempts {
        attempted.extend(a.invoke_ms / BUCKET_MS..=a.complete_ms / BUCKET_MS);
        if matches!(a.result, PublishResult::Acked { .. }) {
            available.insert(a.complete_ms / BUCKET_MS);
        }
    }
    let mut longest = 0u64;
    let mut current = 0u64;
    let mut previous: Option<u64> = None;
    for &bucket in &attempted {
        if previous.is_some_and(|p| p + 1 != bucket) {
            current = 0;
        }
        if available.contains(&bucket) {
            current = 0;
        } else {
            current += 1;
            longest = longest.max(current);
        }
        previous = Some(bucket);
    }
    let buckets_attempted = attempted.len() as u64;
    let buckets_available = available.len() as u64;
    Availability {
        bucket_ms: BUCKET_MS,
        buckets_attempted,
        buckets_available,
        ratio: (buckets_attempted > 0).then(|| buckets_available as f64 / buckets_attempted as f64),
        longest_outage_ms: longest * BUCKET_MS,
    }
}

pub(super) fn recovery(
    history: &[Event],
    attempts: &[Attempt<'_>],
) -> BTreeMap<String, RecoveryStats> {
    let mut times: BTreeMap<&str, (usize, Vec<u64>)> = BTreeMap::new();
    for event in history {
        let Event::Fault { kind, start_ms, .. } = event else {
            continue;
        };
        let first_ack = attempts
            .iter()
            .filter(|a| a.invoke_ms >= *start_ms && matches!(a.result, PublishResult::Acked { .. }))
            .map(|a| a.complete_ms)
            .min();
        let entry = times.entry(kind).or_default();
        entry.0 += 1;
        if let Some(done) = first_ack {
            entry.1.push(done - start_ms);
        }
    }
    times
        .into_iter()
        .map(|(kind, (faults, mut ms))| {
            ms.sort_unstable();
            let median = match ms.len() {
                0 => None,
                n if n % 2 == 1 => Some(ms[n / 2]),
                n => Some((ms[n / 2 - 1] + ms[n / 2]) / 2),
            };
            let stats = RecoveryStats {
                faults,
                recovered: ms.len(),
                min_ms: ms.first().copied(),
                median_ms: median,
                max_ms: ms.last().copied(),
            };
            (kind.to_owned(), stats)
        })
        .collect()
}
