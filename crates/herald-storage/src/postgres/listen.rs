//! The change listener: one dedicated connection per storage that runs
//! `LISTEN` on [`CHANGES_CHANNEL`] and turns each notification into a
//! [`ChangeSignal`] on a broadcast channel, `LISTEN` on
//! [`LEASE_CHANNEL`], whose notifications (a lease was released) bump a
//! counter that standbys wait on, `LISTEN` on [`PRESENCE_CHANNEL`], whose
//! join and leave events go to `presence_events.rs`, and `LISTEN` on
//! [`CLUSTER_CHANNEL`], whose notifications are other nodes' cluster
//! events (`cluster.rs`).
//!
//! Fenced writes send their notices with `pg_notify` inside their
//! transaction; PostgreSQL delivers them only when that transaction commits,
//! and never those of a transaction that rolled back (PostgreSQL
//! documentation, `NOTIFY`). Notifications arrive as asynchronous messages
//! of the connection, read here with `Connection::poll_message`, which also
//! drives the connection.
//!
//! When the connection fails, the task opens a new one after a pause that
//! starts at 100 ms and doubles up to 2 s while attempts keep failing (or
//! connections keep being lost within 10 s), with its warnings
//! rate-limited: the reconnect loop of `reconnect.rs`. Every successful `LISTEN` (the first
//! one included) is followed by [`ChangeSignal::Resync`]: notices sent
//! while no connection listened are lost, and receivers catch up with
//! `changes_since` and `deletions_since`. It also bumps the lease counter,
//! since a release may have been missed too. Cluster events sent meanwhile
//! are lost for good (they are best effort; see `crate::cluster`).

use std::future::Future;
use std::time::Duration;

use herald_core::ChannelName;
use tokio::sync::{broadcast, watch};
use tokio_postgres::{AsyncMessage, Client, Config};

use super::cluster;
use super::names::{CHANGES_CHANNEL, CLUSTER_CHANNEL, LEASE_CHANNEL};
use super::presence_events::{Inbox, PRESENCE_CHANNEL};
use super::reconnect::{keep_open, Kept};
use super::session::{connect_raw, drive, PgConnection};
use crate::cluster::ClusterEvent;
use crate::error::{Error, Result};
use crate::traits::{ChangeSignal, Deletion};

/// The statements that subscribe the connection to the notices.
fn listen_sql() -> String {
    format!(
        "LISTEN {CHANGES_CHANNEL}; LISTEN {LEASE_CHANNEL}; LISTEN {PRESENCE_CHANNEL}; \
         LISTEN {CLUSTER_CHANNEL}"
    )
}

/// Where the listener sends what it hears.
#[derive(Clone)]
pub(super) struct Outputs {
    /// Change notices of fenced writes.
    pub(super) changes: broadcast::Sender<ChangeSignal>,
    /// Counts lease releases heard (and reconnects, when some may have been
    /// missed).
    pub(super) releases: watch::Sender<u64>,
    /// Join and leave events of other nodes.
    pub(super) presence: Inbox,
    /// Other nodes' cluster events.
    pub(super) cluster: broadcast::Sender<ClusterEvent>,
    /// This storage's session key: its own cluster events are dropped.
    pub(super) session_key: i64,
}

/// Opens a listening connection: connects and runs `LISTEN`, both within
/// `limit`.
pub(super) async fn establish(
    config: &Config,
    limit: Duration,
    outputs: &Outputs,
) -> Result<(Client, PgConnection)> {
    let setup = async {
        let (client, mut connection) = connect_raw(config, limit).await?;
        let sql = listen_sql();
        drive(&mut connection, client.batch_execute(&sql), |m| {
            handle(m, outputs);
        })
        .await??;
        Ok::<_, Error>((client, connection))
    };
    tokio::time::timeout(limit, setup).await.map_err(|_| {
        Error::unavailable(format!(
            "the change listener could not connect and LISTEN within {} ms",
            limit.as_millis()
        ))
    })?
}

/// The listener task: serves `first` (already listening) until it ends,
/// then reconnects with backoff ([`keep_open`]), until `stop`'s sender is
/// dropped.
pub(super) async fn run(
    config: Config,
    limit: Duration,
    outputs: Outputs,
    first: (Client, PgConnection),
    stop: watch::Receiver<()>,
) {
    let listener = Listener {
        config,
        limit,
        outputs,
    };
    keep_open(listener, first, stop).await;
}

/// The change listener as [`keep_open`] keeps it open.
struct Listener {
    /// The listener connection's settings.
    config: Config,
    /// Longest wait to connect and `LISTEN`.
    limit: Duration,
    /// Where what it hears goes.
    outputs: Outputs,
}

