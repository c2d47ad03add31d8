//! The lease observer: reads the writer lease's row straight from the
//! database every 100 ms and records each change as an [`Event::Lease`]
//! (a renewal changes `renewed_at` and `expires_at`, so every renewal seen
//! is recorded).
//!
//! It has a connection of its own to the cluster, never through a node's
//! fault proxy, so proxy faults do not blind it; a database restart does,
//! for as long as the restart takes: every error (a closed connection, a
//! query that does not answer within a second, no `storage_leases` table
//! yet) drops the connection quietly and the next tick opens a new one.
//!
//! Whether the lease has expired is judged by the database's clock in the
//! reading statement itself, as every lease decision of the storage is
//! (docs/storage.md), never by the harness's clock. The read is a plain
//! `SELECT`: it takes no row lock, so it never waits for (nor delays) a
//! renewal, an acquire or a fault holding the row.

use std::time::Duration;

use herald_chaos::history::Event;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::clients::Recorder;
use super::database::connect;

/// How often the row is read.
const POLL: Duration = Duration::from_millis(100);

/// Bound of connecting, and of one read.
const TIMEOUT: Duration = Duration::from_secs(1);

/// The lease row: its token, holder, whether it has expired on the
/// database's clock, and its expiry and last renewal in microseconds since
/// the Unix epoch.
const LEASE_SQL: &str = "SELECT token, holder, expires_at <= clock_timestamp(), \
         (extract(epoch FROM expires_at) * 1000000)::bigint, \
         (extract(epoch FROM renewed_at) * 1000000)::bigint \
     FROM storage_leases WHERE name = 'writer'";

/// What one read found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    token: u64,
    holder: Option<String>,
    expired: bool,
    expires_at_us: i64,
    renewed_at_us: i64,
}

/// Starts the observer on the database at `url` (the cluster's own
/// address); it stops when `stop` is cancelled.
pub(crate) fn observer(url: String, recorder: Recorder, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut client: Option<tokio_postgres::Client> = None;
        let mut last: Option<Seen> = None;
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = match tokio::time::timeout(TIMEOUT, connect(&url)).await {
                    Ok(Ok(c)) => Some(c),
                    _ => None,
                };
            }
            let Some(conn) = client.as_ref() else {
                continue;
            };
            let row = match tokio::time::timeout(TIMEOUT, conn.query_opt(LEASE_SQL, &[])).await {
                Ok(Ok(row)) => row,
                _ => {
                    client = None;
                    continue;
                }
            };
            let at_ms = recorder.now_ms();
            let Some(row) = row else {
                // No lease row yet: no node acquired the lease so far.
                continue;
            };
            let seen = match (
                row.try_get::<_, i64>(0),
                row.try_get::<_, Option<String>>(1),
                row.try_get::<_, bool>(2),
                row.try_get::<_, i64>(3),
                row.try_get::<_, i64>(4),
            ) {
                (Ok(token), Ok(holder), Ok(expired), Ok(expires_at_us), Ok(renewed_at_us)) => {
                    Seen {
                        token: u64::try_from(token).unwrap_or(0),
                        holder,
                        expired,
                        expires_at_us,
                        renewed_at_us,
                    }
                }
                _ => continue,
            };
            if last.as_ref() != Some(&seen) {
                recorder.push(Event::Lease {
                    token: seen.token,
                    holder: seen.holder.clone(),
                    expired: seen.expired,
                    expires_at_us: seen.expires_at_us,
                    renewed_at_us: seen.renewed_at_us,
                    at_ms,
                });
                last = Some(seen);
            }
        }
    })
}
