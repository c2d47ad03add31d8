//! The supervisor's task: the standby's acquire loop, then the holder's
//! loop, each one `select!` whose outcome is an event handled by a flat
//! `match`; and the watchdog, a task of its own.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{Candidate, FencingToken, Lease, LeaseInfo};
use herald_storage::{Acquire, Error as StorageError, LeaseStore};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::error::Elapsed;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn, Instrument};

use crate::clock::{Clock, ClockInstant};
use crate::config::LeaseConfig;
use crate::state::{LeaseHandle, LeaseState, Release, StopReason, WatchdogRecord};

/// Longest the watchdog sleeps between two looks at the clock. Tokio's timer
/// runs on `CLOCK_MONOTONIC`, which stops during suspend; waking this often
/// lets the watchdog notice a suspend (seen on [`crate::clock::BootClock`]) quickly.
const WATCHDOG_TICK: Duration = Duration::from_millis(250);

/// Shortest time between the starts of two acquire attempts woken by a
/// takeover hint.
const MIN_ATTEMPT_GAP: Duration = Duration::from_millis(20);
/// How long after the expiry of a lease found held (as the storage computed
/// it when it answered) a standby tries again.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// Runs the lease's timing policy for one node (see the crate docs).
#[derive(Debug)]
pub struct Supervisor;

