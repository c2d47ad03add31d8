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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::history::{Event, FinalState, PublishResult, StoredMessage};

/// Width of one availability bucket.
pub const BUCKET_MS: u64 = 100;

/// How long a live subscription may take to receive an acknowledged
/// message when no fault is near ([`Violation::DeliveryStalled`]): three
/// times a standby's 1 s safety poll, the slowest way a correct node learns
/// of a commit. The runner's subscribers reconnect only after 5 s of
/// silence, so a connection that stalls from its start is judged for the
/// acknowledgements of its first 2 s.
pub const STALL_MS: u64 = 3000;

/// A fault is near an acknowledgement when the fault, widened by this much
/// before its start and [`FAULT_TAIL_MS`] after its end, meets the
/// acknowledgement's [`STALL_MS`] window.
pub const FAULT_LEAD_MS: u64 = 1000;

/// See [`FAULT_LEAD_MS`]: the time after a fault's end in which the
/// cluster may still be recovering from it.
pub const FAULT_TAIL_MS: u64 = 5000;

/// An inclusive range of offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRange {
    /// The first offset of the range.
    pub first: u64,
    /// The last offset of the range (inclusive).
    pub last: u64,
}

impl fmt::Display for OffsetRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}..={}", self.first, self.last)
        }
    }
}

/// One acknowledgement, as evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckEvidence {
    /// The client that got it.
    pub client: String,
    /// The id it acknowledged.
    pub id: String,
}

/// One definite refusal, as evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalEvidence {
    /// The client that got it.
    pub client: String,
    /// The error code.
    pub code: String,
}

