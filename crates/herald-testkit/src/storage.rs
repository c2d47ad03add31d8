//! A storage that passes every call on to another one, with hooks that may
//! delay or fail reads, appends, channel epochs, presence reads and
//! presence removals,
//! fail reads of deletions or withhold change signals ([`Hooked`], [`StorageHooks`]),
//! and the hooks the tests use: reads that return late ([`SlowReads`]),
//! appends held until a gate opens ([`AppendGate`]) and a read outage
//! switched on and off ([`ReadOutage`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use herald_core::{
    Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, NewMessage, Offset, WriteOutcome,
    WriteRequest,
};
use herald_storage::{
    Acquire, ChangeFeed, ChangeSignal, ClusterEvent, Deletions, LeaseStore, Page, Storage,
};
use tokio::sync::{broadcast, watch};

use crate::{within, Rng, NODE_WAIT};

/// What a [`Hooked`] storage does around the calls it passes on. Every
/// hook does nothing by default; a test implements the ones it needs.
#[async_trait]
pub trait StorageHooks: Send + Sync + 'static {
    /// Runs before an append of `batch` is passed on; may wait. An `Err` is
    /// returned instead, and the append is not passed on.
    async fn before_append(&self, batch: &[NewMessage]) -> herald_storage::Result<()> {
        let _ = batch;
        Ok(())
    }

    /// Runs before a read of `channel` is passed on; may wait. An `Err` is
    /// returned instead, and the read is not passed on.
    async fn before_read(&self, channel: &ChannelName) -> herald_storage::Result<()> {
        let _ = channel;
        Ok(())
    }

    /// Runs after a read of `channel` returned `page`, before the page is
    /// returned; may wait. Not run when the read failed.
    async fn after_read(&self, channel: &ChannelName, page: &Page) {
        let _ = (channel, page);
    }

    /// Runs before a read of the deletions after `cursor` is passed on; may
    /// wait. An `Err` is returned instead, and the read is not passed on.
    async fn before_deletions_since(&self, cursor: u64) -> herald_storage::Result<()> {
        let _ = cursor;
        Ok(())
    }

    /// Whether the storage's change signals are passed on (`true` by
    /// default); without them a node polls as it does on SQLite.
    fn change_signals(&self) -> bool {
        true
    }
    /// Runs before `channel_epoch` of `channel` is passed on; may wait. An
    /// `Err` is returned instead, and the call is not passed on.
    async fn before_epoch(&self, channel: &ChannelName) -> herald_storage::Result<()> {
        let _ = channel;
        Ok(())
    }

    /// Runs before `presence` (the rows of `channel`) is passed on; may
    /// wait. An `Err` is returned instead, and the call is not passed on.
    async fn before_presence(&self, channel: &ChannelName) -> herald_storage::Result<()> {
        let _ = channel;
        Ok(())
    }

    /// Runs before `presence_remove` of `client`'s row of `channel` is
    /// passed on; may wait. An `Err` is returned instead, and the call is
    /// not passed on.
    async fn before_presence_remove(
        &self,
        channel: &ChannelName,
        client: &str,
    ) -> herald_storage::Result<()> {
        let _ = (channel, client);
        Ok(())
    }
}

/// A [`Storage`] that passes every call on to `inner`, running the hooks
/// `H` around reads, appends, channel epochs, presence reads and presence
/// removals.
pub struct Hooked<H> {
    inner: Arc<dyn Storage>,
    hooks: Arc<H>,
}

impl<H: StorageHooks> Hooked<H> {
    /// `inner` with `hooks` around its reads and appends.
    pub fn wrap(inner: Arc<dyn Storage>, hooks: Arc<H>) -> Arc<dyn Storage> {
        Arc::new(Self { inner, hooks })
    }
}

