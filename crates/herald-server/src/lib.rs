//! Herald's HTTP server: API v1, the group-commit writer, live
//! subscriptions over SSE and WebSocket, and metrics.
//!
//! A node runs [`serve`] with a listener, a storage, the lease supervisor's
//! [`LeaseHandle`] and a [`ServerConfig`]. Publishes go through one writer
//! task per node (`writer.rs`): a bounded queue, batches of up to
//! `max_batch` messages appended in one fenced transaction, answered only
//! after the commit. Live subscribers follow a per-channel broadcast
//! (`hub.rs`) fed by the writer on the holder and by the standby feed
//! (`standby_feed.rs`) on a standby; `subscription.rs` turns history plus
//! live notices into one gap-free, repeat-free sequence for SSE
//! (`api/sse.rs`) and WebSocket (`api/ws.rs`), and for Centrifugo's client
//! protocol (`centrifugo/`, which also serves Centrifugo's server API).
//! Every wing publishes through one routine (`publish.rs`): a publish that
//! reaches a standby is forwarded once to the holder (`forward.rs`). The
//! router (`router.rs`) merges the wings' routes, each with its own state
//! taken from `AppState` (`state.rs`): API v1's `ApiState`
//! (`api/state.rs`) and Centrifugo's context (`centrifugo/context.rs`,
//! which starts Centrifugo's own tasks), both over what every wing shares
//! (`shared.rs`).
//! The server API's cluster-wide requests reach the other nodes' clients
//! as cluster events (`centrifugo/cluster.rs`). The core's errors are `NodeError`
//! (`node_error.rs`); every error becomes one JSON shape in `error.rs`.
//! Access control (API keys, client tokens, namespaces, publish rate
//! limits) is the herald-auth crate; `auth_extract.rs` reads credentials
//! from requests for it, and `jwks_fetch.rs` fetches a JWKS URL for it.
//! `listener.rs` accepts connections and serves them with
//! HTTP/1 or HTTP/2, closing those that do not send a request head in time.
//!
//! Invariants:
//! - a publish is acknowledged only after `Storage::append` returned Ok,
//!   which the storage does only after the commit;
//! - only the holder writes: the writer asks `LeaseHandle::writable_lease`
//!   before every batch, and the storage fences every write by token;
//! - a subscriber sees every offset after its resume point exactly once, in
//!   order;
//! - the crate knows nothing of SQL or of the lease's timing policy.
//!
//! The feature `fault-switches` (test-only, never shipped) compiles in the
//! fault switches of `herald_core::fault_switches`; two act here:
//! `ack_before_commit` (`writer/fault.rs`, against the first invariant) and
//! `drop_notify` (`standby_feed.rs`). `FaultSwitch` explains each.

mod api;
mod auth_extract;
mod centrifugo;
mod config;
mod conn_limit;
mod cors;
mod edge;
mod error;
mod extract;
mod forward;
#[cfg(test)]
mod fuzz;
mod hub;
mod jwks_fetch;
mod listener;
mod metrics;
mod node_error;
mod publish;
mod retention;
mod role;
mod router;
mod shared;
mod standby_feed;
mod state;
mod subscription;
#[cfg(test)]
mod testing;
mod tls;
mod websocket;
mod writer;

use std::sync::Arc;

use herald_lease::LeaseHandle;
use herald_storage::Storage;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use centrifugo::CentrifugoConfig;
pub use config::ServerConfig;
pub use cors::CorsConfig;
pub use error::{Error, Result};
pub use metrics::install_metrics_recorder;
pub use node_error::{HolderWrite, NodeError, StartError, StorageFailure};
pub use retention::{duration_text, RetentionConfig, RetentionHandle, RetentionPolicy, TrimPacing};
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
    lease: Arc<dyn role::LeaseView>,
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
