//! Centrifugo's server API `info` and `channels` for the whole cluster:
//! every node reports its counts of Centrifugo connections and its
//! subscribed channels (at most [`MAX_REPORTED_CHANNELS`]) to the storage
//! every [`REPORT_INTERVAL`] (`Storage::report_node`, a row per node and
//! one per channel it serves, which expire after [`REPORT_TTL`] unless
//! reported again). `info` lists the reports of every live node, and
//! `channels` sums the channels of every live node's report; both take
//! this node's own counts of now instead of its report. Like Centrifugo's,
//! whose nodes publish their info every few seconds, another node's counts
//! are as of its last report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use herald_core::ChannelName;
use herald_node::hub::Hub;
use herald_storage::{ChannelClients, NodeReport, Storage};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::codes::ReplyError;
use super::registry::Registry;

/// How often a node reports itself.
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(3);

/// How long a report stays without the next one: three missed reports
/// and a second, then the node drops out of `info`.
pub(crate) const REPORT_TTL: Duration = Duration::from_secs(10);

/// At most this many channels in one node's report: a node that serves
/// more reports its most subscribed ones (by count, then name), logs a
/// warning, and sets the gauge `herald_centrifugo_channels_unreported` to
/// how many it left out; the others are missing from the `channels` of
/// the other nodes (the node's own `channels` still has them all). It
/// bounds the rows each report writes and each `channels` call reads.
pub(crate) const MAX_REPORTED_CHANNELS: usize = 10_000;

/// `count` as a `u64`.
fn wide(count: usize) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX)
}

/// This node's channels for its report, at most `max`, and how many it
/// left out: `clients` (Centrifugo connections per channel) joined with
/// `subscribers` (live subscriptions of every protocol per channel, the
/// hub's); the most subscribed first kept, by name among equals.
fn reported_channels(
    clients: BTreeMap<ChannelName, usize>,
    mut subscribers: BTreeMap<ChannelName, usize>,
    max: usize,
) -> (Vec<ChannelClients>, usize) {
    for (channel, n) in &clients {
        let all = subscribers.entry(channel.clone()).or_insert(0);
        *all = (*all).max(*n);
    }
    let mut channels: Vec<ChannelClients> = subscribers
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(channel, n)| ChannelClients {
            clients: wide(clients.get(&channel).copied().unwrap_or(0)),
            subscribers: wide(n),
            channel,
        })
        .collect();
    let left_out = channels.len().saturating_sub(max);
    if left_out > 0 {
        channels.sort_by(|a, b| {
            b.clients
                .cmp(&a.clients)
                .then_with(|| b.subscribers.cmp(&a.subscribers))
                .then_with(|| a.channel.cmp(&b.channel))
        });
        channels.truncate(max);
    }
    (channels, left_out)
}

/// What a node's report says of it besides its Centrifugo counts: where
/// it is reached, and its live subscriptions of every protocol.
#[derive(Clone)]
pub(crate) struct ReportedNode {
    /// The node's id.
    pub(crate) node_id: String,
    /// Its advertised URL.
    pub(crate) url: String,
    /// Its live buffers, which count its subscriptions.
    pub(crate) hub: Arc<Hub>,
}

/// This node's report as `node_id`, reached at `url`, with its counts of
/// now and its `subscriptions` of every protocol.
fn report(registry: &Registry, node_id: &str, url: &str, subscriptions: u64) -> NodeReport {
    let counts = registry.counts();
    NodeReport {
        node_id: node_id.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_s: registry.uptime_s(),
        clients: wide(counts.clients),
        users: wide(counts.users),
        subs: wide(counts.subs),
        channels: wide(counts.channels),
        url: url.to_owned(),
        subscriptions,
        reported_ms_ago: 0,
        reported_at_ms: 0,
    }
}

