use std::path::PathBuf;

use herald_core::FencingToken;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cause of an [`Error::Unavailable`], [`Error::Migration`] or
/// [`Error::Corrupt`]: the driver's, the pool's or a task's own error.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a channel refuses a message ([`Error::ChannelRefuses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The channel is a closed stream.
    Closed,
    /// The channel is a stream of another kind of payload: bytes for a
    /// JSON message, or JSON for bytes.
    ContentType,
    /// The channel is a stream whose TTL or expiry time has passed on the
    /// storage's clock: it reads as deleted until the holder's retention
    /// task deletes it, and takes no message meanwhile (one would revive
    /// its withheld messages, or be deleted with them).
    Expired,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Closed => "the stream is closed",
            Self::ContentType => "the stream holds another content type",
            Self::Expired => "the stream expired",
        })
    }
}

/// Everything that can go wrong in storage.
///
/// Each error's message (its `Display`) is complete: it quotes what caused
/// it, so that a log record with only `error = %e` says everything. The
/// variants that wrap another error also return it as their `source()`,
/// for code that inspects it (all but [`Error::Io`], which keeps its OS
/// error in the field `error`); a report that walks the whole chain should
/// stop at this error, or it prints each cause twice (`herald serve`
/// reports start-up failures so).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lease is no longer ours: another token or holder is current, or
    /// the lease expired on the storage's clock. A fenced write that returns
    /// this committed nothing; a renewal that returns this extended nothing.
    #[error("lease {name:?} lost: token {token} is no longer current")]
    LeaseLost {
        /// The lease's name.
        name: String,
        /// The token the caller presented.
        token: FencingToken,
    },
    /// Message `index` (from 0) of a fenced write carries an idempotency
    /// key already used on its channel (by a stored message or an earlier
    /// message of the same batch) for a different message: its digest
    /// ([`crate::idempotency_digest`]) differs from the one stored with the
    /// key. The whole transaction was rolled back: nothing of the batch was
    /// committed. A key stored without a digest (before schema version 2)
    /// never yields this: such a key answers the original message, whatever
    /// the new one is. The IETF Idempotency-Key draft
    /// (draft-ietf-httpapi-idempotency-key-header, "Error Scenarios") calls
    /// it a key reused with a different request payload.
    #[error("message {index} of the batch reuses an idempotency key for a different message")]
    IdempotencyKeyReused {
        /// The message's position in the batch passed to `append`, from 0.
        index: usize,
    },
    /// Message `index` (from 0) of a fenced write goes to a channel that
    /// takes no such message: a closed stream, or a stream whose content
    /// type is not JSON while the message is JSON (or the reverse). The
    /// whole transaction was rolled back, as for
    /// [`Error::IdempotencyKeyReused`].
    #[error("message {index} of the batch goes to a channel that refuses it ({refusal})")]
    ChannelRefuses {
        /// The message's position in the batch passed to `append`, from 0.
        index: usize,
        /// Why.
        refusal: Refusal,
    },
    /// The storage could not be reached or did not answer in time (locked
    /// database, timeout, closed connection). The operation may be retried.
    /// A write that returns this committed nothing, except when the
    /// connection broke while its commit was in flight: then the outcome is
    /// unknown (retry with the same idempotency keys).
    #[error("storage unavailable: {message}")]
    Unavailable {
        /// What failed, ending with the cause's own words when there is a
        /// cause (e.g. `postgres: ERROR: canceling statement due to lock
        /// timeout (SQLSTATE 55P03)`).
        message: String,
        /// The error that caused it; `None` when this crate found the
        /// condition itself (a wait that ran out, a full queue, a thread or
        /// connection that is gone, an unexpected answer).
        #[source]
        source: Option<Cause>,
    },
    /// A cluster event ([`crate::ClusterEvent`]) whose payload would be
    /// `bytes` long, over the `limit` of one notification (PostgreSQL
    /// refuses a `NOTIFY` payload of 8000 bytes or more in its default
    /// configuration; PostgreSQL documentation, `NOTIFY`). Nothing was
    /// sent.
    #[error("cluster event of {bytes} bytes is over the limit of {limit} bytes")]
    ClusterEventTooLarge {
        /// The payload's length in bytes.
        bytes: usize,
        /// The longest payload sent ([`crate::cluster::MAX_PAYLOAD_BYTES`]).
        limit: usize,
    },
    /// A schema migration failed at start-up.
    #[error("migration failed: {message}")]
    Migration {
        /// What failed, with the cause's own words when there is a cause.
        message: String,
        /// The migration runner's error; `None` when this crate refused
        /// (an unsupported server version).
        #[source]
        source: Option<Cause>,
    },
    /// A file-system operation on the data directory failed: `operation`
    /// (e.g. "create the data directory") on `path` (absolute), with the
    /// operating system's `error`. Displayed once, as
    /// `cannot <operation> <path>: <error>`.
    #[error("cannot {operation} {}: {error}", path.display())]
    Io {
        /// What was being done, as a verb phrase.
        operation: &'static str,
        /// The file or directory it was done on.
        path: PathBuf,
        /// What the operating system answered.
        error: std::io::Error,
    },
    /// A PostgreSQL connection string that cannot be used: the message says
    /// why and which forms are accepted. It never quotes the string (which
    /// may hold a password).
    #[error("invalid PostgreSQL connection string: {0}")]
    InvalidConnectionString(String),
    /// SQLite reported an error that is not one of the above. (SQLite's
    /// `SQLITE_BUSY` and `SQLITE_LOCKED` become [`Error::Unavailable`]
    /// instead; see the `From<rusqlite::Error>` conversion.)
    #[error("sqlite: {0}")]
    Sqlite(#[source] rusqlite::Error),
    /// PostgreSQL reported an error that is not one of the above (a
    /// constraint violation, a syntax error, an unexpected answer). Timeouts,
    /// lock waits that gave up and lost connections become
    /// [`Error::Unavailable`] instead; see the `From<tokio_postgres::Error>`
    /// conversion.
    #[error("postgres: {}", describe_postgres(.0))]
    Postgres(#[source] tokio_postgres::Error),
    /// Stored data could not be decoded (a bug or a damaged database).
    #[error("corrupt data: {message}")]
    Corrupt {
        /// What is wrong, with the decoder's own words when there is a
        /// cause.
        message: String,
        /// The decoder's error; `None` when data this crate reads back is
        /// missing or out of range.
        #[source]
        source: Option<Cause>,
    },
    /// A connection pooler (or another proxy) sits between this node and
    /// PostgreSQL and Herald cannot work through it: it runs the statements
    /// of one connection in different server sessions (transaction or
    /// statement pooling, PgBouncer's `pool_mode = transaction` or
    /// `statement`), or it refuses or drops the session settings that
    /// every connection sends in the start-up parameter `options`. Found by
    /// [`crate::postgres::PostgresStorage::connect`] before it changes
    /// anything in the database. The message says what was seen and what
    /// to do: connect directly to PostgreSQL, or through a pooler in
    /// session mode that passes `options` on (PgBouncer, in any pool mode,
    /// passes none of the settings Herald sends). PgBouncer's pool modes: <https://www.pgbouncer.org/features.html>,
    /// its `ignore_startup_parameters`: <https://www.pgbouncer.org/config.html>.
    #[error(
        "{0}; connect directly to PostgreSQL, or through a pooler in session mode \
         that passes the start-up parameter `options` on (PgBouncer, in any pool \
         mode, does not pass this node's settings)"
    )]
    UnsupportedPooler(PoolerEvidence),
}

