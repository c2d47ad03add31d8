use std::time::Duration;

use async_trait::async_trait;
use herald_core::{
    Appended, Candidate, ChannelHead, ChannelName, FencingToken, Lease, LeaseInfo, Message,
    NewMessage, Offset, StreamAppend, StreamAppended, StreamCreate, StreamCreated, StreamInfo,
    WriteOutcome, WriteRequest,
};

use crate::cluster::ClusterEvent;
use crate::error::Result;
use crate::trim::{ChannelStats, TrimLimits, Trimmed};

/// Why an acquisition was possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeoverReason {
    /// The lease row did not exist yet.
    Fresh,
    /// The previous holder released the lease (drain).
    Released,
    /// The lease had expired on the storage's clock.
    Expired,
    /// The storage proved that the previous holder's process is gone (on
    /// SQLite: its session lock file is no longer locked; on PostgreSQL: its
    /// liveness session's advisory lock is free).
    HolderGone,
    /// The live lease was this storage's own, for the same node id: an
    /// earlier acquire that
    /// committed after its caller stopped waiting for the answer. Nobody
    /// holds that token, so it is acquired again with a new one.
    Reclaimed,
}

impl TakeoverReason {
    /// Every reason, in the order of [`TakeoverReason::as_str`]'s list.
    pub const ALL: [TakeoverReason; 5] = [
        Self::Fresh,
        Self::Released,
        Self::Expired,
        Self::HolderGone,
        Self::Reclaimed,
    ];

    /// The reason as written in logs and metric labels: `fresh`, `released`,
    /// `expired`, `holder_gone`, `reclaimed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::HolderGone => "holder_gone",
            Self::Reclaimed => "reclaimed",
        }
    }

    /// The reason that [`TakeoverReason::as_str`] writes as `text`.
    pub fn from_name(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// How many acquisitions of one lease the storage recorded for one
/// [`TakeoverReason`], over the database's whole life (every node, every
/// restart): the answer of [`LeaseStore::takeover_counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeoverCount {
    /// Why the lease could be acquired.
    pub reason: TakeoverReason,
    /// Acquisitions for this reason so far.
    pub takeovers: u64,
}

impl TakeoverCount {
    /// Orders `(reason, count)` rows as [`TakeoverReason::ALL`]; an unknown
    /// reason or a negative count is corrupt data.
    pub(crate) fn from_rows(rows: Vec<(String, i64)>) -> Result<Vec<TakeoverCount>> {
        let mut counts = Vec::with_capacity(rows.len());
        for (reason, takeovers) in rows {
            let reason = TakeoverReason::from_name(&reason).ok_or_else(|| {
                crate::error::Error::corrupt(format!("unknown takeover reason {reason:?}"))
            })?;
            let takeovers = u64::try_from(takeovers).map_err(|_| {
                crate::error::Error::corrupt(format!("negative takeover count {takeovers}"))
            })?;
            counts.push(TakeoverCount { reason, takeovers });
        }
        counts.sort_by_key(|c| TakeoverReason::ALL.iter().position(|r| *r == c.reason));
        Ok(counts)
    }
}

/// The outcome of [`LeaseStore::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// This candidate is now holder with a new, larger fencing token.
    Acquired {
        /// The proof to present in renewals and fenced writes.
        lease: Lease,
        /// Why the lease was free.
        reason: TakeoverReason,
    },
    /// Another holder is current; nothing changed.
    Held(LeaseInfo),
}

