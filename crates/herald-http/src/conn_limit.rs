//! Connections per client IP address: a count of what each address has
//! open, and the address a request comes from.
//!
//! A direct client is counted per TCP connection (the accept loop in
//! `listener.rs` takes a [`Slot`] for each). A reverse proxy listed in
//! herald-server's `ServerConfig::trusted_proxies` multiplexes many clients over
//! its connections, so its connections are not counted; each request it
//! carries is counted instead, by the client address in its
//! `X-Forwarded-For` header, for as long as its answer lasts (the router's
//! request layer, `layers.rs`, takes the [`Slot`] with
//! [`ConnectionLimits::admit_proxied`]; an SSE stream or a WebSocket
//! session keeps it).
//!
//! The first refusal of an address is logged at WARN, naming the address
//! and the setting to change; its next refusals are only counted, until a
//! minute has passed ([`REFUSAL_LOG_INTERVAL`]), so that a client (or a
//! proxy that is not listed as trusted) over the limit is seen in the log
//! without flooding it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use crate::metrics;

/// The address a connection was accepted from, in each request's
/// extensions (set by the accept loop).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// How many connections each client address has open, against a limit.
#[derive(Debug)]
pub struct ConnectionLimits {
    /// Most open at once per address.
    per_ip: usize,
    /// Peers whose `X-Forwarded-For` is believed.
    trusted: Vec<IpAddr>,
    /// This node's id, in the refusal's log record.
    node_id: String,
    /// Open per address; an address leaves the map at zero.
    open: Mutex<HashMap<IpAddr, usize>>,
    /// Which refusals are logged.
    refusals: Mutex<RefusalLog>,
}

/// Each address's refusals are logged at most once per this interval (one
/// minute).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// At most this many addresses are remembered as logged within the last
/// [`REFUSAL_LOG_INTERVAL`]; while that many were logged, a new address's
/// refusal is counted in `herald_connections_refused_total` but not
/// logged, so that many addresses cannot grow the table or the log
/// without bound.
const MAX_LOGGED_ADDRESSES: usize = 1024;

/// When each address's refusals were last logged, and how many of its
/// refusals were not logged since.
#[derive(Debug, Default)]
struct RefusalLog {
    /// Address → (when its last WARN was logged, refusals since then).
    logged: HashMap<IpAddr, (Instant, u64)>,
}

impl RefusalLog {
    /// Notes a refusal of `ip` at `now`; returns `Some(n)` when it is to be
    /// logged, `n` being the refusals of `ip` left unlogged since its
    /// previous WARN (0 for its first), `None` when it is not.
    fn refused(&mut self, ip: IpAddr, now: Instant) -> Option<u64> {
        if let Some((at, unlogged)) = self.logged.get_mut(&ip) {
            if now.saturating_duration_since(*at) < REFUSAL_LOG_INTERVAL {
                *unlogged += 1;
                return None;
            }
            let skipped = *unlogged;
            *at = now;
            *unlogged = 0;
            return Some(skipped);
        }
        if self.logged.len() >= MAX_LOGGED_ADDRESSES {
            self.logged
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < REFUSAL_LOG_INTERVAL);
            if self.logged.len() >= MAX_LOGGED_ADDRESSES {
                return None;
            }
        }
        self.logged.insert(ip, (now, 0));
        Some(0)
    }
}

impl ConnectionLimits {
    /// Limits of `per_ip` open per address; `trusted` are the proxies whose
    /// `X-Forwarded-For` is believed; `node_id` names the node in the log.
    pub fn new(per_ip: usize, trusted: Vec<IpAddr>, node_id: &str) -> Arc<Self> {
        Arc::new(Self {
            per_ip,
            trusted,
            node_id: node_id.to_owned(),
            open: Mutex::new(HashMap::new()),
            refusals: Mutex::new(RefusalLog::default()),
        })
    }

    /// Logs a refusal of `ip` at `now` at WARN, with the address, the
    /// limit and the setting to change, unless one of its refusals was
    /// logged less than [`REFUSAL_LOG_INTERVAL`] ago (then it is counted,
    /// and the next WARN says how many were left out).
    fn log_refusal(&self, ip: IpAddr, now: Instant) {
        let logged = self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refused(ip, now);
        let Some(unlogged) = logged else { return };
        tracing::warn!(
            node_id = %self.node_id,
            client_ip = %ip,
            limit = self.per_ip,
            setting = "max_connections_per_ip",
            refusals_not_logged = unlogged,
            "a client address reached --max-connections-per-ip (max_connections_per_ip); its \
             further connections are answered 429 too_many_connections (logged at most once a \
             minute per address): raise the setting if this is one host's real load, or list a \
             reverse proxy at this address in --trusted-proxy (trusted_proxy)"
        );
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.contains(&canonical(ip))
    }

