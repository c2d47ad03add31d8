//! Operations routes: `/v1/status`, `/healthz`, `/readyz`, `/metrics`.

use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use herald_core::LeaseInfo;
use serde::Serialize;
use serde_json::{json, Value};

use super::state::ApiState;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};
use herald_http::extract::{FromQuery, QueryParams, ValidQuery};
use herald_http::metrics;
use herald_node::forward::HolderView;
use herald_node::node_error::{StorageContext, StorageFailure};

/// How long `/v1/status` waits for the lease row before showing `null`.
const STATUS_LEASE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long `/readyz` waits for the storage's ping.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// The node as `/v1/status` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct Status {
    node_id: String,
    role: &'static str,
    draining: bool,
    backend: &'static str,
    /// While holder: ms since the last successful renewal was sent.
    since_last_renewal_ms: Option<u64>,
    /// The holder in this node's view: itself while holder, else the lease
    /// row it last read if that row is held.
    holder: Option<HolderStatus>,
    lease: Option<LeaseInfo>,
}

/// The `holder` field of `/v1/status`.
#[derive(Debug, Serialize)]
struct HolderStatus {
    node_id: String,
    url: String,
}

/// `?role=` of `/readyz`.
#[derive(Debug)]
pub(crate) struct ReadyQuery {
    /// `holder`: ready only while this node holds the writer lease.
    role: Option<ReadyRole>,
}

/// The roles `/readyz?role=` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadyRole {
    /// Ready only on the holder.
    Holder,
}

impl FromQuery for ReadyQuery {
    fn from_query(params: &QueryParams) -> Result<Self> {
        Ok(Self {
            role: params
                .one_of("role", &["holder"])?
                .map(|_| ReadyRole::Holder),
        })
    }
}

/// The summary of `/v1/status` shown to callers without `admin` when
/// access control is on.
#[derive(Debug, Serialize)]
struct StatusSummary {
    node_id: String,
    role: &'static str,
    draining: bool,
}

/// The node's id, role, drain flag, backend, its view of the holder and the
/// lease row (`null` when the storage does not answer within 500 ms). With
/// access control on, callers without an `admin` API key get only the id,
/// role and drain flag (bad credentials: 401). The role is `holder` only
/// while this node is writable and the lease row read for this request
/// (when it was read in time) names this node with its token, unexpired.
pub(crate) async fn status(State(state): State<ApiState>, Caller(who): Caller) -> Response {
    let shared = &state.shared;
    let lease_state = shared.node.lease().state();
    let (is_holder, lease) = role_on_the_row(&state).await;
    let role = if is_holder { "holder" } else { "standby" };
    if shared.auth().may_admin(&who).is_err() {
        return Json(StatusSummary {
            node_id: shared.settings.node_id.clone(),
            role,
            draining: state.draining(),
        })
        .into_response();
    }
    let holder = if is_holder {
        Some(HolderView::this_node(
            &shared.settings.node_id,
            &shared.settings.advertise_url,
        ))
    } else {
        HolderView::from_lease_row(&lease_state)
    }
    .map(|h| HolderStatus {
        node_id: h.node_id,
        url: h.url,
    });
    Json(Status {
        node_id: shared.settings.node_id.clone(),
        role,
        draining: state.draining(),
        backend: shared.node.storage().backend(),
        since_last_renewal_ms: shared
            .node
            .lease()
            .since_last_renewal()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        holder,
        lease,
    })
    .into_response()
}

/// This node's role as `/v1/status` and `/metrics` say it, with the lease
/// row read for it (`None` when the storage did not answer within 500 ms):
/// holder while this node is writable and the row, when read, names this
/// node with its token and has not expired.
async fn role_on_the_row(state: &ApiState) -> (bool, Option<LeaseInfo>) {
    let shared = &state.shared;
    let name = shared
        .node
        .lease()
        .state()
        .lease_name()
        .unwrap_or(herald_core::DEFAULT_LEASE_NAME)
        .to_owned();
    let row = match tokio::time::timeout(
        STATUS_LEASE_TIMEOUT,
        shared.node.storage().lease_info(&name),
    )
    .await
    {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            StorageFailure::new("lease_info", None, e).log();
            None
        }
        Err(_) => {
            tracing::debug!("lease row not read within the status timeout");
            None
        }
    };
    let is_holder = shared
        .node
        .lease()
        .writable_lease()
        .is_some_and(|own| match &row {
            Some(row) => holds(row, &own),
            None => true,
        });
    (is_holder, row)
}

