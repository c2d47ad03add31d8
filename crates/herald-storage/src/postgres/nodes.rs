//! Node reports on PostgreSQL (table `cluster_nodes`, migration V7). Expiry
//! times are the database's clock (`clock_timestamp()`).

use std::time::Duration;

use deadpool_postgres::Object;

use crate::decode::{sql_position, to_u64, ttl_ms};
use crate::{NodeReport, Result};

/// Deletes expired reports, then upserts `report`.
pub(super) async fn report(client: &Object, report: &NodeReport, ttl: Duration) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "WITH expired AS ( \
                 DELETE FROM cluster_nodes WHERE expires_at <= clock_timestamp() \
             ) \
             INSERT INTO cluster_nodes (node_id, version, uptime_s, num_clients, num_users, \
                 num_subs, num_channels, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8 * interval '1 millisecond') \
             ON CONFLICT (node_id) DO UPDATE SET version = excluded.version, \
                 uptime_s = excluded.uptime_s, num_clients = excluded.num_clients, \
                 num_users = excluded.num_users, num_subs = excluded.num_subs, \
                 num_channels = excluded.num_channels, expires_at = excluded.expires_at",
        )
        .await?;
    client
        .execute(
            &stmt,
            &[
                &report.node_id,
                &report.version,
                &sql_position(report.uptime_s),
                &sql_position(report.clients),
                &sql_position(report.users),
                &sql_position(report.subs),
                &sql_position(report.channels),
                &(ttl_ms(ttl) as f64),
            ],
        )
        .await?;
    Ok(())
}

/// The unexpired reports, by node id.
pub(super) async fn list(client: &Object) -> Result<Vec<NodeReport>> {
    let stmt = client
        .prepare_cached(
            "SELECT node_id, version, uptime_s, num_clients, num_users, num_subs, num_channels \
             FROM cluster_nodes WHERE expires_at > clock_timestamp() \
             ORDER BY node_id COLLATE \"C\"",
        )
        .await?;
    client
        .query(&stmt, &[])
        .await?
        .into_iter()
        .map(|row| {
            Ok(NodeReport {
                node_id: row.try_get(0)?,
                version: row.try_get(1)?,
                uptime_s: to_u64(row.try_get(2)?, "uptime_s")?,
                clients: to_u64(row.try_get(3)?, "num_clients")?,
                users: to_u64(row.try_get(4)?, "num_users")?,
                subs: to_u64(row.try_get(5)?, "num_subs")?,
                channels: to_u64(row.try_get(6)?, "num_channels")?,
            })
        })
        .collect()
}
