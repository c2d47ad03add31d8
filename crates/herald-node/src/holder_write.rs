//! The one routine of a write that only the holder makes, from any node,
//! for every protocol wing: API v1's publish, batch publish and channel
//! deletion, Centrifugo's publishes and `history_remove`, and Durable
//! Streams' creation, append and deletion. On the holder the write is
//! made here; on a standby it is forwarded once to the holder
//! (`forward.rs`), with the headers the calling wing names
//! ([`CarriedHeaders`]); if this node takes the lease over before the
//! holder answered, it makes the write itself only when doing so cannot
//! repeat it ([`HolderRequest::repeatable`]), and answers `no_holder`
//! (outcome unknown) otherwise.

use std::future::Future;

use bytes::Bytes;
use http::HeaderMap;
use tokio_util::sync::CancellationToken;

use crate::forward::{after_takeover_error, CarriedHeaders, Forwarded, Forwarder, HolderAnswer};
use crate::node_error::{HolderWrite, NodeError, NodeResult};
use crate::role::LeaseView;
use crate::writer::WriterHandle;

/// What a holder-only write (a publish among them) needs of the node: its writer, its role, its way to the
/// holder, and whether it drains.
pub struct Publisher<'a> {
    /// This node's writer queue.
    pub writer: &'a WriterHandle,
    /// This node's role.
    pub lease: &'a dyn LeaseView,
    /// Forwards to the holder on a standby.
    pub forwarder: &'a Forwarder,
    /// Cancelled when the node drains.
    pub shutdown: &'a CancellationToken,
}

/// A holder-only write as it reached this node: what a standby forwards.
#[derive(Debug)]
pub struct HolderRequest<'a> {
    /// The write, which names the holder's route for it.
    pub write: HolderWrite,
    /// The incoming request's headers.
    pub headers: &'a HeaderMap,
    /// The incoming request's body, forwarded exactly as received.
    pub body: Bytes,
    /// The headers a forward carries besides `Content-Type` and
    /// `Idempotency-Key`, both ways, as the calling wing names them.
    pub carry: CarriedHeaders,
    /// Whether making the write here after a takeover cannot repeat what
    /// the old holder may have committed just before it lost the lease: a
    /// publish whose every message carries an idempotency key, a stream
    /// append with a producer sequence, a stream's creation, a channel's
    /// deletion or the removal of its history (making them twice changes
    /// nothing more).
    pub repeatable: bool,
}

/// Where a write was made: here, or by the holder.
#[derive(Debug)]
pub enum Routed<T> {
    /// This node made it.
    Here(T),
    /// The holder answered it.
    Holder(HolderAnswer),
}

/// Makes `request` with `make` here on the holder; else forwards it once
/// to the holder; after a takeover that ended the forward, makes it here
/// only when it is [`HolderRequest::repeatable`]. When this node takes the
/// lease over before the holder answered, the old holder may have made the
/// write just before it lost the lease, and can make nothing after that:
/// this node's fenced write runs after the old holder's last commit (a
/// takeover waits for the write transactions in flight, and a later one
/// fails its fencing check), so a repeatable write finds what the old
/// holder did.
///
/// # Errors
/// `make`'s, and the forwarding's ([`NodeError::NoHolder`],
/// [`NodeError::NotHolder`] for a request another node forwarded
/// already). After a takeover, every error of `make` that would say
/// "nothing was stored" (`QueueFull`, `LeaseLost`, `Draining`,
/// `NotHolder`) is `NoHolder`: it speaks for this node only, not for the
/// old holder.
pub async fn on_holder<T, F, Fut>(
    node: &Publisher<'_>,
    request: HolderRequest<'_>,
    make: F,
) -> NodeResult<Routed<T>>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = NodeResult<T>>,
{
    if node.lease.is_holder() {
        return make().await.map(Routed::Here);
    }
    let HolderRequest {
        write,
        headers,
        body,
        carry,
        repeatable,
    } = request;
    match node
        .forwarder
        .to_holder(node.lease, headers, write, body, carry)
        .await?
    {
        Forwarded::Answer(answer) => Ok(Routed::Holder(answer)),
        Forwarded::TakenOver => {
            if !repeatable || !node.lease.is_holder() {
                return Err(NodeError::NoHolder);
            }
            make().await.map(Routed::Here).map_err(after_takeover_error)
        }
    }
}
