//! Node reports on SQLite (table `cluster_nodes`, migration V7): written on
//! the writer connection (every process reports itself), read on a
//! reader. Expiry times are SQLite's clock in ms.

use std::time::Duration;

use rusqlite::{params, Connection};

use crate::decode::{sql_position, to_u64, ttl_ms};
use crate::{NodeReport, Result};

/// SQLite's clock in ms since the Unix epoch.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Deletes expired reports, then upserts `report`.
pub(super) fn report(conn: &mut Connection, report: &NodeReport, ttl: Duration) -> Result<()> {
    let tx = conn.transaction()?;
    tx.prepare_cached(&format!(
        "DELETE FROM cluster_nodes WHERE expires_at_ms <= {NOW_MS}"
    ))?
    .execute([])?;
    tx.prepare_cached(&format!(
        "INSERT INTO cluster_nodes (node_id, version, uptime_s, num_clients, num_users, \
         num_subs, num_channels, expires_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW_MS} + ?8) \
         ON CONFLICT (node_id) DO UPDATE SET version = excluded.version, \
         uptime_s = excluded.uptime_s, num_clients = excluded.num_clients, \
         num_users = excluded.num_users, num_subs = excluded.num_subs, \
         num_channels = excluded.num_channels, expires_at_ms = excluded.expires_at_ms"
    ))?
    .execute(params![
        report.node_id,
        report.version,
        sql_position(report.uptime_s),
        sql_position(report.clients),
        sql_position(report.users),
        sql_position(report.subs),
        sql_position(report.channels),
        ttl_ms(ttl)
    ])?;
    tx.commit()?;
    Ok(())
}

/// The unexpired reports, by node id.
pub(super) fn list(conn: &mut Connection) -> Result<Vec<NodeReport>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT node_id, version, uptime_s, num_clients, num_users, num_subs, num_channels \
         FROM cluster_nodes WHERE expires_at_ms > {NOW_MS} ORDER BY node_id"
    ))?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(NodeReport {
            node_id: row.get(0)?,
            version: row.get(1)?,
            uptime_s: to_u64(row.get(2)?, "uptime_s")?,
            clients: to_u64(row.get(3)?, "num_clients")?,
            users: to_u64(row.get(4)?, "num_users")?,
            subs: to_u64(row.get(5)?, "num_subs")?,
            channels: to_u64(row.get(6)?, "num_channels")?,
        });
    }
    Ok(out)
}
