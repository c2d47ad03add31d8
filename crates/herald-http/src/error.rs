//! [`Error`], which becomes an HTTP answer: the request's own errors and,
//! through `From<NodeError>`, the node core's (`node_error.rs`).
//!
//! Every error answer has the body `{"error":{"code","message"}}` (plus
//! `holder_url` for `not_holder`, `head` for `offset_beyond_head`). The code is stable and documented in
//! `docs/api.md`; the message is for humans. Internal details (storage
//! error text) never reach the client: they go to the log, once, where the
//! error ends (see [`StorageFailure`]).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use herald_auth::AuthError;
use herald_node::node_error::{not_holder_message, HolderWrite, NodeError, StorageFailure};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while the server answers a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `{channel}` path segment breaks the channel name rules
    /// (`herald_core::ChannelName`). 400 `invalid_channel`.
    #[error("invalid channel name: {0}")]
    InvalidChannel(String),
    /// The `Idempotency-Key` header is empty, too long or not visible
    /// ASCII. 400 `invalid_idempotency_key`.
    #[error("invalid Idempotency-Key header: {0}")]
    InvalidIdempotencyKey(String),
    /// The publish body is not JSON at all. 400 `invalid_json`.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// The publish body is JSON but not exactly `{"data": <value>}` (with
    /// optional `"tags"`). 400 `invalid_body`.
    #[error("request body must be the object {{\"data\": <any JSON value>}}, with optional \"tags\": {{<string>: <string>}}: {0}")]
    InvalidBody(String),
    /// A query parameter is missing its number or out of range.
    /// 400 `invalid_query`.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// The `Last-Event-ID` header is not exactly a non-negative decimal
    /// integer (digits only), or is given more than once.
    /// 400 `invalid_last_event_id`.
    #[error("invalid Last-Event-ID header: it must be a non-negative integer (an offset)")]
    InvalidLastEventId,
    /// The resume point (`?after=N` or `Last-Event-ID`) is beyond the
    /// channel's head as the storage reads it: the channel never had that
    /// offset, so the cursor comes from elsewhere (another database, a
    /// restore). 409 `offset_beyond_head`, with `head` in the body.
    #[error("the resume point {after} is beyond the channel's head {head}; resume from an offset up to the head")]
    OffsetBeyondHead {
        /// The resume point asked for.
        after: herald_core::Offset,
        /// The channel's head, read from the storage.
        head: herald_core::Offset,
    },
    /// A request to the WebSocket route is not a valid upgrade (RFC 6455
    /// §4.2.1). 400 `invalid_upgrade`.
    #[error("not a WebSocket upgrade request: {0}")]
    InvalidUpgrade(String),
    /// The `Idempotency-Key` was already used on this channel for a
    /// different message (another `data`): nothing was stored. The IETF
    /// Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header,
    /// "Error Scenarios") answers a key reused with a different payload
    /// with 422. 422 `idempotency_key_reused`.
    #[error(
        "the Idempotency-Key was already used on this channel for a different message; \
         a retry must send the same data, a new message needs a new key"
    )]
    IdempotencyKeyReused,
    /// The channel is a closed stream (Durable Streams `Stream-Closed`):
    /// it takes no more messages. 409 `channel_closed`.
    #[error("the channel is a closed stream and takes no more messages")]
    ChannelClosed,
    /// The channel is a Durable Streams stream whose content type is not
    /// JSON: Herald's API and Centrifugo publish only JSON.
    /// 409 `content_type_mismatch`.
    #[error("the channel is a stream of another content type than JSON; append to it with the Durable Streams API")]
    ContentTypeMismatch,
    /// The channel is a Durable Streams stream that expired: it reads as
    /// deleted and takes no message until the holder's retention task
    /// deletes it (within a trim interval); a publish after that creates
    /// the channel afresh. 410 `stream_expired`.
    #[error("the channel is a stream that expired; it is deleted within a retention trim interval, and a publish after that creates the channel afresh")]
    StreamExpired,
    /// No live Durable Streams stream at this path (never created,
    /// deleted, or expired). 404 `stream_not_found`.
    #[error("no stream at this path")]
    StreamNotFound,
    /// The stream is being deleted (or was deleted, by an older version,
    /// while forks of it remained): its URL is gone until its deletion
    /// ends. 410 `stream_gone`.
    #[error("the stream is being deleted")]
    StreamGone,
    /// A Durable Streams request that breaks the protocol's rules (a
    /// header or query value, an empty append, JSON that does not parse).
    /// 400 `invalid_stream_request`.
    #[error("{0}")]
    InvalidStreamRequest(String),
    /// A Durable Streams request that conflicts with the stream: another
    /// configuration on a repeated creation, another content type, a
    /// `Stream-Seq` not above the last. 409 `stream_conflict`.
    #[error("{0}")]
    StreamConflict(String),
    /// A fork that would copy more of its source than
    /// `durable_streams.max_fork_messages` or `max_fork_bytes` allow; the
    /// message names the limit. 413 `fork_too_large`.
    #[error("{0}")]
    ForkTooLarge(String),
    /// An append to a closed stream. 409 `stream_closed`, with
    /// `Stream-Closed: true` and `Stream-Next-Offset` (the final offset).
    #[error("the stream is closed and takes no more appends")]
    StreamClosed {
        /// The stream's final offset, as a Durable Streams offset.
        next_offset: String,
    },
    /// An idempotent producer writes in an older epoch than the stream
    /// knows. 403 `stale_producer_epoch`, with `Producer-Epoch`.
    #[error("producer epoch is stale; the current epoch is {epoch}")]
    StaleProducerEpoch {
        /// The producer's current epoch.
        epoch: u64,
    },
    /// An idempotent producer's sequence number skips ahead.
    /// 409 `producer_seq_gap`, with `Producer-Expected-Seq` and
    /// `Producer-Received-Seq`.
    #[error("producer sequence gap: expected {expected}, received {received}")]
    ProducerSeqGap {
        /// The next sequence number the stream expects.
        expected: u64,
        /// The one the request carried.
        received: u64,
    },
    /// An append of an idempotent producer new to a stream that keeps
    /// state for as many producers as `durable_streams.max_producers_per_stream`
    /// already (none of them idle longer than
    /// `durable_streams.producer_idle_timeout`). 409 `too_many_producers`;
    /// nothing is stored.
    #[error(
        "the stream keeps state for {limit} producers already; a new Producer-Id is admitted \
         once one of them is idle long enough to be forgotten"
    )]
    TooManyProducers {
        /// The limit, `durable_streams.max_producers_per_stream`.
        limit: u64,
    },
    /// A read from an offset that retention or a deletion removed.
    /// 410 `offset_gone`, with the stream's `earliest` offset (a Herald
    /// offset) in the body.
    #[error("the offset is before the stream's earliest stored data; read from -1")]
    OffsetGone {
        /// The stream's earliest stored offset.
        earliest: herald_core::Offset,
    },
    /// The request body is longer than the limit, in bytes.
    /// 413 `payload_too_large`.
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit, in bytes (`ServerConfig::max_message_bytes`).
        limit: usize,
    },
    /// A Durable Streams append (or the body of a creation) holds a
    /// message larger than `max_message_bytes`, or messages that weigh
    /// more than `durable_streams.max_append_bytes` together (see
    /// `durable_streams/request.rs`); the text says which. Nothing was
    /// stored. 413 `payload_too_large`.
    #[error("{0}")]
    AppendTooLarge(String),
    /// The client's address has `max_connections_per_ip` connections open
    /// already (counted per TCP connection, or per request through a
    /// trusted proxy). 429 `too_many_connections` (RFC 6585 §4),
    /// `Retry-After: 1`.
    #[error("too many connections from this client address; close some, or retry later")]
    TooManyConnections,
    /// A `POST` to a JSON route without a JSON `Content-Type`
    /// (`application/json` or `application/<x>+json`): a web page can
    /// send other types to any host without a CORS preflight.
    /// 415 `unsupported_media_type` (RFC 9110 §15.5.16).
    #[error("the request body must be sent with Content-Type: application/json")]
    UnsupportedMediaType,
    /// A WebSocket upgrade whose `Origin` is neither the node's own nor
    /// allowed by `cors.allowed_origins` (`null` never is).
    /// 403 `origin_not_allowed`.
    #[error("WebSocket connections from this origin are not allowed; list it in the CORS allowed origins")]
    OriginNotAllowed,
    /// A request whose `Host` is not a loopback name, on a node that
    /// serves loopback only without access control (a defence against DNS
    /// rebinding). 403 `host_not_allowed`.
    #[error("this node serves loopback host names only (localhost, 127.0.0.1, [::1]); configure access control to serve other names")]
    HostNotAllowed,
    /// A request with more than one `Host` header field: RFC 9112 §3.2
    /// has a server answer it 400, as the fields could name different
    /// hosts to this node and to a proxy or check before it.
    /// 400 `invalid_host`.
    #[error("the request has more than one Host header field (RFC 9112 §3.2)")]
    InvalidHost,
    /// No route matches the path. 404 `not_found`.
    #[error("no such route")]
    NotFound,
    /// A Centrifugo `/emulation` request for a session that does not run
    /// on the node it names (ended, never started, or that node is not
    /// known to this one). 404 `session_not_found`.
    #[error("no client session of that id runs on the node named")]
    SessionNotFound,
    /// The route exists but not for this method; the answer keeps axum's
    /// `Allow` header. 405 `method_not_allowed`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// This node does not hold the writer lease, and `request` needs the
    /// holder: a write this node may not forward (a request another node
    /// forwarded already, one hop only) or could not make after all (the
    /// lease was lost meanwhile), or `/readyz?role=holder` (`None`).
    /// `holder_url` is the holder's advertised URL when known.
    /// 503 `not_holder`, `Retry-After: 1`.
    #[error("{}", not_holder_message(request.as_ref()))]
    NotHolder {
        /// The write that needs the holder; `None` for the holder probe.
        request: Option<HolderWrite>,
        /// The holder's advertised URL, if this node knows it.
        holder_url: Option<String>,
    },
    /// This node is a standby and could not hand the publish to a holder:
    /// it knows none, or the holder did not answer (connect error, timeout,
    /// broken answer). 503 `no_holder`, `Retry-After: 1`.
    #[error("no holder could take the publish")]
    NoHolder,
    /// The writer's queue is full. 503 `queue_full`, `Retry-After: 1`.
    #[error("the publish queue is full")]
    QueueFull,
    /// The storage refused the fenced write: another node holds the lease
    /// now. Nothing was written. 503 `lease_lost`, `Retry-After: 1`.
    #[error("this node lost the writer lease")]
    LeaseLost,
    /// A storage call failed; the source holds the storage's error and
    /// what was asked. Logged where the error ends: when it becomes the
    /// answer (`into_response`) or ends a subscription's stream.
    /// 503 `storage_unavailable`, `Retry-After: 1`.
    #[error("the storage is unavailable")]
    Storage(#[from] StorageFailure),
    /// The storage did not answer in time (`/readyz`'s ping), or failed a
    /// whole batch of publishes, which the writer logged once for all of
    /// them. Nothing was written, or the outcome is unknown.
    /// 503 `storage_unavailable`, `Retry-After: 1`.
    #[error("the storage is unavailable")]
    StorageUnavailable,
    /// The node is shutting down and takes no new work.
    /// 503 `draining`, `Retry-After: 1`.
    #[error("the node is draining")]
    Draining,
    /// A bug: a broken internal invariant; details are in the log.
    /// 500 `internal`.
    #[error("internal error: {0}")]
    Internal(String),
    /// Refused by access control: 401 `unauthorized` (with
    /// `WWW-Authenticate`, RFC 6750 §3), 401 `token_expired`, 403
    /// `forbidden`, or 429 `rate_limited` (with `Retry-After`); see
    /// [`AuthError`].
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Entry `index` (from 0) of a batch publish is invalid; answered with
    /// that entry's error's status and code, the message naming the entry.
    /// Nothing of the batch was stored.
    #[error("messages[{index}]: {error}")]
    InBatchEntry {
        /// The entry's position in `messages`, from 0.
        index: usize,
        /// What is wrong with it.
        error: Box<Error>,
    },
}

