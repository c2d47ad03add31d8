//! The console's pages: files of `crates/herald-server/console/`, embedded
//! in the binary at build time (`include_bytes!`; no build step, no second
//! service, nothing fetched from elsewhere), served under `/console/` with
//! the headers an admin page needs: a Content Security Policy that allows
//! only the node's own origin (W3C CSP Level 3; no inline script or
//! style, no framing), `X-Content-Type-Options: nosniff`,
//! `X-Frame-Options: DENY` (for browsers without `frame-ancestors`),
//! `Referrer-Policy: no-referrer`, `Cross-Origin-Opener-Policy` and
//! `Cross-Origin-Resource-Policy: same-origin`, and `Cache-Control:
//! no-cache` (a browser revalidates, so a new binary's pages show at once).

use axum::extract::Path;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::ConsoleState;
use herald_http::error::Error;

/// The Content Security Policy of every page and file: only the node's
/// own origin, for scripts, styles, images and connections alike; no
/// `<base>`, forms post only to the node, no framing.
pub(crate) const CSP: &str =
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One embedded file: its name under `/console/`, media type and bytes.
struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
}

/// Embeds `console/<file>` with its media type.
macro_rules! asset {
    ($name:literal, $media_type:literal) => {
        Asset {
            name: $name,
            media_type: $media_type,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/console/", $name)),
        }
    };
}

/// Every file of the console.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("alerts.js", "text/javascript; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("channel.js", "text/javascript; charset=utf-8"),
    asset!("channels.js", "text/javascript; charset=utf-8"),
    asset!("chart.js", "text/javascript; charset=utf-8"),
    asset!("cluster.js", "text/javascript; charset=utf-8"),
    asset!("dom.js", "text/javascript; charset=utf-8"),
    asset!("feed.js", "text/javascript; charset=utf-8"),
    asset!("format.js", "text/javascript; charset=utf-8"),
    asset!("messages.js", "text/javascript; charset=utf-8"),
    asset!("rates.js", "text/javascript; charset=utf-8"),
    asset!("sse.js", "text/javascript; charset=utf-8"),
    asset!("store.js", "text/javascript; charset=utf-8"),
];

/// `/console` (redirected to `/console/`), `/console/` (the page) and
/// `/console/{file}`.
pub(super) fn routes() -> Router<ConsoleState> {
    Router::new()
        .route("/console", get(redirect))
        .route("/console/", get(index))
        .route("/console/{file}", get(file))
}

/// `308` to `/console/`, so that the page's relative URLs resolve under it.
async fn redirect() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(LOCATION, HeaderValue::from_static("/console/"))],
    )
        .into_response()
}

async fn index() -> Response {
    serve("index.html").unwrap_or_else(|| Error::NotFound.into_response())
}

async fn file(Path(file): Path<String>) -> Response {
    serve(&file).unwrap_or_else(|| Error::NotFound.into_response())
}

/// The file `name` with the page headers; `None` for a name not embedded.
fn serve(name: &str) -> Option<Response> {
    let asset = ASSETS.iter().find(|a| a.name == name)?;
    let mut response = asset.bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.media_type));
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file in the console's folder is embedded, and every
    /// embedded file is in the folder: a file added to the pages and not
    /// here would answer 404 in the browser.
    #[test]
    fn every_file_of_the_folder_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/console");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.name.to_owned()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }
}
