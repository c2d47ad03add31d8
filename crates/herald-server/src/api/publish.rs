//! `POST /v1/channels/{channel}/messages`.

use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::{format_rfc3339_ms, ChannelName, NewMessage};
use serde::Serialize;

use crate::api::extract::{idempotency_key, ChannelPath, PublishBody};
use crate::role::holder_url;
use crate::{metrics, AppState, Error, Result};

/// The answer to a publish: 201 when appended, 200 for a repeated
/// idempotency key (with the original offset and time).
#[derive(Debug, Serialize)]
struct Published<'a> {
    channel: &'a ChannelName,
    offset: u64,
    published_at: String,
}

/// Appends one message; answers only after it is committed.
pub(crate) async fn publish(
    State(state): State<AppState>,
    channel: Result<ChannelPath>,
    headers: HeaderMap,
    body: Result<PublishBody>,
) -> Response {
    let started = Instant::now();
    let outcome = append(&state, channel, &headers, body).await;
    let result = match &outcome {
        Ok(response) if response.status() == StatusCode::OK => "duplicate",
        Ok(_) => "created",
        Err(e) => e.code(),
    };
    metrics::publish_finished(result, started.elapsed().as_secs_f64());
    outcome.into_response()
}

async fn append(
    state: &AppState,
    channel: Result<ChannelPath>,
    headers: &HeaderMap,
    body: Result<PublishBody>,
) -> Result<Response> {
    let ChannelPath(channel) = channel?;
    let idempotency_key = idempotency_key(headers)?;
    let PublishBody(data) = body?;
    if state.draining() {
        return Err(Error::Draining);
    }
    let shared = &state.shared;
    if !shared.lease.is_holder() {
        return Err(Error::NotHolder {
            holder_url: holder_url(&shared.lease.state()),
        });
    }
    let reply = shared.writer.submit(NewMessage {
        channel: channel.clone(),
        data,
        idempotency_key,
    })?;
    let appended = reply.await.map_err(|_| {
        // The writer dropped the request without answering: it is gone.
        if state.draining() {
            Error::Draining
        } else {
            tracing::error!(channel = %channel, "writer task ended without answering");
            Error::Internal("writer task ended".to_owned())
        }
    })??;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let body = Published {
        channel: &appended.channel,
        offset: appended.offset,
        published_at: format_rfc3339_ms(appended.published_at_ms),
    };
    Ok((status, Json(body)).into_response())
}
