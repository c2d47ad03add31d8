//! Durable Streams' writes on a node: a stream's creation, an append (with
//! its closure) and a deletion, made here on the holder, or forwarded once
//! to the holder from a standby, as publishes are (`publish.rs`). A
//! creation and an append go through the node's one writer
//! (`writer.rs`): an append is group-committed with the publishes and
//! other appends queued with it (`Storage::write`), a creation is a
//! transaction of its own (`Storage::create_stream`), and the writer fans
//! what they committed out to this node's live readers; standbys hear of
//! new messages through their feed. A deletion is the channel deletion of
//! `retention`.
//!
//! After a takeover that ends a forward (the old holder is fenced from
//! then on), this node makes the write itself only when a retry cannot
//! repeat it: a creation (idempotent), and an append whose producer
//! sequence makes it exactly-once. Any other write is answered `no_holder`
//! (outcome unknown).

use bytes::Bytes;
use herald_core::{ChannelName, StreamAppend, StreamAppended, StreamCreate, StreamCreated};
use http::{HeaderMap, Method};

use crate::forward::CarriedHeaders;
use crate::holder_write::{on_holder, HolderRequest, Routed};
use crate::node::Node;
use crate::node_error::{HolderWrite, NodeError, NodeResult, StorageFailure};
use crate::retention;

/// How a stream write reached this node: what a standby forwards.
#[derive(Debug)]
pub struct StreamRequest<'a> {
    /// The request's method.
    pub method: Method,
    /// The request's path and query, as received.
    pub path: String,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's body, as received.
    pub body: Bytes,
    /// The headers of the wing's protocol that a forward carries to the
    /// holder and back.
    pub carry: CarriedHeaders,
}

impl<'a> StreamRequest<'a> {
    fn write(&self, channel: &ChannelName) -> HolderWrite {
        HolderWrite::Stream {
            method: self.method.clone(),
            path: self.path.clone(),
            channel: channel.clone(),
        }
    }

    /// The request as [`holder_write::on_holder`] takes it.
    fn holder(&self, channel: &ChannelName, repeatable: bool) -> HolderRequest<'a> {
        HolderRequest {
            write: self.write(channel),
            headers: self.headers,
            body: self.body.clone(),
            carry: self.carry,
            repeatable,
        }
    }
}

/// Maps a storage error of a stream write made here.
fn failed(
    node: &Node,
    e: herald_storage::Error,
    what: &'static str,
    channel: &ChannelName,
) -> NodeError {
    match e {
        herald_storage::Error::LeaseLost { token, .. } => {
            node.lease().report_lease_lost(token);
            NodeError::LeaseLost
        }
        e => NodeError::Storage(StorageFailure::new(what, Some(channel), e)),
    }
}

/// The lease to write with here, or why not.
fn writable(
    node: &Node,
    channel: &ChannelName,
    request: &StreamRequest<'_>,
) -> NodeResult<herald_core::Lease> {
    if node.publisher().shutdown.is_cancelled() {
        return Err(NodeError::Draining);
    }
    node.lease()
        .writable_lease()
        .ok_or_else(|| NodeError::NotHolder {
            request: Some(request.write(channel)),
            holder_url: node.lease().state().holder_url().map(str::to_owned),
        })
}

/// Waits for the writer's answer `reply`.
async fn answered<T>(
    node: &Node,
    channel: &ChannelName,
    reply: tokio::sync::oneshot::Receiver<NodeResult<T>>,
) -> NodeResult<T> {
    reply.await.map_err(|_| {
        // The writer dropped the request without answering: it is gone.
        if node.publisher().shutdown.is_cancelled() {
            NodeError::Draining
        } else {
            tracing::error!(channel = %channel, "writer task ended without answering");
            NodeError::Internal("writer task ended".to_owned())
        }
    })?
}