/// What showed that a connection pooler Herald cannot work through sits
/// between a node and PostgreSQL ([`Error::UnsupportedPooler`]). Backend
/// pids are those of `pg_backend_pid()` (PostgreSQL documentation, "System
/// Information Functions and Operators").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolerEvidence {
    /// Two consecutive transactions on one client connection ran in
    /// different server sessions: the pooler hands out a server connection
    /// per transaction.
    #[error(
        "a transaction-pooling proxy was detected: two consecutive transactions on \
         one connection ran in different server sessions (backend pid {first}, \
         then {then})"
    )]
    BackendChanged {
        /// The backend pid the first transaction saw.
        first: i32,
        /// The different backend pid a later transaction saw.
        then: i32,
    },
    /// Two client connections of this node ran transactions in the same
    /// server session.
    #[error(
        "a transaction-pooling proxy was detected: two connections of this node ran \
         in the same server session (backend pid {pid})"
    )]
    SharedBackend {
        /// The backend pid both connections saw.
        pid: i32,
    },
    /// A session-level setting made with `set_config(..., false)` in one
    /// transaction was gone in the next transaction on the same client
    /// connection.
    #[error(
        "a transaction-pooling proxy was detected: a session setting made in one \
         transaction was gone in the next one on the same connection"
    )]
    SessionStateLost,
    /// A session setting sent in the start-up parameter `options`
    /// (`-c name=value`) is not in effect: something between the node and
    /// the server dropped it (PgBouncer does with
    /// `ignore_startup_parameters = options`, in every pool mode).
    #[error(
        "a connection pooler was detected that drops the session settings this node \
         sends at connection start (start-up parameter `options`; PgBouncer does so \
         with ignore_startup_parameters = options): {setting} is {found:?} on the \
         server, this node sent {sent:?}"
    )]
    SettingsDropped {
        /// The setting checked, e.g. `lock_timeout`.
        setting: String,
        /// The value sent, as `pg_settings.setting` shows it (in the
        /// setting's unit, e.g. ms).
        sent: String,
        /// The value in effect, as `pg_settings.setting` shows it.
        found: String,
    },
    /// The server end refused the start-up parameter `options` (PgBouncer
    /// answers `unsupported startup parameter: options`, or from 1.20 on
    /// `unsupported startup parameter in options: <name>`, SQLSTATE 08P01).
    #[error(
        "a connection pooler was detected that refuses the session settings this node \
         sends at connection start (start-up parameter `options`): it answered \
         \"{server_message}\""
    )]
    OptionsRefused {
        /// The refusal as the server end sent it.
        server_message: String,
    },
}

