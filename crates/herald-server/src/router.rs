//! The node's router: each wing's routes (API v1's `api::routes`,
//! Centrifugo's `centrifugo::routes`), each given its own state (taken
//! from `AppState` with `FromRef`), merged, with the layers they share
//! (edge checks, connection limits, the request span, CORS) and the
//! fallbacks that keep every error in the JSON error shape.

use std::sync::Arc;

use axum::extract::{FromRef, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use tracing::Instrument;

use crate::api::routes as api_routes;
use crate::api::state::ApiState;
use crate::centrifugo::context::CentrifugoState;
use crate::centrifugo::routes as centrifugo_routes;
use crate::conn_limit::limit_proxied;
use crate::edge::{check_loopback_host, check_websocket_origin};
use crate::error::Error;
use crate::state::AppState;

/// Builds the router over `state`.
pub(crate) fn router(state: AppState) -> Router {
    let config = state.config();
    Router::new()
        .merge(api_routes(config).with_state(ApiState::from_ref(&state)))
        // Centrifugo's client protocol and server API (`docs/centrifugo.md`).
        .merge(centrifugo_routes(config).with_state(CentrifugoState::from_ref(&state)))
        // After every route: it applies to the routes already added.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        // Every WebSocket upgrade, whatever its route: its `Origin`
        // (`edge.rs`).
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state.shared),
            check_websocket_origin,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(state.conn_limits()),
            limit_proxied,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), request_span))
        // A preflight (`OPTIONS`) is answered here, on every route, and
        // every answer gets the CORS headers (`cors.rs`).
        .layer(config.cors.layer())
        // Outermost: on a loopback node without access control, a
        // request for another host name is refused before anything else
        // (`edge.rs`).
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state.shared),
            check_loopback_host,
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