/// Liveness: the process answers `{"status":"ok"}`, a constant (no JSON
/// value is built per request).
pub(crate) async fn healthz() -> Response {
    (
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        Bytes::from_static(br#"{"status":"ok"}"#),
    )
        .into_response()
}

/// Readiness: not draining, and the storage answers within 1 s; with
/// `?role=holder`, also only while this node can prove that it is holder
/// (else `not_holder`): its safety deadline has not passed, and the lease
/// row, read during this request on the storage's clock, names this node
/// with this node's token and has not expired. So after another node took
/// the lease over (also before this node's deadline, when its liveness
/// session ended), this node no longer answers holder, however late it
/// learns of the takeover itself.
pub(crate) async fn readyz(
    State(state): State<ApiState>,
    query: Result<ValidQuery<ReadyQuery>>,
) -> Result<Json<Value>> {
    let ValidQuery(query) = query?;
    if state.draining() {
        return Err(Error::Draining);
    }
    if query.role == Some(ReadyRole::Holder) {
        return prove_holder(&state).await;
    }
    match tokio::time::timeout(READY_TIMEOUT, state.shared.node.storage().ping()).await {
        Ok(pinged) => {
            pinged.during("ping", None)?;
            Ok(Json(json!({ "status": "ready" })))
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = READY_TIMEOUT.as_millis() as u64,
                "storage ping timed out"
            );
            Err(Error::StorageUnavailable)
        }
    }
}

/// `/readyz?role=holder`: ready only when this node is writable now and
/// the lease row, read now (within 1 s), says this node holds the lease
/// with its token and has not expired on the storage's clock; and the
/// node is still writable with that token after the read.
async fn prove_holder(state: &ApiState) -> Result<Json<Value>> {
    let shared = &state.shared;
    let not_holder = |row: Option<&LeaseInfo>| Error::NotHolder {
        request: None,
        holder_url: row
            .and_then(|r| r.holder_url.clone())
            .or_else(|| shared.node.lease().state().holder_url().map(str::to_owned)),
    };
    let Some(lease) = shared.node.lease().writable_lease() else {
        return Err(not_holder(None));
    };
    let row =
        match tokio::time::timeout(READY_TIMEOUT, shared.node.storage().lease_info(&lease.name))
            .await
        {
            Ok(read) => read.during("lease_info", None)?,
            Err(_) => {
                tracing::warn!(
                    timeout_ms = READY_TIMEOUT.as_millis() as u64,
                    "lease row not read within the readiness timeout"
                );
                return Err(Error::StorageUnavailable);
            }
        };
    let proven = row.as_ref().is_some_and(|r| holds(r, &lease));
    let still = shared
        .node
        .lease()
        .writable_lease()
        .is_some_and(|now| now.token == lease.token);
    if proven && still {
        return Ok(Json(json!({ "status": "ready" })));
    }
    tracing::debug!(
        token = lease.token.0,
        row_holder = row.as_ref().and_then(|r| r.holder.as_deref()),
        row_token = row.as_ref().map(|r| r.token.0),
        row_expires_in_ms = row.as_ref().map(|r| r.expires_in_ms),
        "not ready as holder: the lease row does not confirm this node's lease"
    );
    Err(not_holder(row.as_ref().filter(|r| r.is_held())))
}

/// `true` when the lease row `row` names `lease`'s holder with its token
/// and has not expired (on the storage's clock).
fn holds(row: &LeaseInfo, lease: &herald_core::Lease) -> bool {
    row.holder.as_deref() == Some(lease.holder.as_str())
        && row.token == lease.token
        && row.expires_in_ms > 0
}

/// Prometheus text exposition format; the lease gauges are set first, and
/// `herald_lease_takeovers_recorded` from the database's record (kept at
/// its last value when the storage does not answer within 500 ms).
/// Needs `admin` when `auth.protect_metrics` is set.
pub(crate) async fn metrics(
    State(state): State<ApiState>,
    Caller(who): Caller,
) -> Result<impl IntoResponse> {
    let shared = &state.shared;
    shared.auth().may_scrape(&who)?;
    let (is_holder, row) = role_on_the_row(&state).await;
    let name = row.map_or_else(|| herald_core::DEFAULT_LEASE_NAME.to_owned(), |r| r.name);
    match tokio::time::timeout(
        STATUS_LEASE_TIMEOUT,
        shared.node.storage().takeover_counts(&name),
    )
    .await
    {
        Ok(Ok(counts)) => herald_node::metrics::takeovers_recorded(&counts),
        Ok(Err(e)) => StorageFailure::new("takeover_counts", None, e).log(),
        Err(_) => tracing::debug!("takeover counts not read within the metrics timeout"),
    }
    herald_node::metrics::lease(
        is_holder,
        shared
            .node
            .lease()
            .state()
            .last_token()
            .map_or(0, |token| token.0),
        shared.node.lease().since_last_renewal(),
    );
    metrics::collect_process();
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(),
    ))
}