impl Error {
    /// An [`Error::Unavailable`] without a cause: a wait that ran out, a
    /// full queue, a thread or connection that is gone; `message` says
    /// which.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Unavailable`] caused by `source`; `message` already
    /// quotes it (see [`Error`]).
    pub(crate) fn unavailable_because(message: String, source: impl Into<Cause>) -> Self {
        Self::Unavailable {
            message,
            source: Some(source.into()),
        }
    }

    /// An [`Error::Migration`] that this crate decided: `message` says why.
    pub(crate) fn migration(message: String) -> Self {
        Self::Migration {
            message,
            source: None,
        }
    }

    /// An [`Error::Migration`] caused by the migration runner's `source`;
    /// the message is its text, followed by the database's own severity,
    /// message and SQLSTATE when a PostgreSQL error is among its causes
    /// (the runner's text for one is only "db error"), and by what to do
    /// when the database refused a privilege (SQLSTATE 42501
    /// `insufficient_privilege`).
    pub(crate) fn migration_because(source: impl Into<Cause>) -> Self {
        let source = source.into();
        let mut message = source.to_string();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
        while let Some(e) = cause {
            if let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() {
                message = format!("{message}: {}", describe_postgres(pg));
                if pg.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
                    message.push_str(PRIVILEGE_HINT);
                }
                break;
            }
            cause = e.source();
        }
        Self::Migration {
            message,
            source: Some(source),
        }
    }

    /// An [`Error::Corrupt`] that this crate found: `message` says what is
    /// wrong.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::Corrupt {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Corrupt`] caused by a decoder's `source`; `message`
    /// already quotes it (see [`Error`]).
    pub(crate) fn corrupt_because(message: String, source: impl Into<Cause>) -> Self {
        Self::Corrupt {
            message,
            source: Some(source.into()),
        }
    }

    /// An [`Error::Io`] for `operation` on `path`.
    pub(crate) fn io(
        operation: &'static str,
        path: &std::path::Path,
        error: std::io::Error,
    ) -> Self {
        Self::Io {
            operation,
            path: path.to_path_buf(),
            error,
        }
    }
}

impl From<rusqlite::Error> for Error {
    /// Classifies a SQLite error: `SQLITE_BUSY` (another connection holds
    /// the lock longer than the busy timeout) and `SQLITE_LOCKED` (a
    /// conflict inside one shared cache) are lock waits that may succeed on
    /// a retry, so they become [`Error::Unavailable`]; see
    /// <https://www.sqlite.org/rescode.html#busy>. Every other error stays
    /// [`Error::Sqlite`].
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Self::unavailable_because(format!("database is locked: {e}"), e)
            }
            _ => Self::Sqlite(e),
        }
    }
}

/// SQLSTATE codes after which the operation may succeed when retried: the
/// server gave up waiting, shut the session down, or could not be reached.
/// Codes from the PostgreSQL documentation, Appendix A "PostgreSQL Error
/// Codes".
const RETRYABLE_SQLSTATES: &[&str] = &[
    "57014", // query_canceled: statement_timeout (also ending a lock wait), or a cancel request
    "55P03", // lock_not_available: lock_timeout, or NOWAIT
    "25P03", // idle_in_transaction_session_timeout ended the session
    "57P01", // admin_shutdown: the server is stopping, or pg_terminate_backend
    "57P02", // crash_shutdown: another server process crashed; the server restarts
    "57P03", // cannot_connect_now: the server is starting up, shutting down or recovering
    "57P05", // idle_session_timeout ended the session
    "53300", // too_many_connections
    "40P01", // deadlock_detected: the transaction was rolled back
    "40001", // serialization_failure: the transaction was rolled back
];

