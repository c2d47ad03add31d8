//! One publish from a Centrifugo client or the server API, into the same
//! channel sequence as `POST /v1/channels/{channel}/messages`: on the
//! holder through this node's writer, on a standby forwarded once to the
//! holder as a Herald publish (`forward.rs`'s `Forwarder::to_holder`,
//! with the cluster secret; the caller's rights were checked here).

use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use herald_core::{ChannelName, IdempotencyKey, NewMessage, Offset, Tags};
use serde_json::value::RawValue;

use super::codes::ReplyError;
use crate::error::Error;
use crate::forward::{after_takeover_error, Forwarded};
use crate::node_error::{NodeError, NodeResult};
use crate::state::AppState;

/// Largest holder answer read back from a forwarded publish, in bytes.
const MAX_FORWARD_ANSWER_BYTES: usize = 64 * 1024;

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
    state: &AppState,
    channel: ChannelName,
    data: Arc<RawValue>,
    tags: Tags,
    idempotency_key: Option<IdempotencyKey>,
) -> Result<Offset, ReplyError> {
    let shared = &state.shared;
    if data.get().len() + tags.byte_len() > shared.config.max_message_bytes {
        return Err(ReplyError::limit_exceeded());
    }
    if state.draining() {
        return Err(ReplyError::internal());
    }
    let message = NewMessage {
        channel,
        data,
        idempotency_key,
        tags,
    };
    if shared.lease.is_holder() {
        return commit(state, message)
            .await
            .map_err(|e| logged(&Error::from(e)));
    }
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(key) = &message.idempotency_key {
        if let Ok(value) = HeaderValue::from_str(key.as_str()) {
            headers.insert(HeaderName::from_static("idempotency-key"), value);
        }
    }
    let body = match message.tags.to_json() {
        None => format!("{{\"data\":{}}}", message.data.get()),
        Some(tags) => format!("{{\"data\":{},\"tags\":{tags}}}", message.data.get()),
    };
    let write = crate::node_error::HolderWrite::Publish(message.channel.clone());
    let forwarded = shared
        .forwarder
        .to_holder(shared.lease.as_ref(), &headers, write, body.into())
        .await;
    match forwarded {
        Ok(Forwarded::Answer(response)) => holder_answer(response).await,
        Ok(Forwarded::TakenOver) => {
            if message.idempotency_key.is_none() || !shared.lease.is_holder() {
                return Err(ReplyError::internal());
            }
            commit(state, message)
                .await
                .map_err(|e| logged(&Error::from(after_takeover_error(e))))
        }
        Err(e) => Err(logged(&Error::from(e))),
    }
}

/// Logs `e` where it ends, and maps it.
fn logged(e: &Error) -> ReplyError {
    e.log();
    ReplyError::from_error(e)
}

/// Hands `message` to this node's writer and waits for the commit.
async fn commit(state: &AppState, message: NewMessage) -> NodeResult<Offset> {
    let reply = state.shared.writer.submit(message)?;
    let appended = reply.await.map_err(|_| NodeError::Draining)??;
    Ok(appended.offset)
}

/// The offset from the holder's answer to a forwarded publish
/// (`{"channel","offset","published_at"}` with 201 or 200), or the
/// Centrifugo error for its error status.
async fn holder_answer(response: axum::response::Response) -> Result<Offset, ReplyError> {
    #[derive(serde::Deserialize)]
    struct Published {
        offset: Offset,
    }
    let status = response.status();
    if !status.is_success() {
        return Err(match status {
            StatusCode::UNAUTHORIZED => ReplyError::unauthorized(),
            StatusCode::FORBIDDEN => ReplyError::permission_denied(),
            StatusCode::TOO_MANY_REQUESTS => ReplyError::too_many_requests(),
            StatusCode::PAYLOAD_TOO_LARGE => ReplyError::limit_exceeded(),
            s if s.is_client_error() => ReplyError::bad_request(),
            _ => ReplyError::internal(),
        });
    }
    let body = axum::body::to_bytes(response.into_body(), MAX_FORWARD_ANSWER_BYTES)
        .await
        .map_err(|_| ReplyError::internal())?;
    serde_json::from_slice::<Published>(&body)
        .map(|p| p.offset)
        .map_err(|_| ReplyError::internal())
}
