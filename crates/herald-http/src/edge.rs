//! Checks at the node's edge against requests a web page makes in a
//! visitor's browser (cross-site request forgery, cross-site WebSocket
//! hijacking, DNS rebinding). A browser sends any page's requests with the
//! visitor's network position, so a node that a developer runs on loopback
//! is reachable by every site the developer visits; these checks keep such
//! pages out, with or without access control:
//!
//! - [`websocket_origin_refusal`]: a WebSocket handshake is not subject to
//!   CORS (a page opens one to any host without a preflight), so every
//!   upgrade's `Origin` is checked against the CORS allow-list
//!   ([`crate::cors::CorsConfig::allowed_origins`]): the node's own origin, a
//!   listed one, or any with `*`; `null` (a sandboxed frame, a `file:`
//!   page) is never allowed. A request without `Origin` is not a
//!   browser's and passes. Refused: `403 origin_not_allowed`.
//! - [`json_refusal`]: a page may `POST` a `text/plain` body to any host
//!   without a preflight, so the JSON `POST` routes take only a JSON
//!   `Content-Type` (`application/json` or `application/<x>+json`, any
//!   parameters), which a page can only send after a CORS preflight.
//!   Refused: `415 unsupported_media_type`.
//! - [`cross_origin_write_refusal`]: a Durable Streams write (`PUT`,
//!   `POST`, `DELETE` under the wing's prefix) takes any `Content-Type`,
//!   so a page could send one without a preflight; one whose `Origin` the
//!   CORS allow-list does not allow (as for WebSockets) is refused.
//!   Refused: `403 origin_not_allowed`.
//! - [`loopback_host_refusal`]: on a node without access control serving
//!   loopback only (herald-server's `ServerConfig::loopback_hosts_only`, here
//!   [`crate::shared::Settings::loopback_hosts_only`]), a
//!   request whose `Host` is not a loopback name (`localhost`,
//!   `*.localhost`, `127.0.0.0/8`, `::1`) came through a name that
//!   resolved to loopback for the page's sake (DNS rebinding). Refused:
//!   `403 host_not_allowed`.
//! - [`duplicate_host_refusal`]: a request with more than one `Host`
//!   field (RFC 9112 §3.2 has a server answer it 400): the checks above,
//!   and a proxy in front, might each read a different one. Refused:
//!   `400 invalid_host`, on every route, the SSE route served outside
//!   hyper (`sse_connection.rs`) included, as its requests go through
//!   the same router.

use axum::extract::Request;
use axum::http::header::{CONTENT_TYPE, HOST, ORIGIN, UPGRADE};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};

use crate::error::Error;
use crate::shared::Shared;

/// The answer that refuses a WebSocket upgrade whose `Origin` the CORS
/// allow-list does not allow (see the module's documentation); `None`
/// for every other request.
pub fn websocket_origin_refusal(state: &Shared, request: &Request) -> Option<Response> {
    if !is_websocket_upgrade(request) {
        return None;
    }
    let origin = request.headers().get(ORIGIN)?;
    let allowed = origin.to_str().is_ok_and(|origin| {
        origin_allowed(
            origin,
            request_authority(request),
            &state.settings.allowed_origins,
        )
    });
    if allowed {
        return None;
    }
    tracing::debug!(
        origin = ?origin,
        path = %request.uri().path(),
        "WebSocket upgrade from an origin that is not allowed"
    );
    Some(Error::OriginNotAllowed.into_response())
}

/// Refuses a stream write carrying an `Origin` that the CORS allow-list
/// does not allow (see the module's documentation); passes a request
/// without `Origin` (not a browser's) or from an allowed one.
///
/// # Errors
/// [`Error::OriginNotAllowed`].
pub fn cross_origin_write_refusal(
    state: &Shared,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
) -> Result<(), Error> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let authority = match headers.get(HOST) {
        Some(host) => host.to_str().ok(),
        None => uri.authority().map(|a| a.as_str()),
    };
    let allowed = origin
        .to_str()
        .is_ok_and(|origin| origin_allowed(origin, authority, &state.settings.allowed_origins));
    if allowed {
        return Ok(());
    }
    tracing::debug!(
        origin = ?origin,
        path = %uri.path(),
        "cross-origin stream write from an origin that is not allowed"
    );
    Err(Error::OriginNotAllowed)
}

/// The answer that refuses a `POST` without a JSON `Content-Type` (see the
/// module's documentation); `None` for other methods.
pub fn json_refusal(request: &Request) -> Option<Response> {
    if request.method() == Method::POST && !is_json(request.headers()) {
        return Some(Error::UnsupportedMediaType.into_response());
    }
    None
}

/// The answer that refuses a request whose `Host` is not a loopback name
/// when the node serves loopback only without access control (see the
/// module's documentation); `None` when it may go on.
pub fn loopback_host_refusal(state: &Shared, request: &Request) -> Option<Response> {
    if !state.settings.loopback_hosts_only
        || request_authority(request).is_some_and(|authority| is_loopback_name(host_of(authority)))
    {
        return None;
    }
    tracing::debug!(
        host = ?request_authority(request),
        "request for a host name that is not loopback on a loopback node"
    );
    Some(Error::HostNotAllowed.into_response())
}

