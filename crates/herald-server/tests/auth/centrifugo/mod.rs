//! Centrifugo's protocols end to end: the client protocol at
//! `/connection/websocket` driven by a hand-written client
//! (`client.rs`), and the server API at `/api/<method>`, with Herald's
//! access control (API keys, tokens, namespaces) on both backends; and
//! what reaches every node (`cluster.rs`).

mod attacks;
mod authenticated;
mod cent;
mod channel_limit;
pub(crate) mod client;
mod cluster;
mod delta;
mod exp_boundary;
mod history_remove;
mod join_leave;
mod presence;
mod protocol;
mod recovery;
mod sdk;
mod server_api;
mod server_subs;
mod tags;
mod transports;
mod unserved;

use serde_json::Value;

use crate::{Backend, Creds, Node, Place, Role};

/// A fresh place on `backend` with a holder (`node-a`) and a standby
/// (`node-b`) started on it with the same new credentials. The place must
/// outlive the nodes.
pub(crate) async fn holder_and_standby(backend: Backend) -> (Place, Creds, Node, Node) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    (place, creds, holder, standby)
}

/// Calls the server API's `method` (`POST /api/<method>`) on `node` with
/// the API key `key` (`X-API-Key`) and the JSON `body`; asserts HTTP 200
/// and returns the reply's body.
pub(crate) async fn api(node: &Node, method: &str, key: &str, body: Value) -> Value {
    let (status, _, body) = node
        .call(
            "POST",
            &format!("/api/{method}"),
            &[("x-api-key", key)],
            Some(body),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The offsets of a list of publications.
pub(crate) fn offsets(publications: &Value) -> Vec<u64> {
    publications
        .as_array()
        .map(|a| a.iter().map(|p| p["offset"].as_u64().unwrap()).collect())
        .unwrap_or_default()
}
