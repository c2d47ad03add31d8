//! Writes on any node: a write that only the holder can make (a publish,
//! a batch publish, `DELETE /v1/channels/{channel}`, Centrifugo's
//! `publish`, `broadcast` and `history_remove`) that reaches a standby is
//! handed once to the holder's advertised URL, and the holder's answer
//! goes back to the client unchanged.
//!
//! Rules:
//! - one hop: the forwarded request carries `Herald-Forwarded-By: <node_id>`,
//!   and a request that already carries it is never forwarded again (a
//!   standby answers it `not_holder`);
//! - the holder gets the same body bytes, `Idempotency-Key` and
//!   `Content-Type`, so a retry through any node publishes once;
//! - the standby checked the client's credentials; it sends the cluster
//!   secret (`Herald-Cluster-Secret`, when configured) instead of them,
//!   and the holder trusts a forwarded request only with it
//!   (`auth_extract.rs`);
//! - no holder known, or the holder unreachable (connect error, timeout,
//!   broken answer) → 503 `no_holder`. Once the request may have reached
//!   the holder, its outcome is unknown to this node: the client retries
//!   with the same `Idempotency-Key`;
//! - the forwarder never follows a redirect (the cluster secret would go
//!   wherever the answer points): a `3xx` answer is a broken answer
//!   (`no_holder`), and so is an answer body over `MAX_ANSWER_BYTES`;
//! - a cluster secret about to travel over plain `http://` to a holder
//!   that is not on loopback is logged as a WARN, once per holder URL;
//! - a forward in flight ends the moment this node takes the lease over
//!   (`ends_forward`): the holder it went to is fenced from then on, so
//!   waiting for its answer (it may be frozen) only delays the client. The
//!   caller then commits the publish itself or answers `no_holder`
//!   (`publish.rs`).

use std::time::Duration;

use bytes::Bytes;
use herald_auth::Secret;
use herald_core::{NewMessage, Offset};
use herald_lease::{LeaseState, Release, StopReason};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::sync::watch;

use crate::metrics;
use crate::node_error::{HolderWrite, StartError};
use crate::node_error::{NodeError, NodeResult};
use crate::role::LeaseView;

/// The header that marks a forwarded request, with the forwarding node's id.
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("herald-forwarded-by");
/// The header that carries the cluster secret on a forwarded request.
pub const CLUSTER_SECRET: HeaderName = HeaderName::from_static("herald-cluster-secret");

/// The headers a holder-only write carries besides those every forward
/// carries (`Content-Type`, `Idempotency-Key`), as the calling wing names
/// them with its request: which of the incoming request's go to the
/// holder, and which of the holder's answer come back
/// ([`HolderAnswer::carried_headers`]). The forwarder knows no protocol's
/// headers itself.
#[derive(Debug, Clone, Copy)]
pub struct CarriedHeaders {
    /// Whether an incoming request header (its name, lowercase) goes to
    /// the holder.
    pub request: fn(&HeaderName) -> bool,
    /// Whether a header of the holder's answer comes back.
    pub answer: fn(&HeaderName) -> bool,
}

impl CarriedHeaders {
    /// None beyond those every forward carries.
    pub const NONE: Self = Self {
        request: carry_none,
        answer: carry_none,
    };
}

/// [`CarriedHeaders::NONE`]'s test: no header.
fn carry_none(_: &HeaderName) -> bool {
    false
}

/// Longest the connection to the holder may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Idle connections to the holder are kept this long for reuse.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest answer body taken from a holder, in bytes (1 MiB): the answer
/// to the largest batch (1 000 entries) is well under it. A longer one is
/// a broken answer, read no further.
pub(crate) const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The holder as this node knows it: its id and advertised URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    /// The holder's node id.
    pub node_id: String,
    /// The holder's advertised URL.
    pub url: String,
}

impl HolderView {
    /// This node, while it is holder: `own_id` at `own_url`.
    pub fn this_node(own_id: &str, own_url: &str) -> Self {
        Self {
            node_id: own_id.to_owned(),
            url: own_url.to_owned(),
        }
    }

