//! Durable Streams' writes on a node: a stream's creation, an append (with
//! its closure) and a deletion, made here on the holder as fenced storage
//! writes (`Storage::create_stream`, `append_stream`, and the channel
//! deletion of `retention`), or forwarded once to the holder from a
//! standby, as publishes are (`publish.rs`). After each write made here the
//! hub is told, so that live readers on this node wake at once; standbys
//! hear of new messages through their feed.
//!
//! After a takeover that ends a forward (the old holder is fenced from
//! then on), this node makes the write itself only when a retry cannot
//! repeat it: a creation (idempotent), and an append whose producer
//! sequence makes it exactly-once. Any other write is answered `no_holder`
//! (outcome unknown).

use bytes::Bytes;
use herald_core::{
    ChannelName, Message, Offset, Payload, StreamAppend, StreamAppended, StreamCreate,
    StreamCreated, Tags,
};
use http::{HeaderMap, Method};

use crate::hub::Notice;
use crate::node::Node;
use crate::node_error::{HolderWrite, NodeError, NodeResult, StorageFailure};
use crate::publish::{route, Routed};
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
}

impl StreamRequest<'_> {
    fn write(&self, channel: &ChannelName) -> HolderWrite {
        HolderWrite::Stream {
            method: self.method.clone(),
            path: self.path.clone(),
            channel: channel.clone(),
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

/// Tells this node's live readers of `channel` that its head is `head`,
/// with the messages `first..=head` when some were written, and whether
/// the stream is `closed` after this write.
fn tell_hub(
    node: &Node,
    channel: &ChannelName,
    first: Offset,
    head: Offset,
    messages: &[Payload],
    at: i64,
    closed: bool,
) {
    let messages = messages
        .iter()
        .zip(first..)
        .map(|(data, offset)| Message {
            offset,
            data: data.clone(),
            published_at_ms: at,
            tags: Tags::default(),
        })
        .collect();
    node.hub().publish(Notice {
        channel: channel.clone(),
        head,
        messages,
        deleted: None,
        closed,
    });
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
    let write = request.write(&channel);
    route(
        &node.publisher(),
        write,
        true,
        request.headers,
        request.body.clone(),
        || async {
            let lease = writable(node, &channel, &request)?;
            let mut created = node
                .storage()
                .create_stream(&lease, &create)
                .await
                .map_err(|e| failed(node, e, "create_stream", &channel))?;
            if created == StreamCreated::Expired {
                retention::delete_channel(
                    node.storage().as_ref(),
                    node.lease().as_ref(),
                    node.hub(),
                    node.config().trim_pacing.batch,
                    &channel,
                )
                .await?;
                created = node
                    .storage()
                    .create_stream(&lease, &create)
                    .await
                    .map_err(|e| failed(node, e, "create_stream", &channel))?;
            }
            if let StreamCreated::Created {
                info,
                published_at_ms,
            } = &created
            {
                let count = create.messages.len() as Offset;
                if count > 0 {
                    tell_hub(
                        node,
                        &channel,
                        info.head + 1 - count,
                        info.head,
                        &create.messages,
                        *published_at_ms,
                        info.closed,
                    );
                }
            }
            Ok(created)
        },
    )
    .await
}

/// Appends to a stream, closes it, or both (see `Storage::append_stream`):
/// here on the holder, or forwarded from a standby.
///
/// # Errors
/// As [`create_stream`].
pub async fn append_stream(
    node: &Node,
    append: StreamAppend,
    request: StreamRequest<'_>,
) -> NodeResult<Routed<StreamAppended>> {
    let channel = append.channel.clone();
    let write = request.write(&channel);
    let exactly_once = append.producer.is_some();
    route(
        &node.publisher(),
        write,
        exactly_once,
        request.headers,
        request.body.clone(),
        || async {
            let lease = writable(node, &channel, &request)?;
            let appended = node
                .storage()
                .append_stream(&lease, &append)
                .await
                .map_err(|e| failed(node, e, "append_stream", &channel))?;
            if let StreamAppended::Appended {
                first,
                head,
                published_at_ms,
                closed,
            } = &appended
            {
                // A close alone wakes the live readers too: they see the end.
                tell_hub(
                    node,
                    &channel,
                    *first,
                    *head,
                    &append.messages,
                    *published_at_ms,
                    *closed,
                );
            }
            Ok(appended)
        },
    )
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
    let write = request.write(channel);
    route(
        &node.publisher(),
        write,
        false,
        request.headers,
        request.body.clone(),
        || async {
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
        },
    )
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
