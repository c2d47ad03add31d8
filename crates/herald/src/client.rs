//! The HTTP client the command-line subcommands share: the `--server` flag,
//! JSON requests, and decoding of the server's `{"error": {...}}` bodies into
//! a typed [`ApiError`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use herald_core::{ChannelName, IdempotencyKey};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, RETRY_AFTER};
use reqwest::{Response, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Server URL used when neither `--server` nor `HERALD_SERVER` is given.
pub(crate) const DEFAULT_SERVER: &str = "http://127.0.0.1:7700";

/// Total timeout of one request of `publish`, `history`, `channels` and `status`.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Timeout of the TCP connect phase of every request.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest part of a non-JSON error body quoted in an error message, in bytes.
const MAX_QUOTED_BODY_BYTES: usize = 200;

/// The `--server` flag every client subcommand takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServerArg {
    /// Base URL of the Herald server, `http://` or `https://` (a path
    /// prefix, e.g. behind a proxy, is kept; `/v1` is added by the client).
    #[arg(
        long,
        env = "HERALD_SERVER",
        default_value = DEFAULT_SERVER,
        value_name = "URL",
        value_parser = parse_server_url
    )]
    pub(crate) server: Url,
    /// API key (or client token) sent as `Authorization: Bearer` with
    /// every request, for a server with access control on (see
    /// docs/security.md).
    #[arg(
        long,
        env = "HERALD_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub(crate) api_key: Option<String>,
    /// PEM file of certificate authorities trusted besides the system's
    /// trust store, for an `https://` server whose certificate a private CA
    /// signed.
    #[arg(long, env = "HERALD_CA_FILE", value_name = "PEM")]
    pub(crate) ca_file: Option<PathBuf>,
}

impl ServerArg {
    /// An HTTP client builder with the connect timeout and the CA
    /// certificates of `--ca-file`, if given.
    ///
    /// # Errors
    /// The CA file cannot be read or holds no PEM certificate.
    pub(crate) fn http_builder(&self) -> anyhow::Result<reqwest::ClientBuilder> {
        http_builder(self.ca_file.as_deref())
    }
}

/// A client builder with the connect timeout, trusting the certificates in
/// the PEM file `ca_file` besides the system's trust store.
///
/// # Errors
/// The CA file cannot be read or holds no PEM certificate.
pub(crate) fn http_builder(ca_file: Option<&Path>) -> anyhow::Result<reqwest::ClientBuilder> {
    let mut builder = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT);
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read --ca-file {}: {e}", path.display()))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            anyhow::anyhow!(
                "--ca-file {} is not a PEM certificate file: {e}",
                path.display()
            )
        })?;
        if certificates.is_empty() {
            anyhow::bail!(
                "--ca-file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            );
        }
        builder = builder.tls_certs_merge(certificates);
    }
    Ok(builder)
}

/// Parses and checks a `--server` value: an `http://` or `https://` URL
/// with a host, no query or fragment, and a path (a prefix, if any) that
/// does not already end with the API's `/v1`.
pub(crate) fn parse_server_url(s: &str) -> Result<Url, String> {
    if !s.contains("://") {
        return Err(format!(
            "{s:?} has no scheme; add http:// (or https://), e.g. --server http://{s}"
        ));
    }
    let url = Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(format!(
                "unsupported scheme {other}://; use http:// or https://"
            ))
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("the URL must not have a query or a fragment".into());
    }
    let path = url.path().trim_end_matches('/');
    if path == "/v1" || path.ends_with("/v1") {
        let mut base = url.clone();
        base.set_path(&path[..path.len() - "/v1".len()]);
        return Err(format!(
            "the URL ends with /v1, which the client adds to every request; give the server's \
             base URL: --server {}",
            base.as_str().trim_end_matches('/')
        ));
    }
    Ok(url)
}

/// Parses a channel name argument with the server's own rules.
pub(crate) fn parse_channel(s: &str) -> Result<ChannelName, herald_core::InvalidChannelName> {
    ChannelName::new(s)
}

