//! The node's router: each wing's routes (API v1's `api::routes`,
//! Centrifugo's `centrifugo::routes`), each given its own state (taken
//! from `AppState` with `FromRef`), merged, with the layers they share
//! (edge checks, connection limits, the request span, CORS; `layers.rs`)
//! and the fallbacks that keep every error in the JSON error shape.

use std::sync::Arc;

use axum::extract::FromRef;
use axum::Router;
use tower::ServiceBuilder;

use crate::api::routes as api_routes;
use crate::api::state::ApiState;
use crate::centrifugo::context::CentrifugoState;
use crate::centrifugo::routes as centrifugo_routes;
use crate::console::routes as console_routes;
use crate::console::ConsoleState;
use crate::state::AppState;
use herald_durable_streams::routes as streams_routes;
use herald_durable_streams::StreamsState;
use herald_http::error::Error;
use herald_http::layers::{CheckLayer, LoopbackHost, RequestLayer};

/// Builds the router over `state`.
pub(crate) fn router(state: AppState) -> Router {
    let config = state.config();
    let routes = Router::new()
        .merge(api_routes(&state.shared.settings).with_state(ApiState::from_ref(&state)))
        // Centrifugo's client protocol and server API (`docs/centrifugo.md`).
        .merge(
            centrifugo_routes(&state.shared.settings).with_state(CentrifugoState::from_ref(&state)),
        )
        // The admin routes and, when enabled, the web console's pages
        // (`docs/console.md`).
        .merge(console_routes(&config.console).with_state(ConsoleState::from_ref(&state)))
        // The Durable Streams protocol under its prefix (`docs/durable-streams.md`).
        .merge(streams_routes(&config.durable_streams).with_state(StreamsState::from_ref(&state)))
        // After every route: it applies to the routes already added.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found);
    // The shared layers wrap the routes once, as one service, rather than
    // each route's endpoint (`Router::layer`), which would clone every
    // layer of the stack, each in its own box, on every request.
    let shared = ServiceBuilder::new()
        // Outermost: a request with two `Host` fields and, on a loopback
        // node without access control, a request for another host name
        // are refused before anything else (`edge.rs`).
        .layer(CheckLayer(LoopbackHost(Arc::clone(&state.shared))))
        // A preflight (`OPTIONS`) is answered here, on every route, and
        // every answer gets the CORS headers (`cors.rs`).
        .layer(config.cors.layer())
        // The request span, the connection limit of a proxied request and
        // the `Origin` of every WebSocket upgrade, whatever its route
        // (`layers.rs`, `conn_limit.rs`, `edge.rs`).
        .layer(RequestLayer {
            shared: Arc::clone(&state.shared),
            limits: Arc::clone(state.conn_limits()),
        })
        .service(routes);
    Router::new().fallback_service(shared)
}

async fn not_found() -> Error {
    Error::NotFound
}

async fn method_not_allowed() -> Error {
    Error::MethodNotAllowed
}
