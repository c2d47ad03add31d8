//! Join and leave events between the nodes of one database
//! (`Storage::send_presence_events`, `Storage::watch_presence_events`):
//! each event is one `pg_notify` on [`PRESENCE_CHANNEL`], sent by
//! [`send`] on a pool connection, and heard by the listener connection
//! (`listen.rs`), which hands the payload to [`Inbox::heard`]. That drops
//! the events this storage sent itself (its node has delivered them) and
//! passes the others to the receivers.
//!
//! A payload is `<session key> <sequence> <JSON>`: the sending storage's
//! session key (decimal), a number that grows with each event it sends,
//! and the event as a JSON object (`kind`, `channel`, `user`, `client`,
//! `conn_info`, `chan_info`; the two infos are JSON text kept as strings).
//! The sequence makes every payload distinct: PostgreSQL delivers
//! identical payloads sent in one transaction only once (PostgreSQL
//! documentation, `NOTIFY`), and a join, a leave and a second join of one
//! client would be identical. A payload must be shorter than 8000 bytes
//! (same page); an event that is not is sent without its infos, and one
//! still too long is dropped with a warning.
//!
//! Delivery is at most once: a notification sent while a node's listener
//! is reconnecting is lost for that node, and nothing replays it.

use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::Object;
use herald_core::ChannelName;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::traits::{ClientInfo, PresenceEvent, PresenceEventKind};

/// The notification channel (`LISTEN`/`NOTIFY`) of join and leave events.
pub const PRESENCE_CHANNEL: &str = "herald_presence";

/// Capacity of the broadcast channel behind `watch_presence_events`: a
/// receiver that falls this many events behind loses the oldest.
pub const PRESENCE_EVENT_CAPACITY: usize = 4096;

/// Longest payload sent, in bytes: PostgreSQL refuses one of 8000 bytes or
/// more (PostgreSQL documentation, `NOTIFY`, "Parameters").
pub const MAX_PAYLOAD_BYTES: usize = 7999;

/// Sends `events` in order, one notification each, in one statement on
/// `client`; `seq` numbers them. Events too long even without their
/// infos are skipped (logged).
pub(super) async fn send(
    client: &Object,
    session_key: i64,
    seq: &AtomicU64,
    events: &[PresenceEvent],
) -> Result<()> {
    let payloads: Vec<String> = events
        .iter()
        .filter_map(|event| {
            let payload = encode(session_key, seq.fetch_add(1, Ordering::Relaxed), event);
            if payload.is_none() {
                tracing::warn!(
                    channel = %event.channel,
                    client = %event.info.client,
                    "join or leave event too long for a notification, even without its infos; not sent to the other nodes"
                );
            }
            payload
        })
        .collect();
    if payloads.is_empty() {
        return Ok(());
    }
    // A function scan of `unnest` yields the array in order, so the
    // notifications are queued (and delivered) in the events' order.
    let stmt = client
        .prepare_cached("SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload")
        .await?;
    client
        .execute(&stmt, &[&PRESENCE_CHANNEL, &payloads])
        .await?;
    Ok(())
}

/// The payload of `event`: with its infos if it fits in
/// [`MAX_PAYLOAD_BYTES`], else without them; `None` if it fits neither
/// way.
pub(super) fn encode(session_key: i64, seq: u64, event: &PresenceEvent) -> Option<String> {
    let kind = match event.kind {
        PresenceEventKind::Join => "join",
        PresenceEventKind::Leave => "leave",
    };
    let info = &event.info;
    let mut body = json!({
        "kind": kind,
        "channel": event.channel.as_str(),
        "user": info.user,
        "client": info.client,
    });
    if let Some(conn_info) = &info.conn_info {
        body["conn_info"] = Value::String(conn_info.clone());
    }
    if let Some(chan_info) = &info.chan_info {
        body["chan_info"] = Value::String(chan_info.clone());
    }
    let payload = format!("{session_key} {seq} {body}");
    if payload.len() <= MAX_PAYLOAD_BYTES {
        return Some(payload);
    }
    if let Some(body) = body.as_object_mut() {
        body.remove("conn_info");
        body.remove("chan_info");
    }
    let payload = format!("{session_key} {seq} {body}");
    (payload.len() <= MAX_PAYLOAD_BYTES).then_some(payload)
}

