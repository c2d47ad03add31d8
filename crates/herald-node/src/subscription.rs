//! One subscriber's ordered message sequence: history from the storage,
//! then live notices from the hub, without a gap or a repeat however many
//! messages arrive during the switch. Shared by Herald's SSE and
//! WebSocket, Centrifugo's subscriptions and Durable Streams' live reads.
//!
//! The algorithm:
//! 1. subscribe to the hub **first**, so that nothing committed from now on
//!    can be missed;
//! 2. read the history after `last` in pages until a short page;
//! 3. for each notice: drop the messages at or below `last`; if the first
//!    remaining one is beyond `last + 1`, or the notice carries no messages
//!    and its head is beyond `last`, or the receiver lagged, read from the
//!    storage after `last` first; then take the notice's messages that
//!    continue at `last + 1`.
//!
//! `last` is the offset of the newest message handed out (or queued to be),
//! so every message is delivered once, in offset order.
//!
//! Retention: every storage read returns the channel's earliest offset.
//! When it is beyond `last + 1` (the resume point is older than what is
//! kept, or trimming passed a subscriber still reading from the storage),
//! one [`Item::Truncated`] is queued and `last` moves to `earliest − 1`:
//! the gap is announced, never skipped silently. A notice that the
//! channel was deleted queues [`Item::Deleted`], the last item, when the
//! deletion is newer than the one the subscription's first storage read
//! showed (`Page::deletion`): a subscription that began after a deletion
//! is not ended by a late or repeated notice of it.
//!
//! History rights: a subscriber whose namespace does not let it read the
//! channel's history (`history = false`, see `docs/security.md`) starts
//! as a [`StartAt::LiveOnly`] subscription. Without a resume point it
//! starts at the head that its first storage read shows (nothing stored
//! is handed out). With a resume point below the head, the stored
//! messages after it are handed out only when the oldest of them was
//! published less than the history resume window ago (by the node's wall
//! clock against the message's `published_at`, the database's clock): a
//! client that reconnects after a short break loses nothing, a late
//! joiner reads at most that window's messages. Otherwise one
//! [`Item::Withheld`] is queued and the subscription goes on at the head.
//!
//! Closure (Durable Streams): a subscription that ends at the channel's
//! closure ([`Subscription::end_at_closure`]) queues [`Item::Closed`], the
//! last item, once it handed out every message up to the head the channel
//! was closed at. It learns that head from the stream's properties read by
//! its caller (at the start, and from time to time:
//! [`Subscription::closed_at`]) or from a notice that says so
//! (`Notice::closed`). Other subscriptions ignore closure: a closed
//! channel merely gets no more messages.
//!
//! A storage read that fails with a transient error (the storage's
//! `Unavailable`: the database is down, restarting, locked or slow) does not
//! end the subscription: the read is tried again after a pause that grows
//! from `RETRY_FIRST` to at most `RETRY_MAX`, as often as needed, and
//! the subscription waits meanwhile (its transport keeps the connection
//! open with heartbeats). Since nothing is queued until a read succeeds and
//! `last` only moves with what is queued, the wait loses and repeats
//! nothing. Any other storage error (corrupt data, an unexpected SQL error)
//! ends the subscription with [`NodeError::Storage`], which the caller logs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use herald_core::{ChannelName, Message, Offset};
use herald_storage::{Page, Storage};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::hub::{Hub, HubReceiver, Notice};
use crate::metrics::{self, SubscriberGauge};
use crate::node_error::StorageFailure;
use crate::node_error::{NodeError, NodeResult};

/// What a subscription hands out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// The next message (offset `last + 1`).
    Message(Message),
    /// Messages after `requested_after` and below `earliest` were trimmed
    /// (retention) or deleted before this subscriber got them: it goes on
    /// at `earliest`. Sent once per gap, never a silent skip.
    Truncated {
        /// The offset the subscriber had reached (its resume point, or its
        /// last message).
        requested_after: Offset,
        /// The channel's earliest stored offset, read from the storage.
        earliest: Offset,
    },
    /// The subscriber may not read the channel's history and its resume
    /// point is older than the history resume window (see the module
    /// docs): the stored messages after `requested_after` are withheld and
    /// the subscription goes on after `head`. Sent once, first.
    Withheld {
        /// The subscriber's resume point.
        requested_after: Offset,
        /// The channel's head when the subscription started: the next
        /// message handed out is `head + 1`.
        head: Offset,
    },
    /// The channel was deleted; `head` is kept (the next message gets
    /// `head + 1`). The last item: the subscription ends after it.
    Deleted {
        /// The channel's head at deletion.
        head: Offset,
    },
    /// The channel was closed (a Durable Streams stream) at `head`, and
    /// every message up to it was handed out. The last item; only a
    /// subscription that ends at closure
    /// ([`Subscription::end_at_closure`]) hands it out.
    Closed {
        /// The channel's head, its last message's offset.
        head: Offset,
    },
}

impl Item {
    /// The JSON body of a `truncated`, `history_withheld`, `deleted` or
    /// `closed` item, as SSE sends it in `data:`
    /// (`{"requested_after":N,"earliest":M}`,
    /// `{"requested_after":N,"head":H}`, `{"head":N}`, `{"head":N}`)
    /// and WebSocket in a text frame with `"type"` added; `None` for a
    /// message.
    pub fn control_json(&self, with_type: bool) -> Option<String> {
        let value = match *self {
            Item::Message(_) => return None,
            Item::Truncated {
                requested_after,
                earliest,
            } => {
                if with_type {
                    serde_json::json!({"type": "truncated", "requested_after": requested_after, "earliest": earliest})
                } else {
                    serde_json::json!({"requested_after": requested_after, "earliest": earliest})
                }
            }
            Item::Withheld {
                requested_after,
                head,
            } => {
                if with_type {
                    serde_json::json!({"type": "history_withheld", "requested_after": requested_after, "head": head})
                } else {
                    serde_json::json!({"requested_after": requested_after, "head": head})
                }
            }
            Item::Deleted { head } => {
                if with_type {
                    serde_json::json!({"type": "deleted", "head": head})
                } else {
                    serde_json::json!({"head": head})
                }
            }
            Item::Closed { head } => {
                if with_type {
                    serde_json::json!({"type": "closed", "head": head})
                } else {
                    serde_json::json!({"head": head})
                }
            }
        };
        Some(value.to_string())
    }
}

/// Where a subscription starts (see the module docs).
#[derive(Debug, Clone, Copy)]
pub enum StartAt {
    /// After this offset: every stored message after it, for a subscriber
    /// that may read the channel's history.
    After(Offset),
    /// For a subscriber that may not read the channel's history.
    LiveOnly(LiveOnly),
}

