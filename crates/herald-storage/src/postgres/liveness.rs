//! The liveness connections: two dedicated, idle connections per storage,
//! one holding the session-level advisory lock of the storage's session
//! key and one that of its twin (`super::twin_key`), for the storage's
//! whole life; each is one run of this module's task. Other nodes find the
//! storage gone only when neither lock is held, so one connection ended on
//! its own (a terminated backend) is taken back without a takeover, while
//! a crash ends both at once.
//!
//! PostgreSQL releases a session-level advisory lock when its session ends
//! (PostgreSQL documentation, "Explicit Locking", "Advisory Locks"). The
//! session ends when the client closes the connection (the storage was
//! dropped, the process exited or crashed) or when the server finds the
//! client's host gone: this connection asks the server for TCP keepalives
//! after 5 s of silence, a probe every 1 s, 5 probes, and a TCP user
//! timeout of 10 s (`tcp_keepalives_idle`, `tcp_keepalives_interval`,
//! `tcp_keepalives_count`, `tcp_user_timeout`: per-session settings,
//! "Connections and Authentication"; they apply to TCP connections only).
//! So another node that can take the lock knows that the holder's process,
//! or at least its connection, is gone.
//!
//! When the connection of a live storage fails (a network fault, a
//! terminated backend), this task reconnects with backoff (100 ms doubling
//! to 2 s, warnings rate-limited: see `reconnect.rs`) and takes the same
//! key again. That is best effort: if the other connection has failed too,
//! until one has its key again another node may find both keys free and
//! take the lease over (`TakeoverReason::HolderGone`). That is safe: the
//! takeover increments the fencing token, so this node's next fenced write
//! or renewal fails with `LeaseLost` and it stops writing.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{Client, Config};

use super::reconnect::{keep_open, Kept};
use super::session::{connect_raw, drive, PgConnection};
use crate::error::{Error, Result};

/// Longest wait to take the key again after a reconnect. The old session
/// may still hold it until the server notices that its client is gone
/// (about 10 s with the keepalive settings above).
const RELOCK_WAIT: Duration = Duration::from_secs(30);
/// Longest wait for the server to close the session after the storage was
/// dropped.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The session-level lock that marks this storage's session as alive.
const LOCK_SQL: &str = "SELECT pg_advisory_lock($1)";

/// Opens a liveness connection and takes the session lock of `key`, within
/// `lock_limit` in all (connecting is bounded by `connect_limit`).
pub(super) async fn establish(
    config: &Config,
    key: i64,
    connect_limit: Duration,
    lock_limit: Duration,
) -> Result<(Client, PgConnection)> {
    let setup = async {
        let (client, mut connection) = connect_raw(config, connect_limit).await?;
        drive(&mut connection, client.execute(LOCK_SQL, &[&key]), |_| {}).await??;
        Ok::<_, Error>((client, connection))
    };
    tokio::time::timeout(lock_limit, setup).await.map_err(|_| {
        Error::unavailable(format!(
            "the liveness connection could not take its session lock within {} ms",
            lock_limit.as_millis()
        ))
    })?
}

/// The liveness task: keeps `first` (which holds the lock) open until it
/// ends, then reconnects and takes the key again ([`keep_open`]), until
/// `stop`'s sender is dropped; then it closes the connection, which
/// releases the lock.
pub(super) async fn run(
    config: Config,
    key: i64,
    connect_limit: Duration,
    first: (Client, PgConnection),
    stop: watch::Receiver<()>,
) {
    let liveness = Liveness {
        config,
        key,
        connect_limit,
    };
    keep_open(liveness, first, stop).await;
}

/// One liveness connection as [`keep_open`] keeps it open.
struct Liveness {
    /// The liveness connection's settings.
    config: Config,
    /// The key of the session lock it holds.
    key: i64,
    /// Longest wait to connect.
    connect_limit: Duration,
}

impl Kept for Liveness {
    const LOST: &'static str = "liveness connection lost; reconnecting to take the session lock \
         again (the other liveness connection still marks this node alive; if it is lost too, \
         another node may take the lease over)";
    const RECONNECTED: &'static str = "liveness session lock taken again";
    const NOT_RECONNECTED: &'static str = "liveness connection could not reconnect";
    const CLOSE_WAIT: Option<Duration> = Some(CLOSE_WAIT);

    fn open(&self) -> impl Future<Output = Result<(Client, PgConnection)>> + Send {
        establish(&self.config, self.key, self.connect_limit, RELOCK_WAIT)
    }

    fn session_key(&self) -> Option<i64> {
        Some(self.key)
    }
}
