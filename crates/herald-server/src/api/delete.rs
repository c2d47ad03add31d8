//! `DELETE /v1/channels/{channel}`: removes a channel's messages and
//! idempotency keys and ends its live subscriptions on this node with a
//! final `deleted` event; the channel keeps its head, so offsets are never
//! reused. Only the holder deletes (a standby answers `503 not_holder`
//! with the holder's URL). Needs the `admin` permission (`auth`).

use axum::extract::State;
use axum::Json;
use herald_core::{ChannelName, Offset};
use serde::Serialize;

use crate::api::ChannelPath;
use crate::auth::Caller;
use crate::{retention, AppState, Result};

/// The answer of a deletion.
#[derive(Debug, Serialize)]
pub(crate) struct Deleted {
    channel: ChannelName,
    /// The head the channel keeps; its next message gets `head + 1`.
    head: Offset,
    /// `head + 1`: nothing is stored any more.
    earliest: Offset,
}

/// Deletes the channel (see the module docs). The caller's `admin`
/// permission is checked before anything is removed (401, 403).
pub(crate) async fn delete_channel(
    State(state): State<AppState>,
    Caller(who): Caller,
    ChannelPath(channel): ChannelPath,
) -> Result<Json<Deleted>> {
    state.shared.auth().may_admin(&who)?;
    let head = retention::delete_channel(&state, &channel).await?;
    Ok(Json(Deleted {
        channel,
        head,
        earliest: head + 1,
    }))
}
