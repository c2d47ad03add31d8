//! The PostgreSQL backend: several Herald nodes share one database, and the
//! writer lease decides which one of them writes.
//!
//! # Connections
//! - A pool of [`PostgresOptions::pool_size`] connections for everything
//!   except renewal: fenced writes, acquire, release and reads. Every pool
//!   connection sets `statement_timeout` and
//!   `idle_in_transaction_session_timeout`, so that the server itself ends a
//!   statement or transaction of a writer that froze in the middle of it
//!   (SIGSTOP, a paused VM) and would otherwise keep its lock on the lease
//!   row forever (PostgreSQL documentation, "Client Connection Defaults",
//!   `statement_timeout` and `idle_in_transaction_session_timeout`).
//! - One dedicated **renewal** connection, outside the pool, so that writers
//!   that fill the pool can never starve a renewal. Its `statement_timeout`
//!   is [`PostgresOptions::renew_statement_timeout`]; an attempt that has no
//!   answer 1 s after that is abandoned: its connection is dropped and the
//!   next attempt opens a fresh one. It also sets
//!   `client_connection_check_interval` (PostgreSQL 14 or newer,
//!   "Connections and Authentication", "Connection Settings"), so that the
//!   server ends a statement soon after its client has gone.
//! - One dedicated **listener** connection (`application_name`
//!   `herald-listen`), opened at connect, that runs `LISTEN` on
//!   [`CHANGES_CHANNEL`] and feeds [`Storage::watch_changes`] (see "Change
//!   notices" below).
//! - One dedicated **liveness** connection (`application_name`
//!   `herald-liveness`), opened at connect and idle for the storage's whole
//!   life, that holds the session-level advisory lock of the storage's
//!   session key (see "Detecting a dead holder" below).
//! - A short-lived migration connection in [`PostgresStorage::connect`].
//!
//! Dropping the last handle of a storage stops the listener and liveness
//! tasks and closes their connections.
//!
//! Every connection has TCP keepalives, a TCP user timeout and a connect
//! timeout, so that a dead peer is noticed in seconds (libpq's parameters
//! `keepalives_idle`, `keepalives_interval`, `keepalives_count`,
//! `tcp_user_timeout`, `connect_timeout`: PostgreSQL documentation, "Database
//! Connection Control Functions", "Parameter Key Words"; this crate uses the
//! equivalent settings of `tokio_postgres::Config`).
//!
//! # Connection poolers
//! Every connection must be one server session for its whole life: the
//! session settings above are sent once, in the start-up parameter
//! `options`; the liveness lock and the migration lock are session-level
//! advisory locks; the driver prepares statements once per connection. A
//! pooler in transaction mode (PgBouncer's `pool_mode = transaction`)
//! breaks all of that without an error: session locks of different nodes
//! end up in one pooled server session and outlive both, a live holder is
//! found gone. [`PostgresStorage::connect`] therefore checks, on its first
//! connection and before it changes anything, that consecutive
//! transactions run in the same server session, that a second connection
//! runs in another one, and that the settings sent in `options` and a
//! session setting made in one transaction are in effect in the next; if
//! not it fails with [`Error::UnsupportedPooler`]. A pooler that refuses
//! `options` (PgBouncer without `ignore_startup_parameters = options`)
//! gives the same error at once. Connect directly, or through a pooler in
//! session mode that passes `options` on (PgBouncer, in any pool mode,
//! passes none of these settings). PgBouncer documentation, pool modes:
//! <https://www.pgbouncer.org/features.html>; `ignore_startup_parameters`:
//! <https://www.pgbouncer.org/config.html>.
//!
//! # Lock modes
//! Row-level lock modes are those of the PostgreSQL documentation,
//! "Explicit Locking", section "Row-Level Locks" (13.3.2 in PostgreSQL 15):
//! `FOR KEY SHARE` conflicts only with `FOR UPDATE`; `FOR NO KEY UPDATE`
//! conflicts with `FOR UPDATE`, `FOR NO KEY UPDATE` and `FOR SHARE`, but not
//! with `FOR KEY SHARE`.
//!
//! | operation | lease row lock | waits for |
//! | --- | --- | --- |
//! | fenced write ([`Storage::append`]) | `FOR KEY SHARE`, after `pg_advisory_xact_lock` of the lease | acquire, the previous fenced write |
//! | renewal ([`LeaseStore::renew`]) | `FOR NO KEY UPDATE` | acquire, release, another renewal; never a fenced write |
//! | acquire ([`LeaseStore::acquire`]) | `FOR UPDATE` | every fenced write in flight (bounded by `lock_timeout`) |
//! | release ([`LeaseStore::release`]) | `FOR NO KEY UPDATE` (its `UPDATE`) | acquire, a renewal |
//!
//! # A commit whose answer is lost
//! When the connection fails while `COMMIT` of a fenced write is in flight,
//! the client cannot know whether the server committed: [`Storage::append`]
//! then returns [`Error::Unavailable`] although the batch may be stored
//! (a retry with the same idempotency keys finds it). Every other error of
//! a fenced write means that nothing was committed.
//!
//! # The change feed
//! Message ids are in commit order because the fenced writes of one lease
//! are serialized by its advisory lock until they commit; the change feed
//! ([`Storage::changes_since`]) relies on it. Writers of different lease
//! names on one database are not serialized with each other, so one
//! database holds the messages of one lease name.
//!
//! # Change notices
//! A fenced write sends, inside its transaction after its inserts, one
//! notification per channel it wrote new messages to (`pg_notify` on
//! [`CHANGES_CHANNEL`], payload `<from> <to> <committed_at_ms> <channel>`).
//! PostgreSQL delivers notifications only when the sending transaction
//! commits, in commit order, and drops those of a transaction that rolls
//! back (PostgreSQL documentation, `NOTIFY`). The listener connection
//! receives them as asynchronous messages and sends each as
//! [`ChangeSignal::Committed`] on a broadcast channel of
//! [`CHANGE_SIGNAL_CAPACITY`] notices; every node's listener hears every
//! node's commits, its own included. When the listener's connection fails
//! it reconnects (after 100 ms, doubling up to 2 s while attempts fail or
//! new connections are lost within 10 s; warnings at most one per 10 s,
//! see "Reconnecting" below) and sends [`ChangeSignal::Resync`] after every successful `LISTEN`, the
//! first included: notices sent while nobody listened are lost, and
//! receivers catch up with [`Storage::changes_since`]. Notices are hints;
//! the change feed stays the truth. (Queuing notifications takes a lock at
//! commit that serializes the commits of notifying transactions in the
//! database; fenced writes of one lease are serialized anyway.)
//!
//! # Detecting a dead holder
//! Each storage draws a random session key at connect and its liveness
//! connection holds `pg_advisory_lock(<session key>)`, a session-level
//! advisory lock, which PostgreSQL releases when the session ends
//! ("Explicit Locking", "Advisory Locks"). An acquire records the key as
//! the lease's `holder_session`. A later acquire by another storage, after
//! it holds the lease row `FOR UPDATE` and when the lease has a holder that
//! has not expired with another session key, probes that key with
//! `pg_try_advisory_xact_lock` in the same transaction: success means that
//! no session holds it, so the holder's storage is gone (dropped, its
//! process exited or crashed, or its host is unreachable), and the takeover
//! decision, still a statement of its own after the row lock, takes the
//! lease at once ([`crate::TakeoverReason::HolderGone`]). The probe's lock
//! is released at commit or rollback.
//!
//! The server must notice a dead client host for this to work, so the
//! liveness connection sets the per-session settings `tcp_keepalives_idle`
//! (5 s), `tcp_keepalives_interval` (1 s), `tcp_keepalives_count` (5) and
//! `tcp_user_timeout` (10 s) (derived from
//! [`PostgresOptions::keepalives_idle`]; "Connections and Authentication",
//! "TCP Settings"; they apply to TCP connections only, not Unix sockets),
//! and turns `idle_session_timeout` and `statement_timeout` off. A process
//! that is paused (SIGSTOP, a paused VM) keeps its connection and is not
//! found gone; its lease expires as usual.
//!
//! A live holder is never found gone because of its other connections: a
//! renewal or pool connection that fails leaves the liveness connection and
//! its lock alone. When the liveness connection itself fails (a network
//! fault), its task reconnects with backoff and takes the same key again,
//! best effort: until then, another node may find the key free and take
//! the lease over. That is safe: the takeover increments the fencing token,
//! so the old holder's next fenced write and renewal fail with
//! [`Error::LeaseLost`] and it stops writing.
//!
//! # Reconnecting
//! The listener and liveness connections are opened again when they fail,
//! under one policy: the pause before an attempt grows with the number of
//! consecutive failures (100 ms, doubling, at most 2 s), where a connection
//! lost less than 10 s after it was made counts as a failure too, so a
//! connection that is made and lost at once is not retried every 100 ms;
//! the pause is measured on the monotonic clock (`std::time::Instant`),
//! so a runtime timer that fires early cannot turn the loop into a spin;
//! and the loop logs the first warning of a run of failures, then at most
//! one per 10 s with the number left out (`suppressed_warnings`).
//!
//! # Decisions after lock waits
//! Every decision taken after a lock wait (the fencing check, the renewal's
//! expiry guard, the takeover) is taken by a statement that runs *after*
//! the lock is held, on the database clock (`clock_timestamp()`, PostgreSQL
//! documentation, "Date/Time Functions and Operators", "Current Date/Time").
//! In READ COMMITTED, a statement that waited for a row that the other
//! transaction only locked (did not change) does not evaluate its `WHERE`
//! again after the wait ("Transaction Isolation", "Read Committed Isolation
//! Level"), so a guard in the locking statement itself would be judged
//! before the wait.
//!
//! # References (PostgreSQL documentation)
//! - "Explicit Locking", 13.3.2 Row-Level Locks and 13.3.5 Advisory Locks:
//!   <https://www.postgresql.org/docs/current/explicit-locking.html#LOCKING-ROWS>,
//!   <https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS>
//! - "Transaction Isolation", 13.2.1 Read Committed Isolation Level:
//!   <https://www.postgresql.org/docs/current/transaction-iso.html#XACT-READ-COMMITTED>
//! - "Client Connection Defaults", `statement_timeout`, `lock_timeout`,
//!   `idle_in_transaction_session_timeout`:
//!   <https://www.postgresql.org/docs/current/runtime-config-client.html>
//! - "Connections and Authentication", `client_connection_check_interval`
//!   (PostgreSQL 14+; it works where the kernel reports a closed peer to
//!   `poll`, e.g. Linux):
//!   <https://www.postgresql.org/docs/current/runtime-config-connection.html#GUC-CLIENT-CONNECTION-CHECK-INTERVAL>
//! - "Date/Time Functions and Operators", Current Date/Time
//!   (`clock_timestamp()`):
//!   <https://www.postgresql.org/docs/current/functions-datetime.html#FUNCTIONS-DATETIME-CURRENT>
//! - `NOTIFY` and `LISTEN`:
//!   <https://www.postgresql.org/docs/current/sql-notify.html>,
//!   <https://www.postgresql.org/docs/current/sql-listen.html>
//! - "Connections and Authentication", TCP Settings (`tcp_keepalives_idle`,
//!   `tcp_keepalives_interval`, `tcp_keepalives_count`, `tcp_user_timeout`):
//!   <https://www.postgresql.org/docs/current/runtime-config-connection.html#RUNTIME-CONFIG-TCP-SETTINGS>
//! - "System Administration Functions", Advisory Lock Functions:
//!   <https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS>
//! - libpq "Parameter Key Words" (connection string, keepalives,
//!   `connect_timeout`, `tcp_user_timeout`):
//!   <https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS>
//! - Appendix A, "PostgreSQL Error Codes":
//!   <https://www.postgresql.org/docs/current/errcodes-appendix.html>