/// A broken guarantee, with its evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Violation {
    /// (1) A message was acknowledged at an offset that does not hold it.
    AckedNotStored {
        /// The channel.
        channel: String,
        /// The acknowledged message.
        id: String,
        /// The clients that got the acknowledgement.
        clients: Vec<String>,
        /// The offset in the acknowledgement.
        acked_offset: u64,
        /// What is stored at that offset instead, if anything.
        stored_id: Option<String>,
        /// The offsets where the id is stored, if anywhere.
        id_stored_at: Vec<u64>,
    },
    /// (2) A channel's stored offsets are not exactly `1..=head`.
    OffsetsNotContiguous {
        /// The channel.
        channel: String,
        /// Its highest stored offset.
        head: u64,
        /// Offsets below the head with no message.
        missing: Vec<OffsetRange>,
        /// Offsets holding more than one message, and offset 0 if used.
        extra: Vec<u64>,
    },
    /// (4) A `truncated` announcement that retention cannot explain: it
    /// does not start where the connection stood, or it announces an
    /// earliest offset beyond the channel's final earliest (messages it
    /// skipped are still stored).
    TruncatedWrongly {
        /// The subscriber.
        subscriber: String,
        /// The node the connection was open to.
        node: String,
        /// The channel.
        channel: String,
        /// The offset the connection had reached (its next expected
        /// offset minus one).
        position: u64,
        /// The announcement's `requested_after`.
        requested_after: u64,
        /// The announcement's `earliest`.
        earliest: u64,
        /// The channel's earliest offset after the run.
        final_earliest: u64,
    },
    /// (3) Different messages were acknowledged at the same offset.
    ConflictingAcks {
        /// The channel.
        channel: String,
        /// The shared offset.
        offset: u64,
        /// Every acknowledgement naming it.
        acks: Vec<AckEvidence>,
        /// What is stored there, if anything.
        stored_id: Option<String>,
    },
    /// (4) A subscriber connection skipped offsets.
    DeliveryGap {
        /// The subscriber.
        subscriber: String,
        /// The node it was connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The connection's resume point.
        after: u64,
        /// The offsets it never received before a later one.
        missing: OffsetRange,
    },
    /// (4) A subscriber connection received an offset twice.
    DeliveryDuplicate {
        /// The subscriber.
        subscriber: String,
        /// The node it was connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The connection's resume point.
        after: u64,
        /// The offset received again.
        offset: u64,
    },
    /// (4) A subscriber connection received an offset at or below its
    /// resume point, or after a higher one, without having received it
    /// before.
    DeliveryOutOfOrder {
        /// The subscriber.
        subscriber: String,
        /// The node it was connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The connection's resume point.
        after: u64,
        /// The offset received.
        offset: u64,
        /// The highest offset received before it on this connection (or
        /// the resume point).
        previous: u64,
    },
    /// (4) A delivered message is not the one stored at its offset.
    DeliveryMismatch {
        /// The subscriber.
        subscriber: String,
        /// The node it was connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The offset.
        offset: u64,
        /// The id delivered.
        delivered_id: String,
        /// The id stored there, if anything.
        stored_id: Option<String>,
    },
    /// (4) A delivery arrived for a subscriber and channel with no
    /// `Subscribe` before it (a malformed history).
    DeliveryWithoutSubscribe {
        /// The subscriber.
        subscriber: String,
        /// The node it came from.
        node: String,
        /// The channel.
        channel: String,
        /// The offset.
        offset: u64,
    },
    /// (5) A message carries a lower fencing token than one stored at a
    /// lower offset.
    TokenRegression {
        /// The channel.
        channel: String,
        /// The offset with the lower token.
        offset: u64,
        /// Its token.
        token: u64,
        /// The lower offset with the highest token before it.
        previous_offset: u64,
        /// That token.
        previous_token: u64,
    },
    /// (6) A message whose every attempt was refused definitely is stored.
    RefusedButStored {
        /// The channel.
        channel: String,
        /// The message.
        id: String,
        /// Every refusal it got.
        refusals: Vec<RefusalEvidence>,
        /// Where it is stored.
        stored_at: Vec<u64>,
    },
    /// (7) A message never acknowledged, with an unknown outcome, is stored
    /// more than once.
    IndeterminateStoredTwice {
        /// The channel.
        channel: String,
        /// The message.
        id: String,
        /// The clients that tried it.
        clients: Vec<String>,
        /// Where it is stored.
        stored_at: Vec<u64>,
    },
    /// (8) An acknowledged message is stored under more than one offset.
    DuplicateStored {
        /// The channel.
        channel: String,
        /// The message.
        id: String,
        /// Where it is stored.
        stored_at: Vec<u64>,
    },
    /// (8) A stored message that no client published on this channel.
    UnpublishedStored {
        /// The channel.
        channel: String,
        /// Its offset.
        offset: u64,
        /// Its id.
        id: String,
    },
    /// (9) A renewal extended an expired lease: the lease observer saw a
    /// fencing token expired (its row's `expires_at` at or before the
    /// database's clock) and later saw the same token in a row whose
    /// `renewed_at` is at or after that expiry. docs/storage.md: a lease
    /// that expired is lost, never extended; every acquisition (also a
    /// takeover of an expired lease and a "reclaimed" one) takes a new
    /// token, and a release keeps the token but leaves it expired for good.
    ///
    /// Judged on the database's own times, not on the order of the
    /// observations: a renewal that decided just before the expiry (its
    /// `renewed_at` is earlier) but whose commit became visible just after
    /// an observation of the expired row is correct, and is not reported.
    /// One violation per token.
    LeaseResurrected {
        /// The token.
        token: u64,
        /// The holder in the unexpired observation.
        holder: Option<String>,
        /// The first observation of the token expired.
        expired_at_ms: u64,
        /// The first observation of a renewal of it at or after that
        /// expiry.
        unexpired_at_ms: u64,
        /// The expiry seen passed, µs since the Unix epoch (database clock).
        expires_at_us: i64,
        /// When the late renewal decided, µs since the Unix epoch
        /// (database clock).
        renewed_at_us: i64,
    },
    /// (10) A Centrifugo subscribe reply or history read names another
    /// epoch than the first one a client saw for the channel. Every node
    /// shares one database, where a channel's epoch is fixed and never
    /// changes (docs/centrifugo.md, "Epochs and recovery that never
    /// lies"). One violation per channel and epoch.
    EpochChanged {
        /// The subscriber that saw it.
        subscriber: String,
        /// The node that answered.
        node: String,
        /// The channel.
        channel: String,
        /// The epoch in the answer.
        epoch: String,
        /// The first epoch seen for the channel.
        first_epoch: String,
    },
    /// (10) A Centrifugo recovery answered `recovered: false` in the
    /// channel's epoch although the client's resume point was still held:
    /// the offset after it is at or above the earliest offset the client's
    /// own history read found right after the reply (retention only ever
    /// moves the earliest offset up, so it was held when the node decided),
    /// or at or above the channel's final earliest.
    NotRecovered {
        /// The subscriber.
        subscriber: String,
        /// The node that answered.
        node: String,
        /// The channel.
        channel: String,
        /// The offset the client asked to recover after.
        resume_after: u64,
        /// The reply's offset (the channel's head).
        head: u64,
        /// The lowest earliest offset known after the reply: the client's
        /// history read, or the channel's final earliest.
        earliest: u64,
    },
    /// (10) A Centrifugo connection was closed with 3010 "insufficient
    /// state" (retention removed what a subscription had not delivered),
    /// yet the client's next subscribe to each of its channels recovered
    /// every publication after the offset it had reached: nothing it
    /// needed had been removed.
    InsufficientStateWrongly {
        /// The subscriber.
        subscriber: String,
        /// The node that closed the connection.
        node: String,
        /// The channels subscribed on the connection.
        channels: Vec<String>,
        /// When the connection was closed.
        closed_at_ms: u64,
    },
    /// (11) Liveness, judged only away from faults: a subscriber connection
    /// did not receive acknowledged messages of its channel within
    /// [`STALL_MS`] of their acknowledgement.
    ///
    /// An acknowledgement (completed at `t`, offset above the connection's
    /// resume point) is judged for a connection when the connection was
    /// opened at or before `t`, was not replaced by the subscriber's next
    /// connection before `t + STALL_MS`, the history goes on past
    /// `t + STALL_MS`, and no fault is near: none whose
    /// `[start - FAULT_LEAD_MS, end + FAULT_TAIL_MS]` meets
    /// `[t, t + STALL_MS]`. The connection must then have received that
    /// offset by `t + STALL_MS`. During and after faults, delays are
    /// expected and only the safety rules apply. Away from them a correct
    /// node delivers at once: the holder from its own commits, a standby as
    /// soon as the database's change notice arrives, or at worst at its
    /// 1 s safety poll; [`STALL_MS`] (3 s) is well beyond both. One
    /// violation per connection.
    DeliveryStalled {
        /// The subscriber.
        subscriber: String,
        /// The node the connection was open to.
        node: String,
        /// The channel.
        channel: String,
        /// The connection's resume point.
        after: u64,
        /// When the connection was opened.
        subscribed_at_ms: u64,
        /// The first missed offset (in acknowledgement order).
        first_missed: u64,
        /// When `first_missed` was acknowledged.
        acked_at_ms: u64,
        /// How many distinct offsets the connection missed.
        missed: usize,
    },
}

