//! Writes on any node: a publish that reaches a standby is handed once to
//! the holder's advertised URL, and the holder's answer goes back to the
//! client unchanged.
//!
//! Rules:
//! - one hop: the forwarded request carries `Herald-Forwarded-By: <node_id>`,
//!   and a request that already carries it is never forwarded again (a
//!   standby answers it `not_holder`);
//! - the holder gets the same body bytes, `Idempotency-Key` and
//!   `Content-Type`, so a retry through any node publishes once;
//! - the standby checked the client's credentials; it sends the cluster
//!   secret (`Herald-Cluster-Secret`, when configured) instead of them,
//!   and the holder trusts a forwarded publish only with it
//!   (`auth/extract.rs`);
//! - no holder known, or the holder unreachable (connect error, timeout,
//!   broken answer) → 503 `no_holder`. Once the request may have reached
//!   the holder, its outcome is unknown to this node: the client retries
//!   with the same `Idempotency-Key`;
//! - a forward in flight ends the moment this node takes the lease over
//!   ([`ends_forward`]): the holder it went to is fenced from then on, so
//!   waiting for its answer (it may be frozen) only delays the client. The
//!   caller then commits the publish itself or answers `no_holder`
//!   (`api/publish.rs`).

use std::time::Duration;

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use herald_lease::{LeaseState, Release, StopReason};
use tokio::sync::watch;

use crate::auth::{Secret, CLUSTER_SECRET};
use crate::{metrics, Error, Result, StartError};

/// The header that marks a forwarded publish, with the forwarding node's id.
pub(crate) const FORWARDED_BY: HeaderName = HeaderName::from_static("herald-forwarded-by");

/// Longest the connection to the holder may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Idle connections to the holder are kept this long for reuse.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The holder as this node knows it: its id and advertised URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderView {
    /// The holder's node id.
    pub(crate) node_id: String,
    /// The holder's advertised URL.
    pub(crate) url: String,
}

impl HolderView {
    /// This node, while it is holder: `own_id` at `own_url`.
    pub(crate) fn this_node(own_id: &str, own_url: &str) -> Self {
        Self {
            node_id: own_id.to_owned(),
            url: own_url.to_owned(),
        }
    }

    /// Another node, as a standby last read it from the lease row, if that
    /// row is held ([`LeaseState::held_by_other`]) and names the holder's
    /// id and URL; `None` when this node knows no holder.
    pub(crate) fn from_lease_row(state: &LeaseState) -> Option<Self> {
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
pub(crate) fn was_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_BY)
}

/// The HTTP client that forwards publishes: one per node, pooling its
/// connections to the holder.
#[derive(Debug, Clone)]
pub(crate) struct Forwarder {
    client: reqwest::Client,
    node_id: HeaderValue,
    /// The cluster secret, sent with every forward; marked sensitive so
    /// that it is never shown in a `Debug` form.
    cluster_secret: Option<HeaderValue>,
}

/// How a forward ended when the holder did not fail it.
#[derive(Debug)]
pub(crate) enum Forwarded {
    /// The holder answered (any status): its answer, to return unchanged.
    Answer(Response),
    /// This node took the lease over before the holder answered
    /// ([`ends_forward`]); the request to the holder was dropped. Whether
    /// the holder committed the publish before it lost the lease is unknown
    /// here, but settled: it can commit nothing more.
    TakenOver,
}

/// What a forward needs from the incoming request.
#[derive(Debug)]
pub(crate) struct ForwardRequest<'a> {
    /// The path of the publish route on the holder (e.g.
    /// `/v1/channels/<channel>/messages`, the channel being a valid name,
    /// safe in a path; or `/v1/messages`).
    pub(crate) path: String,
    /// The publish body exactly as received.
    pub(crate) body: Bytes,
    /// The incoming request's headers (`Idempotency-Key`, `Content-Type`).
    pub(crate) headers: &'a HeaderMap,
}

impl Forwarder {
    /// A forwarder that names `node_id` in `Herald-Forwarded-By`, sends
    /// `cluster_secret` (if any) in `Herald-Cluster-Secret`, and waits at
    /// most `timeout` for a holder's whole answer (at most
    /// [`CONNECT_TIMEOUT`] of it to connect). A holder whose advertised
    /// URL is `https://` is reached over TLS (rustls), its certificate
    /// checked against the system's trust store and `trusted_ca_pem` (PEM
    /// certificates of private CAs), if given.
    ///
    /// # Errors
    /// [`StartError::Config`] when `node_id` or the secret cannot be a
    /// header value, `trusted_ca_pem` holds no usable certificate or the
    /// HTTP client cannot be built.
    pub(crate) fn new(
        node_id: &str,
        timeout: Duration,
        trusted_ca_pem: Option<&[u8]>,
        cluster_secret: Option<&Secret>,
    ) -> Result<Self, StartError> {
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
            cluster_secret,
        })
    }

    /// Sends `request` to the holder at `holder_url` and returns its answer
    /// (status, `Content-Type`, `Retry-After` and body) unchanged, or
    /// [`Forwarded::TakenOver`] as soon as `states` (this node's lease
    /// state) shows that this node took the lease over, whichever comes
    /// first.
    ///
    /// # Errors
    /// [`Error::NoHolder`] when the holder cannot be reached or its answer
    /// breaks off.
    pub(crate) async fn forward(
        &self,
        holder_url: &str,
        request: ForwardRequest<'_>,
        states: watch::Receiver<LeaseState>,
    ) -> Result<Forwarded> {
        let url = format!("{}{}", holder_url.trim_end_matches('/'), request.path);
        tokio::select! {
            // An answer that is complete when the takeover is seen wins.
            biased;
            answer = self.send(&url, request) => answer.map(Forwarded::Answer),
            () = taken_over(states) => {
                metrics::forwarded("takeover");
                tracing::warn!(
                    url = %url,
                    "this node took the lease over before the holder answered a forwarded publish; the forward is dropped"
                );
                Ok(Forwarded::TakenOver)
            }
        }
    }

    /// Sends `request` to `url` and returns the answer (see
    /// [`Forwarder::forward`]).
    async fn send(&self, url: &str, request: ForwardRequest<'_>) -> Result<Response> {
        let mut outgoing = self
            .client
            .post(url)
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
        let answer = match outgoing.send().await {
            Ok(answer) => answer,
            Err(e) => return Err(failed(url, &e)),
        };
        let status = answer.status();
        let content_type = answer.headers().get(CONTENT_TYPE).cloned();
        let retry_after = answer.headers().get(RETRY_AFTER).cloned();
        let body = match answer.bytes().await {
            Ok(body) => body,
            Err(e) => return Err(failed(url, &e)),
        };
        metrics::forwarded("ok");
        tracing::debug!(url = %url, status = status.as_u16(), "publish forwarded to the holder");
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if let Some(value) = content_type {
            headers.insert(CONTENT_TYPE, value);
        }
        if let Some(value) = retry_after {
            headers.insert(RETRY_AFTER, value);
        }
        Ok(response)
    }
}

/// Logs a failed forward and counts it; the client gets `no_holder`.
fn failed(url: &str, e: &reqwest::Error) -> Error {
    metrics::forwarded("error");
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "answer"
    };
    tracing::warn!(url = %url, kind, error = %e, "cannot forward a publish to the holder");
    Error::NoHolder
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
    fn forwarded_requests_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!was_forwarded(&h));
        h.insert(FORWARDED_BY, HeaderValue::from_static("node-b"));
        assert!(was_forwarded(&h));
    }
}