    /// Counts one more open for `ip`, or `None` (counted in
    /// `herald_connections_refused_total`, and logged as
    /// [`ConnectionLimits::log_refusal`] says) when it has the limit open
    /// already. The count drops when the [`Slot`] is dropped.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let ip = canonical(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.per_ip {
            drop(open);
            metrics::connection_refused("per_ip");
            self.log_refusal(ip, Instant::now());
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
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
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
    pub fn open(&self, ip: IpAddr) -> usize {
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
pub struct ClientSlot {
    /// Held, never read: dropping the last clone frees the place.
    _slot: Arc<Slot>,
}

/// What [`ConnectionLimits::admit_proxied`] decided of a request.
#[derive(Debug)]
pub enum Admission {
    /// Not from a trusted proxy: its connection holds a slot already.
    Direct,
    /// From a trusted proxy: the slot counted against its client's
    /// address, to be held by the answer ([`hold_slot`]).
    Proxied(Arc<Slot>),
    /// From a trusted proxy, for a client address over the limit: answer
    /// `429 too_many_connections`.
    Refused,
}

impl ConnectionLimits {
    /// Counts a request that came through a trusted proxy against its
    /// client's address (`X-Forwarded-For`) for as long as its answer
    /// lasts: the slot is returned, to ride along with the response body
    /// ([`hold_slot`]: an SSE stream holds it to its end), and put in the
    /// request's extensions as a [`ClientSlot`], for a WebSocket session.
    /// Requests from other peers pass untouched ([`Admission::Direct`]).
    pub fn admit_proxied(self: &Arc<Self>, request: &mut Request) -> Admission {
        let Some(Peer(peer)) = request.extensions().get::<Peer>().copied() else {
            return Admission::Direct;
        };
        if !self.is_trusted(peer.ip()) {
            return Admission::Direct;
        }
        let client = self.client_ip(peer.ip(), request.headers());
        let Some(slot) = self.try_acquire(client) else {
            return Admission::Refused;
        };
        let slot = Arc::new(slot);
        request.extensions_mut().insert(ClientSlot {
            _slot: Arc::clone(&slot),
        });
        Admission::Proxied(slot)
    }
}

/// `response`, its body holding `slot` until the body is dropped.
pub fn hold_slot(response: Response, slot: Arc<Slot>) -> Response {
    response.map(|inner| Body::new(HeldBody { inner, _slot: slot }))
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
pub struct Slot {
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
    use serde_json::Value;

    use super::*;

    /// The WARN records of `ConnectionLimits` logged while `f` runs on
    /// this thread, as JSON objects.
    fn warnings_of(f: impl FnOnce()) -> Vec<Value> {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buffer = Arc::clone(&buffer);
            move || Captured(Arc::clone(&buffer))
        };
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_max_level(tracing::Level::WARN)
            .with_writer(writer)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = std::mem::take(&mut *buffer.lock().unwrap());
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// Appends log output to a shared buffer.
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A burst of refusals of one address logs one WARN, naming the
    /// address, the limit and the setting; another address gets its own.
    #[test]
    fn a_burst_of_refusals_logs_one_warning_per_address() {
        let limits = ConnectionLimits::new(2, Vec::new(), "node-a");
        let mut held = Vec::new();
        let records = warnings_of(|| {
            for _ in 0..2 {
                held.push(limits.try_acquire(ip("10.0.0.1")).unwrap());
            }
            for _ in 0..50 {
                assert!(limits.try_acquire(ip("10.0.0.1")).is_none());
            }
            held.push(limits.try_acquire(ip("10.0.0.2")).unwrap());
            held.push(limits.try_acquire(ip("10.0.0.2")).unwrap());
            for _ in 0..5 {
                assert!(limits.try_acquire(ip("::ffff:10.0.0.2")).is_none());
            }
        });
        assert_eq!(records.len(), 2, "{records:?}");
        for (record, address) in records.iter().zip(["10.0.0.1", "10.0.0.2"]) {
            assert_eq!(record["level"], "WARN", "{record}");
            assert_eq!(record["node_id"], "node-a", "{record}");
            assert_eq!(record["client_ip"], address, "{record}");
            assert_eq!(record["limit"], 2, "{record}");
            assert_eq!(record["setting"], "max_connections_per_ip", "{record}");
            assert_eq!(record["refusals_not_logged"], 0, "{record}");
            let message = record["message"].as_str().unwrap();
            assert!(message.contains("--max-connections-per-ip"), "{message}");
            assert!(message.contains("--trusted-proxy"), "{message}");
        }
    }

    /// An address is logged again once a minute has passed since its last
    /// WARN, with the count of refusals left out meanwhile; never sooner.
    #[test]
    fn an_address_is_logged_at_most_once_a_minute() {
        let mut log = RefusalLog::default();
        let start = Instant::now();
        let a = ip("192.0.2.1");
        assert_eq!(log.refused(a, start), Some(0));
        for s in [0, 1, 30, 59] {
            assert_eq!(log.refused(a, start + Duration::from_secs(s)), None);
        }
        let almost = start + REFUSAL_LOG_INTERVAL - Duration::from_millis(1);
        assert_eq!(log.refused(a, almost), None);
        assert_eq!(log.refused(a, start + REFUSAL_LOG_INTERVAL), Some(5));
        assert_eq!(log.refused(a, start + REFUSAL_LOG_INTERVAL), None);
        let later = start + 2 * REFUSAL_LOG_INTERVAL;
        assert_eq!(log.refused(a, later), Some(1));
    }

    /// Many addresses cannot grow the table without bound: past
    /// `MAX_LOGGED_ADDRESSES` logged within a minute, a new address is not
    /// logged (it is still refused and counted); once their minute passed,
    /// new addresses are logged again and the old ones are forgotten.
    #[test]
    fn the_logged_addresses_are_bounded() {
        let mut log = RefusalLog::default();
        let start = Instant::now();
        let address = |i: usize| IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
        for i in 0..MAX_LOGGED_ADDRESSES {
            assert_eq!(log.refused(address(i), start), Some(0));
        }
        let extra = address(MAX_LOGGED_ADDRESSES);
        assert_eq!(log.refused(extra, start + Duration::from_secs(1)), None);
        assert_eq!(log.logged.len(), MAX_LOGGED_ADDRESSES);
        let later = start + REFUSAL_LOG_INTERVAL;
        assert_eq!(log.refused(extra, later), Some(0));
        assert_eq!(log.logged.len(), 1);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_limit_holds_per_address_and_frees_on_drop() {
        let limits = ConnectionLimits::new(2, Vec::new(), "node-a");
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
        let limits = ConnectionLimits::new(2, vec![ip("10.0.0.9"), ip("10.0.0.8")], "node-a");
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