mod listen;
mod liveness;
mod ops;
mod pooler;
mod reconnect;
mod renewal;
mod takeover;

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use herald_core::{
    Appended, Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, NewMessage, Offset,
};
use tokio::sync::{broadcast, watch};
use tokio_postgres::config::Host;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, Socket};

use self::renewal::Renewal;
use crate::decode::ttl_ms;
use crate::{Acquire, ChangeFeed, ChangeSignal, Error, LeaseStore, Page, Result, Storage};

mod embedded {
    #![allow(missing_docs, unreachable_pub)]
    refinery::embed_migrations!("migrations/postgres");
}

/// Key of the session-level advisory lock (`pg_advisory_lock`) under which
/// [`PostgresStorage::connect`] runs the schema migrations, so that nodes
/// that start at the same time migrate one after the other. It is the
/// 64-bit FNV-1a hash of `herald/migrations`, reinterpreted as `bigint`
/// (PostgreSQL documentation, "Explicit Locking", "Advisory Locks", and
/// "System Administration Functions", "Advisory Lock Functions").
pub const MIGRATION_LOCK_KEY: i64 = advisory_key(b"herald/migrations", b"");

/// The notification channel (`LISTEN`/`NOTIFY`) on which fenced writes
/// announce their commits, one notification per channel written, with the
/// payload `<from> <to> <committed_at_ms> <channel>` (offsets of the new
/// messages, the database clock in ms since the Unix epoch, the channel
/// name last). PostgreSQL delivers a notification only when the
/// transaction that sent it commits (PostgreSQL documentation, `NOTIFY`).
pub const CHANGES_CHANNEL: &str = "herald_changes";