/// Parses an `--after N` argument: an offset, an integer from 0 (before the
/// first message) to 2^64 − 1, in the server's own words.
pub(crate) fn parse_offset(s: &str) -> Result<u64, String> {
    s.trim().parse::<u64>().map_err(|_| {
        format!(
            "an offset is an integer from 0 to {} (0: from the first message), got {s:?}",
            u64::MAX
        )
    })
}

/// Parses an `--idempotency-key` argument with the server's own rules.
pub(crate) fn parse_idempotency_key(
    s: &str,
) -> Result<IdempotencyKey, herald_core::InvalidIdempotencyKey> {
    IdempotencyKey::new(s)
}

/// Path of a channel's messages resource.
pub(crate) fn messages_path(channel: &ChannelName) -> String {
    format!("/v1/channels/{channel}/messages")
}

/// Path of a channel's SSE stream.
pub(crate) fn events_path(channel: &ChannelName) -> String {
    format!("/v1/channels/{channel}/events")
}

/// An error answer of the server: its status and `{"error": {...}}` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    /// HTTP status code.
    pub(crate) status: u16,
    /// The body's `error.code`, or `http_<status>` when the body has none.
    pub(crate) code: String,
    /// The body's `error.message`, or what the body held instead.
    pub(crate) message: String,
    /// The `Retry-After` header in seconds, when present.
    pub(crate) retry_after: Option<Duration>,
    /// For `not_holder`: the URL of the node that holds the writer lease.
    pub(crate) holder_url: Option<String>,
    /// The URL requested, shown when the answer suggests a wrong
    /// `--server` (404, or a body that is not Herald's).
    pub(crate) url: Option<String>,
}

impl ApiError {
    /// `true` when the same request may succeed later: 408, 429 and 5xx.
    pub(crate) fn is_retryable(&self) -> bool {
        self.status == 408 || self.status == 429 || self.status >= 500
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (HTTP {})", self.code, self.message, self.status)?;
        if let Some(url) = &self.holder_url {
            write!(f, "; the writer is {url}")?;
        }
        if let Some(url) = &self.url {
            write!(f, "; the URL requested was {url} (check --server)")?;
        }
        if let Some(after) = self.retry_after {
            write!(f, "; retry after {} s", after.as_secs())?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The server answered with an error status.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The request did not get an answer: connect, timeout, or a broken body.
    #[error("request to {url} failed: {}{}", describe_transport(.error), connect_hint(.error))]
    Transport {
        /// The URL requested.
        url: String,
        /// What reqwest reported.
        error: reqwest::Error,
    },
    /// The server answered 2xx with a body that is not what the API promises.
    #[error("unexpected answer from {url}: {detail}")]
    Decode {
        /// The URL requested.
        url: String,
        /// What was wrong with it.
        detail: String,
    },
}

impl ClientError {
    /// A short label for counting errors: the API error code, or `timeout`,
    /// `connect`, `transport`, `bad_response`.
    pub(crate) fn code(&self) -> String {
        match self {
            Self::Api(e) => e.code.clone(),
            Self::Transport { error, .. } if error.is_timeout() => "timeout".into(),
            Self::Transport { error, .. } if error.is_connect() => "connect".into(),
            Self::Transport { .. } => "transport".into(),
            Self::Decode { .. } => "bad_response".into(),
        }
    }

    /// `true` when the same request may succeed later (transport errors and
    /// retryable statuses).
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Self::Api(e) => e.is_retryable(),
            Self::Transport { .. } => true,
            Self::Decode { .. } => false,
        }
    }
}

/// What to check after a failed connect: the server may not run there.
fn connect_hint(error: &reqwest::Error) -> &'static str {
    if error.is_connect() {
        " (is a Herald server running there? the server is chosen with --server or \
         HERALD_SERVER, default http://127.0.0.1:7700)"
    } else {
        ""
    }
}

