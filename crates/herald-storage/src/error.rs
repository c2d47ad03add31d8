use std::path::PathBuf;

use herald_core::FencingToken;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in storage.
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
    /// The storage could not be reached or did not answer in time (locked
    /// database, timeout, closed connection). The operation may be retried.
    /// A write that returns this committed nothing, except when the
    /// connection broke while its commit was in flight: then the outcome is
    /// unknown (retry with the same idempotency keys).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A schema migration failed at start-up.
    #[error("migration failed: {0}")]
    Migration(String),
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
    Sqlite(rusqlite::Error),
    /// PostgreSQL reported an error that is not one of the above (a
    /// constraint violation, a syntax error, an unexpected answer). Timeouts,
    /// lock waits that gave up and lost connections become
    /// [`Error::Unavailable`] instead; see the `From<tokio_postgres::Error>`
    /// conversion.
    #[error("postgres: {}", describe_postgres(.0))]
    Postgres(tokio_postgres::Error),
    /// Stored data could not be decoded (a bug or a damaged database).
    #[error("corrupt data: {0}")]
    Corrupt(String),
}

impl Error {
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
                Self::Unavailable(format!("database is locked: {e}"))
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
    // query_canceled: statement_timeout (and a lock wait cut short by it)
    // or a cancel request.
    "57014", // lock_not_available: lock_timeout, or NOWAIT.
    "55P03", // idle_in_transaction_session_timeout ended the session.
    "25P03",
    // admin_shutdown, crash_shutdown, cannot_connect_now (the server is
    // stopping, crashed or starting), idle_session_timeout.
    "57P01", "57P02", "57P03", "57P05", // too_many_connections.
    "53300",
    // deadlock_detected, serialization_failure: the transaction was rolled
    // back and may be retried.
    "40P01", "40001",
];

impl From<tokio_postgres::Error> for Error {
    /// Classifies a PostgreSQL error. [`Error::Unavailable`] for everything
    /// a retry may cure: a statement or lock timeout (SQLSTATE 57014
    /// `query_canceled`, 55P03 `lock_not_available`), a session ended by
    /// the server (25P03, 57P01, 57P02, 57P03, 57P05), too many connections
    /// (53300), a deadlock or serialization failure (40P01, 40001), any
    /// SQLSTATE of class 08 "connection exception", and errors that carry no
    /// SQLSTATE because the connection failed (closed, I/O error, connect
    /// timeout). See the PostgreSQL documentation, Appendix A "PostgreSQL
    /// Error Codes", and "Client Connection Defaults" for `statement_timeout`
    /// and `lock_timeout`. Every other error stays [`Error::Postgres`].
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(code) = e.code() {
            let code = code.code();
            return if code.starts_with("08") || RETRYABLE_SQLSTATES.contains(&code) {
                Self::Unavailable(format!("postgres: {}", describe_postgres(&e)))
            } else {
                Self::Postgres(e)
            };
        }
        let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        // A connect timeout carries no cause; its text is the only sign.
        if e.is_closed() || io || e.to_string().contains("timeout") {
            Self::Unavailable(format!("postgres connection: {}", describe_postgres(&e)))
        } else {
            Self::Postgres(e)
        }
    }
}

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
