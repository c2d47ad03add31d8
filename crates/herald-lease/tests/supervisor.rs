//! The lease supervisor's timing policy, under tokio's paused clock and a
//! fake lease store: no test here waits in real time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use herald_core::{Candidate, FencingToken, Lease, LeaseInfo};
use herald_lease::{
    Clock, ClockInstant, LeaseConfig, LeaseHandle, LeaseState, Release, StopReason, Supervisor,
    TokioClock,
};
use herald_storage::{Acquire, Error, LeaseStore, Result, TakeoverReason};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How the fake answers renewals.
#[derive(Clone)]
enum Renewal {
    /// Extends the lease at once.
    Ok,
    /// Fails at once with an `Unavailable` error.
    Fail,
    /// Never answers.
    Hang,
    /// Extends the lease on the "server" after this delay, whether or not
    /// the client still waits (a statement that commits after the client
    /// abandoned it).
    CommitAfter(Duration),
    /// Takes the lease row's lock ([`FakeStore::row_lock`]), as a renewal
    /// transaction's `FOR NO KEY UPDATE` does, then never answers: the
    /// lock is held until the attempt is dropped.
    HoldRow,
}

/// An in-memory lease row on tokio's clock.
struct Row {
    holder: Option<String>,
    token: u64,
    expires_at: Instant,
}

struct FakeStore {
    row: Mutex<Row>,
    /// The lease row's lock: taken by a [`Renewal::HoldRow`] attempt and
    /// by every release.
    row_lock: tokio::sync::Mutex<()>,
    renewal: Mutex<Renewal>,
    /// Instants (since `t0`) at which renewals were sent.
    renew_calls: Mutex<Vec<Duration>>,
    releases: Mutex<u32>,
    /// Releases fail with an `Unavailable` error.
    release_fails: Mutex<bool>,
    /// Wakes standbys waiting on a takeover hint.
    hint: tokio::sync::Notify,
    /// The takeover hint resolves at once, every time.
    hint_always: Mutex<bool>,
    /// Acquire attempts so far.
    acquires: Mutex<u32>,
    t0: Instant,
}

impl FakeStore {
    fn new(holder: Option<&str>, expires_in: Duration) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            row: Mutex::new(Row {
                holder: holder.map(str::to_owned),
                token: u64::from(holder.is_some()),
                expires_at: now + expires_in,
            }),
            row_lock: tokio::sync::Mutex::new(()),
            renewal: Mutex::new(Renewal::Ok),
            renew_calls: Mutex::new(Vec::new()),
            releases: Mutex::new(0),
            release_fails: Mutex::new(false),
            hint: tokio::sync::Notify::new(),
            hint_always: Mutex::new(false),
            acquires: Mutex::new(0),
            t0: now,
        })
    }

    fn set_renewal(&self, r: Renewal) {
        *self.renewal.lock().unwrap() = r;
    }

    fn renew_calls(&self) -> Vec<Duration> {
        self.renew_calls.lock().unwrap().clone()
    }

    /// Another node takes the lease over (as after expiry elsewhere).
    fn steal(&self, by: &str) {
        let mut row = self.row.lock().unwrap();
        row.holder = Some(by.to_owned());
        row.token += 1;
        row.expires_at = Instant::now() + Duration::from_secs(30);
    }

    fn release_by(&self, who: &str) {
        let mut row = self.row.lock().unwrap();
        if row.holder.as_deref() == Some(who) {
            row.holder = None;
            row.expires_at = Instant::now();
        }
    }

    fn extend(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let mut row = self.row.lock().unwrap();
        let now = Instant::now();
        if row.holder.as_deref() == Some(lease.holder.as_str())
            && row.token == lease.token.0
            && row.expires_at > now
        {
            row.expires_at = now + ttl;
            Ok(())
        } else {
            Err(Error::LeaseLost {
                name: lease.name.clone(),
                token: lease.token,
            })
        }
    }
}

/// The fake as the supervisor sees it.
struct Shared(Arc<FakeStore>);

