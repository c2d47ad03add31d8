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
    /// database, timeout, closed connection). The operation may be retried;
    /// a write that returns this committed nothing.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A schema migration failed at start-up.
    #[error("migration failed: {0}")]
    Migration(String),
    /// A file-system operation on the data directory failed.
    #[error("data directory: {0}")]
    Io(#[from] std::io::Error),
    /// SQLite reported an error that is not one of the above. (SQLite's
    /// `SQLITE_BUSY` and `SQLITE_LOCKED` become [`Error::Unavailable`]
    /// instead; see the `From<rusqlite::Error>` conversion.)
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
    /// Stored data could not be decoded (a bug or a damaged database).
    #[error("corrupt data: {0}")]
    Corrupt(String),
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