/// The lease operations, the part of [`Storage`] the lease supervisor needs.
///
/// All expiry times are computed on the storage's clock (`now + ttl`), never
/// on the node's.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Tries to become holder of `candidate.lease_name` for `ttl`.
    ///
    /// Succeeds when the lease row is absent, released, expired, or (where
    /// the backend can prove it) its holder's process is gone. Every success
    /// increments the fencing token, also for the node that held it before.
    /// The decision is taken after every lock it waits on is held.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached or a
    /// lock wait timed out; the caller retries on its acquire period.
    async fn acquire(&self, candidate: &Candidate, ttl: Duration) -> Result<Acquire>;

    /// Extends the lease to `now + ttl` on the storage's clock, if `lease`'s
    /// holder and token are current and it has not expired, judged after any
    /// lock wait. Never waits behind a fenced write.
    ///
    /// # Errors
    /// [`crate::error::Error::LeaseLost`] when zero rows matched (other token, other
    /// holder, or expired); [`crate::error::Error::Unavailable`] on timeouts.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<()>;

    /// Gives the lease up so that another node can acquire it at once.
    /// Does nothing when `lease` is no longer current.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// The lease as the storage sees it now; `None` if it was never acquired.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn lease_info(&self, name: &str) -> Result<Option<LeaseInfo>>;

    /// The acquisitions of lease `name` recorded so far, one entry per
    /// reason that occurred (in [`TakeoverReason::ALL`]'s order). Every
    /// successful [`LeaseStore::acquire`] records its reason in its own
    /// transaction, so the counts survive every restart of every node. A
    /// database migrated from before schema version 10 counts from then on.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn takeover_counts(&self, name: &str) -> Result<Vec<TakeoverCount>>;

    /// Resolves when a takeover of `held` (the lease as the last
    /// [`LeaseStore::acquire`] found it, held by another node) may have
    /// become possible: its holder's process ended or it released the
    /// lease. A standby waits on this between acquire attempts so that it
    /// tries again at once instead of on its next acquire period.
    ///
    /// A hint only: it may resolve when nothing changed, or never (the
    /// default, for backends that cannot tell); the caller still tries
    /// every acquire period, and only [`LeaseStore::acquire`] decides. It
    /// must be cancel-safe: the caller drops it when its period ends first.
    async fn takeover_hint(&self, held: &LeaseInfo) {
        let _ = held;
        std::future::pending::<()>().await;
    }
}

/// One page of a channel's history.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The channel's head offset when the page was read (0 if it has no
    /// messages).
    pub head: Offset,
    /// The channel's earliest offset in the same snapshot: its oldest
    /// stored message, `head + 1` when none is stored (1 for an unknown
    /// channel). Offsets below it were trimmed or deleted; a read with
    /// `after < earliest − 1` starts at `earliest`.
    pub earliest: Offset,
    /// Messages with offsets above the requested `after`, in offset order.
    pub messages: Vec<Message>,
    /// The number of the channel's latest deletion in the same snapshot
    /// ([`MessageLog::record_deletion`]), 0 when it was never deleted. A
    /// subscriber compares it with a deletion it hears of to tell whether
    /// that deletion came after it began.
    pub deletion: u64,
}

/// A position in the storage's global commit order, and the channels whose
/// head moved since the previous position (see [`ChangeFeedReader::changes_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeFeed {
    /// Pass this to the next [`ChangeFeedReader::changes_since`] call.
    pub cursor: u64,
    /// Channels whose head moved, with their new head.
    pub changed: Vec<ChannelHead>,
}

/// A channel's deletion as recorded by [`MessageLog::record_deletion`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The channel deleted.
    pub channel: ChannelName,
    /// Its head when it was deleted: every message up to it was removed;
    /// the head stays.
    pub head: Offset,
    /// The deletion's number: deletions are numbered from 1 across all
    /// channels, in commit order.
    pub number: u64,
}

/// The deletions recorded after a position, and the new position (see
/// [`ChangeFeedReader::deletions_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletions {
    /// Pass this to the next [`ChangeFeedReader::deletions_since`] call.
    pub cursor: u64,
    /// The latest deletion of each channel deleted after the position, in
    /// number order.
    pub deleted: Vec<Deletion>,
}

/// A push notice about committed writes, from [`ChangeFeedReader::watch_changes`].
///
/// Notices are hints for nodes that follow another node's writes: they say
/// that something changed and where, so that a follower reads sooner than
/// its next poll. They never replace reading: a notice can be missed (the
/// listening connection dropped, or the receiver lagged behind), and then
/// [`ChangeFeedReader::changes_since`] is the way to catch up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeSignal {
    /// A fenced write committed messages `from..=to` of `channel`;
    /// `committed_at_ms` is the database clock at commit (ms since the Unix
    /// epoch).
    Committed {
        /// The channel written.
        channel: ChannelName,
        /// Offset of the first new message of `channel` in that write.
        from: Offset,
        /// Offset of the last new message of `channel` in that write
        /// (`to >= from`).
        to: Offset,
        /// The database clock read just before the commit (at or after
        /// the messages' `published_at_ms`), in ms since the Unix epoch.
        committed_at_ms: i64,
    },
    /// A deletion was recorded ([`MessageLog::record_deletion`]) and
    /// committed.
    Deleted(Deletion),
    /// The listening connection (re)connected: notices may have been
    /// missed; catch up with [`ChangeFeedReader::changes_since`] and
    /// [`ChangeFeedReader::deletions_since`].
    Resync,
}