/// The notification channel on which a release of the writer lease is
/// announced, with the lease's name as payload, so that standbys try to
/// acquire at once instead of on their next acquire period. Delivered only
/// if the release commits (PostgreSQL documentation, `NOTIFY`).
pub const LEASE_CHANNEL: &str = "herald_lease";

/// Capacity of the broadcast channel behind [`Storage::watch_changes`]: a
/// receiver that falls this many notices behind loses the oldest and is
/// told so (`RecvError::Lagged`).
pub const CHANGE_SIGNAL_CAPACITY: usize = 4096;

/// How long [`PostgresStorage::connect`] waits for another node that is
/// migrating the same database (the migration connection's `lock_timeout`).
const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(60);
/// Interval between TCP keepalive probes once the connection is idle for
/// [`PostgresOptions::keepalives_idle`].
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered keepalive probes after which the connection is dead.
const KEEPALIVE_RETRIES: u32 = 5;
/// Extra time the client gives a connection attempt beyond
/// [`PostgresOptions::connect_timeout`] before it gives up itself.
const CONNECT_GRACE: Duration = Duration::from_secs(1);
/// Oldest PostgreSQL release supported: 14, the first with
/// `client_connection_check_interval` (as `server_version_num`).
const MIN_SERVER_VERSION: i64 = 140_000;

/// Settings of [`PostgresStorage::connect`]. Every duration is rounded down
/// to whole milliseconds for the server, and at least 1 ms: PostgreSQL reads
/// 0 as "no timeout", which none of these may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Most connections in the pool (everything but renewal). Default 10;
    /// 0 counts as 1.
    pub pool_size: usize,
    /// Longest wait for a TCP connection and the start-up handshake, for
    /// every connection. Default 5 s.
    pub connect_timeout: Duration,
    /// Longest wait for a free pool connection before an operation fails
    /// with [`Error::Unavailable`]. Default 5 s.
    pub pool_wait_timeout: Duration,
    /// `statement_timeout` of pool connections: the server cancels a
    /// statement that runs (or waits for a lock) longer, SQLSTATE 57014
    /// (PostgreSQL documentation, "Client Connection Defaults",
    /// `statement_timeout`). Keep it well under the lease ttl. Default 5 s.
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout` of pool and renewal
    /// connections: the server ends a session that stays idle inside a
    /// transaction longer, releasing its locks (PostgreSQL documentation,
    /// "Client Connection Defaults", `idle_in_transaction_session_timeout`).
    /// A few seconds, well under the lease ttl. Default 5 s.
    pub idle_in_transaction_timeout: Duration,
    /// `statement_timeout` of the renewal connection. A renewal attempt that
    /// has no answer 1 s after this is abandoned with
    /// [`Error::Unavailable`] and its connection dropped; the next attempt
    /// (1 s later) opens a fresh one. Default 5 s.
    pub renew_statement_timeout: Duration,
    /// `client_connection_check_interval` of the renewal connection: how
    /// often the server checks, while a statement runs, that the client is
    /// still connected, and ends the statement when it is not (PostgreSQL
    /// 14+, "Connections and Authentication", "Connection Settings").
    /// Default 1 s.
    pub client_connection_check_interval: Duration,
    /// `lock_timeout` of an acquire: the longest it waits for the lease row
    /// (that is, for fenced writes in flight) before it fails with
    /// [`Error::Unavailable`], SQLSTATE 55P03 (PostgreSQL documentation,
    /// "Client Connection Defaults", `lock_timeout`). The caller retries on
    /// its acquire period. Default 1 s.
    pub acquire_lock_timeout: Duration,
    /// Idle time after which TCP keepalive probes start, on every
    /// connection; probes follow every 1 s and 5 unanswered probes end the
    /// connection. The TCP user timeout (how long sent data may stay
    /// unacknowledged) is this + 5 s. The liveness connection also asks
    /// the server to use these values on its side (`tcp_keepalives_idle`,
    /// `tcp_keepalives_interval`, `tcp_keepalives_count`,
    /// `tcp_user_timeout`), so the server notices a dead client host as
    /// fast. Default 5 s.
    pub keepalives_idle: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: 10,
            connect_timeout: Duration::from_secs(5),
            pool_wait_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            renew_statement_timeout: Duration::from_secs(5),
            client_connection_check_interval: Duration::from_secs(1),
            acquire_lock_timeout: Duration::from_secs(1),
            keepalives_idle: Duration::from_secs(5),
        }
    }
}

/// Session settings one connection reports (`current_setting(...)`, as
/// PostgreSQL formats them, e.g. `"5s"`, `"300ms"`, `"0"` for off), for
/// status pages and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// `statement_timeout`.
    pub statement_timeout: String,
    /// `idle_in_transaction_session_timeout`.
    pub idle_in_transaction_session_timeout: String,
    /// `client_connection_check_interval`.
    pub client_connection_check_interval: String,
    /// `application_name`: `herald` on pool connections and
    /// `herald-renewal` on the renewal connection (`herald-listen` on the
    /// listener and `herald-liveness` on the liveness connection), unless
    /// the URL sets one.
    pub application_name: String,
}

/// [`SessionSettings`] of each kind of connection of a [`PostgresStorage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    /// A pool connection (all are set up alike).
    pub pool: SessionSettings,
    /// The renewal connection.
    pub renewal: SessionSettings,
}

