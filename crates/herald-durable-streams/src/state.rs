//! What the wing's handlers take ([`StreamsState`]): the state every wing
//! shares, the wing's own settings and the appends waiting for their
//! producer's turn.

use std::sync::Arc;

use axum::extract::FromRef;

use super::config::DurableStreamsConfig;
use super::producer_wait::ProducerWaits;
use herald_http::shared::Shared;

/// The wing's state. Cheap to clone.
#[derive(Clone)]
pub struct StreamsState {
    /// What every wing shares (`shared.rs`).
    pub(crate) shared: Arc<Shared>,
    /// The wing's own settings (`[durable_streams]`).
    pub(crate) config: Arc<DurableStreamsConfig>,
    /// The appends waiting for their producer's turn.
    pub(crate) producer_waits: Arc<ProducerWaits>,
}

impl StreamsState {
    /// The wing's state over `shared`, with its own `config` and no append
    /// waiting yet.
    pub fn new(shared: Arc<Shared>, config: DurableStreamsConfig) -> Self {
        Self {
            shared,
            config: Arc::new(config),
            producer_waits: Arc::default(),
        }
    }
}

impl FromRef<StreamsState> for herald_http::auth_extract::AuthState {
    fn from_ref(state: &StreamsState) -> Self {
        Self(Arc::clone(&state.shared.auth_slot))
    }
}
