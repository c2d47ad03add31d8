//! The wall clock that token checks read (`exp`, `nbf`, the JWKS cache
//! and refetch times): the system clock, or in tests one set by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
#[cfg(any(test, feature = "testing"))]
use std::time::Duration;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where token checks read the time: the system clock, or in tests a
/// clock set by hand (so that `exp == now` is tested exactly, and the
/// JWKS refetch interval without waiting). Clones share the hand-set
/// time.
#[derive(Clone, Default)]
pub struct WallClock(Option<Arc<AtomicU64>>);

impl WallClock {
    /// A clock that reads `unix_ms` until set or advanced.
    #[cfg(any(test, feature = "testing"))]
    pub fn manual(unix_ms: u64) -> Self {
        Self(Some(Arc::new(AtomicU64::new(unix_ms))))
    }

    /// Moves a hand-set clock forward by `by`.
    #[cfg(any(test, feature = "testing"))]
    pub fn advance(&self, by: Duration) {
        if let Some(ms) = &self.0 {
            ms.fetch_add(
                u64::try_from(by.as_millis()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
    }

    /// Milliseconds since the Unix epoch.
    pub(crate) fn unix_ms(&self) -> u64 {
        match &self.0 {
            Some(ms) => ms.load(Ordering::Relaxed),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// Whole seconds since the Unix epoch (the unit of `exp` and `nbf`).
    pub(crate) fn unix_s(&self) -> u64 {
        self.unix_ms() / 1000
    }
}
