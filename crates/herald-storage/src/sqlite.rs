//! The embedded SQLite backend: one database file, `<data_dir>/herald.db`,
//! shared by every Herald process on the same host.
//!
//! # Layout of the data directory
//! - `herald.db` (with SQLite's `herald.db-wal` and `herald.db-shm`): the
//!   database, in WAL mode with `synchronous=FULL`, so that a committed
//!   transaction survives kill -9 and power loss
//!   (<https://www.sqlite.org/pragma.html#pragma_synchronous>,
//!   <https://www.sqlite.org/wal.html>).
//! - `sessions/<id>.lock`: one per open [`SqliteStorage`], exclusively locked
//!   while it is open. A lease whose holder's session file is missing or
//!   unlocked can be taken over at once ([`crate::TakeoverReason::HolderGone`]).
//! - `migrate.lock`: serializes schema migrations between processes that
//!   open the directory at the same time.
//!
//! # Threads
//! Every SQLite connection lives on its own OS thread; the async methods
//! send it a job and await the answer. There is one writer connection
//! (append, acquire, release), one renewal connection (renew only, so a
//! renewal never queues behind writes), and [`SqliteOptions::readers`]
//! reader connections sharing one queue (everything else). SQLite has one
//! write lock per database, so a renewal still waits for a write
//! transaction in progress to finish, bounded by
//! [`SqliteOptions::renew_statement_timeout`].

pub mod backup;
mod epoch;
mod nodes;
mod ops;
mod presence;
mod session;
mod streams;
mod worker;
mod write;

use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use herald_core::{
    Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, Offset, StreamCreate, StreamCreated,
    StreamInfo, WriteOutcome, WriteRequest,
};
use rusqlite::{Connection, TransactionBehavior};

use self::session::SessionLock;
use self::worker::Worker;
use crate::cluster::ClusterEvent;
use crate::decode::ttl_ms;
use crate::error::{Error, Result};
use crate::traits::{
    Acquire, ChangeFeed, ChangeFeedReader, ChannelClients, ChannelSummary, ClusterView, Deletions,
    LeaseStore, LeaseTakeover, MessageLog, NodeReport, Page, PresenceStore, Storage, StreamStore,
};
use crate::trim::{ChannelStats, TrimLimits, Trimmed};

mod embedded {
    #![allow(missing_docs, unreachable_pub)]
    refinery::embed_migrations!("migrations/sqlite");
}

/// File name of the database inside the data directory.
pub const DATABASE_FILE: &str = "herald.db";
/// Directory of the session lock files inside the data directory.
pub const SESSIONS_DIR: &str = "sessions";
/// File that serializes migrations between processes, inside the data directory.
pub const MIGRATION_LOCK_FILE: &str = "migrate.lock";

/// How long `open` waits for another process that is migrating the same
/// database, before it fails with [`Error::Unavailable`].
const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(60);
/// How often `open` retries the migration lock while it waits.
const MIGRATION_LOCK_POLL: Duration = Duration::from_millis(5);
/// How long after [`SqliteOptions::renew_statement_timeout`] a renewal that
/// has not answered is abandoned (its connection is replaced).
const RENEW_ABANDON_GRACE: Duration = Duration::from_secs(1);

/// Settings of [`SqliteStorage::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Number of reader connections (and threads) sharing the read queue.
    /// Default 4; 0 counts as 1.
    pub readers: usize,
    /// How long the writer and reader connections wait for a lock held by
    /// another connection before failing with [`Error::Unavailable`]
    /// (SQLite's busy timeout, <https://www.sqlite.org/c3ref/busy_timeout.html>).
    /// Default 5 s.
    pub busy_timeout: Duration,
    /// Busy timeout of the renewal connection: the longest a renewal waits
    /// for the database write lock. A renewal that has not answered 1 s
    /// after this is reported as [`Error::Unavailable`] and its connection
    /// is replaced by a fresh one. Default 5 s.
    pub renew_statement_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            readers: 4,
            busy_timeout: Duration::from_secs(5),
            renew_statement_timeout: Duration::from_secs(5),
        }
    }
}

/// Settings one SQLite connection reports (`PRAGMA` values), for status
/// pages and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionPragmas {
    /// `PRAGMA journal_mode`, lowercase; `"wal"` when in force.
    pub journal_mode: String,
    /// `PRAGMA synchronous`: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
    /// (<https://www.sqlite.org/pragma.html#pragma_synchronous>).
    pub synchronous: i64,
    /// `PRAGMA busy_timeout`, in ms.
    pub busy_timeout_ms: i64,
    /// `PRAGMA query_only`: `true` on reader connections.
    pub query_only: bool,
}

