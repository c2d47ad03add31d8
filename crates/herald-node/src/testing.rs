//! Test doubles for unit tests: an in-memory [`Storage`] with knobs (hold
//! appends, fail appends or reads, transiently or not, count reads, change
//! the current token) and a lease view driven by hand.
//!
//! They stay in this crate rather than in `herald-testkit`: the unit tests
//! that use them cannot depend on the testkit (it depends on this crate,
//! and a second copy of its types would not match), and [`FakeLease`]
//! implements the crate-private `LeaseView`. The integration tests in
//! `tests/` use the testkit.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use herald_core::{
    Appended, Candidate, ChannelHead, ChannelName, FencingToken, Lease, LeaseInfo, Message,
    NewMessage, Offset,
};
use herald_lease::LeaseState;
use herald_storage::{
    Acquire, ChangeFeed, ChangeSignal, ClusterEvent, Deletion, Deletions, LeaseStore, Page,
    Storage, TakeoverReason,
};
use tokio::sync::{broadcast, watch, Notify, OwnedMutexGuard};

#[derive(Default)]
struct Mem {
    channels: BTreeMap<String, Vec<Message>>,
    /// (channel, key) → (offset, published_at_ms, digest)
    keys: HashMap<(String, String), (Offset, i64, herald_storage::IdempotencyDigest)>,
    /// (commit sequence number, channel, head after the commit)
    changes: Vec<(u64, String, Offset)>,
    seq: u64,
    /// Per channel: every offset at or below this was trimmed.
    trimmed: HashMap<String, Offset>,
    token: u64,
    clock_ms: i64,
    batch_sizes: Vec<usize>,
    /// Channel epochs, made up from a counter on first ask.
    epochs: BTreeMap<String, String>,
    /// Presence entries by (channel, client), with their session (no
    /// expiry: the server's unit tests do not wait for one).
    presence: BTreeMap<(String, String), (String, herald_storage::PresenceEntry)>,
    /// Each deleted channel's latest deletion: (number, head).
    deletions: BTreeMap<String, (u64, Offset)>,
    /// The number of the latest deletion.
    deletion_seq: u64,
    /// Node reports by node id (no expiry: the server's unit tests do not
    /// wait for one).
    nodes: BTreeMap<String, herald_storage::NodeReport>,
    /// Each node's channels of its last report, by node id.
    node_channels: BTreeMap<String, Vec<herald_storage::ChannelClients>>,
    /// Every acquisition, oldest first (the takeover timeline).
    history: Vec<herald_storage::LeaseTakeover>,
}

/// An in-memory storage that follows the `Storage` contract closely enough
/// for the server's unit tests.
pub struct MemoryStorage {
    mem: Mutex<Mem>,
    gate: Arc<tokio::sync::Mutex<()>>,
    appends_started: AtomicUsize,
    started: Notify,
    fail_appends: AtomicBool,
    fail_reads: AtomicBool,
    /// Reads fail with an error that is not transient (`Corrupt`).
    corrupt_reads: AtomicBool,
    /// Calls of `read` so far, failed ones included.
    reads: AtomicUsize,
    /// When each call of `read` came, on tokio's clock.
    read_times: Mutex<Vec<tokio::time::Instant>>,
    /// The most messages one call of `read` returned.
    largest_read: AtomicUsize,
    /// Commit signals, when the test turned them on.
    signals: Mutex<Option<broadcast::Sender<ChangeSignal>>>,
    /// Calls of `changes_since` so far, so tests can await a poll.
    polls: tokio::sync::watch::Sender<usize>,
    /// Every cluster event sent, in order.
    sent_events: Mutex<Vec<ClusterEvent>>,
    /// Cluster events "from other nodes", which the test sends.
    cluster_events: broadcast::Sender<ClusterEvent>,
}

/// What the memory storage answers to a stream write: it does not model
/// streams.
fn not_modelled() -> herald_storage::Error {
    herald_storage::Error::Unavailable {
        message: "the memory storage does not model streams".to_owned(),
        source: None,
    }
}

/// The memory storage's clock at its start, in ms since the Unix epoch:
/// its messages are stamped 1 ms, 2 ms, … after it.
pub const CLOCK_START_MS: i64 = 1_795_287_034_000;

