//! Publish rate limits per API key and per token subject: token buckets
//! (GCRA) from the `governor` crate. Each message of a batch takes one
//! cell; a refused publish takes none.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};

use super::AuthError;
use crate::metrics;

/// Default publish rate, per second, of a key or subject with none of its
/// own.
pub(crate) const DEFAULT_RATE_PER_S: f64 = 100.0;
/// Above this many token subjects, idle ones are dropped from memory.
const SUBJECTS_KEPT: usize = 10_000;

/// What a limiter's `check_n` answers.
type Checked = Result<
    Result<(), governor::NotUntil<<DefaultClock as Clock>::Instant>>,
    governor::InsufficientCapacity,
>;

/// A rate and burst, checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    quota: Quota,
}

impl Rate {
    /// `per_s` publishes per second with bursts of `burst` (default twice
    /// the rate, at least 1); `None` for a rate of 0 (no limit).
    ///
    /// # Errors
    /// A message for a negative, infinite or NaN rate, or a burst of 0.
    pub(crate) fn new(per_s: f64, burst: Option<u32>) -> Result<Option<Self>, String> {
        if !per_s.is_finite() || per_s < 0.0 {
            return Err(format!(
                "publish_rate_per_s must be a number of at least 0, not {per_s}"
            ));
        }
        if per_s == 0.0 {
            return Ok(None);
        }
        let burst = match burst {
            Some(b) => NonZeroU32::new(b).ok_or("publish_burst must be at least 1")?,
            None => {
                NonZeroU32::new(((per_s * 2.0).ceil() as u32).max(1)).unwrap_or(NonZeroU32::MIN)
            }
        };
        let period = Duration::from_secs_f64(1.0 / per_s);
        let quota = Quota::with_period(period)
            .ok_or("publish_rate_per_s is too large")?
            .allow_burst(burst);
        Ok(Some(Self { quota }))
    }
}

/// The limiters of one node.
pub(crate) struct PublishLimits {
    clock: DefaultClock,
    /// Per API key name, for keys with a limit.
    keys: HashMap<String, DefaultDirectRateLimiter>,
    /// Per token subject, if subjects are limited.
    subjects: Option<DefaultKeyedRateLimiter<String>>,
}

impl std::fmt::Debug for PublishLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishLimits")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl PublishLimits {
    /// Limits for the keys of `keys` (name and rate, `None`: unlimited)
    /// and `subjects` for every token subject.
    pub(crate) fn new(keys: Vec<(String, Option<Rate>)>, subjects: Option<Rate>) -> Self {
        let clock = DefaultClock::default();
        Self {
            keys: keys
                .into_iter()
                .filter_map(|(name, rate)| {
                    rate.map(|r| {
                        (
                            name,
                            DefaultDirectRateLimiter::direct_with_clock(r.quota, clock.clone()),
                        )
                    })
                })
                .collect(),
            subjects: subjects
                .map(|r| DefaultKeyedRateLimiter::dashmap_with_clock(r.quota, clock.clone())),
            clock,
        }
    }

    /// Takes `n` cells from API key `name`'s bucket.
    ///
    /// # Errors
    /// [`AuthError::RateLimited`] when they are not all there.
    pub(crate) fn check_key(&self, name: &str, n: usize) -> Result<(), AuthError> {
        let Some(limiter) = self.keys.get(name) else {
            return Ok(());
        };
        let outcome = limiter.check_n(cells(n));
        self.judge(outcome, "key")
    }

    /// Takes `n` cells from token subject `subject`'s bucket.
    ///
    /// # Errors
    /// [`AuthError::RateLimited`] when they are not all there.
    pub(crate) fn check_subject(&self, subject: &str, n: usize) -> Result<(), AuthError> {
        let Some(limiter) = &self.subjects else {
            return Ok(());
        };
        if limiter.len() > SUBJECTS_KEPT {
            limiter.retain_recent();
        }
        let outcome = limiter.check_key_n(&subject.to_owned(), cells(n));
        self.judge(outcome, "token")
    }

    /// The answer to a check: Ok, or 429 with the wait, counted.
    fn judge(&self, outcome: Checked, credential: &'static str) -> Result<(), AuthError> {
        let wait = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => not_until.wait_time_from(self.clock.now()),
            // More messages than the burst: never at once; wait for a
            // whole bucket and send fewer.
            Err(governor::InsufficientCapacity(_)) => Duration::from_secs(1),
        };
        metrics::rate_limited(credential);
        Err(AuthError::RateLimited {
            retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
        })
    }
}

fn cells(n: usize) -> NonZeroU32 {
    NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_next_is_refused_with_a_wait() {
        // One cell every 1000 s: nothing refills during the test.
        let rate = Rate::new(0.001, Some(3)).unwrap();
        let limits = PublishLimits::new(vec![("k".to_owned(), rate)], rate);
        for _ in 0..3 {
            limits.check_key("k", 1).unwrap();
        }
        let refused = limits.check_key("k", 1).unwrap_err();
        assert_eq!(refused.code(), "rate_limited");
        let wait = refused.retry_after_s().unwrap();
        assert!((900..=1000).contains(&wait), "{wait}");
        // Other keys and subjects have their own buckets.
        limits.check_key("unlimited", 100).unwrap();
        limits.check_subject("a", 3).unwrap();
        assert!(limits.check_subject("a", 1).is_err());
        limits.check_subject("b", 1).unwrap();
        // A batch larger than the burst can never pass.
        assert!(limits.check_subject("c", 4).is_err());
    }

    #[test]
    fn rates_are_checked() {
        assert!(Rate::new(0.0, None).unwrap().is_none());
        assert!(Rate::new(-1.0, None).is_err());
        assert!(Rate::new(f64::NAN, None).is_err());
        assert!(Rate::new(1.0, Some(0)).is_err());
        assert!(Rate::new(100.0, None).unwrap().is_some());
    }
}
