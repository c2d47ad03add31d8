//! The crate's one error type, and how it becomes an HTTP answer.
//!
//! Every error answer has the body `{"error":{"code","message"}}` (plus
//! `holder_url` for `not_holder`). The code is stable and documented in
//! `docs/api.md`; the message is for humans. Internal details (storage
//! error text) never reach the client: they are logged where the error is
//! handled.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the server, from a bad request to a
/// failed start-up.
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
    /// The publish body is JSON but not exactly `{"data": <value>}`.
    /// 400 `invalid_body`.
    #[error("request body must be the object {{\"data\": <any JSON value>}}: {0}")]
    InvalidBody(String),
    /// A query parameter is missing its number or out of range.
    /// 400 `invalid_query`.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// The `Last-Event-ID` header is not a non-negative integer.
    /// 400 `invalid_last_event_id`.
    #[error("invalid Last-Event-ID header: it must be a non-negative integer (an offset)")]
    InvalidLastEventId,
    /// A request to the WebSocket route is not a valid upgrade (RFC 6455
    /// §4.2.1). 400 `invalid_upgrade`.
    #[error("not a WebSocket upgrade request: {0}")]
    InvalidUpgrade(String),
    /// The request body is longer than the limit, in bytes.
    /// 413 `payload_too_large`.
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit, in bytes (`ServerConfig::max_message_bytes`).
        limit: usize,
    },
    /// No route matches the path. 404 `not_found`.
    #[error("no such route")]
    NotFound,
    /// The route exists but not for this method; the answer keeps axum's
    /// `Allow` header. 405 `method_not_allowed`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// This node does not hold the writer lease; `holder_url` is the
    /// holder's advertised URL when known. 503 `not_holder`, `Retry-After: 1`.
    #[error("this node is a standby; publish to the holder")]
    NotHolder {
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
    /// The storage did not answer, or failed; details are in the log.
    /// Nothing was written. 503 `storage_unavailable`, `Retry-After: 1`.
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
    /// A [`crate::ServerConfig`] field is unusable (start-up only).
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// The storage failed at start-up.
    #[error("storage: {0}")]
    Storage(#[from] herald_storage::Error),
    /// The listener failed.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
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
            | Self::InvalidUpgrade(_) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotHolder { .. }
            | Self::NoHolder
            | Self::QueueFull
            | Self::LeaseLost
            | Self::StorageUnavailable
            | Self::Draining
            | Self::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) | Self::Config(_) | Self::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
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
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::NotHolder { .. } => "not_holder",
            Self::NoHolder => "no_holder",
            Self::QueueFull => "queue_full",
            Self::LeaseLost => "lease_lost",
            Self::StorageUnavailable | Self::Storage(_) => "storage_unavailable",
            Self::Draining => "draining",
            Self::Internal(_) | Self::Config(_) | Self::Io(_) => "internal",
        }
    }

    /// The human message shown to the client: the `Display` text for client
    /// errors, a fixed sentence for server-side ones (their details are
    /// logged, not shown).
    fn client_message(&self) -> String {
        match self {
            Self::NotHolder { .. } => {
                "this node is a standby; publish to the holder (holder_url)".to_owned()
            }
            Self::NoHolder => {
                "no holder could take the publish; retry later with the same Idempotency-Key"
                    .to_owned()
            }
            Self::QueueFull => "the publish queue is full; retry later".to_owned(),
            Self::LeaseLost => {
                "this node lost the writer lease; nothing was written; retry on the new holder"
                    .to_owned()
            }
            Self::StorageUnavailable | Self::Storage(_) => {
                "the storage is unavailable; the outcome is unknown; retry later with the same Idempotency-Key".to_owned()
            }
            Self::Draining => "the node is shutting down; retry on another node".to_owned(),
            Self::Internal(_) | Self::Config(_) | Self::Io(_) => "internal error".to_owned(),
            other => other.to_string(),
        }
    }

    /// `true` for the answers that ask the client to retry later
    /// (`Retry-After: 1`, RFC 9110 §10.2.3).
    fn retry_later(&self) -> bool {
        self.status() == StatusCode::SERVICE_UNAVAILABLE
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let mut body = json!({
            "error": { "code": self.code(), "message": self.client_message() }
        });
        if let Self::NotHolder { holder_url } = &self {
            body["error"]["holder_url"] = json!(holder_url);
        }
        let mut response = (self.status(), Json(body)).into_response();
        if self.retry_later() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
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
            holder_url: Some("http://h:1".to_owned()),
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let body = body_json(r).await;
        assert_eq!(body["error"]["code"], "not_holder");
        assert_eq!(body["error"]["holder_url"], "http://h:1");

        let body = body_json(Error::NotHolder { holder_url: None }.into_response()).await;
        assert!(body["error"]["holder_url"].is_null());
        assert!(body["error"]
            .as_object()
            .unwrap()
            .contains_key("holder_url"));
    }

    #[tokio::test]
    async fn internals_stay_out_of_the_answer() {
        let e = Error::Storage(herald_storage::Error::unavailable(
            "database is locked at /secret/path",
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
    async fn client_errors_have_no_retry_after() {
        let r = Error::InvalidJson("eof".to_owned()).into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let body = body_json(r).await;
        assert_eq!(body["error"]["code"], "invalid_json");
        assert!(body["error"]["message"].as_str().unwrap().contains("eof"));
    }
}