/// The PostgreSQL backend of [`Storage`]. Cheap to clone: clones share the
/// pool and the renewal, listener and liveness connections. Each
/// `PostgresStorage` made by [`PostgresStorage::connect`] acts as one node,
/// with its own session key. Dropping the last clone closes the listener
/// and liveness connections (which releases the session lock: other nodes
/// may then take its lease over at once).
#[derive(Clone)]
pub struct PostgresStorage {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    renewal: Renewal,
    options: PostgresOptions,
    /// `user@host:port/dbname`, for logs; never the password.
    target: String,
    /// The key of the session-level advisory lock that the liveness
    /// connection holds; recorded as `holder_session` by acquire.
    session_key: i64,
    /// The listener task sends on this; receivers come from `subscribe`.
    changes: broadcast::Sender<ChangeSignal>,
    /// Lease releases heard by the listener (a counter).
    releases: watch::Receiver<u64>,
    /// Which lease the takeover watch waits on (set by `takeover_hint`).
    watch_target: watch::Sender<takeover::Target>,
    /// Holder sessions the takeover watch saw end (a counter).
    watch_fired: watch::Receiver<u64>,
    /// `releases` and `watch_fired` as the last acquire began: a hint
    /// resolves only on news after that.
    seen_at_acquire: Mutex<(u64, u64)>,
    /// Dropped with the last handle: the listener and liveness tasks see
    /// it closed, close their connections and end.
    _stop: watch::Sender<()>,
}

impl fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("target", &self.inner.target)
            .field("session_key", &self.inner.session_key)
            .field("options", &self.inner.options)
            .finish()
    }
}

/// Which connection a configuration is for; decides its session settings.
#[derive(Clone, Copy)]
enum Role {
    Pool,
    Renewal,
    Migration,
    Listener,
    Liveness,
    Watch,
}

impl Role {
    fn application_name(self) -> &'static str {
        match self {
            Self::Pool => "herald",
            Self::Renewal => "herald-renewal",
            Self::Migration => "herald-migrate",
            Self::Listener => "herald-listen",
            Self::Liveness => "herald-liveness",
            Self::Watch => "herald-watch",
        }
    }
}

