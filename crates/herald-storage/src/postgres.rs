//! The PostgreSQL backend: several Herald nodes share one database, and the
//! writer lease decides which one of them writes.
//!
//! The design is in `docs/storage.md` ("Operations on PostgreSQL" with its
//! lock modes, connections, dead-holder detection and change notices, and
//! "The safety argument"); this code follows it, and changes to one go
//! with changes to the other. In short: a pool of connections for fenced
//! writes, acquire, release and reads, and dedicated connections for
//! renewal (`renewal.rs`), change notices (`listen.rs`), liveness
//! (`liveness.rs`) and the takeover watch (`takeover.rs`), reopened under
//! one policy (`reconnect.rs`). Join and leave events between nodes are
//! notifications too (`presence_events.rs`), heard by the same listener. A fenced write holds the lease row
//! `FOR KEY SHARE`, a renewal `FOR NO KEY UPDATE`, an acquire `FOR UPDATE`,
//! and every decision after a lock wait is a statement of its own on the
//! database clock (`ops.rs`). Every connection must be one server session
//! for its whole life: [`PostgresStorage::connect`] refuses a pooler that
//! breaks that (`pooler.rs`; docs/operations.md, "Connection poolers").

mod cluster;
mod epoch;
mod listen;
mod liveness;
mod nodes;
mod ops;
mod pooler;
mod presence;
mod presence_events;
mod reconnect;
mod renewal;
mod takeover;

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::AtomicU64;
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
use crate::{
    Acquire, ChangeFeed, ChangeSignal, ChannelClients, ChannelStats, ClusterEvent, Deletions,
    Error, LeaseStore, NodeReport, Page, PresenceEvent, Result, Storage, TrimLimits, Trimmed,
};

pub use presence_events::{MAX_PAYLOAD_BYTES, PRESENCE_CHANNEL, PRESENCE_EVENT_CAPACITY};

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

/// The notification channel on which nodes send each other cluster
/// events (`crate::cluster`: the payload is JSON, shorter than 8000
/// bytes). Each node's listener passes on the events other nodes sent
/// ([`Storage::watch_cluster_events`]).
pub const CLUSTER_CHANNEL: &str = "herald_cluster";

