//! `POST /v1/channels/{channel}/messages`.

use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::{format_rfc3339_ms, ChannelName, NewMessage};
use serde::Serialize;

use crate::api::extract::{idempotency_key, ChannelPath, PublishBody};
use crate::forward::{current_holder, was_forwarded, ForwardRequest};
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

/// How a publish was answered.
enum Outcome {
    /// This node (the holder) committed it, or found its idempotency key.
    Local(Response),
    /// This node (a standby) handed it to the holder; the holder's answer.
    Forwarded(Response),
}

/// Appends one message; answers only after it is committed. On a standby
/// the publish is forwarded once to the holder (`forward.rs`).
pub(crate) async fn publish(
    State(state): State<AppState>,
    channel: Result<ChannelPath>,
    headers: HeaderMap,
    body: Result<PublishBody>,
) -> Response {
    let started = Instant::now();
    let outcome = append(&state, channel, &headers, body).await;
    let (result, response) = match outcome {
        Ok(Outcome::Local(response)) if response.status() == StatusCode::OK => {
            ("duplicate", response)
        }
        Ok(Outcome::Local(response)) => ("created", response),
        Ok(Outcome::Forwarded(response)) => ("forwarded", response),
        Err(e) => (e.code(), e.into_response()),
    };
    metrics::publish_finished(result, started.elapsed().as_secs_f64());
    response
}

async fn append(
    state: &AppState,
    channel: Result<ChannelPath>,
    headers: &HeaderMap,
    body: Result<PublishBody>,
) -> Result<Outcome> {
    let ChannelPath(channel) = channel?;
    let idempotency_key = idempotency_key(headers)?;
    let PublishBody { data, raw } = body?;
    if state.draining() {
        return Err(Error::Draining);
    }
    let shared = &state.shared;
    if !shared.lease.is_holder() {
        let lease = shared.lease.state();
        if was_forwarded(headers) {
            // One hop only: a forwarded publish is never forwarded again.
            return Err(Error::NotHolder {
                holder_url: holder_url(&lease),
            });
        }
        let config = &shared.config;
        let holder = current_holder(&lease, false, &config.node_id, &config.advertise_url)
            // A row naming this node's own URL is stale (this node is not
            // holder): forwarding to itself would come back as not_holder.
            // (Node ids cannot tell: nodes sharing a data dir share one.)
            .filter(|h| h.url.trim_end_matches('/') != config.advertise_url.trim_end_matches('/'));
        let Some(holder) = holder else {
            metrics::forwarded("no_holder");
            return Err(Error::NoHolder);
        };
        let request = ForwardRequest {
            channel: &channel,
            body: raw,
            headers,
        };
        return shared
            .forwarder
            .forward(&holder.url, request)
            .await
            .map(Outcome::Forwarded);
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
    Ok(Outcome::Local((status, Json(body)).into_response()))
}