/// [`ConnectionPragmas`] of each kind of connection of a [`SqliteStorage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlitePragmas {
    /// The writer connection.
    pub writer: ConnectionPragmas,
    /// The renewal connection.
    pub renewal: ConnectionPragmas,
    /// One of the reader connections (all are set up alike).
    pub reader: ConnectionPragmas,
}

/// The SQLite backend of [`Storage`]. Cheap to clone: clones share the
/// connections and the session. Dropping the last clone stops the connection
/// threads (waiting for jobs in progress to finish) and then deletes and
/// unlocks the session lock file.
#[derive(Clone)]
pub struct SqliteStorage {
    inner: Arc<Inner>,
}

/// The renewal connection and a generation number that changes each time
/// the connection is replaced.
struct RenewalSlot {
    generation: u64,
    worker: Worker,
}

struct Inner {
    data_dir: PathBuf,
    db_path: PathBuf,
    sessions_dir: PathBuf,
    options: SqliteOptions,
    writer: Worker,
    renewal: Mutex<RenewalSlot>,
    readers: Worker,
    // Declared last, so dropped last: the session stays locked until every
    // connection thread above has stopped.
    session: SessionLock,
}

impl fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("db_path", &self.inner.db_path)
            .field("session", &self.inner.session.id())
            .field("options", &self.inner.options)
            .finish()
    }
}

/// Which connection an open is for; decides its settings.
#[derive(Clone, Copy)]
enum Role {
    Writer,
    Renewal,
    Reader,
}