/// The sender's session key and the event of a payload; `None` when it
/// does not have the shape [`encode`] gives.
pub(super) fn decode(payload: &str) -> Option<(i64, PresenceEvent)> {
    let mut parts = payload.splitn(3, ' ');
    let session_key: i64 = parts.next()?.parse().ok()?;
    let _seq: u64 = parts.next()?.parse().ok()?;
    let body: Value = serde_json::from_str(parts.next()?).ok()?;
    let text = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
    let kind = match body.get("kind")?.as_str()? {
        "join" => PresenceEventKind::Join,
        "leave" => PresenceEventKind::Leave,
        _ => return None,
    };
    let event = PresenceEvent {
        kind,
        channel: ChannelName::new(body.get("channel")?.as_str()?).ok()?,
        info: ClientInfo {
            user: text("user")?,
            client: text("client")?,
            conn_info: text("conn_info"),
            chan_info: text("chan_info"),
        },
    };
    Some((session_key, event))
}

/// Where the listener hands the payloads it hears on
/// [`PRESENCE_CHANNEL`]. Cheap to clone.
#[derive(Clone)]
pub(super) struct Inbox {
    /// This storage's session key: its own events are dropped.
    session_key: i64,
    events: broadcast::Sender<PresenceEvent>,
}

impl Inbox {
    /// The inbox of the storage with `session_key`.
    pub(super) fn new(session_key: i64) -> Self {
        Self {
            session_key,
            events: broadcast::channel(PRESENCE_EVENT_CAPACITY).0,
        }
    }

    /// A receiver of the events heard from now on.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<PresenceEvent> {
        self.events.subscribe()
    }

    /// Passes on the event of `payload`, unless this storage sent it.
    pub(super) fn heard(&self, payload: &str) {
        match decode(payload) {
            Some((sender, _)) if sender == self.session_key => {}
            Some((_, event)) => {
                // No receiver is not an error.
                let _ = self.events.send(event);
            }
            None => tracing::warn!(payload = %payload, "unreadable join or leave event; dropped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: PresenceEventKind, conn_info: Option<&str>) -> PresenceEvent {
        PresenceEvent {
            kind,
            channel: ChannelName::new("chat:a").unwrap(),
            info: ClientInfo {
                user: "ann".to_owned(),
                client: "c-1".to_owned(),
                conn_info: conn_info.map(str::to_owned),
                chan_info: Some("[1,2]".to_owned()),
            },
        }
    }

    #[test]
    fn payloads_round_trip() {
        for kind in [PresenceEventKind::Join, PresenceEventKind::Leave] {
            let e = event(kind, Some(r#"{"name":"Ann \"A\""}"#));
            let payload = encode(-42, 7, &e).unwrap();
            assert!(payload.starts_with("-42 7 {"), "{payload}");
            assert_eq!(decode(&payload), Some((-42, e)));
        }
        let bare = event(PresenceEventKind::Join, None);
        assert_eq!(decode(&encode(1, 0, &bare).unwrap()), Some((1, bare)));
    }

    #[test]
    fn long_infos_are_dropped_to_fit() {
        let big = "x".repeat(MAX_PAYLOAD_BYTES);
        let e = event(PresenceEventKind::Join, Some(&format!("\"{big}\"")));
        let payload = encode(i64::MIN, u64::MAX, &e).unwrap();
        assert!(payload.len() <= MAX_PAYLOAD_BYTES);
        let (_, got) = decode(&payload).unwrap();
        assert_eq!((got.info.conn_info, got.info.chan_info), (None, None));
        assert_eq!(got.info.client, "c-1");
        let mut huge = event(PresenceEventKind::Leave, None);
        huge.info.user = big;
        assert_eq!(encode(1, 1, &huge), None);
    }

    #[test]
    fn malformed_payloads_are_rejected() {
        for bad in [
            "",
            "1 2",
            "x 2 {}",
            "1 x {}",
            "1 2 {",
            r#"1 2 {"kind":"stay","channel":"a","user":"","client":"c"}"#,
            r#"1 2 {"kind":"join","channel":"bad name","user":"","client":"c"}"#,
            r#"1 2 {"kind":"join","channel":"a","client":"c"}"#,
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
