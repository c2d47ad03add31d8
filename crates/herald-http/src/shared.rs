//! What every wing shares (API v1's `api::state::ApiState`, Centrifugo's
//! `centrifugo::context::CentrifugoState`, Durable Streams'
//! `durable_streams::state::StreamsState` and the console's state all hold
//! it): the node's core (herald-node's `Node`: storage, lease view, writer
//! queue, hub and forwarder), the [`Settings`] every wing reads, access
//! control and the drain signal. `AppState` (`state.rs`) builds it once at
//! the start; the wings only read it. Each wing's own settings are in its
//! own state, not here.

use std::sync::Arc;
use std::time::Duration;

use herald_auth::{Auth, AuthSlot};
use herald_node::node::Node;
use herald_node::publish::Publisher;
use tokio_util::sync::CancellationToken;

/// The node's state that every wing reads. Shared behind an `Arc`.
pub struct Shared {
    /// The node's core (herald-node): storage, lease view, writer queue,
    /// hub and forwarder.
    pub node: Arc<Node>,
    /// The settings every wing reads.
    pub settings: Settings,
    /// Access control, replaced whole on a reload: read it with
    /// [`Shared::auth`].
    pub auth_slot: Arc<AuthSlot>,
    /// Cancelled when the node drains.
    pub shutdown: CancellationToken,
}

impl Shared {
    /// What the publish routine needs of this node (herald-node's
    /// `publish.rs`).
    pub fn publisher(&self) -> Publisher<'_> {
        self.node.publisher()
    }

    /// The access control in force now; a request reads it once.
    pub fn auth(&self) -> Arc<Auth> {
        self.auth_slot.load()
    }

    /// `true` once the node drains (its `shutdown` token is cancelled).
    pub fn draining(&self) -> bool {
        self.shutdown.is_cancelled()
    }
}

/// The settings every wing reads (a part of the node's whole settings,
/// `ServerConfig`, which fills it; the meaning and default of each field
/// is documented there and in `docs/configuration.md`). A wing's own
/// settings (Centrifugo's, Durable Streams', the console's) are in the
/// wing's own state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// This node's id, in `/v1/status`, Centrifugo's replies and every log
    /// record.
    pub node_id: String,
    /// The URL at which clients reach this node.
    pub advertise_url: String,
    /// Largest stored message, in bytes, whatever protocol writes it.
    pub max_message_bytes: usize,
    /// Largest batch request body (API v1's batch publish, Centrifugo's
    /// server API), in bytes.
    pub max_batch_body_bytes: usize,
    /// Most message bytes one read of the storage may bring into memory,
    /// in bytes.
    pub read_budget_bytes: usize,
    /// Most bytes of pushes queued for one connection and not yet written
    /// to it, in bytes.
    pub subscriber_queue_bytes: usize,
    /// Interval between SSE heartbeats and WebSocket pings.
    pub heartbeat: Duration,
    /// Largest message (and frame) a WebSocket client may send, in bytes.
    pub ws_max_message_bytes: usize,
    /// Web origins allowed to call the node from a browser (`*`: all).
    pub allowed_origins: Vec<String>,
    /// Answer only requests for a loopback host name (DNS rebinding
    /// defence of a loopback node without access control).
    pub loopback_hosts_only: bool,
    /// `true` when the node serves HTTPS itself (the scheme of the URLs it
    /// builds).
    pub tls: bool,
    /// Rows per deletion transaction (retention's trim pacing), used by
    /// the wings' deletions too.
    pub delete_batch: usize,
}

impl Settings {
    /// Messages per storage read of a history or catch-up page: as many
    /// messages of `max_message_bytes` as fit in `read_budget_bytes`, at
    /// least one.
    pub fn read_page_messages(&self) -> usize {
        (self.read_budget_bytes / self.max_message_bytes.max(1)).max(1)
    }
}