impl PostgresStorage {
    /// Connects to the database at `url`, migrates its schema and opens the
    /// pool.
    ///
    /// `url` is a libpq connection string, as a URL
    /// (`postgres://user:password@host:port/dbname?...`) or as `key=value`
    /// pairs (PostgreSQL documentation, "Database Connection Control
    /// Functions", "Connection Strings"); TLS is not supported
    /// (`sslmode=disable` or `prefer`). Session settings given in its
    /// `options` are kept; this storage adds its own after them.
    ///
    /// First, on its first connection, it checks that every connection is
    /// a server session of its own that keeps the settings sent (see
    /// "Connection poolers" in the module documentation).
    ///
    /// Safe to call from several nodes at once on the same database: the
    /// migrations (`migrations/postgres`, applied by refinery in one
    /// transaction) run under the session-level advisory lock
    /// [`MIGRATION_LOCK_KEY`], one node at a time, and each is applied once.
    /// Needs PostgreSQL 14 or newer. Opens the liveness connection (and
    /// takes its session lock) and the listener connection (and runs its
    /// `LISTEN`) before it returns, so notices of every commit after this
    /// returns reach the receivers subscribed at that time; both tasks run
    /// on the current Tokio runtime until the last handle is dropped. The
    /// renewal connection is opened at the first renewal. Logs the
    /// database as `user@host:port/dbname`, never the password.
    ///
    /// # Errors
    /// [`Error::InvalidConnectionString`] when `url` is not a PostgreSQL
    /// connection string (see [`check_connection_string`]);
    /// [`Error::Postgres`] when the server refuses the settings; [`Error::Unavailable`] when the server cannot be
    /// reached within `options.connect_timeout` (also when the liveness or
    /// listener connection cannot be set up in that time), or another node
    /// holds the migration lock for over 60 s; [`Error::Migration`] when the schema
    /// cannot be migrated or the server is older than PostgreSQL 14;
    /// [`Error::UnsupportedPooler`] when a connection pooler between this
    /// node and the server runs one connection's transactions in different
    /// sessions (transaction pooling) or refuses or drops the session
    /// settings sent at connection start (see "Connection poolers" in the
    /// module documentation); nothing in the database was changed then.
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self> {
        let base = parse_connection_string(url)?;
        let target = describe_target(&base);
        migrate(&base, &options, &target).await?;

        let manager = Manager::from_config(
            session_config(&base, &options, Role::Pool),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.pool_wait_timeout))
            .create_timeout(Some(options.connect_timeout + CONNECT_GRACE))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| {
                Error::unavailable_because(format!("could not build the connection pool: {e}"), e)
            })?;
        let renewal = Renewal::new(
            session_config(&base, &options, Role::Renewal),
            options.renew_statement_timeout,
            options.connect_timeout + CONNECT_GRACE,
        );
        let connect_limit = options.connect_timeout + CONNECT_GRACE;
        let (stop, stop_rx) = watch::channel(());

        let session_key: i64 = rand::random();
        let liveness_config = session_config(&base, &options, Role::Liveness);
        let locked =
            liveness::establish(&liveness_config, session_key, connect_limit, connect_limit)
                .await?;
        tokio::spawn(liveness::run(
            liveness_config,
            session_key,
            connect_limit,
            locked,
            stop_rx.clone(),
        ));

        let (changes, _) = broadcast::channel(CHANGE_SIGNAL_CAPACITY);
        let (releases, _) = watch::channel(0);
        let outputs = listen::Outputs {
            changes: changes.clone(),
            releases: releases.clone(),
        };
        let listener_config = session_config(&base, &options, Role::Listener);
        let listening = listen::establish(&listener_config, connect_limit, &outputs).await?;
        tokio::spawn(listen::run(
            listener_config,
            connect_limit,
            outputs,
            listening,
            stop_rx.clone(),
        ));

        let (watch_target, target_rx) = watch::channel(None);
        let (fired, watch_fired) = watch::channel(0);
        tokio::spawn(takeover::run(
            session_config(&base, &options, Role::Watch),
            connect_limit,
            session_key,
            target_rx,
            fired,
            stop_rx,
        ));

        let storage = Self {
            inner: Arc::new(Inner {
                pool,
                renewal,
                options,
                target,
                session_key,
                changes,
                releases: releases.subscribe(),
                watch_target,
                watch_fired,
                seen_at_acquire: Mutex::new((0, 0)),
                _stop: stop,
            }),
        };
        // One pool connection now: the server accepts its session settings.
        storage.ping().await?;
        tracing::info!(
            database = %storage.inner.target,
            pool_size = storage.inner.options.pool_size.max(1),
            session_key,
            "postgres storage connected"
        );
        Ok(storage)
    }

    /// The database as `user@host:port/dbname` (no password), as logged.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// This storage's session key: the key (a random `bigint` drawn at
    /// connect) of the session-level advisory lock that its liveness
    /// connection holds while the storage lives, recorded as the lease's
    /// `holder_session` (in decimal) when this storage acquires. `pg_locks`
    /// shows it as `classid` (high 32 bits) and `objid` (low 32 bits) with
    /// `objsubid = 1`.
    pub fn session_key(&self) -> i64 {
        self.inner.session_key
    }

    /// The options given to [`PostgresStorage::connect`].
    pub fn options(&self) -> &PostgresOptions {
        &self.inner.options
    }

    /// The session settings a pool connection and the renewal connection
    /// report. Opens the renewal connection if it is not open.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the database cannot be reached;
    /// [`Error::Postgres`] otherwise.
    pub async fn session_settings(&self) -> Result<PostgresSettings> {
        let client = self.client().await?;
        let pool = read_settings(&client).await?;
        let renewal = self.inner.renewal.settings().await?;
        Ok(PostgresSettings { pool, renewal })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.inner.pool.get().await.map_err(pool_error)
    }
}

/// The forms of connection string [`check_connection_string`] accepts, as
/// said in its errors.
const CONNECTION_STRING_FORMS: &str = "expected a URL postgres://user:password@host:port/dbname \
     (or postgresql://...) or libpq key=value settings such as \
     `host=db.internal user=herald dbname=herald`";

/// Checks that `url` is a PostgreSQL connection string that
/// [`PostgresStorage::connect`] can use: a `postgres://` or
/// `postgresql://` URL, or libpq `key=value` settings (PostgreSQL
/// documentation, "Connection Strings"). Connects to nothing.
///
/// # Errors
/// [`Error::InvalidConnectionString`] saying what is wrong (another scheme,
/// neither form, an unknown option or a bad value) and which forms are
/// accepted; the message never quotes the string, which may hold a
/// password.
pub fn check_connection_string(url: &str) -> Result<()> {
    parse_connection_string(url).map(drop)
}

/// Parses a connection string; see [`check_connection_string`].
fn parse_connection_string(url: &str) -> Result<Config> {
    let invalid = |reason: String| {
        Error::InvalidConnectionString(format!("{reason}; {CONNECTION_STRING_FORMS}"))
    };
    let url = url.trim();
    if url.is_empty() {
        return Err(invalid("it is empty".to_owned()));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        if !matches!(scheme, "postgres" | "postgresql") {
            // A scheme is letters, digits, `+`, `-`, `.` (RFC 3986 §3.1);
            // anything else is not quoted back.
            let shown = if !scheme.is_empty()
                && scheme.len() <= 20
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            {
                format!("the scheme {scheme}:// is not PostgreSQL")
            } else {
                "it is not a postgres:// URL".to_owned()
            };
            return Err(invalid(shown));
        }
    } else if !url.contains('=') {
        return Err(invalid(
            "it is neither a postgres:// URL nor key=value settings".to_owned(),
        ));
    }
    url.parse::<Config>().map_err(|e| {
        // The driver's own text is "invalid connection string"; its cause
        // says which part (an unknown option, a bad value).
        let reason = std::error::Error::source(&e)
            .map(|cause| cause.to_string())
            .unwrap_or_else(|| e.to_string());
        invalid(reason)
    })
}

