//! The liveness check (11): a live subscription receives every
//! acknowledged message of its channel within [`STALL_MS`], unless a
//! fault was near.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, PublishResult};

use super::bounds::{FAULT_LEAD_MS, FAULT_TAIL_MS, STALL_MS};
use super::record::Attempt;
use super::violation::Violation;

/// One subscriber connection, for the liveness rule.
struct Connection<'a> {
    subscriber: &'a str,
    node: &'a str,
    channel: &'a str,
    after: u64,
    opened_ms: u64,
    /// When the subscriber's next connection opened, if it did.
    replaced_ms: Option<u64>,
    /// Offset -> when it was first received.
    received: BTreeMap<u64, u64>,
    /// The last `truncated` announcement's earliest, and when it came:
    /// offsets below it count as handed over then (retention removed
    /// them).
    truncated_below: Option<(u64, u64)>,
}

/// The faults, each widened to `[start - FAULT_LEAD_MS, end +
/// FAULT_TAIL_MS]`, merged into disjoint windows in time order.
fn fault_windows(history: &[Event]) -> Vec<(u64, u64)> {
    let mut windows: Vec<(u64, u64)> = history
        .iter()
        .filter_map(|e| match e {
            Event::Fault {
                start_ms, end_ms, ..
            } => Some((
                start_ms.saturating_sub(FAULT_LEAD_MS),
                (*start_ms).max(*end_ms).saturating_add(FAULT_TAIL_MS),
            )),
            _ => None,
        })
        .collect();
    windows.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(windows.len());
    for (lo, hi) in windows {
        match merged.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// Whether a merged fault window meets `[from, to]`.
fn fault_near(windows: &[(u64, u64)], from: u64, to: u64) -> bool {
    // The first window that does not end before `from`; windows are
    // disjoint and sorted, so their ends are sorted too.
    let i = windows.partition_point(|&(_, hi)| hi < from);
    windows.get(i).is_some_and(|&(lo, _)| lo <= to)
}

/// (10): away from faults, a live connection receives every acknowledged
/// offset of its channel within [`STALL_MS`] of its acknowledgement.
pub(super) fn check_stalls(history: &[Event], attempts: &[Attempt<'_>], out: &mut Vec<Violation>) {
    let end_ms = history.iter().map(Event::last_ms).max().unwrap_or(0);
    let windows = fault_windows(history);
    // Per channel, every acknowledgement as (completed, offset), in time
    // order.
    let mut acks: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for a in attempts {
        if let PublishResult::Acked { offset } = a.result {
            acks.entry(a.channel)
                .or_default()
                .push((a.complete_ms, *offset));
        }
    }
    for list in acks.values_mut() {
        list.sort_unstable();
    }
    let mut connections: Vec<Connection<'_>> = Vec::new();
    let mut current: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for event in history {
        match event {
            Event::Subscribe {
                subscriber,
                node,
                channel,
                after,
                at_ms,
            } => {
                let key = (subscriber.as_str(), channel.as_str());
                if let Some(&previous) = current.get(&key) {
                    connections[previous].replaced_ms = Some(*at_ms);
                }
                current.insert(key, connections.len());
                connections.push(Connection {
                    subscriber,
                    node,
                    channel,
                    after: *after,
                    opened_ms: *at_ms,
                    replaced_ms: None,
                    received: BTreeMap::new(),
                    truncated_below: None,
                });
            }
            Event::Delivery {
                subscriber,
                channel,
                offset,
                at_ms,
                ..
            } => {
                if let Some(&i) = current.get(&(subscriber.as_str(), channel.as_str())) {
                    connections[i].received.entry(*offset).or_insert(*at_ms);
                }
            }
            Event::Truncated {
                subscriber,
                channel,
                earliest,
                at_ms,
                ..
            } => {
                if let Some(&i) = current.get(&(subscriber.as_str(), channel.as_str())) {
                    connections[i].truncated_below = Some((*earliest, *at_ms));
                }
            }
            _ => {}
        }
    }
    for c in &connections {
        let Some(list) = acks.get(c.channel) else {
            continue;
        };
        let first = list.partition_point(|&(t, _)| t < c.opened_ms);
        let mut missed: BTreeSet<u64> = BTreeSet::new();
        let mut first_missed: Option<(u64, u64)> = None;
        for &(acked_ms, offset) in &list[first..] {
            let due_ms = acked_ms.saturating_add(STALL_MS);
            // Replaced before the deadline, or the history ends before it:
            // nothing to judge from here on (acks are in time order).
            if c.replaced_ms.is_some_and(|r| r < due_ms) || end_ms <= due_ms {
                break;
            }
            if offset <= c.after || fault_near(&windows, acked_ms, due_ms) {
                continue;
            }
            if c.received.get(&offset).is_some_and(|&at| at <= due_ms) {
                continue;
            }
            if c.truncated_below
                .is_some_and(|(earliest, at)| offset < earliest && at <= due_ms)
            {
                continue;
            }
            if missed.insert(offset) && first_missed.is_none() {
                first_missed = Some((offset, acked_ms));
            }
        }
        if let Some((offset, acked_ms)) = first_missed {
            out.push(Violation::DeliveryStalled {
                subscriber: c.subscriber.to_owned(),
                node: c.node.to_owned(),
                channel: c.channel.to_owned(),
                after: c.after,
                subscribed_at_ms: c.opened_ms,
                first_missed: offset,
                acked_at_ms: acked_ms,
                missed: missed.len(),
            });
        }
    }
}