    /// Another node, as a standby last read it from the lease row, if that
    /// row is held ([`LeaseState::held_by_other`]) and names the holder's
    /// id and URL; `None` when this node knows no holder.
    pub fn from_lease_row(state: &LeaseState) -> Option<Self> {
        let info = state.held_by_other()?;
        Some(Self {
            node_id: info.holder.clone()?,
            url: info.holder_url.clone()?,
        })
    }
}

/// `true` when `state` shows that this node has taken the lease over: it is
/// holder, or it stopped after having been holder (a watch may skip the
/// `Holder` state in between). A forward in flight must not outlive that
/// moment: the holder it went to lost the lease to this node, so it can no
/// longer commit anything, and the publish's outcome there is settled.
///
/// A standby's own drain (`Stopped` with [`Release::NotHeld`]) does not
/// count: the holder it forwards to is unchanged, and a drain lets the
/// requests in flight finish until its deadline.
pub(crate) fn ends_forward(state: &LeaseState) -> bool {
    match state {
        LeaseState::Holder { .. } => true,
        LeaseState::Stopped {
            reason: StopReason::Drained {
                release: Release::NotHeld,
            },
        } => false,
        LeaseState::Stopped { .. } => true,
        LeaseState::Starting | LeaseState::Standby { .. } => false,
    }
}

/// Resolves once `states` shows a state for which [`ends_forward`] holds
/// (at once if the current one does); never if the supervisor ends
/// without reaching one.
async fn taken_over(mut states: watch::Receiver<LeaseState>) {
    if states.wait_for(ends_forward).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `true` when the request was already forwarded by a node.
pub fn was_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_BY)
}

/// The HTTP client that forwards holder-only writes: one per node, pooling its
/// connections to the holder.
#[derive(Debug, Clone)]
pub struct Forwarder {
    client: reqwest::Client,
    node_id: HeaderValue,
    /// This node's advertised URL: a lease row that names it is stale,
    /// never a holder to forward to.
    advertise_url: String,
    /// The cluster secret, sent with every forward; marked sensitive so
    /// that it is never shown in a `Debug` form.
    cluster_secret: Option<HeaderValue>,
    /// The holder URLs already warned about: the cluster secret goes
    /// there in clear.
    warned_in_clear: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// How a forward ended when the holder did not fail it.
#[derive(Debug)]
pub enum Forwarded {
    /// The holder answered (any status): its answer, to return unchanged.
    Answer(HolderAnswer),
    /// This node took the lease over before the holder answered
    /// (`ends_forward`); the request to the holder was dropped. Whether
    /// the holder committed the publish before it lost the lease is unknown
    /// here, but settled: it can commit nothing more.
    TakenOver,
}

/// What a forward needs from the incoming request.
#[derive(Debug)]
pub struct ForwardRequest<'a> {
    /// The method of the route on the holder: `POST` for the publishes
    /// and Centrifugo's `history_remove`, `DELETE` for a channel's
    /// deletion.
    pub method: Method,
    /// The path of the route on the holder (e.g.
    /// `/v1/channels/<channel>/messages`, the channel being a valid name,
    /// safe in a path; `/v1/messages`; `/v1/channels/<channel>`).
    pub path: String,
    /// The request body exactly as received (empty for a deletion).
    pub body: Bytes,
    /// The incoming request's headers (`Idempotency-Key`, `Content-Type`).
    pub headers: &'a HeaderMap,
    /// The other headers the forward carries, both ways.
    pub carry: CarriedHeaders,
}

