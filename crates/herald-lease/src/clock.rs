use std::ops::Add;
use std::time::Duration;

/// A point in time on a [`Clock`]: the time elapsed since that clock's
/// origin. Instants of different clocks are not comparable; the supervisor
/// and its [`crate::state::LeaseHandle`] share one clock.
///
/// Distinct from [`Duration`] so that a point in time (a safety deadline,
/// the send of a renewal) and a length of time (a ttl, a margin) cannot be
/// mixed up: an instant plus a duration is an instant, and two instants
/// give the duration between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ClockInstant(Duration);

impl ClockInstant {
    /// The clock's origin.
    pub const ORIGIN: Self = Self(Duration::ZERO);
    /// The latest instant there is: a deadline that never comes.
    pub const MAX: Self = Self(Duration::MAX);

    /// The instant `elapsed` after the clock's origin.
    pub const fn from_origin(elapsed: Duration) -> Self {
        Self(elapsed)
    }

    /// Time from the clock's origin to this instant.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to this instant; zero when `earlier` is later.
    pub fn duration_since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// The instant `d` before this one, or the origin when that would
    /// come before it.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(d))
    }
}

impl Add<Duration> for ClockInstant {
    type Output = Self;

    /// The instant `d` after this one.
    ///
    /// # Panics
    /// When the result overflows, as [`Duration`]'s addition does.
    fn add(self, d: Duration) -> Self {
        Self(self.0 + d)
    }
}

/// A monotonic clock: time since an arbitrary origin that never goes back.
pub trait Clock: Send + Sync + 'static {
    /// The instant now.
    fn now(&self) -> ClockInstant;
}

/// Linux `CLOCK_BOOTTIME`: monotonic and, unlike `CLOCK_MONOTONIC` (Rust's
/// `Instant`), it keeps counting while the machine is suspended, so a holder
/// that was suspended wakes up already past its safety deadline
/// (clock_gettime(2)). Its origin is the boot.
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> ClockInstant {
        let ts = rustix::time::clock_gettime_dynamic(rustix::time::DynamicClockId::Boottime)
            .unwrap_or_else(|_| rustix::time::clock_gettime(rustix::time::ClockId::Monotonic));
        ClockInstant::from_origin(Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        ))
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
    fn now(&self) -> ClockInstant {
        ClockInstant::from_origin(tokio::time::Instant::now().duration_since(self.origin))
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
        assert!(a > ClockInstant::ORIGIN);
    }

    #[test]
    fn instants_and_durations_do_not_mix_up() {
        let t = ClockInstant::from_origin(Duration::from_secs(10));
        assert_eq!(
            (t + Duration::from_secs(5)).since_origin(),
            Duration::from_secs(15)
        );
        assert_eq!(
            (t + Duration::from_secs(5)).duration_since(t),
            Duration::from_secs(5)
        );
        assert_eq!(t.duration_since(t + Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(
            t.saturating_sub(Duration::from_secs(4)).since_origin(),
            Duration::from_secs(6)
        );
        assert_eq!(
            t.saturating_sub(Duration::from_secs(40)),
            ClockInstant::ORIGIN
        );
        assert!(t < ClockInstant::MAX);
    }
}
