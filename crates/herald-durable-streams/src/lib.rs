//! The Durable Streams wing: ElectricSQL's open protocol for durable,
//! resumable streams over plain HTTP (`PROTOCOL.md` of
//! durable-streams/durable-streams; `docs/durable-streams.md` is how Herald
//! serves it). A stream is a Herald channel (`naming.rs` maps its URL path
//! to the channel's name): the same durable log, fenced writes and
//! offsets, readable through Herald's API and Centrifugo too.
//!
//! Routes, under the prefix (`/ds` by default): `PUT` creates a stream,
//! `POST` appends or closes (`write.rs`), `GET` reads (catch-up and
//! long-poll in `read.rs`, SSE in `sse.rs`; a catch-up reads through
//! `chunk.rs`, a live read follows the stream through `follow.rs`),
//! `HEAD` tells its metadata,
//! `DELETE` deletes it. Writes go through herald-node's `streams.rs`
//! (committed on the holder, forwarded once from a standby); reads are
//! served by every node: catch-ups from the storage, live reads as
//! subscriptions of the node core (history from the storage, then the
//! messages the node's hub's notices carry). A read restarts the stream's
//! TTL through herald-node's `stream_renewals.rs` (a standby's batches
//! reach the holder at `renewals.rs`' route).
//!
//! Like the other wings, it knows no SQL and no lease timing, and no
//! other wing: among Herald's crates it depends on the core
//! (herald-core, herald-node), access control (herald-auth) and the HTTP
//! edge (herald-http) only (`scripts/test`'s `check_layers`).

mod body;
mod chunk;
pub mod config;
mod follow;
mod naming;
mod offset;
mod producer_wait;
mod read;
mod renewals;
mod request;
mod response;
mod sse;
mod state;
mod write;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use config::DurableStreamsConfig;
pub use state::StreamsState;

/// The wing's routes (none when it is off): every path under the prefix.
pub fn routes(ds: &DurableStreamsConfig) -> Router<StreamsState> {
    if !ds.enabled {
        return Router::new();
    }
    Router::new()
        .route(
            &format!("{}/{{*path}}", ds.prefix),
            get(read::get)
                .head(read::head)
                .put(write::put)
                .post(write::post)
                .delete(write::delete),
        )
        .layer(DefaultBodyLimit::max(ds.max_append_bytes))
        .layer(axum::middleware::map_response(response::common_headers))
        .route(
            herald_node::stream_renewals::STREAM_RENEWALS_PATH,
            post(renewals::renew).layer(DefaultBodyLimit::max(
                herald_node::stream_renewals::MAX_RENEWAL_BODY_BYTES,
            )),
        )
}