impl Forwarder {
    /// A forwarder that names `node_id` (advertised at `advertise_url`) in
    /// `Herald-Forwarded-By`, sends
    /// `cluster_secret` (if any) in `Herald-Cluster-Secret`, and waits at
    /// most `timeout` for a holder's whole answer (at most
    /// `CONNECT_TIMEOUT` of it to connect). A holder whose advertised
    /// URL is `https://` is reached over TLS (rustls), its certificate
    /// checked against the system's trust store and `trusted_ca_pem` (PEM
    /// certificates of private CAs), if given.
    ///
    /// # Errors
    /// [`StartError::Config`] when `node_id` or the secret cannot be a
    /// header value, `trusted_ca_pem` holds no usable certificate or the
    /// HTTP client cannot be built.
    pub fn new(
        node_id: &str,
        advertise_url: &str,
        timeout: Duration,
        trusted_ca_pem: Option<&[u8]>,
        cluster_secret: Option<&Secret>,
    ) -> NodeResult<Self, StartError> {
        let node_id = HeaderValue::from_str(node_id).map_err(|_| {
            StartError::Config("node_id must be visible ASCII to name it in a header".to_owned())
        })?;
        let cluster_secret = cluster_secret
            .map(|s| {
                let mut value = HeaderValue::from_str(s.expose()).map_err(|_| {
                    StartError::Config("auth.cluster_secret must be visible ASCII".to_owned())
                })?;
                value.set_sensitive(true);
                Ok::<_, StartError>(value)
            })
            .transpose()?;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            // Never to another place than the holder's advertised URL: the
            // cluster secret would follow the redirect.
            .redirect(reqwest::redirect::Policy::none())
            // Node-to-node traffic: no proxy from the environment.
            .no_proxy();
        if let Some(pem) = trusted_ca_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                StartError::Config(format!(
                    "the trusted CA certificates are not PEM certificates: {e}"
                ))
            })?;
            builder = builder.tls_certs_merge(certificates);
        }
        let client = builder
            .build()
            .map_err(|e| StartError::Config(format!("cannot build the forwarding client: {e}")))?;
        Ok(Self {
            client,
            node_id,
            advertise_url: advertise_url.to_owned(),
            cluster_secret,
            warned_in_clear: std::sync::Arc::default(),
        })
    }

    /// Forwards `write`, a request that reached this standby and that only
    /// the holder makes (the body exactly as received, `headers` those of
    /// the incoming request, of which those `carry` names go along), once
    /// to the holder's route for it, and returns the holder's answer, or
    /// [`Forwarded::TakenOver`] when this node (whose role `lease` shows)
    /// took the lease over first. Wings call it through
    /// `holder_write::on_holder`.
    ///
    /// # Errors
    /// [`NodeError::NotHolder`] naming `write` for a request that was forwarded
    /// to this node already (one hop only); [`NodeError::NoHolder`] when no
    /// holder is known or it cannot be reached.
    pub async fn to_holder(
        &self,
        lease: &dyn LeaseView,
        headers: &HeaderMap,
        write: HolderWrite,
        body: Bytes,
        carry: CarriedHeaders,
    ) -> NodeResult<Forwarded> {
        let state = lease.state();
        if was_forwarded(headers) {
            // One hop only: a forwarded request is never forwarded again.
            return Err(NodeError::NotHolder {
                request: Some(write),
                holder_url: state.holder_url().map(str::to_owned),
            });
        }
        let holder = HolderView::from_lease_row(&state)
            // A row naming this node's own URL is stale (this node is not
            // holder): forwarding to itself would come back as not_holder.
            // (Node ids cannot tell: nodes sharing a data dir share one.)
            .filter(|h| h.url.trim_end_matches('/') != self.advertise_url.trim_end_matches('/'));
        let Some(holder) = holder else {
            metrics::forwarded("no_holder");
            return Err(NodeError::NoHolder);
        };
        let (method, path) = holder_route(&write);
        let request = ForwardRequest {
            method,
            path,
            body,
            headers,
            carry,
        };
        self.forward(&holder.url, request, lease.subscribe()).await
    }

    /// Logs a WARN, once per holder URL, when this forwarder sends a
    /// cluster secret to `holder_url` over plain HTTP on a host that is
    /// not loopback: anyone on the path can read it there. Returns
    /// whether it warned now.
    pub fn warn_secret_in_clear(&self, holder_url: &str) -> bool {
        if self.cluster_secret.is_none() || !secret_in_clear(holder_url) {
            return false;
        }
        let mut warned = self
            .warned_in_clear
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !warned.insert(holder_url.to_owned()) {
            return false;
        }
        tracing::warn!(
            holder_url = %holder_url,
            "forwarding with the cluster secret over plain http to another host: anyone on the \
             path can read the secret; advertise an https:// URL (--advertise-url, --tls-cert) \
             or keep node-to-node traffic on a private network"
        );
        true
    }

    /// Sends `request` to the node at `node_url` (any node, not only the
    /// holder: Centrifugo's emulation requests go to the node that runs
    /// their session) and returns its answer unchanged, with the same
    /// headers, secret and timeouts as [`Forwarder::forward`].
    ///
    /// # Errors
    /// [`NodeError::NoHolder`] when the node cannot be reached or its
    /// answer breaks off.
    pub async fn to_node(
        &self,
        node_url: &str,
        request: ForwardRequest<'_>,
    ) -> NodeResult<HolderAnswer> {
        let url = format!("{}{}", node_url.trim_end_matches('/'), request.path);
        self.warn_secret_in_clear(node_url);
        self.send(&url, request).await
    }

    /// Sends `request` to the holder at `holder_url` and returns its answer
    /// (status, `Content-Type`, `Retry-After` and body) unchanged, or
    /// [`Forwarded::TakenOver`] as soon as `states` (this node's lease
    /// state) shows that this node took the lease over, whichever comes
    /// first.
    ///
    /// # Errors
    /// [`NodeError::NoHolder`] when the holder cannot be reached or its answer
    /// breaks off.
    pub async fn forward(
        &self,
        holder_url: &str,
        request: ForwardRequest<'_>,
        states: watch::Receiver<LeaseState>,
    ) -> NodeResult<Forwarded> {
        let url = format!("{}{}", holder_url.trim_end_matches('/'), request.path);
        let method = request.method.clone();
        self.warn_secret_in_clear(holder_url);
        tokio::select! {
            // An answer that is complete when the takeover is seen wins.
            biased;
            answer = self.send(&url, request) => answer.map(Forwarded::Answer),
            () = taken_over(states) => {
                metrics::forwarded("takeover");
                tracing::warn!(
                    url = %url,
                    method = %method,
                    "this node took the lease over before the holder answered a forwarded request; the forward is dropped"
                );
                Ok(Forwarded::TakenOver)
            }
        }
    }

    /// Sends `request` to `url` and returns the answer (see
    /// [`Forwarder::forward`]).
    async fn send(&self, url: &str, request: ForwardRequest<'_>) -> NodeResult<HolderAnswer> {
        let method = request.method;
        let mut outgoing = self
            .client
            .request(method.clone(), url)
            .header(FORWARDED_BY, self.node_id.clone())
            .body(request.body);
        if let Some(secret) = &self.cluster_secret {
            outgoing = outgoing.header(CLUSTER_SECRET, secret.clone());
        }
        for name in [CONTENT_TYPE, HeaderName::from_static("idempotency-key")] {
            if let Some(value) = request.headers.get(&name) {
                outgoing = outgoing.header(name, value.clone());
            }
        }
        // The wing's own headers.
        for (name, value) in request.headers {
            if (request.carry.request)(name) && name != CONTENT_TYPE {
                outgoing = outgoing.header(name.clone(), value.clone());
            }
        }
        let answer = match outgoing.send().await {
            Ok(answer) => answer,
            Err(e) => return Err(failed(&method, url, &e)),
        };
        let status = answer.status();
        if status.is_redirection() {
            metrics::forwarded("error");
            tracing::warn!(
                url = %url,
                status = status.as_u16(),
                "the holder's advertised URL answered a redirect, which forwards never follow; \
                 advertise the URL that serves the API itself"
            );
            return Err(NodeError::NoHolder);
        }
        let content_type = answer.headers().get(CONTENT_TYPE).cloned();
        let retry_after = answer.headers().get(RETRY_AFTER).cloned();
        let mut carried_headers = HeaderMap::new();
        for (name, value) in answer.headers() {
            if (request.carry.answer)(name) {
                carried_headers.append(name.clone(), value.clone());
            }
        }
        let body = read_answer(&method, url, answer).await?;
        metrics::forwarded("ok");
        tracing::debug!(
            url = %url,
            method = %method,
            status = status.as_u16(),
            "request forwarded to the holder"
        );
        Ok(HolderAnswer {
            status,
            content_type,
            retry_after,
            carried_headers: Box::new(carried_headers),
            body,
        })
    }
}