impl StartAt {
    /// The start of a subscriber that gave `resume` (`Last-Event-ID`,
    /// `?after=`; `None` when it gave none): with `live_only` (the history
    /// resume window of a subscriber that may not read history, from
    /// [`herald_auth::Auth::live_only_window`]) a [`StartAt::LiveOnly`] on
    /// the node's wall clock, else after `resume` (0: the whole history).
    pub fn new(resume: Option<Offset>, live_only: Option<Duration>) -> Self {
        match live_only {
            None => Self::After(resume.unwrap_or(0)),
            Some(window) => Self::LiveOnly(LiveOnly {
                resume,
                window,
                now_ms: wall_clock_ms,
            }),
        }
    }
}

/// The start of a subscriber that may not read the channel's history.
#[derive(Debug, Clone, Copy)]
pub struct LiveOnly {
    /// The client's resume point, if it gave one.
    pub resume: Option<Offset>,
    /// The history resume window: the stored messages after `resume` are
    /// handed out only if the oldest was published less than this long
    /// ago.
    pub window: Duration,
    /// The wall clock, in ms since the Unix epoch ([`wall_clock_ms`]; a
    /// fixed one in tests).
    pub now_ms: fn() -> i64,
}

impl LiveOnly {
    /// Whether a message published at `published_at_ms` (ms since the
    /// Unix epoch, the database's clock) is inside the window at the
    /// wall clock's now: less than `window` old. A window of zero admits
    /// nothing.
    pub fn admits(&self, published_at_ms: i64) -> bool {
        let window_ms = i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX);
        (self.now_ms)().saturating_sub(published_at_ms) < window_ms
    }
}

/// The node's wall clock, in ms since the Unix epoch (0 before it).
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Messages read from the storage per request, unless the subscription
/// was started with fewer ([`Subscription::start_paged`]).
pub(crate) const PAGE_LIMIT: usize = 1000;

/// Pause after the first transient failure of a subscription's read,
/// before the read is tried again; each further failure doubles it, up to
/// [`RETRY_MAX`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(50);

/// Longest pause between two tries of a failing read: once the storage is
/// back, a waiting subscription delivers again within this long.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// Whether a storage error may go away by itself, so that a subscription
/// waits and reads again rather than ending: the storage's
/// [`herald_storage::Error::Unavailable`], which it documents as "the
/// operation may be retried" (unreachable, timed out, locked, restarting).
fn is_transient(error: &herald_storage::Error) -> bool {
    matches!(error, herald_storage::Error::Unavailable { .. })
}

/// The state of a read that is failing transiently.
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// When the read is tried again.
    at: Instant,
    /// The pause before the try at `at`; the next one doubles it.
    pause: Duration,
    /// Failed tries so far.
    failures: u32,
    /// When the first of them failed.
    since: Instant,
}

/// Where a subscription is in the algorithm of the module docs. `History`,
/// `Lagged` and a catching-up `Applying` read from the storage, one page
/// per step of [`Subscription::next`], waiting out transient failures
/// meanwhile (`Subscription::retry`). The transitions, each taken once the
/// await of its step completed:
/// - `History` → `Live` at a short page (also in [`Subscription::start`]);
/// - `Live` → `Applying` with the next notice, → `Lagged` when the hub
///   receiver lagged;
/// - `Applying` → `Live` once the notice is applied, or when the storage
///   turns out to be behind it;
/// - `Lagged` → `Live` at a short page.
#[derive(Debug, Clone)]
enum Phase {
    /// Reading the history after `last`, page by page, until a short page.
    History,
    /// Waiting for the next notice from the hub.
    Live,
    /// Applying this notice: if it does not continue at `last + 1` (see
    /// [`catch_up_target`]), reading from the storage up to it first; then
    /// taking its messages that continue at `last + 1`.
    Applying(Arc<Notice>),
    /// The hub receiver lagged, so notices were lost: reading from the
    /// storage after `last`, page by page, until a short page.
    Lagged,
}

/// A live subscription to one channel (see the module docs).
pub struct Subscription {
    storage: Arc<dyn Storage>,
    channel: ChannelName,
    live: HubReceiver,
    /// Offset of the newest message queued in `ready` or already handed out.
    last: Offset,
    /// Items to hand out, in offset order, all `<= last`. Handed out
    /// before anything else, whatever the phase.
    ready: VecDeque<Item>,
    /// Set once a `deleted` notice or the closure was queued: nothing
    /// follows it.
    ended: bool,
    /// Whether this subscription ends at the channel's closure
    /// ([`Subscription::end_at_closure`]).
    ends_at_closure: bool,
    /// The head the channel was closed at, once known (only while
    /// `ends_at_closure`).
    closed_at: Option<Offset>,
    /// Where the subscription is in the algorithm; kept here so that a
    /// cancelled `next` loses nothing.
    phase: Phase,
    /// Set while a read fails transiently, in whichever phase reads: when
    /// to try it again. Kept here so that a cancelled `next` does not cut
    /// the pause short.
    retry: Option<Retry>,
    /// Whether a storage read has shown that the resume point is at or
    /// below the channel's head (checked at the first read that succeeds).
    resume_checked: bool,
    /// The number of the channel's latest deletion as the first read that
    /// succeeded showed it: a deleted notice ends this subscription only
    /// for a later deletion.
    deletion_at_start: u64,
    /// Set until the first read that succeeds for a subscriber that may
    /// not read history: that read decides where it starts (see the
    /// module docs).
    live_only: Option<LiveOnly>,
    /// Most messages per storage read: a page, which `ready` holds until
    /// it is handed out, so this bounds what the subscription holds.
    page_limit: usize,
    /// Counts this subscription in `herald_subscribers` while it lives.
    _gauge: SubscriberGauge,
}

impl Subscription {
    /// Subscribes to `channel` live, then tries to read the first history
    /// page after `after`. When that read fails transiently (see the module
    /// docs) the subscription starts anyway, and `Subscription::next`
    /// waits and reads again: the client is answered at once and follows
    /// the channel as soon as the storage is back. `transport` labels the
    /// subscriber gauge.
    ///
    /// The resume point is judged against the head that the first
    /// successful read returns with its page, read from the storage (on a
    /// standby too, never a cached view): a resume point beyond it is
    /// [`NodeError::OffsetBeyondHead`], here or, when that read waited out an
    /// outage, from `Subscription::next`.
    ///
    /// # Errors
    /// [`NodeError::Storage`] when the first read fails with an error
    /// that is not transient; [`NodeError::OffsetBeyondHead`].
    pub async fn start(
        storage: Arc<dyn Storage>,
        hub: &Arc<Hub>,
        channel: ChannelName,
        after: Offset,
        transport: &'static str,
    ) -> NodeResult<Self> {
        Self::start_at(storage, hub, channel, StartAt::After(after), transport).await
    }

