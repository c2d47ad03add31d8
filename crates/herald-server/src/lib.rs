//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-http` (the HTTP edge every
//! wing shares), `herald-durable-streams` (a wing), `herald-server` (the
//! wings composed: API v1, Centrifugo, the console and Durable Streams) and
//! `herald` (the binary); `herald-auth` (access control, no HTTP) stands
//! beside them on `herald-core`. `ARCHITECTURE.md` is the map.
//!
//! Herald's HTTP adapters: Herald's API v1 (with SSE and WebSocket),
//! Centrifugo's client protocol and server API, and the connections they
//! share. The node's core (writer, hub, subscriptions, forwarding,
//! retention, the one publish routine) is `herald-node`; access control is
//! `herald-auth`.
//!
//! A node runs [`serve`] with a listener, a storage, the lease supervisor's
//! [`LeaseHandle`] and a [`ServerConfig`]. `router.rs` merges the wings'
//! routes (`api/`, `centrifugo/`, herald-durable-streams, `console/`) with the
//! layers they share (connection limits, the request span, CORS, the edge
//! checks) and the fallbacks; `state.rs` holds `AppState`, from which each
//! wing takes its own state (API v1's `api/state.rs`, Centrifugo's
//! `centrifugo/context.rs`, which starts Centrifugo's own tasks, Durable
//! Streams' `StreamsState`), each over herald-http's `Shared`.
//! The HTTP edge the wings share is herald-http's, used here under the
//! same module names: the accept loop (`listener`), the shared layers and
//! edge checks, connection limits, the HTTP `Error` (one JSON shape, with
//! `From<NodeError>`), request parsing, WebSocket close, CORS, TLS, the
//! JWKS fetcher, the metrics recorder and the HTTP side of access control
//! (`auth_extract`).
//!
//! Invariants:
//! - no core logic here: a publish goes through the core's one publish
//!   routine, a subscription is the core's, and a standby's holder-only
//!   write is forwarded once by the core;
//! - bad input is refused before it reaches the core and changes nothing;
//! - with access control on, every route but `/healthz`, `/readyz` and (by
//!   default) `/metrics` checks the caller before doing anything;
//! - the crate knows nothing of SQL or of the lease's timing policy.
//!
//! The feature `fault-switches` (test-only, never shipped) enables
//! herald-node's, whose fault switches act in the writer and the standby
//! feed.

mod api;
#[cfg(test)]
mod auth_extract_proptests;
mod centrifugo;
mod config;
mod console;
#[cfg(test)]
mod fuzz;
mod router;
mod state;

use herald_http::{cors, error, listener, metrics, tls};

use std::sync::Arc;

use herald_lease::LeaseHandle;
use herald_storage::Storage;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use centrifugo::CentrifugoConfig;
pub use config::ServerConfig;
pub use console::config::ConsoleConfig;
pub use cors::CorsConfig;
pub use error::{Error, Result};
pub use herald_durable_streams::config::DurableStreamsConfig;
pub use herald_node::node_error::{HolderWrite, NodeError, StartError, StorageFailure};
pub use herald_node::retention::{
    duration_text, RetentionConfig, RetentionHandle, RetentionPolicy, TrimPacing,
};
pub use metrics::{install_metrics_recorder, record_build_info};
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
/// finish within [`ServerConfig::header_read_timeout`]). A plain-TCP
/// connection whose first request is an SSE subscription is answered
/// outside the HTTP library, so that an idle subscriber holds no HTTP
/// buffers; the connection closes when the stream ends.
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
        Arc::clone(state.conn_limits()),
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
