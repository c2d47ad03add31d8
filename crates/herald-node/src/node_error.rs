//! The node core's errors: [`NodeError`], what the writer, the
//! subscription, the forwarding, the retention and channel administration
//! return (no HTTP in it: each protocol wing maps it to its own answer,
//! the HTTP API with `error.rs`'s `From<NodeError>`), and [`StartError`],
//! why the node could not start. With them the pieces they carry: the
//! holder-only write a refusal names ([`HolderWrite`]) and a storage
//! failure with what was asked ([`StorageFailure`]).

use herald_core::{ChannelName, Offset};

/// Result alias for the node's core.
pub type NodeResult<T, E = NodeError> = std::result::Result<T, E>;

/// Everything that can go wrong in the node's core. The messages are
/// those the HTTP API shows for the same errors.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The `Idempotency-Key` was already used on this channel for a
    /// different message (another `data`): nothing was stored.
    #[error(
        "the Idempotency-Key was already used on this channel for a different message; \
         a retry must send the same data, a new message needs a new key"
    )]
    IdempotencyKeyReused,
    /// The channel is a closed stream (Durable Streams): it takes no more
    /// messages. Nothing was stored.
    #[error("the channel is a closed stream and takes no more messages")]
    ChannelClosed,
    /// The channel is a stream whose content type is not JSON (Durable
    /// Streams): Herald's API and Centrifugo publish only JSON. Nothing was
    /// stored.
    #[error("the channel is a stream of another content type than JSON")]
    ContentTypeMismatch,
    /// The channel is a Durable Streams stream that expired (its TTL or
    /// expiry time passed): it reads as deleted and takes no message until
    /// the holder's retention task deletes it. Nothing was stored.
    #[error("the channel is a stream that expired; it is deleted shortly, and a publish then creates the channel afresh")]
    StreamExpired,
    /// The resume point is beyond the channel's head as the storage reads
    /// it: the channel never had that offset.
    #[error("the resume point {after} is beyond the channel's head {head}; resume from an offset up to the head")]
    OffsetBeyondHead {
        /// The resume point asked for.
        after: Offset,
        /// The channel's head, read from the storage.
        head: Offset,
    },
    /// This node does not hold the writer lease, and `request` needs the
    /// holder: a write this node may not forward (a request another node
    /// forwarded already, one hop only) or could not make after all (the
    /// lease was lost meanwhile), or the holder probe (`None`).
    /// `holder_url` is the holder's advertised URL when known.
    #[error("{}", not_holder_message(request.as_ref()))]
    NotHolder {
        /// The write that needs the holder; `None` for the holder probe.
        request: Option<HolderWrite>,
        /// The holder's advertised URL, if this node knows it.
        holder_url: Option<String>,
    },
    /// This node is a standby and could not hand the write to a holder:
    /// it knows none, or the holder did not answer (connect error,
    /// timeout, broken answer).
    #[error("no holder could take the publish")]
    NoHolder,
    /// The writer's queue is full.
    #[error("the publish queue is full")]
    QueueFull,
    /// The storage refused the fenced write: another node holds the lease
    /// now. Nothing was written.
    #[error("this node lost the writer lease")]
    LeaseLost,
    /// A storage call failed; the source holds the storage's error and
    /// what was asked. Logged where the error ends.
    #[error("the storage is unavailable")]
    Storage(#[from] StorageFailure),
    /// The storage failed a whole batch of publishes, which the writer
    /// logged once for all of them. Nothing was written, or the outcome is
    /// unknown.
    #[error("the storage is unavailable")]
    StorageUnavailable,
    /// The node is shutting down and takes no new work.
    #[error("the node is draining")]
    Draining,
    /// A bug: a broken internal invariant; details are in the log.
    #[error("internal error: {0}")]
    Internal(String),
    /// Entry `index` (from 0) of a batch publish failed with `error`;
    /// nothing of the batch was stored.
    #[error("messages[{index}]: {error}")]
    InBatchEntry {
        /// The entry's position in the batch, from 0.
        index: usize,
        /// What is wrong with it.
        error: Box<NodeError>,
    },
}

impl NodeError {
    /// Logs what the error holds that a client is not told: the storage
    /// failure of a [`NodeError::Storage`] (see [`StorageFailure`]). Call
    /// it once, where the error ends (a stream it ends, or an answer).
    pub fn log(&self) {
        if let Self::Storage(failure) = self {
            failure.log();
        }
    }
}

/// A write that only the holder makes: a standby forwards it to the
/// holder (`forward.rs`), and names it when it answers `not_holder`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderWrite {
    /// `POST /v1/channels/{channel}/messages`, and Centrifugo's
    /// `publish` and `broadcast` (one per channel), which are forwarded
    /// as such.
    Publish(ChannelName),
    /// `POST /v1/messages`.
    BatchPublish,
    /// `DELETE /v1/channels/{channel}`.
    DeleteChannel(ChannelName),
    /// Centrifugo's server API `history_remove`.
    RemoveHistory(ChannelName),
    /// A Durable Streams write (`PUT`, `POST` or `DELETE` of a stream):
    /// forwarded as the same method to the same `path` on the holder.
    Stream {
        /// The request's method.
        method: http::Method,
        /// The request's path and query, as received (the wing's prefix
        /// included).
        path: String,
        /// The stream's channel.
        channel: ChannelName,
    },
}

