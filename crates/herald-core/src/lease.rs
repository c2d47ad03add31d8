use std::fmt;

use serde::Serialize;

/// Name of the lease that elects Herald's single writer.
pub const DEFAULT_LEASE_NAME: &str = "writer";

/// A fencing token: incremented on every acquisition of a lease, also when
/// the same node acquires it again. Tokens only grow and are never reused
/// (see `docs/storage.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A node that wants to hold a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The lease's name (normally [`DEFAULT_LEASE_NAME`]).
    pub lease_name: String,
    /// The node's id.
    pub node_id: String,
    /// The URL clients should use to reach this node's HTTP API.
    pub advertise_url: String,
}

/// Proof that this node acquired a lease: what fenced writes and renewals
/// present to the storage. Holding a `Lease` value does not mean the lease
/// is still held; the storage checks the token in every transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lease's name.
    pub name: String,
    /// Node id of the holder (this node).
    pub holder: String,
    /// The holder's advertised URL.
    pub holder_url: String,
    /// The fencing token this acquisition received.
    pub token: FencingToken,
}

/// What the storage says about a lease right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseInfo {
    /// The lease's name.
    pub name: String,
    /// Node id of the holder; `None` once released.
    pub holder: Option<String>,
    /// Advertised URL of the holder; `None` once released.
    pub holder_url: Option<String>,
    /// The current fencing token (the last acquisition's).
    pub token: FencingToken,
    /// Milliseconds until the lease expires, on the storage's clock; zero or
    /// negative when it has expired.
    pub expires_in_ms: i64,
    /// Milliseconds since the lease was last renewed (or acquired), on the
    /// storage's clock: the holder's last successful renewal as the
    /// database committed it.
    pub renewed_ms_ago: i64,
}

impl LeaseInfo {
    /// `true` while a holder is recorded and the lease has not expired.
    pub fn is_held(&self) -> bool {
        self.holder.is_some() && self.expires_in_ms > 0
    }
}