impl SqliteStorage {
    /// Opens (creating if needed) the database in `data_dir`, migrates its
    /// schema, creates and locks this storage's session file, and starts the
    /// connection threads.
    ///
    /// Creates `data_dir` and `data_dir/sessions` if missing. Safe to call
    /// from several processes (or several times in one process) on the same
    /// directory at once: migrations run one process at a time, under an
    /// exclusive lock on `data_dir/migrate.lock`, and each is applied once.
    /// Deletes the session files of processes that are gone.
    ///
    /// # Errors
    /// [`Error::Io`] (with the absolute path and the operation) when
    /// `data_dir` is not a directory, or the directory or a lock file
    /// cannot be created, or the file system does not support WAL mode
    /// (kind `Unsupported`);
    /// [`Error::Migration`] when the schema cannot be migrated;
    /// [`Error::Unavailable`] when another process holds the migration lock
    /// for over 60 s or the database stays locked longer than
    /// `options.busy_timeout`; [`Error::Sqlite`] for other SQLite errors.
    pub async fn open(data_dir: &Path, options: SqliteOptions) -> Result<Self> {
        let data_dir = data_dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(data_dir, options))
            .await
            .map_err(|e| Error::unavailable_because(format!("open task failed: {e}"), e))?
    }

    fn open_blocking(data_dir: PathBuf, options: SqliteOptions) -> Result<Self> {
        // Absolute, so that every error and log names the real place.
        let data_dir = std::path::absolute(&data_dir)
            .map_err(|e| Error::io("use the data directory", &data_dir, e))?;
        if data_dir.exists() && !data_dir.is_dir() {
            return Err(Error::io(
                "use the data directory",
                &data_dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "it exists and is not a directory",
                ),
            ));
        }
        // Private: the database holds every message; others get no access
        // to a directory made here (an existing one keeps its mode).
        create_private_dir(&data_dir)
            .map_err(|e| Error::io("create the data directory", &data_dir, e))?;
        let sessions_dir = data_dir.join(SESSIONS_DIR);
        fs::create_dir_all(&sessions_dir)
            .map_err(|e| Error::io("create the sessions directory", &sessions_dir, e))?;
        let db_path = data_dir.join(DATABASE_FILE);

        let session = SessionLock::create(&sessions_dir)
            .map_err(|e| Error::io("create a session lock file in", &sessions_dir, e))?;
        session::sweep(&sessions_dir, session.id());

        let writer_conn = {
            let _migration_lock = lock_for_migration(&data_dir.join(MIGRATION_LOCK_FILE))?;
            let mut conn = open_connection(&db_path, Role::Writer, &options)?;
            // Only takes effect on a database without tables yet (a new
            // one): trims then return free pages in small steps. An older
            // database keeps its mode; see `ops::incremental_vacuum`.
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(Error::io(
                    "switch to WAL mode",
                    &db_path,
                    std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        format!("SQLite answered journal_mode {mode:?}"),
                    ),
                ));
            }
            migrate(&mut conn)?;
            conn
        };

        let thread_error = |e| Error::io("start a connection thread for", &db_path, e);
        let writer = Worker::spawn("writer", vec![writer_conn]).map_err(thread_error)?;
        let renewal = Worker::spawn(
            "renewal",
            vec![open_connection(&db_path, Role::Renewal, &options)?],
        )
        .map_err(thread_error)?;
        let readers = (0..options.readers.max(1))
            .map(|_| open_connection(&db_path, Role::Reader, &options))
            .collect::<Result<Vec<_>>>()?;
        let readers = Worker::spawn("reader", readers).map_err(thread_error)?;

        tracing::info!(
            path = %db_path.display(),
            session = %session.id(),
            readers = options.readers.max(1),
            "sqlite storage open"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                data_dir,
                db_path,
                sessions_dir,
                options,
                writer,
                renewal: Mutex::new(RenewalSlot {
                    generation: 0,
                    worker: renewal,
                }),
                readers,
                session,
            }),
        })
    }

    /// The data directory given to [`SqliteStorage::open`].
    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    /// Path of the database file, `<data_dir>/herald.db`.
    pub fn db_path(&self) -> &Path {
        &self.inner.db_path
    }

    /// This storage's session id (32 lowercase hex digits): the name of its
    /// lock file in `<data_dir>/sessions/` and the `holder_session` it
    /// records when it acquires a lease.
    pub fn session_id(&self) -> &str {
        self.inner.session.id()
    }

    /// The settings each kind of connection reports (`journal_mode`,
    /// `synchronous`, `busy_timeout`, `query_only`).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when a connection thread is gone or a
    /// connection is locked; [`Error::Sqlite`] otherwise.
    pub async fn pragmas(&self) -> Result<SqlitePragmas> {
        let writer = self.inner.writer.call(read_pragmas).await?;
        let renewal = self.renewal_sender().call(read_pragmas).await?;
        let reader = self.inner.readers.call(read_pragmas).await?;
        Ok(SqlitePragmas {
            writer,
            renewal,
            reader,
        })
    }

    fn renewal_sender(&self) -> worker::Submitter {
        self.renewal_slot().worker.sender()
    }

    fn renewal_slot(&self) -> std::sync::MutexGuard<'_, RenewalSlot> {
        self.inner
            .renewal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the renewal connection of `generation` by a fresh one, unless
    /// another caller already did. The old thread is left to finish alone.
    async fn replace_renewal(&self, generation: u64) {
        let db_path = self.inner.db_path.clone();
        let options = self.inner.options.clone();
        let fresh = tokio::task::spawn_blocking(move || -> Result<Worker> {
            let conn = open_connection(&db_path, Role::Renewal, &options)?;
            Worker::spawn("renewal", vec![conn])
                .map_err(|e| Error::io("start a connection thread for", &db_path, e))
        })
        .await;
        let fresh = match fresh {
            Ok(Ok(worker)) => worker,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not open a fresh renewal connection");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not open a fresh renewal connection");
                return;
            }
        };
        let old = {
            let mut slot = self.renewal_slot();
            if slot.generation != generation {
                None
            } else {
                slot.generation += 1;
                Some(std::mem::replace(&mut slot.worker, fresh))
            }
        };
        // Outside the lock; `detach` never blocks.
        if let Some(old) = old {
            old.detach();
        }
    }

    /// Runs `f` on the renewal connection, for tests of its timeout.
    #[cfg(test)]
    async fn on_renewal<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.renewal_sender().call(f).await
    }
}

/// Creates `dir` and its missing parents with mode 0700 (owner only);
/// an existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Opens one connection with the settings of `role`.
fn open_connection(db_path: &Path, role: Role, options: &SqliteOptions) -> Result<Connection> {
    let conn = Connection::open(db_path)?;
    let busy = match role {
        Role::Renewal => options.renew_statement_timeout,
        Role::Writer | Role::Reader => options.busy_timeout,
    };
    conn.busy_timeout(busy)?;
    // Per connection, not stored in the file: every connection sets it.
    conn.pragma_update(None, "synchronous", "FULL")?;
    if matches!(role, Role::Reader) {
        conn.pragma_update(None, "query_only", true)?;
    }
    Ok(conn)
}

