//! Centrifugo's protocols end to end: the client protocol at
//! `/connection/websocket` driven by a hand-written client
//! (`client.rs`), and the server API at `/api/<method>`, with Herald's
//! access control (API keys, tokens, namespaces) on both backends; and
//! what reaches every node (`cluster.rs`).

mod cent;
mod channel_limit;
mod client;
mod cluster;
mod history_remove;
mod join_leave;
mod presence;
mod protocol;
mod recovery;
mod sdk;
mod server_api;
mod server_subs;
mod tags;

use serde_json::Value;

/// The offsets of a list of publications.
pub(crate) fn offsets(publications: &Value) -> Vec<u64> {
    publications
        .as_array()
        .map(|a| a.iter().map(|p| p["offset"].as_u64().unwrap()).collect())
        .unwrap_or_default()
}