impl Error {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidChannel(_)
            | Self::InvalidIdempotencyKey(_)
            | Self::InvalidJson(_)
            | Self::InvalidBody(_)
            | Self::InvalidQuery(_)
            | Self::InvalidLastEventId
            | Self::InvalidUpgrade(_)
            | Self::InvalidHost => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } | Self::ForkTooLarge(_) | Self::AppendTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::OriginNotAllowed | Self::HostNotAllowed => StatusCode::FORBIDDEN,
            Self::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ChannelClosed | Self::ContentTypeMismatch => StatusCode::CONFLICT,
            Self::StreamNotFound => StatusCode::NOT_FOUND,
            Self::StreamExpired => StatusCode::GONE,
            Self::InvalidStreamRequest(_) => StatusCode::BAD_REQUEST,
            Self::StreamConflict(_)
            | Self::StreamClosed { .. }
            | Self::ProducerSeqGap { .. }
            | Self::TooManyProducers { .. } => StatusCode::CONFLICT,
            Self::StaleProducerEpoch { .. } => StatusCode::FORBIDDEN,
            Self::OffsetGone { .. } | Self::StreamGone => StatusCode::GONE,
            Self::OffsetBeyondHead { .. } => StatusCode::CONFLICT,
            Self::NotFound | Self::SessionNotFound => StatusCode::NOT_FOUND,
            Self::TooManyConnections => StatusCode::TOO_MANY_REQUESTS,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotHolder { .. }
            | Self::NoHolder
            | Self::QueueFull
            | Self::LeaseLost
            | Self::Storage(_)
            | Self::StorageUnavailable
            | Self::Draining => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Auth(e) => auth_status(e),
            Self::InBatchEntry { error, .. } => error.status(),
        }
    }

    /// The stable error code clients match on (the `error.code` field).
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidChannel(_) => "invalid_channel",
            Self::InvalidIdempotencyKey(_) => "invalid_idempotency_key",
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidBody(_) => "invalid_body",
            Self::InvalidQuery(_) => "invalid_query",
            Self::InvalidLastEventId => "invalid_last_event_id",
            Self::InvalidUpgrade(_) => "invalid_upgrade",
            Self::PayloadTooLarge { .. } | Self::AppendTooLarge(_) => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::OriginNotAllowed => "origin_not_allowed",
            Self::HostNotAllowed => "host_not_allowed",
            Self::InvalidHost => "invalid_host",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::ChannelClosed => "channel_closed",
            Self::ContentTypeMismatch => "content_type_mismatch",
            Self::StreamExpired => "stream_expired",
            Self::StreamNotFound => "stream_not_found",
            Self::InvalidStreamRequest(_) => "invalid_stream_request",
            Self::StreamConflict(_) => "stream_conflict",
            Self::ForkTooLarge(_) => "fork_too_large",
            Self::StreamClosed { .. } => "stream_closed",
            Self::StaleProducerEpoch { .. } => "stale_producer_epoch",
            Self::ProducerSeqGap { .. } => "producer_seq_gap",
            Self::TooManyProducers { .. } => "too_many_producers",
            Self::OffsetGone { .. } => "offset_gone",
            Self::StreamGone => "stream_gone",
            Self::OffsetBeyondHead { .. } => "offset_beyond_head",
            Self::NotFound => "not_found",
            Self::SessionNotFound => "session_not_found",
            Self::TooManyConnections => "too_many_connections",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::NotHolder { .. } => "not_holder",
            Self::NoHolder => "no_holder",
            Self::QueueFull => "queue_full",
            Self::LeaseLost => "lease_lost",
            Self::Storage(_) | Self::StorageUnavailable => "storage_unavailable",
            Self::Draining => "draining",
            Self::Internal(_) => "internal",
            Self::Auth(e) => auth_code(e),
            Self::InBatchEntry { error, .. } => error.code(),
        }
    }

    /// The human message shown to the client: the `Display` text for client
    /// errors, a fixed sentence for server-side ones (their details are
    /// logged, not shown).
    fn client_message(&self) -> String {
        match self {
            Self::NoHolder => {
                "no holder could take the publish; retry later with the same Idempotency-Key"
                    .to_owned()
            }
            Self::QueueFull => "the publish queue is full; retry later".to_owned(),
            Self::LeaseLost => {
                "this node lost the writer lease; nothing was written; retry on the new holder"
                    .to_owned()
            }
            Self::Storage(_) | Self::StorageUnavailable => {
                "the storage is unavailable; the outcome is unknown; retry later with the same Idempotency-Key".to_owned()
            }
            Self::Draining => "the node is shutting down; retry on another node".to_owned(),
            Self::Internal(_) => "internal error".to_owned(),
            Self::InBatchEntry { index, error } => {
                format!("messages[{index}]: {}", error.client_message())
            }
            other => other.to_string(),
        }
    }

    /// The Durable Streams headers of a stream refusal (PROTOCOL.md): the
    /// final offset of a closed stream, the producer's epoch or expected
    /// sequence number.
    fn stream_headers(&self, headers: &mut axum::http::HeaderMap) {
        let mut set = |name: &'static str, value: String| {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        };
        match self {
            Self::StreamClosed { next_offset } => {
                set("stream-closed", "true".to_owned());
                set("stream-next-offset", next_offset.clone());
            }
            Self::StaleProducerEpoch { epoch } => set("producer-epoch", epoch.to_string()),
            Self::ProducerSeqGap { expected, received } => {
                set("producer-expected-seq", expected.to_string());
                set("producer-received-seq", received.to_string());
            }
            _ => {}
        }
    }

    /// `true` for the answers that ask the client to retry later
    /// (`Retry-After: 1`, RFC 9110 §10.2.3): every 503 and 429.
    fn retry_later(&self) -> bool {
        matches!(
            self.status(),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        )
    }

    /// The access-control refusal inside, if this is one (also inside a
    /// batch entry's error).
    fn auth(&self) -> Option<&AuthError> {
        match self {
            Self::Auth(e) => Some(e),
            Self::InBatchEntry { error, .. } => error.auth(),
            _ => None,
        }
    }

    /// Logs what the error holds that the client is not told: the storage
    /// failure of an [`Error::Storage`] (see [`StorageFailure`]). The other
    /// errors are logged where they happen, if a human needs them. Call it
    /// once, where the error ends; `into_response` does.
    pub fn log(&self) {
        if let Self::Storage(failure) = self {
            failure.log();
        }
    }
}