    /// As [`Subscription::start`], from `start`: for a
    /// [`StartAt::LiveOnly`] subscriber the first successful read also
    /// decides where it starts (see the module docs).
    ///
    /// # Errors
    /// As [`Subscription::start`].
    pub async fn start_at(
        storage: Arc<dyn Storage>,
        hub: &Arc<Hub>,
        channel: ChannelName,
        start: StartAt,
        transport: &'static str,
    ) -> NodeResult<Self> {
        Self::start_paged(storage, hub, channel, start, transport, PAGE_LIMIT).await
    }

    /// As [`Subscription::start_at`], reading at most `page_limit`
    /// messages (at least one) per storage read: the caller's bound on
    /// the bytes one catch-up page brings into memory (its byte budget
    /// over the largest message a channel stores).
    ///
    /// # Errors
    /// As [`Subscription::start`].
    pub async fn start_paged(
        storage: Arc<dyn Storage>,
        hub: &Arc<Hub>,
        channel: ChannelName,
        start: StartAt,
        transport: &'static str,
        page_limit: usize,
    ) -> NodeResult<Self> {
        let page_limit = page_limit.clamp(1, PAGE_LIMIT);
        let (after, live_only) = match start {
            StartAt::After(after) => (after, None),
            StartAt::LiveOnly(live) => (live.resume.unwrap_or(0), Some(live)),
        };
        let live = hub.subscribe(&channel);
        let mut sub = Self {
            storage,
            channel,
            live,
            live_only,
            last: after,
            ready: VecDeque::new(),
            ended: false,
            ends_at_closure: false,
            closed_at: None,
            phase: Phase::History,
            retry: None,
            resume_checked: false,
            deletion_at_start: 0,
            page_limit,
            _gauge: SubscriberGauge::new(transport),
        };
        if sub
            .try_read_page()
            .await?
            .is_some_and(|len| len < page_limit)
        {
            sub.phase = Phase::Live;
        }
        Ok(sub)
    }

    /// The channel followed.
    pub fn channel(&self) -> &ChannelName {
        &self.channel
    }

    /// Makes this subscription end at the channel's closure (a Durable
    /// Streams follower): [`Item::Closed`] comes once every message up to
    /// the head the channel was closed at was handed out (see the module
    /// docs). `closed_at`: that head, when the caller read the stream
    /// closed before it subscribed.
    pub fn end_at_closure(&mut self, closed_at: Option<Offset>) {
        self.ends_at_closure = true;
        self.live.watch_closure();
        if let Some(head) = closed_at {
            self.closed_at(head);
        }
    }

    /// Tells a subscription that ends at closure that the channel is
    /// closed at `head`, as the caller read the stream's properties (a
    /// standby's notices do not always say it: a close that appends
    /// nothing moves no head). When `head` is beyond what was handed out
    /// and the subscription waits for a notice, it reads up to `head` from
    /// the storage next. Ignored by other subscriptions.
    pub fn closed_at(&mut self, head: Offset) {
        if !self.ends_at_closure || self.ended {
            return;
        }
        self.closed_at = Some(head);
        if head > self.last && matches!(self.phase, Phase::Live) {
            self.phase = Phase::Applying(Arc::new(Notice {
                channel: self.channel.clone(),
                head,
                messages: Vec::new(),
                deleted: None,
                closed: true,
            }));
        }
    }

    /// Whether the subscription handed out everything it knows of:
    /// nothing is queued, no storage read is pending, and no end is due,
    /// so that what was handed out reaches the channel's head as it last
    /// saw it (from a storage read or a notice). A notice may be waiting
    /// in the hub meanwhile ([`Subscription::next_item_ready`] takes it).
    pub fn waits_for_notice(&self) -> bool {
        self.ready.is_empty()
            && !self.ended
            && matches!(self.phase, Phase::Live)
            && !self.closure_due()
    }

    /// The number of the channel's latest deletion as the subscription's
    /// first successful storage read showed it (`Page::deletion`; 0 before
    /// that read). Every message handed out was stored under it: a later
    /// deletion ends the subscription.
    pub fn deletion(&self) -> u64 {
        self.deletion_at_start
    }

    /// Whether [`Item::Closed`] is due: the channel is closed at a head
    /// this subscription has queued every message up to.
    fn closure_due(&self) -> bool {
        !self.ended && self.closed_at.is_some_and(|head| self.last >= head)
    }

