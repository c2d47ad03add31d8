//! What the server needs to know about the writer lease: the narrow view of
//! `herald_lease::LeaseHandle` that the writer, the standby feed and the
//! handlers read. A trait so that unit tests can drive the role by hand.
//! What a state says about the holder (its URL, the last token seen, the
//! lease's name) are methods of [`LeaseState`].

use herald_core::{FencingToken, Lease};
use herald_lease::{LeaseHandle, LeaseState};
use tokio::sync::watch;

/// The node's role, as the lease supervisor publishes it.
pub trait LeaseView: Send + Sync + 'static {
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

    /// While holder: time left until the safety deadline (the last
    /// successful renewal's send time + ttl − safety margin), after which
    /// the watchdog stops the node.
    fn time_to_deadline(&self) -> Option<std::time::Duration> {
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
    fn time_to_deadline(&self) -> Option<std::time::Duration> {
        LeaseHandle::time_to_deadline(self)
    }
}
