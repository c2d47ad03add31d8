//! Retention: the values a trim takes and returns, and the plan both
//! backends follow inside their trim transaction (which oldest messages of
//! one channel go), kept apart from SQL so that it is tested on its own.
//!
//! A channel's messages always have contiguous offsets from its `earliest`
//! to its `head`: a trim removes only a prefix, in offset order, and never
//! moves the head, so offsets are never reused.

use herald_core::{ChannelName, Offset};

/// What a trim removes from one channel: every oldest message beyond any
/// of these bounds; `None` is unbounded. [`TrimLimits::default`] removes
/// nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrimLimits {
    /// Keep at most this many newest messages.
    pub max_messages: Option<u64>,
    /// Remove messages published at least this long ago on the storage's
    /// clock, in ms.
    pub max_age_ms: Option<u64>,
    /// Keep at most this many bytes of message data (the JSON text's UTF-8
    /// length), counting from the newest message.
    pub max_bytes: Option<u64>,
    /// Remove every message at or below this offset (deleting a channel:
    /// its head when the deletion started).
    pub up_to: Option<Offset>,
}

impl TrimLimits {
    /// True when these limits can never remove anything.
    pub fn is_unbounded(&self) -> bool {
        self.max_messages.is_none()
            && self.max_age_ms.is_none()
            && self.max_bytes.is_none()
            && self.up_to.is_none()
    }
}

/// What one trim transaction did to one channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Messages removed by this transaction.
    pub messages: u64,
    /// Bytes of message data removed by this transaction.
    pub bytes: u64,
    /// The channel's earliest offset after the transaction: its oldest
    /// stored message, or `head + 1` when it has none.
    pub earliest: Offset,
    /// The channel's head (unchanged by any trim).
    pub head: Offset,
    /// False when the transaction stopped at its row bound with more to
    /// remove: call again.
    pub done: bool,
}

/// One channel with its head, earliest offset and size, from
/// [`crate::MessageLog::channel_stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelStats {
    /// The channel's name.
    pub name: ChannelName,
    /// Offset of its newest message ever (kept when messages are trimmed or
    /// the channel deleted).
    pub head: Offset,
    /// Offset of its oldest stored message, `head + 1` when none is stored.
    pub earliest: Offset,
    /// Messages stored (`head − earliest + 1`).
    pub messages: u64,
    /// Bytes of message data stored (the JSON texts' UTF-8 lengths).
    pub bytes: u64,
}

/// A channel's row as a trim transaction reads it, under its row lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChannelWindow {
    /// Offset of the newest message.
    pub head: i64,
    /// Every offset at or below this is removed (`earliest − 1`).
    pub trimmed_through: i64,
    /// Bytes of message data stored.
    pub bytes: i64,
}

/// One stored message as a trim sees it: offset, data size in bytes, and
/// whether it is older than `max_age` on the storage's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    pub offset: i64,
    pub size: i64,
    pub expired: bool,
}

/// What a trim transaction removes: every offset in
/// `window.trimmed_through + 1 ..= through`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The new `trimmed_through`.
    pub through: i64,
    /// Messages removed.
    pub messages: i64,
    /// Bytes removed.
    pub bytes: i64,
    /// False when every candidate was removed and there may be more.
    pub done: bool,
}

/// Decides which of `candidates` (the oldest stored messages of the
/// channel, in offset order, contiguous from `window.trimmed_through + 1`,
/// at most `max_rows` of them) go: the longest prefix of which each message
/// is beyond at least one of `limits`.
pub(crate) fn plan(
    window: ChannelWindow,
    candidates: &[Candidate],
    limits: &TrimLimits,
    max_rows: usize,
) -> Plan {
    let count_bound = limits.max_messages.map_or(i64::MIN, |keep| {
        window
            .head
            .saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX))
    });
    let up_to = limits
        .up_to
        .map_or(i64::MIN, |o| i64::try_from(o).unwrap_or(i64::MAX));
    let max_bytes = limits
        .max_bytes
        .map(|b| i64::try_from(b).unwrap_or(i64::MAX));
    let mut plan = Plan {
        through: window.trimmed_through,
        messages: 0,
        bytes: 0,
        done: true,
    };
    for c in candidates {
        let remaining = window.bytes - plan.bytes;
        let beyond = c.offset <= count_bound
            || c.offset <= up_to
            || (limits.max_age_ms.is_some() && c.expired)
            || max_bytes.is_some_and(|max| remaining > max);
        if !beyond {
            return plan;
        }
        plan.through = c.offset;
        plan.messages += 1;
        plan.bytes += c.size;
    }
    plan.done = candidates.len() < max_rows;
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(head: i64, trimmed_through: i64, bytes: i64) -> ChannelWindow {
        ChannelWindow {
            head,
            trimmed_through,
            bytes,
        }
    }

    fn rows(from: i64, to: i64, size: i64, expired_through: i64) -> Vec<Candidate> {
        (from..=to)
            .map(|offset| Candidate {
                offset,
                size,
                expired: offset <= expired_through,
            })
            .collect()
    }

    #[test]
    fn unbounded_limits_remove_nothing() {
        let p = plan(
            window(10, 0, 100),
            &rows(1, 10, 10, 10),
            &TrimLimits::default(),
            100,
        );
        assert_eq!((p.through, p.messages, p.done), (0, 0, true));
    }

    #[test]
    fn max_messages_keeps_the_newest() {
        let limits = TrimLimits {
            max_messages: Some(3),
            ..TrimLimits::default()
        };
        let p = plan(window(10, 2, 80), &rows(3, 10, 10, 0), &limits, 100);
        assert_eq!(
            p,
            Plan {
                through: 7,
                messages: 5,
                bytes: 50,
                done: true
            }
        );
    }

    #[test]
    fn the_row_bound_leaves_the_rest_for_the_next_transaction() {
        let limits = TrimLimits {
            max_messages: Some(0),
            ..TrimLimits::default()
        };
        let p = plan(window(10, 0, 100), &rows(1, 4, 10, 0), &limits, 4);
        assert_eq!((p.through, p.messages, p.done), (4, 4, false));
    }

    #[test]
    fn max_age_removes_the_expired_prefix_only() {
        let limits = TrimLimits {
            max_age_ms: Some(1000),
            ..TrimLimits::default()
        };
        let p = plan(window(10, 0, 100), &rows(1, 10, 10, 6), &limits, 100);
        assert_eq!((p.through, p.messages, p.done), (6, 6, true));
    }

    #[test]
    fn max_bytes_stops_once_the_rest_fits() {
        let limits = TrimLimits {
            max_bytes: Some(25),
            ..TrimLimits::default()
        };
        // 10 messages of 10 bytes: keep 2 (20 bytes), 3 would be 30.
        let p = plan(window(10, 0, 100), &rows(1, 10, 10, 0), &limits, 100);
        assert_eq!((p.through, p.bytes), (8, 80));
    }

    #[test]
    fn up_to_removes_through_that_offset() {
        let limits = TrimLimits {
            up_to: Some(7),
            ..TrimLimits::default()
        };
        let p = plan(window(10, 0, 100), &rows(1, 10, 10, 0), &limits, 100);
        assert_eq!((p.through, p.messages), (7, 7));
    }

    #[test]
    fn the_widest_bound_wins() {
        let limits = TrimLimits {
            max_messages: Some(8),
            max_age_ms: Some(1),
            ..TrimLimits::default()
        };
        let p = plan(window(10, 0, 100), &rows(1, 10, 10, 5), &limits, 100);
        assert_eq!(p.through, 5);
    }
}
