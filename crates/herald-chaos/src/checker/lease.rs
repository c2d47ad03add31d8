//! The check of the writer lease as observed in the database: guarantee
//! (9), an expired lease is never extended.

use std::collections::BTreeMap;

use crate::history::Event;

use super::violation::Violation;

/// One lease observation: `(at_ms, expired, expires_at_us, renewed_at_us,
/// holder)`.
type LeaseSeen<'a> = (u64, bool, i64, i64, Option<&'a str>);

/// (9): no token is renewed at or after an expiry the observer saw pass:
/// judged on each observation of a row version seen expired and the next
/// observation of that token, so that a renewal that decided before the
/// expiry but committed after it was seen pass, and the renewals after it,
/// are not taken for late ones. (A version that lived less than the
/// observer's period between the two can escape the observer; a correct
/// renewal chain does not need one to be judged correct.)
pub(super) fn check_lease(history: &[Event], out: &mut Vec<Violation>) {
    let mut by_token: BTreeMap<u64, Vec<LeaseSeen<'_>>> = BTreeMap::new();
    for event in history {
        if let Event::Lease {
            token,
            holder,
            expired,
            expires_at_us,
            renewed_at_us,
            at_ms,
        } = event
        {
            by_token.entry(*token).or_default().push((
                *at_ms,
                *expired,
                *expires_at_us,
                *renewed_at_us,
                holder.as_deref(),
            ));
        }
    }
    for (token, mut seen) in by_token {
        seen.sort_by_key(|o| o.0);
        // A row version seen expired, and the next one seen: renewed at or
        // after the expiry of the version it replaced.
        let late = seen.windows(2).find(|pair| {
            let (before, after) = (&pair[0], &pair[1]);
            before.1 && after.3 != before.3 && after.3 >= before.2
        });
        if let Some([before, after]) = late {
            out.push(Violation::LeaseResurrected {
                token,
                holder: after.4.map(str::to_owned),
                expired_at_ms: before.0,
                unexpired_at_ms: after.0,
                expires_at_us: before.2,
                renewed_at_us: after.3,
            });
        }
    }
}
