//! Opening a PostgreSQL storage: the connection string, the start-up
//! checks and migrations, the pool, and the dedicated connections with
//! their tasks (liveness, listener, takeover watch; the renewal connection
//! is opened at the first renewal). [`PostgresStorage`] is the handle all
//! of it hangs on; `storage.rs` implements the storage traits on it.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio::sync::{broadcast, watch};
use tokio_postgres::{Client, Config, NoTls};

use super::names::{twin_key, MIGRATION_LOCK_KEY};
use super::renewal::Renewal;
use super::session::{
    describe_target, open_connection, read_settings, session_config, PostgresOptions, Role,
    SessionSettings, CONNECT_GRACE, MIGRATION_LOCK_WAIT,
};
use super::{listen, liveness, pooler, presence_events, takeover};
use crate::cluster::ClusterEvent;
use crate::error::{Error, Result};
use crate::traits::{ChangeSignal, Storage};

mod embedded {
    #![allow(missing_docs, unreachable_pub)]
    refinery::embed_migrations!("migrations/postgres");
}

/// Capacity of the broadcast channel behind
/// [`ClusterView::watch_cluster_events`](crate::traits::ClusterView::watch_cluster_events): a receiver that falls this many
/// events behind loses the oldest.
pub const CLUSTER_EVENT_CAPACITY: usize = 1024;

/// Capacity of the broadcast channel behind [`ChangeFeedReader::watch_changes`](crate::traits::ChangeFeedReader::watch_changes): a
/// receiver that falls this many notices behind loses the oldest and is
/// told so (`RecvError::Lagged`).
pub const CHANGE_SIGNAL_CAPACITY: usize = 4096;

/// Oldest PostgreSQL release supported: 14, the first with
/// `client_connection_check_interval` (as `server_version_num`).
const MIN_SERVER_VERSION: i64 = 140_000;

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
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) pool: Pool,
    pub(super) renewal: Renewal,
    pub(super) options: PostgresOptions,
    /// `user@host:port/dbname`, for logs; never the password.
    pub(super) target: String,
    /// The key of the session-level advisory lock that the liveness
    /// connection holds; recorded as `holder_session` by acquire.
    pub(super) session_key: i64,
    /// The listener task sends on this; receivers come from `subscribe`.
    pub(super) changes: broadcast::Sender<ChangeSignal>,
    /// Other nodes' cluster events, from the listener task.
    pub(super) cluster: broadcast::Sender<ClusterEvent>,
    /// Lease releases heard by the listener (a counter).
    pub(super) releases: watch::Receiver<u64>,
    /// Join and leave events of other nodes heard by the listener.
    pub(super) presence_inbox: presence_events::Inbox,
    /// Numbers the join and leave events this storage sends.
    pub(super) presence_seq: AtomicU64,
    /// Which lease the takeover watch follows (set by `takeover_hint`).
    pub(super) watch_target: watch::Sender<takeover::Target>,
    /// Holder sessions the takeover watch saw end (a counter).
    pub(super) watch_fired: watch::Receiver<u64>,
    /// `releases` and `watch_fired` as the last acquire began: a hint
    /// resolves only on news after that.
    pub(super) seen_at_acquire: Mutex<(u64, u64)>,
    /// Dropped with the last handle: the listener and liveness tasks see
    /// it closed, close their connections and end.
    pub(super) _stop: watch::Sender<()>,
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

    /// A pool connection.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when none is free or can be opened in time.
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
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

/// Classifies a pool error: no connection in time, or a connection that
/// could not be made, is [`Error::Unavailable`].
pub(super) fn pool_error(e: PoolError) -> Error {
    match e {
        PoolError::Backend(e) => e.into(),
        PoolError::Timeout(kind) => {
            Error::unavailable(format!("no pool connection in time ({kind:?})"))
        }
        other => Error::unavailable_because(format!("connection pool: {other}"), other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
