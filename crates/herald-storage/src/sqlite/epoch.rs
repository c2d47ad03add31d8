//! Channel epochs on SQLite (table `channel_epochs`, migration V4): read
//! on a reader connection; created, when absent, on the writer connection
//! with an insert-if-absent that any process may run.

use herald_core::ChannelName;
use rusqlite::{Connection, OptionalExtension};

use crate::Result;

/// The epoch of `channel` if it has one.
pub(super) fn find(conn: &mut Connection, channel: &ChannelName) -> Result<Option<String>> {
    Ok(conn
        .prepare_cached("SELECT epoch FROM channel_epochs WHERE name = ?1")?
        .query_row([channel.as_str()], |r| r.get(0))
        .optional()?)
}

/// Creates the epoch of `channel` (16 hex digits from 8 random bytes of
/// SQLite's `randomblob`) unless it has one, and returns the stored one.
pub(super) fn create(conn: &mut Connection, channel: &ChannelName) -> Result<String> {
    conn.prepare_cached(
        "INSERT INTO channel_epochs (name, epoch, created_at_ms) \
         VALUES (?1, lower(hex(randomblob(8))), CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
         ON CONFLICT (name) DO NOTHING",
    )?
    .execute([channel.as_str()])?;
    Ok(conn
        .prepare_cached("SELECT epoch FROM channel_epochs WHERE name = ?1")?
        .query_row([channel.as_str()], |r| r.get(0))?)
}