/// A transport error in a few words: its kind and its innermost cause
/// (reqwest's own text repeats the URL).
fn describe_transport(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "cannot connect"
    } else if error.is_body() || error.is_decode() {
        "the answer broke off"
    } else if error.is_builder() {
        "bad request"
    } else {
        "no answer"
    };
    let mut root = std::error::Error::source(error);
    while let Some(inner) = root.and_then(std::error::Error::source) {
        root = Some(inner);
    }
    match root {
        Some(cause) => format!("{kind}: {cause}"),
        None => kind.to_owned(),
    }
}

/// Builds the HTTP client for one-shot requests: keep-alive, with a total
/// timeout per request.
/// `server`'s `--ca-file` is trusted.
pub(crate) fn request_client(
    server: &ServerArg,
    timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    Ok(server.http_builder()?.timeout(timeout).build()?)
}

/// Builds the HTTP client for long-lived streams: no total timeout, but a
/// read that waits longer than `idle` fails.
/// The certificates of the PEM file `ca_file` are trusted.
pub(crate) fn stream_client(
    ca_file: Option<&Path>,
    idle: Duration,
) -> anyhow::Result<reqwest::Client> {
    Ok(http_builder(ca_file)?.read_timeout(idle).build()?)
}

/// `Bearer <credential>` as a header value, marked sensitive (never shown
/// in a `Debug` form).
///
/// # Errors
/// When the credential is not visible ASCII.
fn bearer(credential: &str) -> anyhow::Result<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {credential}"))
        .map_err(|_| anyhow::anyhow!("the API key must be visible ASCII"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// The headers that carry `credential` (an API key or a token), if any:
/// `Authorization: Bearer <credential>`.
///
/// # Errors
/// When the credential is not visible ASCII.
pub(crate) fn credential_headers(credential: Option<&str>) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    if let Some(credential) = credential {
        headers.insert(AUTHORIZATION, bearer(credential)?);
    }
    Ok(headers)
}

/// A Herald server's API, reached through one keep-alive HTTP client.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    /// The server's base URL without a trailing `/`.
    base: String,
    /// `Bearer <API key or token>`, sent with every request if set.
    credential: Option<HeaderValue>,
}

impl Api {
    /// An API client for the server at `base`.
    pub(crate) fn new(base: &Url, http: reqwest::Client) -> Self {
        Self {
            http,
            base: base.as_str().trim_end_matches('/').to_owned(),
            credential: None,
        }
    }

    /// This client, sending `credential` (an API key or a token, if any)
    /// as `Authorization: Bearer` with every request.
    ///
    /// # Errors
    /// When the credential is not visible ASCII.
    pub(crate) fn with_credential(mut self, credential: Option<&str>) -> anyhow::Result<Self> {
        self.credential = credential.map(bearer).transpose()?;
        Ok(self)
    }

