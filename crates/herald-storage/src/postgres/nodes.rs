//! Node reports on PostgreSQL (table `cluster_nodes`, migration V7, and the
//! nodes' channels, `cluster_channels`, migration V8). Expiry times are the
//! database's clock (`clock_timestamp()`).

use std::time::Duration;

use deadpool_postgres::Object;

use super::ops::to_ms;
use crate::decode::{sql_position, to_channel, to_u64, ttl_ms};
use crate::error::Result;
use crate::traits::{ChannelClients, NodeReport};

/// Deletes expired reports and their channels, then upserts `report` and
/// brings the node's channels to `channels`, in one transaction: rows of
/// channels not in `channels` are deleted, changed counts updated, and
/// unchanged rows are not written (no dead row versions for them).
pub(super) async fn report(
    client: &mut Object,
    report: &NodeReport,
    channels: &[ChannelClients],
    ttl: Duration,
) -> Result<()> {
    let tx = client.transaction().await?;
    // One statement: the reports it deletes are exactly those whose
    // channels it deletes.
    let expired = tx
        .prepare_cached(
            "WITH expired AS ( \
                 DELETE FROM cluster_nodes WHERE expires_at <= clock_timestamp() \
                 RETURNING node_id \
             ) \
             DELETE FROM cluster_channels WHERE node_id IN (SELECT node_id FROM expired)",
        )
        .await?;
    tx.execute(&expired, &[]).await?;
    let upsert = tx
        .prepare_cached(
            "INSERT INTO cluster_nodes (node_id, version, uptime_s, num_clients, num_users, \
                 num_subs, num_channels, expires_at, url, subscriptions, reported_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8 * interval '1 millisecond', \
                 $9, $10, clock_timestamp()) \
             ON CONFLICT (node_id) DO UPDATE SET version = excluded.version, \
                 uptime_s = excluded.uptime_s, num_clients = excluded.num_clients, \
                 num_users = excluded.num_users, num_subs = excluded.num_subs, \
                 num_channels = excluded.num_channels, expires_at = excluded.expires_at, \
                 url = excluded.url, subscriptions = excluded.subscriptions, \
                 reported_at = excluded.reported_at",
        )
        .await?;
    tx.execute(
        &upsert,
        &[
            &report.node_id,
            &report.version,
            &sql_position(report.uptime_s),
            &sql_position(report.clients),
            &sql_position(report.users),
            &sql_position(report.subs),
            &sql_position(report.channels),
            &(ttl_ms(ttl) as f64),
            &report.url,
            &sql_position(report.subscriptions),
        ],
    )
    .await?;
    let names: Vec<&str> = channels.iter().map(|c| c.channel.as_str()).collect();
    let counts: Vec<i64> = channels.iter().map(|c| sql_position(c.clients)).collect();
    let subscribers: Vec<i64> = channels
        .iter()
        .map(|c| sql_position(c.subscribers))
        .collect();
    let gone = tx
        .prepare_cached(
            "DELETE FROM cluster_channels WHERE node_id = $1 AND channel <> ALL($2::text[])",
        )
        .await?;
    tx.execute(&gone, &[&report.node_id, &names]).await?;
    let set = tx
        .prepare_cached(
            "INSERT INTO cluster_channels (node_id, channel, num_clients, num_subscribers) \
             SELECT $1, c, n, s FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(c, n, s) \
             ON CONFLICT (node_id, channel) DO UPDATE SET num_clients = excluded.num_clients, \
                 num_subscribers = excluded.num_subscribers \
             WHERE cluster_channels.num_clients <> excluded.num_clients \
                 OR cluster_channels.num_subscribers <> excluded.num_subscribers",
        )
        .await?;
    tx.execute(&set, &[&report.node_id, &names, &counts, &subscribers])
        .await?;
    tx.commit().await?;
    Ok(())
}

/// The unexpired reports, by node id.
pub(super) async fn list(client: &Object) -> Result<Vec<NodeReport>> {
    let stmt = client
        .prepare_cached(
            "SELECT node_id, version, uptime_s, num_clients, num_users, num_subs, num_channels, \
                 url, subscriptions, \
                 GREATEST(0, (extract(epoch FROM clock_timestamp() - reported_at) * 1000))::bigint, \
                 reported_at \
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
                url: row.try_get(7)?,
                subscriptions: to_u64(row.try_get(8)?, "subscriptions")?,
                reported_ms_ago: to_u64(row.try_get(9)?, "reported_at")?,
                reported_at_ms: to_ms(row.try_get(10)?),
            })
        })
        .collect()
}

/// The channels of the unexpired reports of every node but `except_node`,
/// with their clients summed, by channel name.
pub(super) async fn channels(client: &Object, except_node: &str) -> Result<Vec<ChannelClients>> {
    let stmt = client
        .prepare_cached(
            "SELECT c.channel, SUM(c.num_clients)::bigint, SUM(c.num_subscribers)::bigint \
             FROM cluster_channels c \
             JOIN cluster_nodes n ON n.node_id = c.node_id \
             WHERE n.expires_at > clock_timestamp() AND c.node_id <> $1 \
             GROUP BY c.channel ORDER BY c.channel COLLATE \"C\"",
        )
        .await?;
    client
        .query(&stmt, &[&except_node])
        .await?
        .into_iter()
        .map(|row| {
            Ok(ChannelClients {
                channel: to_channel(row.try_get(0)?)?,
                clients: to_u64(row.try_get(1)?, "num_clients")?,
                subscribers: to_u64(row.try_get(2)?, "num_subscribers")?,
            })
        })
        .collect()
}
