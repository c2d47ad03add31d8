//! The decision of a stream append, the same for both backends: each reads
//! the stream's row and the producer's state inside its fenced transaction,
//! asks [`decide`], and writes only what it allows. The order of the checks
//! is the protocol's (`docs/durable-streams.md`): existence, closure,
//! content type, producer, `Stream-Seq`.

use herald_core::{
    media_type, ChannelName, Offset, Producer, ProducerLimits, StreamAppend, StreamAppended,
    StreamConfig, StreamInfo,
};

use crate::decode::{to_channel, to_u64};
use crate::error::Result;

/// A channel's row as both backends read it for streams (times in ms
/// since the Unix epoch, on the storage's clock).
#[derive(Debug, Clone)]
pub(crate) struct StoredStream {
    pub(crate) content_type: Option<String>,
    pub(crate) closed: bool,
    pub(crate) closed_by: Option<Producer>,
    pub(crate) stream_seq: Option<String>,
    pub(crate) head: i64,
    pub(crate) trimmed_through: i64,
    pub(crate) ttl_s: Option<i64>,
    pub(crate) expires_at_ms: Option<i64>,
    pub(crate) touched_at_ms: Option<i64>,
    pub(crate) fork_of: Option<String>,
    pub(crate) fork_sub_offset: Option<i64>,
    pub(crate) soft_deleted: bool,
}

/// The producer whose append closed a stream, from its three columns.
pub(crate) fn closed_by(
    id: Option<String>,
    epoch: Option<i64>,
    seq: Option<i64>,
) -> Result<Option<Producer>> {
    Ok(match (id, epoch, seq) {
        (Some(id), Some(epoch), Some(seq)) => Some(Producer {
            id,
            epoch: to_u64(epoch, "producer epoch")?,
            seq: to_u64(seq, "producer seq")?,
        }),
        _ => None,
    })
}