impl From<tokio_postgres::Error> for Error {
    /// Classifies a PostgreSQL error. [`Error::Unavailable`] for everything
    /// a retry may cure: a statement or lock timeout (SQLSTATE 57014
    /// `query_canceled`, 55P03 `lock_not_available`), a session ended by
    /// the server (25P03, 57P01, 57P02, 57P03, 57P05), too many connections
    /// (53300), a deadlock or serialization failure (40P01, 40001), any
    /// SQLSTATE of class 08 "connection exception", and errors that carry no
    /// SQLSTATE because the connection failed (closed, or an I/O error: a
    /// refused or reset connection, a connect timeout). See the PostgreSQL
    /// documentation, Appendix A "PostgreSQL Error Codes", and "Client
    /// Connection Defaults" for `statement_timeout` and `lock_timeout`.
    /// Every other error stays [`Error::Postgres`]. The driver's error is
    /// the result's source either way.
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(refusal) = options_refusal(&e) {
            return Self::UnsupportedPooler(PoolerEvidence::OptionsRefused {
                server_message: refusal,
            });
        }
        if let Some(code) = e.code() {
            let code = code.code();
            return if code.starts_with("08") || RETRYABLE_SQLSTATES.contains(&code) {
                Self::unavailable_because(format!("postgres: {}", describe_postgres(&e)), e)
            } else {
                Self::Postgres(e)
            };
        }
        // The driver gives a connect timeout (`connect_timeout`) as the
        // I/O error `TimedOut` behind its "error connecting to server".
        let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        if e.is_closed() || io {
            Self::unavailable_because(format!("postgres connection: {}", describe_postgres(&e)), e)
        } else {
            Self::Postgres(e)
        }
    }
}

/// The server's message when `e` is a refusal of the start-up parameter
/// `options`, which PostgreSQL itself never refuses as such but
/// connection poolers do: PgBouncer up to 1.19 answers `unsupported
/// startup parameter: options`, from 1.20 on `unsupported startup
/// parameter in options: <name>` or `unsupported options startup
/// parameter: ...` (SQLSTATE 08P01 `protocol_violation` in every case).
fn options_refusal(e: &tokio_postgres::Error) -> Option<String> {
    let db = e.as_db_error()?;
    let message = db.message();
    let lower = message.to_ascii_lowercase();
    let refused = lower.contains("unsupported startup parameter: options")
        || lower.contains("unsupported startup parameter in options")
        || lower.contains("unsupported options startup parameter");
    refused.then(|| message.to_owned())
}

/// What a migration refused a privilege adds to its message: Herald's
/// role must be able to create tables in the database's schema `public`,
/// which from PostgreSQL 15 on only the database's owner (and whom it
/// grants `CREATE` on the schema) can.
const PRIVILEGE_HINT: &str = "; Herald's role must own the database (CREATE DATABASE ... OWNER \
                              <role>) or have USAGE and CREATE on its schema public; see \
                              \"Setting up PostgreSQL\" in docs/operations.md";

/// A PostgreSQL error as one line of text with its cause: the server's
/// severity, message and SQLSTATE for a database error (the driver's own
/// text for one is only "db error"), the I/O error behind a failed
/// connection. Never contains the connection URL or password.
fn describe_postgres(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A connect timeout is told by the driver's I/O error, not by its
    /// text: transient, with the driver's error as the source.
    #[tokio::test]
    async fn a_connect_timeout_is_unavailable() {
        // A listener whose accept queue is full: the kernel drops further
        // connection requests, so a connect waits until it times out.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        while let Ok(connected) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            queued.push(connected.unwrap());
            assert!(queued.len() < 100, "the accept queue never filled");
        }

        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(addr.port())
            .user("herald")
            .connect_timeout(Duration::from_millis(100));
        let Err(driver) = config.connect(tokio_postgres::NoTls).await else {
            panic!("connected through a full accept queue");
        };
        let e = Error::from(driver);
        let Error::Unavailable {
            message,
            source: Some(source),
        } = &e
        else {
            panic!("expected Unavailable with a source, got {e:?}");
        };
        assert!(message.starts_with("postgres connection: "), "{message}");
        let io = source
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(std::error::Error::source)
            .and_then(|cause| cause.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::TimedOut),
            "{source:?}"
        );
        assert_eq!(e.to_string(), format!("storage unavailable: {message}"));
    }

    /// A locked SQLite database is transient; the message reads as before
    /// and the driver's error is the source.
    #[test]
    fn a_busy_sqlite_database_is_unavailable() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        let text = busy.to_string();
        let e = Error::from(busy);
        assert_eq!(
            e.to_string(),
            format!("storage unavailable: database is locked: {text}")
        );
        let source = std::error::Error::source(&e).expect("the driver's error");
        assert!(source.is::<rusqlite::Error>(), "{source:?}");
    }
}
