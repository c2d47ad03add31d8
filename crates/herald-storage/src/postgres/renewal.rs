//! The dedicated renewal connection: outside the pool, replaced whenever an
//! attempt fails or does not answer in time.
//!
//! An attempt takes the idle connection out of its slot (or opens a fresh
//! one when there is none), so that no attempt ever waits for another one.
//! It puts the connection back only after a clean answer (renewed, or lease
//! lost after a rollback). On any other error, and when the whole attempt
//! (connecting included) has no answer within the renewal statement
//! timeout + 1 s, the connection is dropped and its connection task
//! aborted, which closes the socket; the server, checking every
//! `client_connection_check_interval`, then ends whatever the attempt left
//! running and rolls it back. The outcome of an abandoned attempt is
//! unknown and reported as [`Error::Unavailable`]: it never counts as a
//! renewal.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::Lease;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, IsolationLevel, Statement};

use super::session::{open_connection, read_settings, SessionSettings};
use crate::decode::{log_lost, lost, sql_token};
use crate::error::{Error, Result};

/// How long after the renewal statement timeout an attempt that has not
/// answered is abandoned.
const ABANDON_GRACE: Duration = Duration::from_secs(1);

/// The renewal's lock on the lease row. `FOR NO KEY UPDATE` does not
/// conflict with the `FOR KEY SHARE` of fenced writes, so this waits only
/// for an acquire, a release or another renewal (PostgreSQL documentation,
/// "Explicit Locking", "Row-Level Locks").
const LOCK_ROW_SQL: &str = "SELECT 1 FROM storage_leases WHERE name = $1 FOR NO KEY UPDATE";

/// The guarded extension, run after the row lock is held, so that "not yet
/// expired" is judged on a clock reading taken after any wait. Changes no
/// key column (neither is in a unique index), so it keeps the lock mode
/// above.
const EXTEND_SQL: &str = "UPDATE storage_leases AS l \
     SET expires_at = c.now + $4::bigint * interval '1 millisecond', renewed_at = c.now \
     FROM (SELECT clock_timestamp() AS now) AS c \
     WHERE l.name = $1 AND l.holder = $2 AND l.token = $3 AND l.expires_at > c.now";

/// [`EXTEND_SQL`] without its "not yet expired" guard, used only under the
/// test-only fault switch `renew_expired`
/// (`herald_core::fault_switches::FaultSwitch::RenewExpired`).
const EXTEND_EXPIRED_SQL: &str = "UPDATE storage_leases AS l \
     SET expires_at = c.now + $4::bigint * interval '1 millisecond', renewed_at = c.now \
     FROM (SELECT clock_timestamp() AS now) AS c \
     WHERE l.name = $1 AND l.holder = $2 AND l.token = $3";

/// A connection task that is aborted when this is dropped: the socket
/// closes at once, whether or not a statement is in flight. (An idle
/// session that sees its socket close ends quietly.)
struct ConnectionTask(JoinHandle<()>);

impl Drop for ConnectionTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One open renewal connection with its prepared statements. Dropping it
/// closes the connection at once.
struct RenewalConnection {
    /// Counts connections opened by this storage, for logs.
    id: u64,
    client: Client,
    lock_row: Statement,
    extend: Statement,
    _task: ConnectionTask,
}

type Work<'c, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'c>>;

/// The renewal connection of one storage.
pub(super) struct Renewal {
    config: Config,
    statement_timeout: Duration,
    connect_limit: Duration,
    idle: Mutex<Option<RenewalConnection>>,
    opened: AtomicU64,
}

impl Renewal {
    /// No connection is opened until the first attempt.
    pub(super) fn new(
        config: Config,
        statement_timeout: Duration,
        connect_limit: Duration,
    ) -> Self {
        Self {
            config,
            statement_timeout,
            connect_limit,
            idle: Mutex::new(None),
            opened: AtomicU64::new(0),
        }
    }

