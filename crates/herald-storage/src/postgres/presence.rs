//! Presence on PostgreSQL (table `presence`, migration V5). Expiry times
//! are the database's clock (`clock_timestamp()`).

use std::time::Duration;

use deadpool_postgres::Object;
use herald_core::ChannelName;

use crate::decode::to_channel;
use crate::error::Result;
use crate::traits::PresenceEntry;

fn ttl_ms(ttl: Duration) -> f64 {
    ttl.as_secs_f64() * 1000.0
}

/// Deletes the channel's expired entries, then upserts `entry`.
pub(super) async fn add(
    client: &Object,
    session: &str,
    entry: &PresenceEntry,
    ttl: Duration,
) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "WITH expired AS ( \
                 DELETE FROM presence WHERE channel = $1 AND expires_at <= clock_timestamp() \
             ) \
             INSERT INTO presence (channel, client, \"user\", session, expires_at) \
             VALUES ($1, $2, $3, $4, clock_timestamp() + $5 * interval '1 millisecond') \
             ON CONFLICT (channel, client) DO UPDATE SET \"user\" = excluded.\"user\", \
             session = excluded.session, expires_at = excluded.expires_at",
        )
        .await?;
    client
        .execute(
            &stmt,
            &[
                &entry.channel.as_str(),
                &entry.client,
                &entry.user,
                &session,
                &ttl_ms(ttl),
            ],
        )
        .await?;
    Ok(())
}

/// Removes one entry.
pub(super) async fn remove(client: &Object, channel: &ChannelName, id: &str) -> Result<()> {
    let stmt = client
        .prepare_cached("DELETE FROM presence WHERE channel = $1 AND client = $2")
        .await?;
    client.execute(&stmt, &[&channel.as_str(), &id]).await?;
    Ok(())
}

/// Renews a session's entries.
pub(super) async fn touch(client: &Object, session: &str, ttl: Duration) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "UPDATE presence SET expires_at = clock_timestamp() + $2 * interval '1 millisecond' \
             WHERE session = $1",
        )
        .await?;
    client.execute(&stmt, &[&session, &ttl_ms(ttl)]).await?;
    Ok(())
}

/// The unexpired entries of a channel, by client.
pub(super) async fn list(client: &Object, channel: &ChannelName) -> Result<Vec<PresenceEntry>> {
    let stmt = client
        .prepare_cached(
            "SELECT channel, client, \"user\" FROM presence \
             WHERE channel = $1 AND expires_at > clock_timestamp() ORDER BY client COLLATE \"C\"",
        )
        .await?;
    client
        .query(&stmt, &[&channel.as_str()])
        .await?
        .into_iter()
        .map(|row| {
            Ok(PresenceEntry {
                channel: to_channel(row.try_get(0)?)?,
                client: row.try_get(1)?,
                user: row.try_get(2)?,
            })
        })
        .collect()
}
