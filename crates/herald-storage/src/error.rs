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
    /// SQLite reported an error that is not one of the above.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Stored data could not be decoded (a bug or a damaged database).
    #[error("corrupt data: {0}")]
    Corrupt(String),
}
