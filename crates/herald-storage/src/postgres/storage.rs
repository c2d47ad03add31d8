//! The storage traits on [`PostgresStorage`]: each method takes a pool
//! connection (or the renewal connection, or a receiver of the listener)
//! and runs the SQL of `ops.rs`, `presence.rs`, `nodes.rs`, `epoch.rs`,
//! `cluster.rs` or `presence_events.rs`.

use std::time::Duration;

use async_trait::async_trait;
use herald_core::{
    Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, Offset, StreamCreate, StreamCreated,
    StreamInfo, WriteOutcome, WriteRequest,
};
use tokio::sync::broadcast;

use super::connect::PostgresStorage;
use super::session::setting_ms;
use super::{cluster, epoch, nodes, ops, presence, presence_events, streams, write};
use crate::cluster::ClusterEvent;
use crate::decode::ttl_ms;
use crate::error::Result;
use crate::traits::{
    Acquire, ChangeFeed, ChangeFeedReader, ChangeSignal, ChannelClients, ChannelSummary,
    ClusterView, Deletions, LeaseStore, LeaseTakeover, MessageLog, NodeReport, Page, PresenceEntry,
    PresenceEvent, PresenceStore, Storage, StreamStore, TakeoverCount,
};
use crate::trim::{ChannelStats, TrimLimits, Trimmed};

#[async_trait]
impl LeaseStore for PostgresStorage {
    async fn acquire(&self, candidate: &Candidate, ttl: Duration) -> Result<Acquire> {
        *self
            .inner
            .seen_at_acquire
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = (
            *self.inner.releases.borrow(),
            *self.inner.watch_fired.borrow(),
        );
        let mut client = self.client().await?;
        ops::acquire(
            &mut client,
            candidate,
            ttl_ms(ttl),
            &setting_ms(self.inner.options.acquire_lock_timeout),
            self.inner.session_key,
        )
        .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        self.inner.renewal.renew(lease, ttl_ms(ttl)).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let client = self.client().await?;
        ops::release(&client, lease).await
    }

    async fn lease_info(&self, name: &str) -> Result<Option<LeaseInfo>> {
        let client = self.client().await?;
        ops::lease_info(&client, name).await
    }

    async fn takeover_counts(&self, name: &str) -> Result<Vec<TakeoverCount>> {
        let client = self.client().await?;
        ops::takeover_counts(&client, name).await
    }

    /// Resolves when, since the last acquire began, a release of a lease
    /// was announced on [`LEASE_CHANNEL`](super::names::LEASE_CHANNEL) (or the listener reconnected and
    /// may have missed one), or the takeover watch saw the session of
    /// `held`'s holder end (see the module `takeover`).
    async fn takeover_hint(&self, held: &LeaseInfo) {
        let target = Some((held.name.clone(), held.token.0));
        self.inner.watch_target.send_if_modified(|t| {
            let changed = *t != target;
            if changed {
                t.clone_from(&target);
            }
            changed
        });
        let (releases_seen, fired_seen) = *self
            .inner
            .seen_at_acquire
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut releases = self.inner.releases.clone();
        let mut fired = self.inner.watch_fired.clone();
        let released = async move { releases.wait_for(|n| *n > releases_seen).await.is_ok() };
        let gone = async move { fired.wait_for(|n| *n > fired_seen).await.is_ok() };
        tokio::select! {
            true = released => {}
            true = gone => {}
            else => std::future::pending::<()>().await,
        }
    }
}

#[async_trait]
impl MessageLog for PostgresStorage {
    async fn write(&self, lease: &Lease, batch: &[WriteRequest]) -> Result<Vec<WriteOutcome>> {
        let mut client = self.client().await?;
        write::write(&mut client, lease, batch).await
    }

    async fn read(&self, channel: &ChannelName, after: Offset, limit: usize) -> Result<Page> {
        let client = self.client().await?;
        ops::read(&client, channel, after, limit).await
    }

    async fn channels(&self) -> Result<Vec<ChannelHead>> {
        let client = self.client().await?;
        ops::channels(&client).await
    }

    async fn channel_stats(&self) -> Result<Vec<ChannelStats>> {
        let client = self.client().await?;
        ops::channel_stats(&client).await
    }

    async fn trim(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &TrimLimits,
        max_rows: usize,
    ) -> Result<Trimmed> {
        let mut client = self.client().await?;
        ops::trim(&mut client, lease, channel, limits, max_rows).await
    }

