//! `DELETE /v1/channels/{channel}`: removes a channel's messages and
//! idempotency keys and ends its live subscriptions on this node with a
//! final `deleted` event; the channel keeps its head, so offsets are never
//! reused. Only the holder deletes (a standby answers `503 not_holder`
//! with the holder's URL).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use herald_core::{ChannelName, Offset};
use serde::Serialize;

use crate::api::ChannelPath;
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

/// Deletes the channel (see the module docs).
pub(crate) async fn delete_channel(
    State(state): State<AppState>,
    ChannelPath(channel): ChannelPath,
    headers: HeaderMap,
) -> Result<Json<Deleted>> {
    authorize_admin(&state, &headers)?;
    let head = retention::delete_channel(&state, &channel).await?;
    Ok(Json(Deleted {
        channel,
        head,
        earliest: head + 1,
    }))
}

/// The one place where a deletion's permission is checked, before anything
/// is removed: access control adds its `admin` permission check here.
/// Until then every client may delete.
fn authorize_admin(state: &AppState, headers: &HeaderMap) -> Result<()> {
    let _ = (state, headers);
    Ok(())
}