impl Violation {
    /// The violation's kind, as in its JSON `kind` field.
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::AckedNotStored { .. } => "acked_not_stored",
            Violation::OffsetsNotContiguous { .. } => "offsets_not_contiguous",
            Violation::ConflictingAcks { .. } => "conflicting_acks",
            Violation::DeliveryGap { .. } => "delivery_gap",
            Violation::DeliveryDuplicate { .. } => "delivery_duplicate",
            Violation::DeliveryOutOfOrder { .. } => "delivery_out_of_order",
            Violation::DeliveryMismatch { .. } => "delivery_mismatch",
            Violation::DeliveryWithoutSubscribe { .. } => "delivery_without_subscribe",
            Violation::TokenRegression { .. } => "token_regression",
            Violation::RefusedButStored { .. } => "refused_but_stored",
            Violation::IndeterminateStoredTwice { .. } => "indeterminate_stored_twice",
            Violation::DuplicateStored { .. } => "duplicate_stored",
            Violation::UnpublishedStored { .. } => "unpublished_stored",
            Violation::LeaseResurrected { .. } => "lease_resurrected",
            Violation::DeliveryStalled { .. } => "delivery_stalled",
            Violation::TruncatedWrongly { .. } => "truncated_wrongly",
            Violation::EpochChanged { .. } => "epoch_changed",
            Violation::NotRecovered { .. } => "not_recovered",
            Violation::InsufficientStateWrongly { .. } => "insufficient_state_wrongly",
        }
    }
}