/// Reports this node and its channels every [`REPORT_INTERVAL`], the
/// first time at once, until `shutdown` is cancelled. A failed report is
/// logged (once per run of failures) and tried again at the next interval;
/// so is a report that left channels out ([`MAX_REPORTED_CHANNELS`]).
pub(crate) async fn report_task(
    storage: Arc<dyn Storage>,
    registry: Arc<Registry>,
    node: ReportedNode,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(REPORT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut capped = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let all = node.hub.subscriber_counts();
        let subscriptions = wide(node.hub.subscriber_total());
        let (channels, left_out) =
            reported_channels(registry.subscribers(), all, MAX_REPORTED_CHANNELS);
        herald_http::metrics::channels_unreported(wide(left_out));
        if left_out > 0 && !capped {
            tracing::warn!(
                left_out,
                max = MAX_REPORTED_CHANNELS,
                "node report: more subscribed channels than a report holds; \
                 other nodes' `channels` miss the least subscribed ones"
            );
        }
        capped = left_out > 0;
        match storage
            .report_node(
                &report(&registry, &node.node_id, &node.url, subscriptions),
                &channels,
                REPORT_TTL,
            )
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

/// `info`'s result: `{"nodes": [...]}`, one entry per live node (the
/// others' reports in `storage`, this node's, `node_id`, of `registry`
/// now), by node id, in Centrifugo's shape.
///
/// # Errors
/// 100 when the storage fails (logged).
pub(crate) async fn info(
    storage: &dyn Storage,
    registry: &Registry,
    node_id: &str,
) -> Result<Value, ReplyError> {
    let mut reports = storage.node_reports().await.map_err(|e| {
        herald_node::node_error::StorageFailure::new("node_reports", None, e).log();
        ReplyError::internal()
    })?;
    let own = report(registry, node_id, "", 0);
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

/// `channels`' counts: every channel with subscribers on some live node,
/// with its clients summed over the nodes (the other nodes' as of their
/// last report, this node's of now), by name. Centrifugo's `channels`
/// lists the active channels, those with at least one subscriber, and so
/// does this: a channel with history but no subscribers is not listed.
/// The other nodes' reports are read from `storage`; this node
/// (`node_id`)'s subscribers from `registry`.
///
/// # Errors
/// 100 when the storage fails (logged).
pub(crate) async fn channel_counts(
    storage: &dyn Storage,
    registry: &Registry,
    node_id: &str,
) -> Result<BTreeMap<ChannelName, u64>, ReplyError> {
    let others = storage.cluster_channels(node_id).await.map_err(|e| {
        herald_node::node_error::StorageFailure::new("cluster_channels", None, e).log();
        ReplyError::internal()
    })?;
    let mut counts: BTreeMap<ChannelName, u64> =
        others.into_iter().map(|c| (c.channel, c.clients)).collect();
    for (channel, n) in registry.subscribers() {
        let sum = counts.entry(channel).or_insert(0);
        *sum = sum.saturating_add(wide(n));
    }
    counts.retain(|_, n| *n > 0);
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ChannelName {
        ChannelName::new(s).unwrap()
    }

    #[test]
    fn a_capped_report_keeps_the_most_subscribed_channels() {
        let subscribers: BTreeMap<ChannelName, usize> = [("a", 1), ("b", 5), ("c", 2), ("d", 5)]
            .into_iter()
            .map(|(c, n)| (name(c), n))
            .collect();
        let (kept, left_out) = reported_channels(subscribers.clone(), BTreeMap::new(), 3);
        let kept: Vec<(&str, u64)> = kept
            .iter()
            .map(|c| (c.channel.as_str(), c.clients))
            .collect();
        assert_eq!(kept, [("b", 5), ("d", 5), ("c", 2)]);
        assert_eq!(left_out, 1);
        let (all, left_out) = reported_channels(subscribers, BTreeMap::new(), 4);
        assert_eq!(all.len(), 4);
        assert_eq!(left_out, 0);
    }

    #[test]
    fn a_report_joins_centrifugo_connections_with_every_subscription() {
        let clients: BTreeMap<ChannelName, usize> = [("a", 2), ("b", 1)]
            .into_iter()
            .map(|(c, n)| (name(c), n))
            .collect();
        let hub: BTreeMap<ChannelName, usize> = [("b", 4), ("c", 3)]
            .into_iter()
            .map(|(c, n)| (name(c), n))
            .collect();
        let (channels, left_out) = reported_channels(clients, hub, 10);
        let got: Vec<(&str, u64, u64)> = channels
            .iter()
            .map(|c| (c.channel.as_str(), c.clients, c.subscribers))
            .collect();
        // A channel only Centrifugo counts keeps its count as subscribers.
        assert_eq!(got, [("a", 2, 2), ("b", 1, 4), ("c", 0, 3)]);
        assert_eq!(left_out, 0);
    }
}
