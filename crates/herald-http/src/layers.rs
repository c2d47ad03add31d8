//! The router's per-request checks as plain tower services: each decides
//! at once, from the request's head, whether the request goes on or is
//! answered here, so a request that passes pays neither a boxed future
//! nor a boxed copy of the inner service per layer (what
//! `axum::middleware::from_fn` costs). The checks themselves are in
//! `edge.rs` and `conn_limit.rs`.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures::future::{BoxFuture, Either, Ready};
use tower::{Layer, Service};
use tracing::instrument::Instrumented;
use tracing::Instrument;

use crate::conn_limit::{hold_slot, Admission, ConnectionLimits};
use crate::edge::{
    duplicate_host_refusal, json_refusal, loopback_host_refusal, websocket_origin_refusal,
};
use crate::error::Error;
use crate::shared::Shared;

/// A check of a request's head: `Some` is the answer that refuses it.
pub trait Check: Clone + Send + Sync + 'static {
    /// The answer that refuses `request`, or `None` when it may go on.
    fn refusal(&self, request: &Request) -> Option<Response>;
}

/// Runs a [`Check`] before the inner service.
#[derive(Clone)]
pub struct CheckLayer<C>(pub C);

impl<S, C: Check> Layer<S> for CheckLayer<C> {
    type Service = Checked<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Checked {
            inner,
            check: self.0.clone(),
        }
    }
}

/// The service of a [`CheckLayer`].
#[derive(Clone)]
pub struct Checked<S, C> {
    inner: S,
    check: C,
}

/// An answer made at once, or the inner service's future.
type CheckedFuture<F> = Either<Ready<Result<Response, Infallible>>, F>;

impl<S, C> Service<Request> for Checked<S, C>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    C: Check,
{
    type Response = Response;
    type Error = Infallible;
    type Future = CheckedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.check.refusal(&request) {
            Some(refusal) => Either::Left(futures::future::ready(Ok(refusal))),
            None => Either::Right(self.inner.call(request)),
        }
    }
}

/// What every request passes inside CORS, in this order: the request
/// span that names the node, the connection limit of a request that came
/// through a trusted proxy (`conn_limit.rs`), and the `Origin` check of a
/// WebSocket upgrade (`edge.rs`).
#[derive(Clone)]
pub struct RequestLayer {
    /// The node's state (its id, the CORS allow-list).
    pub shared: Arc<Shared>,
    /// Connections per client address.
    pub limits: Arc<ConnectionLimits>,
}

impl<S> Layer<S> for RequestLayer {
    type Service = RequestService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`RequestLayer`].
#[derive(Clone)]
pub struct RequestService<S> {
    inner: S,
    layer: RequestLayer,
}

/// The inner service's future, or (for a request through a trusted
/// proxy, whose answer holds its client's connection slot) a boxed one.
type Proceed<F> = Either<F, BoxFuture<'static, Result<Response, Infallible>>>;

impl<S> Service<Request> for RequestService<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Instrumented<CheckedFuture<Proceed<S::Future>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        // Runs each request in a span that carries the node's id, so that
        // every log record of a handler names the node. Disabled (and not
        // formatted) unless DEBUG is on.
        let span = tracing::debug_span!(
            "request",
            node_id = %self.layer.shared.settings.node_id,
            method = %request.method(),
            path = %request.uri().path(),
        );
        let future = span.in_scope(|| {
            let slot = match self.layer.limits.admit_proxied(&mut request) {
                Admission::Direct => None,
                Admission::Proxied(slot) => Some(slot),
                Admission::Refused => {
                    let refusal = Error::TooManyConnections.into_response();
                    return Either::Left(futures::future::ready(Ok(refusal)));
                }
            };
            if let Some(refusal) = websocket_origin_refusal(&self.layer.shared, &request) {
                return Either::Left(futures::future::ready(Ok(refusal)));
            }
            let inner = self.inner.call(request);
            Either::Right(match slot {
                None => Either::Left(inner),
                Some(slot) => Either::Right(Box::pin(async move {
                    let response = inner.await?;
                    Ok(hold_slot(response, slot))
                }) as BoxFuture<'static, _>),
            })
        });
        future.instrument(span)
    }
}

/// Refuses a request with more than one `Host` field (400
/// `invalid_host`), then, on a loopback node without access control, one
/// for a host name that is not loopback (`edge.rs`).
#[derive(Clone)]
pub struct LoopbackHost(pub Arc<Shared>);

impl Check for LoopbackHost {
    fn refusal(&self, request: &Request) -> Option<Response> {
        duplicate_host_refusal(request).or_else(|| loopback_host_refusal(&self.0, request))
    }
}

/// Refuses a `POST` without a JSON `Content-Type` (`edge.rs`).
#[derive(Clone)]
pub struct RequireJson;

impl Check for RequireJson {
    fn refusal(&self, request: &Request) -> Option<Response> {
        json_refusal(request)
    }
}