fn opt(id: &Option<String>) -> &str {
    id.as_deref().unwrap_or("nothing")
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind())?;
        match self {
            Violation::AckedNotStored {
                channel,
                id,
                clients,
                acked_offset,
                stored_id,
                id_stored_at,
            } => write!(
                f,
                "{channel}/{id} acked at {acked_offset} to {}; stored there: {}; id stored at [{}]",
                list(clients),
                opt(stored_id),
                list(id_stored_at)
            ),
            Violation::TruncatedWrongly {
                subscriber,
                node,
                channel,
                position,
                requested_after,
                earliest,
                final_earliest,
            } => write!(
                f,
                "{subscriber} on {node}, {channel}: truncated from {requested_after} to {earliest} \
                 at position {position}; the channel's final earliest is {final_earliest}"
            ),
            Violation::OffsetsNotContiguous {
                channel,
                head,
                missing,
                extra,
            } => write!(
                f,
                "{channel} head {head}: missing [{}], extra [{}]",
                list(missing),
                list(extra)
            ),
            Violation::ConflictingAcks {
                channel,
                offset,
                acks,
                stored_id,
            } => {
                let acks: Vec<String> = acks
                    .iter()
                    .map(|a| format!("{}@{}", a.id, a.client))
                    .collect();
                write!(
                    f,
                    "{channel}@{offset} acked for [{}]; stored: {}",
                    acks.join(","),
                    opt(stored_id)
                )
            }
            Violation::DeliveryGap {
                subscriber,
                node,
                channel,
                after,
                missing,
            } => write!(
                f,
                "{subscriber} on {node} {channel} after {after}: skipped {missing}"
            ),
            Violation::DeliveryDuplicate {
                subscriber,
                node,
                channel,
                after,
                offset,
            } => write!(
                f,
                "{subscriber} on {node} {channel} after {after}: {offset} again"
            ),
            Violation::DeliveryOutOfOrder {
                subscriber,
                node,
                channel,
                after,
                offset,
                previous,
            } => write!(
                f,
                "{subscriber} on {node} {channel} after {after}: {offset} after {previous}"
            ),
            Violation::DeliveryMismatch {
                subscriber,
                node,
                channel,
                offset,
                delivered_id,
                stored_id,
            } => write!(
                f,
                "{subscriber} on {node} got {channel}@{offset}={delivered_id}; stored: {}",
                opt(stored_id)
            ),
            Violation::DeliveryWithoutSubscribe {
                subscriber,
                node,
                channel,
                offset,
            } => write!(f, "{subscriber} on {node} got {channel}@{offset}"),
            Violation::TokenRegression {
                channel,
                offset,
                token,
                previous_offset,
                previous_token,
            } => write!(
                f,
                "{channel}@{offset} token {token} < {channel}@{previous_offset} token {previous_token}"
            ),
            Violation::RefusedButStored {
                channel,
                id,
                refusals,
                stored_at,
            } => {
                let refusals: Vec<String> = refusals
                    .iter()
                    .map(|r| format!("{}@{}", r.code, r.client))
                    .collect();
                write!(
                    f,
                    "{channel}/{id} refused [{}] but stored at [{}]",
                    refusals.join(","),
                    list(stored_at)
                )
            }
            Violation::IndeterminateStoredTwice {
                channel,
                id,
                clients,
                stored_at,
            } => write!(
                f,
                "{channel}/{id} (tried by {}) stored at [{}]",
                list(clients),
                list(stored_at)
            ),
            Violation::DuplicateStored {
                channel,
                id,
                stored_at,
            } => write!(f, "{channel}/{id} stored at [{}]", list(stored_at)),
            Violation::UnpublishedStored {
                channel,
                offset,
                id,
            } => write!(f, "{channel}@{offset}={id} was never published"),
            Violation::LeaseResurrected {
                token,
                holder,
                expired_at_ms,
                unexpired_at_ms,
                expires_at_us,
                renewed_at_us,
            } => write!(
                f,
                "token {token} seen expired at {expired_at_ms} ms, renewed {} ms after its \
                 expiry (holder {}), seen at {unexpired_at_ms} ms",
                renewed_at_us.saturating_sub(*expires_at_us) / 1000,
                opt(holder)
            ),
            Violation::EpochChanged {
                subscriber,
                node,
                channel,
                epoch,
                first_epoch,
            } => write!(
                f,
                "{subscriber} on {node} {channel}: epoch {epoch}, first seen {first_epoch}"
            ),
            Violation::NotRecovered {
                subscriber,
                node,
                channel,
                resume_after,
                head,
                earliest,
            } => write!(
                f,
                "{subscriber} on {node} {channel}: recovered false after {resume_after} \
                 (head {head}), but the earliest offset held was at most {earliest}"
            ),
            Violation::InsufficientStateWrongly {
                subscriber,
                node,
                channels,
                closed_at_ms,
            } => write!(
                f,
                "{subscriber} closed by {node} with 3010 at {closed_at_ms} ms, then recovered \
                 [{}] from where it stood",
                channels.join(",")
            ),
            Violation::DeliveryStalled {
                subscriber,
                node,
                channel,
                after,
                subscribed_at_ms,
                first_missed,
                acked_at_ms,
                missed,
            } => write!(
                f,
                "{subscriber} on {node} {channel} after {after} (opened at \
                 {subscribed_at_ms} ms): {missed} acked offsets not received within \
                 {STALL_MS} ms, first {first_missed} acked at {acked_at_ms} ms"
            ),
        }
    }
}