/// One client subscribed to a channel, as presence shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PresenceEntry {
    /// The channel.
    pub channel: ChannelName,
    /// The client's connection id.
    pub client: String,
    /// The client's user (the token's `sub`; empty when anonymous).
    pub user: String,
}

/// Who joined or left a channel, as Centrifugo's `ClientInfo` carries it
/// in join and leave pushes (`client.proto` of centrifugal/protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// The client's user (the token's `sub`; empty when anonymous).
    pub user: String,
    /// The client's connection id.
    pub client: String,
    /// The connection token's `info` claim, as JSON text; the storage
    /// keeps it as opaque text.
    pub conn_info: Option<String>,
    /// The subscription token's `info` claim, as JSON text; opaque too.
    pub chan_info: Option<String>,
}

/// Whether a [`PresenceEvent`] is a join or a leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceEventKind {
    /// The client subscribed to the channel.
    Join,
    /// The client unsubscribed from the channel, or disconnected.
    Leave,
}

/// A client joined or left a channel: what one node tells the others
/// through [`PresenceStore::send_presence_events`], so that their subscribers
/// get Centrifugo's join and leave pushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceEvent {
    /// Join or leave.
    pub kind: PresenceEventKind,
    /// The channel.
    pub channel: ChannelName,
    /// Who.
    pub info: ClientInfo,
}

/// One node as it last reported itself ([`ClusterView::report_node`]), for
/// Centrifugo's server API `info`: its counts of Centrifugo connections
/// at the time of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's id (`--node-id`), which keys its report.
    pub node_id: String,
    /// Its Herald version.
    pub version: String,
    /// Seconds it had been running.
    pub uptime_s: u64,
    /// Connections.
    pub clients: u64,
    /// Distinct users among them.
    pub users: u64,
    /// Subscriptions.
    pub subs: u64,
    /// Distinct channels subscribed to.
    pub channels: u64,
    /// Its advertised URL (`--advertise-url`); empty in a report written
    /// before schema version 12.
    pub url: String,
    /// Its live subscriptions over every protocol (Herald's SSE and
    /// WebSocket, Centrifugo's, Durable Streams' live reads).
    pub subscriptions: u64,
    /// How long ago the report was written, in ms on the storage's clock
    /// (0 when writing one).
    pub reported_ms_ago: u64,
    /// When the report was written, in ms since the Unix epoch on the
    /// storage's clock, the clock of [`LeaseTakeover::at_ms`] (ignored
    /// when writing one: the storage stamps it).
    pub reported_at_ms: i64,
}

/// A channel's count of subscribed Centrifugo connections, for the server
/// API's `channels`: one node's in a report ([`ClusterView::report_node`]), or
/// the sum over nodes ([`ClusterView::cluster_channels`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelClients {
    /// The channel.
    pub channel: ChannelName,
    /// Connections subscribed to it (Centrifugo's `num_clients`).
    pub clients: u64,
    /// Live subscriptions to it over every protocol (Herald's SSE and
    /// WebSocket, Centrifugo's, Durable Streams' live reads).
    pub subscribers: u64,
}

/// One acquisition of a lease, as its takeover timeline keeps it
/// ([`ClusterView::lease_history`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTakeover {
    /// The fencing token the acquisition gave.
    pub token: FencingToken,
    /// The node that acquired the lease.
    pub holder: String,
    /// The node the lease row named before; after a release
    /// ([`TakeoverReason::Released`]), the node that released it (`None`
    /// for a release recorded before schema version 14). `None` for the
    /// first acquisition.
    pub previous_holder: Option<String>,
    /// Why the lease could be acquired.
    pub reason: TakeoverReason,
    /// When, on the storage's clock, in ms since the Unix epoch.
    pub at_ms: i64,
}

/// One channel of a page of [`MessageLog::channel_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSummary {
    /// The channel's name.
    pub name: ChannelName,
    /// Its head offset (0 when it has no messages).
    pub head: Offset,
    /// Its oldest stored offset (`head + 1` when none is stored).
    pub earliest: Offset,
    /// Messages stored.
    pub messages: u64,
    /// Bytes of payload stored.
    pub bytes: u64,
    /// When its head message was published, in ms since the Unix epoch on
    /// the storage's clock; `None` when the head message is not stored
    /// (trimmed, deleted, or no message yet).
    pub last_published_at_ms: Option<i64>,
    /// The content type of a Durable Streams stream; `None` for a plain
    /// channel.
    pub content_type: Option<String>,
    /// Live subscriptions to it over every protocol, summed over the
    /// unexpired node reports ([`ClusterView::report_node`]).
    pub subscribers: u64,
}

