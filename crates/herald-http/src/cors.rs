//! Cross-origin requests (CORS, the Fetch standard's "CORS protocol"):
//! which web origins may call the API, subscribe over SSE and open a
//! WebSocket from a browser page. Built on tower-http's CORS layer.
//!
//! Every `OPTIONS` request is answered as a preflight by the layer, on
//! every route; an origin that is not allowed gets no
//! `Access-Control-Allow-Origin`, so the browser refuses the call. Nothing
//! is allowed by default. (A WebSocket handshake is not subject to CORS:
//! browsers send `Origin` without a preflight, and the layer adds the same
//! headers to its answer; `edge.rs` refuses a handshake whose `Origin`
//! these settings do not allow.)

use std::time::Duration;

use axum::http::header::{
    HeaderName, AUTHORIZATION, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LAST_MODIFIED, LOCATION,
    RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

use herald_node::node_error::StartError;

/// The request headers a page may send: credentials (`Authorization`,
/// `X-API-Key`), the publish body's type, `Idempotency-Key`, SSE's
/// `Last-Event-ID`, `If-None-Match`, and the Durable Streams protocol's
/// request headers (PROTOCOL.md of durable-streams/durable-streams).
const ALLOWED_HEADERS: [HeaderName; 16] = [
    AUTHORIZATION,
    CONTENT_TYPE,
    IF_NONE_MATCH,
    HeaderName::from_static("idempotency-key"),
    HeaderName::from_static("last-event-id"),
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("stream-seq"),
    HeaderName::from_static("stream-ttl"),
    HeaderName::from_static("stream-expires-at"),
    HeaderName::from_static("stream-closed"),
    HeaderName::from_static("producer-id"),
    HeaderName::from_static("producer-epoch"),
    HeaderName::from_static("producer-seq"),
    HeaderName::from_static("stream-forked-from"),
    HeaderName::from_static("stream-fork-offset"),
    HeaderName::from_static("stream-fork-sub-offset"),
];

/// The response headers a page may read besides the CORS-safelisted
/// ones: `Retry-After` (on 429 and 503), `Location`, `Last-Modified`,
/// `WWW-Authenticate` (on 401, RFC 6750 §3), `ETag`, and the Durable
/// Streams protocol's answer headers.
const EXPOSED_HEADERS: [HeaderName; 14] = [
    RETRY_AFTER,
    LOCATION,
    LAST_MODIFIED,
    WWW_AUTHENTICATE,
    ETAG,
    HeaderName::from_static("stream-next-offset"),
    HeaderName::from_static("stream-cursor"),
    HeaderName::from_static("stream-up-to-date"),
    HeaderName::from_static("stream-closed"),
    HeaderName::from_static("stream-sse-data-encoding"),
    HeaderName::from_static("producer-epoch"),
    HeaderName::from_static("producer-seq"),
    HeaderName::from_static("producer-expected-seq"),
    HeaderName::from_static("producer-received-seq"),
];

/// The CORS settings of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsConfig {
    /// Origins (`scheme://host[:port]`, as browsers send them in `Origin`)
    /// whose pages may call the API; `*` allows every origin. Empty (the
    /// default): no cross-origin call is allowed.
    pub allowed_origins: Vec<String>,
    /// How long a browser may cache a preflight's answer
    /// (`Access-Control-Max-Age`, whole seconds; default 10 minutes).
    pub max_age: Duration,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            max_age: Duration::from_secs(600),
        }
    }
}

impl CorsConfig {
    /// Checks every origin: `*`, or `http://` / `https://` with a host, an
    /// optional port and nothing after it.
    ///
    /// # Errors
    /// [`StartError::Config`] naming the first bad origin.
    pub fn validate(&self) -> Result<(), StartError> {
        for origin in &self.allowed_origins {
            check_origin(origin).map_err(|why| {
                StartError::Config(format!(
                    "cors allowed origin {origin:?}: {why}; write scheme://host[:port], \
                     e.g. https://app.example.com, or * for every origin"
                ))
            })?;
        }
        Ok(())
    }

    /// The layer for the router. Invalid origins are left out (the
    /// config is validated at start).
    pub fn layer(&self) -> CorsLayer {
        let origins = if self.allowed_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(
                self.allowed_origins
                    .iter()
                    .filter_map(|o| HeaderValue::from_str(o).ok()),
            )
        };
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([
                Method::GET,
                Method::HEAD,
                Method::POST,
                Method::PUT,
                Method::DELETE,
                Method::OPTIONS,
            ])
            .allow_headers(ALLOWED_HEADERS)
            .expose_headers(EXPOSED_HEADERS)
            .max_age(self.max_age)
    }
}

/// Why `origin` is not an origin as browsers send it (RFC 6454 §6.1).
fn check_origin(origin: &str) -> Result<(), &'static str> {
    if origin == "*" {
        return Ok(());
    }
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or("not http:// or https://")?;
    if rest.is_empty() {
        return Err("no host");
    }
    if rest.contains(['/', '?', '#', '*']) || rest.ends_with(':') {
        return Err("an origin has no path, query, wildcard or trailing colon");
    }
    if HeaderValue::from_str(origin).is_err() || origin.contains(char::is_whitespace) {
        return Err("not a valid header value");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked() {
        let config = |o: &str| CorsConfig {
            allowed_origins: vec![o.to_owned()],
            ..CorsConfig::default()
        };
        for good in ["*", "https://app.example.com", "http://127.0.0.1:8080"] {
            config(good).validate().unwrap();
        }
        for bad in [
            "app.example.com",
            "https://",
            "https://app.example.com/",
            "https://*.example.com",
            "ftp://x",
            "https://a b",
        ] {
            let error = config(bad).validate().unwrap_err().to_string();
            assert!(error.contains(bad), "{bad}: {error}");
        }
    }
}
