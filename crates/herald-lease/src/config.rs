use std::time::Duration;

/// Timing of the writer lease. Defaults follow the design: ttl 30 s, safety
/// margin 5 s, renewal every ttl/6 (5 s), failed renewals retried every 1 s,
/// standbys try to acquire every 1 s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease name (`writer`).
    pub name: String,
    /// How long a renewal extends the lease, on the storage's clock.
    pub ttl: Duration,
    /// How long before expiry the holder gives up: the safety deadline is
    /// the last successful renewal's send instant + `ttl` − `safety_margin`.
    pub safety_margin: Duration,
    /// Period between renewals while they succeed.
    pub renew_interval: Duration,
    /// Period between retries after a failed renewal.
    pub retry_interval: Duration,
    /// How long the supervisor waits for one renewal attempt before it gives
    /// up on it: the backend abandons a silent attempt itself 1 s after its
    /// statement timeout (and replaces its connection), so this is that plus
    /// 1 s, a backstop that lets the backend finish its own abandon first.
    /// An abandoned attempt never moves the safety deadline, even if it later
    /// commits.
    pub renew_attempt_timeout: Duration,
    /// Period between a standby's acquisition attempts.
    pub acquire_interval: Duration,
}

/// Why a [`LeaseConfig`] is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    /// The margin leaves no time to renew.
    #[error("lease safety margin ({margin:?}) must be shorter than the ttl ({ttl:?})")]
    MarginTooLarge {
        /// The ttl.
        ttl: Duration,
        /// The margin.
        margin: Duration,
    },
    /// The holder would reach its safety deadline before its first renewal.
    #[error("renew interval ({interval:?}) must be shorter than ttl - safety margin ({window:?})")]
    IntervalTooLong {
        /// The renew interval.
        interval: Duration,
        /// ttl − safety margin.
        window: Duration,
    },
    /// A renewal that fails by timing out could not be retried before the
    /// safety deadline: the holder would stop on one slow renewal.
    #[error(
        "renew interval ({interval:?}) + renew attempt timeout ({attempt:?}) + retry interval \
         ({retry:?}) must fit in ttl - safety margin ({window:?}), so that a renewal that \
         times out is retried before the safety deadline"
    )]
    NoRoomToRetry {
        /// The renew interval.
        interval: Duration,
        /// The renew attempt timeout.
        attempt: Duration,
        /// The retry interval.
        retry: Duration,
        /// ttl − safety margin.
        window: Duration,
    },
    /// A period is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
}

/// What one renewal attempt may take beyond the storage's renewal
/// statement timeout before the supervisor gives it up: the backend
/// abandons a silent attempt 1 s after its statement timeout, and the
/// supervisor's own limit comes 1 s after that, as a backstop.
pub const RENEW_ATTEMPT_SLACK: Duration = Duration::from_secs(2);

/// The default safety margin for `ttl`: ttl / 6, at most 5 s (5 s for the
/// default 30 s ttl).
pub fn default_safety_margin(ttl: Duration) -> Duration {
    (ttl / 6).min(Duration::from_secs(5))
}

/// The default renewal statement timeout for `ttl`: ttl / 6, at most 5 s
/// (5 s for the default 30 s ttl). The supervisor gives an attempt up
/// [`RENEW_ATTEMPT_SLACK`] after it.
pub fn default_renew_statement_timeout(ttl: Duration) -> Duration {
    (ttl / 6).min(Duration::from_secs(5))
}

/// The default period between retries of a failed renewal for `ttl`:
/// ttl / 10, at most 1 s (1 s from a 10 s ttl up).
pub fn default_retry_interval(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_secs(1))
}

/// The shortest ttl whose derived timings ([`LeaseConfig::for_ttl`]) pass
/// [`LeaseConfig::validate`]: below it the fixed [`RENEW_ATTEMPT_SLACK`]
/// no longer fits, and the timings must be given explicitly.
pub const SHORTEST_DERIVED_TTL: Duration = Duration::from_secs(5);

impl LeaseConfig {
    /// Every timing derived from `ttl`: safety margin and renewal
    /// statement timeout ttl / 6 (at most 5 s each), renewal every ttl / 6,
    /// failed renewals retried every ttl / 10 (at most 1 s), attempts given
    /// up [`RENEW_ATTEMPT_SLACK`] after the statement timeout, acquire
    /// every 1 s. For the default 30 s ttl these are the design's defaults;
    /// they pass [`LeaseConfig::validate`] for every ttl from
    /// [`SHORTEST_DERIVED_TTL`] up.
    pub fn for_ttl(ttl: Duration) -> Self {
        Self {
            retry_interval: default_retry_interval(ttl),
            renew_attempt_timeout: default_renew_statement_timeout(ttl) + RENEW_ATTEMPT_SLACK,
            ..Self::new(ttl, default_safety_margin(ttl))
        }
    }

    /// The design's defaults for `ttl` and `safety_margin`: renew every
    /// ttl/6, retry every 1 s, attempts given up after 7 s (a 5 s statement
    /// timeout + the backend's 1 s abandon + 1 s), acquire every 1 s.
    pub fn new(ttl: Duration, safety_margin: Duration) -> Self {
        Self {
            name: herald_core::DEFAULT_LEASE_NAME.to_owned(),
            ttl,
            safety_margin,
            renew_interval: ttl / 6,
            retry_interval: Duration::from_secs(1),
            renew_attempt_timeout: Duration::from_secs(7),
            acquire_interval: Duration::from_secs(1),
        }
    }

