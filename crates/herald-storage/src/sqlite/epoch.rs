//! Channel epochs on SQLite: the row of `channel_epochs` (migration V4)
//! of a channel that has one, else the epoch derived from the database's
//! seed (`epoch_seed`, migration V9; `crate::epoch`). Read on a reader
//! connection; nothing is written.

use herald_core::ChannelName;
use rusqlite::Connection;

use crate::error::Result;

/// The epoch of `channel`: its stored row's, else the derived one.
pub(super) fn read(conn: &mut Connection, channel: &ChannelName) -> Result<String> {
    let (stored, seed): (Option<String>, String) = conn
        .prepare_cached(
            "SELECT (SELECT epoch FROM channel_epochs WHERE name = ?1), seed \
             FROM epoch_seed WHERE id = 1",
        )?
        .query_row([channel.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(stored.unwrap_or_else(|| crate::epoch::derived(&seed, channel)))
}
