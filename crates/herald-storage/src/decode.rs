//! Conversions between stored values and domain values that both backends
//! share: tokens and offsets as SQL `bigint`s, stored names and JSON text.

use std::sync::Arc;
use std::time::Duration;

use herald_core::{Candidate, ChannelName, FencingToken, Lease, Payload, Tags};
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::traits::{Acquire, TakeoverReason};

/// Longest lease ttl stored, in ms (about 100 years): keeps `now + ttl`
/// inside a signed 64-bit integer on both databases.
const MAX_TTL_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// A ttl in ms for SQL, capped at [`MAX_TTL_MS`].
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis())
        .unwrap_or(i64::MAX)
        .min(MAX_TTL_MS)
}

/// Logs the outcome of a release, for both backends.
pub(crate) fn log_release(lease: &Lease, released: bool) {
    tracing::info!(
        lease = %lease.name,
        token = lease.token.0,
        holder = %lease.holder,
        released,
        "writer lease release"
    );
}

/// Logs, for both backends, that `lease` is no longer current, and why
/// (`what`: "fenced write refused", "renewal matched no current lease").
pub(crate) fn log_lost(lease: &Lease, what: &str) {
    tracing::warn!(
        lease = %lease.name,
        token = lease.token.0,
        holder = %lease.holder,
        "writer lease lost: {what}"
    );
}

/// The error of a lease that is no longer current.
pub(crate) fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        name: lease.name.clone(),
        token: lease.token,
    }
}

/// A presented token as both databases store it (a signed 64-bit integer);
/// a token that does not fit cannot be current.
pub(crate) fn sql_token(lease: &Lease) -> Result<i64> {
    i64::try_from(lease.token.0).map_err(|_| lost(lease))
}

/// An offset or cursor as a signed 64-bit integer; values above `i64::MAX`
/// are beyond everything stored, and `i64::MAX` is too.
pub(crate) fn sql_position(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A stored non-negative integer; a negative one is corrupt data.
pub(crate) fn to_u64(value: i64, what: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::corrupt(format!("{what} is negative: {value}")))
}

/// A stored fencing token.
pub(crate) fn to_token(value: i64) -> Result<FencingToken> {
    to_u64(value, "fencing token").map(FencingToken)
}

/// A stored channel name, validated again.
pub(crate) fn to_channel(name: String) -> Result<ChannelName> {
    ChannelName::new(name)
        .map_err(|e| Error::corrupt_because(format!("stored channel name: {e}"), e))
}

/// Stored message data, which must still be JSON text.
/// A stored message's payload: its `body` when it has one (bytes), else
/// its `data` (JSON text). PostgreSQL stores NULL `data` with a body,
/// SQLite an empty text (migration 11).
pub(crate) fn to_payload(data: Option<String>, body: Option<Vec<u8>>) -> Result<Payload> {
    match (body, data) {
        (Some(body), _) => Ok(Payload::Bytes(Arc::from(body))),
        (None, Some(data)) => to_json(data).map(Payload::Json),
        (None, None) => Err(Error::corrupt("stored message has neither data nor body")),
    }
}

/// Stored JSON text, parsed again.
fn to_json(text: String) -> Result<Arc<RawValue>> {
    RawValue::from_string(text)
        .map(Arc::from)
        .map_err(|e| Error::corrupt_because(format!("stored message data is not JSON: {e}"), e))
}

/// Stored message tags: NULL for none, else the JSON object text of
/// [`Tags::to_json`], which must still be an object of strings.
pub(crate) fn to_tags(text: Option<String>) -> Result<Tags> {
    match text {
        None => Ok(Tags::default()),
        Some(text) => Tags::from_json(&text).map_err(|e| {
            Error::corrupt_because(
                format!("stored message tags are not a JSON object of strings: {e}"),
                e,
            )
        }),
    }
}

/// The outcome of a committed acquisition of `candidate` with `token`,
/// logged once for both backends.
pub(crate) fn acquired(
    candidate: &Candidate,
    token: FencingToken,
    reason: TakeoverReason,
    previous_holder: Option<&str>,
) -> Acquire {
    let lease = Lease {
        name: candidate.lease_name.clone(),
        holder: candidate.node_id.clone(),
        holder_url: candidate.advertise_url.clone(),
        token,
    };
    // `previous_holder` only when there was one (after a release, the
    // node that released): a new lease has none, and an empty field would
    // read as a node named "".
    tracing::info!(
        lease = %lease.name,
        token = token.0,
        holder = %lease.holder,
        previous_holder,
        reason = reason.as_str(),
        "writer lease acquired"
    );
    Acquire::Acquired { lease, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    use herald_core::log_capture::json_records as records;

    /// After a release (no previous holder in the row) the acquisition's
    /// record has no `previous_holder` at all, not an empty one; after a
    /// takeover it names the node.
    #[test]
    fn previous_holder_is_logged_only_when_there_was_one() {
        let candidate = Candidate {
            lease_name: "writer".to_owned(),
            node_id: "node-b".to_owned(),
            advertise_url: "http://b".to_owned(),
        };
        let logged = records(|| {
            acquired(&candidate, FencingToken(2), TakeoverReason::Released, None);
            acquired(
                &candidate,
                FencingToken(3),
                TakeoverReason::Expired,
                Some("node-a"),
            );
        });
        let [released, expired] = &logged[..] else {
            panic!("{logged:?}");
        };
        assert_eq!(released["message"], "writer lease acquired");
        assert_eq!(released["reason"], "released");
        assert!(released.get("previous_holder").is_none(), "{released}");
        assert_eq!(expired["previous_holder"], "node-a");
    }
}
