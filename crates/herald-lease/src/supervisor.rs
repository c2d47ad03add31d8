use std::sync::Arc;

use herald_core::Candidate;
use herald_storage::LeaseStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{Clock, LeaseConfig, LeaseHandle, StopReason};

/// What the supervisor's task returns: why it ended.
pub type Exit = StopReason;

/// Runs the lease's timing policy for one node (see the crate docs).
#[derive(Debug)]
pub struct Supervisor;

impl Supervisor {
    /// Starts the supervisor task: standby until it acquires, then holder
    /// until drain (`shutdown` cancelled), the watchdog, or a lost lease.
    /// On drain it releases the lease if it holds it.
    pub fn start(
        store: Arc<dyn LeaseStore>,
        candidate: Candidate,
        config: LeaseConfig,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> (LeaseHandle, JoinHandle<Exit>) {
        let _ = (store, candidate, config, clock, shutdown);
        unimplemented!("supervisor")
    }
}