/// `user@host:port/dbname` of a configuration, for logs.
fn describe_target(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = config
                .get_ports()
                .get(i)
                .or_else(|| config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

/// A duration as a PostgreSQL time setting in ms, at least 1 ms (0 would
/// turn the timeout off) and at most `i32::MAX` ms (the largest value these
/// settings accept).
fn setting_ms(d: Duration) -> String {
    let ms = d.as_millis().clamp(1, i32::MAX as u128);
    format!("{ms}ms")
}

/// The TCP user timeout of every connection (how long sent data may stay
/// unacknowledged): the keepalive idle time plus every probe.
fn user_timeout(options: &PostgresOptions) -> Duration {
    options.keepalives_idle + KEEPALIVE_INTERVAL * KEEPALIVE_RETRIES
}

/// The connection settings of `role`: connect timeout, keepalives,
/// application name and the role's session settings (as `-c name=value`
/// start-up options, after any options of the URL).
fn session_config(base: &Config, options: &PostgresOptions, role: Role) -> Config {
    let mut config = base.clone();
    config
        .connect_timeout(options.connect_timeout)
        .keepalives(true)
        .keepalives_idle(options.keepalives_idle)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(user_timeout(options));
    if config.get_application_name().is_none() {
        config.application_name(role.application_name());
    }
    let settings: Vec<(&str, String)> = match role {
        Role::Pool => vec![
            ("statement_timeout", setting_ms(options.statement_timeout)),
            (
                "idle_in_transaction_session_timeout",
                setting_ms(options.idle_in_transaction_timeout),
            ),
        ],
        Role::Renewal => vec![
            (
                "statement_timeout",
                setting_ms(options.renew_statement_timeout),
            ),
            (
                "idle_in_transaction_session_timeout",
                setting_ms(options.idle_in_transaction_timeout),
            ),
            (
                "client_connection_check_interval",
                setting_ms(options.client_connection_check_interval),
            ),
        ],
        Role::Migration => vec![("lock_timeout", setting_ms(MIGRATION_LOCK_WAIT))],
        // Idle for its whole life: no idle timeout may end it.
        Role::Listener => vec![("idle_session_timeout", "0".to_owned())],
        // Waits on a lock for as long as the holder lives.
        Role::Watch => vec![
            ("idle_session_timeout", "0".to_owned()),
            ("statement_timeout", "0".to_owned()),
            ("lock_timeout", "0".to_owned()),
        ],
        // Idle for its whole life, and the server must notice soon when its
        // client's host is gone, because that releases the session lock.
        Role::Liveness => vec![
            ("idle_session_timeout", "0".to_owned()),
            ("statement_timeout", "0".to_owned()),
            (
                "client_connection_check_interval",
                setting_ms(options.client_connection_check_interval),
            ),
            ("tcp_keepalives_idle", setting_ms(options.keepalives_idle)),
            ("tcp_keepalives_interval", setting_ms(KEEPALIVE_INTERVAL)),
            ("tcp_keepalives_count", KEEPALIVE_RETRIES.to_string()),
            ("tcp_user_timeout", setting_ms(user_timeout(options))),
        ],
    };
    let mut start_up = config.get_options().unwrap_or("").to_owned();
    for (name, value) in settings {
        if !start_up.is_empty() {
            start_up.push(' ');
        }
        start_up.push_str(&format!("-c {name}={value}"));
    }
    config.options(start_up);
    config
}

/// Opens one connection outside the pool and spawns its connection task.
async fn open_connection(
    config: &Config,
    limit: Duration,
) -> Result<(Client, tokio::task::JoinHandle<()>)> {
    let (client, connection) = tokio::time::timeout(limit, config.connect(NoTls))
        .await
        .map_err(|_| {
            Error::unavailable(format!(
                "no connection to postgres within {} ms",
                limit.as_millis()
            ))
        })??;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %Error::from(e), "postgres connection ended");
        }
    });
    Ok((client, task))
}

/// A connection of this crate (no TLS), driven by hand rather than spawned.
type PgConnection = Connection<Socket, NoTlsStream>;

/// Connects within `limit` and returns the connection undriven: the caller
/// must poll it (see [`drive`]).
async fn connect_raw(config: &Config, limit: Duration) -> Result<(Client, PgConnection)> {
    tokio::time::timeout(limit, config.connect(NoTls))
        .await
        .map_err(|_| {
            Error::unavailable(format!(
                "no connection to postgres within {} ms",
                limit.as_millis()
            ))
        })?
        .map_err(Error::from)
}

