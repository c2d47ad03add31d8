//! Live notices on a standby: another process on the same database writes,
//! so this node learns of new messages by asking the storage which channels
//! moved (`Storage::changes_since`) and publishes a head-moved notice (no
//! messages) per moved channel. Subscribers read the messages themselves.
//!
//! When the storage signals commits (`Storage::watch_changes`, PostgreSQL),
//! the feed asks at each signal (a commit, a resync, or a lagged signal
//! receiver, which may have missed commits) and besides every
//! [`SAFETY_POLL`], in case a signal was lost; otherwise it polls every
//! `standby_poll_interval`.
//!
//! While this node is holder its own writer publishes notices; the feed then
//! polls once more (to announce what the previous holder committed last) and
//! waits for the role to change, without polling, dropping commit signals.
//!
//! The test-only fault switch `drop_notify` acts here: see
//! `herald_core::fault_switches::FaultSwitch::DropNotify`, and [`Turn`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_core::fault_switches::{self, FaultSwitch};
use herald_lease::LeaseState;
use herald_storage::{ChangeSignal, Storage};
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, Notice};
use crate::metrics;
use crate::role::LeaseView;

/// How often a standby that receives commit signals still polls, in case a
/// signal was lost.
pub(crate) const SAFETY_POLL: Duration = Duration::from_secs(1);

/// The standby feed task's state.
pub(crate) struct StandbyFeed {
    storage: Arc<dyn Storage>,
    lease: Arc<dyn LeaseView>,
    hub: Arc<Hub>,
    /// Position in the storage's commit order up to which notices were sent.
    cursor: u64,
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
    /// A poll period passed, or a commit signal (or several) arrived.
    Poll,
    /// The lease state changed.
    RoleChanged,
    /// The lease supervisor is gone: its state no longer changes.
    SupervisorGone,
    /// The storage's signal sender is gone: fall back to polling.
    SignalsClosed,
}

/// How a standby's next turn begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Poll the storage, then wait: at start, after being holder, and after
    /// every wake but the one below.
    Poll,
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
    /// A feed that announces changes committed after `cursor`.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        hub: Arc<Hub>,
        cursor: u64,
        interval: Duration,
    ) -> Self {
        Self {
            storage,
            lease,
            hub,
            cursor,
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
            if turn == Turn::Poll {
                self.poll().await;
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
                open = drain_signals(&mut inputs.signals, true), if has_signals => {
                    if open { Wake::Poll } else { Wake::SignalsClosed }
                }
            };
            turn = match wake {
                Wake::Shutdown => return,
                Wake::Poll => Turn::Poll,
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
        self.poll().await;
        while self.lease.is_holder() && inputs.states.is_some() {
            let has_signals = inputs.signals.is_some();
            let wake = tokio::select! {
                () = shutdown.cancelled() => Wake::Shutdown,
                wake = role_changed(&mut inputs.states) => wake,
                open = drain_signals(&mut inputs.signals, false), if has_signals => {
                    if open { Wake::Poll } else { Wake::SignalsClosed }
                }
            };
            match wake {
                Wake::Shutdown => return AfterHolder::Stop,
                Wake::SupervisorGone => inputs.states = None,
                Wake::SignalsClosed => inputs.signals = None,
                Wake::Poll | Wake::RoleChanged => {}
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

    /// Announces every channel that moved since the cursor.
    async fn poll(&mut self) {
        match self.storage.changes_since(self.cursor).await {
            Ok(feed) => {
                if self.failing {
                    tracing::info!("standby feed: storage answers again");
                    self.failing = false;
                }
                self.cursor = feed.cursor;
                for moved in feed.changed {
                    self.hub.publish(Notice {
                        deleted: false,
                        channel: moved.name,
                        head: moved.head,
                        messages: Vec::new(),
                    });
                }
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!(error = %e, "standby feed: cannot read changes; live subscribers wait");
                    self.failing = true;
                }
            }
        }
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
/// `false` when the sender is gone (or there is no receiver). Cancel-safe:
/// a signal taken is only measured, and the caller polls after any wake.
async fn drain_signals(
    signals: &mut Option<broadcast::Receiver<ChangeSignal>>,
    measure: bool,
) -> bool {
    let Some(rx) = signals.as_mut() else {
        return false;
    };
    match rx.recv().await {
        Ok(signal) => observe(&signal, measure),
        // Missed signals: a resync, which the poll is.
        Err(RecvError::Lagged(_)) => {}
        Err(RecvError::Closed) => return false,
    }
    loop {
        match rx.try_recv() {
            Ok(signal) => observe(&signal, measure),
            Err(TryRecvError::Lagged(_)) => {}
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Closed) => return false,
        }
    }
}

/// Records how long a commit signal took to arrive (local wall clock now
/// minus the commit time, clamped at 0).
fn observe(signal: &ChangeSignal, measure: bool) {
    if let (
        true,
        ChangeSignal::Committed {
            committed_at_ms, ..
        },
    ) = (measure, signal)
    {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let lag_ms = now_ms.saturating_sub(*committed_at_ms).max(0);
        metrics::notify_lag(lag_ms as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use herald_core::{ChannelName, FencingToken};

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
            cursor,
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
            0,
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
        let mut feed = StandbyFeed::new(storage, lease, hub, 0, Duration::from_secs(3600));
        feed.safety_poll = Duration::from_secs(3600);
        feed
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
        let hub = Hub::new(64);
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(signal_driven(storage.clone(), hub.clone()).run(shutdown.clone()));
        // The first poll at start finds nothing; then only signals wake it.
        storage.wait_polls(1).await;
        storage.append_as_other_node("a", "1");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), rx.recv())
                .await
                .is_err(),
            "polled without a signal"
        );
        storage.signal(committed("a", 1));
        assert_eq!(next_head(&mut rx).await, 1);
        // A resync wakes it too.
        storage.append_as_other_node("a", "2");
        storage.signal(ChangeSignal::Resync);
        assert_eq!(next_head(&mut rx).await, 2);
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_lagged_signal_receiver_resyncs() {
        let storage = MemoryStorage::with_signals(2);
        let hub = Hub::new(64);
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        let feed = signal_driven(storage.clone(), hub.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(feed.run(shutdown.clone()));
        storage.wait_polls(1).await;
        for i in 1..=10u64 {
            storage.append_as_other_node("a", &i.to_string());
        }
        // More signals than the buffer holds: the receiver lags, and the
        // feed still announces the last head.
        for i in 1..=10u64 {
            storage.signal(committed("a", i));
        }
        let mut head = next_head(&mut rx).await;
        while head < 10 {
            head = next_head(&mut rx).await;
        }
        assert_eq!(head, 10);
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn without_signals_the_standby_falls_back_to_polling() {
        let storage = MemoryStorage::with_signals(4);
        let hub = Hub::new(64);
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        let mut feed = signal_driven(storage.clone(), hub.clone());
        feed.interval = Duration::from_millis(5);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(feed.run(shutdown.clone()));
        storage.wait_polls(1).await;
        storage.close_signals();
        storage.append_as_other_node("a", "1");
        assert_eq!(next_head(&mut rx).await, 1);
        storage.append_as_other_node("a", "2");
        assert_eq!(next_head(&mut rx).await, 2);
        shutdown.cancel();
        task.await.unwrap();
    }
}