impl Supervisor {
    /// Starts the supervisor task: standby until it acquires, then holder
    /// until drain (`shutdown` cancelled), the watchdog, or a lost lease.
    /// On drain it releases the lease if it holds it. The task's result says
    /// why it ended; the watchdog's and a lost lease's are also published as
    /// [`LeaseState::Stopped`] the moment they happen.
    ///
    /// The task and its watchdog run in a tracing span `lease` with the
    /// fields `node_id` and `lease` (the lease's name): every log record
    /// made in them carries both.
    pub fn start(
        store: Arc<dyn LeaseStore>,
        candidate: Candidate,
        config: LeaseConfig,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> (LeaseHandle, JoinHandle<StopReason>) {
        let (state_tx, state_rx) = watch::channel(LeaseState::Starting);
        let (lost_tx, lost_rx) = mpsc::unbounded_channel();
        let handle = LeaseHandle::new(state_rx, clock.clone(), lost_tx, config.safe_window());
        // At ERROR level so that no filter leaves its fields off the
        // records that need them most.
        let span = tracing::error_span!(
            "lease",
            node_id = %candidate.node_id,
            lease = %candidate.lease_name,
        );
        let run = Run {
            store,
            candidate,
            config,
            clock,
            shutdown,
            state: Arc::new(state_tx),
            lost: lost_rx,
        };
        (handle, tokio::spawn(run.run().instrument(span)))
    }
}

/// The supervisor task's state.
struct Run {
    store: Arc<dyn LeaseStore>,
    candidate: Candidate,
    config: LeaseConfig,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
    /// Shared with the watchdog task, which may publish `Stopped` on its own.
    state: Arc<watch::Sender<LeaseState>>,
    /// Tokens of fenced writes that found the lease lost.
    lost: mpsc::UnboundedReceiver<FencingToken>,
}

/// What the renewal loop tells the watchdog about the attempt in flight.
#[derive(Debug, Default)]
struct Progress {
    /// Clock instant at which the current attempt was sent, if one is running.
    in_flight_since: Option<ClockInstant>,
    /// Wall-clock time at which the last successful renewal was sent.
    last_success_wall: Option<SystemTime>,
    /// The last failed attempt's error.
    last_error: Option<String>,
}

/// What a standby's acquire attempt came to.
enum Acquisition {
    /// This node is now holder; the acquisition was sent at this instant.
    Acquired(Lease, ClockInstant),
    /// Another node holds the lease, until `expires` (on tokio's timer, from
    /// the expiry the storage computed).
    Held {
        /// The lease row as the storage answered.
        info: LeaseInfo,
        /// When the lease found held expires, plus [`EXPIRY_SLACK`].
        expires: Instant,
    },
    /// The attempt failed or timed out (logged).
    Failed,
    /// Drain came first.
    Drain,
}

/// What ends a standby's wait between two acquire attempts.
enum Wake {
    /// Drain: stop without having held the lease.
    Drain,
    /// The next attempt is due.
    AttemptDue,
    /// The storage hints that the holder is gone or released the lease.
    TakeoverHint,
}

/// What the holder's loop acts on, in the order it looks at them: when
/// several are ready at once, the stop that says the lease is gone wins
/// over a drain, and every stop over the renewal.
enum Event {
    /// The watchdog stopped the node (it published `Stopped` itself).
    WatchdogFired,
    /// A fenced write found the lease lost; stops the node if the token is
    /// this holder's.
    LeaseLost(FencingToken),
    /// Drain: release the lease and end.
    Drain,
    /// The next renewal is due.
    Tick,
    /// The renewal in flight answered, or was abandoned.
    Renewed(Renewed),
}

/// A renewal's answer: the storage's, or `Elapsed` when the supervisor
/// abandoned the attempt after the renew attempt timeout.
type RenewAnswer = Result<herald_storage::Result<()>, Elapsed>;

/// A renewal attempt waiting for its answer.
type RenewAttempt = Pin<Box<dyn Future<Output = RenewAnswer> + Send>>;

/// The holder's renewal: waiting until the next one is due, or one in
/// flight.
enum Renewal {
    /// The next renewal is sent at this instant of tokio's timer.
    Due(Instant),
    /// A renewal was sent and has not answered yet.
    InFlight {
        /// When it was sent, on the supervisor's clock.
        sent: ClockInstant,
        /// When it was sent, on tokio's timer (renewal period and duration).
        started: Instant,
        /// The attempt, bounded by the renew attempt timeout.
        answer: RenewAttempt,
    },
}

/// A renewal attempt that answered or was abandoned.
struct Renewed {
    /// When it was sent, on the supervisor's clock.
    sent: ClockInstant,
    /// When it was sent, on tokio's timer.
    started: Instant,
    /// What came of it.
    answer: RenewAnswer,
}

impl Renewal {
    /// Waits until the next renewal is due ([`Event::Tick`]) or the one in
    /// flight has its answer ([`Event::Renewed`]; the caller then replaces
    /// `self`).
    ///
    /// # Cancel safety
    /// Cancel-safe: a wait dropped before it completes leaves the due
    /// instant or the attempt in flight as it was, to be waited on again.
    async fn next(&mut self) -> Event {
        match self {
            Renewal::Due(at) => {
                tokio::time::sleep_until(*at).await;
                Event::Tick
            }
            Renewal::InFlight {
                sent,
                started,
                answer,
            } => {
                let answer = answer.as_mut().await;
                Event::Renewed(Renewed {
                    sent: *sent,
                    started: *started,
                    answer,
                })
            }
        }
    }
}

impl Run {
    async fn run(mut self) -> StopReason {
        let exit = match self.standby().await {
            Some((lease, sent)) => self.holder(lease, sent).await,
            None => StopReason::Drained {
                release: Release::NotHeld,
            },
        };
        self.stop(exit.clone());
        exit
    }

    /// Tries to acquire every acquire interval. Returns the lease once
    /// acquired with the clock instant its acquisition was sent, or `None`
    /// on drain.
    async fn standby(&self) -> Option<(Lease, ClockInstant)> {
        while !self.shutdown.is_cancelled() {
            let attempt_started = Instant::now();
            // The next attempt comes after one acquire period, or right
            // after the lease found held expires, or when the store hints
            // that its holder is gone or released it, whichever is first.
            let mut next = attempt_started + self.config.acquire_interval;
            let held = match self.try_acquire().await {
                Acquisition::Acquired(lease, sent) => return Some((lease, sent)),
                Acquisition::Held { info, expires } => {
                    next = next.min(expires);
                    Some(info)
                }
                Acquisition::Failed => None,
                Acquisition::Drain => return None,
            };
            if let ControlFlow::Break(()) = self
                .wait_for_next_attempt(next, attempt_started, held.as_ref())
                .await
            {
                return None;
            }
        }
        None
    }