#[async_trait]
impl<H: StorageHooks> LeaseStore for Hooked<H> {
    async fn acquire(
        &self,
        candidate: &Candidate,
        ttl: Duration,
    ) -> herald_storage::Result<Acquire> {
        self.inner.acquire(candidate, ttl).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> herald_storage::Result<()> {
        self.inner.renew(lease, ttl).await
    }

    async fn release(&self, lease: &Lease) -> herald_storage::Result<()> {
        self.inner.release(lease).await
    }

    async fn lease_info(&self, name: &str) -> herald_storage::Result<Option<LeaseInfo>> {
        self.inner.lease_info(name).await
    }

    async fn takeover_counts(
        &self,
        name: &str,
    ) -> herald_storage::Result<Vec<herald_storage::TakeoverCount>> {
        self.inner.takeover_counts(name).await
    }

    async fn takeover_hint(&self, held: &LeaseInfo) {
        self.inner.takeover_hint(held).await
    }
}

#[async_trait]
impl<H: StorageHooks> herald_storage::MessageLog for Hooked<H> {
    /// The hook [`StorageHooks::before_append`] sees the batch's messages
    /// (a batch of stream appends only is passed on at once).
    async fn write(
        &self,
        lease: &Lease,
        batch: &[WriteRequest],
    ) -> herald_storage::Result<Vec<WriteOutcome>> {
        let messages: Vec<NewMessage> = batch
            .iter()
            .filter_map(|entry| match entry {
                WriteRequest::Message(message) => Some(message.clone()),
                WriteRequest::Stream(_) => None,
            })
            .collect();
        if !messages.is_empty() {
            self.hooks.before_append(&messages).await?;
        }
        self.inner.write(lease, batch).await
    }

    async fn read(
        &self,
        channel: &ChannelName,
        after: Offset,
        limit: usize,
    ) -> herald_storage::Result<Page> {
        self.hooks.before_read(channel).await?;
        let page = self.inner.read(channel, after, limit).await?;
        self.hooks.after_read(channel, &page).await;
        Ok(page)
    }

    async fn channels(&self) -> herald_storage::Result<Vec<ChannelHead>> {
        self.inner.channels().await
    }

    async fn channel_stats(&self) -> herald_storage::Result<Vec<herald_storage::ChannelStats>> {
        self.inner.channel_stats().await
    }

    async fn trim(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &herald_storage::TrimLimits,
        max_rows: usize,
    ) -> herald_storage::Result<herald_storage::Trimmed> {
        self.inner.trim(lease, channel, limits, max_rows).await
    }

    async fn channel_page(
        &self,
        search: &str,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> herald_storage::Result<Vec<herald_storage::ChannelSummary>> {
        self.inner.channel_page(search, after, limit).await
    }

    async fn channel_epoch(&self, channel: &ChannelName) -> herald_storage::Result<String> {
        self.hooks.before_epoch(channel).await?;
        self.inner.channel_epoch(channel).await
    }

    async fn record_deletion(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        head: Offset,
    ) -> herald_storage::Result<u64> {
        self.inner.record_deletion(lease, channel, head).await
    }
}

#[async_trait]
impl<H: StorageHooks> herald_storage::ChangeFeedReader for Hooked<H> {
    async fn changes_since(&self, cursor: u64) -> herald_storage::Result<ChangeFeed> {
        self.inner.changes_since(cursor).await
    }

    async fn change_cursor(&self) -> herald_storage::Result<u64> {
        self.inner.change_cursor().await
    }

    fn watch_changes(&self) -> Option<broadcast::Receiver<ChangeSignal>> {
        if self.hooks.change_signals() {
            self.inner.watch_changes()
        } else {
            None
        }
    }

    async fn deletions_since(&self, cursor: u64) -> herald_storage::Result<Deletions> {
        self.hooks.before_deletions_since(cursor).await?;
        self.inner.deletions_since(cursor).await
    }

    async fn deletion_cursor(&self) -> herald_storage::Result<u64> {
        self.inner.deletion_cursor().await
    }
}

#[async_trait]
impl<H: StorageHooks> herald_storage::StreamStore for Hooked<H> {
    async fn expired_streams(&self, limit: usize) -> herald_storage::Result<Vec<ChannelName>> {
        self.inner.expired_streams(limit).await
    }

