//! HTTP API v1: its routes (`docs/api.md`) — publish, batch publish,
//! history, deletion, SSE (`sse.rs`), WebSocket (`ws.rs`) — and the
//! node's operational routes. The top-level router (`router.rs`) merges
//! them with Centrifugo's and applies the shared layers.

mod batch;
mod delete;
mod ops;
mod publish;
mod read;
mod sse;
pub(crate) mod state;
mod ws;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use herald_http::layers::{CheckLayer, RequireJson};
use herald_http::shared::Settings;
use state::ApiState;

/// API v1's routes and the operational ones (`/v1/status`, `/healthz`,
/// `/readyz`, `/metrics`), with their body limits from `settings`.
pub(crate) fn routes(settings: &Settings) -> Router<ApiState> {
    let limit = settings.max_message_bytes;
    Router::new()
        // The publish body extractor enforces `max_message_bytes` itself
        // (and reads an oversize body to its end before answering 413);
        // the layer bounds any standard body extractor on the route too.
        .route(
            "/v1/channels/{channel}/messages",
            get(read::history)
                .post(publish::publish)
                .layer(DefaultBodyLimit::max(limit))
                .layer(CheckLayer(RequireJson)),
        )
        // A batch publish: its own body limit, `max_batch_body_bytes`,
        // enforced by the handler as the publish extractor does.
        .route(
            "/v1/messages",
            post(batch::publish_batch)
                .layer(DefaultBodyLimit::max(settings.max_batch_body_bytes))
                .layer(CheckLayer(RequireJson)),
        )
        .route(
            "/v1/channels/{channel}",
            axum::routing::delete(delete::delete_channel),
        )
        .route("/v1/channels/{channel}/events", get(sse::events))
        .route("/v1/channels/{channel}/ws", get(ws::upgrade))
        .route("/v1/channels", get(read::channels))
        .route("/v1/status", get(ops::status))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
}