    async fn channel_page(
        &self,
        search: &str,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<ChannelSummary>> {
        let client = self.client().await?;
        ops::channel_page(&client, search, after, limit).await
    }

    async fn channel_epoch(&self, channel: &ChannelName) -> Result<String> {
        let client = self.client().await?;
        epoch::read(&client, channel).await
    }

    async fn record_deletion(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        head: Offset,
    ) -> Result<u64> {
        let mut client = self.client().await?;
        ops::record_deletion(&mut client, lease, channel, head).await
    }
}

#[async_trait]
impl ChangeFeedReader for PostgresStorage {
    async fn changes_since(&self, cursor: u64) -> Result<ChangeFeed> {
        let client = self.client().await?;
        ops::changes_since(&client, cursor).await
    }

    async fn change_cursor(&self) -> Result<u64> {
        let client = self.client().await?;
        ops::change_cursor(&client).await
    }

    async fn deletions_since(&self, cursor: u64) -> Result<Deletions> {
        let client = self.client().await?;
        ops::deletions_since(&client, cursor).await
    }

    async fn deletion_cursor(&self) -> Result<u64> {
        let client = self.client().await?;
        ops::deletion_cursor(&client).await
    }

    fn watch_changes(&self) -> Option<broadcast::Receiver<ChangeSignal>> {
        Some(self.inner.changes.subscribe())
    }
}

#[async_trait]
impl StreamStore for PostgresStorage {
    async fn expired_streams(&self, limit: usize) -> Result<Vec<ChannelName>> {
        let client = self.client().await?;
        streams::expired_streams(&client, limit).await
    }

    async fn stream_info(&self, channel: &ChannelName) -> Result<Option<StreamInfo>> {
        let client = self.client().await?;
        streams::stream_info(&client, channel).await
    }

    async fn create_stream(&self, lease: &Lease, create: &StreamCreate) -> Result<StreamCreated> {
        let mut client = self.client().await?;
        streams::create_stream(&mut client, lease, create).await
    }

    async fn renew_streams(&self, lease: &Lease, channels: &[ChannelName]) -> Result<u64> {
        let mut client = self.client().await?;
        streams::renew_streams(&mut client, lease, channels).await
    }

    async fn soft_delete_stream(&self, lease: &Lease, channel: &ChannelName) -> Result<bool> {
        let mut client = self.client().await?;
        streams::soft_delete_stream(&mut client, lease, channel).await
    }
}

#[async_trait]
impl PresenceStore for PostgresStorage {
    async fn presence_add(
        &self,
        session: &str,
        entry: &PresenceEntry,
        ttl: Duration,
    ) -> Result<()> {
        let client = self.client().await?;
        presence::add(&client, session, entry, ttl).await
    }

    async fn presence_remove(&self, channel: &ChannelName, id: &str) -> Result<()> {
        let client = self.client().await?;
        presence::remove(&client, channel, id).await
    }

    async fn presence_touch(&self, session: &str, ttl: Duration) -> Result<()> {
        let client = self.client().await?;
        presence::touch(&client, session, ttl).await
    }

    async fn presence(&self, channel: &ChannelName) -> Result<Vec<PresenceEntry>> {
        let client = self.client().await?;
        presence::list(&client, channel).await
    }

    async fn send_presence_events(&self, events: &[PresenceEvent]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        presence_events::send(
            &client,
            self.inner.session_key,
            &self.inner.presence_seq,
            events,
        )
        .await
    }

    fn watch_presence_events(&self) -> Option<broadcast::Receiver<PresenceEvent>> {
        Some(self.inner.presence_inbox.subscribe())
    }
}

#[async_trait]
impl ClusterView for PostgresStorage {
    async fn report_node(
        &self,
        report: &NodeReport,
        channels: &[ChannelClients],
        ttl: Duration,
    ) -> Result<()> {
        let mut client = self.client().await?;
        nodes::report(&mut client, report, channels, ttl).await
    }

    async fn lease_history(&self, name: &str, limit: usize) -> Result<Vec<LeaseTakeover>> {
        let client = self.client().await?;
        ops::lease_history(&client, name, limit).await
    }

    async fn node_reports(&self) -> Result<Vec<NodeReport>> {
        let client = self.client().await?;
        nodes::list(&client).await
    }

    async fn cluster_channels(&self, except_node: &str) -> Result<Vec<ChannelClients>> {
        let client = self.client().await?;
        nodes::channels(&client, except_node).await
    }

    async fn send_cluster_event(&self, event: &ClusterEvent) -> Result<()> {
        event.check_size()?;
        let client = self.client().await?;
        cluster::send(&client, self.inner.session_key, event).await
    }

    fn watch_cluster_events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.inner.cluster.subscribe())
    }
}

#[async_trait]
impl Storage for PostgresStorage {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> Result<()> {
        let client = self.client().await?;
        ops::ping(&client).await
    }
}