/// Drives `connection` until `work` (which uses its client) finishes,
/// passing every asynchronous message (notifications, notices) to
/// `on_message`.
///
/// # Errors
/// [`Error::Unavailable`] (or the driver's error) when the connection
/// fails or closes before `work` finishes.
async fn drive<F: Future>(
    connection: &mut PgConnection,
    work: F,
    mut on_message: impl FnMut(AsyncMessage),
) -> Result<F::Output> {
    let mut work = pin!(work);
    poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        loop {
            match connection.poll_message(cx) {
                Poll::Ready(Some(Ok(message))) => on_message(message),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(Error::from(e))),
                Poll::Ready(None) => {
                    // The connection finished; `work` may have its answer.
                    return Poll::Ready(match work.as_mut().poll(cx) {
                        Poll::Ready(output) => Ok(output),
                        Poll::Pending => Err(Error::unavailable("the postgres connection closed")),
                    });
                }
                Poll::Pending => {
                    // Answers the connection just read may complete `work`.
                    return match work.as_mut().poll(cx) {
                        Poll::Ready(output) => Poll::Ready(Ok(output)),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    })
    .await
}

/// Checks that the connection path is not a pooler Herald cannot work
/// through (see [`pooler`]), then runs the embedded migrations under
/// [`MIGRATION_LOCK_KEY`], on a connection of its own that is closed
/// afterwards (which also releases the lock if anything failed).
async fn migrate(base: &Config, options: &PostgresOptions, target: &str) -> Result<()> {
    let config = session_config(base, options, Role::Migration);
    let limit = options.connect_timeout + CONNECT_GRACE;
    // The first connection of a node: say which server it could not reach.
    let in_target = |e| match e {
        Error::Unavailable { message, source } => Error::Unavailable {
            message: format!("{target}: {message}"),
            source,
        },
        other => other,
    };
    let (mut client, task) = open_connection(&config, limit).await.map_err(in_target)?;
    // Before anything else: through a transaction pooler even the
    // migration lock below would outlive this connection.
    let checked = pooler::check(&client, &config, MIGRATION_LOCK_WAIT.as_millis(), limit)
        .await
        .map_err(in_target);
    let result = match checked {
        Ok(()) => migrate_on(&mut client, target).await,
        Err(e) => Err(e),
    };
    drop(client);
    // The task ends once the client is gone; a failure already ended it.
    let _ = task.await;
    result
}

async fn migrate_on(client: &mut Client, target: &str) -> Result<()> {
    let version: String = client
        .query_one("SELECT current_setting('server_version_num')", &[])
        .await?
        .try_get(0)?;
    let version: i64 = version
        .parse()
        .map_err(|_| Error::migration(format!("unexpected server_version_num {version:?}")))?;
    if version < MIN_SERVER_VERSION {
        return Err(Error::migration(format!(
            "PostgreSQL 14 or newer is required (client_connection_check_interval); \
             the server reports server_version_num {version}"
        )));
    }
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    let report = embedded::migrations::runner()
        .set_grouped(true)
        .run_async(client)
        .await
        .map_err(Error::migration_because);
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    for migration in report?.applied_migrations() {
        tracing::info!(database = %target, migration = %migration, "postgres schema migration applied");
    }
    Ok(())
}

async fn read_settings(client: &Client) -> Result<SessionSettings> {
    let row = client
        .query_one(
            "SELECT current_setting('statement_timeout'), \
             current_setting('idle_in_transaction_session_timeout'), \
             current_setting('client_connection_check_interval'), \
             current_setting('application_name')",
            &[],
        )
        .await?;
    Ok(SessionSettings {
        statement_timeout: row.try_get(0)?,
        idle_in_transaction_session_timeout: row.try_get(1)?,
        client_connection_check_interval: row.try_get(2)?,
        application_name: row.try_get(3)?,
    })
}

/// Classifies a pool error: no connection in time, or a connection that
/// could not be made, is [`Error::Unavailable`].
fn pool_error(e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => e.into(),
        PoolError::Timeout(kind) => {
            Error::unavailable(format!("no pool connection in time ({kind:?})"))
        }
        other => Error::unavailable_because(format!("connection pool: {other}"), other),
    }
}

