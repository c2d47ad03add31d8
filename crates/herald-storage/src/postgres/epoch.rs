//! Channel epochs on PostgreSQL: the row of `channel_epochs` (migration
//! V4) of a channel that has one, else the epoch derived from the
//! database's seed (`epoch_seed`, migration V9; `crate::epoch`). One
//! read; nothing is written.

use deadpool_postgres::Object;
use herald_core::ChannelName;

use crate::error::Result;

/// The epoch of `channel`: its stored row's, else the derived one.
pub(super) async fn read(client: &Object, channel: &ChannelName) -> Result<String> {
    let select = client
        .prepare_cached(
            "SELECT (SELECT epoch FROM channel_epochs WHERE name = $1), seed \
             FROM epoch_seed WHERE id = 1",
        )
        .await?;
    let row = client.query_one(&select, &[&channel.as_str()]).await?;
    let stored: Option<String> = row.try_get(0)?;
    let seed: String = row.try_get(1)?;
    Ok(stored.unwrap_or_else(|| crate::epoch::derived(&seed, channel)))
}
