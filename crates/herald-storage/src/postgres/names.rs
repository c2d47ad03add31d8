//! What every node of one database must agree on: the keys of the advisory
//! locks (migrations, fenced writes, the liveness sessions' twins), the
//! notification channels (`LISTEN`/`NOTIFY`) of commits, lease releases and
//! cluster events, and how long after a server start a free liveness lock
//! proves nothing.

/// Key of the session-level advisory lock (`pg_advisory_lock`) under which
/// [`PostgresStorage::connect`](super::connect::PostgresStorage::connect) runs the schema migrations, so that nodes
/// that start at the same time migrate one after the other. It is the
/// 64-bit FNV-1a hash of `herald/migrations`, reinterpreted as `bigint`
/// (PostgreSQL documentation, "Explicit Locking", "Advisory Locks", and
/// "System Administration Functions", "Advisory Lock Functions").
pub const MIGRATION_LOCK_KEY: i64 = advisory_key(b"herald/migrations", b"");

/// The notification channel (`LISTEN`/`NOTIFY`) on which fenced writes
/// announce their commits, one notification per channel written, with the
/// payload `<from> <to> <committed_at_ms> <channel>` (offsets of the new
/// messages, the database clock in ms since the Unix epoch, the channel
/// name last). PostgreSQL delivers a notification only when the
/// transaction that sent it commits (PostgreSQL documentation, `NOTIFY`).
pub const CHANGES_CHANNEL: &str = "herald_changes";

/// The notification channel on which a release of the writer lease is
/// announced, with the lease's name as payload, so that standbys try to
/// acquire at once instead of on their next acquire period. Delivered only
/// if the release commits (PostgreSQL documentation, `NOTIFY`).
pub const LEASE_CHANNEL: &str = "herald_lease";

/// The notification channel on which nodes send each other cluster
/// events (`crate::cluster`: the payload is JSON, shorter than 8000
/// bytes). Each node's listener passes on the events other nodes sent
/// ([`ClusterView::watch_cluster_events`](crate::traits::ClusterView::watch_cluster_events)).
pub const CLUSTER_CHANNEL: &str = "herald_cluster";

/// 64-bit FNV-1a of `prefix` then `name`, as `bigint`: a stable advisory
/// lock key, the same on every node and every build.
const fn advisory_key(prefix: &[u8], name: &[u8]) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut i = 0;
    while i < prefix.len() {
        hash = (hash ^ prefix[i] as u64).wrapping_mul(PRIME);
        i += 1;
    }
    let mut i = 0;
    while i < name.len() {
        hash = (hash ^ name[i] as u64).wrapping_mul(PRIME);
        i += 1;
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// The twin of session key `key`: `key` with its top bit flipped. A
/// storage's two liveness connections hold `key` and its twin; a lease's
/// `holder_session` records only `key`, and every check of whether a
/// holder is gone derives the twin from it.
pub(super) fn twin_key(key: i64) -> i64 {
    key ^ i64::MIN
}

/// Key of the transaction-level advisory lock (`pg_advisory_xact_lock`)
/// that serializes the fenced writes of the lease `lease_name`: the 64-bit
/// FNV-1a hash of `herald/fenced-write/<lease_name>`, reinterpreted as
/// `bigint`. Every node computes the same key for the same name.
/// PostgreSQL's `pg_locks` shows it as `classid` (high 32 bits) and `objid`
/// (low 32 bits) with `objsubid = 1` (PostgreSQL documentation, "Explicit
/// Locking", "Advisory Locks"; "System Views", `pg_locks`).
pub fn fenced_write_lock_key(lease_name: &str) -> i64 {
    advisory_key(b"herald/fenced-write/", lease_name.as_bytes())
}

/// How long after the database server starts a free session lock of a
/// holder is not yet taken as proof that the holder is gone (see
/// `HOLDER_GONE_SQL` in `ops.rs`, and the takeover watch): well above the
/// liveness connection's longest reconnect pause (2 s) plus a connect.
pub(super) const HOLDER_GONE_GRACE_MS: i64 = 5_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisory_keys_are_stable_and_distinct() {
        // FNV-1a test vector: the empty input hashes to the offset basis.
        assert_eq!(advisory_key(b"", b"") as u64, 0xcbf2_9ce4_8422_2325);
        // "a" -> 0xaf63dc4c8601ec8c (FNV-1a 64 reference value).
        assert_eq!(advisory_key(b"a", b"") as u64, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(advisory_key(b"ab", b""), advisory_key(b"a", b"b"));
        assert_ne!(
            fenced_write_lock_key("writer"),
            fenced_write_lock_key("other")
        );
        assert_ne!(fenced_write_lock_key("writer"), MIGRATION_LOCK_KEY);
    }
}