impl MemoryStorage {
    /// An empty storage whose clock starts at [`CLOCK_START_MS`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            mem: Mutex::new(Mem {
                token: 1,
                clock_ms: CLOCK_START_MS,
                ..Mem::default()
            }),
            gate: Arc::new(tokio::sync::Mutex::new(())),
            appends_started: AtomicUsize::new(0),
            started: Notify::new(),
            fail_appends: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
            corrupt_reads: AtomicBool::new(false),
            reads: AtomicUsize::new(0),
            read_times: Mutex::new(Vec::new()),
            largest_read: AtomicUsize::new(0),
            signals: Mutex::new(None),
            polls: tokio::sync::watch::channel(0).0,
            sent_events: Mutex::new(Vec::new()),
            cluster_events: broadcast::channel(16).0,
        })
    }

    /// The cluster events sent through this storage so far.
    pub fn sent_events(&self) -> Vec<ClusterEvent> {
        self.sent_events.lock().unwrap().clone()
    }

    /// Delivers `event` to every cluster event watcher, as another node
    /// sending it would.
    pub fn hear_event(&self, event: ClusterEvent) {
        let _ = self.cluster_events.send(event);
    }

    /// Deletes `channel` as another node would: removes every message and
    /// records the deletion; returns its number.
    pub fn delete_as_other_node(&self, channel: &str) -> u64 {
        let mut mem = self.mem.lock().unwrap();
        let trimmed = mem.trimmed.get(channel).copied().unwrap_or(0);
        let list = mem.channels.entry(channel.to_owned()).or_default();
        let head = list.last().map_or(trimmed, |m| m.offset);
        list.clear();
        mem.keys.retain(|(ch, _), _| ch != channel);
        mem.trimmed.insert(channel.to_owned(), head);
        Self::record_deletion_locked(&mut mem, channel, head)
    }

    fn record_deletion_locked(mem: &mut Mem, channel: &str, head: Offset) -> u64 {
        mem.deletion_seq += 1;
        let number = mem.deletion_seq;
        mem.deletions.insert(channel.to_owned(), (number, head));
        number
    }

    /// Waits until `changes_since` has been called at least `n` times.
    pub async fn wait_polls(&self, n: usize) {
        let mut rx = self.polls.subscribe();
        let _ = rx.wait_for(|polls| *polls >= n).await;
    }

    /// A storage whose `watch_changes` answers, with a signal buffer of
    /// `capacity`. The test sends the signals with [`Self::signal`].
    pub fn with_signals(capacity: usize) -> Arc<Self> {
        let storage = Self::new();
        *storage.signals.lock().unwrap() = Some(broadcast::channel(capacity).0);
        storage
    }

    /// Sends `signal` to every watcher.
    pub fn signal(&self, signal: ChangeSignal) {
        if let Some(tx) = self.signals.lock().unwrap().as_ref() {
            let _ = tx.send(signal);
        }
    }

    /// Drops the signal sender: watchers see the end of the signals.
    pub fn close_signals(&self) {
        self.signals.lock().unwrap().take();
    }

    /// While the guard lives, every `append` waits after it started.
    pub async fn hold_appends(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.gate).lock_owned().await
    }

    /// Waits until `n` appends have started in total.
    pub async fn wait_for_appends_started(&self, n: usize) {
        loop {
            let notified = self.started.notified();
            if self.appends_started.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }

    /// Appends fail with `Unavailable` while `on`.
    pub fn fail_appends(&self, on: bool) {
        self.fail_appends.store(on, Ordering::SeqCst);
    }

    /// Reads (and pings) fail with `Unavailable`, a transient error.
    pub fn fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }

    /// Reads fail with `Corrupt`, an error that is not transient.
    pub fn corrupt_reads(&self, on: bool) {
        self.corrupt_reads.store(on, Ordering::SeqCst);
    }

    /// The most messages one call of `read` returned so far.
    pub fn largest_read(&self) -> usize {
        self.largest_read.load(Ordering::SeqCst)
    }

    /// Calls of `read` so far, failed ones included.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    /// When each call of `read` came, on tokio's clock.
    pub fn read_times(&self) -> Vec<tokio::time::Instant> {
        self.read_times.lock().unwrap().clone()
    }

    /// Makes `token` the current one, as a takeover by another node would.
    pub fn set_current_token(&self, token: FencingToken) {
        self.mem.lock().unwrap().token = token.0;
    }

    /// The number of messages of each `append` call so far.
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.mem.lock().unwrap().batch_sizes.clone()
    }

    /// The head (last offset) of `channel`, 0 when it has no message.
    pub fn head(&self, channel: &str) -> Offset {
        let mem = self.mem.lock().unwrap();
        mem.channels
            .get(channel)
            .and_then(|v| v.last())
            .map_or(0, |m| m.offset)
    }

    /// Everything a refused request must leave as it was: every channel's
    /// messages (offsets and data) and every stored idempotency key.
    pub fn snapshot(&self) -> Vec<(String, Offset, String)> {
        let mem = self.mem.lock().unwrap();
        let mut all: Vec<(String, Offset, String)> = mem
            .channels
            .iter()
            .flat_map(|(name, messages)| {
                messages
                    .iter()
                    .map(|m| (name.clone(), m.offset, m.data.to_json_text().into_owned()))
            })
            .collect();
        all.extend(mem.keys.iter().map(|((channel, key), (offset, _, _))| {
            (format!("{channel} {key}"), *offset, String::new())
        }));
        all.sort();
        all
    }

    /// Appends directly, as another node on the same database would.
    pub fn append_as_other_node(&self, channel: &str, data: &str) -> Offset {
        let mut mem = self.mem.lock().unwrap();
        let msg = NewMessage {
            channel: ChannelName::new(channel).unwrap(),
            data: herald_core::Payload::Json(Arc::from(
                serde_json::value::RawValue::from_string(data.to_owned()).unwrap(),
            )),
            idempotency_key: None,
            tags: herald_core::Tags::default(),
        };
        Self::append_locked(&mut mem, &msg).offset
    }

    fn append_locked(mem: &mut Mem, msg: &NewMessage) -> Appended {
        let name = msg.channel.as_str().to_owned();
        if let Some(key) = &msg.idempotency_key {
            if let Some(&(offset, at, _)) = mem.keys.get(&(name.clone(), key.as_str().to_owned())) {
                return Appended {
                    channel: msg.channel.clone(),
                    offset,
                    published_at_ms: at,
                    duplicate: true,
                };
            }
        }
        mem.clock_ms += 1;
        let at = mem.clock_ms;
        let list = mem.channels.entry(name.clone()).or_default();
        let trimmed = mem.trimmed.get(&name).copied().unwrap_or(0);
        let offset = list.last().map_or(trimmed + 1, |m| m.offset + 1);
        list.push(Message {
            offset,
            data: msg.data.clone(),
            published_at_ms: at,
            tags: msg.tags.clone(),
        });
        if let Some(key) = &msg.idempotency_key {
            mem.keys.insert(
                (name.clone(), key.as_str().to_owned()),
                (offset, at, herald_storage::idempotency_digest(msg)),
            );
        }
        mem.seq += 1;
        let seq = mem.seq;
        mem.changes.push((seq, name, offset));
        Appended {
            channel: msg.channel.clone(),
            offset,
            published_at_ms: at,
            duplicate: false,
        }
    }
}

