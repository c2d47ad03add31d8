//! What the server needs to know about the writer lease: the narrow view of
//! `herald_lease::LeaseHandle` that the writer, the standby feed and the
//! handlers read. A trait so that unit tests can drive the role by hand.

use herald_core::{FencingToken, Lease};
use herald_lease::{LeaseHandle, LeaseState};
use tokio::sync::watch;

/// The node's role, as the lease supervisor publishes it.
pub(crate) trait LeaseView: Send + Sync + 'static {
    /// The lease to present in a fenced write, or `None` when this node must
    /// not write now.
    fn writable_lease(&self) -> Option<Lease>;
    /// The supervisor's state now.
    fn state(&self) -> LeaseState;
    /// A receiver that sees every state change.
    fn subscribe(&self) -> watch::Receiver<LeaseState>;
    /// Tells the supervisor that a fenced write with `token` found the lease
    /// lost.
    fn report_lease_lost(&self, token: FencingToken);

    /// While holder: time since the last successful renewal was sent.
    fn since_last_renewal(&self) -> Option<std::time::Duration> {
        None
    }

    /// `true` while this node may write.
    fn is_holder(&self) -> bool {
        self.writable_lease().is_some()
    }
}

impl LeaseView for LeaseHandle {
    fn writable_lease(&self) -> Option<Lease> {
        LeaseHandle::writable_lease(self)
    }
    fn state(&self) -> LeaseState {
        LeaseHandle::state(self)
    }
    fn subscribe(&self) -> watch::Receiver<LeaseState> {
        LeaseHandle::subscribe(self)
    }
    fn report_lease_lost(&self, token: FencingToken) {
        LeaseHandle::report_lease_lost(self, token);
    }
    fn since_last_renewal(&self) -> Option<std::time::Duration> {
        LeaseHandle::since_last_renewal(self)
    }
}

/// The holder's advertised URL as this node last read it from the lease
/// row; `None` when unknown (still starting, stopped, or nobody holds it).
pub(crate) fn holder_url(state: &LeaseState) -> Option<String> {
    match state {
        LeaseState::Standby { holder: Some(info) } => info.holder_url.clone(),
        _ => None,
    }
}

/// The fencing token of the lease as this node last saw it: its own while
/// holder, the holder's while standby; 0 when unknown.
pub(crate) fn last_token(state: &LeaseState) -> u64 {
    match state {
        LeaseState::Holder { lease, .. } => lease.token.0,
        LeaseState::Standby { holder: Some(info) } => info.token.0,
        _ => 0,
    }
}

/// The lease's name as this node knows it from its state, else the default.
pub(crate) fn lease_name(state: &LeaseState) -> String {
    match state {
        LeaseState::Holder { lease, .. } => lease.name.clone(),
        LeaseState::Standby { holder: Some(info) } => info.name.clone(),
        _ => herald_core::DEFAULT_LEASE_NAME.to_owned(),
    }
}
