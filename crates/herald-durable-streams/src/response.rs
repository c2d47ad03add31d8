//! What every Durable Streams answer carries, and the answers built from
//! a stream's state.

use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use herald_core::Offset;
use herald_node::forward::HolderAnswer;

use super::offset;

/// Adds to every answer of the wing, errors included, what a browser
/// needs to read it safely: `X-Content-Type-Options: nosniff` (the body
/// is never sniffed as another type) and `Cross-Origin-Resource-Policy:
/// cross-origin` (streams are meant to be read from other origins, under
/// CORS), and `Content-Security-Policy: sandbox` (a stream of `text/html`
/// never runs as a page of this origin).
pub(crate) async fn common_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("cross-origin"),
    );
    // A stream's content is served with the content type it was created
    // with, `text/html` included: never as a page of this origin.
    headers.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static("sandbox"),
    );
    response
}

/// Sets header `name` to `value` (a value that is not a header value is
/// left out: every caller passes digits, offsets or stored content types).
pub(crate) fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// An answer with `status`, no body, and `Stream-Next-Offset` at `head`.
pub(crate) fn empty(status: StatusCode, head: Offset) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    set(
        response.headers_mut(),
        "stream-next-offset",
        &offset::format(head),
    );
    response
}

/// Marks an answer as telling that the stream is closed.
pub(crate) fn closed(response: &mut Response) {
    set(response.headers_mut(), "stream-closed", "true");
}

/// Sets the answer's `Content-Type` to the stream's, as it was created.
pub(crate) fn content_type(response: &mut Response, content_type: &str) {
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
}

/// Sets `Cache-Control`.
pub(crate) fn cache(response: &mut Response, value: &'static str) {
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static(value));
}

/// The holder's answer to a forwarded write, returned unchanged: status,
/// `Content-Type`, `Retry-After`, the protocol's headers and the body.
pub(crate) fn from_holder(answer: HolderAnswer) -> Response {
    let mut response = Response::new(Body::from(answer.body().clone()));
    *response.status_mut() = answer.status();
    let headers = response.headers_mut();
    if let Some(value) = answer.content_type() {
        headers.insert(CONTENT_TYPE, value.clone());
    }
    if let Some(value) = answer.retry_after() {
        headers.insert(axum::http::header::RETRY_AFTER, value.clone());
    }
    for (name, value) in answer.carried_headers() {
        headers.append(name.clone(), value.clone());
    }
    response
}
