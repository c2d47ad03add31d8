//! The one metric herald-auth records, through the `metrics` crate's
//! global recorder (the server installs it and exports it on `/metrics`).

use metrics::counter;

/// Counter `herald_publish_rate_limited_total`, label `credential` (`key`,
/// `token`): publish requests refused with 429 `rate_limited`, by the
/// kind of credential whose rate was used up.
pub const RATE_LIMITED: &str = "herald_publish_rate_limited_total";

/// Counts one publish refused by a rate limit, by `credential` (`key`,
/// `token`).
pub(crate) fn rate_limited(credential: &'static str) {
    counter!(RATE_LIMITED, "credential" => credential).increment(1);
}
