//! HTTP API v1: the router, its routes and the fallbacks that keep every
//! error in the JSON error shape. The routes are documented in `docs/api.md`.

mod batch;
mod delete;
mod extract;
mod ops;
mod publish;
mod read;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tracing::Instrument;

use crate::{centrifugo, conn_limit, edge, sse, ws, AppState, Error};

pub(crate) use publish::{after_takeover_error, forward_to_holder};

pub(crate) use extract::{
    read_limited, resume_point, AfterQuery, ChannelPath, FromQuery, QueryParams, ValidQuery,
};

/// Builds the router over `state`.
pub(crate) fn router(state: AppState) -> Router {
    let limit = state.config().max_message_bytes;
    Router::new()
        // The publish body extractor enforces `max_message_bytes` itself
        // (and reads an oversize body to its end before answering 413);
        // the layer bounds any standard body extractor on the route too.
        .route(
            "/v1/channels/{channel}/messages",
            get(read::history)
                .post(publish::publish)
                .layer(DefaultBodyLimit::max(limit))
                .layer(middleware::from_fn(edge::require_json)),
        )
        // A batch publish: its own body limit, `max_batch_body_bytes`,
        // enforced by the handler as the publish extractor does.
        .route(
            "/v1/messages",
            post(batch::publish_batch)
                .layer(DefaultBodyLimit::max(state.config().max_batch_body_bytes))
                .layer(middleware::from_fn(edge::require_json)),
        )
        .route(
            "/v1/channels/{channel}",
            axum::routing::delete(delete::delete_channel),
        )
        .route("/v1/channels/{channel}/events", get(sse::events))
        .route("/v1/channels/{channel}/ws", get(ws::upgrade))
        .route("/v1/channels", get(read::channels))
        // Centrifugo's client protocol and server API (`docs/centrifugo.md`).
        .route("/connection/websocket", get(centrifugo::upgrade))
        .route(
            "/api/{method}",
            post(centrifugo::server_api)
                .layer(DefaultBodyLimit::max(state.config().max_batch_body_bytes)),
        )
        .route("/v1/status", get(ops::status))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        // After every route: it applies to the routes already added.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        // Every WebSocket upgrade, whatever its route: its `Origin`
        // (`edge.rs`).
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::check_websocket_origin,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            conn_limit::limit_proxied,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), request_span))
        // A preflight (`OPTIONS`) is answered here, on every route, and
        // every answer gets the CORS headers (`cors.rs`).
        .layer(state.config().cors.layer())
        // Outermost: on a loopback node without access control, a
        // request for another host name is refused before anything else
        // (`edge.rs`).
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::check_loopback_host,
        ))
        .with_state(state)
}

/// Runs each request in a span that carries the node's id, so that every
/// log record of a handler names the node.
async fn request_span(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let span = tracing::debug_span!(
        "request",
        node_id = %state.config().node_id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    next.run(request).instrument(span).await
}

async fn not_found() -> Error {
    Error::NotFound
}

async fn method_not_allowed() -> Error {
    Error::MethodNotAllowed
}