/// Most channels one [`MessageLog::channel_page`] call returns.
pub const MAX_CHANNEL_PAGE: usize = 500;

/// Most takeovers one [`ClusterView::lease_history`] call returns.
pub const MAX_LEASE_HISTORY: usize = 1000;

/// The message log, the part of [`Storage`] that appends, reads and trims
/// channels' messages (and records their deletions): what the writer, the
/// subscriptions and retention use.
#[async_trait]
pub trait MessageLog: Send + Sync + 'static {
    /// Writes `batch` in one fenced transaction (group commit): messages
    /// ([`WriteRequest::Message`]) and stream appends
    /// ([`WriteRequest::Stream`]), one outcome per entry, in input order,
    /// returned only after the commit is durable.
    ///
    /// Inside the transaction the storage checks that `lease`'s token and
    /// holder are current and that the lease has not expired, then writes
    /// every entry. Each stored message records the token that wrote it,
    /// and every message of the batch has the batch's commit time.
    ///
    /// A message gets the next offset of its channel. A message whose
    /// idempotency key is already used on its channel (earlier, or in
    /// the same batch) adds nothing and reports the original offset with
    /// `duplicate: true`, provided it is the same message: a keyed
    /// message is stored with its [`crate::digest::idempotency_digest`], and one
    /// whose digest differs from the digest stored with its key (a key
    /// reused for another message) fails the whole batch with
    /// [`crate::error::Error::IdempotencyKeyReused`]. A key stored without a
    /// digest (schema version 1) matches any message.
    ///
    /// A stream append is decided against its stream's row and its
    /// producer's state as the earlier entries of the batch left them
    /// (existence, closure, content type, producer epoch and sequence,
    /// `Stream-Seq`, the bound on producers; see [`StreamAppended`]); when
    /// allowed, its messages get contiguous offsets, its producer's state
    /// and `Stream-Seq` are stored, the stream is closed if it asks, and
    /// its TTL restarts, so that a producer's retry after any failure, on
    /// any node, is answered as a duplicate exactly when its append
    /// committed. Any other answer is the entry's outcome: it writes
    /// nothing, and the rest of the batch commits. A backend may give a
    /// batch's stream appends their offsets before its messages'.
    ///
    /// # Errors
    /// [`crate::error::Error::IdempotencyKeyReused`] naming the first entry
    /// that reuses a key for another message (nothing was committed; the
    /// caller may write the batch again without it);
    /// [`crate::error::Error::ChannelRefuses`] naming the first message entry
    /// whose channel is a closed stream, an expired one or a stream of
    /// another kind of payload (JSON or bytes), the same way;
    /// [`crate::error::Error::LeaseLost`] when the fencing check fails;
    /// [`crate::error::Error::Unavailable`] on timeouts. After `LeaseLost` nothing of
    /// the batch was committed. After `Unavailable` the outcome is unknown
    /// when the connection broke while the commit was in flight (the batch
    /// may be stored; a retry with the same idempotency keys or producer
    /// sequence numbers finds it); otherwise nothing was committed.
    async fn write(&self, lease: &Lease, batch: &[WriteRequest]) -> Result<Vec<WriteOutcome>>;

    /// Appends the messages `batch` in one fenced transaction: a
    /// [`MessageLog::write`] of [`WriteRequest::Message`] entries, answered
    /// one [`Appended`] per message, in input order.
    ///
    /// # Errors
    /// As [`MessageLog::write`].
    async fn append(&self, lease: &Lease, batch: &[NewMessage]) -> Result<Vec<Appended>> {
        let entries: Vec<WriteRequest> = batch.iter().cloned().map(WriteRequest::Message).collect();
        self.write(lease, &entries)
            .await?
            .into_iter()
            .map(|outcome| match outcome {
                WriteOutcome::Message(appended) => Ok(appended),
                WriteOutcome::Stream(_) => Err(crate::error::Error::corrupt(
                    "a message was answered as a stream append",
                )),
            })
            .collect()
    }

    /// Appends to a stream, closes it, or both, in one fenced transaction:
    /// a [`MessageLog::write`] of the one entry [`WriteRequest::Stream`].
    ///
    /// # Errors
    /// As [`MessageLog::write`]: [`crate::error::Error::LeaseLost`] when the fencing
    /// check fails (nothing written); [`crate::error::Error::Unavailable`] on
    /// timeouts (the outcome is unknown if the connection broke during the
    /// commit: a producer's retry finds out).
    async fn append_stream(&self, lease: &Lease, append: &StreamAppend) -> Result<StreamAppended> {
        let entries = [WriteRequest::Stream(append.clone())];
        match self.write(lease, &entries).await?.pop() {
            Some(WriteOutcome::Stream(appended)) => Ok(appended),
            _ => Err(crate::error::Error::corrupt(
                "a stream append was answered as a message",
            )),
        }
    }

    /// Up to `limit` messages of `channel` with offset > `after`, in offset
    /// order, with the channel's head. An unknown channel has head 0 and no
    /// messages. An expired stream (see [`StreamStore::stream_info`]) reads as
    /// a deleted channel does, before the sweep deletes it
    /// ([`StreamStore::expired_streams`]): no message, earliest `head + 1`.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn read(&self, channel: &ChannelName, after: Offset, limit: usize) -> Result<Page>;

    /// The epoch of `channel`: a short text (16 lowercase hex digits)
    /// that names the channel's one unbroken history. It is a pure read:
    /// asking writes nothing, for a channel with or without messages. A
    /// channel whose epoch was stored by schema version 8 or earlier (a
    /// `channel_epochs` row) keeps that one; any other channel's is
    /// derived from its name and the database's seed (64 bits of a
    /// SHA-256; the seed is 128 random bits drawn once by the database's
    /// migration). Either way it never changes: every node, before and
    /// after the channel's first message, a takeover or a restart,
    /// answers the same epoch. A fresh database gives a channel a new one,
    /// so a client's offset from another history is recognised as such
    /// (Centrifugo's `epoch`, see `docs/centrifugo.md`).
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn channel_epoch(&self, channel: &ChannelName) -> Result<String>;

    /// Up to `limit` channels (capped at [`MAX_CHANNEL_PAGE`]) whose name
    /// contains `search` (any, when empty) and sorts after `after` in byte
    /// order (from the first, when `None`), ordered by name, with their
    /// sizes, last publish time and subscribers across the cluster; one
    /// index range per page, so a page costs the same with 100,000
    /// channels as with ten when the search matches often.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn channel_page(
        &self,
        search: &str,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<ChannelSummary>>;

    /// Every channel with its head, ordered by name.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn channels(&self) -> Result<Vec<ChannelHead>>;

    /// Every channel with its head, earliest offset, message count and
    /// bytes stored, ordered by name (one snapshot; no message is read).
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn channel_stats(&self) -> Result<Vec<ChannelStats>>;

    /// Removes the oldest messages of `channel` beyond `limits`, with
    /// their idempotency keys, in one fenced transaction of at most
    /// `max_rows` messages (call again while [`Trimmed::done`] is false).
    ///
    /// The transaction makes the same fencing check as
    /// [`MessageLog::append`], after its lock waits, so a node that lost the
    /// lease removes nothing. It holds the channel's row lock, so it runs
    /// either before or after any append to the same channel: the stored
    /// offsets stay contiguous from `earliest` to `head`. The head never
    /// moves (offsets are never reused). Only a prefix is removed: a
    /// message is removed only with every older one. An unknown channel
    /// trims nothing (earliest 1, head 0).
    ///
    /// # Errors
    /// [`crate::error::Error::LeaseLost`] when the fencing check fails (nothing
    /// removed); [`crate::error::Error::Unavailable`] on timeouts.
    async fn trim(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        limits: &TrimLimits,
        max_rows: usize,
    ) -> Result<Trimmed>;

    /// Records that `channel` was deleted: its messages up to `head` were
    /// removed (by [`MessageLog::trim`] with [`TrimLimits::up_to`]), and the
    /// subscriptions that began before now must end. Gives the deletion the
    /// next number (from 1, across all channels, in commit order) and
    /// returns it; a channel deleted again keeps only its latest deletion.
    /// Stored durably, so that a node that was not listening learns of it
    /// from [`ChangeFeedReader::deletions_since`] and [`Page::deletion`]; on
    /// PostgreSQL the same transaction also sends
    /// [`ChangeSignal::Deleted`], delivered only if it commits.
    ///
    /// A deleted stream is a stream no more: its content type, closure,
    /// expiry, `Stream-Seq` and producers are cleared in the same
    /// transaction.
    ///
    /// A fenced write: it makes the same fencing check as
    /// [`MessageLog::append`], after its lock waits. A channel that has no
    /// messages and never had any can be deleted too.
    ///
    /// # Errors
    /// [`crate::error::Error::LeaseLost`] when the fencing check fails (nothing
    /// recorded); [`crate::error::Error::Unavailable`] on timeouts.
    async fn record_deletion(
        &self,
        lease: &Lease,
        channel: &ChannelName,
        head: Offset,
    ) -> Result<u64>;
}

