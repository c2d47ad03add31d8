//! `GET /v1/admin/cluster`: the cluster as this node sees it (the writer
//! lease, every node that reported itself and those that fell silent or
//! are gone, the takeover timeline, this node's latest rates), and `GET /v1/admin/cluster/events`, the same as
//! Server-Sent Events (WHATWG HTML, "Server-sent events"): one `cluster`
//! event every second and at once when this node's lease state changes,
//! until the node drains. Both need `admin`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use futures::Stream;
use herald_core::{format_rfc3339_ms, LeaseInfo, DEFAULT_LEASE_NAME};
use herald_storage::{LeaseTakeover, NodeReport, TakeoverReason};
use serde::Serialize;

use super::rates::Sample;
use super::ConsoleState;
use crate::centrifugo::node_info::REPORT_INTERVAL;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};
use herald_node::node_error::StorageContext;
use herald_node::subscription::wall_clock_ms;

/// How long one view waits for each storage read.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Takeovers a view shows, newest first.
const TAKEOVERS_SHOWN: usize = 50;

/// A node whose last report is older than this (two report intervals),
/// in ms, is shown `silent`.
const SILENT_AFTER_MS: u64 = 2 * REPORT_INTERVAL.as_millis() as u64;

/// How long a node stays listed after its last report, silent or gone: an
/// hour, in ms. This node remembers it (its report row expires after
/// 10 s): a node that started later lists only what it saw itself.
const LISTED_FOR_MS: u64 = 3_600_000;

/// How often the event stream sends a view.
const PERIOD: Duration = Duration::from_secs(1);

/// The cluster as one node sees it.
#[derive(Debug, Serialize)]
pub(crate) struct ClusterView {
    /// The node that answered.
    observed_by: String,
    /// When, ms since the Unix epoch on that node's clock.
    at_ms: i64,
    /// The writer lease; `null` before its first acquisition.
    lease: Option<LeaseView>,
    /// Every node with an unexpired report, and every node this node saw
    /// report in the last hour, by node id; this node as of now.
    nodes: Vec<NodeView>,
    /// The latest takeovers, newest first (at most 50).
    takeovers: Vec<TakeoverView>,
    /// This node's latest rates sample; `null` in its first seconds.
    rate: Option<Sample>,
}

/// The lease in a [`ClusterView`].
#[derive(Debug, Serialize)]
struct LeaseView {
    name: String,
    /// The holder's node id; `null` once released.
    holder: Option<String>,
    holder_url: Option<String>,
    /// The current fencing token.
    token: u64,
    /// Time left before the lease expires, in ms on the database's clock
    /// (0 or less: expired).
    expires_in_ms: i64,
    /// The holder's ttl, in ms: how far its last renewal extended the
    /// lease (`expires_in_ms` + the row's time since that renewal).
    ttl_ms: i64,
    /// Time since the holder's last successful renewal, in ms: the
    /// holder's own figure (since it was sent) when this node is the
    /// holder (`exact`), else since the database committed it (the lease
    /// row's `renewed_at`).
    renewed_ms_ago: Option<i64>,
    /// Time left before the holder's safety deadline, in ms: the holder's
    /// own figure when `exact`, else `expires_in_ms` − this node's safety
    /// margin.
    safety_deadline_in_ms: Option<i64>,
    /// Whether the renewal figures are the holder's own.
    exact: bool,
}

/// One node in a [`ClusterView`].
#[derive(Debug, Serialize)]
struct NodeView {
    node_id: String,
    url: String,
    /// `holder` when the lease row names it and has not expired; else
    /// `gone` when a `holder_gone` takeover found its database sessions
    /// ended (its process is gone) and it has not reported since; else
    /// `silent` when its last report is older than two report intervals
    /// (6 s: it stopped or cannot reach the database); else `standby`.
    role: &'static str,
    /// Only known for the node that answered (a draining node stops
    /// reporting).
    draining: Option<bool>,
    version: String,
    uptime_s: u64,
    /// Centrifugo connections, as of the node's last report (up to 3 s
    /// old, also for the node that answered).
    connections: u64,
    /// Live subscriptions, every protocol.
    subscriptions: u64,
    /// Age of its report, in ms (0 for the node that answered).
    reported_ms_ago: u64,
    /// When it was last seen: its last report, RFC 3339, ms, UTC, on the
    /// database's clock (now on this node's clock for the node that
    /// answered).
    last_seen: String,
}

/// One takeover in a [`ClusterView`].
#[derive(Debug, Serialize)]
struct TakeoverView {
    token: u64,
    /// The node the lease row named before; `null` after a release.
    from: Option<String>,
    to: String,
    /// `fresh`, `released`, `expired`, `holder_gone` or `reclaimed`.
    reason: &'static str,
    /// RFC 3339, ms, UTC, on the database's clock.
    at: String,
}

impl From<LeaseTakeover> for TakeoverView {
    fn from(t: LeaseTakeover) -> Self {
        Self {
            token: t.token.0,
            from: t.previous_holder,
            to: t.holder,
            reason: t.reason.as_str(),
            at: format_rfc3339_ms(t.at_ms),
        }
    }
}