/// Creates the stream `create` describes (see `Storage::create_stream`):
/// here on the holder (an expired stream in the way is deleted first), or
/// forwarded from a standby.
///
/// # Errors
/// [`NodeError::NotHolder`] for a forwarded request on a standby,
/// [`NodeError::NoHolder`] when no holder can take it,
/// [`NodeError::LeaseLost`], [`NodeError::Draining`],
/// [`NodeError::Storage`].
pub async fn create_stream(
    node: &Node,
    create: StreamCreate,
    request: StreamRequest<'_>,
) -> NodeResult<Routed<StreamCreated>> {
    let channel = create.channel.clone();
    let holder = request.holder(&channel, true);
    on_holder(&node.publisher(), holder, || async {
        writable(node, &channel, &request)?;
        let writer = node.publisher().writer;
        let mut created = answered(node, &channel, writer.submit_create(create.clone())?).await?;
        if created == StreamCreated::Expired {
            retention::delete_channel(
                node.storage().as_ref(),
                node.lease().as_ref(),
                node.hub(),
                node.config().trim_pacing.batch,
                &channel,
            )
            .await?;
            created = answered(node, &channel, writer.submit_create(create)?).await?;
        }
        Ok(created)
    })
    .await
}

/// Appends to a stream, closes it, or both (see `Storage::write`): here on
/// the holder, group-committed by the writer with what is queued with it,
/// or forwarded from a standby.
///
/// # Errors
/// As [`create_stream`].
pub async fn append_stream(
    node: &Node,
    append: StreamAppend,
    request: StreamRequest<'_>,
) -> NodeResult<Routed<StreamAppended>> {
    let channel = append.channel.clone();
    let exactly_once = append.producer.is_some();
    let holder = request.holder(&channel, exactly_once);
    on_holder(&node.publisher(), holder, || async {
        writable(node, &channel, &request)?;
        let reply = node.publisher().writer.submit_stream(append)?;
        answered(node, &channel, reply).await
    })
    .await
}

/// What a deletion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamDeleted {
    /// The stream is deleted, with its messages.
    Deleted,
    /// No live stream has this name; nothing changed.
    NotFound,
}

/// Deletes the stream `channel` (its messages, then its record, as
/// `retention::delete_channel` does any channel): here on the holder, or
/// forwarded. The stream is first marked deleted
/// (`Storage::soft_delete_stream`), so that no append is acknowledged
/// while its messages are removed. Its forks hold their own copies of what
/// they inherited: they live on, forks of it no more, and the name can be
/// created again at once. A source marked deleted (as deletions did while
/// forks of it lived) whose forks are all gone is deleted too, up the
/// chain of forks.
///
/// # Errors
/// As [`create_stream`].
pub async fn delete_stream(
    node: &Node,
    channel: &ChannelName,
    request: StreamRequest<'_>,
) -> NodeResult<Routed<StreamDeleted>> {
    let holder = request.holder(channel, false);
    on_holder(&node.publisher(), holder, || async {
        let lease = writable(node, channel, &request)?;
        let Some(info) = stream_info(node, channel).await? else {
            return Ok(StreamDeleted::NotFound);
        };
        // Marked first: from then on an append is refused (`Gone`), so
        // none is acknowledged while the messages are being removed.
        node.storage()
            .soft_delete_stream(&lease, channel)
            .await
            .map_err(|e| failed(node, e, "soft_delete_stream", channel))?;
        delete(node, channel).await?;
        let mut parent = info.fork_of;
        while let Some(source) = parent {
            match stream_info(node, &source).await? {
                Some(up) if up.soft_deleted && up.live_forks == 0 => {
                    delete(node, &source).await?;
                    parent = up.fork_of;
                }
                _ => break,
            }
        }
        Ok(StreamDeleted::Deleted)
    })
    .await
}

/// The stream `channel` as the storage holds it now.
async fn stream_info(
    node: &Node,
    channel: &ChannelName,
) -> NodeResult<Option<herald_core::StreamInfo>> {
    node.storage()
        .stream_info(channel)
        .await
        .map_err(|e| failed(node, e, "stream_info", channel))
}

/// Deletes `channel` here, as every channel is deleted.
async fn delete(node: &Node, channel: &ChannelName) -> NodeResult<()> {
    retention::delete_channel(
        node.storage().as_ref(),
        node.lease().as_ref(),
        node.hub(),
        node.config().trim_pacing.batch,
        channel,
    )
    .await
    .map(drop)
}