    /// The next message in offset order; waits for one to be committed, and
    /// while a storage read fails transiently, for the storage to answer
    /// again (see the module docs). `Ok(None)` when the live feed ended
    /// (never while the hub lives).
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: dropped before it returned (a branch of
    /// a `select!` that lost), it has lost no message, and a later call
    /// goes on where it stopped. Every change of the subscription's state
    /// (the messages queued, `last`, the phase, the pause before the next
    /// try of a failing read) happens after an await completed, never
    /// across one, and [`HubReceiver::recv`] is cancel safe itself.
    ///
    /// # Errors
    /// [`NodeError::Storage`] when a storage read failed with an
    /// error that is not transient; the caller ends the subscription (the
    /// client resumes from its last offset). [`NodeError::OffsetBeyondHead`]
    /// when the first read that succeeded came after an outage at the
    /// start and found the resume point beyond the head.
    pub async fn next_item(&mut self) -> NodeResult<Option<Item>> {
        self.advance(true).await
    }

    /// As [`Subscription::next_item`], but without waiting for the hub's
    /// next notice: `Ok(None)` once nothing is queued, no storage read is
    /// pending and no notice is waiting (the subscription handed out
    /// everything it knows of), or once it ended. A storage read it needs
    /// is still made (and a transient failure waited out). A caller that
    /// gathers what is there into one answer (Durable Streams) takes items
    /// so until `None`, then waits with `next_item`.
    ///
    /// # Cancel safety
    ///
    /// As [`Subscription::next_item`].
    ///
    /// # Errors
    /// As [`Subscription::next_item`].
    pub async fn next_item_ready(&mut self) -> NodeResult<Option<Item>> {
        self.advance(false).await
    }

    /// The steps of [`Subscription::next_item`]; with `wait` false it
    /// answers `Ok(None)` where it would wait for a notice.
    async fn advance(&mut self, wait: bool) -> NodeResult<Option<Item>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                if matches!(item, Item::Message(_)) {
                    metrics::delivered();
                }
                return Ok(Some(item));
            }
            if self.ended {
                return Ok(None);
            }
            if let Some(head) = self.closed_at.filter(|_| self.closure_due()) {
                self.ended = true;
                return Ok(Some(Item::Closed { head }));
            }
            // Each arm awaits at most one read or one notice, then names
            // the next phase; `self.phase` changes only once it completed.
            self.phase = match self.phase.clone() {
                Phase::History => {
                    if self.read_page().await? < self.page_limit {
                        Phase::Live
                    } else {
                        Phase::History
                    }
                }
                Phase::Lagged => {
                    metrics::catchup_read();
                    if self.read_page().await? < self.page_limit {
                        Phase::Live
                    } else {
                        Phase::Lagged
                    }
                }
                Phase::Applying(notice) => self.apply(notice).await?,
                Phase::Live => {
                    let received = if wait {
                        self.live.recv().await
                    } else {
                        match self.live.try_recv() {
                            Some(received) => received,
                            None => return Ok(None),
                        }
                    };
                    match received {
                        Ok(notice) => Phase::Applying(notice),
                        Err(RecvError::Lagged(missed)) => {
                            tracing::debug!(channel = %self.channel, missed, "subscriber lagged; reading from storage");
                            Phase::Lagged
                        }
                        Err(RecvError::Closed) => return Ok(None),
                    }
                }
            };
        }
    }

    /// One step of applying `notice`: a read from the storage when the
    /// notice does not continue at `last + 1`, else queueing its messages.
    /// Returns the next phase: [`Phase::Live`] once the notice is applied,
    /// or when the storage is behind it (it never skips ahead of the
    /// storage), else [`Phase::Applying`] again.
    ///
    /// # Errors
    /// [`NodeError::StorageUnavailable`] on a read failure that is not
    /// transient.
    async fn apply(&mut self, notice: Arc<Notice>) -> NodeResult<Phase> {
        if let Some(deletion) = notice.deleted {
            if deletion > self.deletion_at_start {
                self.ready.push_back(Item::Deleted { head: notice.head });
                self.ended = true;
            }
            return Ok(Phase::Live);
        }
        if notice.closed && self.ends_at_closure {
            self.closed_at = Some(notice.head);
        }
        match catch_up_target(&notice, self.last) {
            Some(target) => {
                metrics::catchup_read();
                let read = self.read_page().await?;
                if self.last < target && read < self.page_limit {
                    // The storage does not have what the notice promises;
                    // never skip ahead of it.
                    tracing::warn!(
                        channel = %self.channel,
                        offset = self.last,
                        head = target,
                        "storage is behind a live notice; waiting for the next one"
                    );
                    return Ok(Phase::Live);
                }
                Ok(Phase::Applying(notice))
            }
            None => {
                self.take_contiguous(&notice);
                // A gap inside the notice (never sent so, but cheap to
                // honour) makes it a catch-up next turn.
                if catch_up_target(&notice, self.last).is_none() {
                    Ok(Phase::Live)
                } else {
                    Ok(Phase::Applying(notice))
                }
            }
        }
    }

    /// Reads one page after `last` and queues it; returns the page's length.
    /// Waits out transient failures: after each, it pauses (see
    /// [`RETRY_FIRST`], [`RETRY_MAX`]) and reads again, until a read
    /// succeeds.
    ///
    /// # Errors
    /// [`NodeError::Storage`] on a failure that is not transient.
    async fn read_page(&mut self) -> NodeResult<usize> {
        loop {
            if let Some(retry) = self.retry {
                tokio::time::sleep_until(retry.at).await;
            }
            if let Some(len) = self.try_read_page().await? {
                return Ok(len);
            }
        }
    }

    /// One try of [`Self::read_page`]: `Ok(Some(len))` when the page was
    /// read and queued, `Ok(None)` when the read failed transiently (the
    /// next try is scheduled in `retry`).
    ///
    /// # Errors
    /// [`NodeError::Storage`] on a failure that is not transient;
    /// [`NodeError::OffsetBeyondHead`] at the first successful read.
    async fn try_read_page(&mut self) -> NodeResult<Option<usize>> {
        // A subscriber that may not read history and gave no resume point
        // needs only the head.
        let head_only = self.live_only.is_some_and(|l| l.resume.is_none());
        let (after, limit) = if head_only {
            (Offset::MAX, 1)
        } else {
            (self.last, self.page_limit)
        };
        match self.storage.read(&self.channel, after, limit).await {
            Ok(page) => {
                let mut withheld = false;
                if !self.resume_checked {
                    // Nothing was queued yet: `last` is the resume point.
                    if !head_only && self.last > page.head {
                        return Err(NodeError::OffsetBeyondHead {
                            after: self.last,
                            head: page.head,
                        });
                    }
                    self.resume_checked = true;
                    self.deletion_at_start = page.deletion;
                    if let Some(live) = self.live_only.take() {
                        withheld = !head_only
                            && page
                                .messages
                                .first()
                                .is_some_and(|m| !live.admits(m.published_at_ms));
                        if withheld {
                            tracing::debug!(
                                channel = %self.channel,
                                offset = self.last,
                                head = page.head,
                                "resume point older than the history resume window; starting at the head"
                            );
                            self.ready.push_back(Item::Withheld {
                                requested_after: self.last,
                                head: page.head,
                            });
                        }
                        if head_only || withheld {
                            self.last = page.head;
                        }
                    }
                }
                if let Some(retry) = self.retry.take() {
                    tracing::info!(
                        channel = %self.channel,
                        offset = self.last,
                        failures = retry.failures,
                        waited_ms = u64::try_from(retry.since.elapsed().as_millis()).unwrap_or(u64::MAX),
                        "the storage answers again; the subscription goes on"
                    );
                }
                if head_only || withheld {
                    return Ok(Some(0));
                }
                Ok(Some(self.queue(page)))
            }
            Err(e) if is_transient(&e) => {
                metrics::subscription_read_retry();
                let now = Instant::now();
                let retry = match self.retry {
                    None => {
                        tracing::warn!(
                            channel = %self.channel,
                            offset = self.last,
                            error = %e,
                            retry_ms = u64::try_from(RETRY_FIRST.as_millis()).unwrap_or(u64::MAX),
                            "storage read failed; the subscription waits and reads again"
                        );
                        Retry {
                            at: now + RETRY_FIRST,
                            pause: RETRY_FIRST,
                            failures: 1,
                            since: now,
                        }
                    }
                    Some(previous) => {
                        tracing::debug!(
                            channel = %self.channel,
                            error = %e,
                            failures = previous.failures.saturating_add(1),
                            "storage read failed again"
                        );
                        let pause = (previous.pause * 2).min(RETRY_MAX);
                        Retry {
                            at: now + pause,
                            pause,
                            failures: previous.failures.saturating_add(1),
                            since: previous.since,
                        }
                    }
                };
                self.retry = Some(retry);
                Ok(None)
            }
            Err(e) => Err(NodeError::Storage(StorageFailure::new(
                "read",
                Some(&self.channel),
                e,
            ))),
        }
    }

    /// Queues the page's messages that continue at `last + 1`; returns the
    /// page's length. When the page's `earliest` is beyond `last + 1`
    /// (retention trimmed, or a deletion removed, what this subscriber had
    /// not got yet), first queues one [`Item::Truncated`] and goes on at
    /// `earliest`: the gap is announced, never skipped silently.
    fn queue(&mut self, page: Page) -> usize {
        if page.earliest > self.last + 1 {
            metrics::subscription_truncated();
            self.ready.push_back(Item::Truncated {
                requested_after: self.last,
                earliest: page.earliest,
            });
            self.last = page.earliest - 1;
        }
        let len = page.messages.len();
        for message in page.messages {
            if message.offset == self.last + 1 {
                self.last = message.offset;
                self.ready.push_back(Item::Message(message));
            }
        }
        len
    }

    /// Queues the notice's messages that continue at `last + 1`.
    fn take_contiguous(&mut self, notice: &Notice) {
        for message in &notice.messages {
            if message.offset == self.last + 1 {
                self.last = message.offset;
                self.ready.push_back(Item::Message(message.clone()));
            }
        }
    }

    /// The next message, for tests written before retention: panics on
    /// any other item.
    #[cfg(test)]
    pub async fn next(&mut self) -> NodeResult<Option<Message>> {
        match self.next_item().await? {
            Some(Item::Message(m)) => Ok(Some(m)),
            None => Ok(None),
            Some(other) => panic!("expected a message, got {other:?}"),
        }
    }
}