impl Kept for Listener {
    const LOST: &'static str = "change listener connection lost; reconnecting";
    const RECONNECTED: &'static str = "change listener reconnected";
    const NOT_RECONNECTED: &'static str = "change listener could not reconnect";

    fn open(&self) -> impl Future<Output = Result<(Client, PgConnection)>> + Send {
        establish(&self.config, self.limit, &self.outputs)
    }

    /// Listening from here on: whatever was sent before is unknown.
    fn serving(&self) {
        let _ = self.outputs.changes.send(ChangeSignal::Resync);
        self.outputs.releases.send_modify(|n| *n += 1);
    }

    fn heard(&self, message: AsyncMessage) {
        handle(message, &self.outputs);
    }
}

/// Forwards one asynchronous message: a change notice of ours becomes a
/// signal; a payload that does not parse becomes [`ChangeSignal::Resync`],
/// so that receivers catch up instead of missing it. A lease notice bumps
/// the release counter. A join or leave event goes to the presence inbox,
/// another node's cluster event to the cluster receivers.
fn handle(message: AsyncMessage, outputs: &Outputs) {
    let sender = &outputs.changes;
    match message {
        AsyncMessage::Notification(n) if n.channel() == LEASE_CHANNEL => {
            tracing::debug!(lease = %n.payload(), "lease released");
            outputs.releases.send_modify(|count| *count += 1);
        }
        AsyncMessage::Notification(n) if n.channel() == PRESENCE_CHANNEL => {
            outputs.presence.heard(n.payload());
        }
        AsyncMessage::Notification(n) if n.channel() == CLUSTER_CHANNEL => {
            cluster::hear(n.payload(), outputs.session_key, &outputs.cluster);
        }
        AsyncMessage::Notification(n) if n.channel() == CHANGES_CHANNEL => {
            let signal = parse_payload(n.payload()).unwrap_or_else(|| {
                tracing::warn!(payload = %n.payload(), "unreadable change notice; asking receivers to resync");
                ChangeSignal::Resync
            });
            // No receiver is not an error.
            let _ = sender.send(signal);
        }
        AsyncMessage::Notice(notice) => {
            tracing::debug!(message = %notice.message(), "notice on the change listener connection");
        }
        _ => {}
    }
}

/// Reads the payload a fenced write sends for one channel (see
/// `NOTIFY_SQL` in the fenced write): `<from> <to> <committed_at_ms>
/// <channel>`, decimal numbers and the channel name last; or, for a
/// deletion (`NOTIFY_DELETION_SQL`), `deleted <number> <head> <channel>`;
/// `None` when it has neither shape.
pub(super) fn parse_payload(payload: &str) -> Option<ChangeSignal> {
    if let Some(deletion) = payload.strip_prefix("deleted ") {
        return parse_deletion(deletion);
    }
    let mut parts = payload.splitn(4, ' ');
    let from: u64 = parts.next()?.parse().ok()?;
    let to: u64 = parts.next()?.parse().ok()?;
    let committed_at_ms: i64 = parts.next()?.parse().ok()?;
    let channel = ChannelName::new(parts.next()?).ok()?;
    (from >= 1 && from <= to).then_some(ChangeSignal::Committed {
        channel,
        from,
        to,
        committed_at_ms,
    })
}

/// Reads `<number> <head> <channel>` of a deletion's payload.
fn parse_deletion(payload: &str) -> Option<ChangeSignal> {
    let mut parts = payload.splitn(3, ' ');
    let number: u64 = parts.next()?.parse().ok()?;
    let head: u64 = parts.next()?.parse().ok()?;
    let channel = ChannelName::new(parts.next()?).ok()?;
    (number >= 1).then_some(ChangeSignal::Deleted(Deletion {
        channel,
        head,
        number,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        assert_eq!(
            parse_payload("3 7 1700000000123 room:a.b_c-d"),
            Some(ChangeSignal::Committed {
                channel: ChannelName::new("room:a.b_c-d").unwrap(),
                from: 3,
                to: 7,
                committed_at_ms: 1_700_000_000_123,
            })
        );
    }

    #[test]
    fn deletion_payloads_round_trip() {
        assert_eq!(
            parse_payload("deleted 4 17 room:a"),
            Some(ChangeSignal::Deleted(Deletion {
                channel: ChannelName::new("room:a").unwrap(),
                head: 17,
                number: 4,
            }))
        );
    }

    #[test]
    fn malformed_payloads_are_rejected() {
        for bad in [
            "",
            "1 2 3",
            "x 2 3 ch",
            "1 2 3 ",
            "2 1 3 ch",
            "0 1 3 ch",
            "1 2 3 bad name",
            "deleted 0 3 ch",
            "deleted 1 x ch",
            "deleted 1 3",
            "deleted 1 3 bad name",
        ] {
            assert_eq!(parse_payload(bad), None, "{bad:?}");
        }
    }
}