fn read_pragmas(conn: &mut Connection) -> Result<ConnectionPragmas> {
    let journal_mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    Ok(ConnectionPragmas {
        journal_mode: journal_mode.to_ascii_lowercase(),
        synchronous: conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?,
        busy_timeout_ms: conn.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?,
        query_only: conn.query_row("PRAGMA query_only", [], |r| r.get(0))?,
    })
}

/// Takes the exclusive lock on the migration lock file, waiting up to
/// [`MIGRATION_LOCK_WAIT`]. The lock is released when the file is dropped.
fn lock_for_migration(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io("open the migration lock file", path, e))?;
    let deadline = Instant::now() + MIGRATION_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(MIGRATION_LOCK_POLL);
            }
            Err(TryLockError::WouldBlock) => {
                return Err(Error::unavailable(format!(
                    "another process has been migrating {} for over {} s",
                    path.display(),
                    MIGRATION_LOCK_WAIT.as_secs()
                )))
            }
            Err(TryLockError::Error(e)) => {
                return Err(Error::io("lock the migration lock file", path, e))
            }
        }
    }
}

/// Applies the embedded migrations that are not applied yet, all in one
/// transaction with their history rows (grouped), so that a crash never
/// leaves a migration applied but unrecorded. Refinery's transactions are
/// made `BEGIN IMMEDIATE`, so that they wait (busy timeout) for the write
/// lock instead of failing on a stale read snapshot. The caller holds the
/// migration lock: refinery reads the applied versions and applies the rest
/// in separate transactions, which is only safe one process at a time.
fn migrate(conn: &mut Connection) -> Result<()> {
    conn.set_transaction_behavior(TransactionBehavior::Immediate);
    let report = embedded::migrations::runner()
        .set_grouped(true)
        .run(conn)
        .map_err(Error::migration_because);
    conn.set_transaction_behavior(TransactionBehavior::Deferred);
    for migration in report?.applied_migrations() {
        tracing::info!(migration = %migration, "sqlite schema migration applied");
    }
    Ok(())
}

#[async_trait]
impl LeaseStore for SqliteStorage {
    async fn acquire(&self, candidate: &Candidate, ttl: Duration) -> Result<Acquire> {
        let candidate = candidate.clone();
        let ttl_ms = ttl_ms(ttl);
        let sessions_dir = self.inner.sessions_dir.clone();
        let own_session = self.inner.session.id().to_owned();
        self.inner
            .writer
            .call(move |conn| ops::acquire(conn, &sessions_dir, &own_session, &candidate, ttl_ms))
            .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let (generation, sender) = {
            let slot = self.renewal_slot();
            (slot.generation, slot.worker.sender())
        };
        let job_lease = lease.clone();
        let ttl_ms = ttl_ms(ttl);
        let limit = self.inner.options.renew_statement_timeout + RENEW_ABANDON_GRACE;
        let call = sender.call(move |conn| ops::renew(conn, &job_lease, ttl_ms));
        match tokio::time::timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    lease = %lease.name,
                    token = lease.token.0,
                    holder = %lease.holder,
                    timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
                    "renewal did not answer in time; abandoning its connection"
                );
                self.replace_renewal(generation).await;
                Err(Error::unavailable(format!(
                    "renewal did not answer within {} ms; its outcome is unknown",
                    limit.as_millis()
                )))
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.inner
            .writer
            .call(move |conn| ops::release(conn, &lease))
            .await
    }

    async fn lease_info(&self, name: &str) -> Result<Option<LeaseInfo>> {
        let name = name.to_owned();
        self.inner
            .readers
            .call(move |conn| ops::lease_info(conn, &name))
            .await
    }

    async fn takeover_counts(&self, name: &str) -> Result<Vec<crate::traits::TakeoverCount>> {
        let name = name.to_owned();
        self.inner
            .readers
            .call(move |conn| ops::takeover_counts(conn, &name))
            .await
    }

    /// Looks every [`TAKEOVER_HINT_POLL`] (a plain read of the local file,
    /// and a try-lock of the holder's session lock file): resolves when the
    /// lease found held was released, expired or changed hands, or its
    /// holder's session is gone (its process ended, however it ended).
    async fn takeover_hint(&self, held: &LeaseInfo) {
        let token = held.token;
        loop {
            tokio::time::sleep(TAKEOVER_HINT_POLL).await;
            let name = held.name.clone();
            let sessions_dir = self.inner.sessions_dir.clone();
            let own_session = self.inner.session.id().to_owned();
            let look = self
                .inner
                .readers
                .call(move |conn| {
                    ops::takeover_looks_possible(conn, &sessions_dir, &own_session, &name, token)
                })
                .await;
            if let Ok(true) = look {
                return;
            }
        }
    }
}