#[async_trait]
impl LeaseStore for Shared {
    async fn acquire(&self, c: &Candidate, ttl: Duration) -> Result<Acquire> {
        *self.0.acquires.lock().unwrap() += 1;
        let mut row = self.0.row.lock().unwrap();
        let now = Instant::now();
        if row.holder.is_some() && row.expires_at > now {
            return Ok(Acquire::Held(LeaseInfo {
                name: c.lease_name.clone(),
                holder: row.holder.clone(),
                holder_url: Some("http://other".into()),
                token: FencingToken(row.token),
                expires_in_ms: (row.expires_at - now).as_millis() as i64,
                renewed_ms_ago: 0,
            }));
        }
        let reason = if row.holder.is_none() {
            TakeoverReason::Released
        } else {
            TakeoverReason::Expired
        };
        row.holder = Some(c.node_id.clone());
        row.token += 1;
        row.expires_at = now + ttl;
        Ok(Acquire::Acquired {
            lease: Lease {
                name: c.lease_name.clone(),
                holder: c.node_id.clone(),
                holder_url: c.advertise_url.clone(),
                token: FencingToken(row.token),
            },
            reason,
        })
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        self.0
            .renew_calls
            .lock()
            .unwrap()
            .push(Instant::now() - self.0.t0);
        let behaviour = self.0.renewal.lock().unwrap().clone();
        match behaviour {
            Renewal::Ok => self.0.extend(lease, ttl),
            Renewal::Fail => Err(Error::unavailable("injected failure")),
            Renewal::Hang => std::future::pending().await,
            Renewal::CommitAfter(d) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let me = self.0.clone();
                let lease = lease.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let _ = tx.send(me.extend(&lease, ttl));
                });
                rx.await.unwrap_or(Err(Error::unavailable("gone")))
            }
            Renewal::HoldRow => {
                let _row = self.0.row_lock.lock().await;
                std::future::pending().await
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        *self.0.releases.lock().unwrap() += 1;
        let _row = self.0.row_lock.lock().await;
        if *self.0.release_fails.lock().unwrap() {
            return Err(Error::unavailable("release refused by the test"));
        }
        self.0.release_by(&lease.holder);
        Ok(())
    }

    async fn lease_info(&self, _name: &str) -> Result<Option<LeaseInfo>> {
        Ok(None)
    }

    async fn takeover_counts(&self, _name: &str) -> Result<Vec<herald_storage::TakeoverCount>> {
        Ok(Vec::new())
    }

    async fn takeover_hint(&self, _held: &LeaseInfo) {
        let notified = self.0.hint.notified();
        if *self.0.hint_always.lock().unwrap() {
            return;
        }
        notified.await;
    }
}

fn candidate() -> Candidate {
    Candidate {
        lease_name: "writer".into(),
        node_id: "node-a".into(),
        advertise_url: "http://node-a".into(),
    }
}

/// ttl 30 s, margin 5 s (safety window 25 s), renew every 5 s, retry every
/// 1 s, attempts abandoned after `attempt` s, acquire every 1 s.
fn config(attempt: f64) -> LeaseConfig {
    LeaseConfig {
        renew_attempt_timeout: Duration::from_secs_f64(attempt),
        ..LeaseConfig::default()
    }
}

struct Node {
    handle: LeaseHandle,
    task: tokio::task::JoinHandle<StopReason>,
    shutdown: CancellationToken,
    t0: Instant,
}

fn start(store: &Arc<FakeStore>, config: LeaseConfig, clock: Arc<dyn Clock>) -> Node {
    let shutdown = CancellationToken::new();
    let (handle, task) = Supervisor::start(
        Arc::new(Shared(store.clone())),
        candidate(),
        config,
        clock,
        shutdown.clone(),
    );
    Node {
        handle,
        task,
        shutdown,
        t0: Instant::now(),
    }
}

impl Node {
    async fn at(&self, secs: f64) {
        tokio::time::sleep_until(self.t0 + Duration::from_secs_f64(secs)).await;
    }

    /// The safety deadline, as time since the clock's origin.
    fn deadline(&self) -> Option<Duration> {
        match self.handle.state() {
            LeaseState::Holder {
                safety_deadline, ..
            } => Some(safety_deadline.since_origin()),
            _ => None,
        }
    }
}

/// The supervisor's exit; fails the test instead of hanging when it never
/// comes (the paused clock makes the ten virtual minutes instant).
async fn exit_of(task: tokio::task::JoinHandle<StopReason>) -> StopReason {
    tokio::time::timeout(Duration::from_secs(600), task)
        .await
        .expect("the supervisor never stopped")
        .unwrap()
}

fn secs(v: &[f64]) -> Vec<Duration> {
    v.iter().map(|s| Duration::from_secs_f64(*s)).collect()
}