/// The holder's answer to a forwarded request, read whole: what a wing
/// returns unchanged to its client (status, `Content-Type`,
/// `Retry-After`, body), or reads as a publish's outcome
/// ([`HolderAnswer::published`]).
#[derive(Debug)]
pub struct HolderAnswer {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    retry_after: Option<HeaderValue>,
    /// The answer headers the request's [`CarriedHeaders`] named.
    carried_headers: Box<HeaderMap>,
    body: Bytes,
}

/// Why the holder refused a forwarded publish, read from its answer's
/// status ([`HolderAnswer::published`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderRefusal {
    /// 401: the holder refused the forward's credentials (the cluster
    /// secret differs between the nodes).
    Unauthorized,
    /// 403: the publish is not allowed.
    Forbidden,
    /// 429: the holder's rate limit refused it.
    RateLimited,
    /// 413: the message is larger than the holder takes.
    TooLarge,
    /// Another `4xx`: the holder found the publish invalid.
    Invalid,
    /// A `5xx`, or a success whose body is not a publish's answer.
    Failed,
}

impl HolderAnswer {
    /// The answer's HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The answer's `Content-Type`, if it had one.
    pub fn content_type(&self) -> Option<&HeaderValue> {
        self.content_type.as_ref()
    }

    /// The answer's `Retry-After`, if it had one.
    pub fn retry_after(&self) -> Option<&HeaderValue> {
        self.retry_after.as_ref()
    }

