//! The takeover watch: how a standby learns, within
//! [`POLL`] (100 ms), that the holder's process is gone, instead of on its
//! next acquire period.
//!
//! One dedicated connection per storage, opened the first time a standby
//! waits for a takeover hint, reads the holder's session key from the lease
//! row and then asks every [`POLL`] whether that session's advisory lock
//! and its twin's (`super::twin_key`: the holder's second liveness
//! session) are both free, with one statement of transaction-level
//! try-locks that are given back when it ends, so that it never keeps the
//! holder from taking a lock back. A liveness session's lock is freed the
//! moment the session ends (PostgreSQL documentation, "Explicit Locking",
//! "Advisory Locks"). When both are free, the watch bumps a counter that
//! [`super::PostgresStorage`]'s `takeover_hint` waits on; while only one
//! is (one of the holder's sessions ended on its own and is coming back),
//! it asks again. The acquire that follows decides as always, under the
//! lease row lock.
//!
//! It asks rather than waits. A statement keeps its snapshot while it
//! waits for a lock, and the oldest snapshot of any session bounds what
//! `VACUUM` and page pruning may remove (PostgreSQL documentation,
//! "Routine Vacuuming"): a blocking `pg_advisory_lock` for the holder's
//! whole life, as the watch first did, kept every row version made
//! meanwhile, each channel head the holder moved and each renewal of the
//! lease row, so the tables bloated and the holder's writes slowed down
//! (fourfold within a minute at 64 publishers) for as long as a standby
//! watched, and after, since a killed standby's waiting session outlived
//! it. Waits bounded by a `lock_timeout` would end that, but each would
//! end in an error that the server logs, ten a second per standby.
//!
//! Locks found free while the database server has been up for less than
//! the holder-gone grace (a restart ends every session, the live holder's
//! included) are not reported: the watch waits out the grace and looks
//! again, by which time a live holder has taken its lock back.
//!
//! The watch fires once per holder session; when the lease moves to
//! another holder (a new fencing token), it drops its connection (which
//! ends a question in flight) and watches the new one. Errors close the connection;
//! the next attempt comes after [`RETRY`], so a database outage cannot
//! make it spin.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{Client, Config};

use super::names::{twin_key, HOLDER_GONE_GRACE_MS};
use super::session::{connect_raw, drive, PgConnection};
use crate::error::Result;

/// Pause after a failed connection or statement before the next attempt.
const RETRY: Duration = Duration::from_secs(1);

/// How often the watch asks whether the holder's session locks are free:
/// the most a takeover hint comes after the holder's sessions ended,
/// besides a round trip.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// The holder's session key, when the lease has a live holder.
const HOLDER_SESSION_SQL: &str = "SELECT holder_session FROM storage_leases \
     WHERE name = $1 AND holder IS NOT NULL AND expires_at > clock_timestamp()";
/// Whether both keys are free now (transaction-level try-locks, released
/// with this statement), and how long the database server has been up, in
/// ms.
const BOTH_FREE_SQL: &str = "SELECT pg_try_advisory_xact_lock($1) \
         AND pg_try_advisory_xact_lock($2), \
     (extract(epoch FROM clock_timestamp() - pg_postmaster_start_time()) * 1000)::bigint";

/// What the standby waits for: the lease name and the fencing token it
/// found held.
pub(super) type Target = Option<(String, u64)>;

/// The watch task. `target` says which lease to watch (set by
/// `takeover_hint`); `fired` is bumped each time a watched holder's session
/// ends; `own_session` is never watched. Ends when `stop`'s sender is
/// dropped.
pub(super) async fn run(
    config: Config,
    connect_limit: Duration,
    own_session: i64,
    mut target: watch::Receiver<Target>,
    fired: watch::Sender<u64>,
    mut stop: watch::Receiver<()>,
) {
    let mut connection: Option<(Client, PgConnection)> = None;
    // The session already reported, so that it is not reported twice.
    let mut reported: Option<i64> = None;
    loop {
        let Some((name, _token)) = target.borrow_and_update().clone() else {
            tokio::select! {
                _ = stop.changed() => return,
                changed = target.changed() => if changed.is_err() { return },
            }
            continue;
        };
        if connection.is_none() {
            match connect_raw(&config, connect_limit).await {
                Ok(opened) => connection = Some(opened),
                Err(e) => {
                    tracing::debug!(error = %e, "takeover watch could not connect");
                    if pause(&mut stop, RETRY).await {
                        return;
                    }
                    continue;
                }
            }
        }
        let Some((client, conn)) = connection.as_mut() else {
            continue;
        };
        let key = match holder_session(client, conn, &name).await {
            Ok(key) => key,
            Err(e) => {
                tracing::debug!(error = %e, "takeover watch could not read the lease");
                connection = None;
                if pause(&mut stop, RETRY).await {
                    return;
                }
                continue;
            }
        };
        let Some(key) = key.filter(|k| *k != own_session && Some(*k) != reported) else {
            // Nothing to wait for (no live holder, our own session, or one
            // already reported): the acquire period covers it.
            tokio::select! {
                _ = stop.changed() => return,
                changed = target.changed() => if changed.is_err() { return },
            }
            continue;
        };
        let waited = tokio::select! {
            _ = stop.changed() => return,
            // Another holder now: watch the new one.
            _ = target.changed() => None,
            waited = wait_until_both_free(client, conn, key) => Some(waited),
        };
        let uptime_ms = match waited {
            None => {
                connection = None;
                continue;
            }
            Some(Ok(answer)) => answer,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "takeover watch: asking for the holder's session locks failed");
                connection = None;
                if pause(&mut stop, RETRY).await {
                    return;
                }
                continue;
            }
        };
        if uptime_ms >= HOLDER_GONE_GRACE_MS {
            tracing::info!(
                session_key = key,
                "the holder's sessions ended; trying to acquire now"
            );
            reported = Some(key);
            fired.send_modify(|n| *n += 1);
        } else {
            // The server just started: the holder may be reconnecting.
            let rest = HOLDER_GONE_GRACE_MS.saturating_sub(uptime_ms);
            if pause(&mut stop, Duration::from_millis(rest.unsigned_abs())).await {
                return;
            }
        }
    }
}

/// Sleeps `d` (on a pause that cannot end early, see `reconnect.rs`)
/// unless stopped first; returns whether to stop.
async fn pause(stop: &mut watch::Receiver<()>, d: Duration) -> bool {
    tokio::select! {
        _ = stop.changed() => true,
        () = super::reconnect::pause(d) => false,
    }
}

/// The session key of the lease's live holder, if any.
async fn holder_session(
    client: &Client,
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<i64>> {
    let row = drive(conn, client.query_opt(HOLDER_SESSION_SQL, &[&name]), |_| {}).await??;
    let session: Option<String> = match row {
        Some(row) => row.try_get(0)?,
        None => None,
    };
    Ok(session.and_then(|s| s.parse().ok()))
}

/// Asks every [`POLL`] until the locks of `key` and its twin are both
/// free at one instant; then answers the server's uptime in ms.
async fn wait_until_both_free(client: &Client, conn: &mut PgConnection, key: i64) -> Result<i64> {
    let twin = twin_key(key);
    loop {
        let row = drive(
            conn,
            client.query_one(BOTH_FREE_SQL, &[&key, &twin]),
            |_| {},
        )
        .await??;
        if row.try_get(0)? {
            return Ok(row.try_get(1)?);
        }
        super::reconnect::pause(POLL).await;
    }
}