/// How many of each thing the run had.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Publish attempts.
    pub publishes: usize,
    /// Attempts acknowledged.
    pub acked: usize,
    /// Attempts refused definitely.
    pub failed: usize,
    /// Attempts with an unknown outcome.
    pub indeterminate: usize,
    /// Distinct messages (channel and id) attempted.
    pub messages: usize,
    /// Subscriber connections.
    pub subscribes: usize,
    /// Messages delivered to subscribers.
    pub deliveries: usize,
    /// Faults injected.
    pub faults: usize,
    /// Takeovers observed.
    pub takeovers: usize,
    /// Channels in the final state.
    pub channels: usize,
    /// Messages in the final state.
    pub stored: usize,
    /// Lease acquisitions in the final state, when known.
    pub lease_acquisitions: Option<usize>,
    /// Lease observations (changes of the lease row seen by the harness).
    #[serde(default)]
    pub lease_observations: usize,
    /// `truncated` announcements received by subscribers (retention).
    #[serde(default)]
    pub truncations: usize,
    /// Distinct fencing tokens among the lease observations.
    #[serde(default)]
    pub lease_tokens: usize,
    /// The run's length: the latest time in the history.
    pub run_ms: u64,
    /// What the Centrifugo clients saw.
    #[serde(default)]
    pub centrifugo: CentrifugoCounts,
}

/// What the Centrifugo clients (the client protocol at
/// `/connection/websocket`) saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CentrifugoCounts {
    /// Connections that were connected and then ended.
    pub connections: usize,
    /// Subscribe replies.
    pub subscribes: usize,
    /// Replies to a first subscribe (no resume point yet).
    pub first_subscribes: usize,
    /// Recoveries answered `recovered: true`.
    pub recovered: usize,
    /// Recoveries answered `recovered: false`.
    pub not_recovered: usize,
    /// Publications recovered by the replies.
    pub recovered_publications: usize,
    /// History reads after `recovered: false`.
    pub history_reloads: usize,
    /// Messages the Centrifugo subscribers received.
    pub deliveries: usize,
    /// Pongs sent in answer to the nodes' pings.
    pub pongs: u64,
    /// How connections ended: a close code (`"3010"`), or `"none"` when
    /// one broke or was ended without a code.
    pub closes: BTreeMap<String, usize>,
}