    /// Checks the relations between the periods: every period is non-zero,
    /// the margin is shorter than the ttl, and a renewal sent
    /// `renew_interval` after the last success that times out
    /// (`renew_attempt_timeout`) is retried (`retry_interval` later) before
    /// the safety deadline (`ttl − safety_margin`).
    ///
    /// # Errors
    /// [`LeaseConfigError`] names the first broken rule.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        for (name, d) in [
            ("lease ttl", self.ttl),
            ("renew interval", self.renew_interval),
            ("retry interval", self.retry_interval),
            ("renew attempt timeout", self.renew_attempt_timeout),
            ("acquire interval", self.acquire_interval),
        ] {
            if d.is_zero() {
                return Err(LeaseConfigError::Zero(name));
            }
        }
        if self.safety_margin >= self.ttl {
            return Err(LeaseConfigError::MarginTooLarge {
                ttl: self.ttl,
                margin: self.safety_margin,
            });
        }
        let window = self.ttl - self.safety_margin;
        if self.renew_interval >= window {
            return Err(LeaseConfigError::IntervalTooLong {
                interval: self.renew_interval,
                window,
            });
        }
        // A renewal sent `renew_interval` after the last success may run for
        // `renew_attempt_timeout` before it is given up; its retry goes out
        // `retry_interval` later and must still be sent inside the window.
        if self.renew_interval + self.renew_attempt_timeout + self.retry_interval > window {
            return Err(LeaseConfigError::NoRoomToRetry {
                interval: self.renew_interval,
                attempt: self.renew_attempt_timeout,
                retry: self.retry_interval,
                window,
            });
        }
        Ok(())
    }

    /// ttl − safety margin: how long after a successful renewal was sent the
    /// holder may still write.
    pub fn safe_window(&self) -> Duration {
        self.ttl.saturating_sub(self.safety_margin)
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::new(Duration::from_secs(30), Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_timings_fit_every_ttl_from_five_seconds_up() {
        // Every 100 ms from 5 s to 2 min, then coarser up to an hour.
        let ttls = (50..=1200u64)
            .map(|tenths| Duration::from_millis(tenths * 100))
            .chain((2..=60u64).map(|minutes| Duration::from_secs(minutes * 60)));
        for ttl in ttls {
            let c = LeaseConfig::for_ttl(ttl);
            assert_eq!(c.validate(), Ok(()), "ttl {ttl:?}: {c:?}");
            assert!(c.safety_margin > Duration::ZERO, "ttl {ttl:?}");
            assert!(c.safety_margin <= Duration::from_secs(5), "ttl {ttl:?}");
            assert!(c.retry_interval <= Duration::from_secs(1), "ttl {ttl:?}");
        }
        assert_eq!(
            LeaseConfig::for_ttl(SHORTEST_DERIVED_TTL).validate(),
            Ok(())
        );
        // Below the shortest, the fixed slack no longer fits: refused, so
        // such a ttl needs its timings given.
        assert!(LeaseConfig::for_ttl(Duration::from_secs(4))
            .validate()
            .is_err());
    }

    #[test]
    fn derived_timings_of_the_default_ttl_are_the_designs() {
        let derived = LeaseConfig::for_ttl(Duration::from_secs(30));
        assert_eq!(derived, LeaseConfig::default());
        assert_eq!(
            default_renew_statement_timeout(Duration::from_secs(30)),
            Duration::from_secs(5)
        );
        // A 10 s ttl: margin and statement timeout 1.67 s, retry 1 s.
        let ten = LeaseConfig::for_ttl(Duration::from_secs(10));
        assert_eq!(ten.safety_margin, Duration::from_secs(10) / 6);
        assert_eq!(ten.retry_interval, Duration::from_secs(1));
        assert_eq!(
            ten.renew_attempt_timeout,
            Duration::from_secs(10) / 6 + RENEW_ATTEMPT_SLACK
        );
    }

    #[test]
    fn defaults_follow_the_design() {
        let c = LeaseConfig::default();
        assert_eq!(c.renew_interval, Duration::from_secs(5));
        assert_eq!(c.safe_window(), Duration::from_secs(25));
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn rejects_inconsistent_timings() {
        let c = LeaseConfig::new(Duration::from_secs(5), Duration::from_secs(5));
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::MarginTooLarge { .. })
        ));
        let mut c = LeaseConfig {
            renew_interval: Duration::from_secs(25),
            ..LeaseConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::IntervalTooLong { .. })
        ));
        c.renew_interval = Duration::ZERO;
        assert_eq!(c.validate(), Err(LeaseConfigError::Zero("renew interval")));
    }

    #[test]
    fn refuses_timings_where_a_slow_renewal_cannot_be_retried() {
        // ttl 10 s leaves a 5 s window; 1.67 s + 7 s + 1 s does not fit.
        let c = LeaseConfig::new(Duration::from_secs(10), Duration::from_secs(5));
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::NoRoomToRetry { .. })
        ));
        // The same window with a short attempt timeout fits: 1.67 + 2 + 1 s.
        let c = LeaseConfig {
            renew_attempt_timeout: Duration::from_secs(2),
            ..c
        };
        assert_eq!(c.validate(), Ok(()));
        // Exactly full is accepted: the retry is sent at the deadline's edge.
        let c = LeaseConfig {
            renew_interval: Duration::from_millis(500),
            renew_attempt_timeout: Duration::from_millis(2500),
            ..LeaseConfig::new(Duration::from_secs(5), Duration::from_secs(1))
        };
        assert_eq!(c.validate(), Ok(()));
    }
}