fn unavailable() -> herald_storage::Error {
    herald_storage::Error::unavailable("injected failure")
}

#[async_trait]
impl LeaseStore for MemoryStorage {
    async fn acquire(
        &self,
        candidate: &Candidate,
        _ttl: Duration,
    ) -> herald_storage::Result<Acquire> {
        let mut mem = self.mem.lock().unwrap();
        mem.token += 1;
        let previous_holder = mem.history.last().map(|t| t.holder.clone());
        let takeover = herald_storage::LeaseTakeover {
            token: FencingToken(mem.token),
            holder: candidate.node_id.clone(),
            previous_holder,
            reason: TakeoverReason::Fresh,
            at_ms: mem.clock_ms,
        };
        mem.history.push(takeover);
        Ok(Acquire::Acquired {
            lease: Lease {
                name: candidate.lease_name.clone(),
                holder: candidate.node_id.clone(),
                holder_url: candidate.advertise_url.clone(),
                token: FencingToken(mem.token),
            },
            reason: TakeoverReason::Fresh,
        })
    }

    async fn renew(&self, lease: &Lease, _ttl: Duration) -> herald_storage::Result<()> {
        let mem = self.mem.lock().unwrap();
        if mem.token == lease.token.0 {
            Ok(())
        } else {
            Err(herald_storage::Error::LeaseLost {
                name: lease.name.clone(),
                token: lease.token,
            })
        }
    }

    async fn release(&self, _lease: &Lease) -> herald_storage::Result<()> {
        Ok(())
    }

