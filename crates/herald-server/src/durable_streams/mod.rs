//! The Durable Streams wing: ElectricSQL's open protocol for durable,
//! resumable streams over plain HTTP (`PROTOCOL.md` of
//! durable-streams/durable-streams; `docs/durable-streams.md` is how Herald
//! serves it). A stream is a Herald channel (`naming.rs` maps its URL path
//! to the channel's name): the same durable log, fenced writes and
//! offsets, readable through Herald's API and Centrifugo too.
//!
//! Routes, under the prefix (`/ds` by default): `PUT` creates a stream,
//! `POST` appends or closes (`write.rs`), `GET` reads (catch-up and
//! long-poll in `read.rs`, SSE in `sse.rs`, both reading through
//! `chunk.rs`), `HEAD` tells its metadata,
//! `DELETE` deletes it. Writes go through herald-node's `streams.rs`
//! (committed on the holder, forwarded once from a standby); reads are
//! served by every node from the storage, woken by the node's hub.
//!
//! Like the other wings, it knows no SQL and no lease timing.

mod body;
mod chunk;
pub(crate) mod config;
mod naming;
mod offset;
pub(crate) mod producer_wait;
mod read;
mod request;
mod response;
mod sse;
pub(crate) mod state;
mod write;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::Router;

use config::DurableStreamsConfig;
pub(crate) use state::StreamsState;

/// The wing's routes (none when it is off): every path under the prefix.
pub(crate) fn routes(ds: &DurableStreamsConfig) -> Router<StreamsState> {
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
}
