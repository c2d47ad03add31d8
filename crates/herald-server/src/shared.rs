//! What every wing shares (API v1's `api::state::ApiState` and
//! Centrifugo's `centrifugo::context::CentrifugoState` both hold it): the
//! node's storage, lease view, writer queue, hub and forwarder, the
//! settings, access control and the drain signal. `AppState`
//! (`state.rs`) builds it once at the start; the wings only read it.

use std::sync::Arc;

use herald_auth::{Auth, AuthSlot};
use herald_storage::Storage;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::forward::Forwarder;
use crate::hub::Hub;
use crate::publish::Publisher;
use crate::role::LeaseView;
use crate::writer::WriterHandle;

/// The node's state that every wing reads. Shared behind an `Arc`.
pub(crate) struct Shared {
    /// Where messages and the lease live.
    pub(crate) storage: Arc<dyn Storage>,
    /// The node's role (holder or standby).
    pub(crate) lease: Arc<dyn LeaseView>,
    /// Settings.
    pub(crate) config: ServerConfig,
    /// The writer's queue.
    pub(crate) writer: WriterHandle,
    /// Live fan-out to subscribers.
    pub(crate) hub: Arc<Hub>,
    /// Access control, replaced whole on a reload: read it with
    /// [`Shared::auth`].
    pub(crate) auth_slot: Arc<AuthSlot>,
    /// Hands publishes that reach this node while standby to the holder.
    pub(crate) forwarder: Forwarder,
    /// Cancelled when the node drains.
    pub(crate) shutdown: CancellationToken,
}

impl Shared {
    /// What the publish routine needs of this node (`publish.rs`).
    pub(crate) fn publisher(&self) -> Publisher<'_> {
        Publisher {
            writer: &self.writer,
            lease: self.lease.as_ref(),
            forwarder: &self.forwarder,
            shutdown: &self.shutdown,
        }
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
