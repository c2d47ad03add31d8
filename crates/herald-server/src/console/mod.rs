//! The web console (`docs/console.md`): its pages, embedded in the binary
//! and served under `/console/` when `[console] enabled` is set
//! (`assets.rs`), and the admin routes it is driven by, which are part of
//! the HTTP API whether the pages are served or not: the cluster and its
//! lease (`cluster.rs`, also as an event stream), a page of channels
//! (`channels.rs`) and the node's rates (`rates.rs`). The pages use only
//! these and the rest of the public API (history, publish, SSE, deletion,
//! Centrifugo's server API): the console has no private back door.

mod assets;
mod channels;
pub(crate) mod cluster;
pub(crate) mod config;
pub(crate) mod rates;

use std::sync::Arc;

use axum::extract::FromRef;
use axum::routing::get;
use axum::Router;

use config::ConsoleConfig;
use herald_http::shared::Shared;
use rates::Rates;

/// The console's state: what every wing shares, the node's rates, its
/// start and the cluster view. Connection counts, its own included, come
/// from the node reports in the storage, not from a wing. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ConsoleState {
    /// What every wing shares (`shared.rs`).
    pub(crate) shared: Arc<Shared>,
    /// The node's rates of the last minutes.
    pub(crate) rates: Arc<Rates>,
    /// When the node's state started (its uptime).
    pub(crate) started: std::time::Instant,
    /// The cluster view its event streams share.
    pub(crate) views: Arc<cluster::ViewCache>,
    /// The console's own settings (`[console]`).
    pub(crate) config: Arc<ConsoleConfig>,
}

impl FromRef<ConsoleState> for herald_http::auth_extract::AuthState {
    fn from_ref(state: &ConsoleState) -> Self {
        Self(Arc::clone(&state.shared.auth_slot))
    }
}

/// The admin routes, and the pages when the console is enabled.
pub(crate) fn routes(config: &ConsoleConfig) -> Router<ConsoleState> {
    let admin = Router::new()
        .route("/v1/admin/cluster", get(cluster::cluster))
        .route("/v1/admin/cluster/events", get(cluster::events))
        .route("/v1/admin/channels", get(channels::channels))
        .route("/v1/admin/rates", get(rates::rates));
    if !config.enabled {
        return admin;
    }
    admin.merge(assets::routes())
}
