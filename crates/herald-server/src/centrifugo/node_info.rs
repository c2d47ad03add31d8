//! Centrifugo's server API `info` for the whole cluster: every node
//! reports its counts of Centrifugo connections to the storage every
//! [`REPORT_INTERVAL`] (`Storage::report_node`, a row per node that
//! expires after [`REPORT_TTL`] unless reported again), and `info` lists
//! the reports of every live node, this node's own with its counts of now.
//! Like Centrifugo's, whose nodes publish their info every few seconds,
//! another node's counts are as of its last report.

use std::sync::Arc;
use std::time::Duration;

use herald_storage::{NodeReport, Storage};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::codes::ReplyError;
use super::Registry;
use crate::AppState;

/// How often a node reports itself.
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(3);

/// How long a report stays without the next one: three missed reports
/// and a second, then the node drops out of `info`.
pub(crate) const REPORT_TTL: Duration = Duration::from_secs(10);

/// This node's report, with its counts of now.
fn report(registry: &Registry, node_id: &str) -> NodeReport {
    let counts = registry.counts();
    let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    NodeReport {
        node_id: node_id.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_s: registry.uptime_s(),
        clients: wide(counts.clients),
        users: wide(counts.users),
        subs: wide(counts.subs),
        channels: wide(counts.channels),
    }
}

/// Reports this node every [`REPORT_INTERVAL`], the first time at once,
/// until `shutdown` is cancelled. A failed report is logged (once per run
/// of failures) and tried again at the next interval.
pub(crate) async fn report_task(
    storage: Arc<dyn Storage>,
    registry: Arc<Registry>,
    node_id: String,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(REPORT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match storage
            .report_node(&report(&registry, &node_id), REPORT_TTL)
            .await
        {
            Ok(()) if failing => {
                tracing::info!("node report: storage answers again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(error = %e, "node report failed; other nodes' info may miss this node");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

/// `info`'s result: `{"nodes": [...]}`, one entry per live node, by node
/// id, in Centrifugo's shape.
///
/// # Errors
/// 100 when the storage fails (logged).
pub(crate) async fn info(state: &AppState) -> Result<Value, ReplyError> {
    let shared = &state.shared;
    let mut reports = shared.storage.node_reports().await.map_err(|e| {
        crate::StorageFailure::new("node_reports", None, e).log();
        ReplyError::internal()
    })?;
    let own = report(&shared.centrifugo, &shared.config.node_id);
    reports.retain(|r| r.node_id != own.node_id);
    reports.push(own);
    reports.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let nodes: Vec<Value> = reports
        .into_iter()
        .map(|r| {
            json!({
                "uid": r.node_id,
                "name": r.node_id,
                "version": r.version,
                "num_clients": r.clients,
                "num_users": r.users,
                "num_subs": r.subs,
                "num_channels": r.channels,
                "uptime": r.uptime_s,
            })
        })
        .collect();
    Ok(json!({ "nodes": nodes }))
}
