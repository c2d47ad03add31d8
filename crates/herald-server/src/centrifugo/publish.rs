//! One publish from a Centrifugo client or the server API, into the same
//! channel sequence as `POST /v1/channels/{channel}/messages`, through the
//! node's publish routine (`publish.rs`): on the holder this node's writer
//! commits it, on a standby it is forwarded once to the holder (the
//! caller's rights were checked here). This module maps the routine's
//! outcome to Centrifugo's answer.

use std::sync::Arc;

use herald_core::{ChannelName, IdempotencyKey, NewMessage, Offset, Tags};
use serde_json::value::RawValue;

use super::codes::ReplyError;
use super::context::CentrifugoState;
use herald_node::forward::HolderRefusal;
use herald_node::node_error::NodeError;
use herald_node::publish::{self, Published, Received};

/// Publishes `data` with `tags` to `channel` and returns its offset once
/// committed (the original offset for a repeated `idempotency_key`).
/// Rights and rate limits are the caller's to check first.
///
/// # Errors
/// The Centrifugo error for what went wrong: 106 when `data` and `tags`
/// together ([`Tags::byte_len`]) are larger than `max_message_bytes`, 100
/// (temporary) when the storage, the writer or the holder failed, 111 when
/// the holder's rate limit refused it.
pub(crate) async fn publish(
    state: &CentrifugoState,
    channel: ChannelName,
    data: Arc<RawValue>,
    tags: Tags,
    idempotency_key: Option<IdempotencyKey>,
) -> Result<Offset, ReplyError> {
    let shared = &state.shared;
    if data.get().len() + tags.byte_len() > shared.settings.max_message_bytes {
        return Err(ReplyError::limit_exceeded());
    }
    if state.draining() {
        return Err(ReplyError::internal());
    }
    let message = NewMessage {
        channel,
        data: herald_core::Payload::Json(data),
        idempotency_key,
        tags,
    };
    match publish::publish(&shared.publisher(), message, Received::Message).await {
        Ok(Published::Created(appended) | Published::Duplicate(appended)) => Ok(appended.offset),
        Ok(Published::Forwarded(answer)) => answer.published().map_err(refused),
        Err(e) => Err(logged(&e)),
    }
}

/// Logs `e` where it ends, and maps it.
fn logged(e: &NodeError) -> ReplyError {
    e.log();
    ReplyError::from_node_error(e)
}

/// The Centrifugo error for the holder's refusal of a forwarded publish.
fn refused(refusal: HolderRefusal) -> ReplyError {
    match refusal {
        HolderRefusal::Unauthorized => ReplyError::unauthorized(),
        HolderRefusal::Forbidden => ReplyError::permission_denied(),
        HolderRefusal::RateLimited => ReplyError::too_many_requests(),
        HolderRefusal::TooLarge => ReplyError::limit_exceeded(),
        HolderRefusal::Invalid => ReplyError::bad_request(),
        HolderRefusal::Failed => ReplyError::internal(),
    }
}