    async fn stream_info(
        &self,
        channel: &ChannelName,
    ) -> herald_storage::Result<Option<herald_core::StreamInfo>> {
        self.inner.stream_info(channel).await
    }

    async fn create_stream(
        &self,
        lease: &Lease,
        create: &herald_core::StreamCreate,
    ) -> herald_storage::Result<herald_core::StreamCreated> {
        self.inner.create_stream(lease, create).await
    }

    async fn renew_streams(
        &self,
        lease: &Lease,
        channels: &[ChannelName],
    ) -> herald_storage::Result<u64> {
        self.inner.renew_streams(lease, channels).await
    }

    async fn soft_delete_stream(
        &self,
        lease: &Lease,
        channel: &ChannelName,
    ) -> herald_storage::Result<bool> {
        self.inner.soft_delete_stream(lease, channel).await
    }
}

#[async_trait]
impl<H: StorageHooks> herald_storage::PresenceStore for Hooked<H> {
    async fn presence_add(
        &self,
        session: &str,
        entry: &herald_storage::PresenceEntry,
        ttl: Duration,
    ) -> herald_storage::Result<()> {
        self.inner.presence_add(session, entry, ttl).await
    }

    async fn presence_remove(
        &self,
        channel: &ChannelName,
        client: &str,
    ) -> herald_storage::Result<()> {
        self.hooks.before_presence_remove(channel, client).await?;
        self.inner.presence_remove(channel, client).await
    }

    async fn presence_touch(&self, session: &str, ttl: Duration) -> herald_storage::Result<()> {
        self.inner.presence_touch(session, ttl).await
    }

    async fn presence(
        &self,
        channel: &ChannelName,
    ) -> herald_storage::Result<Vec<herald_storage::PresenceEntry>> {
        self.hooks.before_presence(channel).await?;
        self.inner.presence(channel).await
    }

    async fn send_presence_events(
        &self,
        events: &[herald_storage::PresenceEvent],
    ) -> herald_storage::Result<()> {
        self.inner.send_presence_events(events).await
    }

    fn watch_presence_events(&self) -> Option<broadcast::Receiver<herald_storage::PresenceEvent>> {
        self.inner.watch_presence_events()
    }
}

#[async_trait]
impl<H: StorageHooks> herald_storage::ClusterView for Hooked<H> {
    async fn report_node(
        &self,
        report: &herald_storage::NodeReport,
        channels: &[herald_storage::ChannelClients],
        ttl: Duration,
    ) -> herald_storage::Result<()> {
        self.inner.report_node(report, channels, ttl).await
    }

    async fn node_reports(&self) -> herald_storage::Result<Vec<herald_storage::NodeReport>> {
        self.inner.node_reports().await
    }

    async fn lease_history(
        &self,
        name: &str,
        limit: usize,
    ) -> herald_storage::Result<Vec<herald_storage::LeaseTakeover>> {
        self.inner.lease_history(name, limit).await
    }

    async fn cluster_channels(
        &self,
        except_node: &str,
    ) -> herald_storage::Result<Vec<herald_storage::ChannelClients>> {
        self.inner.cluster_channels(except_node).await
    }

    async fn send_cluster_event(&self, event: &ClusterEvent) -> herald_storage::Result<()> {
        self.inner.send_cluster_event(event).await
    }

    fn watch_cluster_events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        self.inner.watch_cluster_events()
    }
}

#[async_trait]
impl<H: StorageHooks> Storage for Hooked<H> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn ping(&self) -> herald_storage::Result<()> {
        self.inner.ping().await
    }
}

/// History reads that return late, by a random delay up to a maximum, to
/// widen the window between a subscriber's history read and its switch to
/// live notices, and to make live receivers lag behind while they read.
/// Deliberate latency injection, not a wait for an event.
pub struct SlowReads {
    max_delay: Duration,
    rng: Mutex<Rng>,
}

