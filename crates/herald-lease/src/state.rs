use std::sync::Arc;
use std::time::{Duration, SystemTime};

use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{FencingToken, Lease, LeaseInfo};
use tokio::sync::{mpsc, watch};

use crate::clock::{Clock, ClockInstant};

/// Where the node stands with the lease. Published by the supervisor on a
/// `watch` channel; read through [`LeaseHandle`].
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseState {
    /// The supervisor has not finished its first acquisition attempt.
    Starting,
    /// Another node holds the lease, or nobody does and this node could not
    /// acquire it yet. `holder` is the last lease row this node read.
    Standby {
        /// The lease as last read, if the storage answered.
        holder: Option<LeaseInfo>,
    },
    /// This node holds the lease and may write until `safety_deadline`.
    Holder {
        /// The acquisition's proof, presented in every fenced write.
        lease: Lease,
        /// Instant on the supervisor's [`Clock`] after which this node must
        /// assume it lost the lease.
        safety_deadline: ClockInstant,
    },
    /// The supervisor has ended; the node must not write any more.
    Stopped {
        /// Why it ended.
        reason: StopReason,
    },
}

impl LeaseState {
    /// While standby: the lease row as this node last read it, if it shows
    /// a holder whose lease had not expired then ([`LeaseInfo::is_held`]).
    /// `None` in every other state, and while holder: this node knows
    /// itself.
    pub fn held_by_other(&self) -> Option<&LeaseInfo> {
        match self {
            Self::Standby { holder: Some(info) } if info.is_held() => Some(info),
            _ => None,
        }
    }

    /// While standby: the holder's advertised URL as this node last read it
    /// from the lease row, held or not. `None` when unknown (still
    /// starting, holder, stopped, or the row names nobody).
    pub fn holder_url(&self) -> Option<&str> {
        match self {
            Self::Standby { holder: Some(info) } => info.holder_url.as_deref(),
            _ => None,
        }
    }

    /// The fencing token of the lease as this node last saw it: its own
    /// while holder, the lease row's while standby; `None` when unknown.
    pub fn last_token(&self) -> Option<FencingToken> {
        match self {
            Self::Holder { lease, .. } => Some(lease.token),
            Self::Standby { holder: Some(info) } => Some(info.token),
            _ => None,
        }
    }

    /// The lease's name as this node knows it from its state (its own lease
    /// while holder, the lease row while standby); `None` when unknown.
    pub fn lease_name(&self) -> Option<&str> {
        match self {
            Self::Holder { lease, .. } => Some(&lease.name),
            Self::Standby { holder: Some(info) } => Some(&info.name),
            _ => None,
        }
    }
}

/// Why the supervisor ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StopReason {
    /// Drain or start-up failure: the supervisor stopped on request and,
    /// if it was holder, tried to release the lease.
    Drained {
        /// What became of the lease.
        release: Release,
    },
    /// The safety deadline passed without a successful renewal.
    Watchdog(WatchdogRecord),
    /// A renewal or a fenced write found the lease held by another token.
    LeaseLost {
        /// The token this node had.
        token: FencingToken,
    },
}

impl std::fmt::Display for StopReason {
    /// Why the supervisor stopped, in words for a log line: `drained,
    /// lease released`, `drained, not holder`, `drained, release failed`,
    /// `watchdog stop, token 7`, `lease lost, token 7`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Drained { release } => match release {
                Release::NotHeld => f.write_str("drained, not holder"),
                Release::Released => f.write_str("drained, lease released"),
                Release::Failed => f.write_str("drained, release failed"),
            },
            Self::Watchdog(record) => write!(f, "watchdog stop, token {}", record.token.0),
            Self::LeaseLost { token } => write!(f, "lease lost, token {}", token.0),
        }
    }
}

/// What a drain did with the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The node was not holder: nothing to release.
    NotHeld,
    /// The node was holder and the storage confirmed the release: a standby
    /// may take over at once.
    Released,
    /// The node was holder and the release failed or timed out (after the
    /// renew attempt timeout): the lease stays until it expires, ttl after
    /// the last renewal.
    Failed,
}

/// What the watchdog logs when it stops the node: the facts an operator
/// needs to tell a hung database from a hung node.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchdogRecord {
    /// The fencing token that was lost.
    pub token: FencingToken,
    /// Wall-clock time at which the last successful renewal (or the
    /// acquisition) was sent.
    pub last_renewal_sent_at: SystemTime,
    /// How long after the safety deadline the watchdog actually ran (a large
    /// value means the node itself was paused or starved).
    pub watchdog_late_by: Duration,
    /// If a renewal attempt was in flight, how long it had been running.
    pub attempt_in_flight_for: Option<Duration>,
    /// The error of the last failed renewal attempt, if any.
    pub last_renewal_error: Option<String>,
}

/// A cheap, cloneable view of the supervisor for the rest of the node.
#[derive(Clone)]
pub struct LeaseHandle {
    state: watch::Receiver<LeaseState>,
    clock: Arc<dyn Clock>,
    lost: mpsc::UnboundedSender<FencingToken>,
    /// ttl − safety margin: the safety deadline minus this is the send
    /// instant of the last successful renewal.
    window: Duration,
}