/// `GET /v1/admin/cluster` (see the module docs).
pub(crate) async fn cluster(
    State(state): State<ConsoleState>,
    Caller(who): Caller,
) -> Result<Json<ClusterView>> {
    state.shared.auth().may_admin(&who)?;
    Ok(Json(view(&state).await?))
}

/// `GET /v1/admin/cluster/events` (see the module docs). A view that
/// cannot be read (the storage does not answer) is skipped; the stream
/// goes on, with keep-alive comments every 15 s. Streams of one node share
/// their views ([`ViewCache`]): however many are open, the node reads the
/// storage for them about once a second, and at once after a lease change.
pub(crate) async fn events(
    State(state): State<ConsoleState>,
    Caller(who): Caller,
) -> Result<Sse<impl Stream<Item = std::result::Result<Event, Infallible>>>> {
    state.shared.auth().may_admin(&who)?;
    let lease_changes = Some(state.shared.node.lease().subscribe());
    let stream = futures::stream::unfold(
        (state, lease_changes, true),
        |(state, mut changes, first)| async move {
            let mut fresh = first;
            if !first {
                let shutdown = state.shared.shutdown.clone();
                // Once the lease's sender is gone (the node stops), only
                // the period and the drain wake the stream.
                let changed = async {
                    match changes.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(PERIOD) => {}
                    ok = changed => {
                        if ok {
                            fresh = true;
                        } else {
                            changes = None;
                        }
                    }
                }
            }
            if state.shared.shutdown.is_cancelled() {
                return None;
            }
            let event = match state.views.get(&state, fresh).await {
                Ok(json) => Event::default().event("cluster").data(json.as_ref()),
                Err(e) => {
                    tracing::debug!(error = %e, "cluster view not read; skipped");
                    Event::default().comment("storage unavailable")
                }
            };
            Some((Ok(event), (state, changes, false)))
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The node's latest cluster view as JSON text, shared by its event
/// streams: one read of the storage serves every stream that asks within
/// [`VIEW_MAX_AGE`] of it. Also the node reports this node has seen, so
/// that a node whose report expired stays listed ([`LISTED_FOR_MS`]).
#[derive(Default)]
pub(crate) struct ViewCache {
    /// When the view was read, and its JSON text. An async mutex: a
    /// stream that finds the view stale reads it while the others wait
    /// for that read instead of making their own.
    latest: tokio::sync::Mutex<Option<(tokio::time::Instant, Arc<str>)>>,
    /// The last report read of each other node, and when it was read.
    seen: Mutex<BTreeMap<String, (NodeReport, tokio::time::Instant)>>,
}

/// How old a shared view may be: under the streams' period, so each
/// stream's view is at most about one period old.
const VIEW_MAX_AGE: Duration = Duration::from_millis(900);

impl ViewCache {
    /// The view, read again when `fresh` is asked for or the kept one is
    /// older than [`VIEW_MAX_AGE`].
    ///
    /// # Errors
    /// [`Error::StorageUnavailable`] when the read fails.
    async fn get(&self, state: &ConsoleState, fresh: bool) -> Result<Arc<str>> {
        let mut latest = self.latest.lock().await;
        if let Some((at, json)) = latest.as_ref() {
            if !fresh && at.elapsed() < VIEW_MAX_AGE {
                return Ok(Arc::clone(json));
            }
        }
        let json: Arc<str> = serde_json::to_string(&view(state).await?)
            .map_err(|e| Error::Internal(format!("cluster view not encoded: {e}")))?
            .into();
        *latest = Some((tokio::time::Instant::now(), Arc::clone(&json)));
        Ok(json)
    }

    /// `reports` (the unexpired ones, read now) remembered, followed by
    /// the remembered reports of the other nodes that expired less than
    /// [`LISTED_FOR_MS`] ago, aged by the time since they were read.
    /// `own` (this node) is neither remembered nor returned.
    fn remember(&self, reports: Vec<NodeReport>, own: &str) -> Vec<NodeReport> {
        let now = tokio::time::Instant::now();
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for report in &reports {
            if report.node_id != own {
                seen.insert(report.node_id.clone(), (report.clone(), now));
            }
        }
        let mut out: Vec<NodeReport> = reports.into_iter().filter(|r| r.node_id != own).collect();
        seen.retain(|node_id, (report, read_at)| {
            if out.iter().any(|r| &r.node_id == node_id) {
                return true;
            }
            let since_read =
                u64::try_from(now.duration_since(*read_at).as_millis()).unwrap_or(u64::MAX);
            let age = report.reported_ms_ago.saturating_add(since_read);
            if age > LISTED_FOR_MS {
                return false;
            }
            out.push(NodeReport {
                reported_ms_ago: age,
                ..report.clone()
            });
            true
        });
        out
    }
}

/// The nodes that a `holder_gone` takeover of `history` found gone, each
/// with the time of its latest such takeover (ms since the Unix epoch on
/// the database's clock): the database saw every session of its storage
/// end, so its process is gone, until it reports again.
fn gone_since(history: &[LeaseTakeover]) -> BTreeMap<&str, i64> {
    let mut gone = BTreeMap::new();
    // Newest first: the first takeover seen of a node is its latest.
    for t in history {
        if t.reason == TakeoverReason::HolderGone {
            if let Some(node) = t.previous_holder.as_deref() {
                gone.entry(node).or_insert(t.at_ms);
            }
        }
    }
    gone
}

/// Reads the view: the lease row, the node reports and the takeover
/// timeline, each within [`READ_TIMEOUT`].
///
/// # Errors
/// [`Error::StorageUnavailable`] when a read fails or times out.
async fn view(state: &ConsoleState) -> Result<ClusterView> {
    let shared = &state.shared;
    let storage = shared.node.storage();
    let name = shared
        .node
        .lease()
        .state()
        .lease_name()
        .unwrap_or(DEFAULT_LEASE_NAME)
        .to_owned();
    let (row, reports, history) = tokio::try_join!(
        timed(storage.lease_info(&name)),
        timed(storage.node_reports()),
        timed(storage.lease_history(&name, TAKEOVERS_SHOWN)),
    )?;
    let row = row.during("lease_info", None)?;
    let reports = reports.during("node_reports", None)?;
    let history = history.during("lease_history", None)?;
    let holder = row
        .as_ref()
        .filter(|r| r.is_held())
        .and_then(|r| r.holder.clone());
    let config = &shared.settings;
    let own_at_ms = wall_clock_ms();
    // This node's connections as of its own last report (the same figure
    // the other nodes read); none before its first report.
    let own_clients = reports
        .iter()
        .find(|r| r.node_id == config.node_id)
        .map_or(0, |r| r.clients);
    let own = NodeReport {
        node_id: config.node_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_s: state.started.elapsed().as_secs(),
        clients: own_clients,
        users: 0,
        subs: 0,
        channels: 0,
        url: config.advertise_url.clone(),
        subscriptions: shared.node.hub().subscriber_total() as u64,
        reported_ms_ago: 0,
        reported_at_ms: own_at_ms,
    };
    let gone = gone_since(&history);
    let mut nodes: Vec<NodeView> = state
        .views
        .remember(reports, &config.node_id)
        .into_iter()
        .chain(std::iter::once(own))
        .map(|r| {
            let is_own = r.node_id == config.node_id;
            NodeView {
                role: if holder.as_deref() == Some(r.node_id.as_str()) {
                    "holder"
                } else if !is_own
                    && gone
                        .get(r.node_id.as_str())
                        .is_some_and(|at| r.reported_at_ms < *at)
                {
                    "gone"
                } else if r.reported_ms_ago > SILENT_AFTER_MS {
                    "silent"
                } else {
                    "standby"
                },
                draining: is_own.then(|| shared.draining()),
                last_seen: format_rfc3339_ms(r.reported_at_ms),
                node_id: r.node_id,
                url: r.url,
                version: r.version,
                uptime_s: r.uptime_s,
                connections: r.clients,
                subscriptions: r.subscriptions,
                reported_ms_ago: r.reported_ms_ago,
            }
        })
        .collect();
    nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    Ok(ClusterView {
        observed_by: config.node_id.clone(),
        at_ms: own_at_ms,
        lease: row.map(|row| lease_view(state, row)),
        nodes,
        takeovers: history.into_iter().map(TakeoverView::from).collect(),
        rate: state.rates.latest(),
    })
}

/// The lease of a view from its row: with this node's own renewal
/// figures when the row names this node with the token it holds.
fn lease_view(state: &ConsoleState, row: LeaseInfo) -> LeaseView {
    let lease = state.shared.node.lease();
    let console = &state.config;
    let own = lease
        .writable_lease()
        .filter(|own| row.holder.as_deref() == Some(own.holder.as_str()) && row.token == own.token);
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let (renewed_ms_ago, safety_deadline_in_ms, exact) = match own {
        Some(_) => (
            lease.since_last_renewal().map(ms),
            lease.time_to_deadline().map(ms),
            true,
        ),
        None if row.holder.is_some() => (
            Some(row.renewed_ms_ago.max(0)),
            Some(row.expires_in_ms - ms(console.lease_safety_margin)),
            false,
        ),
        None => (None, None, false),
    };
    LeaseView {
        name: row.name,
        holder: row.holder,
        holder_url: row.holder_url,
        token: row.token.0,
        expires_in_ms: row.expires_in_ms,
        ttl_ms: row.expires_in_ms.saturating_add(row.renewed_ms_ago),
        renewed_ms_ago,
        safety_deadline_in_ms,
        exact,
    }
}

/// `read` within [`READ_TIMEOUT`].
async fn timed<T>(read: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(READ_TIMEOUT, read).await.map_err(|_| {
        tracing::debug!(
            timeout_ms = READ_TIMEOUT.as_millis() as u64,
            "cluster view: a storage read timed out"
        );
        Error::StorageUnavailable
    })
}
