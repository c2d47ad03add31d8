//! `DELETE /v1/channels/{channel}`: removes a channel's messages and
//! idempotency keys and ends its live subscriptions on every node with a
//! final `deleted` event; the channel keeps its head, so offsets are never
//! reused. Only the holder deletes: a standby checks the caller and
//! forwards the request once to the holder (`forward.rs`), whose answer
//! it returns. Needs the `admin` permission (`auth`).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use herald_auth::Principal;
use herald_core::{ChannelName, Offset};
use serde::Serialize;

use super::state::ApiState;
use crate::api::publish::holder_response;
use herald_http::auth_extract::Caller;
use herald_http::error::Result;
use herald_http::extract::ChannelPath;
use herald_node::forward::CarriedHeaders;
use herald_node::holder_write::{on_holder, HolderRequest, Routed};
use herald_node::node_error::HolderWrite;
use herald_node::retention;

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
/// permission is checked before anything is removed or forwarded (401,
/// 403); a deletion a standby forwarded with the cluster secret was
/// checked there.
pub(crate) async fn delete_channel(
    State(state): State<ApiState>,
    Caller(who): Caller,
    ChannelPath(channel): ChannelPath,
    headers: HeaderMap,
) -> Result<Response> {
    if !matches!(who, Principal::Cluster) {
        state.shared.auth().may_admin(&who)?;
    }
    herald_http::audit::admin_action(&who, "delete_channel", Some(channel.as_str()), None);
    let shared = &state.shared;
    // After a takeover that ended the forward, this node deletes the
    // channel itself, as the client's retry would.
    let request = HolderRequest {
        write: HolderWrite::DeleteChannel(channel.clone()),
        headers: &headers,
        body: Bytes::new(),
        carry: CarriedHeaders::NONE,
        repeatable: true,
    };
    let routed = on_holder(&shared.node.publisher(), request, || {
        retention::delete_channel(
            shared.node.storage().as_ref(),
            shared.node.lease().as_ref(),
            shared.node.hub(),
            shared.settings.delete_batch,
            &channel,
        )
    })
    .await?;
    let head = match routed {
        Routed::Holder(answer) => return Ok(holder_response(answer)),
        Routed::Here(head) => head,
    };
    Ok(Json(Deleted {
        channel,
        head,
        earliest: head + 1,
    })
    .into_response())
}
