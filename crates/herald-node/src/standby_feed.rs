//! Live notices on a standby: another process on the same database writes,
//! so this node learns of new messages by asking the storage which channels
//! moved (`Storage::changes_since`) and publishes a head-moved notice per
//! moved channel. For a channel that has subscribers here, the feed reads
//! the new messages once and sends them with the notice (up to
//! `READ_AHEAD_LIMIT`), so that a thousand subscribers cost one read, not
//! a thousand; the first notice after a channel's first subscriber came,
//! and one of a channel that moved further, carry none, and each
//! subscriber reads from the storage itself.
//! For a channel whose subscribers here end at its closure (Durable
//! Streams followers), the feed also reads once whether the stream is
//! closed at the new head, and says so in the notice.
//! Likewise for deletions of channels (`Storage::deletions_since`): a
//! deleted notice per deletion, which ends the subscriptions to the
//! channel that began before it (`subscription.rs`).
//!
//! When the storage signals commits (`Storage::watch_changes`, PostgreSQL),
//! the feed asks which channels moved at each signal, and publishes the
//! deleted notice of a deletion signal at once. A resync or a lagged signal
//! receiver (signals may have been missed) and every `SAFETY_POLL`, in
//! case a signal was lost, make it also ask for the deletions it has not
//! seen: a deletion whose signal was lost still ends the subscriptions.
//! Without signals (SQLite) it asks for both every
//! `standby_poll_interval`. A deletion may so be announced twice (by its
//! signal, then by a poll); subscriptions ignore the repeat.
//!
//! While this node is holder its own writer publishes notices (and a
//! deletion its own deleted notice); the feed then polls once more (to
//! announce what the previous holder committed last) and waits for the
//! role to change, without polling, dropping commit signals.
//!
//! The test-only fault switch `drop_notify` acts here: see
//! `herald_core::fault_switches::FaultSwitch::DropNotify`, and `Turn`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::ChannelHead;
use herald_lease::LeaseState;
use herald_storage::{ChangeSignal, Deletion, Storage};
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, Notice};
use crate::metrics;
use crate::role::LeaseView;

/// How often a standby that receives commit signals still polls, in case a
/// signal was lost.
pub(crate) const SAFETY_POLL: Duration = Duration::from_secs(1);

/// The most new messages of one channel the feed reads to send with its
/// notice; a channel that moved further is announced without them.
pub(crate) const READ_AHEAD_LIMIT: usize = 256;

/// The most of those reads the feed runs at once.
const READ_AHEAD_CONCURRENCY: usize = 4;

/// The standby feed task's state.
pub(crate) struct StandbyFeed {
    storage: Arc<dyn Storage>,
    lease: Arc<dyn LeaseView>,
    hub: Arc<Hub>,
    /// Position in the storage's commit order up to which notices were sent.
    cursor: u64,
    /// The number of the last deletion read from the storage.
    deletions: u64,
    /// Poll period without commit signals.
    interval: Duration,
    /// Poll period besides commit signals.
    safety_poll: Duration,
    /// `true` while the last poll failed (to log transitions only).
    failing: bool,
}

/// What woke the feed's wait.
enum Wake {
    /// Drain: stop.
    Shutdown,
    /// A poll period passed.
    Poll,
    /// Commit signals arrived.
    Signals(Heard),
    /// The lease state changed.
    RoleChanged,
    /// The lease supervisor is gone: its state no longer changes.
    SupervisorGone,
    /// The storage's signal sender is gone: fall back to polling.
    SignalsClosed,
}

/// What [`drain_signals`] took: the deletions signalled, and whether
/// signals may have been missed (a resync, a lagged receiver).
#[derive(Debug, Default)]
struct Heard {
    /// The deletions signalled, in the order heard.
    deleted: Vec<Deletion>,
    /// A resync or a lag: the feed must read the deletions too.
    missed: bool,
}

/// How a standby's next turn begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Poll the storage for moved channels and deletions, then wait: at
    /// start, after being holder, after a poll period, after signals that
    /// may have missed some, and after an update of the lease state (but
    /// see [`Turn::Wait`]).
    Poll,
    /// Poll the storage for moved channels only, then wait: after commit
    /// signals (a deletion's own signal announced it).
    PollChanges,
    /// Only wait. Under the test-only fault switch `drop_notify`, after an
    /// update of the lease state that leaves this node a standby (they come
    /// about once per acquire attempt), which is then no reason to poll.
    Wait,
}

