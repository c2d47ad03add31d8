//! Publish rate limits per API key and per token subject: token buckets
//! (GCRA) from the `governor` crate. Each message of a batch takes one
//! cell; a refused publish takes none.
//!
//! Token subjects (end users) have [`DEFAULT_RATE_PER_S`] unless `[auth]`
//! says otherwise; API keys (the operator's own backends) have no limit
//! unless `[auth]` or the key sets one. A refusal names the key or the
//! subject and the setting that limits it, and the first refusal of each
//! kind per minute is logged (WARN).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};

use crate::error::AuthError;
use crate::log_limit::LogLimit;
use crate::metrics;

/// Default publish rate, per second, of a token subject when `[auth]`
/// sets none (API keys have no default limit).
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
    /// Publishes per second.
    per_s: f64,
    /// The bucket's size, in publishes.
    burst: u32,
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/s, burst {}", self.per_s, self.burst)
    }
}

/// A limit in force: the rate, and the setting it comes from (named in
/// refusals and logs).
#[derive(Debug, Clone)]
pub(crate) struct Limit {
    pub(crate) rate: Rate,
    pub(crate) setting: String,
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
        Ok(Some(Self {
            quota,
            per_s,
            burst: burst.get(),
        }))
    }
}

/// The limiters of one node.
pub(crate) struct PublishLimits {
    clock: DefaultClock,
    /// Per API key name, for keys with a limit.
    keys: HashMap<String, (DefaultDirectRateLimiter, Limit)>,
    /// Per token subject, if subjects are limited.
    subjects: Option<(DefaultKeyedRateLimiter<String>, Limit)>,
    /// The WARN of a key's refusal, at most one a minute.
    key_refusals: LogLimit,
    /// The WARN of a token subject's refusal, at most one a minute.
    subject_refusals: LogLimit,
}

impl std::fmt::Debug for PublishLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishLimits")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl PublishLimits {
    /// Limits for the keys of `keys` (name and limit, `None`: unlimited)
    /// and `subjects` for every token subject.
    pub(crate) fn new(keys: Vec<(String, Option<Limit>)>, subjects: Option<Limit>) -> Self {
        let clock = DefaultClock::default();
        Self {
            keys: keys
                .into_iter()
                .filter_map(|(name, limit)| {
                    limit.map(|l| {
                        let limiter = DefaultDirectRateLimiter::direct_with_clock(
                            l.rate.quota,
                            clock.clone(),
                        );
                        (name, (limiter, l))
                    })
                })
                .collect(),
            subjects: subjects.map(|l| {
                (
                    DefaultKeyedRateLimiter::dashmap_with_clock(l.rate.quota, clock.clone()),
                    l,
                )
            }),
            clock,
            key_refusals: LogLimit::default(),
            subject_refusals: LogLimit::default(),
        }
    }

    /// The limit of API key `name`, if it has one.
    pub(crate) fn key_limit(&self, name: &str) -> Option<&Limit> {
        self.keys.get(name).map(|(_, limit)| limit)
    }

    /// The limit of every token subject, if they have one.
    pub(crate) fn subject_limit(&self) -> Option<&Limit> {
        self.subjects.as_ref().map(|(_, limit)| limit)
    }

    /// Takes `n` cells from API key `name`'s bucket.
    ///
    /// # Errors
    /// [`AuthError::RateLimited`] when they are not all there.
    pub(crate) fn check_key(&self, name: &str, n: usize) -> Result<(), AuthError> {
        let Some((limiter, limit)) = self.keys.get(name) else {
            return Ok(());
        };
        let outcome = limiter.check_n(cells(n));
        self.judge(outcome, Who::Key(name), limit)
    }

    /// Takes `n` cells from token subject `subject`'s bucket.
    ///
    /// # Errors
    /// [`AuthError::RateLimited`] when they are not all there.
    pub(crate) fn check_subject(&self, subject: &str, n: usize) -> Result<(), AuthError> {
        let Some((limiter, limit)) = &self.subjects else {
            return Ok(());
        };
        if limiter.len() > SUBJECTS_KEPT {
            limiter.retain_recent();
        }
        let outcome = limiter.check_key_n(&subject.to_owned(), cells(n));
        self.judge(outcome, Who::Subject(subject), limit)
    }

    /// The answer to a check: Ok, or 429 with the wait, counted, and
    /// logged at most once a minute per kind of credential.
    fn judge(&self, outcome: Checked, who: Who<'_>, limit: &Limit) -> Result<(), AuthError> {
        let wait = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => not_until.wait_time_from(self.clock.now()),
            // More messages than the burst: never at once; wait for a
            // whole bucket and send fewer.
            Err(governor::InsufficientCapacity(_)) => Duration::from_secs(1),
        };
        let retry_after_s = wait.as_secs_f64().ceil().max(1.0) as u64;
        let (credential, name, log) = match who {
            Who::Key(name) => ("key", format!("API key \"{name}\""), &self.key_refusals),
            Who::Subject(sub) => (
                "token",
                format!("token subject \"{sub}\""),
                &self.subject_refusals,
            ),
        };
        metrics::rate_limited(credential);
        let detail = format!(
            "{name} is over its publish rate of {} (set by {})",
            limit.rate, limit.setting
        );
        if let Some(held_back) = log.allow() {
            tracing::warn!(
                credential,
                limited = %name,
                rate = %limit.rate,
                setting = %limit.setting,
                retry_after_s,
                refused_since_last_warning = held_back,
                "publish refused: rate limit reached (429 rate_limited)"
            );
        }
        Err(AuthError::RateLimited {
            retry_after_s,
            detail,
        })
    }
}

/// Whose bucket was empty.
#[derive(Clone, Copy)]
enum Who<'a> {
    Key(&'a str),
    Subject(&'a str),
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
        let limit = rate.map(|rate| Limit {
            rate,
            setting: "test".to_owned(),
        });
        let limits = PublishLimits::new(vec![("k".to_owned(), limit.clone())], limit);
        for _ in 0..3 {
            limits.check_key("k", 1).unwrap();
        }
        let refused = limits.check_key("k", 1).unwrap_err();
        assert_eq!(refused.code_for_tests(), "rate_limited");
        let AuthError::RateLimited {
            retry_after_s: wait,
            ..
        } = refused
        else {
            panic!("{refused:?}")
        };
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