#[tokio::test(start_paused = true)]
async fn holder_renews_every_interval_and_moves_the_deadline() {
    let store = FakeStore::new(None, Duration::ZERO);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(0.1).await;
    assert!(node.handle.is_holder());
    assert_eq!(node.deadline(), Some(Duration::from_secs(25)));
    node.at(16.0).await;
    assert_eq!(store.renew_calls(), secs(&[5.0, 10.0, 15.0]));
    assert_eq!(node.deadline(), Some(Duration::from_secs(40)));
    assert_eq!(
        node.handle.since_last_renewal(),
        Some(Duration::from_secs(1))
    );
    assert_eq!(node.handle.writable_lease().unwrap().token, FencingToken(1));
}

#[tokio::test(start_paused = true)]
async fn failed_renewals_retry_every_second_and_the_node_stays_holder() {
    let store = FakeStore::new(None, Duration::ZERO);
    store.set_renewal(Renewal::Fail);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(8.5).await;
    assert_eq!(store.renew_calls(), secs(&[5.0, 6.0, 7.0, 8.0]));
    assert!(
        node.handle.is_holder(),
        "a failed renewal is no reason to stop"
    );
    store.set_renewal(Renewal::Ok);
    node.at(9.5).await;
    assert_eq!(node.deadline(), Some(Duration::from_secs(34)));
    node.at(14.5).await;
    assert_eq!(store.renew_calls().last(), Some(&Duration::from_secs(14)));
}