    async fn takeover_counts(
        &self,
        _name: &str,
    ) -> herald_storage::Result<Vec<herald_storage::TakeoverCount>> {
        Ok(Vec::new())
    }

    async fn lease_info(&self, name: &str) -> herald_storage::Result<Option<LeaseInfo>> {
        let mem = self.mem.lock().unwrap();
        Ok(Some(LeaseInfo {
            name: name.to_owned(),
            holder: Some("node-a".to_owned()),
            holder_url: Some("http://node-a".to_owned()),
            token: FencingToken(mem.token),
            expires_in_ms: 30_000,
            renewed_ms_ago: 0,
        }))
    }
}

#[async_trait]
impl herald_storage::MessageLog for MemoryStorage {
    /// Messages only: a stream append is not modelled.
    async fn write(
        &self,
        lease: &Lease,
        batch: &[herald_core::WriteRequest],
    ) -> herald_storage::Result<Vec<herald_core::WriteOutcome>> {
        let batch: Vec<&NewMessage> = batch
            .iter()
            .map(|entry| match entry {
                herald_core::WriteRequest::Message(message) => Ok(message),
                herald_core::WriteRequest::Stream(_) => Err(not_modelled()),
            })
            .collect::<herald_storage::Result<_>>()?;
        self.appends_started.fetch_add(1, Ordering::SeqCst);
        self.started.notify_waiters();
        let _gate = self.gate.lock().await;
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        let mut mem = self.mem.lock().unwrap();
        if mem.token != lease.token.0 {
            return Err(herald_storage::Error::LeaseLost {
                name: lease.name.clone(),
                token: lease.token,
            });
        }
        // A key reused for another message (stored, or earlier in this
        // batch) refuses the whole batch, as the real backends do.
        let mut in_batch: HashMap<(&str, &str), herald_storage::IdempotencyDigest> = HashMap::new();
        for (index, m) in batch.iter().enumerate() {
            let Some(key) = &m.idempotency_key else {
                continue;
            };
            let digest = herald_storage::idempotency_digest(m);
            let id = (m.channel.as_str(), key.as_str());
            let first = in_batch.get(&id).copied().or_else(|| {
                mem.keys
                    .get(&(id.0.to_owned(), id.1.to_owned()))
                    .map(|k| k.2)
            });
            match first {
                Some(first) if first != digest => {
                    return Err(herald_storage::Error::IdempotencyKeyReused { index });
                }
                Some(_) => {}
                None => {
                    in_batch.insert(id, digest);
                }
            }
        }
        mem.batch_sizes.push(batch.len());
        Ok(batch
            .iter()
            .map(|m| herald_core::WriteOutcome::Message(Self::append_locked(&mut mem, m)))
            .collect())
    }

