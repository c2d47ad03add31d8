//! The record of a run: what every client did and saw, and what the
//! database held at the end.
//!
//! A history is a sequence of [`Event`]s, one JSON object per line (JSON
//! Lines), each tagged by `"type"`. Times are milliseconds on a monotonic
//! clock since the run's start, taken by the harness. The events of one
//! subscriber must appear in the order the subscriber saw them; the order
//! of other events does not matter to the checker.
//!
//! Besides the clients' events, the harness records faults, takeovers seen
//! in the nodes' status, and [`Event::Lease`]: the writer lease's row as
//! read straight from the database (not through any node) every 100 ms,
//! recorded only when its token, holder or expiry changed. Its `expired`
//! is judged by the database's clock in the reading statement itself.
//! Histories without lease events (older runs, synthetic tests) are
//! valid: the rules about the lease then have nothing to judge.
//!
//! The database's contents after the run are a [`FinalState`], one JSON
//! document.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// One thing a client did or saw, or a fault the harness injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// One publish attempt (a retry is another attempt with the same `id`
    /// and `idempotency_key`).
    Publish {
        /// The publishing client.
        client: String,
        /// The node the request was sent to.
        node: String,
        /// The channel published to.
        channel: String,
        /// The message's unique id, carried inside its `data`.
        id: String,
        /// The `Idempotency-Key` sent, if any.
        idempotency_key: Option<String>,
        /// When the request was sent.
        invoke_ms: u64,
        /// When its answer (or its failure) arrived.
        complete_ms: u64,
        /// What the client learned.
        result: PublishResult,
    },
    /// A message a subscriber received.
    Delivery {
        /// The subscriber.
        subscriber: String,
        /// The node the subscription is connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The offset the message carried.
        offset: u64,
        /// The message's id, read from its `data`.
        id: String,
        /// When it was received.
        at_ms: u64,
    },
    /// A subscriber (re)connected; what it receives next starts right after
    /// `after`.
    Subscribe {
        /// The subscriber.
        subscriber: String,
        /// The node it connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The resume point sent (`?after=` or `Last-Event-ID`).
        after: u64,
        /// When the connection was opened.
        at_ms: u64,
    },
    /// A subscriber was told that the messages after `requested_after` and
    /// below `earliest` were removed by retention (SSE `event: truncated`);
    /// what it receives next starts at `earliest`.
    Truncated {
        /// The subscriber.
        subscriber: String,
        /// The node the subscription is connected to.
        node: String,
        /// The channel.
        channel: String,
        /// The offset the subscriber had reached.
        requested_after: u64,
        /// The channel's earliest offset, as the node announced it.
        earliest: u64,
        /// When it was received.
        at_ms: u64,
    },
    /// A Centrifugo client's subscribe reply (the client protocol at
    /// `/connection/websocket`, docs/centrifugo.md). The client records it
    /// before the [`Event::Subscribe`] that starts the connection's stream
    /// of that channel.
    CentrifugoSubscribed {
        /// The subscriber.
        subscriber: String,
        /// The node the connection is open to.
        node: String,
        /// The channel.
        channel: String,
        /// The stream position the client asked to recover from
        /// (`recover: true` with its `offset` and `epoch`); `None` for a
        /// first subscribe, which starts at the channel's current position.
        recover_from: Option<StreamPosition>,
        /// The reply's `recovered`.
        recovered: bool,
        /// The reply's `epoch`.
        epoch: String,
        /// The reply's `offset`: the last recovered publication's offset
        /// (the requested one when nothing was missed), or the channel's
        /// head when not recovered.
        offset: u64,
        /// How many publications the reply recovered.
        publications: usize,
        /// When the reply arrived.
        at_ms: u64,
    },
    /// After `recovered: false`, the client reloaded the channel's state
    /// as Centrifugo's documentation tells an application to: a `history`
    /// read from the oldest publication held (no `since`, 1000 at most).
    /// When its first offset lies beyond the resume point, the client
    /// records an [`Event::Truncated`] (the skipped offsets are judged as
    /// retention's) and goes on with the publications it read.
    CentrifugoHistory {
        /// The subscriber.
        subscriber: String,
        /// The node the connection is open to.
        node: String,
        /// The channel.
        channel: String,
        /// The offset of the first publication read, `None` when the
        /// history held none.
        first: Option<u64>,
        /// The reply's `offset` (the channel's head).
        offset: u64,
        /// The reply's `epoch`.
        epoch: String,
        /// When the reply arrived.
        at_ms: u64,
    },
    /// A Centrifugo client's connection ended.
    CentrifugoClosed {
        /// The subscriber.
        subscriber: String,
        /// The node it was open to.
        node: String,
        /// The channels subscribed on it when it ended.
        channels: Vec<String>,
        /// The close code the node sent (Centrifugo's disconnect codes,
        /// e.g. 3010 "insufficient state"); `None` when the connection
        /// broke without one, stayed silent too long or the run ended.
        code: Option<u16>,
        /// The close reason, or what ended the connection.
        reason: String,
        /// How many of the node's pings (`{}`) the client answered with a
        /// pong on this connection.
        pongs: u64,
        /// When it ended.
        at_ms: u64,
    },
    /// A fault the harness injected, for reporting.
    Fault {
        /// What kind of fault, e.g. `kill_holder`, `partition_db`.
        kind: String,
        /// What it hit, e.g. a node id.
        target: String,
        /// When it began.
        start_ms: u64,
        /// When it was healed (equal to `start_ms` for an instant fault).
        end_ms: u64,
    },
    /// A node became holder, as its status or log said, for reporting.
    Takeover {
        /// The new holder.
        node: String,
        /// Its fencing token.
        token: u64,
        /// When the harness saw it.
        at_ms: u64,
    },
    /// The writer lease's row as the harness read it from the database
    /// (`storage_leases`, name `writer`), on a connection of its own; one
    /// event per change of token, holder or expiry.
    Lease {
        /// The fencing token in the row.
        token: u64,
        /// The holder in the row (`None` after a release).
        holder: Option<String>,
        /// Whether `expires_at <= clock_timestamp()`, the database's clock
        /// read by the same statement.
        expired: bool,
        /// The row's `expires_at`, in microseconds since the Unix epoch
        /// (database clock).
        expires_at_us: i64,
        /// The row's `renewed_at`: when the last renewal (or the
        /// acquisition) decided, in microseconds since the Unix epoch
        /// (database clock, read by that statement itself).
        renewed_at_us: i64,
        /// When the answer arrived.
        at_ms: u64,
    },
}