/// How often a standby on SQLite looks whether the lease it found held may
/// be taken over (see `takeover_hint`).
pub const TAKEOVER_HINT_POLL: Duration = Duration::from_millis(20);

#[async_trait]
impl MessageLog for SqliteStorage {
    async fn write(&self, lease: &Lease, batch: &[WriteRequest]) -> Result<Vec<WriteOutcome>> {
        let lease = lease.clone();
        let batch = batch.to_vec();
        self.inner
            .writer
            .call(move |conn| write::write(conn, &lease, &batch))
            .await
    }

    async fn read(&self, channel: &ChannelName, after: Offset, limit: usize) -> Result<Page> {
        let channel = channel.clone();
        self.inner
            .readers
            .call(move |conn| ops::read(conn, &channel, after, limit))
            .await
    }

    async fn channels(&self) -> Result<Vec<ChannelHead>> {
        self.inner.readers.call(ops::channels).await
    }

    async fn channel_stats(&self) -> Result<Vec<ChannelStats>> {
        self.inner.readers.call(ops::channel_stats).await
    }

    async fn trim(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &TrimLimits,
        max_rows: usize,
    ) -> Result<Trimmed> {
        let lease = lease.clone();
        let channel = channel.clone();
        let limits = *limits;
        self.inner
            .writer
            .call(move |conn| ops::trim(conn, &lease, &channel, &limits, max_rows))
            .await
    }

    async fn channel_page(
        &self,
        search: &str,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<ChannelSummary>> {
        let search = search.to_owned();
        let after = after.cloned();
        self.inner
            .readers
            .call(move |conn| ops::channel_page(conn, &search, after.as_ref(), limit))
            .await
    }

    async fn channel_epoch(&self, channel: &ChannelName) -> Result<String> {
        let name = channel.clone();
        self.inner
            .readers
            .call(move |conn| epoch::read(conn, &name))
            .await
    }

    async fn record_deletion(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        head: Offset,
    ) -> Result<u64> {
        let lease = lease.clone();
        let channel = channel.clone();
        self.inner
            .writer
            .call(move |conn| ops::record_deletion(conn, &lease, &channel, head))
            .await
    }
}

#[async_trait]
impl ChangeFeedReader for SqliteStorage {
    async fn changes_since(&self, cursor: u64) -> Result<ChangeFeed> {
        self.inner
            .readers
            .call(move |conn| ops::changes_since(conn, cursor))
            .await
    }

    async fn change_cursor(&self) -> Result<u64> {
        self.inner.readers.call(ops::change_cursor).await
    }

    async fn deletions_since(&self, cursor: u64) -> Result<Deletions> {
        self.inner
            .readers
            .call(move |conn| ops::deletions_since(conn, cursor))
            .await
    }

    async fn deletion_cursor(&self) -> Result<u64> {
        self.inner.readers.call(ops::deletion_cursor).await
    }
}

#[async_trait]
impl StreamStore for SqliteStorage {
    async fn expired_streams(&self, limit: usize) -> Result<Vec<ChannelName>> {
        self.inner
            .readers
            .call(move |conn| streams::expired_streams(conn, limit))
            .await
    }

    async fn stream_info(&self, channel: &ChannelName) -> Result<Option<StreamInfo>> {
        let channel = channel.clone();
        self.inner
            .readers
            .call(move |conn| streams::stream_info(conn, &channel))
            .await
    }

    async fn create_stream(&self, lease: &Lease, create: &StreamCreate) -> Result<StreamCreated> {
        let lease = lease.clone();
        let create = create.clone();
        self.inner
            .writer
            .call(move |conn| streams::create_stream(conn, &lease, &create))
            .await
    }

    async fn renew_streams(&self, lease: &Lease, channels: &[ChannelName]) -> Result<u64> {
        let lease = lease.clone();
        let channels = channels.to_vec();
        self.inner
            .writer
            .call(move |conn| streams::renew_streams(conn, &lease, &channels))
            .await
    }

    async fn soft_delete_stream(&self, lease: &Lease, channel: &ChannelName) -> Result<bool> {
        let lease = lease.clone();
        let channel = channel.clone();
        self.inner
            .writer
            .call(move |conn| streams::soft_delete_stream(conn, &lease, &channel))
            .await
    }
}

#[async_trait]
impl PresenceStore for SqliteStorage {
    async fn presence_add(
        &self,
        session: &str,
        entry: &crate::traits::PresenceEntry,
        ttl: Duration,
    ) -> Result<()> {
        let session = session.to_owned();
        let entry = entry.clone();
        self.inner
            .writer
            .call(move |conn| presence::add(conn, &session, &entry, ttl))
            .await
    }

