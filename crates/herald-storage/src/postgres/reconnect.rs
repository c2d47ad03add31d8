//! The reconnect policy of the connections that a storage keeps open for
//! its whole life and opens again when they fail: the change listener
//! (`listen.rs`) and the liveness connection (`liveness.rs`).
//!
//! - **Backoff by count, not by time.** The pause before the next attempt
//!   is [`BACKOFF_MIN`] doubled per consecutive failure, at most
//!   [`BACKOFF_MAX`]: 100 ms, 200 ms, 400 ms, 800 ms, 1.6 s, 2 s, 2 s, ...
//!   A failure is an attempt that could not connect, and also a connection
//!   that was lost before it stayed up [`STABLE_AFTER`]: only a connection
//!   that lasted that long starts the count again, so a connection that is
//!   established and lost at once, over and over, is retried every 2 s,
//!   not every 100 ms.
//! - **A pause that cannot be cut short.** [`pause`] sleeps on the
//!   runtime's timer and then checks the monotonic clock
//!   (`std::time::Instant`, `CLOCK_MONOTONIC` on Linux); if the timer fired
//!   early (a runtime whose clock is paused or advanced by hand, as in
//!   tests, fires every timer at once), it sleeps the rest on a blocking
//!   thread, on the operating system's clock.
//! - **Rate-limited warnings.** The first warning of a run of failures is
//!   logged; after that at most one per [`WARN_EVERY`], carrying how many
//!   were left out since the last one logged.
//!
//! [`Reconnect`] is pure logic: every method that needs the time is given
//! it, so tests drive it on made-up instants. [`keep_open`] is the one
//! loop that applies it: it serves a connection until it ends, then
//! reconnects under the policy, until the storage stops; what differs
//! between the connections (how one is opened, what is done with its
//! messages, what each log line says) is their [`Kept`] implementation.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, Client};

use super::session::{drive, PgConnection};
use crate::error::Result;

/// First pause before a new connection, after a connection that had been
/// up a while was lost.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest pause between connection attempts.
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a connection must stay up for its loss to start the count of
/// failures again (at [`BACKOFF_MIN`]).
pub(super) const STABLE_AFTER: Duration = Duration::from_secs(10);
/// Smallest interval between two warnings logged by one loop.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(10);

/// The pause before attempt number `failures` + 1, after `failures`
/// consecutive failures (at least 1): [`BACKOFF_MIN`] × 2^(failures − 1),
/// at most [`BACKOFF_MAX`].
pub(super) fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_MIN.saturating_mul(1 << doublings).min(BACKOFF_MAX)
}

/// The state of one reconnect loop: consecutive failures, since when the
/// current connection is up, and the warnings logged and left out.
#[derive(Debug)]
pub(super) struct Reconnect {
    /// Consecutive failures: failed attempts, and connections lost before
    /// they stayed up [`STABLE_AFTER`].
    failures: u32,
    /// When the current connection was established; `None` while there is
    /// none.
    up_since: Option<Instant>,
    /// When the last warning was logged.
    last_warning: Option<Instant>,
    /// Warnings left out since the last one logged.
    suppressed: u64,
}

