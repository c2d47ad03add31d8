//! Connections per client IP address: a count of what each address has
//! open, and the address a request comes from.
//!
//! A direct client is counted per TCP connection (the accept loop in
//! `listener.rs` takes a [`Slot`] for each). A reverse proxy listed in
//! [`crate::ServerConfig::trusted_proxies`] multiplexes many clients over
//! its connections, so its connections are not counted; each request it
//! carries is counted instead, by the client address in its
//! `X-Forwarded-For` header, for as long as its answer lasts (the router's
//! middleware in `api/mod.rs` takes the [`Slot`]; an SSE stream or a
//! WebSocket session keeps it).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::{metrics, AppState, Error};

/// The address a connection was accepted from, in each request's
/// extensions (set by the accept loop).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) SocketAddr);

/// How many connections each client address has open, against a limit.
#[derive(Debug)]
pub(crate) struct ConnectionLimits {
    /// Most open at once per address.
    per_ip: usize,
    /// Peers whose `X-Forwarded-For` is believed.
    trusted: Vec<IpAddr>,
    /// Open per address; an address leaves the map at zero.
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl ConnectionLimits {
    /// Limits of `per_ip` open per address; `trusted` are the proxies whose
    /// `X-Forwarded-For` is believed.
    pub(crate) fn new(per_ip: usize, trusted: Vec<IpAddr>) -> Arc<Self> {
        Arc::new(Self {
            per_ip,
            trusted,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `ip` is a trusted proxy.
    pub(crate) fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.contains(&canonical(ip))
    }

    /// Counts one more open for `ip`, or `None` (counted in
    /// `herald_connections_refused_total`) when it has the limit open
    /// already. The count drops when the [`Slot`] is dropped.
    pub(crate) fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let ip = canonical(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.per_ip {
            drop(open);
            metrics::connection_refused("per_ip");
            return None;
        }
        *count += 1;
        Some(Slot {
            limits: Arc::clone(self),
            ip,
        })
    }

    /// The client address of a request that came over a connection from
    /// `peer`: from a trusted proxy, the last address of `X-Forwarded-For`
    /// that is not itself a trusted proxy (each proxy appends the address
    /// it got the request from; those left of a trusted one are only what
    /// the client wrote); otherwise, or without a usable header, `peer`.
    pub(crate) fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(peer) {
            return canonical(peer);
        }
        let mut client = canonical(peer);
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .collect::<Vec<_>>();
        for hop in hops.into_iter().rev() {
            match hop.trim().parse::<IpAddr>() {
                Ok(ip) if self.is_trusted(ip) => client = canonical(ip),
                Ok(ip) => return canonical(ip),
                // Not an address (a name, "unknown", a port): stop at the
                // last address known.
                Err(_) => break,
            }
        }
        client
    }

    /// Open connections of `ip` now (for tests).
    #[cfg(test)]
    pub(crate) fn open(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&canonical(ip)).copied().unwrap_or(0)
    }
}

/// An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`, as a dual-stack
/// socket reports IPv4 peers) as the IPv4 address, so one client has one
/// count.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// A proxied request's [`Slot`], in its extensions, shared with whatever
/// outlives the request (a WebSocket session).
#[derive(Debug, Clone)]
pub(crate) struct ClientSlot {
    /// Held, never read: dropping the last clone frees the place.
    _slot: Arc<Slot>,
}

/// Counts a request that came through a trusted proxy against its client's
/// address (`X-Forwarded-For`) for as long as its answer lasts: the slot
/// rides along with the response body (an SSE stream holds it to its end)
/// and, through [`ClientSlot`], into a WebSocket session. Requests from
/// other peers pass untouched (their connection holds a slot already).
/// Over the limit: `429 too_many_connections`.
pub(crate) async fn limit_proxied(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(Peer(peer)) = request.extensions().get::<Peer>().copied() else {
        return next.run(request).await;
    };
    let limits = &state.shared.conn_limits;
    if !limits.is_trusted(peer.ip()) {
        return next.run(request).await;
    }
    let client = limits.client_ip(peer.ip(), request.headers());
    let Some(slot) = limits.try_acquire(client) else {
        return Error::TooManyConnections.into_response();
    };
    let slot = Arc::new(slot);
    request.extensions_mut().insert(ClientSlot {
        _slot: Arc::clone(&slot),
    });
    next.run(request)
        .await
        .map(|inner| Body::new(HeldBody { inner, _slot: slot }))
}

/// A response body that holds a [`Slot`] until it is dropped.
struct HeldBody {
    inner: Body,
    _slot: Arc<Slot>,
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// One open connection (or proxied request) of an address; dropping it
/// frees its place.
#[derive(Debug)]
pub(crate) struct Slot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_limit_holds_per_address_and_frees_on_drop() {
        let limits = ConnectionLimits::new(2, Vec::new());
        let a1 = limits.try_acquire(ip("10.0.0.1")).unwrap();
        let _a2 = limits.try_acquire(ip("::ffff:10.0.0.1")).unwrap();
        assert!(limits.try_acquire(ip("10.0.0.1")).is_none(), "third one");
        let _b = limits.try_acquire(ip("10.0.0.2")).unwrap();
        drop(a1);
        assert_eq!(limits.open(ip("10.0.0.1")), 1);
        let _a3 = limits.try_acquire(ip("10.0.0.1")).unwrap();
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let limits = ConnectionLimits::new(2, vec![ip("10.0.0.9"), ip("10.0.0.8")]);
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.1.1.1, 2.2.2.2, 10.0.0.8"),
        );
        // From a client: the header is ignored.
        assert_eq!(limits.client_ip(ip("3.3.3.3"), &h), ip("3.3.3.3"));
        // From a trusted proxy: the last address that is not a proxy.
        assert_eq!(limits.client_ip(ip("10.0.0.9"), &h), ip("2.2.2.2"));
        h.insert("x-forwarded-for", HeaderValue::from_static("nonsense"));
        assert_eq!(limits.client_ip(ip("10.0.0.9"), &h), ip("10.0.0.9"));
        h.remove("x-forwarded-for");
        assert_eq!(limits.client_ip(ip("10.0.0.9"), &h), ip("10.0.0.9"));
        assert!(limits.is_trusted(ip("::ffff:10.0.0.9")));
    }
}
