//! One connection's set-up: the options of a storage, the session settings
//! of each kind of connection (pool, renewal, migration, listener,
//! liveness, takeover watch) sent at connection start, and opening one
//! connection outside the pool, spawned or driven by hand.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, Socket};

use crate::error::{Error, Result};

/// How long [`PostgresStorage::connect`](super::connect::PostgresStorage::connect) waits for another node that is
/// migrating the same database (the migration connection's `lock_timeout`).
pub(super) const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(60);
/// Interval between TCP keepalive probes once the connection is idle for
/// [`PostgresOptions::keepalives_idle`].
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered keepalive probes after which the connection is dead.
const KEEPALIVE_RETRIES: u32 = 5;
/// Extra time the client gives a connection attempt beyond
/// [`PostgresOptions::connect_timeout`] before it gives up itself.
pub(super) const CONNECT_GRACE: Duration = Duration::from_secs(1);

/// Settings of [`PostgresStorage::connect`](super::connect::PostgresStorage::connect). Every duration is rounded down
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

/// Which connection a configuration is for; decides its session settings.
#[derive(Clone, Copy)]
pub(super) enum Role {
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

/// `user@host:port/dbname` of a configuration, for logs.
pub(super) fn describe_target(config: &Config) -> String {
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
pub(super) fn setting_ms(d: Duration) -> String {
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
pub(super) fn session_config(base: &Config, options: &PostgresOptions, role: Role) -> Config {
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
        // Asks every 100 ms for as long as the holder lives, idle in
        // between.
        Role::Watch => vec![("idle_session_timeout", "0".to_owned())],
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
pub(super) async fn open_connection(
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
pub(super) type PgConnection = Connection<Socket, NoTlsStream>;

/// Connects within `limit` and returns the connection undriven: the caller
/// must poll it (see [`drive`]).
pub(super) async fn connect_raw(
    config: &Config,
    limit: Duration,
) -> Result<(Client, PgConnection)> {
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
pub(super) async fn drive<F: Future>(
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

pub(super) async fn read_settings(client: &Client) -> Result<SessionSettings> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
