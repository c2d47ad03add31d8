//! Judges a run: checks a history and the database's final state against
//! Herald's guarantees, and measures availability and recovery times.
//!
//! The guarantees checked (docs/api.md, docs/storage.md):
//!
//! 1. every acknowledged message is stored, at its acknowledged offset,
//!    with its id ([`Violation::AckedNotStored`]);
//! 2. each channel's stored offsets are exactly `earliest..=head`, where
//!    `earliest` is 1 unless retention trimmed the channel (the final
//!    state's `earliest`) ([`Violation::OffsetsNotContiguous`]);
//! 3. no two acknowledgements of different ids name the same channel and
//!    offset ([`Violation::ConflictingAcks`]);
//! 4. each subscriber connection receives every offset after its resume
//!    point exactly once, in order, and each as stored (a message trimmed
//!    since cannot be compared), except the offsets that a `truncated`
//!    announcement skips: accepted only when they are below the announced
//!    earliest, the announcement starts where the connection stood, and
//!    the announced earliest is at most the channel's final earliest (the
//!    node never claims trimmed what is still stored)
//!    ([`Violation::TruncatedWrongly`]); an acknowledged message may be
//!    missing only below the channel's final earliest
//!    ([`Violation::DeliveryGap`], [`Violation::DeliveryDuplicate`],
//!    [`Violation::DeliveryOutOfOrder`], [`Violation::DeliveryMismatch`],
//!    [`Violation::DeliveryWithoutSubscribe`]);
//! 5. fencing tokens never go down along a channel's offsets
//!    ([`Violation::TokenRegression`]);
//! 6. a message whose every attempt was refused definitely is not stored
//!    ([`Violation::RefusedButStored`]);
//! 7. a message whose outcome stayed unknown is stored at most once
//!    ([`Violation::IndeterminateStoredTwice`]);
//! 8. no message is stored under two offsets ([`Violation::DuplicateStored`]),
//!    and nothing is stored that no client published
//!    ([`Violation::UnpublishedStored`]);
//! 9. a lease that expired is lost, never extended: a fencing token that
//!    the lease observer saw expired is never renewed at or after that
//!    expiry ([`Violation::LeaseResurrected`]; needs the history's
//!    [`Event::Lease`] observations).
//!
//! 10. a Centrifugo client's subscriptions (docs/centrifugo.md) keep the
//!     channel's one epoch ([`Violation::EpochChanged`]); a recovery says
//!     `recovered: false` only when the client's resume point is no longer
//!     held, i.e. below the earliest offset that the client's own history
//!     read found right after the reply, and below the channel's final
//!     earliest ([`Violation::NotRecovered`]); a disconnect with 3010
//!     "insufficient state" is followed by at least one such failed
//!     recovery ([`Violation::InsufficientStateWrongly`]). What the client
//!     then receives is judged by (4) like any subscriber's stream: every
//!     offset exactly once, in order, with the gap below the earliest it
//!     found accepted as a `truncated` announcement.
//!
//! One liveness rule is judged too, only away from faults:
//!
//! 11. a live subscription receives every acknowledged message of its
//!     channel within [`STALL_MS`] of the acknowledgement, unless a fault
//!     was near ([`Violation::DeliveryStalled`]).
//!
//! Messages are identified by `(channel, id)`; the id is the unique value a
//! client puts in each message's data and reuses for its retries.

mod bounds;
mod centrifugo;
mod deliveries;
mod lease;
mod measure;
mod record;
mod report;
mod stalls;
mod stored;
mod violation;

use std::collections::BTreeMap;

use crate::history::{Event, FinalState};

pub use bounds::{FAULT_LEAD_MS, FAULT_TAIL_MS, STALL_MS};
pub use centrifugo::CLOSE_INSUFFICIENT_STATE;
pub use measure::BUCKET_MS;
pub use report::{Availability, CentrifugoCounts, Counts, RecoveryStats, Report, RunSettings};
pub use violation::{AckEvidence, OffsetRange, RefusalEvidence, Violation};

use centrifugo::check_centrifugo;
use deliveries::check_deliveries;
use lease::check_lease;
use measure::{availability, counts, recovery};
use record::{Attempt, Store};
use stalls::check_stalls;
use stored::{check_acks, check_offsets, check_stored_ids, check_tokens};

/// Checks a run's history against its final state.
pub fn check(history: &[Event], final_state: &FinalState) -> Report {
    let attempts: Vec<Attempt<'_>> = history
        .iter()
        .filter_map(|event| match event {
            Event::Publish {
                client,
                channel,
                id,
                invoke_ms,
                complete_ms,
                result,
                ..
            } => Some(Attempt {
                client,
                channel,
                id,
                invoke_ms: *invoke_ms,
                complete_ms: (*complete_ms).max(*invoke_ms),
                result,
            }),
            _ => None,
        })
        .collect();
    let store = Store::new(final_state);

    let mut violations = Vec::new();
    check_acks(&attempts, &store, &mut violations);
    check_offsets(&store, &mut violations);
    check_tokens(&store, &mut violations);
    check_stored_ids(&attempts, &store, &mut violations);
    check_deliveries(history, &store, &mut violations);
    check_lease(history, &mut violations);
    check_centrifugo(history, &store, &mut violations);
    check_stalls(history, &attempts, &mut violations);

    let mut violations_by_kind = BTreeMap::new();
    for v in &violations {
        *violations_by_kind.entry(v.kind().to_owned()).or_insert(0) += 1;
    }

    Report {
        valid: violations.is_empty(),
        settings: None,
        counts: counts(history, &attempts, final_state),
        availability: availability(&attempts),
        recovery: recovery(history, &attempts),
        violations_by_kind,
        violations,
    }
}

#[cfg(test)]
mod tests;
