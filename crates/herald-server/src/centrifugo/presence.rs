//! Presence, in channels whose namespace has it (`channel_options.rs`:
//! the namespace's `presence`, else `CentrifugoConfig::presence`): each
//! subscription is a row of the storage's presence
//! (`Storage::presence_add`), written by the node that holds the
//! connection under its process's session id
//! and renewed by that node's heartbeat every third of `presence_ttl`, so
//! every node answers `presence` for the whole cluster, and the clients of
//! a node that died drop out within `presence_ttl`.
//!
//! The heartbeat renews every row of the session, so a row whose removal
//! failed (the storage down when its client unsubscribed or disconnected)
//! would be renewed for as long as the node runs: such a row is kept as a
//! pending removal, retried by each heartbeat before it renews the rest.

use std::collections::BTreeSet;
use std::sync::Arc;

use herald_core::ChannelName;
use herald_storage::PresenceEntry;
use serde_json::{json, Map, Value};

use super::channel_options::ChannelOptions;
use super::codes::ReplyError;
use super::context::CentrifugoState;

/// Whether `channel` has presence; when not, `presence` and
/// `presence_stats` answer 108 before permissions are checked, as
/// Centrifugo's do.
pub(crate) fn enabled(state: &CentrifugoState, channel: &ChannelName) -> bool {
    ChannelOptions::of(state, channel).presence
}

/// Records that `client` of `user` subscribed to `channel` (nothing when
/// the channel has no presence).
///
/// # Errors
/// 100 when the storage fails (logged).
pub(crate) async fn join(
    state: &CentrifugoState,
    client: &str,
    user: &str,
    channel: &ChannelName,
) -> Result<(), ReplyError> {
    if !enabled(state, channel) {
        return Ok(());
    }
    let shared = &state.shared;
    let config = state.config();
    let session = &state.centrifugo.registry.presence;
    session.ensure_heartbeat(
        Arc::clone(shared.node.storage()),
        config.presence_ttl,
        shared.shutdown.clone(),
    );
    let key = (channel.clone(), client.to_owned());
    // A row of an earlier subscription of this client to the channel
    // whose removal failed: this write replaces it, after any retried
    // removal of it in flight.
    let was_pending = session.pending().remove(&key);
    let _retrying = if was_pending {
        Some(session.retrying.lock().await)
    } else {
        None
    };
    let entry = PresenceEntry {
        channel: channel.clone(),
        client: client.to_owned(),
        user: user.to_owned(),
    };
    shared
        .node
        .storage()
        .presence_add(&session.id, &entry, config.presence_ttl)
        .await
        .map_err(|e| {
            herald_node::node_error::StorageFailure::new("presence_add", Some(channel), e).log();
            // The row may have been written all the same: the subscribe
            // fails, so the row must not be renewed.
            session.pending().insert(key);
            ReplyError::internal()
        })
}

/// Removes `client`'s rows of those of `channels` that have presence, in
/// the background, once its connection closed (a failure is logged and the
/// row becomes a pending removal, see [`super::presence_session::PresenceSession`]).
pub(crate) fn leave(state: &CentrifugoState, client: &str, mut channels: BTreeSet<ChannelName>) {
    channels.retain(|channel| enabled(state, channel));
    if channels.is_empty() {
        return;
    }
    let storage = Arc::clone(state.shared.node.storage());
    let session = Arc::clone(&state.centrifugo.registry.presence);
    let client = client.to_owned();
    tokio::spawn(async move {
        for channel in channels {
            session.remove(storage.as_ref(), &channel, &client).await;
        }
    });
}

/// Removes `client`'s row of `channel` now (a failure is logged and the
/// row becomes a pending removal, see [`super::presence_session::PresenceSession`]).
pub(crate) async fn remove(state: &CentrifugoState, client: &str, channel: &ChannelName) {
    if !enabled(state, channel) {
        return;
    }
    state
        .centrifugo
        .registry
        .presence
        .remove(state.shared.node.storage().as_ref(), channel, client)
        .await;
}

/// The entries of `channel`, or 108 when it has no presence.
///
/// # Errors
/// 108 when the channel has no presence; 100 when the storage fails.
pub(crate) async fn entries(
    state: &CentrifugoState,
    channel: &ChannelName,
) -> Result<Vec<PresenceEntry>, ReplyError> {
    if !enabled(state, channel) {
        return Err(ReplyError::not_available());
    }
    state
        .shared
        .node
        .storage()
        .presence(channel)
        .await
        .map_err(|e| {
            herald_node::node_error::StorageFailure::new("presence", Some(channel), e).log();
            ReplyError::internal()
        })
}

/// `presence`'s result: `{"presence": {"<client>": {"client", "user"}}}`.
///
/// # Errors
/// 108 when the channel has no presence; 100 when the storage fails.
pub(crate) async fn presence(
    state: &CentrifugoState,
    channel: &ChannelName,
) -> Result<Value, ReplyError> {
    let map: Map<String, Value> = entries(state, channel)
        .await?
        .into_iter()
        .map(|e| {
            (
                e.client.clone(),
                json!({ "client": e.client, "user": e.user }),
            )
        })
        .collect();
    Ok(json!({ "presence": map }))
}

/// `presence_stats`'s result: `{"num_clients", "num_users"}`.
///
/// # Errors
/// As [`presence`].
pub(crate) async fn stats(
    state: &CentrifugoState,
    channel: &ChannelName,
) -> Result<Value, ReplyError> {
    let entries = entries(state, channel).await?;
    let users: BTreeSet<&str> = entries.iter().map(|e| e.user.as_str()).collect();
    Ok(json!({ "num_clients": entries.len(), "num_users": users.len() }))
}
