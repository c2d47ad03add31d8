//! `POST /v1/channels/{channel}/messages`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::{format_rfc3339_ms, Appended, ChannelName, NewMessage};
use serde::Serialize;

use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::extract::{idempotency_key, ChannelPath, PublishBody};
use crate::forward::{after_takeover_error, Forwarded};
use crate::metrics;
use crate::node_error::HolderWrite;
use crate::node_error::{NodeError, NodeResult};
use crate::state::AppState;

/// The answer to a publish: 201 when appended, 200 for a repeated
/// idempotency key (with the original offset and time).
#[derive(Debug, Serialize)]
struct Published<'a> {
    channel: &'a ChannelName,
    offset: u64,
    published_at: String,
}

/// How a publish ended when it did not fail. The holder's own outcomes
/// (`Created`, `Duplicate`) are also those of a standby that took the lease
/// over while it forwarded the publish ([`after_takeover`]).
enum Outcome {
    /// This node (the holder) committed it: `201`.
    Created(Appended),
    /// This node (the holder) found its idempotency key already used on the
    /// channel, and stored nothing: `200` with the original offset and
    /// time.
    Duplicate(Appended),
    /// This node (a standby) handed it to the holder; the holder's answer,
    /// returned unchanged.
    Forwarded(Response),
}

impl Outcome {
    /// The `result` label of `herald_publish_*`.
    fn label(&self) -> &'static str {
        match self {
            Self::Created(_) => "created",
            Self::Duplicate(_) => "duplicate",
            Self::Forwarded(_) => "forwarded",
        }
    }
}

impl IntoResponse for Outcome {
    fn into_response(self) -> Response {
        let (status, appended) = match self {
            Self::Created(appended) => (StatusCode::CREATED, appended),
            Self::Duplicate(appended) => (StatusCode::OK, appended),
            Self::Forwarded(response) => return response,
        };
        let body = Published {
            channel: &appended.channel,
            offset: appended.offset,
            published_at: format_rfc3339_ms(appended.published_at_ms),
        };
        (status, Json(body)).into_response()
    }
}

/// Appends one message; answers only after it is committed. The caller's
/// credentials are checked first (401), then its right to publish to the
/// channel (403) and its publish rate (429). On a standby the publish is
/// then forwarded once to the holder (`forward.rs`); if this node takes
/// the lease over before the holder answered, see [`after_takeover`].
///
/// The body is read only once the credentials, path and headers are
/// valid, so that a client that waits for `100 Continue`
/// (`Expect: 100-continue`) gets a `4xx` decided by them at once and never
/// sends the body.
pub(crate) async fn publish(
    State(state): State<AppState>,
    caller: Result<Caller>,
    channel: Result<ChannelPath>,
    req: Request,
) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let outcome = append(&state, caller, channel, &parts.headers, body).await;
    let (result, response) = match outcome {
        Ok(outcome) => (outcome.label(), outcome.into_response()),
        Err(e) => (e.code(), e.into_response()),
    };
    metrics::publish_finished(result, started.elapsed().as_secs_f64());
    response
}

async fn append(
    state: &AppState,
    caller: Result<Caller>,
    channel: Result<ChannelPath>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Outcome> {
    let Caller(who) = caller?;
    let ChannelPath(channel) = channel?;
    let shared = &state.shared;
    shared.auth().may_publish(&who, &channel)?;
    let idempotency_key = idempotency_key(headers)?;
    let PublishBody { data, tags, raw } =
        PublishBody::read(headers, body, state.config().max_message_bytes).await?;
    if state.draining() {
        return Err(Error::Draining);
    }
    shared.auth().take_publishes(&who, 1)?;
    let message = NewMessage {
        channel,
        data,
        idempotency_key,
        tags,
    };
    if shared.lease.is_holder() {
        return Ok(commit(state, message).await?);
    }
    let write = HolderWrite::Publish(message.channel.clone());
    let forwarded = shared
        .forwarder
        .to_holder(shared.lease.as_ref(), headers, write, raw)
        .await?;
    match forwarded {
        Forwarded::Answer(response) => Ok(Outcome::Forwarded(response)),
        Forwarded::TakenOver => after_takeover(state, message).await,
    }
}

/// A publish whose forward ended because this node took the lease over
/// before the holder answered. The old holder may have committed it just
/// before it lost the lease, and can commit nothing after that.
///
/// With an `Idempotency-Key`, this node, holder now, commits it itself:
/// its fenced write runs after the old holder's last commit (a takeover
/// waits for the write transactions in flight, and a later one fails its
/// fencing check), and finds the key there if the old holder stored it,
/// so the client gets `200` with the original offset, or `201` for a
/// message stored once, here. Without a key a second copy could not be
/// told from the first: `no_holder` (outcome unknown) at once, and the
/// client's retry reaches the new holder.
///
/// Every error that would say "nothing was stored" (`queue_full`,
/// `lease_lost`, `draining`, `not_holder`) is `no_holder` here: it speaks
/// for this node only, not for the old holder.
async fn after_takeover(state: &AppState, message: NewMessage) -> Result<Outcome> {
    if message.idempotency_key.is_none() || !state.shared.lease.is_holder() {
        return Err(Error::NoHolder);
    }
    commit(state, message)
        .await
        .map_err(|e| Error::from(after_takeover_error(e)))
}

/// Hands `message` to this node's writer and answers once it is committed
/// ([`Outcome::Created`]), or found by its idempotency key
/// ([`Outcome::Duplicate`]).
async fn commit(state: &AppState, message: NewMessage) -> NodeResult<Outcome> {
    let channel = message.channel.clone();
    let reply = state.shared.writer.submit(message)?;
    let appended = reply.await.map_err(|_| {
        // The writer dropped the request without answering: it is gone.
        if state.draining() {
            NodeError::Draining
        } else {
            tracing::error!(channel = %channel, "writer task ended without answering");
            NodeError::Internal("writer task ended".to_owned())
        }
    })??;
    Ok(if appended.duplicate {
        Outcome::Duplicate(appended)
    } else {
        Outcome::Created(appended)
    })
}