/// The change feed, the part of [`Storage`] a node follows other nodes'
/// writes with: moved heads and recorded deletions after a cursor, and
/// push notices of commits.
#[async_trait]
pub trait ChangeFeedReader: Send + Sync + 'static {
    /// The latest deletion of every channel deleted after deletion number
    /// `cursor` (0 = every one), and the new position.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn deletions_since(&self, cursor: u64) -> Result<Deletions>;

    /// The number of the latest deletion recorded (0 when none), for a
    /// node that starts following deletions now.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn deletion_cursor(&self) -> Result<u64>;

    /// The channels whose head moved after position `cursor` of the global
    /// commit order (0 = from the beginning), and the new position. A node
    /// that does not write itself polls this to feed live subscriptions.
    /// A backend may stop early on a long stretch (PostgreSQL: after
    /// 1 000 000 messages): the answer then covers the commits up to the
    /// position it returns, and the next call carries on from there.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn changes_since(&self, cursor: u64) -> Result<ChangeFeed>;

    /// The current end of the global commit order, for a node that starts
    /// following changes now.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn change_cursor(&self) -> Result<u64>;

    /// Push notices of commits, for nodes that follow other nodes' writes;
    /// `None` when the backend has none (poll [`ChangeFeedReader::changes_since`]
    /// instead).
    ///
    /// Each call returns a new receiver that gets every notice sent after
    /// the call. A receiver that falls behind by more than the channel's
    /// capacity gets [`tokio::sync::broadcast::error::RecvError::Lagged`]
    /// and must catch up with [`ChangeFeedReader::changes_since`], as after
    /// [`ChangeSignal::Resync`]. The PostgreSQL backend delivers notices of
    /// writes committed by any node (its own included); SQLite has none.
    fn watch_changes(&self) -> Option<tokio::sync::broadcast::Receiver<ChangeSignal>> {
        None
    }
}