impl Event {
    /// The latest time this event mentions.
    pub fn last_ms(&self) -> u64 {
        match self {
            Event::Publish {
                invoke_ms,
                complete_ms,
                ..
            } => (*invoke_ms).max(*complete_ms),
            Event::Delivery { at_ms, .. }
            | Event::Subscribe { at_ms, .. }
            | Event::CentrifugoSubscribed { at_ms, .. }
            | Event::CentrifugoHistory { at_ms, .. }
            | Event::CentrifugoClosed { at_ms, .. }
            | Event::Truncated { at_ms, .. }
            | Event::Takeover { at_ms, .. }
            | Event::Lease { at_ms, .. } => *at_ms,
            Event::Fault {
                start_ms, end_ms, ..
            } => (*start_ms).max(*end_ms),
        }
    }
}

/// A Centrifugo stream position: an offset in a channel's epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPosition {
    /// The offset.
    pub offset: u64,
    /// The epoch.
    pub epoch: String,
}

/// What a publish attempt's client learned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PublishResult {
    /// `201` or `200`: the message is stored at `offset`.
    Acked {
        /// The offset in the answer.
        offset: u64,
    },
    /// A definite refusal: nothing was stored by this attempt.
    Failed {
        /// The error `code` of the answer (or the status, if it had none).
        code: String,
    },
    /// The outcome is unknown: the message may or may not be stored.
    Indeterminate {
        /// Why: a timeout, a broken connection, or the error code.
        reason: String,
    },
}