/// 64-bit FNV-1a of `prefix` then `name`, as `bigint`: a stable advisory
/// lock key, the same on every node and every build.
const fn advisory_key(prefix: &[u8], name: &[u8]) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut i = 0;
    while i < prefix.len() {
        hash = (hash ^ prefix[i] as u64).wrapping_mul(PRIME);
        i += 1;
    }
    let mut i = 0;
    while i < name.len() {
        hash = (hash ^ name[i] as u64).wrapping_mul(PRIME);
        i += 1;
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Key of the transaction-level advisory lock (`pg_advisory_xact_lock`)
/// that serializes the fenced writes of the lease `lease_name`: the 64-bit
/// FNV-1a hash of `herald/fenced-write/<lease_name>`, reinterpreted as
/// `bigint`. Every node computes the same key for the same name.
/// PostgreSQL's `pg_locks` shows it as `classid` (high 32 bits) and `objid`
/// (low 32 bits) with `objsubid = 1` (PostgreSQL documentation, "Explicit
/// Locking", "Advisory Locks"; "System Views", `pg_locks`).
pub fn fenced_write_lock_key(lease_name: &str) -> i64 {
    advisory_key(b"herald/fenced-write/", lease_name.as_bytes())
}

#[async_trait]
impl LeaseStore for PostgresStorage {
    async fn acquire(&self, candidate: &Candidate, ttl: Duration) -> Result<Acquire> {
        *self
            .inner
            .seen_at_acquire
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = (
            *self.inner.releases.borrow(),
            *self.inner.watch_fired.borrow(),
        );
        let mut client = self.client().await?;
        ops::acquire(
            &mut client,
            candidate,
            ttl_ms(ttl),
            &setting_ms(self.inner.options.acquire_lock_timeout),
            self.inner.session_key,
        )
        .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        self.inner.renewal.renew(lease, ttl_ms(ttl)).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let client = self.client().await?;
        ops::release(&client, lease).await
    }

    async fn lease_info(&self, name: &str) -> Result<Option<LeaseInfo>> {
        let client = self.client().await?;
        ops::lease_info(&client, name).await
    }

    /// Resolves when, since the last acquire began, a release of a lease
    /// was announced on [`LEASE_CHANNEL`] (or the listener reconnected and
    /// may have missed one), or the takeover watch saw the session of
    /// `held`'s holder end (see the module `takeover`).
    async fn takeover_hint(&self, held: &LeaseInfo) {
        let target = Some((held.name.clone(), held.token.0));
        self.inner.watch_target.send_if_modified(|t| {
            let changed = *t != target;
            if changed {
                t.clone_from(&target);
            }
            changed
        });
        let (releases_seen, fired_seen) = *self
            .inner
            .seen_at_acquire
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut releases = self.inner.releases.clone();
        let mut fired = self.inner.watch_fired.clone();
        let released = async move { releases.wait_for(|n| *n > releases_seen).await.is_ok() };
        let gone = async move { fired.wait_for(|n| *n > fired_seen).await.is_ok() };
        tokio::select! {
            true = released => {}
            true = gone => {}
            else => std::future::pending::<()>().await,
        }
    }
}

#[async_trait]
impl Storage for PostgresStorage {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn append(&self, lease: &Lease, batch: &[NewMessage]) -> Result<Vec<Appended>> {
        let mut client = self.client().await?;
        ops::append(&mut client, lease, batch).await
    }

    async fn read(&self, channel: &ChannelName, after: Offset, limit: usize) -> Result<Page> {
        let client = self.client().await?;
        ops::read(&client, channel, after, limit).await
    }

    async fn channels(&self) -> Result<Vec<ChannelHead>> {
        let client = self.client().await?;
        ops::channels(&client).await
    }

    async fn changes_since(&self, cursor: u64) -> Result<ChangeFeed> {
        let client = self.client().await?;
        ops::changes_since(&client, cursor).await
    }

    async fn change_cursor(&self) -> Result<u64> {
        let client = self.client().await?;
        ops::change_cursor(&client).await
    }

    async fn ping(&self) -> Result<()> {
        let client = self.client().await?;
        ops::ping(&client).await
    }

    fn watch_changes(&self) -> Option<broadcast::Receiver<ChangeSignal>> {
        Some(self.inner.changes.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisory_keys_are_stable_and_distinct() {
        // FNV-1a test vector: the empty input hashes to the offset basis.
        assert_eq!(advisory_key(b"", b"") as u64, 0xcbf2_9ce4_8422_2325);
        // "a" -> 0xaf63dc4c8601ec8c (FNV-1a 64 reference value).
        assert_eq!(advisory_key(b"a", b"") as u64, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(advisory_key(b"ab", b""), advisory_key(b"a", b"b"));
        assert_ne!(
            fenced_write_lock_key("writer"),
            fenced_write_lock_key("other")
        );
        assert_ne!(fenced_write_lock_key("writer"), MIGRATION_LOCK_KEY);
    }

    #[test]
    fn connection_strings_name_the_accepted_forms() {
        for ok in [
            "postgres://herald:secret@db.internal:5432/herald",
            "postgresql://herald@127.0.0.1/postgres",
            "host=db.internal user=herald dbname=herald",
        ] {
            assert!(check_connection_string(ok).is_ok(), "{ok}");
        }
        for (bad, reason) in [
            (
                "not-a-url",
                "neither a postgres:// URL nor key=value settings",
            ),
            (
                "mysql://root:secret@db/app",
                "the scheme mysql:// is not PostgreSQL",
            ),
            ("sqlite:///x.db", "the scheme sqlite:// is not PostgreSQL"),
            ("  ", "it is empty"),
            ("host=db frobnicate=1", "unknown option `frobnicate`"),
            ("host=db port=seven", "invalid value for option `port`"),
        ] {
            let e = check_connection_string(bad).unwrap_err();
            assert!(
                matches!(e, Error::InvalidConnectionString(_)),
                "{bad}: {e:?}"
            );
            let text = e.to_string();
            assert!(
                text.starts_with("invalid PostgreSQL connection string: "),
                "{text}"
            );
            assert!(text.contains(reason), "{bad}: {text}");
            assert!(
                text.contains("postgres://user:password@host:port/dbname"),
                "{text}"
            );
            assert!(text.contains("key=value"), "{text}");
            assert!(!text.contains("secret"), "{text}");
        }
    }

    #[test]
    fn settings_are_whole_ms_and_never_zero() {
        assert_eq!(setting_ms(Duration::from_secs(5)), "5000ms");
        assert_eq!(setting_ms(Duration::ZERO), "1ms");
        assert_eq!(setting_ms(Duration::from_micros(1500)), "1ms");
        assert_eq!(
            setting_ms(Duration::from_secs(u64::MAX)),
            format!("{}ms", i32::MAX)
        );
    }

    #[test]
    fn session_options_keep_the_urls_and_hide_the_password() {
        let base: Config = "postgres://u:secret@db.test:6543/herald?options=-c%20search_path%3Dx"
            .parse()
            .unwrap();
        let config = session_config(&base, &PostgresOptions::default(), Role::Renewal);
        assert_eq!(
            config.get_options(),
            Some(
                "-c search_path=x -c statement_timeout=5000ms \
                 -c idle_in_transaction_session_timeout=5000ms \
                 -c client_connection_check_interval=1000ms"
            )
        );
        assert_eq!(config.get_application_name(), Some("herald-renewal"));
        assert!(config.get_keepalives());
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(5)));
        let target = describe_target(&base);
        assert_eq!(target, "u@db.test:6543/herald");

        let liveness = session_config(&base, &PostgresOptions::default(), Role::Liveness);
        assert_eq!(
            liveness.get_options(),
            Some(
                "-c search_path=x -c idle_session_timeout=0 -c statement_timeout=0 \
                 -c client_connection_check_interval=1000ms -c tcp_keepalives_idle=5000ms \
                 -c tcp_keepalives_interval=1000ms -c tcp_keepalives_count=5 \
                 -c tcp_user_timeout=10000ms"
            )
        );
        assert_eq!(liveness.get_application_name(), Some("herald-liveness"));
        let listener = session_config(&base, &PostgresOptions::default(), Role::Listener);
        assert_eq!(listener.get_application_name(), Some("herald-listen"));
        assert!(!format!("{config:?}").contains("secret"));
    }
}
