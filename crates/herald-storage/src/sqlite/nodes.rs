//! Node reports on SQLite (table `cluster_nodes`, migration V7, and the
//! nodes' channels, `cluster_channels`, migration V8): written on the
//! writer connection (every process reports itself), read on a reader.
//! Expiry times are SQLite's clock in ms.

use std::time::Duration;

use rusqlite::{params, Connection, TransactionBehavior};

use crate::decode::{sql_position, to_channel, to_u64, ttl_ms};
use crate::error::Result;
use crate::traits::{ChannelClients, NodeReport};

/// SQLite's clock in ms since the Unix epoch.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Deletes expired reports and their channels, then upserts `report` and
/// replaces the node's channels with `channels`, in one transaction.
pub(super) fn report(
    conn: &mut Connection,
    report: &NodeReport,
    channels: &[ChannelClients],
    ttl: Duration,
) -> Result<()> {
    // `BEGIN IMMEDIATE`: the write lock first, so that the clock is read
    // with it held and the transaction never has to upgrade a read.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // One reading of the clock for both deletions, so that no report
    // expires between them and leaves its channels behind.
    let now: i64 = tx.query_row(&format!("SELECT {NOW_MS}"), [], |r| r.get(0))?;
    tx.prepare_cached(
        "DELETE FROM cluster_channels WHERE node_id IN \
         (SELECT node_id FROM cluster_nodes WHERE expires_at_ms <= ?1)",
    )?
    .execute([now])?;
    tx.prepare_cached("DELETE FROM cluster_nodes WHERE expires_at_ms <= ?1")?
        .execute([now])?;
    tx.prepare_cached(
        "INSERT INTO cluster_nodes (node_id, version, uptime_s, num_clients, num_users, \
         num_subs, num_channels, expires_at_ms, url, subscriptions, reported_at_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 + ?9, ?10, ?11, ?8) \
         ON CONFLICT (node_id) DO UPDATE SET version = excluded.version, \
         uptime_s = excluded.uptime_s, num_clients = excluded.num_clients, \
         num_users = excluded.num_users, num_subs = excluded.num_subs, \
         num_channels = excluded.num_channels, expires_at_ms = excluded.expires_at_ms, \
         url = excluded.url, subscriptions = excluded.subscriptions, \
         reported_at_ms = excluded.reported_at_ms",
    )?
    .execute(params![
        report.node_id,
        report.version,
        sql_position(report.uptime_s),
        sql_position(report.clients),
        sql_position(report.users),
        sql_position(report.subs),
        sql_position(report.channels),
        now,
        ttl_ms(ttl),
        report.url,
        sql_position(report.subscriptions)
    ])?;
    tx.prepare_cached("DELETE FROM cluster_channels WHERE node_id = ?1")?
        .execute([&report.node_id])?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO cluster_channels (node_id, channel, num_clients, num_subscribers) \
             VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (node_id, channel) DO UPDATE SET num_clients = excluded.num_clients, \
             num_subscribers = excluded.num_subscribers",
        )?;
        for c in channels {
            insert.execute(params![
                report.node_id,
                c.channel.as_str(),
                sql_position(c.clients),
                sql_position(c.subscribers)
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The unexpired reports, by node id.
pub(super) fn list(conn: &mut Connection) -> Result<Vec<NodeReport>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT node_id, version, uptime_s, num_clients, num_users, num_subs, num_channels, \
         url, subscriptions, max(0, {NOW_MS} - reported_at_ms), reported_at_ms \
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
            url: row.get(7)?,
            subscriptions: to_u64(row.get(8)?, "subscriptions")?,
            reported_ms_ago: to_u64(row.get(9)?, "reported_at_ms")?,
            reported_at_ms: row.get(10)?,
        });
    }
    Ok(out)
}

/// The channels of the unexpired reports of every node but `except_node`,
/// with their clients summed, by channel name.
pub(super) fn channels(conn: &mut Connection, except_node: &str) -> Result<Vec<ChannelClients>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT c.channel, SUM(c.num_clients), SUM(c.num_subscribers) FROM cluster_channels c \
         JOIN cluster_nodes n ON n.node_id = c.node_id \
         WHERE n.expires_at_ms > {NOW_MS} AND c.node_id <> ?1 \
         GROUP BY c.channel ORDER BY c.channel"
    ))?;
    let mut rows = stmt.query([except_node])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(ChannelClients {
            channel: to_channel(row.get(0)?)?,
            clients: to_u64(row.get(1)?, "num_clients")?,
            subscribers: to_u64(row.get(2)?, "num_subscribers")?,
        });
    }
    Ok(out)
}
