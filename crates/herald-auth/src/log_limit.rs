//! [`LogLimit`]: at most one log record of a kind per interval, so that a
//! refusal repeated by every request (a cluster without its secret, a key
//! over its rate) is told to the operator without flooding the log.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Interval between two records of the same kind: one a minute.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Lets one record through per [`LOG_INTERVAL`] (the first at once) and
/// counts those held back in between. Uses tokio's clock, so that tests
/// can pause it.
#[derive(Debug, Default)]
pub(crate) struct LogLimit {
    /// When the last record went through, and how many were held back
    /// since.
    state: Mutex<Option<(Instant, u64)>>,
}

impl LogLimit {
    /// `Some(held_back)` when a record may be logged now (with the number
    /// of records held back since the previous one), `None` when it is to
    /// be held back.
    pub(crate) fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            Some((last, held_back)) if now.duration_since(*last) < LOG_INTERVAL => {
                *held_back += 1;
                None
            }
            Some((last, held_back)) => {
                let before = *held_back;
                *last = now;
                *held_back = 0;
                Some(before)
            }
            None => {
                *state = Some((now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_record_per_interval_with_the_count_of_those_held_back() {
        let limit = LogLimit::default();
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        tokio::time::advance(LOG_INTERVAL - Duration::from_millis(1)).await;
        assert_eq!(limit.allow(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(limit.allow(), Some(3));
        assert_eq!(limit.allow(), None);
    }
}