    async fn read(
        &self,
        channel: &ChannelName,
        after: Offset,
        limit: usize,
    ) -> herald_storage::Result<Page> {
        self.read_times
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        self.reads.fetch_add(1, Ordering::SeqCst);
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        if self.corrupt_reads.load(Ordering::SeqCst) {
            return Err(herald_storage::Error::corrupt("injected damage"));
        }
        let mem = self.mem.lock().unwrap();
        let list = mem.channels.get(channel.as_str());
        let trimmed = mem.trimmed.get(channel.as_str()).copied().unwrap_or(0);
        let head = list.and_then(|v| v.last()).map_or(trimmed, |m| m.offset);
        let messages: Vec<Message> = list
            .map(|v| {
                v.iter()
                    .filter(|m| m.offset > after)
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        self.largest_read
            .fetch_max(messages.len(), Ordering::SeqCst);
        Ok(Page {
            head,
            earliest: trimmed + 1,
            messages,
            deletion: mem.deletions.get(channel.as_str()).map_or(0, |d| d.0),
        })
    }

    async fn channel_stats(&self) -> herald_storage::Result<Vec<herald_storage::ChannelStats>> {
        let mem = self.mem.lock().unwrap();
        Ok(mem
            .channels
            .iter()
            .map(|(name, v)| {
                let trimmed = mem.trimmed.get(name).copied().unwrap_or(0);
                herald_storage::ChannelStats {
                    name: ChannelName::new(name.clone()).unwrap(),
                    head: v.last().map_or(trimmed, |m| m.offset),
                    earliest: v.first().map_or(trimmed + 1, |m| m.offset),
                    messages: v.len() as u64,
                    bytes: v.iter().map(|m| m.data.to_json_text().len() as u64).sum(),
                }
            })
            .collect())
    }

    /// Trims by `max_messages` and `up_to` only (enough for the server's
    /// unit tests), in one step.
    async fn trim(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &herald_storage::TrimLimits,
        _max_rows: usize,
    ) -> herald_storage::Result<herald_storage::Trimmed> {
        let mut mem = self.mem.lock().unwrap();
        if mem.token != lease.token.0 {
            return Err(herald_storage::Error::LeaseLost {
                name: lease.name.clone(),
                token: lease.token,
            });
        }
        let name = channel.as_str().to_owned();
        let trimmed = mem.trimmed.get(&name).copied().unwrap_or(0);
        let list = mem.channels.entry(name.clone()).or_default();
        let head = list.last().map_or(trimmed, |m| m.offset);
        let through = limits
            .max_messages
            .map_or(0, |keep| head.saturating_sub(keep))
            .max(limits.up_to.unwrap_or(0).min(head))
            .max(trimmed);
        let before = list.len();
        let bytes: u64 = list
            .iter()
            .filter(|m| m.offset <= through)
            .map(|m| m.data.to_json_text().len() as u64)
            .sum();
        list.retain(|m| m.offset > through);
        let messages = (before - list.len()) as u64;
        mem.keys
            .retain(|(ch, _), (offset, _, _)| *ch != name || *offset > through);
        mem.trimmed.insert(name, through);
        Ok(herald_storage::Trimmed {
            messages,
            bytes,
            earliest: through + 1,
            head,
            done: true,
        })
    }

    async fn channel_page(
        &self,
        search: &str,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> herald_storage::Result<Vec<herald_storage::ChannelSummary>> {
        let mem = self.mem.lock().unwrap();
        let after = after.map_or("", ChannelName::as_str);
        Ok(mem
            .channels
            .iter()
            .filter(|(name, _)| name.as_str() > after && name.contains(search))
            .take(limit.min(herald_storage::MAX_CHANNEL_PAGE))
            .map(|(name, v)| {
                let trimmed = mem.trimmed.get(name).copied().unwrap_or(0);
                let head = v.last().map_or(trimmed, |m| m.offset);
                herald_storage::ChannelSummary {
                    name: ChannelName::new(name.clone()).unwrap(),
                    head,
                    earliest: v.first().map_or(trimmed + 1, |m| m.offset),
                    messages: v.len() as u64,
                    bytes: v.iter().map(|m| m.data.to_json_text().len() as u64).sum(),
                    last_published_at_ms: v.last().map(|m| m.published_at_ms),
                    content_type: None,
                    subscribers: mem
                        .node_channels
                        .values()
                        .flatten()
                        .filter(|c| c.channel.as_str() == name)
                        .map(|c| c.subscribers)
                        .sum(),
                }
            })
            .collect())
    }

    async fn channel_epoch(&self, channel: &ChannelName) -> herald_storage::Result<String> {
        let mut mem = self.mem.lock().unwrap();
        let next = format!("{:016x}", mem.epochs.len() + 1);
        Ok(mem
            .epochs
            .entry(channel.as_str().to_owned())
            .or_insert(next)
            .clone())
    }

    async fn channels(&self) -> herald_storage::Result<Vec<ChannelHead>> {
        let mem = self.mem.lock().unwrap();
        Ok(mem
            .channels
            .iter()
            .map(|(name, v)| ChannelHead {
                name: ChannelName::new(name.clone()).unwrap(),
                head: v
                    .last()
                    .map_or(mem.trimmed.get(name).copied().unwrap_or(0), |m| m.offset),
            })
            .collect())
    }

    async fn record_deletion(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        head: Offset,
    ) -> herald_storage::Result<u64> {
        let mut mem = self.mem.lock().unwrap();
        if mem.token != lease.token.0 {
            return Err(herald_storage::Error::LeaseLost {
                name: lease.name.clone(),
                token: lease.token,
            });
        }
        Ok(Self::record_deletion_locked(
            &mut mem,
            channel.as_str(),
            head,
        ))
    }
}

#[async_trait]
impl herald_storage::ChangeFeedReader for MemoryStorage {
    async fn changes_since(&self, cursor: u64) -> herald_storage::Result<ChangeFeed> {
        self.polls.send_modify(|polls| *polls += 1);
        let mem = self.mem.lock().unwrap();
        let mut heads: BTreeMap<&str, Offset> = BTreeMap::new();
        for (seq, name, head) in &mem.changes {
            if *seq > cursor {
                heads.insert(name, *head);
            }
        }
        Ok(ChangeFeed {
            cursor: mem.seq.max(cursor),
            changed: heads
                .into_iter()
                .map(|(name, head)| ChannelHead {
                    name: ChannelName::new(name).unwrap(),
                    head,
                })
                .collect(),
        })
    }

    fn watch_changes(&self) -> Option<broadcast::Receiver<ChangeSignal>> {
        self.signals
            .lock()
            .unwrap()
            .as_ref()
            .map(broadcast::Sender::subscribe)
    }

    async fn change_cursor(&self) -> herald_storage::Result<u64> {
        Ok(self.mem.lock().unwrap().seq)
    }

    async fn deletions_since(&self, cursor: u64) -> herald_storage::Result<Deletions> {
        let mem = self.mem.lock().unwrap();
        let mut deleted: Vec<Deletion> = mem
            .deletions
            .iter()
            .filter(|(_, (number, _))| *number > cursor)
            .map(|(name, &(number, head))| Deletion {
                channel: ChannelName::new(name.clone()).unwrap(),
                head,
                number,
            })
            .collect();
        deleted.sort_by_key(|d| d.number);
        Ok(Deletions {
            cursor: mem.deletion_seq.max(cursor),
            deleted,
        })
    }

    async fn deletion_cursor(&self) -> herald_storage::Result<u64> {
        Ok(self.mem.lock().unwrap().deletion_seq)
    }
}

#[async_trait]
impl herald_storage::StreamStore for MemoryStorage {
    // Streams are not modelled here: the node's stream paths are tested
    // against the real backends (`herald-server/tests/durable_streams.rs`).
    async fn stream_info(
        &self,
        _channel: &ChannelName,
    ) -> herald_storage::Result<Option<herald_core::StreamInfo>> {
        Ok(None)
    }

    async fn expired_streams(&self, _limit: usize) -> herald_storage::Result<Vec<ChannelName>> {
        Ok(Vec::new())
    }

    async fn create_stream(
        &self,
        _lease: &Lease,
        _create: &herald_core::StreamCreate,
    ) -> herald_storage::Result<herald_core::StreamCreated> {
        Err(not_modelled())
    }

    async fn renew_streams(
        &self,
        lease: &Lease,
        _channels: &[ChannelName],
    ) -> herald_storage::Result<u64> {
        // No streams here: a fenced write that renews nothing.
        if self.mem.lock().unwrap().token != lease.token.0 {
            return Err(herald_storage::Error::LeaseLost {
                name: lease.name.clone(),
                token: lease.token,
            });
        }
        Ok(0)
    }

    async fn soft_delete_stream(
        &self,
        _lease: &Lease,
        _channel: &ChannelName,
    ) -> herald_storage::Result<bool> {
        Err(not_modelled())
    }
}

#[async_trait]
impl herald_storage::PresenceStore for MemoryStorage {
    async fn presence_add(
        &self,
        session: &str,
        entry: &herald_storage::PresenceEntry,
        _ttl: Duration,
    ) -> herald_storage::Result<()> {
        let key = (entry.channel.as_str().to_owned(), entry.client.clone());
        self.mem
            .lock()
            .unwrap()
            .presence
            .insert(key, (session.to_owned(), entry.clone()));
        Ok(())
    }

    async fn presence_remove(
        &self,
        channel: &ChannelName,
        client: &str,
    ) -> herald_storage::Result<()> {
        let key = (channel.as_str().to_owned(), client.to_owned());
        self.mem.lock().unwrap().presence.remove(&key);
        Ok(())
    }

    async fn presence_touch(&self, _session: &str, _ttl: Duration) -> herald_storage::Result<()> {
        Ok(())
    }

    async fn presence(
        &self,
        channel: &ChannelName,
    ) -> herald_storage::Result<Vec<herald_storage::PresenceEntry>> {
        let mem = self.mem.lock().unwrap();
        Ok(mem
            .presence
            .values()
            .filter(|(_, e)| &e.channel == channel)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

#[async_trait]
impl herald_storage::ClusterView for MemoryStorage {
    async fn report_node(
        &self,
        report: &herald_storage::NodeReport,
        channels: &[herald_storage::ChannelClients],
        _ttl: Duration,
    ) -> herald_storage::Result<()> {
        let mut mem = self.mem.lock().unwrap();
        mem.nodes.insert(report.node_id.clone(), report.clone());
        mem.node_channels
            .insert(report.node_id.clone(), channels.to_vec());
        Ok(())
    }

    async fn lease_history(
        &self,
        _name: &str,
        limit: usize,
    ) -> herald_storage::Result<Vec<herald_storage::LeaseTakeover>> {
        let mem = self.mem.lock().unwrap();
        Ok(mem.history.iter().rev().take(limit).cloned().collect())
    }

    async fn node_reports(&self) -> herald_storage::Result<Vec<herald_storage::NodeReport>> {
        Ok(self.mem.lock().unwrap().nodes.values().cloned().collect())
    }

    async fn cluster_channels(
        &self,
        except_node: &str,
    ) -> herald_storage::Result<Vec<herald_storage::ChannelClients>> {
        let mem = self.mem.lock().unwrap();
        let mut sums: BTreeMap<ChannelName, (u64, u64)> = BTreeMap::new();
        for (node, channels) in &mem.node_channels {
            if node != except_node {
                for c in channels {
                    let sum = sums.entry(c.channel.clone()).or_insert((0, 0));
                    sum.0 += c.clients;
                    sum.1 += c.subscribers;
                }
            }
        }
        Ok(sums
            .into_iter()
            .map(
                |(channel, (clients, subscribers))| herald_storage::ChannelClients {
                    channel,
                    clients,
                    subscribers,
                },
            )
            .collect())
    }

    async fn send_cluster_event(&self, event: &ClusterEvent) -> herald_storage::Result<()> {
        event.check_size()?;
        self.sent_events.lock().unwrap().push(event.clone());
        Ok(())
    }

    fn watch_cluster_events(&self) -> Option<broadcast::Receiver<ClusterEvent>> {
        Some(self.cluster_events.subscribe())
    }
}

#[async_trait]
impl Storage for MemoryStorage {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn ping(&self) -> herald_storage::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            Err(unavailable())
        } else {
            Ok(())
        }
    }
}

/// A lease view whose state the test sets by hand. While `Holder`, the
/// lease is writable (the safety deadline is not checked).
pub struct FakeLease {
    tx: watch::Sender<LeaseState>,
    lost: Mutex<Vec<FencingToken>>,
}

impl FakeLease {
    /// A lease view that holds the lease with `token`.
    pub fn holder(token: FencingToken) -> Arc<Self> {
        let (tx, _) = watch::channel(Self::holder_state(token));
        Arc::new(Self {
            tx,
            lost: Mutex::new(Vec::new()),
        })
    }

    /// The holder state [`FakeLease::holder`] starts in, with `token`.
    pub fn holder_state(token: FencingToken) -> LeaseState {
        LeaseState::Holder {
            lease: Lease {
                name: herald_core::DEFAULT_LEASE_NAME.to_owned(),
                holder: "node-a".to_owned(),
                holder_url: "http://node-a".to_owned(),
                token,
            },
            safety_deadline: herald_lease::ClockInstant::MAX,
        }
    }

    /// Replaces the state.
    pub fn set(&self, state: LeaseState) {
        self.tx.send_replace(state);
    }

    /// Standby, with node-b holding the lease at `holder_url`.
    pub fn set_standby(&self, holder_url: Option<&str>) {
        self.set(LeaseState::Standby {
            holder: Some(LeaseInfo {
                name: herald_core::DEFAULT_LEASE_NAME.to_owned(),
                holder: Some("node-b".to_owned()),
                holder_url: holder_url.map(str::to_owned),
                token: FencingToken(7),
                expires_in_ms: 30_000,
                renewed_ms_ago: 0,
            }),
        });
    }

    /// The tokens reported lost so far.
    pub fn reported_lost(&self) -> Vec<FencingToken> {
        self.lost.lock().unwrap().clone()
    }
}

impl crate::role::LeaseView for FakeLease {
    fn writable_lease(&self) -> Option<Lease> {
        match &*self.tx.borrow() {
            LeaseState::Holder { lease, .. } => Some(lease.clone()),
            _ => None,
        }
    }
    fn state(&self) -> LeaseState {
        self.tx.borrow().clone()
    }
    fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.tx.subscribe()
    }
    fn report_lease_lost(&self, token: FencingToken) {
        self.lost.lock().unwrap().push(token);
    }
}
