//! `POST /v1/channels/{channel}/messages`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::{format_rfc3339_ms, ChannelName, NewMessage};
use serde::Serialize;

use super::state::ApiState;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};
use herald_http::extract::{idempotency_key, ChannelPath, PublishBody};
use herald_node::forward::HolderAnswer;
use herald_node::metrics;
use herald_node::publish::{self, Published, Received};

/// The answer to a publish: 201 when appended, 200 for a repeated
/// idempotency key (with the original offset and time).
#[derive(Debug, Serialize)]
struct PublishedBody<'a> {
    channel: &'a ChannelName,
    offset: u64,
    published_at: String,
}

/// The answer to a publish, from the publish routine's outcome: 201 when
/// this node committed it, 200 for a repeated idempotency key, and the
/// holder's answer unchanged when it was forwarded.
fn answer(outcome: Published) -> Response {
    let (status, appended) = match outcome {
        Published::Created(appended) => (StatusCode::CREATED, appended),
        Published::Duplicate(appended) => (StatusCode::OK, appended),
        Published::Forwarded(answer) => return holder_response(answer),
    };
    let body = PublishedBody {
        channel: &appended.channel,
        offset: appended.offset,
        published_at: format_rfc3339_ms(appended.published_at_ms),
    };
    (status, Json(body)).into_response()
}

/// The holder's answer to a forwarded request, returned to the client
/// unchanged: status, `Content-Type`, `Retry-After` and body.
pub(crate) fn holder_response(answer: HolderAnswer) -> Response {
    let mut response = Response::new(Body::from(answer.body().clone()));
    *response.status_mut() = answer.status();
    let headers = response.headers_mut();
    if let Some(value) = answer.content_type() {
        headers.insert(CONTENT_TYPE, value.clone());
    }
    if let Some(value) = answer.retry_after() {
        headers.insert(RETRY_AFTER, value.clone());
    }
    response
}

/// Appends one message; answers only after it is committed. The caller's
/// credentials are checked first (401), then its right to publish to the
/// channel (403) and its publish rate (429). On a standby the publish is
/// then forwarded once to the holder; if this node takes the lease over
/// before the holder answered, see `publish.rs`.
///
/// The body is read only once the credentials, path and headers are
/// valid, so that a client that waits for `100 Continue`
/// (`Expect: 100-continue`) gets a `4xx` decided by them at once and never
/// sends the body.
pub(crate) async fn publish(
    State(state): State<ApiState>,
    caller: Result<Caller>,
    channel: Result<ChannelPath>,
    req: Request,
) -> Response {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let outcome = append(&state, caller, channel, &parts.headers, body).await;
    let (result, response) = match outcome {
        Ok(outcome) => (outcome.label(), answer(outcome)),
        Err(e) => (e.code(), e.into_response()),
    };
    metrics::publish_finished(result, started.elapsed().as_secs_f64());
    response
}

async fn append(
    state: &ApiState,
    caller: Result<Caller>,
    channel: Result<ChannelPath>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Published> {
    let Caller(who) = caller?;
    let ChannelPath(channel) = channel?;
    let shared = &state.shared;
    shared.auth().may_publish(&who, &channel)?;
    let idempotency_key = idempotency_key(headers)?;
    let PublishBody { data, tags, raw } =
        PublishBody::read(headers, body, state.settings().max_message_bytes).await?;
    if state.draining() {
        return Err(Error::Draining);
    }
    shared.auth().take_publishes(&who, 1)?;
    let message = NewMessage {
        channel,
        data: herald_core::Payload::Json(data),
        idempotency_key,
        tags,
    };
    let received = Received::Http { headers, body: raw };
    Ok(publish::publish(&shared.publisher(), message, received).await?)
}
