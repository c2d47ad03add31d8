//! The catalogue of what the checker can find wrong: one [`Violation`]
//! per broken guarantee, with its evidence, its kind (the name the report
//! counts by) and its text.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::bounds::STALL_MS;

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