/// Stream properties, the part of [`Storage`] the Durable Streams wing
/// uses: a stream's row (content type, closure, TTL, expiry, producers,
/// forks) and its fenced writes.
#[async_trait]
pub trait StreamStore: Send + Sync + 'static {
    /// The live stream `channel` (a channel created by
    /// [`StreamStore::create_stream`], not deleted since and not expired on the
    /// storage's clock), with its head and earliest offset in one snapshot;
    /// `None` otherwise.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn stream_info(&self, channel: &ChannelName) -> Result<Option<StreamInfo>>;

    /// Up to `limit` streams that have expired on the storage's clock
    /// (`Stream-TTL` or `Stream-Expires-At` passed) and are not deleted
    /// yet, soft-deleted ones too, by name in byte order: what the
    /// holder's sweep deletes (`herald_node::retention`). Until then an
    /// expired stream already reads as deleted ([`MessageLog::read`]).
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn expired_streams(&self, limit: usize) -> Result<Vec<ChannelName>>;

    /// Makes `create.channel` a stream with `create.config`, closed if
    /// asked, and appends `create.messages`, in one fenced transaction
    /// (the fencing check of [`MessageLog::append`]). A channel that exists
    /// without being a stream becomes one if its stored messages fit the
    /// content type (JSON ones for `application/json`, or none stored)
    /// and, when it stores any, `create.may_convert` allows it (otherwise
    /// [`StreamCreated::ChannelHasMessages`], decided inside the
    /// transaction); offsets go on from its head. A live stream, or a
    /// channel whose stored messages do not fit, is left alone and
    /// answered [`StreamCreated::Exists`]; an expired stream is answered
    /// [`StreamCreated::Expired`] (delete it, then create again). A fork
    /// that breaks its [`herald_core::ForkLimits`] is answered
    /// [`StreamCreated::TooManyForks`] or [`StreamCreated::ForkTooLarge`]
    /// before anything is copied. Every answer but `Created` wrote
    /// nothing.
    ///
    /// # Errors
    /// [`crate::error::Error::LeaseLost`] when the fencing check fails (nothing
    /// written); [`crate::error::Error::Unavailable`] on timeouts.
    async fn create_stream(&self, lease: &Lease, create: &StreamCreate) -> Result<StreamCreated>;

    /// Restarts the TTL (`Stream-TTL`) of each live stream of `channels`
    /// that has one, as a read of it does (Durable Streams `PROTOCOL.md`:
    /// a stream expires after its TTL without access, reads included), in
    /// one fenced transaction (the fencing check of [`MessageLog::append`],
    /// after its lock waits). Its TTL then runs from this transaction's
    /// time on the storage's clock; its `Stream-Expires-At` stays. A
    /// stream already expired on the storage's clock (TTL or expiry
    /// passed) is left expired: a renewal never revives it. Soft-deleted
    /// streams, streams without a TTL, plain and unknown channels are left
    /// alone. Returns how many streams were renewed (a name given twice
    /// counts once). Writes no message, moves no head, sends no change
    /// notice.
    ///
    /// # Errors
    /// [`crate::error::Error::LeaseLost`] when the fencing check fails (nothing
    /// written); [`crate::error::Error::Unavailable`] on timeouts.
    async fn renew_streams(&self, lease: &Lease, channels: &[ChannelName]) -> Result<u64>;

    /// Marks the stream `channel` as being deleted
    /// (`StreamInfo::soft_deleted`): an append is refused ("gone"), and so
    /// is a fork of it, while its messages are removed before
    /// [`MessageLog::record_deletion`]. A fenced write; returns whether a
    /// stream was marked.
    ///
    /// # Errors
    /// [`crate::error::Error::LeaseLost`] when the fencing check fails;
    /// [`crate::error::Error::Unavailable`] on timeouts.
    async fn soft_delete_stream(&self, lease: &Lease, channel: &ChannelName) -> Result<bool>;
}