#[tokio::test(start_paused = true)]
async fn watchdog_stops_the_node_at_the_safety_deadline_when_renewals_hang() {
    let store = FakeStore::new(None, Duration::ZERO);
    store.set_renewal(Renewal::Hang);
    let mut cfg = config(4.0);
    cfg.safety_margin = Duration::from_millis(4500); // deadline 25.5 s
    let node = start(&store, cfg, Arc::new(TokioClock::new()));
    node.at(25.4).await;
    assert!(node.handle.is_holder());
    // Attempts: sent at 5, abandoned at 9, retried 1 s later, and so on.
    assert_eq!(store.renew_calls(), secs(&[5.0, 10.0, 15.0, 20.0, 25.0]));
    node.at(25.5).await;
    assert!(!node.handle.is_holder());
    let exit = exit_of(node.task).await;
    let StopReason::Watchdog(record) = exit else {
        panic!("expected a watchdog stop, got {exit:?}");
    };
    assert_eq!(record.token, FencingToken(1));
    assert_eq!(record.watchdog_late_by, Duration::ZERO);
    assert_eq!(
        record.attempt_in_flight_for,
        Some(Duration::from_millis(500))
    );
    assert!(record
        .last_renewal_error
        .as_deref()
        .unwrap()
        .contains("abandoned after 4000 ms"));
    assert!(matches!(
        node.handle.state(),
        LeaseState::Stopped {
            reason: StopReason::Watchdog(_)
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_late_success_of_an_abandoned_attempt_never_moves_the_deadline() {
    let store = FakeStore::new(None, Duration::ZERO);
    // The attempt sent at 5 s commits on the "server" at 15 s; the client
    // abandoned it at 11 s.
    store.set_renewal(Renewal::CommitAfter(Duration::from_secs(10)));
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(11.1).await;
    store.set_renewal(Renewal::Hang);
    node.at(16.0).await;
    assert_eq!(
        node.deadline(),
        Some(Duration::from_secs(25)),
        "the deadline counts from the last success the client saw"
    );
    node.at(25.0).await;
    assert!(matches!(exit_of(node.task).await, StopReason::Watchdog(_)));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_finds_the_lease_lost_stops_at_once() {
    let store = FakeStore::new(None, Duration::ZERO);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(7.0).await;
    store.steal("node-b");
    assert!(node.handle.is_holder(), "nothing has told the node yet");
    node.at(10.0).await;
    let t0 = node.t0;
    let exit = exit_of(node.task).await;
    assert_eq!(
        exit,
        StopReason::LeaseLost {
            token: FencingToken(1)
        }
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(10));
    assert!(node.handle.writable_lease().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_fenced_write_that_finds_the_lease_lost_stops_the_node() {
    let store = FakeStore::new(None, Duration::ZERO);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(1.0).await;
    node.handle.report_lease_lost(FencingToken(99)); // not ours: ignored
    node.at(2.0).await;
    assert!(node.handle.is_holder());
    node.handle.report_lease_lost(FencingToken(1));
    let t0 = node.t0;
    let exit = exit_of(node.task).await;
    assert_eq!(
        exit,
        StopReason::LeaseLost {
            token: FencingToken(1)
        }
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_reported_while_a_renewal_waits_stops_at_once() {
    let store = FakeStore::new(None, Duration::ZERO);
    store.set_renewal(Renewal::Hang);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(7.0).await; // the renewal sent at 5 s is still waiting
    assert!(node.handle.is_holder());
    node.handle.report_lease_lost(FencingToken(1));
    let t0 = node.t0;
    let exit = exit_of(node.task).await;
    assert_eq!(
        exit,
        StopReason::LeaseLost {
            token: FencingToken(1)
        }
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(7));
}

#[tokio::test(start_paused = true)]
async fn drain_releases_the_lease_and_leaves_no_watchdog_behind() {
    let store = FakeStore::new(None, Duration::ZERO);
    store.set_renewal(Renewal::Hang);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(7.0).await; // a renewal is in flight
    node.shutdown.cancel();
    let Node {
        handle, task, t0, ..
    } = node;
    let exit = exit_of(task).await;
    assert_eq!(
        exit,
        StopReason::Drained {
            release: Release::Released,
        }
    );
    assert_eq!(*store.releases.lock().unwrap(), 1);
    assert!(store.row.lock().unwrap().holder.is_none());
    // Far past the old safety deadline nothing fires.
    tokio::time::sleep_until(t0 + Duration::from_secs(120)).await;
    assert_eq!(
        handle.state(),
        LeaseState::Stopped {
            reason: StopReason::Drained {
                release: Release::Released,
            }
        }
    );
}

/// A drain while a renewal attempt holds the lease row (its transaction
/// took the row lock and waits for its next statement) still releases at
/// once: the drain gives up the attempt, which frees the row, instead of
/// leaving it unpolled until the release times out.
#[tokio::test(start_paused = true)]
async fn a_drain_gives_up_a_renewal_that_holds_the_row_and_releases() {
    let store = FakeStore::new(None, Duration::ZERO);
    store.set_renewal(Renewal::HoldRow);
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(7.0).await; // the renewal sent at 5 s holds the row
    assert!(
        store.row_lock.try_lock().is_err(),
        "the renewal holds the row"
    );
    node.shutdown.cancel();
    let exit = exit_of(node.task).await;
    assert_eq!(
        exit,
        StopReason::Drained {
            release: Release::Released,
        }
    );
    assert!(store.row.lock().unwrap().holder.is_none());
    assert_eq!(Instant::now() - node.t0, Duration::from_secs(7));
}

/// A drain counts as clean (exit 0) only when the lease was released or
/// never held: a failed release is reported as such.
#[tokio::test(start_paused = true)]
async fn a_drain_whose_release_fails_says_so() {
    let store = FakeStore::new(None, Duration::ZERO);
    *store.release_fails.lock().unwrap() = true;
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(1.0).await;
    assert!(node.handle.is_holder());
    node.shutdown.cancel();
    let handle = node.handle.clone();
    let exit = exit_of(node.task).await;
    assert_eq!(
        exit,
        StopReason::Drained {
            release: Release::Failed
        }
    );
    assert_eq!(*store.releases.lock().unwrap(), 1);
    assert_eq!(handle.state(), LeaseState::Stopped { reason: exit });
}

/// A standby that drains had nothing to release.
#[tokio::test(start_paused = true)]
async fn a_standby_drains_without_a_lease_to_release() {
    let store = FakeStore::new(Some("node-b"), Duration::from_secs(30));
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(1.0).await;
    assert!(!node.handle.is_holder());
    node.shutdown.cancel();
    let exit = exit_of(node.task).await;
    assert_eq!(
        exit,
        StopReason::Drained {
            release: Release::NotHeld
        }
    );
    assert_eq!(*store.releases.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_standby_acquires_within_one_interval_of_a_release() {
    let store = FakeStore::new(Some("node-b"), Duration::from_secs(30));
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(3.2).await;
    match node.handle.state() {
        LeaseState::Standby { holder: Some(info) } => {
            assert_eq!(info.holder.as_deref(), Some("node-b"))
        }
        other => panic!("expected standby, got {other:?}"),
    }
    assert!(node.handle.writable_lease().is_none());
    store.release_by("node-b");
    let state = node
        .handle
        .wait_for(|s| matches!(s, LeaseState::Holder { .. }))
        .await
        .unwrap();
    assert_eq!(Instant::now() - node.t0, Duration::from_secs(4));
    let LeaseState::Holder { lease, .. } = state else {
        unreachable!()
    };
    assert_eq!(lease.token, FencingToken(2));
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_an_expired_lease() {
    let store = FakeStore::new(Some("node-b"), Duration::from_millis(2500));
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.handle
        .wait_for(|s| matches!(s, LeaseState::Holder { .. }))
        .await
        .unwrap();
    // Right after the expiry, not on the next acquire period (3 s).
    assert_eq!(Instant::now() - node.t0, Duration::from_millis(2501));
}

/// A takeover hint (the holder's session ended, or it released) wakes the
/// standby at once instead of on its next acquire period.
#[tokio::test(start_paused = true)]
async fn a_takeover_hint_wakes_the_standby_at_once() {
    let store = FakeStore::new(Some("node-b"), Duration::from_secs(30));
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(0.3).await;
    assert!(!node.handle.is_holder());
    store.release_by("node-b");
    store.hint.notify_waiters();
    node.handle
        .wait_for(|s| matches!(s, LeaseState::Holder { .. }))
        .await
        .unwrap();
    assert_eq!(Instant::now() - node.t0, Duration::from_millis(300));
}

/// A hint that fires although nothing changed does not become a busy loop:
/// attempts stay at least 20 ms apart.
#[tokio::test(start_paused = true)]
async fn a_hint_that_always_fires_does_not_spin() {
    let store = FakeStore::new(Some("node-b"), Duration::from_secs(30));
    *store.hint_always.lock().unwrap() = true;
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(1.0).await;
    let attempts = *store.acquires.lock().unwrap();
    assert!(!node.handle.is_holder());
    assert!((2..=51).contains(&attempts), "{attempts} attempts in 1 s");
}

/// Tokio's clock plus a jump, standing in for `CLOCK_BOOTTIME` running on
/// while `CLOCK_MONOTONIC` (tokio's timer) stood still during a suspend.
struct SuspendableClock {
    inner: TokioClock,
    jumped: Mutex<Duration>,
}

impl Clock for SuspendableClock {
    fn now(&self) -> ClockInstant {
        self.inner.now() + *self.jumped.lock().unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_suspend_writes_stop_at_once_and_the_watchdog_fires_within_a_tick() {
    let store = FakeStore::new(None, Duration::ZERO);
    let clock = Arc::new(SuspendableClock {
        inner: TokioClock::new(),
        jumped: Mutex::new(Duration::ZERO),
    });
    let node = start(&store, config(6.0), clock.clone());
    node.at(1.0).await;
    assert!(node.handle.is_holder());
    *clock.jumped.lock().unwrap() = Duration::from_secs(60);
    assert!(
        node.handle.writable_lease().is_none(),
        "no write may start past the deadline, even before the watchdog runs"
    );
    let t0 = node.t0;
    let exit = exit_of(node.task).await;
    let StopReason::Watchdog(record) = exit else {
        panic!("expected a watchdog stop, got {exit:?}");
    };
    assert!(Instant::now() - t0 <= Duration::from_millis(1250));
    assert!(record.watchdog_late_by >= Duration::from_secs(36));
}

/// The period between renewals counts from each renewal's send, like the
/// safety deadline: renewals answered 2 s late are still sent every 5 s,
/// not every 7 s.
#[tokio::test(start_paused = true)]
async fn slow_renewals_keep_their_period_from_the_send() {
    let store = FakeStore::new(None, Duration::ZERO);
    store.set_renewal(Renewal::CommitAfter(Duration::from_secs(2)));
    let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
    node.at(21.0).await;
    assert_eq!(store.renew_calls(), secs(&[5.0, 10.0, 15.0, 20.0]));
    assert_eq!(node.deadline(), Some(Duration::from_secs(40)));
}

/// A lost lease and a drain seen at the same moment: the lost lease is the
/// node's reason (exit status 4), never a drain (exit status 0), whatever
/// order the supervisor's task finds them in.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_wins_over_a_simultaneous_drain() {
    for _ in 0..32 {
        let store = FakeStore::new(None, Duration::ZERO);
        let node = start(&store, config(6.0), Arc::new(TokioClock::new()));
        node.at(1.0).await;
        assert!(node.handle.is_holder());
        // Both before the supervisor's task runs again.
        node.handle.report_lease_lost(FencingToken(1));
        node.shutdown.cancel();
        let exit = exit_of(node.task).await;
        assert_eq!(
            exit,
            StopReason::LeaseLost {
                token: FencingToken(1)
            }
        );
        assert_eq!(
            node.handle.state(),
            LeaseState::Stopped {
                reason: StopReason::LeaseLost {
                    token: FencingToken(1)
                }
            }
        );
    }
}