/// The offset the subscriber must read up to from the storage before it can
/// apply `notice`, or `None` when the notice continues at `last + 1` (or
/// brings nothing new).
fn catch_up_target(notice: &Notice, last: Offset) -> Option<Offset> {
    match notice.messages.iter().find(|m| m.offset > last) {
        Some(first) if first.offset > last + 1 => Some(first.offset - 1),
        Some(_) => None,
        None if notice.messages.is_empty() && notice.head > last => Some(notice.head),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use herald_storage::MessageLog;
    use std::time::Duration;

    use super::*;
    use crate::testing::MemoryStorage;

    /// A subscription of `storage` and `hub` to `channel` after `after`,
    /// over `transport`, started (its history read done or pending).
    async fn subscribe(
        storage: &Arc<MemoryStorage>,
        hub: &Arc<Hub>,
        channel: &str,
        after: u64,
        transport: &'static str,
    ) -> Subscription {
        Subscription::start(
            storage.clone(),
            hub,
            ChannelName::new(channel).unwrap(),
            after,
            transport,
        )
        .await
        .unwrap()
    }

    fn msg(offset: Offset) -> Message {
        Message {
            offset,
            data: herald_core::Payload::Json(Arc::from(
                serde_json::value::RawValue::from_string(offset.to_string()).unwrap(),
            )),
            published_at_ms: 0,
            tags: herald_core::Tags::default(),
        }
    }

    /// A head-moved notice without messages, as the standby feed sends.
    fn bare(channel: &str, head: Offset) -> Notice {
        Notice {
            deleted: None,
            closed: false,
            channel: ChannelName::new(channel).unwrap(),
            head,
            messages: Vec::new(),
        }
    }

    fn notice(channel: &str, head: Offset, offsets: std::ops::RangeInclusive<Offset>) -> Notice {
        Notice {
            deleted: None,
            closed: false,
            channel: ChannelName::new(channel).unwrap(),
            head,
            messages: offsets.map(msg).collect(),
        }
    }

    #[test]
    fn catch_up_only_on_gaps_and_bare_heads() {
        assert_eq!(catch_up_target(&notice("a", 5, 4..=5), 3), None);
        assert_eq!(catch_up_target(&notice("a", 5, 1..=5), 3), None);
        assert_eq!(catch_up_target(&notice("a", 7, 6..=7), 3), Some(5));
        assert_eq!(catch_up_target(&bare("a", 9), 3), Some(9));
        assert_eq!(catch_up_target(&bare("a", 3), 3), None);
        assert_eq!(catch_up_target(&notice("a", 3, 1..=3), 3), None);
    }

    async fn collect(sub: &mut Subscription, n: usize) -> Vec<Offset> {
        let mut out = Vec::new();
        for _ in 0..n {
            let m = tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .expect("subscription stalled")
                .unwrap()
                .unwrap();
            out.push(m.offset);
        }
        out
    }

    #[tokio::test]
    async fn history_in_pages_then_live_without_repeats() {
        let storage = MemoryStorage::new();
        for i in 0..2500 {
            storage.append_as_other_node("a", &i.to_string());
        }
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 10, "sse").await;
        // Committed after subscribing, and also announced: must come once.
        storage.append_as_other_node("a", "2501");
        hub.publish(Notice {
            deleted: None,
            closed: false,
            channel: ChannelName::new("a").unwrap(),
            head: 2501,
            messages: vec![msg(2501)],
        });
        let got = collect(&mut sub, 2491).await;
        assert_eq!(got, (11..=2501).collect::<Vec<_>>());
        // A notice with old and new messages: only the new ones.
        storage.append_as_other_node("a", "2502");
        hub.publish(notice("a", 2502, 2500..=2502));
        assert_eq!(collect(&mut sub, 1).await, vec![2502]);
        assert!(tokio::time::timeout(Duration::from_millis(50), sub.next())
            .await
            .is_err());
    }

    /// A subscription started with a page limit (the server's read
    /// budget over its largest message) never reads more messages at
    /// once, in its history, after a lag or to fill a gap, and still
    /// hands every message out once, in order.
    #[tokio::test]
    async fn catch_up_pages_hold_at_most_the_page_limit() {
        let storage = MemoryStorage::new();
        for i in 0..50 {
            storage.append_as_other_node("a", &i.to_string());
        }
        let hub = Hub::new(2);
        let a = ChannelName::new("a").unwrap();
        let mut sub = Subscription::start_paged(
            storage.clone(),
            &hub,
            a.clone(),
            StartAt::After(0),
            "sse",
            4,
        )
        .await
        .unwrap();
        assert_eq!(collect(&mut sub, 50).await, (1..=50).collect::<Vec<_>>());
        // More notices than the hub keeps: the subscriber lags and reads
        // the storage, still 4 at a time.
        for i in 51..=80 {
            storage.append_as_other_node("a", &i.to_string());
            hub.publish(notice("a", i, i..=i));
        }
        assert_eq!(collect(&mut sub, 30).await, (51..=80).collect::<Vec<_>>());
        // A bare head (a standby's notice) far ahead: a gap read in pages.
        for i in 81..=100 {
            storage.append_as_other_node("a", &i.to_string());
        }
        hub.publish(bare("a", 100));
        assert_eq!(collect(&mut sub, 20).await, (81..=100).collect::<Vec<_>>());
        assert_eq!(storage.largest_read(), 4, "a read of more than the page");
    }

    #[tokio::test]
    async fn gaps_and_bare_heads_are_read_from_storage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let a = ChannelName::new("a").unwrap();
        let mut sub = Subscription::start(storage.clone(), &hub, a.clone(), 0, "ws")
            .await
            .unwrap();
        for i in 1..=3 {
            storage.append_as_other_node("a", &i.to_string());
        }
        // Only 3 is announced with its message: 1 and 2 come from storage.
        hub.publish(notice("a", 3, 3..=3));
        assert_eq!(collect(&mut sub, 3).await, vec![1, 2, 3]);
        // A head-moved notice (standby feed) with no messages.
        storage.append_as_other_node("a", "4");
        storage.append_as_other_node("a", "5");
        hub.publish(bare("a", 5));
        assert_eq!(collect(&mut sub, 2).await, vec![4, 5]);
    }

    #[tokio::test]
    async fn a_gap_inside_a_notice_is_read_from_storage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let a = ChannelName::new("a").unwrap();
        let mut sub = Subscription::start(storage.clone(), &hub, a.clone(), 0, "sse")
            .await
            .unwrap();
        for i in 1..=4 {
            storage.append_as_other_node("a", &i.to_string());
        }
        hub.publish(Notice {
            deleted: None,
            closed: false,
            channel: a,
            head: 4,
            messages: vec![msg(1), msg(2), msg(4)],
        });
        assert_eq!(collect(&mut sub, 4).await, vec![1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_lagged_subscriber_catches_up_from_storage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(2);
        let mut sub = subscribe(&storage, &hub, "a", 0, "sse").await;
        for i in 1..=50u64 {
            storage.append_as_other_node("a", &i.to_string());
            hub.publish(notice("a", i, i..=i));
        }
        assert_eq!(collect(&mut sub, 50).await, (1..=50).collect::<Vec<_>>());
        storage.append_as_other_node("a", "51");
        hub.publish(notice("a", 51, 51..=51));
        assert_eq!(collect(&mut sub, 1).await, vec![51]);
    }

    #[tokio::test]
    async fn next_is_cancel_safe() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 0, "ws").await;
        // Cancel `next` many times while it waits; then deliver.
        for _ in 0..10 {
            assert!(tokio::time::timeout(Duration::from_millis(1), sub.next())
                .await
                .is_err());
        }
        storage.append_as_other_node("a", "1");
        hub.publish(notice("a", 1, 1..=1));
        assert_eq!(collect(&mut sub, 1).await, vec![1]);
    }

    /// Checks the pauses between the reads at `times`: the first is
    /// [`RETRY_FIRST`], each is at least the one before (at most double it)
    /// and none is longer than [`RETRY_MAX`].
    fn assert_backoff(times: &[tokio::time::Instant]) {
        let pauses: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(pauses.first(), Some(&RETRY_FIRST), "{pauses:?}");
        for pair in pauses.windows(2) {
            assert!(pair[1] >= pair[0] && pair[1] <= pair[0] * 2, "{pauses:?}");
        }
        assert!(pauses.iter().all(|p| *p <= RETRY_MAX), "{pauses:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_of_the_history_read_is_waited_out() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        for i in 1..=3 {
            storage.append_as_other_node("a", &i.to_string());
        }
        storage.fail_reads(true);
        let mut sub = Subscription::start(
            storage.clone(),
            &hub,
            ChannelName::new("a").unwrap(),
            0,
            "sse",
        )
        .await
        .expect("a transient failure does not refuse the subscription");
        // While every read fails, `next` neither returns nor gives up: it
        // reads again and again, with growing pauses (time is paused, so
        // the pauses are exact).
        assert!(
            tokio::time::timeout(Duration::from_secs(10), sub.next())
                .await
                .is_err(),
            "next returned while every read failed"
        );
        let times = storage.read_times();
        assert!(times.len() >= 10, "{} reads in 10 s", times.len());
        assert_backoff(&times);
        let pauses: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(pauses.last(), Some(&RETRY_MAX), "{pauses:?}");
        // The storage is back: the history, then live, each once.
        storage.fail_reads(false);
        assert_eq!(collect(&mut sub, 3).await, vec![1, 2, 3]);
        storage.append_as_other_node("a", "4");
        hub.publish(notice("a", 4, 3..=4));
        assert_eq!(collect(&mut sub, 1).await, vec![4]);
    }

    /// A resume point beyond the head: refused at the start; after an
    /// outage at the start, the first read that succeeds ends the
    /// subscription with the same error. At the head it is fine.
    #[tokio::test(start_paused = true)]
    async fn a_resume_point_beyond_the_head_is_refused() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        storage.append_as_other_node("a", "1");
        let start = |after| {
            Subscription::start(
                storage.clone(),
                &hub,
                ChannelName::new("a").unwrap(),
                after,
                "sse",
            )
        };
        assert!(matches!(
            start(2).await,
            Err(NodeError::OffsetBeyondHead { after: 2, head: 1 })
        ));
        assert!(start(1).await.is_ok());

        storage.fail_reads(true);
        let mut sub = start(5).await.expect("an outage does not refuse it");
        storage.fail_reads(false);
        assert!(matches!(
            sub.next().await,
            Err(NodeError::OffsetBeyondHead { after: 5, head: 1 })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_of_a_catch_up_read_is_waited_out() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 0, "ws").await;
        for round in 0..2u64 {
            // Head-moved notices make the subscription read the storage.
            storage.append_as_other_node("a", "1");
            storage.append_as_other_node("a", "2");
            hub.publish(bare("a", 2 + round * 4));
            assert_eq!(
                collect(&mut sub, 2).await,
                vec![1 + round * 4, 2 + round * 4]
            );
            storage.fail_reads(true);
            storage.append_as_other_node("a", "3");
            storage.append_as_other_node("a", "4");
            hub.publish(bare("a", 4 + round * 4));
            let before = storage.reads();
            assert!(
                tokio::time::timeout(Duration::from_secs(3), sub.next())
                    .await
                    .is_err(),
                "next returned while every read failed"
            );
            // Each outage starts again from the shortest pause.
            let times = storage.read_times();
            assert!(times.len() >= before + 3, "{times:?}");
            assert_backoff(&times[before..]);
            storage.fail_reads(false);
            assert_eq!(
                collect(&mut sub, 2).await,
                vec![3 + round * 4, 4 + round * 4]
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_next_keeps_the_pause_before_the_next_read() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        storage.fail_reads(true);
        let mut sub = subscribe(&storage, &hub, "a", 0, "ws").await;
        assert_eq!(storage.reads(), 1);
        // A WebSocket session cancels `next` whenever another branch of
        // its `select!` wins; 100 cancellations in about 100 ms must not
        // turn into 100 reads: the tries come at 50 ms and 150 ms.
        for _ in 0..100 {
            assert!(tokio::time::timeout(Duration::from_millis(1), sub.next())
                .await
                .is_err());
        }
        let reads = storage.reads();
        assert!((2..=3).contains(&reads), "{reads} reads");
        assert_backoff(&storage.read_times());
        storage.fail_reads(false);
        storage.append_as_other_node("a", "1");
        assert_eq!(collect(&mut sub, 1).await, vec![1]);
    }

    #[tokio::test]
    async fn a_storage_failure_that_is_not_transient_ends_the_subscription() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        storage.corrupt_reads(true);
        let start = Subscription::start(
            storage.clone(),
            &hub,
            ChannelName::new("a").unwrap(),
            0,
            "sse",
        )
        .await;
        assert!(matches!(start, Err(NodeError::Storage(_))));
        // The failed start left no sender behind.
        assert_eq!(hub.channel_count(), 0);
        // Mid-stream, the same error ends it.
        storage.corrupt_reads(false);
        let mut sub = subscribe(&storage, &hub, "a", 0, "sse").await;
        storage.corrupt_reads(true);
        storage.append_as_other_node("a", "1");
        hub.publish(bare("a", 1));
        let next = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("next returns");
        assert!(matches!(next, Err(NodeError::Storage(_))));
    }

    /// Trims `channel` of `storage` to its newest `keep` messages.
    async fn trim_keeping(storage: &Arc<MemoryStorage>, channel: &str, keep: u64) {
        let lease = herald_core::Lease {
            name: "writer".to_owned(),
            holder: "node-a".to_owned(),
            holder_url: "http://node-a".to_owned(),
            token: herald_core::FencingToken(1),
        };
        let limits = herald_storage::TrimLimits {
            max_messages: Some(keep),
            ..herald_storage::TrimLimits::default()
        };
        storage
            .trim(&lease, &ChannelName::new(channel).unwrap(), &limits, 1000)
            .await
            .unwrap();
    }

    async fn next_item(sub: &mut Subscription) -> Item {
        tokio::time::timeout(Duration::from_secs(5), sub.next_item())
            .await
            .expect("subscription stalled")
            .unwrap()
            .expect("an item")
    }

    #[tokio::test]
    async fn a_resume_point_below_earliest_is_announced_then_goes_on_at_earliest() {
        let storage = MemoryStorage::new();
        for i in 0..10 {
            storage.append_as_other_node("a", &i.to_string());
        }
        trim_keeping(&storage, "a", 3).await;
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 2, "sse").await;
        assert_eq!(
            next_item(&mut sub).await,
            Item::Truncated {
                requested_after: 2,
                earliest: 8
            }
        );
        assert_eq!(collect(&mut sub, 3).await, vec![8, 9, 10]);
        // Exactly at earliest − 1: nothing is announced.
        let mut at_edge = subscribe(&storage, &hub, "a", 7, "sse").await;
        assert_eq!(collect(&mut at_edge, 3).await, vec![8, 9, 10]);
    }

    #[tokio::test]
    async fn a_subscriber_overtaken_by_trimming_gets_truncated_not_a_silent_skip() {
        let storage = MemoryStorage::new();
        for i in 0..2500 {
            storage.append_as_other_node("a", &i.to_string());
        }
        let hub = Hub::new(16);
        // The first page (1..=1000) is read at the start.
        let mut sub = subscribe(&storage, &hub, "a", 0, "sse").await;
        trim_keeping(&storage, "a", 100).await;
        assert_eq!(
            collect(&mut sub, 1000).await,
            (1..=1000).collect::<Vec<_>>()
        );
        assert_eq!(
            next_item(&mut sub).await,
            Item::Truncated {
                requested_after: 1000,
                earliest: 2401
            }
        );
        assert_eq!(
            collect(&mut sub, 100).await,
            (2401..=2500).collect::<Vec<_>>()
        );
    }

    /// A live-only start with `resume` and `window`, on a clock a minute
    /// ahead of the memory storage's: the messages of a test are about
    /// 60 s old.
    fn live_only(resume: Option<Offset>, window: Duration) -> StartAt {
        StartAt::LiveOnly(LiveOnly {
            resume,
            window,
            now_ms: || crate::testing::CLOCK_START_MS + 60_000,
        })
    }

    async fn start_live_only(
        storage: &Arc<MemoryStorage>,
        hub: &Arc<Hub>,
        start: StartAt,
    ) -> NodeResult<Subscription> {
        Subscription::start_at(
            storage.clone(),
            hub,
            ChannelName::new("a").unwrap(),
            start,
            "sse",
        )
        .await
    }

    /// Without a resume point, a subscriber that may not read history
    /// gets nothing stored, whatever the window: the next item is the
    /// next publish.
    #[tokio::test]
    async fn a_live_only_subscriber_starts_at_the_head() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        for i in 1..=3 {
            storage.append_as_other_node("a", &i.to_string());
        }
        let start = live_only(None, Duration::from_secs(3600));
        let mut sub = start_live_only(&storage, &hub, start).await.unwrap();
        storage.append_as_other_node("a", "4");
        hub.publish(notice("a", 4, 4..=4));
        assert_eq!(collect(&mut sub, 1).await, vec![4]);
    }

    /// A resume point whose next message is older than the window: one
    /// `Withheld`, then the messages after the head; inside the window:
    /// every message after it.
    #[tokio::test]
    async fn a_live_only_resume_point_is_honoured_only_inside_the_window() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        for i in 1..=3 {
            storage.append_as_other_node("a", &i.to_string());
        }
        // Message 2 was published about 60 s before the clock's now.
        for window in [Duration::ZERO, Duration::from_secs(30)] {
            let mut sub = start_live_only(&storage, &hub, live_only(Some(1), window))
                .await
                .unwrap();
            assert_eq!(
                next_item(&mut sub).await,
                Item::Withheld {
                    requested_after: 1,
                    head: 3
                },
                "{window:?}"
            );
            assert!(
                tokio::time::timeout(Duration::from_millis(20), sub.next_item())
                    .await
                    .is_err(),
                "nothing stored follows"
            );
        }
        let inside = live_only(Some(1), Duration::from_secs(3600));
        let mut sub = start_live_only(&storage, &hub, inside).await.unwrap();
        assert_eq!(collect(&mut sub, 2).await, vec![2, 3]);
        // At the head nothing is withheld; beyond it is refused as usual.
        let mut at_head = start_live_only(&storage, &hub, live_only(Some(3), Duration::ZERO))
            .await
            .unwrap();
        storage.append_as_other_node("a", "4");
        hub.publish(notice("a", 4, 4..=4));
        assert_eq!(collect(&mut at_head, 1).await, vec![4]);
        assert!(matches!(
            start_live_only(&storage, &hub, live_only(Some(9), Duration::ZERO)).await,
            Err(NodeError::OffsetBeyondHead { after: 9, head: 4 })
        ));
    }

    /// The start is decided by the first read that succeeds, also after an
    /// outage at the start.
    #[tokio::test(start_paused = true)]
    async fn a_live_only_start_waits_out_an_outage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        for i in 1..=3 {
            storage.append_as_other_node("a", &i.to_string());
        }
        storage.fail_reads(true);
        let start = live_only(None, Duration::from_secs(3600));
        let mut sub = start_live_only(&storage, &hub, start).await.unwrap();
        storage.fail_reads(false);
        // The read after the pause decides the start (head 3), then waits.
        assert!(
            tokio::time::timeout(Duration::from_secs(2), sub.next_item())
                .await
                .is_err()
        );
        assert!(storage.reads() >= 2, "{} reads", storage.reads());
        storage.append_as_other_node("a", "4");
        hub.publish(notice("a", 4, 4..=4));
        assert_eq!(collect(&mut sub, 1).await, vec![4]);
    }

    /// A subscription that ends at closure hands out every message up to
    /// the closing notice's head, then `Closed`, the last item, without
    /// reading the storage for what the notices carried; one that does
    /// not end at closure ignores the closure.
    #[tokio::test]
    async fn a_closing_notice_ends_a_subscription_that_ends_at_closure() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 0, "durable_streams").await;
        sub.end_at_closure(None);
        let mut plain = subscribe(&storage, &hub, "a", 0, "sse").await;
        assert!(sub.waits_for_notice());
        let reads = storage.reads();
        storage.append_as_other_node("a", "1");
        hub.publish(notice("a", 1, 1..=1));
        storage.append_as_other_node("a", "2");
        let mut closing = notice("a", 2, 2..=2);
        closing.closed = true;
        hub.publish(closing);
        assert_eq!(collect(&mut sub, 2).await, vec![1, 2]);
        assert_eq!(next_item(&mut sub).await, Item::Closed { head: 2 });
        assert!(sub.next_item().await.unwrap().is_none());
        assert_eq!(collect(&mut plain, 2).await, vec![1, 2]);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), plain.next_item())
                .await
                .is_err(),
            "a subscription that does not end at closure waits on"
        );
        assert_eq!(
            storage.reads(),
            reads,
            "a notice's messages were read again"
        );
        // A close that appends nothing: its notice carries no message.
        let mut sub = subscribe(&storage, &hub, "a", 2, "durable_streams").await;
        sub.end_at_closure(None);
        let mut close = bare("a", 2);
        close.closed = true;
        hub.publish(close);
        assert_eq!(next_item(&mut sub).await, Item::Closed { head: 2 });
    }

    /// A closure the caller read (the stream's properties) ends the
    /// subscription once it handed out every message up to that head,
    /// read from the storage when no notice brought them (a standby
    /// hears of a close that appends nothing only so).
    #[tokio::test]
    async fn a_closure_read_by_the_caller_ends_the_subscription_at_its_head() {
        let storage = MemoryStorage::new();
        storage.append_as_other_node("a", "1");
        let hub = Hub::new(16);
        // Closed before it began: ends after the history.
        let mut sub = subscribe(&storage, &hub, "a", 0, "durable_streams").await;
        sub.end_at_closure(Some(1));
        assert!(!sub.waits_for_notice());
        assert_eq!(collect(&mut sub, 1).await, vec![1]);
        assert_eq!(next_item(&mut sub).await, Item::Closed { head: 1 });
        // Closed at a head no notice announced here.
        let mut sub = subscribe(&storage, &hub, "a", 1, "durable_streams").await;
        sub.end_at_closure(None);
        assert!(sub.waits_for_notice());
        storage.append_as_other_node("a", "2");
        storage.append_as_other_node("a", "3");
        sub.closed_at(3);
        assert_eq!(collect(&mut sub, 2).await, vec![2, 3]);
        assert_eq!(next_item(&mut sub).await, Item::Closed { head: 3 });
        assert!(sub.next_item().await.unwrap().is_none());
        // Ignored by a subscription that does not end at closure.
        let mut plain = subscribe(&storage, &hub, "a", 3, "sse").await;
        plain.closed_at(3);
        assert!(plain.waits_for_notice());
    }

    /// The items `next_item_ready` hands out before it answers `None`.
    async fn ready_items(sub: &mut Subscription) -> Vec<Offset> {
        let mut got = Vec::new();
        loop {
            let item = tokio::time::timeout(Duration::from_secs(5), sub.next_item_ready())
                .await
                .expect("next_item_ready waited")
                .unwrap();
            match item {
                Some(Item::Message(m)) => got.push(m.offset),
                Some(other) => panic!("expected a message, got {other:?}"),
                None => return got,
            }
        }
    }

    /// `next_item_ready` hands out what the subscription gets without a
    /// new notice (a catch-up read for a bare notice, the notices waiting
    /// in the hub), then answers `None` rather than waiting.
    #[tokio::test]
    async fn next_item_ready_stops_where_a_new_notice_is_needed() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 0, "durable_streams").await;
        assert_eq!(ready_items(&mut sub).await, Vec::<Offset>::new());
        // A standby's notice: only the head, the messages from the storage.
        storage.append_as_other_node("a", "1");
        storage.append_as_other_node("a", "2");
        hub.publish(bare("a", 2));
        assert_eq!(ready_items(&mut sub).await, vec![1, 2]);
        assert!(sub.waits_for_notice());
        for i in 3..=4 {
            storage.append_as_other_node("a", &i.to_string());
            hub.publish(notice("a", i, i..=i));
        }
        assert_eq!(ready_items(&mut sub).await, vec![3, 4]);
        assert_eq!(ready_items(&mut sub).await, Vec::<Offset>::new());
    }

    fn deleted(channel: &str, head: Offset, deletion: u64) -> Notice {
        Notice {
            deleted: Some(deletion),
            closed: false,
            channel: ChannelName::new(channel).unwrap(),
            head,
            messages: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_deleted_notice_is_the_last_item() {
        let storage = MemoryStorage::new();
        storage.append_as_other_node("a", "1");
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 0, "ws").await;
        assert_eq!(collect(&mut sub, 1).await, vec![1]);
        hub.publish(deleted("a", 1, 1));
        assert_eq!(next_item(&mut sub).await, Item::Deleted { head: 1 });
        assert!(sub.next_item().await.unwrap().is_none());
    }

    /// A subscription that began after a deletion (its first read showed
    /// it) is not ended by a notice of that deletion, which may come late
    /// or twice; a later deletion ends it.
    #[tokio::test]
    async fn only_a_deletion_after_the_start_ends_a_subscription() {
        let storage = MemoryStorage::new();
        storage.append_as_other_node("a", "1");
        storage.delete_as_other_node("a");
        storage.append_as_other_node("a", "2");
        let hub = Hub::new(16);
        let mut sub = subscribe(&storage, &hub, "a", 1, "sse").await;
        assert_eq!(collect(&mut sub, 1).await, vec![2]);
        hub.publish(deleted("a", 1, 1));
        storage.append_as_other_node("a", "3");
        hub.publish(Notice {
            deleted: None,
            closed: false,
            channel: ChannelName::new("a").unwrap(),
            head: 3,
            messages: Vec::new(),
        });
        assert_eq!(collect(&mut sub, 1).await, vec![3]);
        let number = storage.delete_as_other_node("a");
        assert_eq!(number, 2);
        hub.publish(deleted("a", 3, number));
        assert_eq!(next_item(&mut sub).await, Item::Deleted { head: 3 });
        assert!(sub.next_item().await.unwrap().is_none());
    }
}
