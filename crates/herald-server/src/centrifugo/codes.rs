//! Centrifugo's client error codes (100–112, in replies to commands) and
//! disconnect codes (WebSocket close codes: 3000–3499 the client
//! reconnects, 3500 and above it does not), with their meanings as listed
//! in Centrifugo's documentation, "Error and disconnect codes". Only the
//! codes Herald sends are here: 102 "unknown channel" never applies (a
//! channel in a namespace without rules follows the default namespace).

use herald_node::node_error::NodeError;
use serde::{Deserialize, Serialize};

/// An error in a reply: `{"code":N,"message":"..."}`, plus
/// `"temporary":true` for errors worth retrying (internal error, too many
/// requests), as Centrifugo marks them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplyError {
    /// The code, 100–112.
    pub(crate) code: u32,
    /// Centrifugo's message for the code.
    pub(crate) message: String,
    /// Set for the codes a client may retry at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) temporary: bool,
}

macro_rules! reply_errors {
    ($($name:ident = $code:literal, $message:literal, $temporary:literal;)*) => {
        impl ReplyError {
            $(
                #[doc = concat!("Code ", stringify!($code), ", \"", $message, "\".")]
                pub(crate) fn $name() -> Self {
                    Self { code: $code, message: $message.to_owned(), temporary: $temporary }
                }
            )*
        }
    };
}

reply_errors! {
    internal = 100, "internal server error", true;
    unauthorized = 101, "unauthorized", false;
    permission_denied = 103, "permission denied", false;
    method_not_found = 104, "method not found", false;
    already_subscribed = 105, "already subscribed", false;
    limit_exceeded = 106, "limit exceeded", false;
    bad_request = 107, "bad request", false;
    not_available = 108, "not available", false;
    token_expired = 109, "token expired", false;
    too_many_requests = 111, "too many requests", true;
    unrecoverable_position = 112, "unrecoverable position", false;
}

impl ReplyError {
    /// Maps an error of the node's core to the nearest Centrifugo code,
    /// by Centrifugo's own meanings (not through an HTTP status): what the
    /// request asked that the channel refuses (a reused idempotency key, a
    /// closed or expired stream, a stream of another content type, a
    /// resume point beyond the head) → 107 "bad request"; everything the
    /// client cannot fix (no holder, a full queue, a lost lease, the
    /// storage down, draining, a bug) → 100 "internal server error"
    /// (temporary); an entry of a batch → its own error's code.
    pub(crate) fn from_node_error(e: &NodeError) -> Self {
        match e {
            NodeError::IdempotencyKeyReused
            | NodeError::ChannelClosed
            | NodeError::ContentTypeMismatch
            | NodeError::StreamExpired
            | NodeError::OffsetBeyondHead { .. } => Self::bad_request(),
            NodeError::NotHolder { .. }
            | NodeError::NoHolder
            | NodeError::QueueFull
            | NodeError::LeaseLost
            | NodeError::Storage(_)
            | NodeError::StorageUnavailable
            | NodeError::Draining
            | NodeError::Internal(_) => Self::internal(),
            NodeError::InBatchEntry { error, .. } => Self::from_node_error(error),
        }
    }
}

/// A disconnect: the WebSocket close code and reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Disconnect {
    /// Close code (RFC 6455 §7.4.2 private range as Centrifugo uses it).
    pub(crate) code: u16,
    /// Centrifugo's reason text.
    pub(crate) reason: &'static str,
}

macro_rules! disconnects {
    ($($name:ident = $code:literal, $reason:literal;)*) => {
        $(
            #[doc = concat!("Close code ", stringify!($code), ", \"", $reason, "\".")]
            pub(crate) const $name: Disconnect = Disconnect { code: $code, reason: $reason };
        )*
    };
}

disconnects! {
    SHUTDOWN = 3001, "shutdown";
    SERVER_ERROR = 3004, "internal server error";
    EXPIRED = 3005, "connection expired";
    SUB_EXPIRED = 3006, "subscription expired";
    SLOW = 3008, "slow";
    INSUFFICIENT_STATE = 3010, "insufficient state";
    FORCE_RECONNECT = 3011, "force reconnect";
    NO_PONG = 3012, "no pong";
    TOO_MANY_REQUESTS = 3013, "too many requests";
    INVALID_TOKEN = 3500, "invalid token";
    BAD_REQUEST = 3501, "bad request";
    STALE = 3502, "stale";
    FORCE_NO_RECONNECT = 3503, "force disconnect";
    CHANNEL_LIMIT = 3505, "channel limit";
    NOT_AVAILABLE = 3508, "not available";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each error of the node's core has the Centrifugo code its meaning
    /// calls for, also inside a batch entry.
    #[test]
    fn node_errors_have_centrifugo_codes() {
        let cases = [
            (NodeError::IdempotencyKeyReused, 107),
            (NodeError::ChannelClosed, 107),
            (NodeError::ContentTypeMismatch, 107),
            (NodeError::StreamExpired, 107),
            (NodeError::OffsetBeyondHead { after: 5, head: 1 }, 107),
            (
                NodeError::NotHolder {
                    request: None,
                    holder_url: None,
                },
                100,
            ),
            (NodeError::NoHolder, 100),
            (NodeError::QueueFull, 100),
            (NodeError::LeaseLost, 100),
            (NodeError::StorageUnavailable, 100),
            (NodeError::Draining, 100),
            (NodeError::Internal("x".to_owned()), 100),
            (
                NodeError::InBatchEntry {
                    index: 1,
                    error: Box::new(NodeError::ChannelClosed),
                },
                107,
            ),
        ];
        for (e, code) in cases {
            let reply = ReplyError::from_node_error(&e);
            assert_eq!(reply.code, code, "{e:?}");
            assert_eq!(reply.temporary, code == 100, "{e:?}");
        }
    }
}
