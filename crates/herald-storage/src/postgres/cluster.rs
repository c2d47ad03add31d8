//! Cluster events on PostgreSQL (see `crate::cluster`): sent with one
//! autocommitted `pg_notify` on [`CLUSTER_CHANNEL`], heard by every
//! node's listening connection (`listen.rs`), which passes on the events
//! of other storages and drops its own.

use deadpool_postgres::Object;
use tokio::sync::broadcast;

use super::names::CLUSTER_CHANNEL;
use crate::cluster::ClusterEvent;
use crate::cluster::{decode, encode};
use crate::error::Result;

/// Sends `event` from the storage whose session key is `origin`.
/// Autocommitted: delivered to the listeners once the statement ends
/// (PostgreSQL documentation, `NOTIFY`).
///
/// # Errors
/// [`crate::Error::ClusterEventTooLarge`] before anything is sent;
/// [`crate::Error::Unavailable`] when the database cannot be reached.
pub(super) async fn send(client: &Object, origin: i64, event: &ClusterEvent) -> Result<()> {
    let payload = encode(origin, event)?;
    let stmt = client.prepare_cached("SELECT pg_notify($1, $2)").await?;
    client.query(&stmt, &[&CLUSTER_CHANNEL, &payload]).await?;
    Ok(())
}

/// Passes on an event heard on [`CLUSTER_CHANNEL`] unless the storage whose
/// session key is `own` sent it; ignores (and logs) a payload it cannot
/// read, such as an event of a kind a newer node sends.
pub(super) fn hear(payload: &str, own: i64, events: &broadcast::Sender<ClusterEvent>) {
    match decode(payload) {
        Some((origin, _)) if origin == own => {}
        // No receiver is not an error.
        Some((_, event)) => drop(events.send(event)),
        None => tracing::debug!(payload = %payload, "cluster event not understood; ignored"),
    }
}
