//! The time bounds of the liveness rule (11): how soon a live
//! subscription must receive an acknowledged message, and how near a
//! fault excuses it.

/// How long a live subscription may take to receive an acknowledged
/// message when no fault is near
/// ([`Violation::DeliveryStalled`](super::Violation::DeliveryStalled)):
/// three times a standby's 1 s safety poll, the slowest way a correct node learns
/// of a commit. The runner's subscribers reconnect only after 5 s of
/// silence, so a connection that stalls from its start is judged for the
/// acknowledgements of its first 2 s.
pub const STALL_MS: u64 = 3000;

/// A fault is near an acknowledgement when the fault, widened by this much
/// before its start and [`FAULT_TAIL_MS`] after its end, meets the
/// acknowledgement's [`STALL_MS`] window.
pub const FAULT_LEAD_MS: u64 = 1000;

/// See [`FAULT_LEAD_MS`]: the time after a fault's end in which the
/// cluster may still be recovering from it.
pub const FAULT_TAIL_MS: u64 = 5000;
