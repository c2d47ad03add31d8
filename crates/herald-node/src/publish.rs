//! The node's one publish routine, for every protocol wing (API v1's
//! single and batch publish, Centrifugo's client `publish` and server API
//! `publish` and `broadcast`), made through the one holder-only write
//! routine (`holder_write.rs`): on the holder this node's writer commits
//! it; on a standby it is forwarded once to the holder (`forward.rs`); if
//! this node takes the lease over before the holder answered, it commits
//! it itself, but only when every message carries an idempotency key
//! (see [`publish`]). The outcome is typed ([`Published`],
//! [`BatchPublished`]); each wing makes its own answer of it. Rights,
//! rate limits, size limits and the drain check are the wing's, before.

use std::future::Future;

use bytes::Bytes;
use herald_core::{Appended, NewMessage};
use http::HeaderMap;

use crate::forward::{self, CarriedHeaders, HolderAnswer};
use crate::holder_write::{self, HolderRequest};
pub use crate::holder_write::{Publisher, Routed};
use crate::node_error::{HolderWrite, NodeError, NodeResult};

/// How a publish reached this node, which decides what a standby forwards.
#[derive(Debug)]
pub enum Received<'a> {
    /// As an HTTP request of Herald's API: its headers (`Idempotency-Key`,
    /// `Content-Type`, and whether a node forwarded it already) and its
    /// body exactly as received, forwarded unchanged.
    Http {
        /// The request's headers.
        headers: &'a HeaderMap,
        /// The request's body, as received.
        body: Bytes,
    },
    /// From another protocol: the holder gets the message as a Herald
    /// publish (its data, tags and idempotency key).
    Message,
}

/// How a publish ended when it did not fail. The holder's own outcomes
/// (`Created`, `Duplicate`) are also those of a standby that took the
/// lease over while it forwarded the publish.
#[derive(Debug)]
pub enum Published {
    /// This node committed it.
    Created(Appended),
    /// This node found its idempotency key already used on the channel,
    /// and stored nothing: the original offset and time.
    Duplicate(Appended),
    /// This node, a standby, handed it to the holder: the holder's answer.
    Forwarded(HolderAnswer),
}

impl Published {
    /// The `result` label of `herald_publish_*`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Created(_) => "created",
            Self::Duplicate(_) => "duplicate",
            Self::Forwarded(_) => "forwarded",
        }
    }
}

/// How a batch publish ended when it did not fail.
#[derive(Debug)]
pub enum BatchPublished {
    /// This node committed it (or found every key used), in the order of
    /// the batch.
    Committed(Vec<Appended>),
    /// This node, a standby, forwarded it: the holder's answer.
    Forwarded(HolderAnswer),
}

/// Publishes `message`: commits it here on the holder, or forwards it
/// once to the holder on a standby (as `received` says). When this node
/// takes the lease over before the holder answered, the old holder may
/// have committed it just before it lost the lease, and can commit
/// nothing after that. With an idempotency key, this node, holder now,
/// commits it itself: its fenced write runs after the old holder's last
/// commit (a takeover waits for the write transactions in flight, and a
/// later one fails its fencing check), and finds the key there if the old
/// holder stored it, so the outcome is `Duplicate` with the original
/// offset, or `Created` for a message stored once, here. Without a key a
/// second copy could not be told from the first: `NoHolder` (outcome
/// unknown) at once, and the client's retry reaches the new holder.
///
/// # Errors
/// The writer's ([`NodeError::QueueFull`], [`NodeError::LeaseLost`],
/// [`NodeError::Storage`], ...) and the forwarding's
/// ([`NodeError::NoHolder`], [`NodeError::NotHolder`] for a request
/// another node forwarded already). After a takeover, every error that
/// would say "nothing was stored" (`QueueFull`, `LeaseLost`, `Draining`,
/// `NotHolder`) is `NoHolder`: it speaks for this node only, not for the
/// old holder.
pub async fn publish(
    node: &Publisher<'_>,
    message: NewMessage,
    received: Received<'_>,
) -> NodeResult<Published> {
    let keyed = message.idempotency_key.is_some();
    let write = HolderWrite::Publish(message.channel.clone());
    let own;
    let (headers, body) = match received {
        Received::Http { headers, body } => (headers, body),
        Received::Message => {
            let (headers, body) = forward::publish_request(&message);
            own = headers;
            (&own, body)
        }
    };
    let routed = route(node, write, keyed, headers, body, || commit(node, message)).await?;
    Ok(match routed {
        Routed::Here(appended) if appended.duplicate => Published::Duplicate(appended),
        Routed::Here(appended) => Published::Created(appended),
        Routed::Holder(answer) => Published::Forwarded(answer),
    })
}

/// Publishes `messages` in one transaction, as [`publish`] does one: the
/// request (`headers`, `body` as received) is forwarded unchanged on a
/// standby; after a takeover, this node commits it only when every entry
/// carries an idempotency key.
///
/// # Errors
/// As [`publish`].
pub async fn publish_batch(
    node: &Publisher<'_>,
    messages: Vec<NewMessage>,
    headers: &HeaderMap,
    body: Bytes,
) -> NodeResult<BatchPublished> {
    let keyed = messages.iter().all(|m| m.idempotency_key.is_some());
    let write = HolderWrite::BatchPublish;
    let routed = route(node, write, keyed, headers, body, || {
        commit_batch(node, messages)
    })
    .await?;
    Ok(match routed {
        Routed::Here(appended) => BatchPublished::Committed(appended),
        Routed::Holder(answer) => BatchPublished::Forwarded(answer),
    })
}

/// Makes `write` through [`holder_write::on_holder`], with no header
/// carried beyond those every forward carries.
async fn route<T, F, Fut>(
    node: &Publisher<'_>,
    write: HolderWrite,
    keyed: bool,
    headers: &HeaderMap,
    body: Bytes,
    commit: F,
) -> NodeResult<Routed<T>>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = NodeResult<T>>,
{
    let request = HolderRequest {
        write,
        headers,
        body,
        carry: CarriedHeaders::NONE,
        repeatable: keyed,
    };
    holder_write::on_holder(node, request, commit).await
}

/// Hands `message` to this node's writer and waits for the commit (or the
/// original, for a repeated idempotency key).
async fn commit(node: &Publisher<'_>, message: NewMessage) -> NodeResult<Appended> {
    let channel = message.channel.clone();
    let reply = node.writer.submit(message)?;
    reply.await.map_err(|_| {
        // The writer dropped the request without answering: it is gone.
        if node.shutdown.is_cancelled() {
            NodeError::Draining
        } else {
            tracing::error!(channel = %channel, "writer task ended without answering");
            NodeError::Internal("writer task ended".to_owned())
        }
    })?
}

/// Hands the batch to this node's writer and waits for the commit.
async fn commit_batch(
    node: &Publisher<'_>,
    messages: Vec<NewMessage>,
) -> NodeResult<Vec<Appended>> {
    let reply = node.writer.submit_batch(messages)?;
    reply.await.map_err(|_| {
        if node.shutdown.is_cancelled() {
            NodeError::Draining
        } else {
            tracing::error!("writer task ended without answering a batch publish");
            NodeError::Internal("writer task ended".to_owned())
        }
    })?
}