    /// The answer's headers that the request's [`CarriedHeaders`] named,
    /// as the holder sent them.
    pub fn carried_headers(&self) -> &HeaderMap {
        &self.carried_headers
    }

    /// The answer's body, at most `MAX_ANSWER_BYTES`.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The offset the holder gave a forwarded publish (its answer
    /// `{"channel","offset","published_at"}` with 201, or 200 for a
    /// repeated idempotency key).
    ///
    /// # Errors
    /// The [`HolderRefusal`] its error status says, or
    /// [`HolderRefusal::Failed`] for a success that names no offset.
    pub fn published(&self) -> Result<Offset, HolderRefusal> {
        #[derive(serde::Deserialize)]
        struct Published {
            offset: Offset,
        }
        if !self.status.is_success() {
            return Err(match self.status {
                StatusCode::UNAUTHORIZED => HolderRefusal::Unauthorized,
                StatusCode::FORBIDDEN => HolderRefusal::Forbidden,
                StatusCode::TOO_MANY_REQUESTS => HolderRefusal::RateLimited,
                StatusCode::PAYLOAD_TOO_LARGE => HolderRefusal::TooLarge,
                s if s.is_client_error() => HolderRefusal::Invalid,
                _ => HolderRefusal::Failed,
            });
        }
        serde_json::from_slice::<Published>(&self.body)
            .map(|p| p.offset)
            .map_err(|_| HolderRefusal::Failed)
    }
}

/// The headers and body of a Herald publish of `message`, for a publish
/// that did not come as one (Centrifugo's): `Content-Type: application/json`,
/// its `Idempotency-Key` if any, and the body `{"data": ..., "tags": ...}`.
pub(crate) fn publish_request(message: &NewMessage) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(key) = &message.idempotency_key {
        if let Ok(value) = HeaderValue::from_str(key.as_str()) {
            headers.insert(HeaderName::from_static("idempotency-key"), value);
        }
    }
    let body = match message.tags.to_json() {
        None => format!("{{\"data\":{}}}", message.data.to_json_text()),
        Some(tags) => format!(
            "{{\"data\":{},\"tags\":{tags}}}",
            message.data.to_json_text()
        ),
    };
    (headers, Bytes::from(body))
}

/// The method and path of the holder's route that takes `write`.
fn holder_route(write: &HolderWrite) -> (Method, String) {
    match write {
        HolderWrite::Publish(channel) => (Method::POST, format!("/v1/channels/{channel}/messages")),
        HolderWrite::BatchPublish => (Method::POST, "/v1/messages".to_owned()),
        HolderWrite::DeleteChannel(channel) => (Method::DELETE, format!("/v1/channels/{channel}")),
        HolderWrite::RemoveHistory(_) => (Method::POST, "/api/history_remove".to_owned()),
        HolderWrite::Stream { method, path, .. } => (method.clone(), path.clone()),
    }
}

/// The error of a commit attempted after a takeover (a forward that ended
/// with [`Forwarded::TakenOver`]): every error that would say "nothing was
/// stored" speaks for this node only, not for the old holder, so it
/// becomes `no_holder` (outcome unknown).
pub(crate) fn after_takeover_error(e: NodeError) -> NodeError {
    match e {
        NodeError::QueueFull
        | NodeError::LeaseLost
        | NodeError::Draining
        | NodeError::NotHolder { .. } => NodeError::NoHolder,
        e => e,
    }
}