/// Presence, the part of [`Storage`] Centrifugo's presence and join/leave
/// pushes use: who is subscribed where, shared by every node.
#[async_trait]
pub trait PresenceStore: Send + Sync + 'static {
    /// Records `entry` (replacing an entry of the same channel and client)
    /// for node process `session`, expiring `ttl` from now on the storage's
    /// clock unless renewed by [`PresenceStore::presence_touch`]. Deletes expired
    /// entries of the channel on the way. Not a fenced write: any node
    /// records its own clients.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn presence_add(&self, session: &str, entry: &PresenceEntry, ttl: Duration)
        -> Result<()>;

    /// Removes the entry of `client` in `channel`, if any.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn presence_remove(&self, channel: &ChannelName, client: &str) -> Result<()>;

    /// Renews every entry of node process `session` to expire `ttl` from
    /// now (the node's heartbeat).
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn presence_touch(&self, session: &str, ttl: Duration) -> Result<()>;

    /// The unexpired entries of `channel`, from every node, ordered by
    /// client.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn presence(&self, channel: &ChannelName) -> Result<Vec<PresenceEntry>>;

    /// Tells the other nodes of the same database (their storages'
    /// [`PresenceStore::watch_presence_events`] receivers) about `events`, in
    /// order.
    ///
    /// Delivery is at most once: an event is lost when a receiving node's
    /// listening connection is down or its receiver lags, and a failed
    /// call sends nothing or only a prefix. Events that one storage sends
    /// in successive calls (each awaited before the next) arrive in that
    /// order. A backend whose transport limits an event's size drops the
    /// event's `conn_info` and `chan_info` when they do not fit, and the
    /// event itself (logged) when it does not fit without them: on
    /// PostgreSQL a `NOTIFY` payload must be shorter than 8000 bytes
    /// (PostgreSQL documentation, `NOTIFY`). A backend with no way to
    /// other processes (SQLite, the default) sends nothing and returns
    /// `Ok`.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn send_presence_events(&self, events: &[PresenceEvent]) -> Result<()> {
        let _ = events;
        Ok(())
    }

    /// The events that other storages of the same database send with
    /// [`PresenceStore::send_presence_events`] from now on (never this
    /// storage's own: its node delivers those itself); `None` when the
    /// backend has no way between processes (SQLite, the default).
    ///
    /// Each call returns a new receiver. A receiver that falls behind by
    /// more than the channel's capacity gets
    /// [`tokio::sync::broadcast::error::RecvError::Lagged`]: those events
    /// are lost.
    fn watch_presence_events(&self) -> Option<tokio::sync::broadcast::Receiver<PresenceEvent>> {
        None
    }
}

