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
//! - A short-lived migration connection in [`PostgresStorage::connect`].
//!
//! Every connection has TCP keepalives, a TCP user timeout and a connect
//! timeout, so that a dead peer is noticed in seconds (libpq's parameters
//! `keepalives_idle`, `keepalives_interval`, `keepalives_count`,
//! `tcp_user_timeout`, `connect_timeout`: PostgreSQL documentation, "Database
//! Connection Control Functions", "Parameter Key Words"; this crate uses the
//! equivalent settings of `tokio_postgres::Config`).
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
//! - "System Administration Functions", Advisory Lock Functions:
//!   <https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS>
//! - libpq "Parameter Key Words" (connection string, keepalives,
//!   `connect_timeout`, `tcp_user_timeout`):
//!   <https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS>
//! - Appendix A, "PostgreSQL Error Codes":
//!   <https://www.postgresql.org/docs/current/errcodes-appendix.html>

mod ops;
mod renewal;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use herald_core::{
    Appended, Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, NewMessage, Offset,
};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use self::renewal::Renewal;
use crate::{Acquire, ChangeFeed, Error, LeaseStore, Page, Result, Storage};

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
/// Longest lease ttl stored, in ms (about 100 years).
const MAX_TTL_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

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
    /// [`Error::Unavailable`] and its connection dropped. Keep it (plus 1 s)
    /// under the renew interval. Default 5 s.
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
    /// unacknowledged) is this + 5 s. Default 5 s.
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
    /// `herald-renewal` on the renewal connection, unless the URL sets one.
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
/// pool and the renewal connection. Each `PostgresStorage` made by
/// [`PostgresStorage::connect`] acts as one node.
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
}

impl fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("target", &self.inner.target)
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
}

impl Role {
    fn application_name(self) -> &'static str {
        match self {
            Self::Pool => "herald",
            Self::Renewal => "herald-renewal",
            Self::Migration => "herald-migrate",
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
    /// Safe to call from several nodes at once on the same database: the
    /// migrations (`migrations/postgres`, applied by refinery in one
    /// transaction) run under the session-level advisory lock
    /// [`MIGRATION_LOCK_KEY`], one node at a time, and each is applied once.
    /// Needs PostgreSQL 14 or newer. The renewal connection is opened at the
    /// first renewal. Logs the database as `user@host:port/dbname`, never
    /// the password.
    ///
    /// # Errors
    /// [`Error::Postgres`] when `url` cannot be parsed or the server refuses
    /// the settings; [`Error::Unavailable`] when the server cannot be
    /// reached within `options.connect_timeout`, or another node holds the
    /// migration lock for over 60 s; [`Error::Migration`] when the schema
    /// cannot be migrated or the server is older than PostgreSQL 14.
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self> {
        let base: Config = url.parse()?;
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
            .map_err(|e| Error::Unavailable(format!("could not build the connection pool: {e}")))?;
        let renewal = Renewal::new(
            session_config(&base, &options, Role::Renewal),
            options.renew_statement_timeout,
            options.connect_timeout + CONNECT_GRACE,
        );
        let storage = Self {
            inner: Arc::new(Inner {
                pool,
                renewal,
                options,
                target,
            }),
        };
        // One pool connection now: the server accepts its session settings.
        storage.ping().await?;
        tracing::info!(
            database = %storage.inner.target,
            pool_size = storage.inner.options.pool_size.max(1),
            "postgres storage connected"
        );
        Ok(storage)
    }

    /// The database as `user@host:port/dbname` (no password), as logged.
    pub fn target(&self) -> &str {
        &self.inner.target
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
        .tcp_user_timeout(options.keepalives_idle + KEEPALIVE_INTERVAL * KEEPALIVE_RETRIES);
    if config.get_application_name().is_none() {
        config.application_name(role.application_name());
    }
    let settings: Vec<(&str, Duration)> = match role {
        Role::Pool => vec![
            ("statement_timeout", options.statement_timeout),
            (
                "idle_in_transaction_session_timeout",
                options.idle_in_transaction_timeout,
            ),
        ],
        Role::Renewal => vec![
            ("statement_timeout", options.renew_statement_timeout),
            (
                "idle_in_transaction_session_timeout",
                options.idle_in_transaction_timeout,
            ),
            (
                "client_connection_check_interval",
                options.client_connection_check_interval,
            ),
        ],
        Role::Migration => vec![("lock_timeout", MIGRATION_LOCK_WAIT)],
    };
    let mut start_up = config.get_options().unwrap_or("").to_owned();
    for (name, value) in settings {
        if !start_up.is_empty() {
            start_up.push(' ');
        }
        start_up.push_str(&format!("-c {name}={}", setting_ms(value)));
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
            Error::Unavailable(format!(
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

/// Runs the embedded migrations under [`MIGRATION_LOCK_KEY`], on a
/// connection of its own that is closed afterwards (which also releases
/// the lock if anything failed).
async fn migrate(base: &Config, options: &PostgresOptions, target: &str) -> Result<()> {
    let config = session_config(base, options, Role::Migration);
    let (mut client, task) =
        open_connection(&config, options.connect_timeout + CONNECT_GRACE).await?;
    let result = migrate_on(&mut client, target).await;
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
        .map_err(|_| Error::Migration(format!("unexpected server_version_num {version:?}")))?;
    if version < MIN_SERVER_VERSION {
        return Err(Error::Migration(format!(
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
        .map_err(|e| Error::Migration(e.to_string()));
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
            Error::Unavailable(format!("no pool connection in time ({kind:?})"))
        }
        other => Error::Unavailable(format!("connection pool: {other}")),
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

/// A ttl in ms for SQL, capped at about 100 years.
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis())
        .unwrap_or(i64::MAX)
        .min(MAX_TTL_MS)
}

#[async_trait]
impl LeaseStore for PostgresStorage {
    async fn acquire(&self, candidate: &Candidate, ttl: Duration) -> Result<Acquire> {
        let mut client = self.client().await?;
        ops::acquire(
            &mut client,
            candidate,
            ttl_ms(ttl),
            &setting_ms(self.inner.options.acquire_lock_timeout),
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
        assert!(!format!("{config:?}").contains("secret"));
    }
}