/// The holder's answer body, up to [`MAX_ANSWER_BYTES`].
///
/// # Errors
/// [`NodeError::NoHolder`] when it breaks off or is longer (logged, counted).
async fn read_answer(
    method: &Method,
    url: &str,
    mut answer: reqwest::Response,
) -> NodeResult<Bytes> {
    let too_long = || {
        metrics::forwarded("error");
        tracing::warn!(
            url = %url,
            limit = MAX_ANSWER_BYTES,
            "the holder's answer to a forwarded request is too long; read no further"
        );
        NodeError::NoHolder
    };
    if answer
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_long());
    }
    let mut body = Vec::new();
    loop {
        match answer.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(too_long());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Bytes::from(body)),
            Err(e) => return Err(failed(method, url, &e)),
        }
    }
}

/// Whether a cluster secret sent to `url` travels in clear to another
/// host: plain `http://` to a host that is not loopback (`localhost`,
/// `127.0.0.0/8`, `::1`). A URL that does not parse counts as in clear.
fn secret_in_clear(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return true;
    };
    if url.scheme() != "http" {
        return false;
    }
    let Some(host) = url.host_str() else {
        return true;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return !ip.to_canonical().is_loopback();
    }
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    name != "localhost" && !name.ends_with(".localhost")
}

/// Logs a failed forward and counts it; the client gets `no_holder`. The
/// record's `error` is the whole chain of causes
/// ([`error_with_causes`]), so that it says "Connection refused" or
/// "dns error", not only "error sending request".
fn failed(method: &Method, url: &str, e: &reqwest::Error) -> NodeError {
    metrics::forwarded("error");
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "answer"
    };
    tracing::warn!(
        url = %url,
        method = %method,
        kind,
        error = %error_with_causes(e),
        "cannot forward a request to the holder"
    );
    NodeError::NoHolder
}