/// Share of time in which publishes succeeded.
///
/// The run is cut into buckets of [`BUCKET_MS`]. A bucket is *attempted*
/// when some publish was in flight during it (from its invoke to its
/// completion), and *available* when some publish was acknowledged in it
/// (its completion falls in the bucket).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Availability {
    /// The bucket width.
    pub bucket_ms: u64,
    /// Buckets with a publish in flight.
    pub buckets_attempted: u64,
    /// Attempted buckets with an acknowledgement.
    pub buckets_available: u64,
    /// `buckets_available / buckets_attempted`; `None` when nothing was
    /// attempted.
    pub ratio: Option<f64>,
    /// The longest run of consecutive attempted buckets without an
    /// acknowledgement, in ms.
    pub longest_outage_ms: u64,
}

/// Recovery after the faults of one kind: for each fault, the time from
/// its start to the completion of the first acknowledged publish sent at
/// or after its start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryStats {
    /// Faults of this kind.
    pub faults: usize,
    /// Faults followed by an acknowledged publish.
    pub recovered: usize,
    /// The shortest recovery, in ms.
    pub min_ms: Option<u64>,
    /// The median recovery (the mean of the two middle ones, rounded down,
    /// for an even count), in ms.
    pub median_ms: Option<u64>,
    /// The longest recovery, in ms.
    pub max_ms: Option<u64>,
}

/// How a run was configured, as the runner records it in its report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The schedule's seed.
    pub seed: u64,
    /// How long clients ran and faults were injected.
    pub duration_ms: u64,
    /// How many nodes.
    pub nodes: usize,
    /// The fault kinds the schedule could draw from (empty: none).
    pub faults: Vec<String>,
    /// What every node got as `HERALD_FAULT_SWITCHES` (empty: nothing).
    pub fault_switches: String,
}

/// The checker's verdict on a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// True when no guarantee was broken.
    pub valid: bool,
    /// The run's settings, filled in by the runner ([`check`] does not
    /// know them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<RunSettings>,
    /// What the run contained.
    pub counts: Counts,
    /// Publish availability.
    pub availability: Availability,
    /// Recovery times per fault kind.
    pub recovery: BTreeMap<String, RecoveryStats>,
    /// Number of violations per kind.
    pub violations_by_kind: BTreeMap<String, usize>,
    /// Every violation found.
    pub violations: Vec<Violation>,
}

impl Report {
    /// The violations of one kind (as named by [`Violation::kind`]).
    pub fn violations_of(&self, kind: &str) -> Vec<&Violation> {
        self.violations
            .iter()
            .filter(|v| v.kind() == kind)
            .collect()
    }
}

