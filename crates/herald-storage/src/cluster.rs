//! Cluster events: what one node tells every other node that shares its
//! database, and their wire form.
//!
//! A cluster event is a request to act on the clients a node holds (end a
//! user's subscriptions, close a user's connections), sent by the node
//! that received it from an API call and applied by every other node to
//! its own clients. Events are best-effort and not stored: a node that is
//! not listening at the moment one is sent (its listening connection is
//! reconnecting, or it starts later) never gets it. What must reach every
//! node despite that goes through stored data and the change feed instead
//! (a channel's deletion: [`crate::MessageLog::record_deletion`]).
//!
//! On PostgreSQL an event is one `NOTIFY` on [`crate::postgres::CLUSTER_CHANNEL`]
//! whose payload is the JSON text described below; every node's listening
//! connection hears it and drops the events its own storage sent
//! ([`crate::ClusterView::send_cluster_event`],
//! [`crate::ClusterView::watch_cluster_events`]). A payload must be shorter
//! than 8000 bytes in PostgreSQL's default configuration (PostgreSQL
//! documentation, `NOTIFY`): an event whose text would be longer is
//! refused with [`Error::ClusterEventTooLarge`] before anything is sent.
//! SQLite has no such path: its events reach no other process.
//!
//! The payload is a JSON object `{"origin": "<sender>", "event": {"type":
//! "<kind>", ...}}`, `origin` the decimal session key of the sending
//! storage. A node ignores an event whose `type` it does not know (a newer
//! node's), so new kinds can be added without breaking older nodes.

use herald_core::ChannelName;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// The longest payload sent, in bytes: PostgreSQL refuses a `NOTIFY`
/// payload of 8000 bytes or more in its default configuration
/// (PostgreSQL documentation, `NOTIFY`: "the payload string ... must be
/// shorter than 8000 bytes").
pub const MAX_PAYLOAD_BYTES: usize = 7999;

/// An event for every node of the cluster (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// End `user`'s subscriptions to `channel` (Centrifugo's server API
    /// `unsubscribe`). Wire form `{"type": "unsubscribe", "user": "...",
    /// "channel": "..."}`.
    Unsubscribe {
        /// The user (a token's `sub`; empty for anonymous connections).
        user: String,
        /// The channel.
        channel: ChannelName,
    },
    /// Close `user`'s connections with the WebSocket close `code`
    /// (Centrifugo's server API `disconnect`; the code is one of
    /// Centrifugo's disconnect codes, 3000–4999). Wire form `{"type":
    /// "disconnect", "user": "...", "code": N}`.
    Disconnect {
        /// The user.
        user: String,
        /// The close code.
        code: u16,
    },
}

impl ClusterEvent {
    /// The event as JSON (without the envelope).
    fn to_json(&self) -> Value {
        match self {
            Self::Unsubscribe { user, channel } => {
                json!({"type": "unsubscribe", "user": user, "channel": channel.as_str()})
            }
            Self::Disconnect { user, code } => {
                json!({"type": "disconnect", "user": user, "code": code})
            }
        }
    }

    /// Reads an event; `None` for an unknown `type` or a malformed one.
    fn from_json(value: &Map<String, Value>) -> Option<Self> {
        let text = |name: &str| value.get(name)?.as_str().map(str::to_owned);
        match value.get("type")?.as_str()? {
            "unsubscribe" => Some(Self::Unsubscribe {
                user: text("user")?,
                channel: ChannelName::new(text("channel")?).ok()?,
            }),
            "disconnect" => Some(Self::Disconnect {
                user: text("user")?,
                code: u16::try_from(value.get("code")?.as_u64()?).ok()?,
            }),
            _ => None,
        }
    }

    /// Checks that the event fits in one payload from any sender, so that
    /// a caller can refuse it before it acts on anything.
    ///
    /// # Errors
    /// [`Error::ClusterEventTooLarge`] when its payload would not fit.
    pub fn check_size(&self) -> Result<()> {
        // The longest origin there is: the smallest i64, in decimal.
        encode(i64::MIN, self).map(drop)
    }
}

/// The payload of `event` sent by the storage whose session key is
/// `origin`.
///
/// # Errors
/// [`Error::ClusterEventTooLarge`] when it would be longer than
/// [`MAX_PAYLOAD_BYTES`].
pub(crate) fn encode(origin: i64, event: &ClusterEvent) -> Result<String> {
    let text = json!({"origin": origin.to_string(), "event": event.to_json()}).to_string();
    if text.len() > MAX_PAYLOAD_BYTES {
        return Err(Error::ClusterEventTooLarge {
            bytes: text.len(),
            limit: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(text)
}

/// Reads a payload: the sender's session key and the event; `None` when it
/// does not parse or its event is of an unknown kind.
pub(crate) fn decode(payload: &str) -> Option<(i64, ClusterEvent)> {
    let value: Value = serde_json::from_str(payload).ok()?;
    let origin = value.get("origin")?.as_str()?.parse().ok()?;
    let event = ClusterEvent::from_json(value.get("event")?.as_object()?)?;
    Some((origin, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip() {
        let events = [
            ClusterEvent::Unsubscribe {
                user: "ann \"quoted\" ünïcode".to_owned(),
                channel: ChannelName::new("news:a").unwrap(),
            },
            ClusterEvent::Disconnect {
                user: String::new(),
                code: 3503,
            },
        ];
        for event in events {
            let payload = encode(-42, &event).unwrap();
            assert_eq!(decode(&payload), Some((-42, event)));
        }
    }

    #[test]
    fn unknown_and_malformed_payloads_are_ignored() {
        for bad in [
            "",
            "3 4 5 ch",
            r#"{"origin": "1"}"#,
            r#"{"origin": 1, "event": {"type": "disconnect", "user": "u", "code": 3503}}"#,
            r#"{"origin": "1", "event": {"type": "join", "user": "u"}}"#,
            r#"{"origin": "1", "event": {"type": "unsubscribe", "user": "u", "channel": "bad name"}}"#,
            r#"{"origin": "1", "event": {"type": "disconnect", "user": "u", "code": 70000}}"#,
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_payload_over_the_limit_is_refused() {
        let fits = |n: usize| {
            ClusterEvent::Disconnect {
                user: "u".repeat(n),
                code: 3503,
            }
            .check_size()
        };
        // The envelope and the event's other fields take the rest.
        let overhead = encode(
            i64::MIN,
            &ClusterEvent::Disconnect {
                user: String::new(),
                code: 3503,
            },
        )
        .unwrap()
        .len();
        assert!(fits(MAX_PAYLOAD_BYTES - overhead).is_ok());
        match fits(MAX_PAYLOAD_BYTES - overhead + 1) {
            Err(Error::ClusterEventTooLarge { bytes, limit }) => {
                assert_eq!((bytes, limit), (MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES));
            }
            other => panic!("expected ClusterEventTooLarge, got {other:?}"),
        }
    }
}