    async fn presence_remove(&self, channel: &ChannelName, client: &str) -> Result<()> {
        let channel = channel.clone();
        let client = client.to_owned();
        self.inner
            .writer
            .call(move |conn| presence::remove(conn, &channel, &client))
            .await
    }

    async fn presence_touch(&self, session: &str, ttl: Duration) -> Result<()> {
        let session = session.to_owned();
        self.inner
            .writer
            .call(move |conn| presence::touch(conn, &session, ttl))
            .await
    }

    async fn presence(&self, channel: &ChannelName) -> Result<Vec<crate::traits::PresenceEntry>> {
        let channel = channel.clone();
        self.inner
            .readers
            .call(move |conn| presence::list(conn, &channel))
            .await
    }
}

#[async_trait]
impl ClusterView for SqliteStorage {
    async fn report_node(
        &self,
        report: &NodeReport,
        channels: &[ChannelClients],
        ttl: Duration,
    ) -> Result<()> {
        let report = report.clone();
        let channels = channels.to_vec();
        self.inner
            .writer
            .call(move |conn| nodes::report(conn, &report, &channels, ttl))
            .await
    }

    async fn lease_history(&self, name: &str, limit: usize) -> Result<Vec<LeaseTakeover>> {
        let name = name.to_owned();
        self.inner
            .readers
            .call(move |conn| ops::lease_history(conn, &name, limit))
            .await
    }

    async fn node_reports(&self) -> Result<Vec<NodeReport>> {
        self.inner.readers.call(nodes::list).await
    }

    async fn cluster_channels(&self, except_node: &str) -> Result<Vec<ChannelClients>> {
        let except_node = except_node.to_owned();
        self.inner
            .readers
            .call(move |conn| nodes::channels(conn, &except_node))
            .await
    }

    /// No other process hears it: SQLite has no notifications (see
    /// `crate::cluster`).
    async fn send_cluster_event(&self, event: &ClusterEvent) -> Result<()> {
        event.check_size()
    }
}

#[async_trait]
impl Storage for SqliteStorage {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> Result<()> {
        self.inner.readers.call(ops::ping).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_candidate() -> Candidate {
        Candidate {
            lease_name: "writer".to_owned(),
            node_id: "node-a".to_owned(),
            advertise_url: "http://node-a.test".to_owned(),
        }
    }

    /// A data directory the storage creates is the owner's only (0700):
    /// the database holds every message.
    #[tokio::test]
    async fn a_new_data_directory_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("new").join("data");
        let storage = SqliteStorage::open(&data_dir, SqliteOptions::default())
            .await
            .unwrap();
        for created in [data_dir.as_path(), data_dir.parent().unwrap()] {
            let mode = fs::metadata(created).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}: {mode:o}", created.display());
        }
        drop(storage);
    }

    /// A renewal stuck on its connection is abandoned after the statement
    /// timeout + 1 s, and the next renewal runs on a fresh connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hung_renewal_is_abandoned_and_next_one_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions {
            renew_statement_timeout: Duration::from_millis(100),
            ..SqliteOptions::default()
        };
        let storage = SqliteStorage::open(dir.path(), options).await.unwrap();
        let Acquire::Acquired { lease, .. } = storage
            .acquire(&lease_candidate(), Duration::from_secs(60))
            .await
            .unwrap()
        else {
            panic!("fresh acquire failed");
        };
        // Occupy the renewal connection's thread for longer than the limit.
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (occupied_tx, occupied_rx) = tokio::sync::oneshot::channel::<()>();
        let blocking = storage.clone();
        let blocker = tokio::spawn(async move {
            blocking
                .on_renewal(move |_conn| {
                    let _ = occupied_tx.send(());
                    let _ = release_rx.recv_timeout(Duration::from_secs(30));
                    Ok(())
                })
                .await
        });
        occupied_rx
            .await
            .expect("the renewal thread runs the blocker");

        let started = Instant::now();
        let err = storage
            .renew(&lease, Duration::from_secs(60))
            .await
            .unwrap_err();
        let waited = started.elapsed();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(waited >= Duration::from_millis(1100), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");

        let started = Instant::now();
        storage
            .renew(&lease, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));

        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
    }
}
