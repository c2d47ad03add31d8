//! The check of what each subscriber connection received: guarantee (4),
//! every offset after its resume point exactly once, in order, as stored,
//! and the `truncated` announcements that skip offsets.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::Event;

use super::record::Store;
use super::violation::{OffsetRange, Violation};

/// One subscriber connection in progress.
struct Segment<'a> {
    node: &'a str,
    after: u64,
    /// The next offset this connection should receive.
    expected: u64,
    received: BTreeSet<u64>,
}

/// (4): each connection receives `after+1, after+2, ...` exactly once, in
/// order, each as stored.
pub(super) fn check_deliveries(history: &[Event], store: &Store<'_>, out: &mut Vec<Violation>) {
    let mut segments: BTreeMap<(&str, &str), Segment<'_>> = BTreeMap::new();
    for event in history {
        match event {
            Event::Subscribe {
                subscriber,
                node,
                channel,
                after,
                ..
            } => {
                segments.insert(
                    (subscriber, channel),
                    Segment {
                        node,
                        after: *after,
                        expected: after.saturating_add(1),
                        received: BTreeSet::new(),
                    },
                );
            }
            Event::Truncated {
                subscriber,
                node,
                channel,
                requested_after,
                earliest,
                ..
            } => {
                let Some(segment) = segments.get_mut(&(subscriber.as_str(), channel.as_str()))
                else {
                    continue;
                };
                let position = segment.expected.saturating_sub(1);
                let final_earliest = store.earliest(channel);
                if *requested_after != position || *earliest > final_earliest {
                    out.push(Violation::TruncatedWrongly {
                        subscriber: subscriber.clone(),
                        node: node.clone(),
                        channel: channel.clone(),
                        position,
                        requested_after: *requested_after,
                        earliest: *earliest,
                        final_earliest,
                    });
                }
                // The skipped offsets are accepted, below the announced
                // earliest only.
                segment.expected = segment.expected.max(*earliest);
            }
            Event::Delivery {
                subscriber,
                node,
                channel,
                offset,
                id,
                ..
            } => {
                let offset = *offset;
                let Some(segment) = segments.get_mut(&(subscriber.as_str(), channel.as_str()))
                else {
                    out.push(Violation::DeliveryWithoutSubscribe {
                        subscriber: subscriber.clone(),
                        node: node.clone(),
                        channel: channel.clone(),
                        offset,
                    });
                    continue;
                };
                if segment.received.contains(&offset) {
                    out.push(Violation::DeliveryDuplicate {
                        subscriber: subscriber.clone(),
                        node: segment.node.to_owned(),
                        channel: channel.clone(),
                        after: segment.after,
                        offset,
                    });
                } else if offset < segment.expected {
                    out.push(Violation::DeliveryOutOfOrder {
                        subscriber: subscriber.clone(),
                        node: segment.node.to_owned(),
                        channel: channel.clone(),
                        after: segment.after,
                        offset,
                        previous: segment.expected - 1,
                    });
                } else {
                    if offset > segment.expected {
                        out.push(Violation::DeliveryGap {
                            subscriber: subscriber.clone(),
                            node: segment.node.to_owned(),
                            channel: channel.clone(),
                            after: segment.after,
                            missing: OffsetRange {
                                first: segment.expected,
                                last: offset - 1,
                            },
                        });
                    }
                    segment.expected = offset.saturating_add(1);
                }
                segment.received.insert(offset);
                let stored = store.at(channel, offset);
                // A message trimmed since cannot be compared.
                let trimmed = offset < store.earliest(channel);
                if !trimmed && !stored.iter().any(|m| m.id == *id) {
                    out.push(Violation::DeliveryMismatch {
                        subscriber: subscriber.clone(),
                        node: segment.node.to_owned(),
                        channel: channel.clone(),
                        offset,
                        delivered_id: id.clone(),
                        stored_id: stored.first().map(|m| m.id.clone()),
                    });
                }
            }
            _ => {}
        }
    }
}