    /// One acquire attempt, given up after the renew attempt timeout.
    /// Publishes `Standby` (with the lease row when the storage read one).
    async fn try_acquire(&self) -> Acquisition {
        let sent = self.clock.now();
        let attempt = tokio::time::timeout(
            self.config.renew_attempt_timeout,
            self.store.acquire(&self.candidate, self.config.ttl),
        );
        let outcome = tokio::select! {
            r = attempt => r,
            () = self.shutdown.cancelled() => return Acquisition::Drain,
        };
        match outcome {
            Ok(Ok(Acquire::Acquired { lease, reason })) => {
                metrics::counter!("herald_lease_acquisitions_total", "reason" => reason.as_str())
                    .increment(1);
                info!(
                    token = lease.token.0,
                    reason = reason.as_str(),
                    "acquired the lease; this node is now holder"
                );
                Acquisition::Acquired(lease, sent)
            }
            Ok(Ok(Acquire::Held(info))) => {
                let expires_in = Duration::from_millis(info.expires_in_ms.max(0).unsigned_abs());
                let expires = Instant::now() + expires_in + EXPIRY_SLACK;
                self.state.send_if_modified(|s| {
                    let next = LeaseState::Standby {
                        holder: Some(info.clone()),
                    };
                    let changed = *s != next;
                    *s = next;
                    changed
                });
                Acquisition::Held { info, expires }
            }
            Ok(Err(e)) => {
                warn!(error = %e, "lease acquisition attempt failed");
                self.keep_standby();
                Acquisition::Failed
            }
            Err(_) => {
                warn!(
                    timeout_ms = self.config.renew_attempt_timeout.as_millis() as u64,
                    "lease acquisition attempt timed out"
                );
                self.keep_standby();
                Acquisition::Failed
            }
        }
    }