/// The node core's error as an HTTP answer: each [`NodeError`] becomes the
/// [`Error`] of the same name, with its status, code, message and headers.
impl From<NodeError> for Error {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::IdempotencyKeyReused => Self::IdempotencyKeyReused,
            NodeError::ChannelClosed => Self::ChannelClosed,
            NodeError::ContentTypeMismatch => Self::ContentTypeMismatch,
            NodeError::StreamExpired => Self::StreamExpired,
            NodeError::OffsetBeyondHead { after, head } => Self::OffsetBeyondHead { after, head },
            NodeError::NotHolder {
                request,
                holder_url,
            } => Self::NotHolder {
                request,
                holder_url,
            },
            NodeError::NoHolder => Self::NoHolder,
            NodeError::QueueFull => Self::QueueFull,
            NodeError::LeaseLost => Self::LeaseLost,
            NodeError::Storage(failure) => Self::Storage(failure),
            NodeError::StorageUnavailable => Self::StorageUnavailable,
            NodeError::Draining => Self::Draining,
            NodeError::Internal(detail) => Self::Internal(detail),
            NodeError::InBatchEntry { index, error } => Self::InBatchEntry {
                index,
                error: Box::new(Self::from(*error)),
            },
        }
    }
}

impl IntoResponse for Error {
    /// The JSON error answer. Logs the storage failure of an
    /// [`Error::Storage`] first: this is where it ends.
    fn into_response(self) -> Response {
        self.log();
        let mut body = json!({
            "error": { "code": self.code(), "message": self.client_message() }
        });
        if let Self::NotHolder { holder_url, .. } = &self {
            body["error"]["holder_url"] = json!(holder_url);
        }
        if let Self::OffsetBeyondHead { head, .. } = &self {
            body["error"]["head"] = json!(head);
        }
        if let Self::OffsetGone { earliest } = &self {
            body["error"]["earliest"] = json!(earliest);
        }
        let mut response = (self.status(), Json(body)).into_response();
        self.stream_headers(response.headers_mut());
        if self.retry_later() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Some(auth) = self.auth() {
            let headers = response.headers_mut();
            if let Some(challenge) = auth_challenge(auth) {
                headers.insert(header::WWW_AUTHENTICATE, challenge);
            }
            if let AuthError::RateLimited { retry_after_s, .. } = auth {
                let seconds = *retry_after_s;
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
        }
        response
    }
}

/// `WWW-Authenticate` for a request without credentials (RFC 6750 §3).
const CHALLENGE: &str = r#"Bearer realm="herald""#;
/// `WWW-Authenticate` for a bad credential (RFC 6750 §3.1, `invalid_token`).
const CHALLENGE_INVALID: &str = r#"Bearer realm="herald", error="invalid_token""#;
/// `WWW-Authenticate` for an expired token (RFC 6750 §3.1).
const CHALLENGE_EXPIRED: &str =
    r#"Bearer realm="herald", error="invalid_token", error_description="the token has expired""#;

/// The HTTP status of an access-control refusal ([`Error::Auth`]).
fn auth_status(e: &AuthError) -> StatusCode {
    match e {
        AuthError::MissingCredentials(_)
        | AuthError::InvalidCredentials(_)
        | AuthError::TokenExpired => StatusCode::UNAUTHORIZED,
        AuthError::Forbidden(_) => StatusCode::FORBIDDEN,
        AuthError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        // Settings, never a request's refusal.
        AuthError::Config(_) | AuthError::KeyReload(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The stable error code of an access-control refusal.
fn auth_code(e: &AuthError) -> &'static str {
    match e {
        AuthError::MissingCredentials(_) | AuthError::InvalidCredentials(_) => "unauthorized",
        AuthError::TokenExpired => "token_expired",
        AuthError::Forbidden(_) => "forbidden",
        AuthError::RateLimited { .. } => "rate_limited",
        AuthError::Config(_) | AuthError::KeyReload(_) => "internal",
    }
}

/// The `WWW-Authenticate` header of a 401 answer (RFC 6750 §3).
fn auth_challenge(e: &AuthError) -> Option<HeaderValue> {
    let value = match e {
        AuthError::MissingCredentials(_) => CHALLENGE,
        AuthError::InvalidCredentials(_) => CHALLENGE_INVALID,
        AuthError::TokenExpired => CHALLENGE_EXPIRED,
        AuthError::Forbidden(_)
        | AuthError::RateLimited { .. }
        | AuthError::Config(_)
        | AuthError::KeyReload(_) => return None,
    };
    Some(HeaderValue::from_static(value))
}

#[cfg(test)]
mod tests {
    use herald_core::ChannelName;

    use super::*;

    async fn body_json(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn not_holder_carries_holder_url_and_retry_after() {
        let r = Error::NotHolder {
            request: Some(HolderWrite::DeleteChannel(
                ChannelName::new("orders").unwrap(),
            )),
            holder_url: Some("http://h:1".to_owned()),
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let body = body_json(r).await;
        assert_eq!(body["error"]["code"], "not_holder");
        assert_eq!(body["error"]["holder_url"], "http://h:1");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("deleting channel orders needs the holder"),
            "the refusal names the request: {message}"
        );
        assert!(!message.contains("publish"), "{message}");

        let body = body_json(
            Error::NotHolder {
                request: None,
                holder_url: None,
            }
            .into_response(),
        )
        .await;
        assert!(body["error"]["holder_url"].is_null());
        assert!(body["error"]
            .as_object()
            .unwrap()
            .contains_key("holder_url"));
    }

    #[tokio::test]
    async fn internals_stay_out_of_the_answer() {
        let e = Error::Storage(StorageFailure::new(
            "read",
            None,
            herald_storage::Error::unavailable("database is locked at /secret/path"),
        ));
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = body_json(r).await;
        assert_eq!(body["error"]["code"], "storage_unavailable");
        assert!(!body.to_string().contains("secret"));
        assert!(!body["error"]
            .as_object()
            .unwrap()
            .contains_key("holder_url"));
    }

    #[tokio::test]
    async fn offset_beyond_head_carries_the_head() {
        let r = Error::OffsetBeyondHead {
            after: 50,
            head: 10,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let body = body_json(r).await;
        assert_eq!(body["error"]["code"], "offset_beyond_head");
        assert_eq!(body["error"]["head"], 10);
    }

    #[tokio::test]
    async fn client_errors_have_no_retry_after() {
        let r = Error::InvalidJson("eof".to_owned()).into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let body = body_json(r).await;
        assert_eq!(body["error"]["code"], "invalid_json");
        assert!(body["error"]["message"].as_str().unwrap().contains("eof"));
    }

    /// Every error of the node's core keeps its status, code and message
    /// as an HTTP answer, also inside a batch entry.
    #[test]
    fn node_errors_answer_as_before() {
        let cases = [
            (
                NodeError::IdempotencyKeyReused,
                422,
                "idempotency_key_reused",
            ),
            (
                NodeError::OffsetBeyondHead { after: 5, head: 1 },
                409,
                "offset_beyond_head",
            ),
            (
                NodeError::NotHolder {
                    request: None,
                    holder_url: None,
                },
                503,
                "not_holder",
            ),
            (NodeError::NoHolder, 503, "no_holder"),
            (NodeError::QueueFull, 503, "queue_full"),
            (NodeError::LeaseLost, 503, "lease_lost"),
            (NodeError::StorageUnavailable, 503, "storage_unavailable"),
            (NodeError::Draining, 503, "draining"),
            (NodeError::Internal("x".to_owned()), 500, "internal"),
            (
                NodeError::InBatchEntry {
                    index: 2,
                    error: Box::new(NodeError::IdempotencyKeyReused),
                },
                422,
                "idempotency_key_reused",
            ),
        ];
        for (node_error, status, code) in cases {
            let text = node_error.to_string();
            let e = Error::from(node_error);
            assert_eq!(e.status().as_u16(), status, "{e:?}");
            assert_eq!(e.code(), code, "{e:?}");
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }
}