/// When a stream with these columns expires (ms since the Unix epoch),
/// if ever: the sooner of its absolute expiry and its last write plus its
/// TTL (`ttl_s`, seconds).
fn expiry_ms(
    ttl_s: Option<i64>,
    touched_at_ms: Option<i64>,
    expires_at_ms: Option<i64>,
) -> Option<i64> {
    let sliding = match (ttl_s, touched_at_ms) {
        (Some(ttl), Some(touched)) => Some(touched.saturating_add(ttl.saturating_mul(1000))),
        _ => None,
    };
    match (sliding, expires_at_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The columns of a channel's row that tell whether it is an expired
/// stream, as a read of its messages looks at them (times in ms since the
/// Unix epoch, on the storage's clock).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StreamExpiry {
    /// Whether the channel is a stream (`content_type` set).
    pub(crate) is_stream: bool,
    /// `ttl_s`.
    pub(crate) ttl_s: Option<i64>,
    /// `touched_at_ms`.
    pub(crate) touched_at_ms: Option<i64>,
    /// `expires_at_ms`.
    pub(crate) expires_at_ms: Option<i64>,
}

impl StreamExpiry {
    /// Whether the channel is a stream that expired at `now_ms`.
    pub(crate) fn expired(&self, now_ms: i64) -> bool {
        self.is_stream
            && expiry_ms(self.ttl_s, self.touched_at_ms, self.expires_at_ms)
                .is_some_and(|at| at <= now_ms)
    }
}

impl StoredStream {
    /// Whether the row is a stream (live, expired or soft-deleted).
    pub(crate) fn is_stream(&self) -> bool {
        self.content_type.is_some()
    }

    /// When the stream expires (ms since the Unix epoch), if ever: the
    /// sooner of its absolute expiry and its last write plus its TTL.
    pub(crate) fn expiry_ms(&self) -> Option<i64> {
        expiry_ms(self.ttl_s, self.touched_at_ms, self.expires_at_ms)
    }

    /// Whether the stream expired at `now_ms`.
    pub(crate) fn expired(&self, now_ms: i64) -> bool {
        self.expiry_ms().is_some_and(|at| at <= now_ms)
    }

    /// The row as [`StreamInfo`] (`live_forks` 0: the caller counts them).
    pub(crate) fn info(&self, channel: &ChannelName) -> Result<StreamInfo> {
        Ok(StreamInfo {
            channel: channel.clone(),
            config: StreamConfig {
                content_type: self
                    .content_type
                    .clone()
                    .unwrap_or_else(|| "application/json".to_owned()),
                ttl_s: self.ttl_s.map(|t| to_u64(t, "ttl_s")).transpose()?,
                expires_at_ms: self.expires_at_ms,
            },
            closed: self.closed,
            head: to_u64(self.head, "head")?,
            earliest: to_u64(self.trimmed_through, "trimmed_through")? + 1,
            expires_at_ms: self.expiry_ms(),
            fork_of: self.fork_of.clone().map(to_channel).transpose()?,
            fork_sub_offset: self
                .fork_sub_offset
                .map(|s| to_u64(s, "fork_sub_offset"))
                .transpose()?
                .unwrap_or(0),
            soft_deleted: self.soft_deleted,
            live_forks: 0,
        })
    }

    /// What [`decide`] needs of the row at `now_ms`.
    pub(crate) fn rules_row(&self, now_ms: i64) -> Result<StreamRow> {
        Ok(StreamRow {
            content_type: self.content_type.clone(),
            closed: self.closed,
            closed_by: self.closed_by.clone(),
            stream_seq: self.stream_seq.clone(),
            head: to_u64(self.head, "head")?,
            expired: self.expired(now_ms),
            soft_deleted: self.soft_deleted,
        })
    }
}

/// A stream's row as an append reads it.
#[derive(Debug, Clone)]
pub(crate) struct StreamRow {
    /// `content_type`: `None` for a channel that is not a stream.
    pub(crate) content_type: Option<String>,
    /// Whether the stream is closed.
    pub(crate) closed: bool,
    /// The producer whose append closed it, if one did.
    pub(crate) closed_by: Option<Producer>,
    /// The last `Stream-Seq` accepted.
    pub(crate) stream_seq: Option<String>,
    /// The channel's head.
    pub(crate) head: Offset,
    /// Whether the stream expired (on the storage's clock).
    pub(crate) expired: bool,
    /// Whether it was deleted while forks of it remained.
    pub(crate) soft_deleted: bool,
}

/// A producer's stored state: its epoch and the last sequence number it
/// appended in it.
pub(crate) type ProducerState = (u64, u64);

/// The state of a producer whose row says `(epoch, last_seq)` and that it
/// last appended at `last_append_ms`, as [`decide`] takes it at `now_ms`
/// (all ms since the Unix epoch, on the storage's clock): `None` once the
/// producer is idle longer than `limits.idle_ms`, which makes it new again.
pub(crate) fn live_state(
    stored: Option<(u64, u64, i64)>,
    now_ms: i64,
    limits: &ProducerLimits,
) -> Option<ProducerState> {
    stored
        .filter(|&(_, _, last)| !idle(last, now_ms, limits))
        .map(|(epoch, seq, _)| (epoch, seq))
}

/// Whether a producer that last appended at `last_append_ms` is idle at
/// `now_ms` (ms since the Unix epoch) under `limits`.
fn idle(last_append_ms: i64, now_ms: i64, limits: &ProducerLimits) -> bool {
    let idle_ms = i64::try_from(limits.idle_ms).unwrap_or(i64::MAX);
    now_ms.saturating_sub(last_append_ms) > idle_ms
}

/// The time (ms since the Unix epoch) such that a producer whose last
/// append is before it is idle at `now_ms`: its row may be removed.
pub(crate) fn idle_before_ms(now_ms: i64, limits: &ProducerLimits) -> i64 {
    now_ms.saturating_sub(i64::try_from(limits.idle_ms).unwrap_or(i64::MAX))
}

/// What an append that admits a producer new to the stream is answered
/// when the stream keeps state for `live` producers that are not idle:
/// `None` when there is room for one more.
pub(crate) fn admit_new_producer(live: u64, limits: &ProducerLimits) -> Option<StreamAppended> {
    (live >= limits.max_per_stream).then_some(StreamAppended::TooManyProducers {
        limit: limits.max_per_stream,
    })
}

/// What [`decide`] allows.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Change nothing and answer this.
    Answer(StreamAppended),
    /// Append the request's messages (close if it asks), store the
    /// producer's new state if it has one, and store its `Stream-Seq`.
    Write,
}

