//! `POST /v1/cluster/stream-renewals` (herald-node's
//! `STREAM_RENEWALS_PATH`): a standby's batch of the streams its clients
//! read, whose TTL the holder restarts with one fenced storage write
//! (herald-node's `stream_renewals.rs`). A request forwarded by a node
//! only: it carries `Herald-Forwarded-By` and, once a cluster secret or
//! access control is configured, the cluster secret (the standby checked
//! each reader's right to read). Answers `{"renewed": <streams>}`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use herald_auth::{AuthError, Principal};
use herald_core::ChannelName;
use herald_node::forward::was_forwarded;
use herald_node::stream_renewals::{RenewalBatch, MAX_PENDING_RENEWALS};

use crate::state::StreamsState;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};

/// The answer: how many streams had their TTL restarted.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Renewed {
    renewed: u64,
}

/// `POST`: renews the batch here, as holder.
///
/// # Errors
/// 404 `not_found` for a request no node forwarded; 403 for a forwarded
/// request without the cluster secret on a node with access control;
/// 400 `invalid_body` for a body that is not a batch of at most
/// `MAX_PENDING_RENEWALS` channel names; 503 `not_holder` on a standby;
/// the storage's errors.
pub(crate) async fn renew(
    State(state): State<StreamsState>,
    Caller(who): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Renewed>> {
    if !was_forwarded(&headers) {
        return Err(Error::NotFound);
    }
    if state.shared.auth().enabled() && !matches!(who, Principal::Cluster) {
        return Err(AuthError::Forbidden(
            "stream renewals are taken from nodes of the cluster only".to_owned(),
        )
        .into());
    }
    let batch: RenewalBatch = serde_json::from_slice(&body)
        .map_err(|e| Error::InvalidBody(format!("not a renewal batch: {e}")))?;
    if batch.streams.len() > MAX_PENDING_RENEWALS {
        return Err(Error::InvalidBody(format!(
            "a renewal batch names at most {MAX_PENDING_RENEWALS} streams"
        )));
    }
    let streams = batch
        .streams
        .into_iter()
        .map(|name| ChannelName::new(name).map_err(|e| Error::InvalidChannel(e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    let renewed = state
        .shared
        .node
        .stream_renewals()
        .renew_forwarded(&streams)
        .await?;
    Ok(Json(Renewed { renewed }))
}