impl SlowReads {
    /// `inner` with every successful read returned up to `max_delay` late
    /// (uniformly, in microseconds; the seed is printed).
    pub fn wrap(inner: Arc<dyn Storage>, max_delay: Duration) -> Arc<dyn Storage> {
        let hooks = Self {
            max_delay,
            rng: Mutex::new(Rng::from_time()),
        };
        Hooked::wrap(inner, Arc::new(hooks))
    }
}

#[async_trait]
impl StorageHooks for SlowReads {
    async fn after_read(&self, _channel: &ChannelName, _page: &Page) {
        let micros = self.max_delay.as_micros() as u64;
        let delay = self.rng.lock().unwrap().below(micros + 1);
        tokio::time::sleep(Duration::from_micros(delay)).await;
    }
}

/// Holds every `append` of the storages it wraps until opened, and counts
/// the appends that started. Starts closed.
pub struct AppendGate {
    open: watch::Sender<bool>,
    started: watch::Sender<usize>,
}

impl AppendGate {
    /// A closed gate.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            open: watch::channel(false).0,
            started: watch::channel(0).0,
        })
    }

    /// Lets every held and future append through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Holds appends that start from now on.
    pub fn close(&self) {
        self.open.send_replace(false);
    }

    /// Appends started so far.
    pub fn started(&self) -> usize {
        *self.started.borrow()
    }

    /// Waits until `n` appends have started.
    ///
    /// # Panics
    /// When they have not within [`NODE_WAIT`].
    pub async fn wait_started(&self, n: usize) {
        let mut started = self.started.subscribe();
        within("appends start", NODE_WAIT, started.wait_for(|s| *s >= n))
            .await
            .unwrap();
    }

    /// Wraps `inner` so that its appends wait for this gate.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Storage>) -> Arc<dyn Storage> {
        Hooked::wrap(inner, Arc::clone(self))
    }
}

#[async_trait]
impl StorageHooks for AppendGate {
    async fn before_append(&self, _batch: &[NewMessage]) -> herald_storage::Result<()> {
        self.started.send_modify(|s| *s += 1);
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
        Ok(())
    }
}

/// Switches a storage outage for reads on and off: while it is on, every
/// `read` of a wrapped storage fails with `Unavailable` (a transient error,
/// as when the database is down or restarting); everything else passes.
/// Counts the failed reads per channel, so that tests can await them.
pub struct ReadOutage {
    on: AtomicBool,
    failed: watch::Sender<BTreeMap<String, usize>>,
}

impl ReadOutage {
    /// An outage that is off.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            on: AtomicBool::new(false),
            failed: watch::channel(BTreeMap::new()).0,
        })
    }

    /// Reads fail from now on.
    pub fn start(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// Reads pass again.
    pub fn end(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// Waits until `n` reads of `channel` have failed in total.
    ///
    /// # Panics
    /// When they have not within [`NODE_WAIT`].
    pub async fn wait_failed(&self, channel: &str, n: usize) {
        let mut failed = self.failed.subscribe();
        within(
            &format!("{n} failed reads of {channel}"),
            NODE_WAIT,
            failed.wait_for(|f| f.get(channel).copied().unwrap_or(0) >= n),
        )
        .await
        .unwrap();
    }

    /// Wraps `inner` so that its reads fail while the outage is on.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Storage>) -> Arc<dyn Storage> {
        Hooked::wrap(inner, Arc::clone(self))
    }
}

#[async_trait]
impl StorageHooks for ReadOutage {
    async fn before_read(&self, channel: &ChannelName) -> herald_storage::Result<()> {
        if !self.on.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.failed.send_modify(|f| {
            *f.entry(channel.as_str().to_owned()).or_default() += 1;
        });
        Err(herald_storage::Error::unavailable("injected outage"))
    }
}
