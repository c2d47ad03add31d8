//! Centrifugo's client error codes (100–112, in replies to commands) and
//! disconnect codes (WebSocket close codes: 3000–3499 the client
//! reconnects, 3500 and above it does not), with their meanings as listed
//! in Centrifugo's documentation, "Error and disconnect codes". Only the
//! codes Herald sends are here: 102 "unknown channel" never applies (a
//! channel in a namespace without rules follows the default namespace).

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
    /// Maps a Herald error to the nearest Centrifugo code: credentials →
    /// 101 (109 for an expired token), not allowed → 103, rate limited →
    /// 111, bad input → 107, a message too large → 106, everything the
    /// client cannot fix (storage down, no holder, draining) → 100.
    pub(crate) fn from_error(e: &crate::error::Error) -> Self {
        use crate::error::Error;
        use herald_auth::AuthError;
        match e {
            Error::Auth(AuthError::TokenExpired) => Self::token_expired(),
            Error::Auth(AuthError::Forbidden(_)) => Self::permission_denied(),
            Error::Auth(AuthError::RateLimited { .. }) => Self::too_many_requests(),
            Error::Auth(_) => Self::unauthorized(),
            Error::PayloadTooLarge { .. } => Self::limit_exceeded(),
            e if e.status().is_client_error() => Self::bad_request(),
            _ => Self::internal(),
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