/// `e` and each of its causes (`source()`), joined by `: `: an HTTP
/// client's error shows only its outermost layer ("error sending request
/// for url ...") and keeps the reason ("Connection refused (os error
/// 111)") in its causes. A cause whose text the previous one already
/// holds is left out.
pub(crate) fn error_with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let part = c.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use herald_core::{FencingToken, Lease, LeaseInfo};

    use super::*;

    fn standby(holder: Option<&str>, url: Option<&str>, expires_in_ms: i64) -> LeaseState {
        LeaseState::Standby {
            holder: Some(LeaseInfo {
                name: "writer".to_owned(),
                holder: holder.map(str::to_owned),
                holder_url: url.map(str::to_owned),
                token: FencingToken(3),
                expires_in_ms,
                renewed_ms_ago: 0,
            }),
        }
    }

    #[test]
    fn the_holder_is_known_only_while_the_row_is_held() {
        let held = standby(Some("b"), Some("http://b"), 1000);
        assert_eq!(
            HolderView::from_lease_row(&held),
            Some(HolderView {
                node_id: "b".to_owned(),
                url: "http://b".to_owned()
            })
        );
        let other = HolderView::from_lease_row;
        assert_eq!(other(&standby(Some("b"), Some("http://b"), 0)), None);
        assert_eq!(other(&standby(None, None, 1000)), None);
        assert_eq!(other(&LeaseState::Starting), None);
        assert_eq!(other(&LeaseState::Standby { holder: None }), None);
        assert_eq!(HolderView::this_node("me", "http://me").node_id, "me");
    }

    #[test]
    fn a_forward_ends_once_this_node_has_taken_the_lease_over() {
        let holder = LeaseState::Holder {
            lease: Lease {
                name: "writer".to_owned(),
                holder: "me".to_owned(),
                holder_url: "http://me".to_owned(),
                token: FencingToken(4),
            },
            safety_deadline: herald_lease::ClockInstant::ORIGIN,
        };
        let stopped = |reason| LeaseState::Stopped { reason };
        let drained = |release| stopped(StopReason::Drained { release });
        // Holder, even past its safety deadline, and every stop that only a
        // holder reaches.
        assert!(ends_forward(&holder));
        assert!(ends_forward(&drained(Release::Released)));
        assert!(ends_forward(&drained(Release::Failed)));
        assert!(ends_forward(&stopped(StopReason::LeaseLost {
            token: FencingToken(4)
        })));
        // Still forwarding to the same holder: starting, standby (whatever
        // row it read), or a standby's own drain.
        assert!(!ends_forward(&LeaseState::Starting));
        assert!(!ends_forward(&LeaseState::Standby { holder: None }));
        assert!(!ends_forward(&standby(Some("b"), Some("http://b"), 1000)));
        assert!(!ends_forward(&standby(Some("c"), Some("http://c"), 0)));
        assert!(!ends_forward(&drained(Release::NotHeld)));
    }

    #[test]
    fn a_secret_in_clear_to_another_host_is_warned_about_once() {
        for clear in [
            "http://10.0.0.5:7700",
            "http://node-b.internal",
            "http://[2001:db8::1]:7700",
            "not a url",
        ] {
            assert!(secret_in_clear(clear), "{clear}");
        }
        for safe in [
            "https://10.0.0.5:7700",
            "http://127.0.0.1:7700",
            "http://localhost:7700",
            "http://[::1]:7700",
            "http://node.localhost",
        ] {
            assert!(!secret_in_clear(safe), "{safe}");
        }
        let secret = Secret::new("a cluster secret of 16+ bytes".to_owned());
        let forwarder = Forwarder::new(
            "me",
            "http://me",
            Duration::from_secs(1),
            None,
            Some(&secret),
        )
        .unwrap();
        assert!(forwarder.warn_secret_in_clear("http://10.0.0.5:7700"));
        assert!(
            !forwarder.warn_secret_in_clear("http://10.0.0.5:7700"),
            "twice"
        );
        assert!(forwarder.warn_secret_in_clear("http://10.0.0.6:7700"));
        assert!(!forwarder.warn_secret_in_clear("https://10.0.0.7:7700"));
        // Without a secret there is nothing to leak.
        let plain = Forwarder::new("me", "http://me", Duration::from_secs(1), None, None).unwrap();
        assert!(!plain.warn_secret_in_clear("http://10.0.0.5:7700"));
    }

    /// A stand-in holder on 127.0.0.1 that reads each request (head and
    /// `Content-Length` body), counts it, and writes `answer`; its URL
    /// and the count.
    async fn answering(
        answer: Vec<u8>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = std::sync::Arc::clone(&count);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut got = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while got.len() < head_end + length {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = socket.write_all(&answer).await;
                let _ = socket.shutdown().await;
            }
        });
        (url, count)
    }

    /// Forwards a publish with a cluster secret to `holder_url`.
    async fn forward_to(holder_url: &str) -> NodeResult<Forwarded> {
        let secret = Secret::new("a cluster secret of 16+ bytes".to_owned());
        let forwarder = Forwarder::new(
            "me",
            "http://me",
            Duration::from_secs(10),
            None,
            Some(&secret),
        )
        .unwrap();
        let (_states, watched) = watch::channel(LeaseState::Starting);
        let headers = HeaderMap::new();
        let request = ForwardRequest {
            method: Method::POST,
            path: "/v1/channels/c/messages".to_owned(),
            body: Bytes::from_static(b"{\"data\":1}"),
            headers: &headers,
            carry: CarriedHeaders::NONE,
        };
        forwarder.forward(holder_url, request, watched).await
    }

    /// The forwarder brings back exactly the answer headers the calling
    /// wing names: none of a protocol's own (`Stream-*`) unless named.
    #[tokio::test]
    async fn only_the_headers_the_wing_names_come_back() {
        let (holder, _) = answering(
            b"HTTP/1.1 204 No Content\r\nx-wing: 1\r\nstream-next-offset: 5\r\n\
              content-length: 0\r\nconnection: close\r\n\r\n"
                .to_vec(),
        )
        .await;
        let forwarder =
            Forwarder::new("me", "http://me", Duration::from_secs(10), None, None).unwrap();
        let headers = HeaderMap::new();
        let send = |carry: CarriedHeaders| {
            let request = ForwardRequest {
                method: Method::POST,
                path: "/s".to_owned(),
                body: Bytes::new(),
                headers: &headers,
                carry,
            };
            forwarder.to_node(&holder, request)
        };
        let none = send(CarriedHeaders::NONE).await.unwrap();
        assert!(none.carried_headers().is_empty(), "{none:?}");
        let wing = CarriedHeaders {
            request: |_| false,
            answer: |name| name.as_str() == "x-wing",
        };
        let named = send(wing).await.unwrap();
        let names: Vec<&str> = named.carried_headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-wing"]);
    }

    /// A holder URL that answers a redirect does not get the publish
    /// (and its cluster secret) sent on: the redirect is not followed and
    /// the forward fails (`no_holder`).
    #[tokio::test]
    async fn a_redirect_is_never_followed() {
        let (elsewhere, reached) = answering(
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".to_vec(),
        )
        .await;
        for status in [
            "301 Moved Permanently",
            "307 Temporary Redirect",
            "308 Permanent Redirect",
        ] {
            let redirect = format!(
                "HTTP/1.1 {status}\r\nlocation: {elsewhere}/v1/channels/c/messages\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n"
            );
            let (holder, asked) = answering(redirect.into_bytes()).await;
            let outcome = forward_to(&holder).await;
            assert!(
                matches!(outcome, Err(NodeError::NoHolder)),
                "{status}: {outcome:?}"
            );
            assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
        assert_eq!(
            reached.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a redirect was followed"
        );
    }

    /// An answer body over [`MAX_ANSWER_BYTES`] is a broken answer
    /// (`no_holder`), with a `Content-Length` or without one; one within
    /// it is returned.
    #[tokio::test]
    async fn the_answer_body_is_capped() {
        let big = vec![b'x'; MAX_ANSWER_BYTES + 1];
        let mut with_length = format!(
            "HTTP/1.1 201 Created\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            big.len()
        )
        .into_bytes();
        with_length.extend_from_slice(&big);
        let mut until_close = b"HTTP/1.1 201 Created\r\nconnection: close\r\n\r\n".to_vec();
        until_close.extend_from_slice(&big);
        for answer in [with_length, until_close] {
            let (holder, _) = answering(answer).await;
            let outcome = forward_to(&holder).await;
            assert!(matches!(outcome, Err(NodeError::NoHolder)), "{outcome:?}");
        }
        let (holder, _) = answering(
            b"HTTP/1.1 201 Created\r\ncontent-length: 12\r\nconnection: close\r\n\r\n{\"offset\":1}"
                .to_vec(),
        )
        .await;
        match forward_to(&holder).await {
            Ok(Forwarded::Answer(answer)) => {
                assert_eq!(answer.status().as_u16(), 201);
                assert_eq!(&answer.body()[..], b"{\"offset\":1}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A holder that refuses the connection: the WARN says so in its
    /// `error` (the HTTP client's own text, "error sending request for
    /// url", hides the cause in its sources), with the method and URL.
    #[tokio::test]
    async fn a_failed_forward_logs_its_cause() {
        // A port that nothing listens on: bound, then closed.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let holder = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let lines = herald_core::log_capture::LogLines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .json()
            .flatten_event(true)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let outcome = forward_to(&holder).await;
        assert!(matches!(outcome, Err(NodeError::NoHolder)), "{outcome:?}");
        let text = lines.text();
        let records: Vec<serde_json::Value> = lines
            .records()
            .into_iter()
            .filter(|r: &serde_json::Value| {
                r["message"] == "cannot forward a request to the holder"
            })
            .collect();
        let [record] = &records[..] else {
            panic!("{text}");
        };
        assert_eq!(record["level"], "WARN");
        assert_eq!(record["kind"], "connect");
        assert_eq!(record["method"], "POST");
        let error = record["error"].as_str().unwrap().to_ascii_lowercase();
        assert!(error.contains("connection refused"), "{error}");
    }

    #[test]
    fn the_causes_of_an_error_are_joined_once() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl std::fmt::Display for Layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Layer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer("Connection refused", None))),
            ))),
        );
        assert_eq!(
            error_with_causes(&e),
            "error sending request: client error (Connect): Connection refused"
        );
        let repeats = Layer("a: b", Some(Box::new(Layer("b", None))));
        assert_eq!(error_with_causes(&repeats), "a: b");
    }

    #[test]
    fn forwarded_requests_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!was_forwarded(&h));
        h.insert(FORWARDED_BY, HeaderValue::from_static("node-b"));
        assert!(was_forwarded(&h));
    }
}