/// How a stretch as holder ended.
enum AfterHolder {
    /// This node is a standby again.
    Standby,
    /// Drain, or the supervisor ended while this node was holder: stop.
    Stop,
}

/// What the feed listens to besides `shutdown`; each `None` once its
/// sender is gone.
struct Inputs {
    /// The storage's commit signals; `None` without them (SQLite, or the
    /// storage stopped signalling): the standby then polls every
    /// `standby_poll_interval`.
    signals: Option<broadcast::Receiver<ChangeSignal>>,
    /// The lease supervisor's state; `None` once the supervisor is gone.
    states: Option<watch::Receiver<LeaseState>>,
}

impl StandbyFeed {
    /// A feed that announces changes committed after `cursor` and the
    /// deletions numbered after `deletions`.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        hub: Arc<Hub>,
        (cursor, deletions): (u64, u64),
        interval: Duration,
    ) -> Self {
        Self {
            storage,
            lease,
            hub,
            cursor,
            deletions,
            interval,
            safety_poll: SAFETY_POLL,
            failing: false,
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut inputs = Inputs {
            signals: self.storage.watch_changes(),
            states: Some(self.lease.subscribe()),
        };
        let mut turn = Turn::Poll;
        loop {
            if self.lease.is_holder() {
                match self.while_holder(&shutdown, &mut inputs).await {
                    AfterHolder::Stop => return,
                    AfterHolder::Standby => turn = Turn::Poll,
                }
                continue;
            }
            match turn {
                Turn::Poll => self.poll(true).await,
                Turn::PollChanges => self.poll(false).await,
                Turn::Wait => {}
            }
            let has_signals = inputs.signals.is_some();
            let has_states = inputs.states.is_some();
            let period = if has_signals {
                self.safety_poll
            } else {
                self.interval
            };
            // Test-only fault switch `drop_notify`: no safety poll besides
            // the signals.
            let timed_poll = !(has_signals && fault_switches::enabled(FaultSwitch::DropNotify));
            let wake = tokio::select! {
                () = shutdown.cancelled() => Wake::Shutdown,
                () = tokio::time::sleep(period), if timed_poll => Wake::Poll,
                wake = role_changed(&mut inputs.states), if has_states => wake,
                heard = drain_signals(&mut inputs.signals, true), if has_signals => {
                    heard.map_or(Wake::SignalsClosed, Wake::Signals)
                }
            };
            turn = match wake {
                Wake::Shutdown => return,
                Wake::Poll => Turn::Poll,
                Wake::Signals(heard) => {
                    for deletion in heard.deleted {
                        self.announce_deletion(deletion);
                    }
                    if heard.missed {
                        Turn::Poll
                    } else {
                        Turn::PollChanges
                    }
                }
                Wake::RoleChanged => self.turn_after_role_update(),
                Wake::SupervisorGone => {
                    inputs.states = None;
                    self.turn_after_role_update()
                }
                Wake::SignalsClosed => {
                    tracing::warn!(
                        "standby feed: the storage stopped signalling commits; polling every standby_poll_interval"
                    );
                    inputs.signals = None;
                    Turn::Poll
                }
            };
        }
    }

    /// While this node is holder its own writer announces its commits: polls
    /// once (to announce what the previous holder committed last), then
    /// waits for the role to change, without polling, dropping commit
    /// signals so that none are stale later.
    async fn while_holder(
        &mut self,
        shutdown: &CancellationToken,
        inputs: &mut Inputs,
    ) -> AfterHolder {
        self.poll(true).await;
        while self.lease.is_holder() && inputs.states.is_some() {
            let has_signals = inputs.signals.is_some();
            let wake = tokio::select! {
                () = shutdown.cancelled() => Wake::Shutdown,
                wake = role_changed(&mut inputs.states) => wake,
                heard = drain_signals(&mut inputs.signals, false), if has_signals => {
                    heard.map_or(Wake::SignalsClosed, Wake::Signals)
                }
            };
            match wake {
                Wake::Shutdown => return AfterHolder::Stop,
                Wake::SupervisorGone => inputs.states = None,
                Wake::SignalsClosed => inputs.signals = None,
                Wake::Poll | Wake::Signals(_) | Wake::RoleChanged => {}
            }
        }
        if self.lease.is_holder() {
            // Supervisor gone while holder: nothing will change any more;
            // the node is stopping.
            shutdown.cancelled().await;
            return AfterHolder::Stop;
        }
        AfterHolder::Standby
    }

    /// How a standby's turn begins after an update of the lease state (or
    /// the supervisor's end) woke it: [`Turn::Poll`], except under the
    /// test-only fault switch `drop_notify` when this node is still a
    /// standby ([`Turn::Wait`]).
    fn turn_after_role_update(&self) -> Turn {
        if fault_switches::enabled(FaultSwitch::DropNotify) && !self.lease.is_holder() {
            Turn::Wait
        } else {
            Turn::Poll
        }
    }

    /// Announces every channel that moved since the cursor and, with
    /// `deletions`, every deletion after the last one read.
    async fn poll(&mut self, deletions: bool) {
        let mut failed = None;
        match self.storage.changes_since(self.cursor).await {
            Ok(feed) => {
                self.cursor = feed.cursor;
                // A few reads at once, each notice published as its read
                // ends: the pool (10 connections) stays free for the
                // subscribers' own reads and the lease's acquire.
                let mut notices = futures::stream::iter(feed.changed)
                    .map(|moved| self.notice(moved))
                    .buffer_unordered(READ_AHEAD_CONCURRENCY);
                while let Some(notice) = notices.next().await {
                    self.hub.publish(notice);
                }
            }
            Err(e) => failed = Some(e),
        }
        if deletions {
            match self.storage.deletions_since(self.deletions).await {
                Ok(read) => {
                    self.deletions = read.cursor;
                    for deletion in read.deleted {
                        self.announce_deletion(deletion);
                    }
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            None if self.failing => {
                tracing::info!("standby feed: storage answers again");
                self.failing = false;
            }
            Some(e) if !self.failing => {
                tracing::warn!(error = %e, "standby feed: cannot read changes; live subscribers wait");
                self.failing = true;
            }
            _ => {}
        }
    }

    /// The notice that `moved`'s head moved. When this node's subscribers
    /// to the channel were last told of a head at most
    /// [`READ_AHEAD_LIMIT`] messages behind, it carries the messages in
    /// between, read once here (at most `READ_AHEAD_LIMIT`, up to the new
    /// head), so that the subscribers need not each read them. Otherwise,
    /// or when that read fails, it carries none and each subscriber reads
    /// from the storage itself (`subscription.rs`).
    async fn notice(&self, moved: ChannelHead) -> Notice {
        let mut messages = Vec::new();
        if let Some(told) = self.hub.last_head(&moved.name) {
            let behind = moved.head.saturating_sub(told);
            if behind > 0 && behind <= READ_AHEAD_LIMIT as u64 {
                match self.storage.read(&moved.name, told, READ_AHEAD_LIMIT).await {
                    Ok(page) => {
                        messages = page.messages;
                        messages.retain(|m| m.offset <= moved.head);
                    }
                    Err(e) => {
                        tracing::debug!(channel = %moved.name, error = %e, "standby feed: cannot read the new messages; subscribers read them");
                    }
                }
            }
        }
        let closed = self.closed_at(&moved).await;
        Notice {
            deleted: None,
            channel: moved.name,
            head: moved.head,
            messages,
            closed,
        }
    }

    /// Whether `moved` is a stream closed at its new head, for a channel
    /// whose subscribers here end at its closure
    /// ([`Hub::closure_watched`]): read once here (the stream's
    /// properties, never its messages) rather than by each subscriber.
    /// `false` when nobody here watches, when the stream moved on since
    /// (a later notice tells), or when the read fails (the subscribers
    /// look at the stream themselves from time to time).
    async fn closed_at(&self, moved: &ChannelHead) -> bool {
        if !self.hub.closure_watched(&moved.name) {
            return false;
        }
        match self.storage.stream_info(&moved.name).await {
            Ok(info) => info.is_some_and(|info| info.closed && info.head == moved.head),
            Err(e) => {
                tracing::debug!(channel = %moved.name, error = %e, "standby feed: cannot read whether the stream is closed");
                false
            }
        }
    }

    /// Publishes the deleted notice of `deletion`.
    fn announce_deletion(&self, deletion: Deletion) {
        tracing::debug!(channel = %deletion.channel, deletion = deletion.number, "standby feed: channel deleted");
        self.hub.publish(Notice {
            deleted: Some(deletion.number),
            closed: false,
            channel: deletion.channel,
            head: deletion.head,
            messages: Vec::new(),
        });
    }
}

/// Waits for the next change of the lease state: [`Wake::RoleChanged`], or
/// [`Wake::SupervisorGone`] when the supervisor is gone (or was already).
/// Cancel-safe (`watch::Receiver::changed`).
async fn role_changed(states: &mut Option<watch::Receiver<LeaseState>>) -> Wake {
    let Some(rx) = states.as_mut() else {
        return Wake::SupervisorGone;
    };
    match rx.changed().await {
        Ok(()) => Wake::RoleChanged,
        Err(_) => Wake::SupervisorGone,
    }
}

/// Waits for a commit signal, then takes every signal already waiting too,
/// so that a burst of commits costs one `changes_since`. With `measure`,
/// records each commit's delay in `herald_notify_lag_seconds`. Returns
/// what was heard, or `None` when the sender is gone (or there is no
/// receiver). Cancel-safe: the first await takes nothing before it
/// completes, and the rest takes only what is already there.
async fn drain_signals(
    signals: &mut Option<broadcast::Receiver<ChangeSignal>>,
    measure: bool,
) -> Option<Heard> {
    let rx = signals.as_mut()?;
    let mut heard = Heard::default();
    match rx.recv().await {
        Ok(signal) => heard.take(signal, measure),
        // Missed signals: a resync.
        Err(RecvError::Lagged(_)) => heard.missed = true,
        Err(RecvError::Closed) => return None,
    }
    loop {
        match rx.try_recv() {
            Ok(signal) => heard.take(signal, measure),
            Err(TryRecvError::Lagged(_)) => heard.missed = true,
            Err(TryRecvError::Empty) => return Some(heard),
            Err(TryRecvError::Closed) => return None,
        }
    }
}

impl Heard {
    /// Takes one signal: keeps a deletion, notes a resync and, with
    /// `measure`, records how long a commit signal took to arrive (local
    /// wall clock now minus the commit time, clamped at 0).
    fn take(&mut self, signal: ChangeSignal, measure: bool) {
        match signal {
            ChangeSignal::Committed {
                committed_at_ms, ..
            } if measure => {
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                let lag_ms = now_ms.saturating_sub(committed_at_ms).max(0);
                metrics::notify_lag(lag_ms as f64 / 1000.0);
            }
            ChangeSignal::Committed { .. } => {}
            ChangeSignal::Deleted(deletion) => self.deleted.push(deletion),
            ChangeSignal::Resync => self.missed = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use herald_core::{ChannelName, FencingToken};
    use herald_storage::ChangeFeedReader;

    use super::*;
    use crate::testing::{FakeLease, MemoryStorage};

    #[tokio::test]
    async fn a_standby_announces_what_another_node_commits() {
        let storage = MemoryStorage::new();
        storage.append_as_other_node("a", "0");
        let lease = FakeLease::holder(FencingToken(1));
        lease.set_standby(Some("http://other"));
        let hub = Hub::new(16);
        let cursor = storage.change_cursor().await.unwrap();
        let feed = StandbyFeed::new(
            storage.clone(),
            lease.clone(),
            hub.clone(),
            (cursor, 0),
            Duration::from_millis(5),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(feed.run(shutdown.clone()));
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        storage.append_as_other_node("a", "1");
        storage.append_as_other_node("a", "2");
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(n.messages.is_empty());
        // Both commits may come in one poll or two; the last head is 3.
        let mut head = n.head;
        assert!(
            head >= 2,
            "the commit before the start cursor was announced"
        );
        while head < 3 {
            head = rx.recv().await.unwrap().head;
        }
        assert_eq!(head, 3);
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_holder_polls_once_then_idles_until_it_is_standby_again() {
        let storage = MemoryStorage::new();
        let lease = FakeLease::holder(FencingToken(1));
        let hub = Hub::new(64);
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        // Committed by the previous holder before this node took over.
        storage.append_as_other_node("a", "0");
        let feed = StandbyFeed::new(
            storage.clone(),
            lease.clone(),
            hub.clone(),
            (0, 0),
            Duration::from_millis(5),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(feed.run(shutdown.clone()));
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.head, 1);
        // While holder, commits are not polled for.
        storage.append_as_other_node("a", "1");
        assert!(tokio::time::timeout(Duration::from_millis(100), rx.recv())
            .await
            .is_err());
        // Standby again: polling resumes.
        lease.set_standby(None);
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.head, 2);
        shutdown.cancel();
        task.await.unwrap();
    }

    /// A standby feed on `storage` whose timers never fire during a test:
    /// only commit signals (or a role change) wake it.
    fn signal_driven(storage: Arc<MemoryStorage>, hub: Arc<Hub>) -> StandbyFeed {
        let lease = FakeLease::holder(FencingToken(1));
        lease.set_standby(Some("http://other"));
        let mut feed = StandbyFeed::new(storage, lease, hub, (0, 0), Duration::from_secs(3600));
        feed.safety_poll = Duration::from_secs(3600);
        feed
    }

    /// A standby feed announcing to a hub, with a receiver of channel
    /// `a`'s notices; started once the feed's first poll (at start) on
    /// `storage` is done.
    struct Running {
        rx: crate::hub::HubReceiver,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Running {
        /// Runs the feed `feed` makes for the hub.
        async fn start(
            storage: &MemoryStorage,
            feed: impl FnOnce(Arc<Hub>) -> StandbyFeed,
        ) -> Self {
            let hub = Hub::new(64);
            let rx = hub.subscribe(&ChannelName::new("a").unwrap());
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(feed(hub).run(shutdown.clone()));
            storage.wait_polls(1).await;
            Self { rx, shutdown, task }
        }

        /// Stops the feed and waits for its task to end.
        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.unwrap();
        }
    }

    fn committed(channel: &str, to: u64) -> ChangeSignal {
        ChangeSignal::Committed {
            channel: ChannelName::new(channel).unwrap(),
            from: to,
            to,
            committed_at_ms: 0,
        }
    }

    async fn next_head(rx: &mut crate::hub::HubReceiver) -> u64 {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("no notice")
            .unwrap()
            .head
    }

    #[tokio::test]
    async fn commit_signals_wake_a_standby() {
        let storage = MemoryStorage::with_signals(4);
        // The first poll at start finds nothing; then only signals wake it.
        let mut feed = Running::start(&storage, |hub| signal_driven(storage.clone(), hub)).await;
        storage.append_as_other_node("a", "1");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), feed.rx.recv())
                .await
                .is_err(),
            "polled without a signal"
        );
        storage.signal(committed("a", 1));
        assert_eq!(next_head(&mut feed.rx).await, 1);
        // A resync wakes it too.
        storage.append_as_other_node("a", "2");
        storage.signal(ChangeSignal::Resync);
        assert_eq!(next_head(&mut feed.rx).await, 2);
        feed.stop().await;
    }

    /// The next notice; fails after 5 s without one.
    async fn next_notice(rx: &mut crate::hub::HubReceiver) -> Arc<Notice> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("no notice")
            .unwrap()
    }

    #[tokio::test]
    async fn a_followed_channel_gets_its_new_messages_with_the_notice_read_once() {
        let storage = MemoryStorage::with_signals(16);
        let mut feed = Running::start(&storage, |hub| signal_driven(storage.clone(), hub)).await;
        // The first notice since the subscriber came: the hub knows no head
        // it was told, so the notice carries nothing and it reads itself.
        storage.append_as_other_node("a", "1");
        storage.signal(committed("a", 1));
        let first = next_notice(&mut feed.rx).await;
        assert_eq!((first.head, first.messages.len()), (1, 0));
        // Two commits in one poll: the notice carries both, read once.
        let reads = storage.reads();
        storage.append_as_other_node("a", "2");
        storage.append_as_other_node("a", "3");
        storage.signal(committed("a", 3));
        let n = next_notice(&mut feed.rx).await;
        assert_eq!(n.head, 3);
        let carried: Vec<(u64, String)> = n
            .messages
            .iter()
            .map(|m| (m.offset, m.data.to_json_text().into_owned()))
            .collect();
        assert_eq!(carried, [(2, "2".to_owned()), (3, "3".to_owned())]);
        assert_eq!(storage.reads() - reads, 1);
        // Further than the read-ahead limit: announced without messages,
        // and nothing read.
        let reads = storage.reads();
        let mut head = 3;
        for i in 0..=READ_AHEAD_LIMIT {
            head = storage.append_as_other_node("a", &i.to_string());
        }
        storage.signal(committed("a", head));
        let n = next_notice(&mut feed.rx).await;
        assert_eq!((n.head, n.messages.len()), (head, 0));
        assert_eq!(storage.reads(), reads);
        feed.stop().await;
    }

    #[tokio::test]
    async fn a_lagged_signal_receiver_resyncs() {
        let storage = MemoryStorage::with_signals(2);
        let mut feed = Running::start(&storage, |hub| signal_driven(storage.clone(), hub)).await;
        for i in 1..=10u64 {
            storage.append_as_other_node("a", &i.to_string());
        }
        // More signals than the buffer holds: the receiver lags, and the
        // feed still announces the last head.
        for i in 1..=10u64 {
            storage.signal(committed("a", i));
        }
        let mut head = next_head(&mut feed.rx).await;
        while head < 10 {
            head = next_head(&mut feed.rx).await;
        }
        assert_eq!(head, 10);
        feed.stop().await;
    }

    /// The next notice's deletion number; fails when it is not a deleted
    /// notice.
    async fn next_deletion(rx: &mut crate::hub::HubReceiver) -> (u64, u64) {
        let notice = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("no notice")
            .unwrap();
        (notice.deleted.expect("a deleted notice"), notice.head)
    }

    fn deletion_signal(channel: &str, head: u64, number: u64) -> ChangeSignal {
        ChangeSignal::Deleted(Deletion {
            channel: ChannelName::new(channel).unwrap(),
            head,
            number,
        })
    }

    #[tokio::test]
    async fn a_deletion_signal_is_announced_at_once() {
        let storage = MemoryStorage::with_signals(4);
        let mut feed = Running::start(&storage, |hub| signal_driven(storage.clone(), hub)).await;
        storage.append_as_other_node("a", "1");
        let number = storage.delete_as_other_node("a");
        storage.signal(deletion_signal("a", 1, number));
        assert_eq!(next_deletion(&mut feed.rx).await, (number, 1));
        feed.stop().await;
    }

    /// A deletion whose signal was lost is read from the storage at the
    /// resync that follows a reconnect of the listener.
    #[tokio::test]
    async fn a_resync_reads_the_deletions_whose_signal_was_lost() {
        let storage = MemoryStorage::with_signals(4);
        let mut feed = Running::start(&storage, |hub| signal_driven(storage.clone(), hub)).await;
        storage.append_as_other_node("a", "1");
        let number = storage.delete_as_other_node("a");
        // A commit signal asks only for moved channels.
        storage.signal(committed("a", 1));
        assert_eq!(next_head(&mut feed.rx).await, 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), feed.rx.recv())
                .await
                .is_err(),
            "read the deletions without a resync"
        );
        storage.signal(ChangeSignal::Resync);
        assert_eq!(next_deletion(&mut feed.rx).await, (number, 1));
        feed.stop().await;
    }

    /// Without signals (SQLite), every poll reads the deletions too.
    #[tokio::test]
    async fn a_polling_standby_reads_the_deletions() {
        let storage = MemoryStorage::new();
        let lease = FakeLease::holder(FencingToken(1));
        lease.set_standby(Some("http://other"));
        let mut feed = Running::start(&storage, |hub| {
            StandbyFeed::new(
                storage.clone(),
                lease,
                hub,
                (0, 0),
                Duration::from_millis(5),
            )
        })
        .await;
        let number = storage.delete_as_other_node("a");
        assert_eq!(next_deletion(&mut feed.rx).await, (number, 0));
        feed.stop().await;
    }

    #[tokio::test]
    async fn without_signals_the_standby_falls_back_to_polling() {
        let storage = MemoryStorage::with_signals(4);
        let mut feed = Running::start(&storage, |hub| {
            let mut feed = signal_driven(storage.clone(), hub);
            feed.interval = Duration::from_millis(5);
            feed
        })
        .await;
        storage.close_signals();
        storage.append_as_other_node("a", "1");
        assert_eq!(next_head(&mut feed.rx).await, 1);
        storage.append_as_other_node("a", "2");
        assert_eq!(next_head(&mut feed.rx).await, 2);
        feed.stop().await;
    }
}
