use std::time::Duration;

/// A monotonic clock: time since an arbitrary origin that never goes back.
pub trait Clock: Send + Sync + 'static {
    /// Time elapsed since the clock's origin.
    fn now(&self) -> Duration;
}

/// Linux `CLOCK_BOOTTIME`: monotonic and, unlike `CLOCK_MONOTONIC` (Rust's
/// `Instant`), it keeps counting while the machine is suspended, so a holder
/// that was suspended wakes up already past its safety deadline
/// (clock_gettime(2)).
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> Duration {
        let ts = rustix::time::clock_gettime_dynamic(rustix::time::DynamicClockId::Boottime)
            .unwrap_or_else(|_| rustix::time::clock_gettime(rustix::time::ClockId::Monotonic));
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
}

/// Tokio's clock, which tests pause and advance (`tokio::time::pause`).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        tokio::time::Instant::now().duration_since(self.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_never_goes_back() {
        let a = BootClock.now();
        let b = BootClock.now();
        assert!(b >= a);
        assert!(a > Duration::ZERO);
    }
}