/// The cluster view, the part of [`Storage`] Centrifugo's server API and
/// the web console use: node reports, the channels summed over nodes, the
/// lease's takeover timeline and cluster events between nodes.
#[async_trait]
pub trait ClusterView: Send + Sync + 'static {
    /// Records `report` and the node's subscribed `channels` (each channel
    /// at most once, counts above 0) in one transaction, replacing the
    /// report and the channels of the same node id, expiring `ttl` from
    /// now on the storage's clock unless reported again; a node's channels
    /// live exactly as long as its report. Deletes expired reports and
    /// their channels on the way. Not a fenced write: every node reports
    /// itself.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached;
    /// then nothing of the report was recorded.
    async fn report_node(
        &self,
        report: &NodeReport,
        channels: &[ChannelClients],
        ttl: Duration,
    ) -> Result<()>;

    /// The unexpired reports of every node, ordered by node id.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn node_reports(&self) -> Result<Vec<NodeReport>>;

    /// Every channel in the unexpired reports of the nodes other than
    /// `except_node`, with its clients summed over those nodes, ordered
    /// by channel name (Centrifugo's server API `channels`; the asking
    /// node adds its own counts of now).
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn cluster_channels(&self, except_node: &str) -> Result<Vec<ChannelClients>>;

    /// The latest acquisitions of lease `name`, newest first, at most
    /// `limit` (capped at [`MAX_LEASE_HISTORY`]). Every successful
    /// [`LeaseStore::acquire`] records one in its own transaction (schema
    /// version 12 on), so the timeline survives restarts and is the same
    /// on every node.
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when the storage cannot be reached.
    async fn lease_history(&self, name: &str, limit: usize) -> Result<Vec<LeaseTakeover>>;

    /// Sends `event` to every other node that shares this storage and
    /// listens now ([`ClusterView::watch_cluster_events`]); best effort (see
    /// [`crate::cluster`]). Does nothing on a backend without such a path
    /// (SQLite).
    ///
    /// # Errors
    /// [`crate::error::Error::ClusterEventTooLarge`] when the event does not fit
    /// in one notification (nothing sent); [`crate::error::Error::Unavailable`]
    /// when the storage cannot be reached.
    async fn send_cluster_event(&self, event: &ClusterEvent) -> Result<()>;

    /// The cluster events other nodes send ([`ClusterView::send_cluster_event`];
    /// never this storage's own); `None` when the backend has none
    /// (SQLite).
    ///
    /// Each call returns a new receiver that gets every event heard after
    /// the call. Events heard while the listening connection was down are
    /// lost, and a receiver that falls behind by more than the channel's
    /// capacity loses the oldest
    /// ([`tokio::sync::broadcast::error::RecvError::Lagged`]).
    fn watch_cluster_events(&self) -> Option<tokio::sync::broadcast::Receiver<ClusterEvent>> {
        None
    }
}

/// Herald's storage: lease, fenced writes and reads. One implementation per
/// backend; every implementation passes the `conformance` suite.
///
/// The union of its role traits ([`LeaseStore`], [`MessageLog`],
/// [`ChangeFeedReader`], [`StreamStore`], [`PresenceStore`],
/// [`ClusterView`]), each of one part's methods, plus what concerns the
/// whole: its name and its liveness. A caller that calls a role's method
/// brings that role trait into scope (`use herald_storage::MessageLog`).
#[async_trait]
pub trait Storage:
    LeaseStore + MessageLog + ChangeFeedReader + StreamStore + PresenceStore + ClusterView
{
    /// The backend's name as shown in `/v1/status`: `"sqlite"` or `"postgres"`.
    fn backend(&self) -> &'static str;

    /// Checks that the storage answers (for `/readyz`).
    ///
    /// # Errors
    /// [`crate::error::Error::Unavailable`] when it does not.
    async fn ping(&self) -> Result<()>;
}