/// The `503` codes that guarantee nothing was stored (docs/api.md).
const DEFINITE_503_CODES: [&str; 4] = ["not_holder", "queue_full", "lease_lost", "draining"];

impl PublishResult {
    /// Classifies an HTTP error answer to a publish.
    ///
    /// Every `4xx`, and a `503` with `not_holder`, `queue_full`,
    /// `lease_lost` or `draining`, is a definite refusal. Anything else
    /// (`500 internal`, `503 storage_unavailable`, `503 no_holder`, an
    /// unknown code) leaves the outcome unknown.
    pub fn from_error(status: u16, code: &str) -> Self {
        let definite =
            (400..500).contains(&status) || (status == 503 && DEFINITE_503_CODES.contains(&code));
        if definite {
            PublishResult::Failed {
                code: code.to_owned(),
            }
        } else {
            PublishResult::Indeterminate {
                reason: format!("{status} {code}"),
            }
        }
    }

    /// A publish whose answer never arrived (timeout, connection refused or
    /// broken): the outcome is unknown.
    pub fn transport_error(reason: impl Into<String>) -> Self {
        PublishResult::Indeterminate {
            reason: reason.into(),
        }
    }
}

/// One message as stored in the database after the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Its offset.
    pub offset: u64,
    /// Its id, read from its `data`.
    pub id: String,
    /// The fencing token of the write that stored it.
    pub token: u64,
    /// Its commit time, in ms since the run's start.
    pub published_at_ms: u64,
}

/// One acquisition of the writer lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAcquisition {
    /// The fencing token it got.
    pub token: u64,
    /// When, in ms since the run's start.
    pub acquired_at_ms: u64,
}

/// What the database held after the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// Every channel's stored messages, in any order.
    pub channels: BTreeMap<String, Vec<StoredMessage>>,
    /// Each channel's earliest offset (`channels.trimmed_through + 1`):
    /// every offset below it was removed by retention. A channel missing
    /// here has earliest 1 (nothing removed).
    #[serde(default)]
    pub earliest: BTreeMap<String, u64>,
    /// The writer lease's acquisitions, when they could be recovered.
    #[serde(default)]
    pub lease_history: Option<Vec<LeaseAcquisition>>,
}

/// A history that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Reading or writing failed.
    #[error("history I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a valid event.
    #[error("history line {line}: {source}")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// What was wrong with it.
        source: serde_json::Error,
    },
    /// An event could not be encoded.
    #[error("cannot encode event: {0}")]
    Encode(serde_json::Error),
}

