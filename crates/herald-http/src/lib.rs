//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-http` (the HTTP edge every
//! wing shares), `herald-server` (HTTP: API v1, Centrifugo and Durable
//! Streams) and `herald` (the binary); `herald-auth` (access control, no
//! HTTP) stands beside them on `herald-core`. `ARCHITECTURE.md` is the map.
//!
//! Herald's HTTP edge: what every wing (API v1, Centrifugo, Durable
//! Streams, the console) shares and none owns: the JSON error answer
//! (`error.rs`: `{"error":{"code","message"}}` with its status and
//! headers, and `From<NodeError>`), the request parsing (`extract.rs`),
//! WebSocket upgrades and their close (`websocket.rs`, RFC 6455), the CORS
//! layer and its settings (`cors.rs`), the HTTPS certificates (`tls.rs`),
//! the JWKS fetcher of access control (`jwks_fetch.rs`), the audit log
//! of admin actions (`audit.rs`), the credentials of a request
//! (`auth_extract.rs`: the `Caller` and `Subscriber` extractors); the connections (the accept loop,
//! `listener.rs`, HTTP/1 and HTTP/2 over TLS when configured; SSE
//! connections served outside hyper, `sse_connection.rs`; limits per
//! client address, `conn_limit.rs`), the checks of what a web page can
//! make a browser send (`edge.rs`) and the shared tower layers
//! (`layers.rs`); the metrics recorder (`metrics.rs`); and what every wing
//! reads (`shared.rs`: `Shared`, with the node's core, access control, the
//! drain signal and the `Settings` every wing shares).
//!
//! Invariants: it depends on no wing (`scripts/test`'s `check_layers`), it
//! knows no SQL and no lease timing; the node's core is `herald-node`,
//! access control `herald-auth`.

pub mod audit;
pub mod auth_extract;
pub mod conn_limit;
pub mod cors;
pub mod edge;
pub mod error;
pub mod extract;
pub mod jwks_fetch;
pub mod layers;
pub mod listener;
pub mod metrics;
pub mod shared;
pub mod sse_connection;
pub mod tls;
pub mod websocket;

pub use error::{Error, Result};
