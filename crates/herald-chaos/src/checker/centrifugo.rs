//! The checks of the Centrifugo clients' subscriptions: guarantee (10),
//! one epoch per channel, recoveries refused only when the resume point
//! is gone, and disconnects with 3010 "insufficient state" only then.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::Event;

use super::record::Store;
use super::violation::Violation;

/// A `recovered: false` waiting for the client's history read.
struct Refusal<'a> {
    node: &'a str,
    resume_after: u64,
    head: u64,
}

/// A 3010 close waiting for the client's next subscribes.
struct Insufficient<'a> {
    node: &'a str,
    closed_at_ms: u64,
    channels: &'a [String],
    /// The channels whose next subscribe recovered from where the client
    /// stood.
    recovered: BTreeSet<&'a str>,
}

/// (10): Centrifugo's epoch, `recovered: false` and 3010 "insufficient
/// state", judged from what the clients saw and the final earliest
/// offsets.
pub(super) fn check_centrifugo(history: &[Event], store: &Store<'_>, out: &mut Vec<Violation>) {
    let mut epochs: BTreeMap<&str, &str> = BTreeMap::new();
    let mut reported: BTreeSet<(&str, &str)> = BTreeSet::new();
    // Judged when the client's history read comes, or without it (with
    // the final earliest only) when the connection goes on otherwise.
    let mut refusals: BTreeMap<(&str, &str), Refusal<'_>> = BTreeMap::new();
    let judge = |key: (&str, &str), r: Refusal<'_>, read: Option<u64>, out: &mut Vec<Violation>| {
        let earliest = read.map_or(store.earliest(key.1), |e| e.min(store.earliest(key.1)));
        if r.resume_after.saturating_add(1) >= earliest {
            out.push(Violation::NotRecovered {
                subscriber: key.0.to_owned(),
                node: r.node.to_owned(),
                channel: key.1.to_owned(),
                resume_after: r.resume_after,
                head: r.head,
                earliest,
            });
        }
    };
    let mut insufficient: BTreeMap<&str, Insufficient<'_>> = BTreeMap::new();
    for event in history {
        match event {
            Event::CentrifugoSubscribed {
                subscriber,
                node,
                channel,
                recover_from,
                recovered,
                epoch,
                offset,
                ..
            } => {
                let key = (subscriber.as_str(), channel.as_str());
                if let Some(r) = refusals.remove(&key) {
                    judge(key, r, None, out);
                }
                check_epoch(
                    &mut epochs,
                    &mut reported,
                    (subscriber, node, channel, epoch),
                    out,
                );
                if let Some(from) = recover_from {
                    if !recovered && from.epoch == *epoch {
                        refusals.insert(
                            key,
                            Refusal {
                                node,
                                resume_after: from.offset,
                                head: *offset,
                            },
                        );
                    }
                }
                if let Some(pending) = insufficient.get_mut(subscriber.as_str()) {
                    if pending.channels.contains(channel) {
                        match recover_from {
                            Some(_) if *recovered => {
                                pending.recovered.insert(channel);
                            }
                            // A failed recovery bears the close out; a
                            // subscribe without a resume point says nothing.
                            _ => {
                                insufficient.remove(subscriber.as_str());
                            }
                        }
                    }
                }
                if let Some(pending) = insufficient.get(subscriber.as_str()) {
                    if pending.recovered.len() == pending.channels.len() {
                        out.push(Violation::InsufficientStateWrongly {
                            subscriber: subscriber.clone(),
                            node: pending.node.to_owned(),
                            channels: pending.channels.to_vec(),
                            closed_at_ms: pending.closed_at_ms,
                        });
                        insufficient.remove(subscriber.as_str());
                    }
                }
            }
            Event::CentrifugoHistory {
                subscriber,
                node,
                channel,
                first,
                offset,
                epoch,
                ..
            } => {
                check_epoch(
                    &mut epochs,
                    &mut reported,
                    (subscriber, node, channel, epoch),
                    out,
                );
                let key = (subscriber.as_str(), channel.as_str());
                if let Some(r) = refusals.remove(&key) {
                    // An empty history holds nothing up to its head.
                    let read = first.unwrap_or(offset.saturating_add(1));
                    judge(key, r, Some(read), out);
                }
            }
            Event::CentrifugoClosed {
                subscriber,
                node,
                channels,
                code,
                at_ms,
                ..
            } => {
                for channel in channels {
                    let key = (subscriber.as_str(), channel.as_str());
                    if let Some(r) = refusals.remove(&key) {
                        judge(key, r, None, out);
                    }
                }
                // A later close before the client recovered every channel
                // leaves the earlier one undecided.
                insufficient.remove(subscriber.as_str());
                if *code == Some(CLOSE_INSUFFICIENT_STATE) && !channels.is_empty() {
                    insufficient.insert(
                        subscriber,
                        Insufficient {
                            node,
                            closed_at_ms: *at_ms,
                            channels,
                            recovered: BTreeSet::new(),
                        },
                    );
                }
            }
            _ => {}
        }
    }
    for (key, r) in refusals {
        judge(key, r, None, out);
    }
}

/// Centrifugo's disconnect code 3010 "insufficient state" (Centrifugo's
/// documentation, "Error and disconnect codes").
pub const CLOSE_INSUFFICIENT_STATE: u16 = 3010;

/// The epoch rule of (10) for one answer `(subscriber, node, channel,
/// epoch)`: the first epoch seen for a channel is its epoch.
fn check_epoch<'a>(
    epochs: &mut BTreeMap<&'a str, &'a str>,
    reported: &mut BTreeSet<(&'a str, &'a str)>,
    (subscriber, node, channel, epoch): (&'a str, &'a str, &'a str, &'a str),
    out: &mut Vec<Violation>,
) {
    let first = *epochs.entry(channel).or_insert(epoch);
    if first != epoch && reported.insert((channel, epoch)) {
        out.push(Violation::EpochChanged {
            subscriber: subscriber.to_owned(),
            node: node.to_owned(),
            channel: channel.to_owned(),
            epoch: epoch.to_owned(),
            first_epoch: first.to_owned(),
        });
    }
}