    /// Waits until `next`, or until the storage hints at a takeover of
    /// `held` (then until [`MIN_ATTEMPT_GAP`] after `attempt_started`).
    /// Breaks on drain.
    async fn wait_for_next_attempt(
        &self,
        mut next: Instant,
        attempt_started: Instant,
        held: Option<&LeaseInfo>,
    ) -> ControlFlow<()> {
        let hint = async {
            match held {
                Some(info) => self.store.takeover_hint(info).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(hint);
        let mut hinted = false;
        loop {
            let wake = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => Wake::Drain,
                () = tokio::time::sleep_until(next) => Wake::AttemptDue,
                () = &mut hint, if !hinted => Wake::TakeoverHint,
            };
            match wake {
                Wake::Drain => return ControlFlow::Break(()),
                Wake::AttemptDue => return ControlFlow::Continue(()),
                // A hint that fires again at once (nothing changed) must
                // not turn into a busy loop of acquires.
                Wake::TakeoverHint => {
                    hinted = true;
                    next = attempt_started + MIN_ATTEMPT_GAP;
                }
            }
        }
    }

    /// Moves `Starting` to `Standby` without forgetting a known holder.
    fn keep_standby(&self) {
        self.state.send_if_modified(|s| match s {
            LeaseState::Starting => {
                *s = LeaseState::Standby { holder: None };
                true
            }
            _ => false,
        });
    }

    /// The holder's loop: renew, retry, watch the deadline, release on
    /// drain. `acquired_sent` is the instant the acquisition was sent.
    async fn holder(&mut self, lease: Lease, acquired_sent: ClockInstant) -> StopReason {
        let progress = Arc::new(Mutex::new(Progress {
            last_success_wall: Some(
                SystemTime::now() - self.clock.now().duration_since(acquired_sent),
            ),
            ..Progress::default()
        }));
        self.state.send_replace(LeaseState::Holder {
            lease: lease.clone(),
            safety_deadline: acquired_sent + self.config.safe_window(),
        });
        metrics::gauge!("herald_lease_token").set(lease.token.0 as f64);
        metrics::gauge!("herald_lease_role").set(1.0);
        let watchdog = self.spawn_watchdog(lease.token, progress.clone());

        let mut renewal = Renewal::Due(Instant::now() + self.config.renew_interval);
        let exit = loop {
            // Biased, in the order of `Event`'s variants.
            let event = tokio::select! {
                biased;
                () = watchdog.fired.cancelled() => Event::WatchdogFired,
                Some(token) = self.lost.recv() => Event::LeaseLost(token),
                () = self.shutdown.cancelled() => Event::Drain,
                event = renewal.next() => event,
            };
            match event {
                Event::WatchdogFired => break self.stop_reason(),
                // Also while a renewal is still waiting: stop at once all
                // the same.
                Event::LeaseLost(token) => {
                    const WHY: &str = "a fenced write found the lease lost";
                    if token == lease.token && !zombie_ignores(&lease, WHY) {
                        break self.lease_lost(&lease, WHY);
                    }
                }
                Event::Drain => {
                    lock(&progress).in_flight_since = None;
                    // An attempt in flight may hold the lease row (its
                    // transaction took the row lock and waits to be polled
                    // for its next statement); left unpolled it would block
                    // the release until the server's idle-in-transaction
                    // timeout. Dropping it closes its connection, which
                    // rolls it back and frees the row.
                    drop(renewal);
                    break self.release(&lease).await;
                }
                Event::Tick => renewal = self.send_renewal(&lease, &progress),
                Event::Renewed(renewed) => match self.renewed(&lease, &progress, renewed) {
                    ControlFlow::Continue(next) => renewal = Renewal::Due(next),
                    ControlFlow::Break(exit) => break exit,
                },
            }
        };
        watchdog.task.abort();
        exit
    }

    /// Sends a renewal, given up after the renew attempt timeout.
    fn send_renewal(&self, lease: &Lease, progress: &Mutex<Progress>) -> Renewal {
        let sent = self.clock.now();
        lock(progress).in_flight_since = Some(sent);
        let started = Instant::now();
        let store = Arc::clone(&self.store);
        let lease = lease.clone();
        let ttl = self.config.ttl;
        let answer = tokio::time::timeout(self.config.renew_attempt_timeout, async move {
            store.renew(&lease, ttl).await
        });
        Renewal::InFlight {
            sent,
            started,
            answer: Box::pin(answer),
        }
    }

    /// Acts on a renewal's answer: moves the safety deadline after a
    /// success, stops on a lost lease, schedules a retry after a failure.
    /// Continues with the instant the next renewal is due, or breaks with
    /// the reason the node stopped.
    fn renewed(
        &self,
        lease: &Lease,
        progress: &Mutex<Progress>,
        Renewed {
            sent,
            started,
            answer,
        }: Renewed,
    ) -> ControlFlow<StopReason, Instant> {
        lock(progress).in_flight_since = None;
        metrics::histogram!("herald_lease_renewal_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        match answer {
            Ok(Ok(())) => {
                metrics::counter!("herald_lease_renewals_total", "result" => "ok").increment(1);
                let deadline = sent + self.config.safe_window();
                // The watchdog may have stopped the node while this attempt
                // was in flight; a late success never revives it.
                let extended = self.state.send_if_modified(|s| match s {
                    LeaseState::Holder {
                        lease: held,
                        safety_deadline,
                    } if held.token == lease.token => {
                        *safety_deadline = (*safety_deadline).max(deadline);
                        true
                    }
                    _ => false,
                });
                if !extended {
                    return ControlFlow::Break(self.stop_reason());
                }
                {
                    let mut p = lock(progress);
                    p.last_success_wall =
                        Some(SystemTime::now() - self.clock.now().duration_since(sent));
                    p.last_error = None;
                }
                // The period counts from the send, as the deadline does: a
                // slow answer must not push the next renewal later and
                // shrink the stall the holder survives.
                ControlFlow::Continue(started + self.config.renew_interval)
            }
            Ok(Err(StorageError::LeaseLost { .. })) => {
                metrics::counter!("herald_lease_renewals_total", "result" => "lost").increment(1);
                const WHY: &str = "a renewal found the lease lost";
                if zombie_ignores(lease, WHY) {
                    return ControlFlow::Continue(Instant::now() + self.config.renew_interval);
                }
                ControlFlow::Break(self.lease_lost(lease, WHY))
            }
            Ok(Err(e)) => {
                metrics::counter!("herald_lease_renewals_total", "result" => "error").increment(1);
                warn!(token = lease.token.0, error = %e, "lease renewal failed; retrying");
                lock(progress).last_error = Some(e.to_string());
                ControlFlow::Continue(Instant::now() + self.retry_interval())
            }
            Err(_) => {
                metrics::counter!("herald_lease_renewals_total", "result" => "timeout")
                    .increment(1);
                let msg = format!(
                    "renewal attempt abandoned after {} ms without an answer",
                    self.config.renew_attempt_timeout.as_millis()
                );
                warn!(token = lease.token.0, "{msg}; retrying");
                lock(progress).last_error = Some(msg);
                ControlFlow::Continue(Instant::now() + self.retry_interval())
            }
        }
    }

    /// The wait before retrying a failed renewal: the retry interval, or the
    /// normal renew interval under the test-only fault switch
    /// `zombie_holder` (a holder that takes no notice of failures).
    fn retry_interval(&self) -> Duration {
        if fault_switches::enabled(FaultSwitch::ZombieHolder) {
            self.config.renew_interval
        } else {
            self.config.retry_interval
        }
    }

    fn spawn_watchdog(&self, token: FencingToken, progress: Arc<Mutex<Progress>>) -> Watchdog {
        let fired = CancellationToken::new();
        let task = tokio::spawn(
            watchdog(
                self.state.clone(),
                self.clock.clone(),
                token,
                progress,
                fired.clone(),
            )
            .in_current_span(),
        );
        Watchdog { task, fired }
    }

    fn lease_lost(&self, lease: &Lease, why: &str) -> StopReason {
        self.stop(StopReason::LeaseLost { token: lease.token });
        error!(token = lease.token.0, "{why}; this node stops writing now");
        self.stop_reason()
    }

    /// Releases the lease on drain. Writes are refused from this moment on.
    /// When the node had already stopped for another reason (the watchdog,
    /// a lost lease), the release is still attempted (it is guarded by the
    /// token, and spares a standby the wait for expiry) but that first
    /// reason stays the node's reason.
    async fn release(&self, lease: &Lease) -> StopReason {
        // Until the storage confirms it, the release counts as failed.
        let first = self.stop(StopReason::Drained {
            release: Release::Failed,
        });
        let release = match tokio::time::timeout(
            self.config.renew_attempt_timeout,
            self.store.release(lease),
        )
        .await
        {
            Ok(Ok(())) => {
                info!(token = lease.token.0, "released the lease");
                Release::Released
            }
            Ok(Err(e)) => {
                warn!(token = lease.token.0, error = %e, "releasing the lease failed; it will expire instead");
                Release::Failed
            }
            Err(_) => {
                warn!(
                    token = lease.token.0,
                    "releasing the lease timed out; it will expire instead"
                );
                Release::Failed
            }
        };
        if !first {
            return self.stop_reason();
        }
        // Only this drain's own record is completed; a stop published
        // meanwhile would not be overwritten (none can be: the watchdog
        // and the lost-lease path only stop a holder).
        let reason = StopReason::Drained { release };
        self.state.send_if_modified(|s| match s {
            LeaseState::Stopped {
                reason: StopReason::Drained { .. },
            } => {
                *s = LeaseState::Stopped {
                    reason: reason.clone(),
                };
                true
            }
            _ => false,
        });
        self.stop_reason()
    }

    /// Publishes `Stopped` unless already stopped: the first reason wins.
    /// Returns whether this call stopped the node.
    fn stop(&self, reason: StopReason) -> bool {
        let stopped = self.state.send_if_modified(|s| {
            if matches!(s, LeaseState::Stopped { .. }) {
                return false;
            }
            *s = LeaseState::Stopped { reason };
            true
        });
        metrics::gauge!("herald_lease_role").set(0.0);
        stopped
    }

    /// The reason the node stopped, once it has.
    fn stop_reason(&self) -> StopReason {
        match &*self.state.borrow() {
            LeaseState::Stopped { reason } => reason.clone(),
            other => {
                error!(state = ?other, "the supervisor ended without a stopped state");
                StopReason::Drained {
                    release: Release::NotHeld,
                }
            }
        }
    }
}

struct Watchdog {
    task: JoinHandle<()>,
    /// Cancelled by the watchdog when it stops the node.
    fired: CancellationToken,
}

/// Under the test-only fault switch `zombie_holder` (cargo feature
/// `fault-switches`): logs that `why` (a "lease lost" answer) is ignored
/// and returns `true`, so the caller keeps this node holder. Returns
/// `false`, logging nothing, when the switch is off.
fn zombie_ignores(lease: &Lease, why: &str) -> bool {
    if !fault_switches::enabled(FaultSwitch::ZombieHolder) {
        return false;
    }
    error!(
        token = lease.token.0,
        fault_switch = FaultSwitch::ZombieHolder.as_str(),
        "{why}; fault switch zombie_holder: ignored, this node stays holder"
    );
    true
}

fn lock(p: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    // A panic while holding this lock cannot leave Progress inconsistent.
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watchdog: a task of its own, so that a renewal stuck anywhere cannot
/// delay it. It looks at the clock at the safety deadline (and at least every
/// [`WATCHDOG_TICK`]) and stops the node once the deadline has passed.
///
/// Under the test-only fault switch `zombie_holder` (cargo feature
/// `fault-switches`) it returns at once and never stops the node.
async fn watchdog(
    state: Arc<watch::Sender<LeaseState>>,
    clock: Arc<dyn Clock>,
    token: FencingToken,
    progress: Arc<Mutex<Progress>>,
    fired: CancellationToken,
) {
    if fault_switches::enabled(FaultSwitch::ZombieHolder) {
        return;
    }
    loop {
        let deadline = match &*state.borrow() {
            LeaseState::Holder {
                lease,
                safety_deadline,
            } if lease.token == token => *safety_deadline,
            _ => return,
        };
        let now = clock.now();
        if now >= deadline {
            let record = {
                let p = lock(&progress);
                WatchdogRecord {
                    token,
                    last_renewal_sent_at: p.last_success_wall.unwrap_or(SystemTime::UNIX_EPOCH),
                    watchdog_late_by: now.duration_since(deadline),
                    attempt_in_flight_for: p.in_flight_since.map(|s| now.duration_since(s)),
                    last_renewal_error: p.last_error.clone(),
                }
            };
            let stopped = state.send_if_modified(|s| match s {
                LeaseState::Holder { lease, .. } if lease.token == token => {
                    *s = LeaseState::Stopped {
                        reason: StopReason::Watchdog(record.clone()),
                    };
                    true
                }
                _ => false,
            });
            if stopped {
                metrics::counter!("herald_lease_watchdog_stops_total").increment(1);
                metrics::gauge!("herald_lease_role").set(0.0);
                error!(
                    token = token.0,
                    last_renewal_sent_at = %humantime_rfc3339(record.last_renewal_sent_at),
                    watchdog_late_by_ms = record.watchdog_late_by.as_millis() as u64,
                    renewal_in_flight = record.attempt_in_flight_for.is_some(),
                    renewal_in_flight_for_ms = record.attempt_in_flight_for.map(|d| d.as_millis() as u64),
                    last_renewal_error = record.last_renewal_error.as_deref().unwrap_or("none"),
                    "safety deadline passed without a successful renewal; the watchdog stops this node"
                );
                fired.cancel();
            }
            return;
        }
        tokio::time::sleep(
            deadline
                .duration_since(now)
                .clamp(Duration::from_millis(1), WATCHDOG_TICK),
        )
        .await;
    }
}

fn humantime_rfc3339(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    herald_core::format_rfc3339_ms(ms)
}