/// Capacity of the broadcast channel behind
/// [`Storage::watch_cluster_events`]: a receiver that falls this many
/// events behind loses the oldest.
pub const CLUSTER_EVENT_CAPACITY: usize = 1024;

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
    /// Other nodes' cluster events, from the listener task.
    cluster: broadcast::Sender<ClusterEvent>,
    /// Lease releases heard by the listener (a counter).
    releases: watch::Receiver<u64>,
    /// Join and leave events of other nodes heard by the listener.
    presence_inbox: presence_events::Inbox,
    /// Numbers the join and leave events this storage sends.
    presence_seq: AtomicU64,
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
    /// `postgres/pooler.rs`, and "Connection poolers" in
    /// docs/operations.md).
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
    /// settings sent at connection start (see "Connection poolers" in
    /// docs/operations.md); nothing in the database was changed then.
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
        // Two liveness sessions, one on the key and one on its twin: the
        // storage counts as gone only when both have ended, so one session
        // ended on its own (a terminated backend) is taken back before any
        // standby finds this node gone, while a crash ends both at once.
        let liveness_config = session_config(&base, &options, Role::Liveness);
        for key in [session_key, twin_key(session_key)] {
            let locked =
                liveness::establish(&liveness_config, key, connect_limit, connect_limit).await?;
            tokio::spawn(liveness::run(
                liveness_config.clone(),
                key,
                connect_limit,
                locked,
                stop_rx.clone(),
            ));
        }

        let (changes, _) = broadcast::channel(CHANGE_SIGNAL_CAPACITY);
        let (releases, _) = watch::channel(0);
        let presence_inbox = presence_events::Inbox::new(session_key);
        let (cluster, _) = broadcast::channel(CLUSTER_EVENT_CAPACITY);
        let outputs = listen::Outputs {
            changes: changes.clone(),
            releases: releases.clone(),
            presence: presence_inbox.clone(),
            cluster: cluster.clone(),
            session_key,
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
                cluster,
                releases: releases.subscribe(),
                presence_inbox,
                presence_seq: AtomicU64::new(0),
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
    ///
    /// A second liveness connection holds the key's twin
    /// ([`PostgresStorage::twin_session_key`]); other nodes find this
    /// storage gone only when neither lock is held.
    pub fn session_key(&self) -> i64 {
        self.inner.session_key
    }

    /// The twin of [`PostgresStorage::session_key`] (the key with its top
    /// bit flipped), whose session-level advisory lock this storage's
    /// second liveness connection holds.
    pub fn twin_session_key(&self) -> i64 {
        twin_key(self.inner.session_key)
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
        // Warnings and errors only: on a database already migrated (every
        // start after the first) refinery's `CREATE TABLE IF NOT EXISTS`
        // draws a NOTICE that tokio_postgres would log at INFO.
        Role::Migration => vec![
            ("lock_timeout", setting_ms(MIGRATION_LOCK_WAIT)),
            ("client_min_messages", "warning".to_owned()),
        ],
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

/// The twin of session key `key`: `key` with its top bit flipped. A
/// storage's two liveness connections hold `key` and its twin; a lease's
/// `holder_session` records only `key`, and every check of whether a
/// holder is gone derives the twin from it.
pub(super) fn twin_key(key: i64) -> i64 {
    key ^ i64::MIN
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

    async fn takeover_counts(&self, name: &str) -> Result<Vec<crate::TakeoverCount>> {
        let client = self.client().await?;
        ops::takeover_counts(&client, name).await
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

    async fn channel_stats(&self) -> Result<Vec<ChannelStats>> {
        let client = self.client().await?;
        ops::channel_stats(&client).await
    }

    async fn trim(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &TrimLimits,
        max_rows: usize,
    ) -> Result<Trimmed> {
        let mut client = self.client().await?;
        ops::trim(&mut client, lease, channel, limits, max_rows).await
    }

    async fn presence_add(
        &self,
        session: &str,
        entry: &crate::PresenceEntry,
        ttl: Duration,
    ) -> Result<()> {
        let client = self.client().await?;
        presence::add(&client, session, entry, ttl).await
    }

    async fn presence_remove(&self, channel: &ChannelName, id: &str) -> Result<()> {
        let client = self.client().await?;
        presence::remove(&client, channel, id).await
    }

    async fn presence_touch(&self, session: &str, ttl: Duration) -> Result<()> {
        let client = self.client().await?;
        presence::touch(&client, session, ttl).await
    }

    async fn report_node(
        &self,
        report: &NodeReport,
        channels: &[ChannelClients],
        ttl: Duration,
    ) -> Result<()> {
        let mut client = self.client().await?;
        nodes::report(&mut client, report, channels, ttl).await
    }

    async fn node_reports(&self) -> Result<Vec<NodeReport>> {
        let client = self.client().await?;
        nodes::list(&client).await
    }

    async fn cluster_channels(&self, except_node: &str) -> Result<Vec<ChannelClients>> {
        let client = self.client().await?;
        nodes::channels(&client, except_node).await
    }

    async fn presence(&self, channel: &ChannelName) -> Result<Vec<crate::PresenceEntry>> {
        let client = self.client().await?;
        presence::list(&client, channel).await
    }

    async fn channel_epoch(&self, channel: &ChannelName) -> Result<String> {
        let client = self.client().await?;
        epoch::read(&client, channel).await
    }

    async fn changes_since(&self, cursor: u64) -> Result<ChangeFeed> {
        let client = self.client().await?;
        ops::changes_since(&client, cursor).await
    }

    async fn change_cursor(&self) -> Result<u64> {
        let client = self.client().await?;
        ops::change_cursor(&client).await
    }

    async fn record_deletion(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        head: Offset,
    ) -> Result<u64> {
        let mut client = self.client().await?;
        ops::record_deletion(&mut client, lease, channel, head).await
    }

    async fn deletions_since(&self, cursor: u64) -> Result<Deletions> {
        let client = self.client().await?;
        ops::deletions_since(&client, cursor).await
    }

    async fn deletion_cursor(&self) -> Result<u64> {
        let client = self.client().await?;
        ops::deletion_cursor(&client).await
    }

    async fn send_cluster_event(&self, event: &ClusterEvent) -> Result<()> {
        event.check_size()?;
        let client = self.client().await?;
        cluster::send(&client, self.inner.session_key, event).await
    }

    fn watch_cluster_events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.inner.cluster.subscribe())
    }

    async fn ping(&self) -> Result<()> {
        let client = self.client().await?;
        ops::ping(&client).await
    }

    fn watch_changes(&self) -> Option<broadcast::Receiver<ChangeSignal>> {
        Some(self.inner.changes.subscribe())
    }

    async fn send_presence_events(&self, events: &[PresenceEvent]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        presence_events::send(
            &client,
            self.inner.session_key,
            &self.inner.presence_seq,
            events,
        )
        .await
    }

    fn watch_presence_events(&self) -> Option<broadcast::Receiver<PresenceEvent>> {
        Some(self.inner.presence_inbox.subscribe())
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

    /// The migration session gets no NOTICE from the server: the
    /// `CREATE TABLE IF NOT EXISTS` that finds the table (as refinery's
    /// does at every start after the first) would otherwise send one,
    /// which tokio_postgres logs at INFO on every standby's start.
    #[tokio::test]
    async fn the_migration_session_gets_no_notices() {
        use futures::StreamExt;
        let db = crate::testing::TestDatabase::create().await;
        let base: Config = db.url().parse().unwrap();
        let config = session_config(&base, &PostgresOptions::default(), Role::Migration);
        let (client, mut connection) = config.connect(NoTls).await.unwrap();
        let notices = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            let mut notices = Vec::new();
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                    notices.push(notice.message().to_owned());
                }
            }
            notices
        });
        for _ in 0..2 {
            client
                .batch_execute("CREATE TABLE IF NOT EXISTS notice_probe (x int)")
                .await
                .unwrap();
        }
        drop(client);
        let notices = notices.await.unwrap();
        assert!(notices.is_empty(), "{notices:?}");
    }
}
