//! The checks of what the database holds against what the publishers
//! were told: guarantees (1), (2), (3), (5), (6), (7) and (8).

use std::collections::BTreeMap;

use crate::history::PublishResult;

use super::record::{Attempt, Store};
use super::violation::{AckEvidence, OffsetRange, RefusalEvidence, Violation};

/// (1) and (3): every acknowledgement is stored where it says, and no
/// offset is acknowledged for two ids.
pub(super) fn check_acks(attempts: &[Attempt<'_>], store: &Store<'_>, out: &mut Vec<Violation>) {
    // (channel, offset) -> id -> clients
    let mut acks: BTreeMap<(&str, u64), BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for a in attempts {
        if let PublishResult::Acked { offset } = a.result {
            let clients = acks
                .entry((a.channel, *offset))
                .or_default()
                .entry(a.id)
                .or_default();
            if !clients.contains(&a.client) {
                clients.push(a.client);
            }
        }
    }
    for ((channel, offset), ids) in acks {
        if ids.len() > 1 {
            let acks = ids
                .iter()
                .flat_map(|(id, clients)| {
                    clients.iter().map(|client| AckEvidence {
                        client: (*client).to_owned(),
                        id: (*id).to_owned(),
                    })
                })
                .collect();
            out.push(Violation::ConflictingAcks {
                channel: channel.to_owned(),
                offset,
                acks,
                stored_id: store.id_at(channel, offset),
            });
            continue;
        }
        for (id, clients) in ids {
            if store.at(channel, offset).iter().any(|m| m.id == id) {
                continue;
            }
            // Trimmed by retention: only ever below the final earliest.
            if offset < store.earliest(channel) {
                continue;
            }
            out.push(Violation::AckedNotStored {
                channel: channel.to_owned(),
                id: id.to_owned(),
                clients: clients.iter().map(|c| (*c).to_owned()).collect(),
                acked_offset: offset,
                stored_id: store.id_at(channel, offset),
                id_stored_at: store.offsets_of(channel, id),
            });
        }
    }
}

/// (2): each channel's offsets are exactly `earliest..=head`.
pub(super) fn check_offsets(store: &Store<'_>, out: &mut Vec<Violation>) {
    for (channel, offsets) in &store.by_offset {
        let head = offsets.keys().next_back().copied().unwrap_or(0);
        let mut missing = Vec::new();
        let mut extra = Vec::new();
        let earliest = store.earliest(channel);
        let mut expected = earliest;
        for (&offset, messages) in offsets {
            if offset < earliest {
                // Stored below the earliest: it should have been trimmed.
                extra.push(offset);
                continue;
            }
            if offset > expected {
                missing.push(OffsetRange {
                    first: expected,
                    last: offset - 1,
                });
            }
            if messages.len() > 1 {
                extra.push(offset);
            }
            expected = offset + 1;
        }
        if !missing.is_empty() || !extra.is_empty() {
            out.push(Violation::OffsetsNotContiguous {
                channel: (*channel).to_owned(),
                head,
                missing,
                extra,
            });
        }
    }
}

/// (5): tokens never go down along a channel's offsets.
pub(super) fn check_tokens(store: &Store<'_>, out: &mut Vec<Violation>) {
    for (channel, offsets) in &store.by_offset {
        let mut highest: Option<(u64, u64)> = None; // (offset, token)
        for (&offset, messages) in offsets {
            for m in messages {
                match highest {
                    Some((previous_offset, previous_token)) if m.token < previous_token => {
                        out.push(Violation::TokenRegression {
                            channel: (*channel).to_owned(),
                            offset,
                            token: m.token,
                            previous_offset,
                            previous_token,
                        });
                    }
                    Some((_, token)) if m.token <= token => {}
                    _ => highest = Some((offset, m.token)),
                }
            }
        }
    }
}

/// (6), (7), (8): what is stored was published, at most once, and not
/// after a definite refusal of every attempt.
pub(super) fn check_stored_ids(
    attempts: &[Attempt<'_>],
    store: &Store<'_>,
    out: &mut Vec<Violation>,
) {
    let mut by_id: BTreeMap<(&str, &str), Vec<&Attempt<'_>>> = BTreeMap::new();
    for a in attempts {
        by_id.entry((a.channel, a.id)).or_default().push(a);
    }
    for (&(channel, id), offsets) in &store.by_id {
        let stored_at: Vec<u64> = offsets.iter().copied().collect();
        let Some(tries) = by_id.get(&(channel, id)) else {
            for &offset in &stored_at {
                out.push(Violation::UnpublishedStored {
                    channel: channel.to_owned(),
                    offset,
                    id: id.to_owned(),
                });
            }
            continue;
        };
        let acked = tries
            .iter()
            .any(|a| matches!(a.result, PublishResult::Acked { .. }));
        let unknown = tries
            .iter()
            .any(|a| matches!(a.result, PublishResult::Indeterminate { .. }));
        if !acked && !unknown {
            // Every attempt was refused definitely; a retry that may have
            // stored it would be acked or indeterminate.
            let refusals = tries
                .iter()
                .filter_map(|a| match a.result {
                    PublishResult::Failed { code } => Some(RefusalEvidence {
                        client: a.client.to_owned(),
                        code: code.clone(),
                    }),
                    _ => None,
                })
                .collect();
            out.push(Violation::RefusedButStored {
                channel: channel.to_owned(),
                id: id.to_owned(),
                refusals,
                stored_at,
            });
        } else if stored_at.len() > 1 {
            if acked {
                out.push(Violation::DuplicateStored {
                    channel: channel.to_owned(),
                    id: id.to_owned(),
                    stored_at,
                });
            } else {
                let mut clients: Vec<String> = tries.iter().map(|a| a.client.to_owned()).collect();
                clients.sort();
                clients.dedup();
                out.push(Violation::IndeterminateStoredTwice {
                    channel: channel.to_owned(),
                    id: id.to_owned(),
                    clients,
                    stored_at,
                });
            }
        }
    }
}