/// How many violations [`Report`]'s `Display` lists one by one.
const SHOWN_VIOLATIONS: usize = 20;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        if self.valid {
            writeln!(f, "verdict       VALID")?;
        } else {
            writeln!(
                f,
                "verdict       INVALID ({} violations)",
                self.violations.len()
            )?;
        }
        if let Some(settings) = &self.settings {
            writeln!(
                f,
                "settings      seed {}, {} nodes, {} ms",
                settings.seed, settings.nodes, settings.duration_ms
            )?;
            let kinds = if settings.faults.is_empty() {
                "none".to_owned()
            } else {
                settings.faults.join(",")
            };
            writeln!(f, "fault kinds   {kinds}")?;
            if !settings.fault_switches.is_empty() {
                writeln!(f, "switches      {}", settings.fault_switches)?;
            }
        }
        writeln!(f, "run           {} ms", c.run_ms)?;
        writeln!(
            f,
            "publishes     {} ({} messages): acked {}, failed {}, indeterminate {}",
            c.publishes, c.messages, c.acked, c.failed, c.indeterminate
        )?;
        writeln!(
            f,
            "stored        {} messages in {} channels",
            c.stored, c.channels
        )?;
        writeln!(
            f,
            "subscribers   {} connections, {} deliveries",
            c.subscribes, c.deliveries
        )?;
        let acquisitions = c
            .lease_acquisitions
            .map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        writeln!(
            f,
            "faults        {}, takeovers seen {}, lease acquisitions {}",
            c.faults, c.takeovers, acquisitions
        )?;
        if c.truncations > 0 {
            writeln!(
                f,
                "truncations   {} announced to subscribers",
                c.truncations
            )?;
        }
        let z = &c.centrifugo;
        if z.connections > 0 || z.subscribes > 0 {
            writeln!(
                f,
                "centrifugo    {} connections, {} subscribes ({} first, {} recovered with {} \
                 publications, {} not recovered), {} history reloads, {} deliveries, {} pongs",
                z.connections,
                z.subscribes,
                z.first_subscribes,
                z.recovered,
                z.recovered_publications,
                z.not_recovered,
                z.history_reloads,
                z.deliveries,
                z.pongs
            )?;
            let closes: Vec<String> = z
                .closes
                .iter()
                .map(|(code, n)| format!("{code}: {n}"))
                .collect();
            writeln!(f, "  closed by   {}", closes.join(", "))?;
        }
        if c.lease_observations > 0 {
            writeln!(
                f,
                "lease         {} changes seen, {} tokens",
                c.lease_observations, c.lease_tokens
            )?;
        }
        let a = &self.availability;
        match a.ratio {
            Some(ratio) => writeln!(
                f,
                "availability  {:.1}% ({} of {} buckets of {} ms; longest outage {} ms)",
                ratio * 100.0,
                a.buckets_available,
                a.buckets_attempted,
                a.bucket_ms,
                a.longest_outage_ms
            )?,
            None => writeln!(f, "availability  n/a (no publishes)")?,
        }
        if !self.recovery.is_empty() {
            writeln!(
                f,
                "{:<20} {:>6} {:>9} {:>8} {:>8} {:>8}",
                "recovery (ms)", "faults", "recovered", "min", "median", "max"
            )?;
            let ms = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            for (kind, s) in &self.recovery {
                writeln!(
                    f,
                    "  {:<18} {:>6} {:>9} {:>8} {:>8} {:>8}",
                    kind,
                    s.faults,
                    s.recovered,
                    ms(s.min_ms),
                    ms(s.median_ms),
                    ms(s.max_ms)
                )?;
            }
        }
        if !self.violations.is_empty() {
            writeln!(f, "violations")?;
            for (kind, n) in &self.violations_by_kind {
                writeln!(f, "  {kind:<28} {n:>6}")?;
            }
            for v in self.violations.iter().take(SHOWN_VIOLATIONS) {
                writeln!(f, "  - {v}")?;
            }
            if self.violations.len() > SHOWN_VIOLATIONS {
                writeln!(
                    f,
                    "  ... and {} more",
                    self.violations.len() - SHOWN_VIOLATIONS
                )?;
            }
        }
        Ok(())
    }
}

/// One publish attempt, borrowed from the history.
struct Attempt<'a> {
    client: &'a str,
    channel: &'a str,
    id: &'a str,
    invoke_ms: u64,
    complete_ms: u64,
    result: &'a PublishResult,
}

/// The final state, indexed.
struct Store<'a> {
    /// Per channel, per offset, the messages stored there (normally one).
    by_offset: BTreeMap<&'a str, BTreeMap<u64, Vec<&'a StoredMessage>>>,
    /// Per (channel, id), the distinct offsets it is stored at, ascending.
    by_id: BTreeMap<(&'a str, &'a str), BTreeSet<u64>>,
    /// Per channel, its final earliest offset (absent: 1).
    earliest: &'a BTreeMap<String, u64>,
}

impl<'a> Store<'a> {
    fn new(state: &'a FinalState) -> Self {
        let mut by_offset: BTreeMap<&str, BTreeMap<u64, Vec<&StoredMessage>>> = BTreeMap::new();
        let mut by_id: BTreeMap<(&str, &str), BTreeSet<u64>> = BTreeMap::new();
        for (channel, messages) in &state.channels {
            let offsets = by_offset.entry(channel.as_str()).or_default();
            for m in messages {
                offsets.entry(m.offset).or_default().push(m);
                by_id
                    .entry((channel.as_str(), m.id.as_str()))
                    .or_default()
                    .insert(m.offset);
            }
        }
        Store {
            by_offset,
            by_id,
            earliest: &state.earliest,
        }
    }