impl LeaseHandle {
    pub(crate) fn new(
        state: watch::Receiver<LeaseState>,
        clock: Arc<dyn Clock>,
        lost: mpsc::UnboundedSender<FencingToken>,
        window: Duration,
    ) -> Self {
        Self {
            state,
            clock,
            lost,
            window,
        }
    }

    /// The state now.
    pub fn state(&self) -> LeaseState {
        self.state.borrow().clone()
    }

    /// A receiver that sees every state change.
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// The lease to present in a fenced write, or `None` when this node must
    /// not write: not holder, stopped, or past the safety deadline on the
    /// clock even if the watchdog has not run yet.
    ///
    /// Under the test-only fault switch `zombie_holder` the safety deadline
    /// is not checked
    /// (`herald_core::fault_switches::FaultSwitch::ZombieHolder`).
    pub fn writable_lease(&self) -> Option<Lease> {
        match &*self.state.borrow() {
            LeaseState::Holder {
                lease,
                safety_deadline,
            } if self.clock.now() < *safety_deadline
                || fault_switches::enabled(FaultSwitch::ZombieHolder) =>
            {
                Some(lease.clone())
            }
            _ => None,
        }
    }

    /// `true` while this node is holder (same rule as
    /// [`LeaseHandle::writable_lease`]).
    pub fn is_holder(&self) -> bool {
        self.writable_lease().is_some()
    }

    /// Time left before the safety deadline, while holder.
    pub fn time_to_deadline(&self) -> Option<Duration> {
        match &*self.state.borrow() {
            LeaseState::Holder {
                safety_deadline, ..
            } => Some(safety_deadline.duration_since(self.clock.now())),
            _ => None,
        }
    }

    /// While holder: time since the last successful renewal (or the
    /// acquisition) was sent.
    pub fn since_last_renewal(&self) -> Option<Duration> {
        match &*self.state.borrow() {
            LeaseState::Holder {
                safety_deadline, ..
            } => Some(
                self.clock
                    .now()
                    .duration_since(safety_deadline.saturating_sub(self.window)),
            ),
            _ => None,
        }
    }

    /// Tells the supervisor that a fenced write with `token` found the lease
    /// lost; the supervisor stops the node at once if `token` is current.
    pub fn report_lease_lost(&self, token: FencingToken) {
        // The supervisor may already be gone, in which case it stopped anyway.
        let _ = self.lost.send(token);
    }

    /// Waits until the state satisfies `pred`, and returns that state.
    /// Returns `None` if the supervisor is gone without reaching it.
    pub async fn wait_for(&self, mut pred: impl FnMut(&LeaseState) -> bool) -> Option<LeaseState> {
        let mut rx = self.state.clone();
        let r = rx.wait_for(|s| pred(s)).await.ok().map(|s| s.clone());
        r
    }
}

impl std::fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(holder: Option<&str>, expires_in_ms: i64) -> LeaseInfo {
        LeaseInfo {
            name: "other-lease".to_owned(),
            holder: holder.map(str::to_owned),
            holder_url: holder.map(|h| format!("http://{h}")),
            token: FencingToken(3),
            expires_in_ms,
            renewed_ms_ago: 0,
        }
    }

    fn standby(info: Option<LeaseInfo>) -> LeaseState {
        LeaseState::Standby { holder: info }
    }

    #[test]
    fn what_a_state_says_about_the_holder() {
        let holder = LeaseState::Holder {
            lease: Lease {
                name: "mine".to_owned(),
                holder: "me".to_owned(),
                holder_url: "http://me".to_owned(),
                token: FencingToken(4),
            },
            safety_deadline: ClockInstant::ORIGIN,
        };
        let held = standby(Some(row(Some("b"), 1000)));
        let expired = standby(Some(row(Some("b"), 0)));
        let released = standby(Some(row(None, 0)));
        let stopped = LeaseState::Stopped {
            reason: StopReason::LeaseLost {
                token: FencingToken(4),
            },
        };

        // Another node's hold: only a held row, seen as a standby.
        assert_eq!(held.held_by_other(), Some(&row(Some("b"), 1000)));
        for state in [&expired, &released, &holder, &stopped] {
            assert_eq!(state.held_by_other(), None, "{state:?}");
        }
        // The holder's URL: any row a standby read that names one.
        assert_eq!(held.holder_url(), Some("http://b"));
        assert_eq!(expired.holder_url(), Some("http://b"));
        assert_eq!(released.holder_url(), None);
        assert_eq!(holder.holder_url(), None);
        // The token and the lease's name: own while holder, the row's while
        // standby.
        assert_eq!(holder.last_token(), Some(FencingToken(4)));
        assert_eq!(expired.last_token(), Some(FencingToken(3)));
        assert_eq!(holder.lease_name(), Some("mine"));
        assert_eq!(released.lease_name(), Some("other-lease"));
        for state in [&LeaseState::Starting, &standby(None), &stopped] {
            assert_eq!(state.holder_url(), None, "{state:?}");
            assert_eq!(state.last_token(), None, "{state:?}");
            assert_eq!(state.lease_name(), None, "{state:?}");
        }
    }
}