/// Decides `append` against the stream's `row` (`None`: no such channel)
/// and its producer's stored `state`.
pub(crate) fn decide(
    row: Option<&StreamRow>,
    state: Option<ProducerState>,
    append: &StreamAppend,
) -> Decision {
    let Some(row) = row.filter(|r| r.content_type.is_some() && !r.expired) else {
        return Decision::Answer(StreamAppended::NotFound);
    };
    if row.soft_deleted {
        return Decision::Answer(StreamAppended::Gone);
    }
    if append.messages.is_empty() && !append.close {
        // Nothing to write: above all, no producer sequence number used up.
        return Decision::Answer(StreamAppended::Empty);
    }
    let close_only = append.messages.is_empty();
    if row.closed {
        if let (Some(producer), Some(by)) = (&append.producer, &row.closed_by) {
            if producer == by {
                return Decision::Answer(StreamAppended::Duplicate {
                    head: row.head,
                    last_seq: by.seq,
                    closed: true,
                });
            }
        }
        if close_only && append.close && append.producer.is_none() {
            // Closing a closed stream again changes nothing and succeeds.
            return Decision::Answer(StreamAppended::Appended {
                first: row.head + 1,
                head: row.head,
                published_at_ms: 0,
                closed: true,
            });
        }
        return Decision::Answer(StreamAppended::Closed { head: row.head });
    }
    if let (Some(sent), Some(stored), false) = (&append.content_type, &row.content_type, close_only)
    {
        if media_type(sent) != media_type(stored) {
            return Decision::Answer(StreamAppended::ContentTypeMismatch {
                content_type: stored.clone(),
            });
        }
    }
    if let Some(producer) = &append.producer {
        match state {
            None if producer.seq != 0 => {
                return Decision::Answer(StreamAppended::SeqGap {
                    expected: 0,
                    received: producer.seq,
                })
            }
            None => {}
            Some((epoch, _)) if producer.epoch < epoch => {
                return Decision::Answer(StreamAppended::StaleEpoch { epoch })
            }
            Some((epoch, _)) if producer.epoch > epoch && producer.seq != 0 => {
                return Decision::Answer(StreamAppended::EpochWithoutSeqZero);
            }
            Some((epoch, _)) if producer.epoch > epoch => {}
            Some((_, last)) if producer.seq <= last => {
                return Decision::Answer(StreamAppended::Duplicate {
                    head: row.head,
                    last_seq: last,
                    closed: false,
                })
            }
            Some((_, last)) if producer.seq != last + 1 => {
                return Decision::Answer(StreamAppended::SeqGap {
                    expected: last + 1,
                    received: producer.seq,
                })
            }
            Some(_) => {}
        }
    }
    if let (Some(sent), Some(last)) = (&append.stream_seq, &row.stream_seq) {
        if sent.as_bytes() <= last.as_bytes() {
            return Decision::Answer(StreamAppended::StreamSeqConflict);
        }
    }
    Decision::Write
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use herald_core::{ChannelName, Payload};

    use super::*;

    fn row() -> StreamRow {
        StreamRow {
            content_type: Some("text/plain".to_owned()),
            closed: false,
            closed_by: None,
            stream_seq: None,
            head: 4,
            expired: false,
            soft_deleted: false,
        }
    }

    fn append(producer: Option<(u64, u64)>) -> StreamAppend {
        StreamAppend {
            channel: ChannelName::new("s").unwrap(),
            content_type: Some("TEXT/plain; charset=utf-8".to_owned()),
            messages: vec![Payload::Bytes(Arc::from(&b"x"[..]))],
            producer: producer.map(|(epoch, seq)| Producer {
                id: "p".to_owned(),
                epoch,
                seq,
            }),
            stream_seq: None,
            close: false,
            producer_limits: ProducerLimits::default(),
        }
    }

    fn answer(d: Decision) -> StreamAppended {
        match d {
            Decision::Answer(a) => a,
            Decision::Write => panic!("expected an answer, got a write"),
        }
    }

    #[test]
    fn a_producer_starts_at_zero_and_goes_on_by_one() {
        assert_eq!(
            decide(Some(&row()), None, &append(Some((0, 0)))),
            Decision::Write
        );
        assert_eq!(
            answer(decide(Some(&row()), None, &append(Some((0, 1))))),
            StreamAppended::SeqGap {
                expected: 0,
                received: 1
            }
        );
        assert_eq!(
            decide(Some(&row()), Some((0, 0)), &append(Some((0, 1)))),
            Decision::Write
        );
        assert_eq!(
            answer(decide(Some(&row()), Some((0, 2)), &append(Some((0, 1))))),
            StreamAppended::Duplicate {
                head: 4,
                last_seq: 2,
                closed: false
            }
        );
        assert_eq!(
            answer(decide(Some(&row()), Some((0, 2)), &append(Some((0, 4))))),
            StreamAppended::SeqGap {
                expected: 3,
                received: 4
            }
        );
    }

    #[test]
    fn epochs_fence_older_producers_and_restart_at_zero() {
        assert_eq!(
            answer(decide(Some(&row()), Some((2, 5)), &append(Some((1, 6))))),
            StreamAppended::StaleEpoch { epoch: 2 }
        );
        assert_eq!(
            answer(decide(Some(&row()), Some((2, 5)), &append(Some((3, 1))))),
            StreamAppended::EpochWithoutSeqZero
        );
        assert_eq!(
            decide(Some(&row()), Some((2, 5)), &append(Some((3, 0)))),
            Decision::Write
        );
    }

    #[test]
    fn closure_comes_before_content_type_and_sequence() {
        let mut closed = row();
        closed.closed = true;
        closed.closed_by = Some(Producer {
            id: "p".to_owned(),
            epoch: 0,
            seq: 3,
        });
        let mut other_type = append(Some((0, 3)));
        other_type.content_type = Some("application/json".to_owned());
        assert_eq!(
            answer(decide(Some(&closed), Some((0, 3)), &other_type)),
            StreamAppended::Duplicate {
                head: 4,
                last_seq: 3,
                closed: true
            }
        );
        assert_eq!(
            answer(decide(Some(&closed), Some((0, 3)), &append(Some((0, 4))))),
            StreamAppended::Closed { head: 4 }
        );
        let mut close_again = append(None);
        close_again.messages.clear();
        close_again.close = true;
        assert!(matches!(
            answer(decide(Some(&closed), None, &close_again)),
            StreamAppended::Appended {
                closed: true,
                head: 4,
                ..
            }
        ));
        let mut json = append(None);
        json.content_type = Some("application/json".to_owned());
        assert_eq!(
            answer(decide(Some(&row()), None, &json)),
            StreamAppended::ContentTypeMismatch {
                content_type: "text/plain".to_owned()
            }
        );
    }

    #[test]
    fn stream_seq_must_grow_as_bytes_and_duplicates_win_over_it() {
        let mut seen = row();
        seen.stream_seq = Some("2".to_owned());
        let mut ten = append(None);
        ten.stream_seq = Some("10".to_owned());
        assert_eq!(
            answer(decide(Some(&seen), None, &ten)),
            StreamAppended::StreamSeqConflict
        );
        ten.stream_seq = Some("3".to_owned());
        assert_eq!(decide(Some(&seen), None, &ten), Decision::Write);
        let mut retry = append(Some((0, 1)));
        retry.stream_seq = Some("2".to_owned());
        assert!(matches!(
            answer(decide(Some(&seen), Some((0, 1)), &retry)),
            StreamAppended::Duplicate { .. }
        ));
    }

    #[test]
    fn an_empty_append_uses_up_no_sequence_number() {
        let mut empty = append(Some((0, 1)));
        empty.messages.clear();
        assert_eq!(
            answer(decide(Some(&row()), Some((0, 0)), &empty)),
            StreamAppended::Empty
        );
        empty.close = true;
        assert_eq!(decide(Some(&row()), Some((0, 0)), &empty), Decision::Write);
    }

    #[test]
    fn idle_producers_are_forgotten_and_new_ones_are_bounded() {
        let limits = ProducerLimits {
            max_per_stream: 2,
            idle_ms: 1000,
        };
        assert_eq!(live_state(Some((1, 5, 0)), 1000, &limits), Some((1, 5)));
        assert_eq!(live_state(Some((1, 5, 0)), 1001, &limits), None);
        assert_eq!(idle_before_ms(1001, &limits), 1);
        assert_eq!(admit_new_producer(1, &limits), None);
        assert_eq!(
            admit_new_producer(2, &limits),
            Some(StreamAppended::TooManyProducers { limit: 2 })
        );
    }

    #[test]
    fn a_missing_plain_or_expired_channel_is_not_found() {
        assert_eq!(
            answer(decide(None, None, &append(None))),
            StreamAppended::NotFound
        );
        let mut plain = row();
        plain.content_type = None;
        assert_eq!(
            answer(decide(Some(&plain), None, &append(None))),
            StreamAppended::NotFound
        );
        let mut expired = row();
        expired.expired = true;
        assert_eq!(
            answer(decide(Some(&expired), None, &append(None))),
            StreamAppended::NotFound
        );
    }
}