/// The answer that refuses a request with more than one `Host` header
/// field (see the module's documentation); `None` for one or none.
pub fn duplicate_host_refusal(request: &Request) -> Option<Response> {
    let mut hosts = request.headers().get_all(HOST).iter();
    hosts.next()?;
    hosts.next()?;
    tracing::debug!(
        path = %request.uri().path(),
        "request with more than one Host header field"
    );
    Some(Error::InvalidHost.into_response())
}

/// Whether `request` opens a WebSocket: an HTTP/1.1 upgrade to `websocket`
/// (RFC 6455 §4.1), or an HTTP/2 extended `CONNECT` (RFC 8441 §4).
fn is_websocket_upgrade(request: &Request) -> bool {
    if request.method() == Method::CONNECT {
        return true;
    }
    request
        .headers()
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|protocol| protocol.trim().eq_ignore_ascii_case("websocket"))
}

/// The authority the client asked for: the `Host` header, else the
/// request target's (HTTP/2's `:authority`).
fn request_authority(request: &Request) -> Option<&str> {
    match request.headers().get(HOST) {
        Some(host) => host.to_str().ok(),
        None => request.uri().authority().map(|a| a.as_str()),
    }
}

/// Whether a `Content-Type` is JSON: `application/json` or
/// `application/<x>+json`, in any case, with any parameters.
pub fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    kind.eq_ignore_ascii_case("application") && (subtype == "json" || subtype.ends_with("+json"))
}

/// Whether a browser's `origin` may open a WebSocket to a node that the
/// request reached as `authority` (its `Host`), given the CORS allow-list
/// `allowed`: `null` never; else `*`, a listed origin (compared without
/// regard to case), or the node's own origin (the same host and port).
fn origin_allowed(origin: &str, authority: Option<&str>, allowed: &[String]) -> bool {
    if origin.eq_ignore_ascii_case("null") {
        return false;
    }
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    authority.is_some_and(|authority| same_origin(origin, authority))
}

/// Whether `origin` (`scheme://host[:port]`) names the host and port of
/// `authority` (`host[:port]`); a missing port is the origin scheme's
/// default on either side.
fn same_origin(origin: &str, authority: &str) -> bool {
    let (scheme, rest) = match origin.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => return false,
    };
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return false,
    };
    let split = |text: &str| -> Option<(String, u16)> {
        let host = host_of(text);
        let port = match &text[host_end(text)..] {
            "" => default_port,
            port => port.strip_prefix(':')?.parse().ok()?,
        };
        Some((host.to_ascii_lowercase(), port))
    };
    match (split(rest), split(authority)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Where the host part of `authority` (`host[:port]`, IPv6 in brackets)
/// ends.
fn host_end(authority: &str) -> usize {
    if authority.starts_with('[') {
        authority.find(']').map_or(authority.len(), |i| i + 1)
    } else {
        authority.rfind(':').unwrap_or(authority.len())
    }
}

/// The host of `authority`, IPv6 brackets included.
fn host_of(authority: &str) -> &str {
    &authority[..host_end(authority)]
}

/// Whether a host name (IPv6 in brackets) can only mean this machine:
/// `localhost` and its subdomains (RFC 6761 §6.3), an address in
/// `127.0.0.0/8`, `::1`.
fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn json_content_types() {
        for good in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
            " application/json ;x=y",
        ] {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(good));
            assert!(is_json(&h), "{good}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "json",
            "",
        ] {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(bad));
            assert!(!is_json(&h), "{bad}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn origins_of_websocket_upgrades() {
        let none: Vec<String> = Vec::new();
        let listed = vec!["https://app.example".to_owned()];
        let any = vec!["*".to_owned()];
        // Same origin: the host and port the request names.
        assert!(origin_allowed(
            "http://127.0.0.1:7700",
            Some("127.0.0.1:7700"),
            &none
        ));
        assert!(origin_allowed(
            "https://herald.example",
            Some("herald.example"),
            &none
        ));
        assert!(origin_allowed(
            "https://Herald.example:443",
            Some("herald.example"),
            &none
        ));
        assert!(origin_allowed("http://[::1]:80", Some("[::1]"), &none));
        assert!(!origin_allowed(
            "http://127.0.0.1:7701",
            Some("127.0.0.1:7700"),
            &none
        ));
        assert!(!origin_allowed(
            "https://evil.example",
            Some("herald.example"),
            &none
        ));
        assert!(!origin_allowed("http://herald.example", None, &none));
        // Listed, or any with `*`; `null` never.
        assert!(origin_allowed(
            "https://APP.example",
            Some("herald.example"),
            &listed
        ));
        assert!(!origin_allowed(
            "https://evil.example",
            Some("herald.example"),
            &listed
        ));
        assert!(origin_allowed("https://evil.example", None, &any));
        assert!(!origin_allowed("null", Some("herald.example"), &any));
        assert!(!origin_allowed("file://", Some("herald.example"), &none));
    }

    #[test]
    fn loopback_names() {
        for good in [
            "localhost",
            "LOCALHOST.",
            "app.localhost",
            "127.0.0.1",
            "127.9.8.7",
            "[::1]",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(is_loopback_name(good), "{good}");
        }
        for bad in [
            "evil.example",
            "localhost.example",
            "10.0.0.1",
            "0.0.0.0",
            "[::]",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_name(bad), "{bad}");
        }
        assert_eq!(host_of("[::1]:7700"), "[::1]");
        assert_eq!(host_of("localhost:7700"), "localhost");
        assert_eq!(host_of("localhost"), "localhost");
    }
}
