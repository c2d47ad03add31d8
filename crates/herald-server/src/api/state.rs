//! What API v1's handlers take ([`ApiState`]): the state every wing
//! shares, the metrics recorder `/metrics` renders, and API v1's
//! WebSocket sessions.

use std::sync::Arc;

use axum::extract::FromRef;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::task::TaskTracker;

use herald_http::auth_extract::AuthState;
use herald_http::shared::{Settings, Shared};

/// API v1's state. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ApiState {
    /// What every wing shares (`shared.rs`).
    pub(crate) shared: Arc<Shared>,
    /// Renders `/metrics`.
    pub(crate) metrics: PrometheusHandle,
    /// API v1's WebSocket sessions (`ws.rs`), which outlive their HTTP
    /// request; [`ApiState::stopped`] waits for them to close.
    pub(crate) sessions: TaskTracker,
}

impl ApiState {
    /// API v1's state over `shared`, rendering `/metrics` with `metrics`,
    /// with no session yet.
    pub(crate) fn new(shared: Arc<Shared>, metrics: PrometheusHandle) -> Self {
        Self {
            shared,
            metrics,
            sessions: TaskTracker::new(),
        }
    }

    /// The settings every wing reads.
    pub(crate) fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// `true` once the node drains.
    pub(crate) fn draining(&self) -> bool {
        self.shared.draining()
    }

    /// Waits until every WebSocket session has closed (each closes when
    /// the node drains).
    pub(crate) async fn stopped(&self) {
        self.sessions.close();
        self.sessions.wait().await;
    }
}

impl FromRef<ApiState> for AuthState {
    fn from_ref(state: &ApiState) -> Self {
        AuthState(Arc::clone(&state.shared.auth_slot))
    }
}
