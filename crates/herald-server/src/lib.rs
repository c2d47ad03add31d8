//! Herald's HTTP server: API v1 with SSE and WebSocket, Centrifugo's
//! client protocol and server API, connections and metrics, on the node's
//! core (the herald-node crate: the group-commit writer, the hub, the
//! subscriptions, the standby feed, forwarding to the holder, retention
//! and the one publish routine).
//!
//! A node runs [`serve`] with a listener, a storage, the lease supervisor's
//! [`LeaseHandle`] and a [`ServerConfig`]. `state.rs` starts the core
//! (`herald_node`'s writer, standby feed and trimming task) and the
//! server's own tasks. Subscriptions (`herald_node::subscription`) reach
//! clients over SSE (`api/sse.rs`), WebSocket (`api/ws.rs`) and
//! Centrifugo's client protocol (`centrifugo/`, which also serves
//! Centrifugo's server API). Every wing publishes through the core's one
//! routine (`herald_node::publish`). The router (`router.rs`) merges the
//! wings' routes.
//! The server API's cluster-wide requests reach the other nodes' clients
//! as cluster events (`cluster.rs`). The core's errors are `NodeError`
//! (`herald_node::node_error`); every error becomes one JSON shape in
//! `error.rs`.
//! Access control (API keys, client tokens, namespaces, publish rate
//! limits) is the herald-auth crate; `auth_extract.rs` reads credentials
//! from requests for it, and `jwks_fetch.rs` fetches a JWKS URL for it.
//! `listener.rs` accepts connections and serves them with
//! HTTP/1 or HTTP/2, closing those that do not send a request head in time.
//!
//! The core's invariants (a publish acknowledged only after the commit,
//! only the holder writes, every offset exactly once to a subscriber) are
//! herald-node's; this crate keeps them by publishing and subscribing only
//! through it. It knows nothing of SQL or of the lease's timing policy.
//!
//! The feature `fault-switches` (test-only, never shipped) enables
//! herald-node's, whose fault switches act in the writer and the standby
//! feed.

mod api;
mod auth_extract;
mod centrifugo;
mod cluster;
mod config;
mod conn_limit;
mod cors;
mod edge;
mod error;
mod extract;
#[cfg(test)]
mod fuzz;
mod jwks_fetch;
mod listener;
mod metrics;
mod router;
mod state;
mod tls;
mod websocket;

use std::sync::Arc;

use herald_lease::LeaseHandle;
use herald_storage::Storage;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use centrifugo::CentrifugoConfig;
pub use config::ServerConfig;
pub use cors::CorsConfig;
pub use error::{Error, Result};
pub use herald_node::node_error::{HolderWrite, NodeError, StartError, StorageFailure};
pub use herald_node::retention::{
    duration_text, RetentionConfig, RetentionHandle, RetentionPolicy, TrimPacing,
};
pub use metrics::install_metrics_recorder;
pub use state::AppState;
pub use tls::TlsCertificates;

/// The HTTP API over `state`, without a socket (tests call it with
/// `tower::ServiceExt::oneshot`). Routes and error codes: `docs/api.md`.
pub fn app(state: AppState) -> axum::Router {
    router::router(state)
}

/// Serves the API on `listener` until `shutdown` is cancelled, then drains:
///
/// 1. stops accepting connections, closes idle ones, and answers new
///    publishes with 503 `draining`;
/// 2. ends every SSE stream (the body finishes) and closes every WebSocket
///    with 1001 "going away" (RFC 6455 §7.4.1);
/// 3. lets in-flight publishes finish: the writer closes its queue and
///    commits (or fails, never acknowledges without storing) what is
///    queued;
/// 4. returns once every connection, session and background task ended.
///
/// Each connection speaks HTTP/1 (with upgrades, for WebSocket) or HTTP/2,
/// over TLS when [`ServerConfig::tls`] is set (the handshake, too, must
/// finish within [`ServerConfig::header_read_timeout`]).
/// A client that does not send a complete request head within
/// [`ServerConfig::header_read_timeout`] (for its first request, or for
/// the next one on a kept-alive connection) is disconnected. A failed
/// accept (such as running out of file descriptors) is logged and retried
/// after a short pause; it does not end the server.
///
/// The caller then stops the lease supervisor, which releases the lease.
///
/// # Errors
/// [`StartError::Config`] for an unusable config, [`StartError::Storage`]
/// when the storage does not answer at start.
pub async fn serve(
    listener: TcpListener,
    storage: Arc<dyn Storage>,
    lease: LeaseHandle,
    config: ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    serve_with(listener, storage, Arc::new(lease), config, shutdown, None).await
}

/// [`serve`], and cancels `writes_done` as soon as the writer has ended
/// during the drain (step 3 above), before slow clients have closed their
/// connections. The caller releases the lease at that moment, so that a
/// standby takes over without waiting for those connections.
///
/// # Errors
/// As [`serve`].
pub async fn serve_with_writes_done(
    listener: TcpListener,
    storage: Arc<dyn Storage>,
    lease: LeaseHandle,
    config: ServerConfig,
    shutdown: CancellationToken,
    writes_done: CancellationToken,
) -> Result<(), StartError> {
    serve_with(
        listener,
        storage,
        Arc::new(lease),
        config,
        shutdown,
        Some(writes_done),
    )
    .await
}

/// [`serve`] with any lease view.
pub(crate) async fn serve_with(
    listener: TcpListener,
    storage: Arc<dyn Storage>,
    lease: Arc<dyn herald_node::role::LeaseView>,
    config: ServerConfig,
    shutdown: CancellationToken,
    writes_done: Option<CancellationToken>,
) -> Result<(), StartError> {
    // A child token: this server's tasks follow the caller's token, and
    // cancelling it here never cancels the caller's.
    let stop = shutdown.child_token();
    let tls = match &config.tls {
        Some(certificates) => Some(certificates.acceptor()?),
        None => None,
    };
    let state = AppState::start_with(storage, lease, config, stop.clone()).await?;
    let node_id = state.config().node_id.clone();
    match listener.local_addr() {
        Ok(addr) => tracing::info!(node_id = %node_id, addr = %addr, "serving"),
        Err(e) => tracing::info!(node_id = %node_id, addr_error = %e, "serving"),
    }
    if let Some(writes_done) = writes_done {
        let state = state.clone();
        tokio::spawn(async move {
            state.writes_done().await;
            writes_done.cancel();
        });
    }
    listener::serve_connections(
        listener,
        tls,
        app(state.clone()),
        state.config().header_read_timeout,
        state.config().max_streams_per_connection,
        Arc::clone(&state.shared.conn_limits),
        stop.clone(),
    )
    .await;
    stop.cancel();
    state.stopped().await;
    tracing::info!(node_id = %node_id, "server drained");
    Ok(())
}

#[cfg(test)]
mod tests;