/// Writes events as JSON Lines, one event per line.
pub fn write_jsonl<W: Write>(mut out: W, events: &[Event]) -> Result<(), HistoryError> {
    for event in events {
        serde_json::to_writer(&mut out, event).map_err(HistoryError::Encode)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads events from JSON Lines; blank lines are skipped.
pub fn read_jsonl<R: BufRead>(input: R) -> Result<Vec<Event>, HistoryError> {
    let mut events = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
            line: index + 1,
            source,
        })?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_are_classified_as_the_api_documents() {
        for (status, code) in [
            (400, "invalid_body"),
            (413, "payload_too_large"),
            (503, "not_holder"),
            (503, "queue_full"),
            (503, "lease_lost"),
            (503, "draining"),
        ] {
            assert!(
                matches!(
                    PublishResult::from_error(status, code),
                    PublishResult::Failed { .. }
                ),
                "{status} {code}"
            );
        }
        for (status, code) in [
            (500, "internal"),
            (503, "storage_unavailable"),
            (503, "no_holder"),
            (503, "something_new"),
            (502, ""),
        ] {
            assert!(
                matches!(
                    PublishResult::from_error(status, code),
                    PublishResult::Indeterminate { .. }
                ),
                "{status} {code}"
            );
        }
    }

    #[test]
    fn events_round_trip_through_json_lines() {
        let events = vec![
            Event::Publish {
                client: "c1".into(),
                node: "n1".into(),
                channel: "orders".into(),
                id: "m1".into(),
                idempotency_key: Some("k1".into()),
                invoke_ms: 10,
                complete_ms: 12,
                result: PublishResult::Acked { offset: 1 },
            },
            Event::Publish {
                client: "c1".into(),
                node: "n2".into(),
                channel: "orders".into(),
                id: "m2".into(),
                idempotency_key: None,
                invoke_ms: 13,
                complete_ms: 5013,
                result: PublishResult::transport_error("timeout"),
            },
            Event::Subscribe {
                subscriber: "s1".into(),
                node: "n2".into(),
                channel: "orders".into(),
                after: 0,
                at_ms: 1,
            },
            Event::Delivery {
                subscriber: "s1".into(),
                node: "n2".into(),
                channel: "orders".into(),
                offset: 1,
                id: "m1".into(),
                at_ms: 15,
            },
            Event::CentrifugoSubscribed {
                subscriber: "z1".into(),
                node: "n2".into(),
                channel: "orders".into(),
                recover_from: Some(StreamPosition {
                    offset: 1,
                    epoch: "0123456789abcdef".into(),
                }),
                recovered: false,
                epoch: "0123456789abcdef".into(),
                offset: 2,
                publications: 0,
                at_ms: 16,
            },
            Event::CentrifugoHistory {
                subscriber: "z1".into(),
                node: "n2".into(),
                channel: "orders".into(),
                first: Some(2),
                offset: 2,
                epoch: "0123456789abcdef".into(),
                at_ms: 17,
            },
            Event::CentrifugoClosed {
                subscriber: "z1".into(),
                node: "n2".into(),
                channels: vec!["orders".into()],
                code: Some(3010),
                reason: "insufficient state".into(),
                pongs: 3,
                at_ms: 18,
            },
            Event::Fault {
                kind: "kill_holder".into(),
                target: "n1".into(),
                start_ms: 20,
                end_ms: 20,
            },
            Event::Takeover {
                node: "n2".into(),
                token: 2,
                at_ms: 900,
            },
            Event::Lease {
                token: 2,
                holder: Some("n2".into()),
                expired: false,
                expires_at_us: 1_700_000_004_000_000,
                renewed_at_us: 1_700_000_000_000_000,
                at_ms: 950,
            },
            Event::Lease {
                token: 2,
                holder: None,
                expired: true,
                expires_at_us: 1_700_000_000_100_000,
                renewed_at_us: 1_700_000_000_000_000,
                at_ms: 1050,
            },
        ];
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &events).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert_eq!(text.lines().count(), events.len());
        assert!(text.starts_with(r#"{"type":"publish","#), "{text}");
        assert!(text.contains(r#""result":{"status":"acked","offset":1}"#));
        assert!(
            text.contains(
                r#"{"type":"lease","token":2,"holder":null,"expired":true,"expires_at_us":1700000000100000,"renewed_at_us":1700000000000000,"at_ms":1050}"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"{"type":"centrifugo_subscribed","subscriber":"z1","node":"n2","channel":"orders","recover_from":{"offset":1,"epoch":"0123456789abcdef"},"recovered":false,"#
            ),
            "{text}"
        );
        assert_eq!(read_jsonl(&buf[..]).unwrap(), events);
    }

    #[test]
    fn a_bad_line_is_reported_with_its_number() {
        let input = "\n{\"type\":\"takeover\",\"node\":\"n\",\"token\":1,\"at_ms\":0}\nnot json\n";
        match read_jsonl(input.as_bytes()) {
            Err(HistoryError::Parse { line, .. }) => assert_eq!(line, 3),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn final_state_without_lease_history_parses() {
        let state: FinalState = serde_json::from_str(
            r#"{"channels":{"a":[{"offset":1,"id":"m1","token":1,"published_at_ms":3}]}}"#,
        )
        .unwrap();
        assert_eq!(state.channels["a"].len(), 1);
        assert!(state.lease_history.is_none());
    }
}