    /// Extends `lease` to now + `ttl_ms` on the database clock: one
    /// transaction of two statements, the row lock then the guarded update.
    /// (Under the test-only fault switch `renew_expired`, the update has no
    /// expiry guard: see [`EXTEND_EXPIRED_SQL`] and
    /// `herald_core::fault_switches::FaultSwitch::RenewExpired`.)
    pub(super) async fn renew(&self, lease: &Lease, ttl_ms: i64) -> Result<()> {
        let token = sql_token(lease)?;
        let name = lease.name.clone();
        let holder = lease.holder.clone();
        let renewed = self
            .run(move |conn| {
                Box::pin(async move {
                    let tx = conn
                        .client
                        .build_transaction()
                        .isolation_level(IsolationLevel::ReadCommitted)
                        .start()
                        .await?;
                    tx.query_opt(&conn.lock_row, &[&name]).await?;
                    let updated = tx
                        .execute(&conn.extend, &[&name, &holder, &token, &ttl_ms])
                        .await?;
                    if updated == 0 {
                        // The lease is lost whatever the rollback does; a
                        // connection that broke here fails the next attempt
                        // (if any) and is replaced then.
                        if let Err(e) = tx.rollback().await {
                            tracing::debug!(error = %Error::from(e), "rollback after a lost renewal");
                        }
                        return Ok(false);
                    }
                    tx.commit().await?;
                    Ok(true)
                })
            })
            .await;
        let outcome = match renewed {
            Ok(true) => Ok(()),
            Ok(false) => Err(lost(lease)),
            Err(e) => Err(e),
        };
        match &outcome {
            Err(Error::LeaseLost { .. }) => log_lost(lease, "renewal matched no current lease"),
            Err(e) => tracing::warn!(
                lease = %lease.name,
                token = lease.token.0,
                holder = %lease.holder,
                error = %e,
                "lease renewal attempt failed; its connection was dropped"
            ),
            Ok(()) => {}
        }
        outcome
    }

    /// The session settings of the renewal connection, read under the same
    /// rules as a renewal attempt.
    pub(super) async fn settings(&self) -> Result<SessionSettings> {
        self.run(|conn| Box::pin(read_settings(&conn.client))).await
    }

    /// One attempt: takes (or opens) the connection, runs `work` on it, and
    /// puts the connection back after a success; after an error the
    /// connection is dropped. Abandons the attempt when it has no answer
    /// within the statement timeout + 1 s.
    async fn run<T>(
        &self,
        work: impl for<'c> FnOnce(&'c mut RenewalConnection) -> Work<'c, T> + Send,
    ) -> Result<T> {
        let limit = self.statement_timeout + ABANDON_GRACE;
        let started = Instant::now();
        let mut checkout = self.take_idle();
        let attempt = async {
            let conn = match &mut checkout {
                Some(conn) => conn,
                None => checkout.insert(self.open().await?),
            };
            work(conn).await
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(Ok(value)) => {
                self.put_back(checkout);
                Ok(value)
            }
            // Dropping `checkout` closes the connection.
            Ok(Err(e)) => Err(e),
            Err(_) => {
                tracing::warn!(
                    connection = checkout.as_ref().map_or(0, |c| c.id),
                    waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
                    "renewal attempt abandoned: no answer in time; its connection is dropped"
                );
                Err(Error::unavailable(format!(
                    "renewal did not answer within {} ms; its outcome is unknown",
                    limit.as_millis()
                )))
            }
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<RenewalConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The idle connection, unless there is none or it has closed.
    fn take_idle(&self) -> Option<RenewalConnection> {
        let conn = self.slot().take()?;
        (!conn.client.is_closed()).then_some(conn)
    }

    /// Returns an attempt's connection to the slot. If another attempt
    /// already put one there, this one is closed.
    fn put_back(&self, conn: Option<RenewalConnection>) {
        if let Some(conn) = conn {
            let mut slot = self.slot();
            if slot.is_none() {
                *slot = Some(conn);
            }
        }
    }

    async fn open(&self) -> Result<RenewalConnection> {
        let (client, task) = open_connection(&self.config, self.connect_limit).await?;
        // From here on, an error or an abandoned attempt closes the socket.
        let task = ConnectionTask(task);
        let lock_row = client.prepare(LOCK_ROW_SQL).await?;
        let extend = if fault_switches::enabled(FaultSwitch::RenewExpired) {
            client.prepare(EXTEND_EXPIRED_SQL).await?
        } else {
            client.prepare(EXTEND_SQL).await?
        };
        let id = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(connection = id, "renewal connection opened");
        Ok(RenewalConnection {
            id,
            client,
            lock_row,
            extend,
            _task: task,
        })
    }
}
