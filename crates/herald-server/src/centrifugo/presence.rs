//! Presence, in channels whose namespace has it (`channel_options.rs`:
//! the namespace's `presence`, else `CentrifugoConfig::presence`): each
//! subscription is a row of the storage's presence
//! (`Storage::presence_add`), written by the node that holds the
//! connection under its process's session id
//! and renewed by that node's heartbeat every third of `presence_ttl`, so
//! every node answers `presence` for the whole cluster, and the clients of
//! a node that died drop out within `presence_ttl`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use herald_core::ChannelName;
use herald_storage::{PresenceEntry, Storage};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::channel_options::ChannelOptions;
use super::codes::ReplyError;
use crate::AppState;

/// This node process's presence session: its id and whether its heartbeat
/// runs.
#[derive(Debug)]
pub(crate) struct PresenceSession {
    /// Random per process, so that a restarted node never renews the rows
    /// of its previous run.
    id: String,
    heartbeat: AtomicBool,
}

impl Default for PresenceSession {
    fn default() -> Self {
        let bits: u128 = rand::random();
        Self {
            id: format!("{bits:032x}"),
            heartbeat: AtomicBool::new(false),
        }
    }
}

impl PresenceSession {
    /// Starts the heartbeat once: every third of the ttl, renew this
    /// session's rows, until the node drains.
    fn ensure_heartbeat(
        &self,
        storage: Arc<dyn Storage>,
        ttl: std::time::Duration,
        shutdown: CancellationToken,
    ) {
        if self.heartbeat.swap(true, Ordering::SeqCst) {
            return;
        }
        let id = self.id.clone();
        tokio::spawn(async move {
            let mut beats = tokio::time::interval(ttl / 3);
            beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = beats.tick() => {
                        if let Err(e) = storage.presence_touch(&id, ttl).await {
                            crate::StorageFailure::new("presence_touch", None, e).log();
                        }
                    }
                }
            }
        });
    }
}

/// Whether `channel` has presence; when not, `presence` and
/// `presence_stats` answer 108 before permissions are checked, as
/// Centrifugo's do.
pub(crate) fn enabled(state: &AppState, channel: &ChannelName) -> bool {
    ChannelOptions::of(state, channel).presence
}

/// Records that `client` of `user` subscribed to `channel` (nothing when
/// the channel has no presence).
///
/// # Errors
/// 100 when the storage fails (logged).
pub(crate) async fn join(
    state: &AppState,
    client: &str,
    user: &str,
    channel: &ChannelName,
) -> Result<(), ReplyError> {
    if !enabled(state, channel) {
        return Ok(());
    }
    let shared = &state.shared;
    let config = &shared.config.centrifugo;
    let session = &shared.centrifugo.presence;
    session.ensure_heartbeat(
        Arc::clone(&shared.storage),
        config.presence_ttl,
        shared.shutdown.clone(),
    );
    let entry = PresenceEntry {
        channel: channel.clone(),
        client: client.to_owned(),
        user: user.to_owned(),
    };
    shared
        .storage
        .presence_add(&session.id, &entry, config.presence_ttl)
        .await
        .map_err(|e| {
            crate::StorageFailure::new("presence_add", Some(channel), e).log();
            ReplyError::internal()
        })
}

/// Removes `client`'s rows of those of `channels` that have presence, in
/// the background (a failure is logged; the rows then expire).
pub(crate) fn leave(state: &AppState, client: &str, mut channels: BTreeSet<ChannelName>) {
    channels.retain(|channel| enabled(state, channel));
    if channels.is_empty() {
        return;
    }
    let storage = Arc::clone(&state.shared.storage);
    let client = client.to_owned();
    tokio::spawn(async move {
        for channel in channels {
            if let Err(e) = storage.presence_remove(&channel, &client).await {
                crate::StorageFailure::new("presence_remove", Some(&channel), e).log();
            }
        }
    });
}

/// Removes `client`'s row of `channel` now (a failure is logged; the row
/// then expires).
pub(crate) async fn remove(state: &AppState, client: &str, channel: &ChannelName) {
    if !enabled(state, channel) {
        return;
    }
    if let Err(e) = state.shared.storage.presence_remove(channel, client).await {
        crate::StorageFailure::new("presence_remove", Some(channel), e).log();
    }
}

/// The entries of `channel`, or 108 when it has no presence.
async fn entries(
    state: &AppState,
    channel: &ChannelName,
) -> Result<Vec<PresenceEntry>, ReplyError> {
    if !enabled(state, channel) {
        return Err(ReplyError::not_available());
    }
    state.shared.storage.presence(channel).await.map_err(|e| {
        crate::StorageFailure::new("presence", Some(channel), e).log();
        ReplyError::internal()
    })
}

/// `presence`'s result: `{"presence": {"<client>": {"client", "user"}}}`.
///
/// # Errors
/// 108 when the channel has no presence; 100 when the storage fails.
pub(crate) async fn presence(state: &AppState, channel: &ChannelName) -> Result<Value, ReplyError> {
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
pub(crate) async fn stats(state: &AppState, channel: &ChannelName) -> Result<Value, ReplyError> {
    let entries = entries(state, channel).await?;
    let users: BTreeSet<&str> = entries.iter().map(|e| e.user.as_str()).collect();
    Ok(json!({ "num_clients": entries.len(), "num_users": users.len() }))
}
