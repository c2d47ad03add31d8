//! Operations routes: `/v1/status`, `/healthz`, `/readyz`, `/metrics`.

use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::LeaseInfo;
use serde::Serialize;
use serde_json::{json, Value};

use crate::api::{FromQuery, QueryParams, ValidQuery};
use crate::auth::Caller;
use crate::error::{StorageContext, StorageFailure};
use crate::forward::HolderView;
use crate::{metrics, AppState, Error, Result};

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
/// role and drain flag (bad credentials: 401).
pub(crate) async fn status(State(state): State<AppState>, Caller(who): Caller) -> Response {
    let shared = &state.shared;
    let is_holder = shared.lease.is_holder();
    let role = if is_holder { "holder" } else { "standby" };
    if shared.auth.may_admin(&who).is_err() {
        return Json(StatusSummary {
            node_id: shared.config.node_id.clone(),
            role,
            draining: state.draining(),
        })
        .into_response();
    }
    let lease_state = shared.lease.state();
    let holder = if is_holder {
        Some(HolderView::this_node(
            &shared.config.node_id,
            &shared.config.advertise_url,
        ))
    } else {
        HolderView::from_lease_row(&lease_state)
    }
    .map(|h| HolderStatus {
        node_id: h.node_id,
        url: h.url,
    });
    let name = lease_state
        .lease_name()
        .unwrap_or(herald_core::DEFAULT_LEASE_NAME)
        .to_owned();
    let lease =
        match tokio::time::timeout(STATUS_LEASE_TIMEOUT, shared.storage.lease_info(&name)).await {
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
    Json(Status {
        node_id: shared.config.node_id.clone(),
        role,
        draining: state.draining(),
        backend: shared.storage.backend(),
        since_last_renewal_ms: shared
            .lease
            .since_last_renewal()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        holder,
        lease,
    })
    .into_response()
}

/// Liveness: the process answers.
pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: not draining, and the storage answers within 1 s; with
/// `?role=holder`, also only while this node is holder (else `not_holder`).
pub(crate) async fn readyz(
    State(state): State<AppState>,
    query: Result<ValidQuery<ReadyQuery>>,
) -> Result<Json<Value>> {
    let ValidQuery(query) = query?;
    if state.draining() {
        return Err(Error::Draining);
    }
    if query.role == Some(ReadyRole::Holder) && !state.shared.lease.is_holder() {
        return Err(Error::NotHolder {
            request: None,
            holder_url: state.shared.lease.state().holder_url().map(str::to_owned),
        });
    }
    match tokio::time::timeout(READY_TIMEOUT, state.shared.storage.ping()).await {
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

/// Prometheus text exposition format; the lease gauges are set first.
/// Needs `admin` when `auth.protect_metrics` is set.
pub(crate) async fn metrics(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<impl IntoResponse> {
    let shared = &state.shared;
    shared.auth.may_scrape(&who)?;
    metrics::lease(
        shared.lease.is_holder(),
        shared.lease.state().last_token().map_or(0, |token| token.0),
        shared.lease.since_last_renewal(),
    );
    metrics::collect_process();
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        shared.metrics.render(),
    ))
}