    /// The channel's final earliest offset: every offset below it was
    /// removed by retention.
    fn earliest(&self, channel: &str) -> u64 {
        self.earliest.get(channel).copied().unwrap_or(1).max(1)
    }

    /// The messages stored at an offset.
    fn at(&self, channel: &str, offset: u64) -> &[&'a StoredMessage] {
        self.by_offset
            .get(channel)
            .and_then(|offsets| offsets.get(&offset))
            .map_or(&[], Vec::as_slice)
    }

    /// The (first) id stored at an offset.
    fn id_at(&self, channel: &str, offset: u64) -> Option<String> {
        self.at(channel, offset).first().map(|m| m.id.clone())
    }

    fn offsets_of(&self, channel: &str, id: &str) -> Vec<u64> {
        self.by_id
            .get(&(channel, id))
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }
}

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

/// (1) and (3): every acknowledgement is stored where it says, and no
/// offset is acknowledged for two ids.
fn check_acks(attempts: &[Attempt<'_>], store: &Store<'_>, out: &mut Vec<Violation>) {
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
fn check_offsets(store: &Store<'_>, out: &mut Vec<Violation>) {
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
fn check_tokens(store: &Store<'_>, out: &mut Vec<Violation>) {
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
fn check_stored_ids(attempts: &[Attempt<'_>], store: &Store<'_>, out: &mut Vec<Violation>) {
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
fn check_deliveries(history: &[Event], store: &Store<'_>, out: &mut Vec<Violation>) {
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
fn check_centrifugo(history: &[Event], store: &Store<'_>, out: &mut Vec<Violation>) {
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

/// One lease observation: `(at_ms, expired, expires_at_us, renewed_at_us,
/// holder)`.
type LeaseSeen<'a> = (u64, bool, i64, i64, Option<&'a str>);

/// (9): no token is renewed at or after an expiry the observer saw pass:
/// judged on each observation of a row version seen expired and the next
/// observation of that token, so that a renewal that decided before the
/// expiry but committed after it was seen pass, and the renewals after it,
/// are not taken for late ones. (A version that lived less than the
/// observer's period between the two can escape the observer; a correct
/// renewal chain does not need one to be judged correct.)
fn check_lease(history: &[Event], out: &mut Vec<Violation>) {
    let mut by_token: BTreeMap<u64, Vec<LeaseSeen<'_>>> = BTreeMap::new();
    for event in history {
        if let Event::Lease {
            token,
            holder,
            expired,
            expires_at_us,
            renewed_at_us,
            at_ms,
        } = event
        {
            by_token.entry(*token).or_default().push((
                *at_ms,
                *expired,
                *expires_at_us,
                *renewed_at_us,
                holder.as_deref(),
            ));
        }
    }
    for (token, mut seen) in by_token {
        seen.sort_by_key(|o| o.0);
        // A row version seen expired, and the next one seen: renewed at or
        // after the expiry of the version it replaced.
        let late = seen.windows(2).find(|pair| {
            let (before, after) = (&pair[0], &pair[1]);
            before.1 && after.3 != before.3 && after.3 >= before.2
        });
        if let Some([before, after]) = late {
            out.push(Violation::LeaseResurrected {
                token,
                holder: after.4.map(str::to_owned),
                expired_at_ms: before.0,
                unexpired_at_ms: after.0,
                expires_at_us: before.2,
                renewed_at_us: after.3,
            });
        }
    }
}

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
fn check_stalls(history: &[Event], attempts: &[Attempt<'_>], out: &mut Vec<Violation>) {
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

fn counts(history: &[Event], attempts: &[Attempt<'_>], state: &FinalState) -> Counts {
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

fn centrifugo_counts(history: &[Event]) -> CentrifugoCounts {
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

fn availability(attempts: &[Attempt<'_>]) -> Availability {
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

fn recovery(history: &[Event], attempts: &[Attempt<'_>]) -> BTreeMap<String, RecoveryStats> {
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

#[cfg(test)]
mod tests;