impl std::fmt::Display for HolderWrite {
    /// The write in words, as a refusal names it: `publishing to orders`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Publish(channel) => write!(f, "publishing to {channel}"),
            Self::BatchPublish => f.write_str("a batch publish"),
            Self::DeleteChannel(channel) => write!(f, "deleting channel {channel}"),
            Self::RemoveHistory(channel) => write!(f, "removing the history of {channel}"),
            Self::Stream {
                method, channel, ..
            } => write!(f, "{method} of stream {channel}"),
        }
    }
}

/// The message of [`NodeError::NotHolder`] (and of the HTTP error's): names the write that needs the
/// holder (or the holder probe), and where the holder is.
pub fn not_holder_message(request: Option<&HolderWrite>) -> String {
    match request {
        Some(write) => format!(
            "{write} needs the holder, and this node is not the holder (nor forwards a \
             request another node forwarded); send it to the holder (holder_url), or retry"
        ),
        None => "this node is a standby, not the holder (holder_url)".to_owned(),
    }
}

/// A storage error and what the server asked the storage for: the source
/// of a [`NodeError::Storage`] (and of the HTTP error's). Handlers make it by naming what they asked
/// the storage for: `.during("read", Some(&channel))?`.
///
/// It is logged once, by whoever ends it: the HTTP error's `into_response` when it
/// becomes an answer, the SSE or WebSocket session whose stream it ends,
/// the writer when it fails a whole batch, `/v1/status` when it shows the
/// lease as `null`. The record is a WARN `storage unavailable` for a
/// storage that did not answer (a retry may cure it), else an ERROR
/// `storage failed`, with the fields `operation`, `channel` and `error`.
#[derive(Debug, thiserror::Error)]
#[error("storage operation {operation} failed")]
pub struct StorageFailure {
    /// What was asked: `read`, `channels`, `ping`, `lease_info`, `append`.
    operation: &'static str,
    /// The channel it concerned, if one.
    channel: Option<ChannelName>,
    /// The storage's answer.
    #[source]
    error: herald_storage::Error,
}

impl StorageFailure {
    /// `error`, met while asking the storage for `operation` (on
    /// `channel`, if one).
    pub fn new(
        operation: &'static str,
        channel: Option<&ChannelName>,
        error: herald_storage::Error,
    ) -> Self {
        Self {
            operation,
            channel: channel.cloned(),
            error,
        }
    }

    /// Logs the failure (see [`StorageFailure`]): WARN for a storage that
    /// did not answer or a lease lost under a write, which the node
    /// handles itself; ERROR for anything a human must look at.
    pub fn log(&self) {
        let Self {
            operation,
            channel,
            error,
        } = self;
        let channel = channel.as_ref().map(ChannelName::as_str);
        match error {
            herald_storage::Error::Unavailable { .. } | herald_storage::Error::LeaseLost { .. } => {
                tracing::warn!(operation, channel, error = %error, "storage unavailable");
            }
            _ => tracing::error!(operation, channel, error = %error, "storage failed"),
        }
    }
}

/// Names what a storage call was for, so that `?` turns its error into an
/// [`NodeError::Storage`]:
/// `storage.read(&channel, after, limit).await.during("read", Some(&channel))?`.
pub trait StorageContext<T> {
    /// The value, or a [`StorageFailure`] for `operation` on `channel`.
    fn during(
        self,
        operation: &'static str,
        channel: Option<&ChannelName>,
    ) -> Result<T, StorageFailure>;
}

impl<T> StorageContext<T> for herald_storage::Result<T> {
    fn during(
        self,
        operation: &'static str,
        channel: Option<&ChannelName>,
    ) -> Result<T, StorageFailure> {
        self.map_err(|error| StorageFailure::new(operation, channel, error))
    }
}

/// Why the node (or the server around it) could not start: herald-server's
/// `serve`, `AppState::start` and `ServerConfig::validate` return it too.
/// Never an HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is unusable: the message names it.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// The TLS certificate or key cannot be used (at start, or at a reload,
    /// which then keeps the certificate in use): the message names the
    /// file.
    #[error("TLS: {0}")]
    Tls(String),
    /// The storage failed before the server could serve (reading its
    /// change cursor). The storage's error is also the source.
    #[error("storage: {0}")]
    Storage(#[from] herald_storage::Error),
}

/// Access control that cannot be built from its settings (herald-server
/// builds it at start): [`StartError::Config`] with the message naming the
/// setting.
impl From<herald_auth::AuthError> for StartError {
    fn from(e: herald_auth::AuthError) -> Self {
        match e {
            herald_auth::AuthError::Config(message) => Self::Config(message),
            other => Self::Config(other.to_string()),
        }
    }
}
