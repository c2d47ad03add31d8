//! Centrifugo's protocols, so that the apps built on Centrifugo's SDKs and
//! server API clients work with Herald unchanged (`docs/centrifugo.md`):
//!
//! - `GET /connection/websocket`: the bidirectional client protocol v2,
//!   JSON or protobuf (`session.rs` runs a connection, `commands/`
//!   answers its commands, one file per command; `protocol.rs` the
//!   commands and `replies.rs` the replies and pushes, one set of
//!   `client.proto` types for both forms; `codec.rs` each form on the
//!   wire; `codes.rs` the error and disconnect codes);
//! - `POST /connection/http_stream`, `GET|POST /connection/sse` and
//!   `POST /emulation`: the same sessions over HTTP streaming and SSE,
//!   with the client's commands posted to `/emulation` (`emulation.rs`;
//!   `emulation_sessions.rs` the sessions it hands frames to;
//!   `transport.rs` is what differs between the transports);
//! - `POST /api/<method>`: the server HTTP API (`server_api.rs`;
//!   `history_remove.rs` its `history_remove`, forwarded to the holder
//!   from a standby);
//! - `recovery.rs`: recovery on subscribe that never lies, with the
//!   channel's epoch from the storage (`Storage::channel_epoch`);
//! - `tags_filter.rs`: the tags filter (`tf`) of a subscribe;
//! - `fossil_delta.rs`: Fossil delta of a subscription's publications;
//!   `delta_cache.rs` the node's deltas, one per publication per channel,
//!   within a CPU budget;
//! - `history.rs`: history with Centrifugo's `limit`, `since`, `reverse`;
//! - `publish.rs`: a publish into the same channel sequence as Herald's
//!   own, through the node's publish routine (`herald_node::publish`);
//! - `mailbox.rs`: what reaches a session from outside its connection;
//! - `registry.rs`: this node's connections, for the server API, which
//!   also applies other nodes' cluster events to them (`cluster.rs`);
//! - `context.rs`: Centrifugo's context on a node (the registry, the
//!   client sessions, the tasks of cluster events and of the node report)
//!   and `CentrifugoState`, what its handlers take;
//! - `presence.rs`: cluster-wide presence in the storage, when enabled
//!   (`presence_session.rs`: this node's session of rows and its heartbeat);
//! - `join_leave.rs`: join and leave pushes, cluster-wide, when enabled;
//! - `channel_options.rs`: `presence`, `join_leave` and
//!   `force_push_join_leave` per namespace;
//! - `config.rs`: ping, pong and connect timeouts, and the defaults of
//!   the channel options;
//! - `node_info.rs`: each node's report of its connections in the
//!   storage, for a cluster-wide `info`;
//! - `fuzz.rs` (tests only): property tests of the server API (the client
//!   protocol's are `tests/fuzz_centrifugo.rs`).
//!
//! Access control is Herald's (`auth/`): the connection token is a
//! Herald client token (Centrifugo's claim names `sub`, `exp`,
//! `channel`), subscriptions and publishes follow the namespace rules, and
//! the server API takes Herald's API keys.

mod channel_options;
mod cluster;
mod codec;
mod codes;
mod commands;
pub(crate) mod config;
pub(crate) mod context;
mod delta_cache;
mod emulation;
mod emulation_sessions;
mod fossil_delta;
#[cfg(test)]
mod fuzz;
mod history;
mod history_remove;
mod join_leave;
pub(crate) mod mailbox;
pub(crate) mod node_info;
mod presence;
mod presence_session;
mod protocol;
mod publish;
mod recovery;
pub(crate) mod registry;
mod replies;
mod server_api;
mod session;
mod tags_filter;
mod transport;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use context::CentrifugoState;
use herald_http::shared::Settings;

pub use config::CentrifugoConfig;

/// Centrifugo's routes: the client protocol's WebSocket and the server
/// API, whose body limit is `settings`' `max_batch_body_bytes`.
pub(crate) fn routes(settings: &Settings) -> Router<CentrifugoState> {
    Router::new()
        .route("/connection/websocket", get(session::upgrade))
        // Their bodies are read within the frame limit by the handlers.
        .route("/connection/http_stream", post(emulation::http_stream))
        .route("/connection/sse", get(emulation::sse).post(emulation::sse))
        .route("/emulation", post(emulation::emulate))
        .route(
            "/api/{method}",
            post(server_api::call).layer(DefaultBodyLimit::max(settings.max_batch_body_bytes)),
        )
}