    /// The absolute URL of `path` (which starts with `/` and may hold a query).
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET path`, decoding a 2xx JSON body into `T`.
    pub(crate) async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.url(path);
        let resp = self.send(&url, self.http.get(&url)).await?;
        decode_json(&url, resp).await
    }

    /// `GET path`, returning a 2xx body as text.
    pub(crate) async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let url = self.url(path);
        let resp = self.send(&url, self.http.get(&url)).await?;
        resp.text()
            .await
            .map_err(|error| ClientError::Transport { url, error })
    }

    /// `POST path` with `body` as JSON and an optional `Idempotency-Key`,
    /// decoding a 2xx JSON answer into `T`.
    pub(crate) async fn post_json<B, T>(
        &self,
        path: &str,
        body: &B,
        idempotency_key: Option<&IdempotencyKey>,
    ) -> Result<T, ClientError>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        self.post_json_status(path, body, idempotency_key)
            .await
            .map(|(_, answer)| answer)
    }

    /// Like [`Api::post_json`], with the 2xx status code of the answer
    /// (a publish is 201 when stored, 200 for a repeated idempotency key).
    pub(crate) async fn post_json_status<B, T>(
        &self,
        path: &str,
        body: &B,
        idempotency_key: Option<&IdempotencyKey>,
    ) -> Result<(u16, T), ClientError>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let url = self.url(path);
        let mut req = self.http.post(&url).json(body);
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key.as_str());
        }
        let resp = self.send(&url, req).await?;
        let status = resp.status().as_u16();
        decode_json(&url, resp).await.map(|answer| (status, answer))
    }

    /// `GET path` for a streamed body (SSE), with `headers`; returns the
    /// response once its status is 2xx.
    pub(crate) async fn open_stream(
        &self,
        path: &str,
        headers: HeaderMap,
    ) -> Result<Response, ClientError> {
        let url = self.url(path);
        self.send(&url, self.http.get(&url).headers(headers)).await
    }

    /// Sends `req` and turns a non-2xx answer into [`ClientError::Api`].
    async fn send(&self, url: &str, req: reqwest::RequestBuilder) -> Result<Response, ClientError> {
        let req = match &self.credential {
            Some(value) => req.header(AUTHORIZATION, value.clone()),
            None => req,
        };
        let resp = req.send().await.map_err(|error| ClientError::Transport {
            url: url.to_owned(),
            error,
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = parse_retry_after(resp.headers());
        // A body that cannot be read still leaves the status to report.
        let body = resp.bytes().await.unwrap_or_default();
        let mut error = decode_error(status.as_u16(), retry_after, &body);
        if error.status == 404 || error.code.starts_with("http_") {
            error.url = Some(url.to_owned());
        }
        Err(ClientError::Api(error))
    }
}

/// Reads a 2xx body and decodes it as JSON.
async fn decode_json<T: DeserializeOwned>(url: &str, resp: Response) -> Result<T, ClientError> {
    let body = resp.bytes().await.map_err(|error| ClientError::Transport {
        url: url.to_owned(),
        error,
    })?;
    serde_json::from_slice(&body).map_err(|e| ClientError::Decode {
        url: url.to_owned(),
        detail: e.to_string(),
    })
}

/// The `Retry-After` header as a duration; only the delay-seconds form is
/// understood (Herald sends no HTTP dates).
pub(crate) fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The `{"error": {...}}` envelope of error answers.
#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

/// The fields of an error answer this client uses; others are ignored.
#[derive(Deserialize)]
struct ErrorBody {
    code: String,
    message: String,
    #[serde(default)]
    holder_url: Option<String>,
}

/// Decodes an error answer. A body that is not the API's error envelope (a
/// proxy's page, say) becomes code `http_<status>` with the body's start as
/// the message.
pub(crate) fn decode_error(status: u16, retry_after: Option<Duration>, body: &[u8]) -> ApiError {
    if let Ok(ErrorEnvelope { error }) = serde_json::from_slice::<ErrorEnvelope>(body) {
        return ApiError {
            status,
            code: error.code,
            message: error.message,
            retry_after,
            holder_url: error.holder_url,
            url: None,
        };
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let message = if text.is_empty() {
        reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("no error body")
            .to_owned()
    } else {
        let mut end = text.len().min(MAX_QUOTED_BODY_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_owned()
    };
    ApiError {
        status,
        code: format!("http_{status}"),
        message,
        retry_after,
        holder_url: None,
        url: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    /// Answers one request with `{}` and returns its head, lowercased.
    async fn one_request_head(api: Api) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let api = Api {
            base: base.as_str().trim_end_matches('/').to_owned(),
            ..api
        };
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                socket.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
            socket.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8(head).unwrap().to_ascii_lowercase()
        });
        let _: serde_json::Value = api.get_json("/v1/status").await.unwrap();
        server.await.unwrap()
    }

    #[tokio::test]
    async fn the_credential_goes_in_a_bearer_header() {
        let base = Url::parse("http://unused").unwrap();
        let api = Api::new(&base, reqwest::Client::new());
        let with = one_request_head(api.clone().with_credential(Some("k3y")).unwrap()).await;
        assert!(with.contains("authorization: bearer k3y\r\n"), "{with}");
        let without = one_request_head(api.with_credential(None).unwrap()).await;
        assert!(!without.contains("authorization"), "{without}");
        assert!(Api::new(&base, reqwest::Client::new())
            .with_credential(Some("bad\nkey"))
            .is_err());
    }

    #[test]
    fn decodes_the_error_envelope() {
        let body = br#"{"error":{"code":"not_holder","message":"this node is a follower","holder_url":"http://10.0.0.2:7700"}}"#;
        let e = decode_error(409, None, body);
        assert_eq!(e.code, "not_holder");
        assert_eq!(e.message, "this node is a follower");
        assert_eq!(e.holder_url.as_deref(), Some("http://10.0.0.2:7700"));
        assert_eq!(
            e.to_string(),
            "not_holder: this node is a follower (HTTP 409); the writer is http://10.0.0.2:7700"
        );
        assert!(!e.is_retryable());
    }

    #[test]
    fn falls_back_for_foreign_bodies() {
        let e = decode_error(
            502,
            Some(Duration::from_secs(3)),
            b"<html>Bad gateway</html>\n",
        );
        assert_eq!(e.code, "http_502");
        assert_eq!(e.message, "<html>Bad gateway</html>");
        assert_eq!(
            e.to_string(),
            "http_502: <html>Bad gateway</html> (HTTP 502); retry after 3 s"
        );
        assert!(e.is_retryable());

        let e = decode_error(404, None, b"");
        assert_eq!(e.message, "Not Found");

        let long = "é".repeat(300);
        let e = decode_error(500, None, long.as_bytes());
        assert!(e.message.len() <= MAX_QUOTED_BODY_BYTES);
        assert!(e.message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn parses_retry_after_seconds_only() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static(" 2 "));
        assert_eq!(parse_retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(parse_retry_after(&h), None);
    }

    #[test]
    fn checks_server_urls() {
        assert!(parse_server_url("http://127.0.0.1:7700").is_ok());
        assert!(parse_server_url("http://example.test/herald/").is_ok());
        assert!(parse_server_url("https://example.test").is_ok());
        assert_eq!(
            parse_server_url("ftp://example.test").unwrap_err(),
            "unsupported scheme ftp://; use http:// or https://"
        );
        assert_eq!(
            parse_server_url("127.0.0.1:7700").unwrap_err(),
            "\"127.0.0.1:7700\" has no scheme; add http:// (or https://), e.g. --server \
             http://127.0.0.1:7700"
        );
        assert!(parse_server_url("localhost:7700")
            .unwrap_err()
            .contains("add http://"));
        assert_eq!(
            parse_server_url("http://h:7700/v1").unwrap_err(),
            "the URL ends with /v1, which the client adds to every request; give the server's \
             base URL: --server http://h:7700"
        );
        assert!(parse_server_url("https://h/herald/v1/")
            .unwrap_err()
            .ends_with("--server https://h/herald"));
        assert!(parse_server_url("http://h/?x=1").is_err());
    }

    #[test]
    fn a_404_or_a_foreign_answer_names_the_url() {
        let mut e = decode_error(
            404,
            None,
            br#"{"error":{"code":"not_found","message":"no such route"}}"#,
        );
        e.url = Some("http://h/api/v1/status".to_owned());
        assert_eq!(
            e.to_string(),
            "not_found: no such route (HTTP 404); the URL requested was \
             http://h/api/v1/status (check --server)"
        );
    }

    #[test]
    fn joins_paths_onto_the_base() {
        let client = reqwest::Client::new();
        let api = Api::new(&Url::parse("http://h:1/").unwrap(), client.clone());
        assert_eq!(api.url("/v1/status"), "http://h:1/v1/status");
        let api = Api::new(&Url::parse("http://h:1/prefix/").unwrap(), client);
        let ch = ChannelName::new("orders").unwrap();
        assert_eq!(
            api.url(&messages_path(&ch)),
            "http://h:1/prefix/v1/channels/orders/messages"
        );
    }
}
