//! Presence on SQLite (table `presence`, migration V5): written on the
//! writer connection (any process records its own clients), read on a
//! reader. Expiry times are SQLite's clock in ms.

use std::time::Duration;

use herald_core::ChannelName;
use rusqlite::{params, Connection};

use crate::decode::to_channel;
use crate::error::Result;
use crate::traits::PresenceEntry;

/// SQLite's clock in ms since the Unix epoch.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// Deletes the channel's expired entries, then upserts `entry`.
pub(super) fn add(
    conn: &mut Connection,
    session: &str,
    entry: &PresenceEntry,
    ttl: Duration,
) -> Result<()> {
    let tx = conn.transaction()?;
    tx.prepare_cached(&format!(
        "DELETE FROM presence WHERE channel = ?1 AND expires_at_ms <= {NOW_MS}"
    ))?
    .execute([entry.channel.as_str()])?;
    tx.prepare_cached(&format!(
        "INSERT INTO presence (channel, client, user, session, expires_at_ms) \
         VALUES (?1, ?2, ?3, ?4, {NOW_MS} + ?5) \
         ON CONFLICT (channel, client) DO UPDATE SET user = excluded.user, \
         session = excluded.session, expires_at_ms = excluded.expires_at_ms"
    ))?
    .execute(params![
        entry.channel.as_str(),
        entry.client,
        entry.user,
        session,
        ttl_ms(ttl)
    ])?;
    tx.commit()?;
    Ok(())
}

/// Removes one entry.
pub(super) fn remove(conn: &mut Connection, channel: &ChannelName, client: &str) -> Result<()> {
    conn.prepare_cached("DELETE FROM presence WHERE channel = ?1 AND client = ?2")?
        .execute(params![channel.as_str(), client])?;
    Ok(())
}

/// Renews a session's entries.
pub(super) fn touch(conn: &mut Connection, session: &str, ttl: Duration) -> Result<()> {
    conn.prepare_cached(&format!(
        "UPDATE presence SET expires_at_ms = {NOW_MS} + ?2 WHERE session = ?1"
    ))?
    .execute(params![session, ttl_ms(ttl)])?;
    Ok(())
}

/// The unexpired entries of a channel, by client.
pub(super) fn list(conn: &mut Connection, channel: &ChannelName) -> Result<Vec<PresenceEntry>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT channel, client, user FROM presence \
         WHERE channel = ?1 AND expires_at_ms > {NOW_MS} ORDER BY client"
    ))?;
    let mut rows = stmt.query([channel.as_str()])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(PresenceEntry {
            channel: to_channel(row.get(0)?)?,
            client: row.get(1)?,
            user: row.get(2)?,
        });
    }
    Ok(out)
}