impl Reconnect {
    /// A loop whose first connection was established at `now`.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            failures: 0,
            up_since: Some(now),
            last_warning: None,
            suppressed: 0,
        }
    }

    /// A new connection was established at `now`. The count of failures
    /// stays until it has been up [`STABLE_AFTER`] (judged when it is lost).
    pub(super) fn connected(&mut self, now: Instant) {
        self.up_since = Some(now);
    }

    /// The connection was lost at `now`; returns the pause before the next
    /// attempt: [`BACKOFF_MIN`] if the connection had been up at least
    /// [`STABLE_AFTER`], else one more failure's backoff.
    pub(super) fn lost(&mut self, now: Instant) -> Duration {
        let stable = self
            .up_since
            .take()
            .is_some_and(|since| now.saturating_duration_since(since) >= STABLE_AFTER);
        if stable {
            self.failures = 0;
        }
        self.failed()
    }

    /// An attempt to connect failed; returns the pause before the next one.
    pub(super) fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        backoff(self.failures)
    }

    /// Consecutive failures so far, for logs.
    pub(super) fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether to log a warning at `now`: `Some(n)` to log it, with `n`
    /// warnings left out since the last one logged; `None` to leave it out
    /// (counted). The first warning is always logged, then at most one per
    /// [`WARN_EVERY`].
    pub(super) fn warning(&mut self, now: Instant) -> Option<u64> {
        match self.last_warning {
            Some(last) if now.saturating_duration_since(last) < WARN_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_warning = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// `d` in whole milliseconds, for log fields.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Waits `wait`, measured on the monotonic clock: sleeps on the runtime's
/// timer, and if that returned before `wait` passed on
/// `std::time::Instant` (the runtime's clock is paused or was advanced),
/// sleeps the rest on a blocking thread.
pub(super) async fn pause(wait: Duration) {
    let deadline = Instant::now() + wait;
    tokio::time::sleep(wait).await;
    let now = Instant::now();
    if now < deadline {
        let rest = deadline - now;
        // `thread::sleep` sleeps at least `rest` on the OS clock.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

/// A connection that a storage keeps open for its whole life and opens
/// again when it fails (the change listener, each liveness connection):
/// what [`keep_open`] needs to know of it.
pub(super) trait Kept: Send + Sync + 'static {
    /// The warning logged when a serving connection is lost.
    const LOST: &'static str;
    /// The line (INFO) logged when a new connection serves.
    const RECONNECTED: &'static str;
    /// The warning logged when an attempt to reconnect fails.
    const NOT_RECONNECTED: &'static str;
    /// At stop, how long to drive the connection after the client is
    /// dropped, so that it says goodbye and the server ends the session
    /// at once; `None`: the connection is dropped without that.
    const CLOSE_WAIT: Option<Duration> = None;

    /// Opens a new connection, ready to serve (connected, and whatever it
    /// holds taken again).
    ///
    /// # Errors
    /// Any: the attempt counts as a failure and is retried after the
    /// policy's pause.
    fn open(&self) -> impl Future<Output = Result<(Client, PgConnection)>> + Send;

    /// Called each time a connection, the first one included, starts to
    /// serve.
    fn serving(&self) {}

    /// Handles one asynchronous message (a notification, a notice) of the
    /// serving connection.
    fn heard(&self, _message: AsyncMessage) {}

    /// The session key named in every log line (the `session_key` field),
    /// if any.
    fn session_key(&self) -> Option<i64> {
        None
    }
}

/// The reconnect loop: serves `first` (already open) until it ends, then
/// opens a new one after the pause of [`Reconnect`], and so on, until
/// `stop`'s sender is dropped (then the connection is dropped, after
/// [`Kept::CLOSE_WAIT`] if set). Logs a warning (rate-limited) for each
/// connection lost and each failed attempt, and one line at INFO for each
/// new connection.
pub(super) async fn keep_open<K: Kept>(
    kept: K,
    first: (Client, PgConnection),
    mut stop: watch::Receiver<()>,
) {
    let mut current = Some(first);
    let mut policy = Reconnect::new(Instant::now());
    let mut wait = Duration::ZERO;
    loop {
        if let Some((client, mut connection)) = current.take() {
            kept.serving();
            let ended = tokio::select! {
                _ = stop.changed() => {
                    // The client's end makes the connection say goodbye and
                    // close; the server then ends the session at once.
                    drop(client);
                    if let Some(limit) = K::CLOSE_WAIT {
                        let _ = tokio::time::timeout(limit, &mut connection).await;
                    }
                    return;
                }
                ended = drive(&mut connection, std::future::pending::<()>(), |m| kept.heard(m)) => ended,
            };
            drop(client);
            let error = ended.err().map(|e| e.to_string()).unwrap_or_default();
            wait = policy.lost(Instant::now());
            if let Some(suppressed) = policy.warning(Instant::now()) {
                tracing::warn!(
                    session_key = kept.session_key(),
                    error = %error,
                    failures = policy.failures(),
                    retry_in_ms = millis(wait),
                    suppressed_warnings = suppressed,
                    "{}",
                    K::LOST
                );
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = pause(wait) => {}
        }
        tokio::select! {
            _ = stop.changed() => return,
            opened = kept.open() => match opened {
                Ok(open) => {
                    policy.connected(Instant::now());
                    tracing::info!(
                        session_key = kept.session_key(),
                        failures = policy.failures(),
                        "{}",
                        K::RECONNECTED
                    );
                    current = Some(open);
                }
                Err(e) => {
                    wait = policy.failed();
                    if let Some(suppressed) = policy.warning(Instant::now()) {
                        tracing::warn!(
                            session_key = kept.session_key(),
                            error = %e,
                            failures = policy.failures(),
                            retry_in_ms = millis(wait),
                            suppressed_warnings = suppressed,
                            "{}",
                            K::NOT_RECONNECTED
                        );
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_backoff_doubles_from_the_minimum_to_the_maximum() {
        let waits: Vec<u128> = (1..=8).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    /// Failed attempts in a row back off like failures counted.
    #[test]
    fn failed_attempts_back_off() {
        let t0 = Instant::now();
        let mut policy = Reconnect::new(t0);
        let mut waits = vec![policy.lost(t0 + STABLE_AFTER)];
        waits.extend((0..6).map(|_| policy.failed()));
        let waits: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(policy.failures(), 7);
    }

    /// A connection that is established and lost at once, over and over,
    /// is not retried every 100 ms: each short-lived connection counts as
    /// a failure. (The old loops restarted at 100 ms on every connect.)
    #[test]
    fn connections_lost_at_once_do_not_reset_the_backoff() {
        let t0 = Instant::now();
        let mut policy = Reconnect::new(t0);
        let mut now = t0 + STABLE_AFTER;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let wait = policy.lost(now);
            waits.push(wait.as_millis());
            now += wait;
            policy.connected(now);
            now += MS;
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    /// Only a connection that stayed up [`STABLE_AFTER`] starts the count
    /// again.
    #[test]
    fn a_connection_that_stayed_up_starts_again_at_the_minimum() {
        let t0 = Instant::now();
        let mut policy = Reconnect::new(t0);
        for _ in 0..5 {
            policy.failed();
        }
        policy.connected(t0);
        assert_eq!(policy.lost(t0 + STABLE_AFTER - MS), backoff(6));
        policy.connected(t0 + STABLE_AFTER);
        assert_eq!(policy.lost(t0 + STABLE_AFTER * 2), BACKOFF_MIN);
        assert_eq!(policy.failures(), 1);
    }

    /// 1000 failures within 1 s give one warning; the next one, 10 s after
    /// the first, says how many were left out.
    #[test]
    fn warnings_are_rate_limited_and_count_what_was_left_out() {
        let t0 = Instant::now();
        let mut policy = Reconnect::new(t0);
        let logged: Vec<u32> = (0..1000)
            .filter(|i| policy.warning(t0 + MS * *i).is_some())
            .collect();
        assert_eq!(logged.len(), 1, "warnings logged");
        assert_eq!(logged[0], 0, "the first failure warns");
        assert_eq!(policy.warning(t0 + WARN_EVERY - MS), None);
        assert_eq!(policy.warning(t0 + WARN_EVERY), Some(1000));
        assert_eq!(policy.warning(t0 + WARN_EVERY + MS), None);
        assert_eq!(policy.warning(t0 + WARN_EVERY * 3), Some(1));
    }

    /// Under a runtime whose clock is paused, the runtime's sleep returns
    /// at once (the clock jumps to the next timer); the pause still lasts
    /// its whole length on the monotonic clock.
    #[tokio::test(start_paused = true)]
    async fn a_pause_lasts_on_the_monotonic_clock_when_the_timer_fires_early() {
        let wait = Duration::from_millis(300);
        let started = Instant::now();
        pause(wait).await;
        assert!(started.elapsed() >= wait, "{:?}", started.elapsed());
    }
}
