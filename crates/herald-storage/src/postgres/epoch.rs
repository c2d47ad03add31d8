//! Channel epochs on PostgreSQL (table `channel_epochs`, migration V4):
//! read first; created, when absent, with an insert-if-absent that any
//! node may run, then read again (READ COMMITTED: the second statement
//! sees the row of a node that won the race).

use deadpool_postgres::Object;
use herald_core::ChannelName;

use crate::Result;

/// The epoch of `channel`, created unless it has one: the first 16 hex
/// digits (64 bits) of the MD5 of a random UUID (`gen_random_uuid`,
/// PostgreSQL 13 and later).
pub(super) async fn get_or_create(client: &Object, channel: &ChannelName) -> Result<String> {
    let select = client
        .prepare_cached("SELECT epoch FROM channel_epochs WHERE name = $1")
        .await?;
    if let Some(row) = client.query_opt(&select, &[&channel.as_str()]).await? {
        return Ok(row.try_get(0)?);
    }
    let insert = client
        .prepare_cached(
            "INSERT INTO channel_epochs (name, epoch, created_at) \
             VALUES ($1, substr(md5(gen_random_uuid()::text), 1, 16), clock_timestamp()) \
             ON CONFLICT (name) DO NOTHING",
        )
        .await?;
    client.execute(&insert, &[&channel.as_str()]).await?;
    let row = client.query_one(&select, &[&channel.as_str()]).await?;
    Ok(row.try_get(0)?)
}
