//! The server API's `history_remove`: Centrifugo removes a channel's
//! history and keeps its stream position (offset and epoch), so that
//! subscribers are not disconnected for it (Centrifugo's documentation,
//! "Server API walkthrough"). Herald removes every stored message up to the
//! head in fenced trims (`retention::remove_history`, the removal retention
//! makes): the channel's earliest offset becomes `head + 1`, its head and
//! epoch stay. A recovery from a removed offset then answers
//! `recovered: false`, and a live subscriber that had not got every removed
//! message yet is closed with 3010, as after a retention trim.
//!
//! Only the holder removes; a standby forwards the call once to the
//! holder's `POST /api/history_remove` with the cluster secret (as it
//! forwards a publish, `forward.rs`) and returns its answer.

use axum::http::{HeaderMap, StatusCode};
use herald_auth::Principal;
use herald_core::ChannelName;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::codes::ReplyError;
use super::context::CentrifugoState;
use herald_node::forward::{CarriedHeaders, HolderAnswer};
use herald_node::holder_write::{on_holder, HolderRequest, Routed};
use herald_node::node_error::NodeError;
use herald_node::retention;

/// Largest holder answer read back from a forwarded call, in bytes.
const MAX_FORWARD_ANSWER_BYTES: usize = 64 * 1024;

/// `history_remove` of `channel` for `who` (an API key with `admin`, or
/// the cluster, for a call a standby forwarded): returns once every message
/// up to the head is removed (the caller answers `{}`).
///
/// # Errors
/// 103 without `admin`; 100 (temporary) when this node is not holder and
/// the holder cannot be reached, or the storage or the lease failed.
pub(crate) async fn history_remove(
    state: &CentrifugoState,
    who: &Principal,
    headers: &HeaderMap,
    channel: ChannelName,
) -> Result<(), ReplyError> {
    let forwarded_by_a_node = matches!(who, Principal::Cluster);
    if !forwarded_by_a_node && state.shared.auth().may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    if !forwarded_by_a_node {
        herald_http::audit::admin_action(who, "history_remove", Some(channel.as_str()), None);
    }
    let shared = &state.shared;
    let body = serde_json::json!({ "channel": channel.as_str() }).to_string();
    // After a takeover that ended the forward, this node removes the
    // history itself (removing it twice removes nothing more).
    let request = HolderRequest {
        write: herald_node::node_error::HolderWrite::RemoveHistory(channel.clone()),
        headers,
        body: body.into(),
        carry: CarriedHeaders::NONE,
        repeatable: true,
    };
    let removed = on_holder(&shared.node.publisher(), request, || {
        retention::remove_history(
            shared.node.storage().as_ref(),
            shared.node.lease().as_ref(),
            shared.settings.delete_batch,
            &channel,
        )
    })
    .await;
    match removed {
        Ok(Routed::Holder(answer)) => holder_answer(&answer),
        Ok(Routed::Here(head)) => {
            tracing::info!(channel = %channel, head, "history removed");
            Ok(())
        }
        Err(e) => Err(logged(&e)),
    }
}

/// Logs `e` where it ends, and maps it.
fn logged(e: &NodeError) -> ReplyError {
    e.log();
    ReplyError::from_node_error(e)
}

/// The outcome of the holder's answer to a forwarded call (`{"result":
/// ...}` or `{"error": {...}}` with HTTP 200), or the Centrifugo error for
/// its HTTP status.
fn holder_answer(answer: &HolderAnswer) -> Result<(), ReplyError> {
    #[derive(Deserialize)]
    struct Answer {
        #[serde(default)]
        result: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<ReplyError>,
    }
    let status = answer.status();
    if status != StatusCode::OK {
        return Err(match status {
            // The holder refused the cluster secret: it differs between
            // the nodes.
            StatusCode::UNAUTHORIZED => ReplyError::unauthorized(),
            _ => ReplyError::internal(),
        });
    }
    let body = answer.body();
    if body.len() > MAX_FORWARD_ANSWER_BYTES {
        return Err(ReplyError::internal());
    }
    match serde_json::from_slice::<Answer>(body) {
        Ok(Answer {
            error: Some(error), ..
        }) => Err(error),
        Ok(Answer {
            result: Some(_), ..
        }) => Ok(()),
        _ => Err(ReplyError::internal()),
    }
}
