//! What every wing shares (API v1's `api::state::ApiState` and
//! Centrifugo's `centrifugo::context::CentrifugoState` both hold it): the
//! node's core (herald-node's `Node`: storage, lease view, writer queue,
//! hub and forwarder), the settings, access control and the drain signal. `AppState`
//! (`state.rs`) builds it once at the start; the wings only read it.

use std::sync::Arc;

use herald_auth::{Auth, AuthSlot};
use herald_node::node::Node;
use herald_node::publish::Publisher;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;

/// The node's state that every wing reads. Shared behind an `Arc`.
pub(crate) struct Shared {
    /// The node's core (herald-node): storage, lease view, writer queue,
    /// hub and forwarder.
    pub(crate) node: Arc<Node>,
    /// Settings.
    pub(crate) config: ServerConfig,
    /// Access control, replaced whole on a reload: read it with
    /// [`Shared::auth`].
    pub(crate) auth_slot: Arc<AuthSlot>,
    /// Cancelled when the node drains.
    pub(crate) shutdown: CancellationToken,
    /// The Durable Streams appends waiting for their producer's turn.
    pub(crate) stream_producer_waits: Arc<crate::durable_streams::producer_wait::ProducerWaits>,
}

impl Shared {
    /// What the publish routine needs of this node (herald-node's
    /// `publish.rs`).
    pub(crate) fn publisher(&self) -> Publisher<'_> {
        self.node.publisher()
    }

    /// The access control in force now; a request reads it once.
    pub(crate) fn auth(&self) -> Arc<Auth> {
        self.auth_slot.load()
    }

    /// `true` once the node drains (its `shutdown` token is cancelled).
    pub(crate) fn draining(&self) -> bool {
        self.shutdown.is_cancelled()
    }
}
