//! The SQL of the PostgreSQL backend, run on pool connections.
//!
//! Transactions are READ COMMITTED: every statement sees the rows committed
//! before it started, so a statement that runs after a lock wait sees the
//! latest committed version of the row it waited for (PostgreSQL
//! documentation, "Transaction Isolation", "Read Committed Isolation
//! Level"). "Now" is `clock_timestamp()`, the time when the function is
//! called, not when the transaction started ("Date/Time Functions and
//! Operators", "Current Date/Time").

use std::time::{SystemTime, UNIX_EPOCH};

use deadpool_postgres::Object;
use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, Message, Offset};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, IsolationLevel};

use super::names::{
    fenced_write_lock_key, twin_key, CHANGES_CHANNEL, HOLDER_GONE_GRACE_MS, LEASE_CHANNEL,
};
use crate::decode::{
    acquired, log_lost, log_release, lost, sql_position, sql_token, to_channel, to_payload,
    to_tags, to_token, to_u64,
};
use crate::error::{Error, Refusal, Result};
use crate::traits::{
    Acquire, ChangeFeed, ChannelSummary, Deletion, Deletions, LeaseTakeover, Page, TakeoverCount,
    TakeoverReason, MAX_CHANNEL_PAGE, MAX_LEASE_HISTORY,
};
use crate::trim;
use crate::trim::{ChannelStats, TrimLimits, Trimmed};

/// A `timestamptz` as whole milliseconds since the Unix epoch, rounded
/// down (also before 1970).
pub(super) fn to_ms(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => {
            let before = before.duration();
            let ms = before.as_millis() + u128::from(before.subsec_nanos() % 1_000_000 != 0);
            i64::try_from(ms).map_or(i64::MIN, |ms| -ms)
        }
    }
}

/// The current lease row, with the time left computed by the database and
/// rounded up, so that it is <= 0 exactly when `expires_at <=
/// clock_timestamp()`, the expiry test of every other statement.
const LEASE_INFO_SQL: &str = "SELECT name, holder, holder_url, token, \
     ceil((extract(epoch FROM expires_at) - extract(epoch FROM clock_timestamp())) * 1000)::bigint, \
     floor((extract(epoch FROM clock_timestamp()) - extract(epoch FROM renewed_at)) * 1000)::bigint \
     FROM storage_leases WHERE name = $1";

async fn read_lease_info<C: GenericClient>(client: &C, name: &str) -> Result<Option<LeaseInfo>> {
    let Some(row) = client.query_opt(LEASE_INFO_SQL, &[&name]).await? else {
        return Ok(None);
    };
    Ok(Some(LeaseInfo {
        name: row.try_get(0)?,
        holder: row.try_get(1)?,
        holder_url: row.try_get(2)?,
        token: to_token(row.try_get(3)?)?,
        expires_in_ms: row.try_get(4)?,
        renewed_ms_ago: row.try_get(5)?,
    }))
}

/// The lease as the storage sees it now.
pub(super) async fn lease_info(client: &Object, name: &str) -> Result<Option<LeaseInfo>> {
    let client: &tokio_postgres::Client = client;
    read_lease_info(client, name).await
}

/// Adds one acquisition of lease `$1` for reason `$2` (with its new token
/// `$3`) to `lease_takeovers`, inside the acquire's transaction.
const RECORD_TAKEOVER_SQL: &str = "INSERT INTO lease_takeovers \
         (name, reason, takeovers, last_token, last_at) \
     VALUES ($1, $2, 1, $3, clock_timestamp()) \
     ON CONFLICT (name, reason) DO UPDATE SET takeovers = lease_takeovers.takeovers + 1, \
         last_token = excluded.last_token, last_at = excluded.last_at";

/// Adds acquisition `$2` (token) of lease `$1` by node `$3`, which the row
/// named `$4` before, for reason `$5`, to the takeover timeline
/// (`lease_history`), inside the acquire's transaction.
const RECORD_HISTORY_SQL: &str = "INSERT INTO lease_history \
         (name, token, holder, previous_holder, reason, acquired_at) \
     VALUES ($1, $2, $3, $4, $5, clock_timestamp()) \
     ON CONFLICT (name, token) DO NOTHING";

/// Keeps the timeline of lease `$1` to its last 1000 tokens up to `$2`.
const PRUNE_HISTORY_SQL: &str =
    "DELETE FROM lease_history WHERE name = $1 AND token <= $2::bigint - 1000";

/// The latest `$2` acquisitions of lease `$1`, newest first
/// (`Storage::lease_history`).
pub(super) async fn lease_history(
    client: &Object,
    name: &str,
    limit: usize,
) -> Result<Vec<LeaseTakeover>> {
    let stmt = client
        .prepare_cached(
            "SELECT token, holder, previous_holder, reason, acquired_at \
             FROM lease_history WHERE name = $1 ORDER BY token DESC LIMIT $2",
        )
        .await?;
    let limit = i64::try_from(limit.min(MAX_LEASE_HISTORY)).unwrap_or(0);
    client
        .query(&stmt, &[&name, &limit])
        .await?
        .into_iter()
        .map(|row| {
            let reason: String = row.try_get(3)?;
            Ok(LeaseTakeover {
                token: to_token(row.try_get(0)?)?,
                holder: row.try_get(1)?,
                previous_holder: row.try_get(2)?,
                reason: TakeoverReason::from_name(&reason)
                    .ok_or_else(|| Error::corrupt(format!("unknown takeover reason {reason:?}")))?,
                at_ms: to_ms(row.try_get(4)?),
            })
        })
        .collect()
}

/// The recorded acquisitions of lease `name` by reason
/// (`LeaseStore::takeover_counts`).
pub(super) async fn takeover_counts(client: &Object, name: &str) -> Result<Vec<TakeoverCount>> {
    let stmt = client
        .prepare_cached(
            "SELECT reason, takeovers FROM lease_takeovers WHERE name = $1 AND takeovers > 0",
        )
        .await?;
    let mut rows = Vec::new();
    for row in client.query(&stmt, &[&name]).await? {
        rows.push((row.try_get::<_, String>(0)?, row.try_get::<_, i64>(1)?));
    }
    TakeoverCount::from_rows(rows)
}

/// Locks the lease row `FOR UPDATE`: conflicts with the `FOR KEY SHARE` of
/// every fenced write in flight, so an acquire waits for all of them, and
/// every fenced write that starts later waits for the acquire and then sees
/// its new token.
const LOCK_FOR_TAKEOVER_SQL: &str = "SELECT 1 FROM storage_leases WHERE name = $1 FOR UPDATE";

/// What acquire needs to know about the holder, read after the row lock is
/// held: whether a holder is recorded and its lease has not expired at this
/// statement's clock reading, and its session.
const READ_HOLDER_SQL: &str = "SELECT holder IS NOT NULL AND expires_at > clock_timestamp(), \
     holder_session, holder FROM storage_leases WHERE name = $1";

/// Probes the session locks of a storage: true when no session holds
/// either its session key `$1` or that key's twin `$2`
/// (`super::twin_key`), that is, when both of that storage's liveness
/// connections are closed. Transaction-level locks, released at commit or
/// rollback (PostgreSQL documentation, "System Administration Functions",
/// "Advisory Lock Functions").
const PROBE_HOLDER_SQL: &str =
    "SELECT pg_try_advisory_xact_lock($1) AND pg_try_advisory_xact_lock($2)";

/// Whether another node's storage is provably gone: both its session locks
/// are free ([`PROBE_HOLDER_SQL`]; `$3` is the twin key) *and* the
/// database server has been up for at
/// least `$2` ms. A server that just started has no sessions at all, so a
/// free lock then says nothing about the holder: its liveness connection
/// reconnects and takes the lock again within its reconnect backoff. Only
/// after that grace does a free lock count as evidence of death
/// (`pg_postmaster_start_time`: PostgreSQL documentation, "System
/// Information Functions").
const HOLDER_GONE_SQL: &str = "SELECT pg_try_advisory_xact_lock($1) \
     AND pg_try_advisory_xact_lock($3) \
     AND clock_timestamp() - pg_postmaster_start_time() >= $2::bigint * interval '1 millisecond'";

/// The takeover decision, run after the row lock is held: the row is taken
/// when released, expired at this statement's clock reading, or when
/// `$5` (the holder's session is gone, probed in this transaction after
/// the row lock). Records `$6`, this storage's session key, as
/// `holder_session`, and clears `released_by`. Returns the new token, the
/// previous holder (NULL when released), whether the previous lease had
/// expired, and the node that released it (NULL unless released, schema
/// version 14).
const TAKE_OVER_SQL: &str = "UPDATE storage_leases AS l \
     SET holder = $2, holder_url = $3, holder_session = $6, token = l.token + 1, \
         acquired_at = c.now, renewed_at = c.now, released_by = NULL, \
         expires_at = c.now + $4::bigint * interval '1 millisecond' \
     FROM (SELECT clock_timestamp() AS now) AS c, \
          (SELECT holder AS previous_holder, expires_at AS previous_expires_at, \
                  released_by AS previous_released_by \
           FROM storage_leases WHERE name = $1) AS p \
     WHERE l.name = $1 AND (l.holder IS NULL OR l.expires_at <= c.now OR $5::boolean) \
     RETURNING l.token, p.previous_holder, p.previous_expires_at <= c.now, \
         p.previous_released_by";

/// Starts a READ COMMITTED transaction on `client`: the level every
/// fenced write, trim and acquisition runs at (their lock waits re-read the
/// latest row versions; docs/storage.md).
async fn read_committed(client: &mut Object) -> Result<deadpool_postgres::Transaction<'_>> {
    Ok(client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?)
}

/// One transaction: `lock_timeout`; a check that this storage's own
/// session key is held by some session (its liveness connection), else
/// [`Error::Unavailable`] and nothing is decided; the lease row `FOR
/// UPDATE` (inserting a blank row with token 0 first when there is none),
/// then, when another storage's session holds an unexpired lease, a probe
/// of its session lock, then the decision in a statement of its own.
///
/// The first check keeps a node from holding the lease without its
/// liveness lock (while its liveness connection reconnects): any standby
/// would find such a holder gone and take the lease straight back.
pub(super) async fn acquire(
    client: &mut Object,
    candidate: &Candidate,
    ttl_ms: i64,
    lock_timeout: &str,
    own_session: i64,
) -> Result<Acquire> {
    let name = candidate.lease_name.as_str();
    if let Some(info) = held_at_a_glance(client, name, own_session).await? {
        return Ok(Acquire::Held(info));
    }
    let tx = read_committed(client).await?;
    tx.execute(
        "SELECT set_config('lock_timeout', $1, true)",
        &[&lock_timeout],
    )
    .await?;
    let probe = tx.prepare_cached(PROBE_HOLDER_SQL).await?;
    let own_key_free: bool = tx
        .query_one(&probe, &[&own_session, &twin_key(own_session)])
        .await?
        .try_get(0)?;
    if own_key_free {
        tx.rollback().await?;
        return Err(Error::unavailable(
            "neither of this node's liveness connections holds its session lock (they \
             are reconnecting); the lease is not acquired until one does",
        ));
    }
    let lock = tx.prepare_cached(LOCK_FOR_TAKEOVER_SQL).await?;
    let mut fresh = false;
    if tx.query_opt(&lock, &[&name]).await?.is_none() {
        // The blank row never becomes visible as such: the takeover below
        // always matches it (holder NULL) in this same transaction. Another
        // node inserting at the same time makes this wait for its commit,
        // then do nothing.
        let inserted = tx
            .execute(
                "INSERT INTO storage_leases \
                 (name, holder, holder_url, holder_session, token, expires_at, acquired_at, renewed_at) \
                 VALUES ($1, NULL, NULL, NULL, 0, clock_timestamp(), clock_timestamp(), clock_timestamp()) \
                 ON CONFLICT (name) DO NOTHING",
                &[&name],
            )
            .await?;
        fresh = inserted == 1;
        if tx.query_opt(&lock, &[&name]).await?.is_none() {
            return Err(Error::corrupt(format!(
                "the lease row {name:?} vanished inside an acquire"
            )));
        }
    }
    let read_holder = tx.prepare_cached(READ_HOLDER_SQL).await?;
    let holder = tx.query_one(&read_holder, &[&name]).await?;
    let live: bool = holder.try_get(0)?;
    let holder_session: Option<String> = holder.try_get(1)?;
    let holder_id: Option<String> = holder.try_get(2)?;
    let own_session_text = own_session.to_string();
    // A live lease of this very storage: an earlier acquire of ours that
    // committed after its caller gave up waiting. Nobody holds its token,
    // so it is taken again (with a new token) instead of blocking every
    // node until it expires.
    let reclaimed = live
        && holder_session.as_deref() == Some(own_session_text.as_str())
        && holder_id.as_deref() == Some(candidate.node_id.as_str());
    let mut holder_gone = reclaimed;
    if let Some(key) = holder_session
        .filter(|s| live && *s != own_session_text)
        .and_then(|s| s.parse::<i64>().ok())
    {
        let gone = tx.prepare_cached(HOLDER_GONE_SQL).await?;
        holder_gone = tx
            .query_one(&gone, &[&key, &HOLDER_GONE_GRACE_MS, &twin_key(key)])
            .await?
            .try_get(0)?;
    }
    let take_over = tx.prepare_cached(TAKE_OVER_SQL).await?;
    let taken = tx
        .query_opt(
            &take_over,
            &[
                &name,
                &candidate.node_id,
                &candidate.advertise_url,
                &ttl_ms,
                &holder_gone,
                &own_session_text,
            ],
        )
        .await?;
    let Some(row) = taken else {
        let info = read_lease_info(&*tx, name).await?.ok_or_else(|| {
            Error::corrupt(format!("the lease row {name:?} vanished inside an acquire"))
        })?;
        tx.rollback().await?;
        return Ok(Acquire::Held(info));
    };
    let token = to_token(row.try_get(0)?)?;
    let previous: Option<String> = row.try_get(1)?;
    let expired: bool = row.try_get(2)?;
    let released_by: Option<String> = row.try_get(3)?;
    let reason = match (&previous, fresh, expired) {
        (_, true, _) => TakeoverReason::Fresh,
        (Some(_), false, false) if reclaimed => TakeoverReason::Reclaimed,
        (None, false, _) => TakeoverReason::Released,
        (Some(_), false, true) => TakeoverReason::Expired,
        (Some(_), false, false) => TakeoverReason::HolderGone,
    };
    // After a release the row names no holder: the node that released it
    // is the previous one.
    let previous = if reason == TakeoverReason::Released {
        released_by
    } else {
        previous
    };
    let record = tx.prepare_cached(RECORD_TAKEOVER_SQL).await?;
    let sql_token = row.try_get::<_, i64>(0)?;
    tx.execute(&record, &[&name, &reason.as_str(), &sql_token])
        .await?;
    let history = tx.prepare_cached(RECORD_HISTORY_SQL).await?;
    tx.execute(
        &history,
        &[
            &name,
            &sql_token,
            &candidate.node_id,
            &previous,
            &reason.as_str(),
        ],
    )
    .await?;
    let prune = tx.prepare_cached(PRUNE_HISTORY_SQL).await?;
    tx.execute(&prune, &[&name, &sql_token]).await?;
    tx.commit().await?;
    Ok(acquired(candidate, token, reason, previous.as_deref()))
}

/// Decides without locks whether a takeover is out of the question: a
/// plain read of the lease row (no row lock) and, when another storage's
/// session holds an unexpired lease, a probe of that session's lock in a
/// statement of its own (its transaction-level lock ends with the
/// statement). Returns the lease when it is live and its holder's session
/// is alive: the acquire then declines without ever taking `FOR UPDATE`,
/// which would conflict with the holder's fenced writes (`FOR KEY SHARE`)
/// and renewals (`FOR NO KEY UPDATE`). Declining on this read is always
/// safe; every takeover is still decided under the row lock.
async fn held_at_a_glance(
    client: &Object,
    name: &str,
    own_session: i64,
) -> Result<Option<LeaseInfo>> {
    let read_holder = client.prepare_cached(READ_HOLDER_SQL).await?;
    let Some(row) = client.query_opt(&read_holder, &[&name]).await? else {
        return Ok(None);
    };
    let live: bool = row.try_get(0)?;
    let holder_session: Option<String> = row.try_get(1)?;
    let Some(key) = holder_session
        .filter(|s| live && *s != own_session.to_string())
        .and_then(|s| s.parse::<i64>().ok())
    else {
        return Ok(None);
    };
    let gone = client.prepare_cached(HOLDER_GONE_SQL).await?;
    let holder_gone: bool = client
        .query_one(&gone, &[&key, &HOLDER_GONE_GRACE_MS, &twin_key(key)])
        .await?
        .try_get(0)?;
    if holder_gone {
        return Ok(None);
    }
    let client: &tokio_postgres::Client = client;
    read_lease_info(client, name).await
}

/// Clears the holder if `lease` is current, recording it as
/// `released_by` (schema version 14) for the next acquisition's takeover
/// record; the token stays. One
/// autocommitted statement: its `UPDATE` locks the row `FOR NO KEY UPDATE`,
/// so it does not wait for fenced writes; a write in flight either finishes
/// before a later acquire (which waits for it) or, if it starts after the
/// release, finds no holder and fails. When it cleared the holder it also
/// sends the lease's name on [`LEASE_CHANNEL`], delivered at commit, so
/// that standbys try to acquire at once.
pub(super) async fn release(client: &Object, lease: &Lease) -> Result<()> {
    let Ok(token) = sql_token(lease) else {
        return Ok(());
    };
    let stmt = client
        .prepare_cached(
            "WITH released AS ( \
                 UPDATE storage_leases SET released_by = holder, holder = NULL, holder_url = NULL, \
                 holder_session = NULL, expires_at = clock_timestamp() \
                 WHERE name = $1 AND holder = $2 AND token = $3 RETURNING name) \
             SELECT pg_notify($4, name) FROM released",
        )
        .await?;
    let updated = client
        .execute(&stmt, &[&lease.name, &lease.holder, &token, &LEASE_CHANNEL])
        .await?;
    log_release(lease, updated > 0);
    Ok(())
}

/// Serializes the fenced writes of one lease until commit.
const WRITE_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock($1)";

/// Holds the lease row against a takeover until commit; does not conflict
/// with a renewal's `FOR NO KEY UPDATE`. This is where a fenced write may
/// wait (for an acquire in progress).
const LOCK_FOR_WRITE_SQL: &str = "SELECT 1 FROM storage_leases WHERE name = $1 FOR KEY SHARE";

/// The fencing check, run after the row lock is held so that its clock
/// reading is taken after any wait: holder and token current and not
/// expired. Also reads the batch's commit time.
const FENCING_CHECK_SQL: &str = "SELECT l.holder IS NOT DISTINCT FROM $2 AND l.token = $3 \
         AND l.expires_at > c.now, c.now \
     FROM storage_leases AS l, (SELECT clock_timestamp() AS now) AS c \
     WHERE l.name = $1";

/// The commit time of a fenced write under the test-only fault switch
/// `skip_fencing_check`, which skips [`FENCING_CHECK_SQL`] (that reads it
/// otherwise); see [`fenced`].
const COMMIT_TIME_SQL: &str = "SELECT clock_timestamp()";

/// Whether a fenced write takes the lease's advisory lock
/// ([`WRITE_LOCK_SQL`]) in its prelude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Serialized {
    /// It does: its commit is ordered with every other fenced write of the
    /// lease that takes it (`append` and `record_deletion`: message ids
    /// and deletion numbers follow commit order).
    Yes,
    /// It does not (`trim`: it inserts nothing, so it cannot disturb the
    /// commit order of message ids).
    No,
}

/// A locking read that a fenced write needs held before its fencing
/// check (`trim`'s channel row): its SQL and parameters, run in the
/// prelude after the lease row lock, so that the check's clock reading is
/// taken after its wait too.
type LockingRead<'a> = (&'static str, &'a [&'a (dyn ToSql + Sync)]);

/// A fenced write's transaction once its prelude passed.
pub(super) struct Fenced<'c> {
    /// The transaction, holding the prelude's locks until it ends.
    pub(super) tx: deadpool_postgres::Transaction<'c>,
    /// What the decision to commit needs.
    pub(super) fence: Fence,
    /// The row of the prelude's [`LockingRead`]; `None` without one, or
    /// when it found no row.
    pub(super) locked: Option<tokio_postgres::Row>,
}

/// The fencing check of one fenced write, for its decision to commit.
pub(super) struct Fence {
    /// [`FENCING_CHECK_SQL`], prepared on the write's connection.
    check: tokio_postgres::Statement,
    /// The lease's token as stored.
    pub(super) token: i64,
    /// The test-only fault switch `skip_fencing_check`, read once by the
    /// prelude.
    skip: bool,
    /// The database clock read by the prelude's check (under
    /// `skip_fencing_check`, by [`COMMIT_TIME_SQL`]).
    pub(super) now: SystemTime,
}

/// The fenced-write prelude, the one every fenced write (`append`, `trim`,
/// `record_deletion`) runs: starts a READ COMMITTED transaction, then, in
/// one round trip, takes the lease's advisory lock ([`WRITE_LOCK_SQL`],
/// when `serialized`), locks the lease row `FOR KEY SHARE`
/// ([`LOCK_FOR_WRITE_SQL`]), runs `also` and makes the fencing check
/// ([`FENCING_CHECK_SQL`]), in that order, so that the check reads the
/// clock after every wait before it. Statements sent together are
/// answered in order; after the first error the server refuses the rest
/// ("current transaction is aborted"), so every answer is awaited and the
/// first error in statement order, the cause, is the one returned
/// (`tokio::join!` polls its futures in an order of its own).
///
/// The test-only fault switch `skip_fencing_check` acts here and only
/// here (see `herald_core::fault_switches::FaultSwitch`): no lease row
/// lock and no fencing check, in the prelude or in [`Fence::decide`]; the
/// advisory lock and `also` are still taken, and the clock is read by
/// [`COMMIT_TIME_SQL`].
///
/// # Errors
/// [`Error::LeaseLost`] when the check fails (the transaction is rolled
/// back first, see [`refuse`]); the driver's error of the first statement
/// that failed otherwise.
pub(super) async fn fenced<'c>(
    client: &'c mut Object,
    lease: &Lease,
    serialized: Serialized,
    also: Option<LockingRead<'_>>,
) -> Result<Fenced<'c>> {
    let token = sql_token(lease)?;
    let tx = read_committed(client).await?;
    let skip = fault_switches::enabled(FaultSwitch::SkipFencingCheck);
    let (write_lock, lock_row, also_stmt, check, commit_time) = tokio::join!(
        tx.prepare_cached(WRITE_LOCK_SQL),
        tx.prepare_cached(LOCK_FOR_WRITE_SQL),
        async {
            match also {
                Some((sql, _)) => tx.prepare_cached(sql).await.map(Some),
                None => Ok(None),
            }
        },
        tx.prepare_cached(FENCING_CHECK_SQL),
        tx.prepare_cached(COMMIT_TIME_SQL),
    );
    let (write_lock, lock_row, also_stmt, check, commit_time) =
        (write_lock?, lock_row?, also_stmt?, check?, commit_time?);
    let lock_key = fenced_write_lock_key(&lease.name);
    let (write_locked, row_locked, also_row, checked) = tokio::join!(
        async {
            match serialized {
                Serialized::Yes => tx.execute(&write_lock, &[&lock_key]).await.map(drop),
                Serialized::No => Ok(()),
            }
        },
        async {
            if skip {
                Ok(None)
            } else {
                tx.query_opt(&lock_row, &[&lease.name]).await
            }
        },
        async {
            match (&also_stmt, also) {
                (Some(stmt), Some((_, params))) => tx.query_opt(stmt, params).await,
                _ => Ok(None),
            }
        },
        async {
            if skip {
                // Test-only fault switch: no fencing check.
                tx.query_one(&commit_time, &[]).await.map(Some)
            } else {
                tx.query_opt(&check, &[&lease.name, &lease.holder, &token])
                    .await
            }
        },
    );
    write_locked?;
    row_locked?;
    let locked = also_row?;
    let checked = checked?;
    let now = if skip {
        checked.map(|row| row.try_get(0)).transpose()?
    } else {
        fencing_outcome(checked)?
    };
    let Some(now) = now else {
        return Err(refuse(tx, lease).await);
    };
    Ok(Fenced {
        tx,
        fence: Fence {
            check,
            token,
            skip,
            now,
        },
        locked,
    })
}

impl Fence {
    /// The decision to commit: the fencing check again, in `tx` (or,
    /// under the test-only `skip_fencing_check`, the prelude's clock
    /// reading).
    pub(super) async fn decide(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        lease: &Lease,
    ) -> Result<Decision> {
        if self.skip {
            return Ok(Decision::Commit(self.now));
        }
        let checked = tx
            .query_opt(&self.check, &[&lease.name, &lease.holder, &self.token])
            .await?;
        Ok(match fencing_outcome(checked)? {
            Some(now) => Decision::Commit(now),
            None => Decision::Refuse,
        })
    }
}

/// The change notices of a fenced write, one per channel written: payload
/// `<from> <to> <committed_at_ms> <channel>` on [`CHANGES_CHANNEL`], with
/// the database clock read by this statement, just before `COMMIT`.
/// PostgreSQL queues them and delivers them only if the transaction commits
/// (PostgreSQL documentation, `NOTIFY`).
pub(super) const NOTIFY_SQL: &str = "SELECT pg_notify($1, \
         u.first::text || ' ' || u.last::text || ' ' || n.ms::text || ' ' || u.channel) \
     FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(channel, first, last), \
          (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) AS n";

/// The stored messages of a batch's idempotency keys: `(channel, key,
/// offset, published_at, digest)` for every `(channel, key)` pair of the
/// arrays that is stored (`digest` NULL for keys stored before schema
/// version 2).
pub(super) const FIND_KEYS_SQL: &str =
    "SELECT m.channel, m.idempotency_key, m.\"offset\", m.published_at, \
            m.idempotency_digest \
     FROM messages AS m \
     JOIN unnest($1::text[], $2::text[]) AS k(channel, key) \
       ON m.channel = k.channel AND m.idempotency_key = k.key";

/// Advances the head of every channel of the arrays by its count and its
/// stored bytes by the batch's bytes (`$4`; creating the channel at that
/// head, with `created_at` `$3`), in one statement;
/// returns each channel's new head. This is where the batch may wait on a
/// channel's row lock. Each channel appears once in the arrays. A closed
/// stream, an expired one (at `$3`), or one whose payloads are of the
/// other kind (`$5`: the batch's are JSON), is not moved and not
/// returned; a live stream with a TTL has it restarted (`touched_at`), as
/// a stream append does.
pub(super) const BUMP_HEADS_SQL: &str =
    "INSERT INTO channels (name, head, created_at, bytes, json) \
     SELECT name, n, $3, b, j \
     FROM unnest($1::text[], $2::bigint[], $4::bigint[], $5::boolean[]) AS u(name, n, b, j) \
     ON CONFLICT (name) DO UPDATE SET head = channels.head + excluded.head, \
         bytes = channels.bytes + excluded.bytes, \
         touched_at = CASE WHEN channels.ttl_s IS NULL THEN channels.touched_at ELSE $3 END \
     WHERE NOT channels.closed AND channels.json = excluded.json \
       AND NOT (channels.content_type IS NOT NULL \
                AND COALESCE(LEAST(channels.expires_at, \
                                   channels.touched_at + channels.ttl_s * interval '1 second'), \
                             'infinity') <= $3) \
     RETURNING name, head";

/// Inserts every new message of the batch in one statement:
/// `(channel, offset, data, idempotency key, digest, tags)` arrays, with
/// the batch's `published_at` (`$5`) and fencing token (`$6`), in array
/// order, so that message ids follow the batch's order as they did row by
/// row.
pub(super) const INSERT_MESSAGES_SQL: &str = "INSERT INTO messages \
     (channel, \"offset\", data, published_at, idempotency_key, token, idempotency_digest, tags, body) \
     SELECT channel, \"offset\", data, $5, key, $6, digest, tags, body \
     FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $7::bytea[], $8::text[], $9::bytea[]) \
       WITH ORDINALITY AS u(channel, \"offset\", data, key, digest, tags, body, position) \
     ORDER BY position";

/// A channel that a fenced write adds new messages to, and the range of
/// their offsets (offsets of one channel in one batch are contiguous): one
/// head bump and one change notice.
pub(super) struct Written<'a> {
    /// The channel's name.
    pub(super) channel: &'a str,
    /// New messages of this channel in the batch.
    pub(super) count: i64,
    /// Offset of the batch's first new message in the channel (known once
    /// the head moved).
    pub(super) first: i64,
    /// Offset of the batch's last new message in the channel: the new head.
    pub(super) last: i64,
    /// Bytes of data of the batch's new messages in the channel.
    pub(super) bytes: i64,
    /// Whether its messages are JSON (else bytes).
    pub(super) json: bool,
    /// Index in the batch of its first new message.
    pub(super) index: usize,
}

/// A stored idempotency key's message: offset, `published_at`, and the
/// digest stored with the key (`None` for keys stored before schema
/// version 2).
pub(super) type StoredKey<'a> = (i64, SystemTime, Option<&'a [u8]>);

/// What the last fencing check of a fenced write decided.
pub(super) enum Decision {
    /// The lease is this node's and live: commit, with this clock reading
    /// as `published_at`.
    Commit(SystemTime),
    /// The lease is lost: roll back.
    Refuse,
}

/// How one message of a batch is written.
pub(super) enum Planned {
    /// Its idempotency key is stored already: answer the stored message.
    Duplicate {
        offset: i64,
        published_at: SystemTime,
    },
    /// Its idempotency key was used by an earlier new message of this
    /// batch: the `rank`-th new message of `written[written]`.
    DuplicateInBatch { written: usize, rank: i64 },
    /// A new message: the `rank`-th (from 0) new message of its channel,
    /// `written[written]`, in this batch.
    New { written: usize, rank: i64 },
    /// Not a message: a stream append, written by
    /// `streams.rs`' `apply_append`.
    Stream,
}

/// Reads the answer of [`FENCING_CHECK_SQL`]: the clock reading when the
/// lease is this node's and live, `None` when it is lost.
fn fencing_outcome(checked: Option<tokio_postgres::Row>) -> Result<Option<SystemTime>> {
    match checked {
        Some(row) if row.try_get::<_, bool>(0)? => Ok(Some(row.try_get(1)?)),
        _ => Ok(None),
    }
}

/// Rolls back a fenced write whose fencing check failed and returns
/// [`Error::LeaseLost`], whatever the rollback does: a connection that
/// broke during it must not turn a lost lease into "unavailable" (the pool
/// drops closed connections).
pub(super) async fn refuse(tx: deadpool_postgres::Transaction<'_>, lease: &Lease) -> Error {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(error = %Error::from(e), "rollback after a failed fencing check");
    }
    log_lost(lease, "fenced write refused");
    lost(lease)
}

/// Rolls back a fenced write whose message `index` reuses an idempotency
/// key for a different message, and returns
/// [`Error::IdempotencyKeyReused`], whatever the rollback does (nothing was
/// written yet, and a transaction that is not committed never is).
pub(super) async fn key_reused(tx: deadpool_postgres::Transaction<'_>, index: usize) -> Error {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(error = %Error::from(e), "rollback after a reused idempotency key");
    }
    Error::IdempotencyKeyReused { index }
}

/// Rolls back a fenced write whose message `index` goes to a channel that
/// refuses it and returns [`Error::ChannelRefuses`], whatever the rollback
/// does.
pub(super) async fn channel_refuses(
    tx: deadpool_postgres::Transaction<'_>,
    index: usize,
    refusal: Refusal,
) -> Error {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(error = %Error::from(e), "rollback after a refused channel");
    }
    Error::ChannelRefuses { index, refusal }
}

/// The [`Error::ChannelRefuses`] of a batch whose head bump left out a
/// written channel (`heads` lacks it): reads why (closed, expired at
/// `at`, or another content type), then rolls back.
pub(super) async fn refused_channel(
    tx: deadpool_postgres::Transaction<'_>,
    written: &[Written<'_>],
    heads: &[tokio_postgres::Row],
    at: &(dyn tokio_postgres::types::ToSql + Sync),
) -> Error {
    let moved: Vec<&str> = heads.iter().filter_map(|r| r.try_get(0).ok()).collect();
    let Some(w) = written.iter().find(|w| !moved.contains(&w.channel)) else {
        return Error::corrupt("a refused channel was not found");
    };
    let why = async {
        let stmt = tx
            .prepare_cached(
                "SELECT closed, content_type IS NOT NULL \
                   AND COALESCE(LEAST(expires_at, touched_at + ttl_s * interval '1 second'), \
                                'infinity') <= $2 \
                 FROM channels WHERE name = $1",
            )
            .await?;
        let row = tx.query_one(&stmt, &[&w.channel, at]).await?;
        Ok::<_, tokio_postgres::Error>((row.try_get::<_, bool>(0)?, row.try_get::<_, bool>(1)?))
    }
    .await;
    let refusal = match why {
        Ok((true, _)) => Refusal::Closed,
        Ok((false, true)) => Refusal::Expired,
        Ok((false, false)) => Refusal::ContentType,
        Err(e) => return Error::from(e),
    };
    channel_refuses(tx, w.index, refusal).await
}

/// A page of one channel with the channel's head, in one statement (one
/// snapshot). The outer row always exists, so an empty page still carries
/// the head. An expired stream reads as deleted: no message, earliest
/// `head + 1` (its expiry as `Storage::stream_info` judges it, on the
/// database's clock).
pub(super) async fn read(
    client: &Object,
    channel: &ChannelName,
    after: Offset,
    limit: usize,
) -> Result<Page> {
    let stmt = client
        .prepare_cached(
            "SELECT h.head, h.trimmed_through, m.\"offset\", m.data, m.published_at, h.deletion, m.tags, m.body \
             FROM (SELECT COALESCE(c.head, 0) AS head, \
                          CASE WHEN c.expired THEN c.head \
                               ELSE COALESCE(c.trimmed_through, 0) END AS trimmed_through, \
                          COALESCE(c.expired, false) AS expired, \
                          COALESCE(d.deletion, 0) AS deletion \
                   FROM (SELECT 1) AS one \
                   LEFT JOIN (SELECT head, trimmed_through, \
                                     content_type IS NOT NULL \
                                     AND COALESCE(LEAST(expires_at, touched_at + ttl_s * interval '1 second'), \
                                                  'infinity') <= clock_timestamp() AS expired \
                              FROM channels WHERE name = $1) AS c ON true \
                   LEFT JOIN channel_deletions AS d ON d.channel = $1) AS h \
             LEFT JOIN LATERAL ( \
                 SELECT \"offset\", data, published_at, tags, body FROM messages \
                 WHERE channel = $1 AND \"offset\" > $2 AND NOT h.expired ORDER BY \"offset\" LIMIT $3 \
             ) AS m ON true \
             ORDER BY m.\"offset\"",
        )
        .await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(&stmt, &[&channel.as_str(), &sql_position(after), &limit])
        .await?;
    let mut head = 0;
    let mut trimmed_through = 0;
    let mut deletion = 0;
    let mut messages = Vec::with_capacity(rows.len());
    for row in rows {
        head = to_u64(row.try_get(0)?, "head")?;
        trimmed_through = to_u64(row.try_get(1)?, "trimmed_through")?;
        deletion = to_u64(row.try_get(5)?, "deletion")?;
        let Some(offset) = row.try_get::<_, Option<i64>>(2)? else {
            continue;
        };
        let published_at: SystemTime = row.try_get(4)?;
        messages.push(Message {
            offset: to_u64(offset, "offset")?,
            data: to_payload(row.try_get(3)?, row.try_get(7)?)?,
            published_at_ms: to_ms(published_at),
            tags: to_tags(row.try_get(6)?)?,
        });
    }
    Ok(Page {
        head,
        earliest: trimmed_through + 1,
        messages,
        deletion,
    })
}

/// Every channel with its head, by name in byte order.
pub(super) async fn channels(client: &Object) -> Result<Vec<ChannelHead>> {
    let stmt = client
        .prepare_cached("SELECT name, head FROM channels ORDER BY name COLLATE \"C\"")
        .await?;
    client
        .query(&stmt, &[])
        .await?
        .into_iter()
        .map(|row| {
            Ok(ChannelHead {
                name: to_channel(row.try_get(0)?)?,
                head: to_u64(row.try_get(1)?, "head")?,
            })
        })
        .collect()
}

/// Every channel with its head, earliest offset and size, by name in byte
/// order.
pub(super) async fn channel_stats(client: &Object) -> Result<Vec<ChannelStats>> {
    let stmt = client
        .prepare_cached(
            "SELECT name, head, trimmed_through, bytes FROM channels ORDER BY name COLLATE \"C\"",
        )
        .await?;
    client
        .query(&stmt, &[])
        .await?
        .into_iter()
        .map(|row| {
            let head = to_u64(row.try_get(1)?, "head")?;
            let trimmed_through = to_u64(row.try_get(2)?, "trimmed_through")?;
            Ok(ChannelStats {
                name: to_channel(row.try_get(0)?)?,
                head,
                earliest: trimmed_through + 1,
                messages: head.saturating_sub(trimmed_through),
                bytes: to_u64(row.try_get(3)?, "bytes")?,
            })
        })
        .collect()
}

/// A page of channels for `Storage::channel_page`: names after `$1`
/// containing `$2`, by name in byte order, at most `$3`; with the head
/// message's publish time (one index lookup each) and the subscribers in
/// the unexpired node reports.
const CHANNEL_PAGE_SQL: &str =
    "SELECT c.name, c.head, c.trimmed_through, c.bytes, c.content_type, \
         (SELECT m.published_at FROM messages m \
          WHERE m.channel = c.name AND m.\"offset\" = c.head), \
         (SELECT COALESCE(SUM(cc.num_subscribers), 0)::bigint FROM cluster_channels cc \
          JOIN cluster_nodes n ON n.node_id = cc.node_id \
          WHERE cc.channel = c.name AND n.expires_at > clock_timestamp()) \
     FROM channels c WHERE c.name > $1 AND strpos(c.name, $2) > 0 \
     ORDER BY c.name COLLATE \"C\" LIMIT $3";

/// One page of channels (`Storage::channel_page`).
pub(super) async fn channel_page(
    client: &Object,
    search: &str,
    after: Option<&ChannelName>,
    limit: usize,
) -> Result<Vec<ChannelSummary>> {
    let stmt = client.prepare_cached(CHANNEL_PAGE_SQL).await?;
    let after = after.map_or("", ChannelName::as_str);
    let limit = i64::try_from(limit.min(MAX_CHANNEL_PAGE)).unwrap_or(0);
    client
        .query(&stmt, &[&after, &search, &limit])
        .await?
        .into_iter()
        .map(|row| {
            let head = to_u64(row.try_get(1)?, "head")?;
            let trimmed_through = to_u64(row.try_get(2)?, "trimmed_through")?;
            Ok(ChannelSummary {
                name: to_channel(row.try_get(0)?)?,
                head,
                earliest: trimmed_through + 1,
                messages: head.saturating_sub(trimmed_through),
                bytes: to_u64(row.try_get(3)?, "bytes")?,
                content_type: row.try_get(4)?,
                last_published_at_ms: row.try_get::<_, Option<SystemTime>>(5)?.map(to_ms),
                subscribers: to_u64(row.try_get(6)?, "num_subscribers")?,
            })
        })
        .collect()
}

/// Locks a channel's row against appends (which update it) until commit,
/// and reads what a trim needs of it.
const LOCK_CHANNEL_SQL: &str =
    "SELECT head, trimmed_through, bytes FROM channels WHERE name = $1 FOR UPDATE";

/// The oldest `$4` stored messages of channel `$1` above `$2`: offset,
/// data size in bytes, and whether older than `$3` ms on the database
/// clock (false when `$3` is NULL).
const TRIM_CANDIDATES_SQL: &str = "SELECT \"offset\", COALESCE(octet_length(body), octet_length(data))::bigint, \
         COALESCE(published_at <= clock_timestamp() - $3::bigint * interval '1 millisecond', false) \
     FROM messages WHERE channel = $1 AND \"offset\" > $2 ORDER BY \"offset\" LIMIT $4";

/// Removes the messages of channel `$1` in `$2 < offset <= $3` (their
/// idempotency keys are columns of their rows and go with them).
const TRIM_DELETE_SQL: &str =
    "DELETE FROM messages WHERE channel = $1 AND \"offset\" > $2 AND \"offset\" <= $3";

/// Records a trim on the channel's row.
const TRIM_RECORD_SQL: &str =
    "UPDATE channels SET trimmed_through = $2, bytes = bytes - $3 WHERE name = $1";

/// The fenced trim: one READ COMMITTED transaction that runs the
/// fenced-write prelude ([`fenced`]), which locks the lease row `FOR KEY
/// SHARE` (an acquire waits for it, a renewal does not), then the
/// channel's row `FOR UPDATE` (so appends to that channel wait for it, and
/// it for them: offsets stay contiguous), then makes the fencing check
/// after both waits; then reads the oldest
/// `max_rows` messages, removes the prefix that [`trim::plan`] picks and
/// records the new `trimmed_through` and `bytes`. It does not take the
/// fenced writes' advisory lock: it inserts nothing, so it cannot disturb
/// the commit order of message ids, and a fenced write to other channels
/// never waits for it (one to this channel does, holding the advisory
/// lock, so `max_rows` bounds what every queued write waits). Removed rows become dead tuples that autovacuum reclaims
/// for reuse (docs/retention.md).
///
/// The test-only fault switch `skip_fencing_check` acts here as on every
/// fenced write (see [`fenced`]).
pub(super) async fn trim(
    client: &mut Object,
    lease: &Lease,
    channel: &ChannelName,
    limits: &TrimLimits,
    max_rows: usize,
) -> Result<Trimmed> {
    let name = channel.as_str();
    let Fenced {
        tx, locked: window, ..
    } = fenced(
        client,
        lease,
        Serialized::No,
        Some((LOCK_CHANNEL_SQL, &[&name])),
    )
    .await?;
    let Some(window) = window else {
        tx.rollback().await?;
        return Ok(Trimmed {
            earliest: 1,
            done: true,
            ..Trimmed::default()
        });
    };
    let window = trim::ChannelWindow {
        head: window.try_get(0)?,
        trimmed_through: window.try_get(1)?,
        bytes: window.try_get(2)?,
    };
    let max_age_ms = limits
        .max_age_ms
        .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
    let rows_limit = i64::try_from(max_rows).unwrap_or(i64::MAX);
    let candidates_stmt = tx.prepare_cached(TRIM_CANDIDATES_SQL).await?;
    let candidates = tx
        .query(
            &candidates_stmt,
            &[&name, &window.trimmed_through, &max_age_ms, &rows_limit],
        )
        .await?
        .into_iter()
        .map(|row| {
            Ok(trim::Candidate {
                offset: row.try_get(0)?,
                size: row.try_get(1)?,
                expired: row.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let plan = trim::plan(window, &candidates, limits, max_rows);
    if plan.messages > 0 {
        let (delete, record) = tokio::join!(
            tx.prepare_cached(TRIM_DELETE_SQL),
            tx.prepare_cached(TRIM_RECORD_SQL),
        );
        let (delete, record) = (delete?, record?);
        let (deleted, recorded) = tokio::join!(
            async {
                tx.execute(&delete, &[&name, &window.trimmed_through, &plan.through])
                    .await
            },
            async {
                tx.execute(&record, &[&name, &plan.through, &plan.bytes])
                    .await
            },
        );
        deleted?;
        recorded?;
    }
    tx.commit().await?;
    Ok(Trimmed {
        messages: to_u64(plan.messages, "messages trimmed")?,
        bytes: to_u64(plan.bytes, "bytes trimmed")?,
        earliest: to_u64(plan.through, "trimmed_through")? + 1,
        head: to_u64(window.head, "head")?,
        done: plan.done,
    })
}

/// Gives the channel's deletion the next number: upserts its row of
/// `channel_deletions`. Run under the lease's advisory lock, which orders
/// the numbers as the commits.
const RECORD_DELETION_SQL: &str = "INSERT INTO channel_deletions (channel, deletion, head, deleted_at) \
     VALUES ($1, (SELECT COALESCE(MAX(deletion), 0) + 1 FROM channel_deletions), $2, clock_timestamp()) \
     ON CONFLICT (channel) DO UPDATE SET deletion = excluded.deletion, head = excluded.head, \
         deleted_at = excluded.deleted_at \
     RETURNING deletion";

/// The change notice of a deletion: payload `deleted <number> <head>
/// <channel>` on [`CHANGES_CHANNEL`] (read by `listen.rs`), delivered
/// only if the transaction commits (PostgreSQL documentation, `NOTIFY`).
const NOTIFY_DELETION_SQL: &str = "SELECT pg_notify($1, $2)";

/// The fenced record of a channel's deletion: one READ COMMITTED
/// transaction that runs the fenced-write prelude ([`fenced`]: the lease's
/// advisory lock, as `append` takes it, so the fenced writes of a lease,
/// and so the deletion numbers, are serialized until commit; the lease row
/// `FOR KEY SHARE`; the fencing check after both waits), then upserts the channel's row of
/// `channel_deletions` with the next number and sends its change notice,
/// before `COMMIT`. Returns the number.
///
/// The test-only fault switch `drop_notify` drops the notice, as it does
/// `append`'s; `skip_fencing_check` acts here as on every fenced write
/// (see [`fenced`]).
pub(super) async fn record_deletion(
    client: &mut Object,
    lease: &Lease,
    channel: &ChannelName,
    head: Offset,
) -> Result<u64> {
    let Fenced { tx, .. } = fenced(client, lease, Serialized::Yes, None).await?;
    let record = tx.prepare_cached(RECORD_DELETION_SQL).await?;
    let number = to_u64(
        tx.query_one(&record, &[&channel.as_str(), &sql_position(head)])
            .await?
            .try_get(0)?,
        "deletion",
    )?;
    // A deleted stream is a stream no more.
    let (clear, forget) = tokio::join!(
        tx.prepare_cached(
            "UPDATE channels SET content_type = NULL, json = true, closed = false, ttl_s = NULL, \
             expires_at = NULL, touched_at = NULL, stream_seq = NULL, closed_by = NULL, \
             closed_by_epoch = NULL, closed_by_seq = NULL, fork_of = NULL, \
             fork_sub_offset = NULL, soft_deleted = false WHERE name = $1",
        ),
        tx.prepare_cached("DELETE FROM stream_producers WHERE channel = $1"),
    );
    tx.execute(&clear?, &[&channel.as_str()]).await?;
    tx.execute(&forget?, &[&channel.as_str()]).await?;
    // Its forks hold their own copies: they are forks of it no more (a
    // stream created again at its name starts without forks).
    let orphan = tx
        .prepare_cached("UPDATE channels SET fork_of = NULL WHERE fork_of = $1")
        .await?;
    tx.execute(&orphan, &[&channel.as_str()]).await?;
    if !fault_switches::enabled(FaultSwitch::DropNotify) {
        let payload = format!("deleted {number} {head} {channel}");
        let notify = tx.prepare_cached(NOTIFY_DELETION_SQL).await?;
        tx.query(&notify, &[&CHANGES_CHANNEL, &payload]).await?;
    }
    tx.commit().await?;
    Ok(number)
}

/// The latest deletion of every channel deleted after number `cursor`, in
/// number order, and the largest number seen (`cursor` when none).
/// Numbers are in commit order (see [`record_deletion`]), so a snapshot
/// that sees number `n` sees every smaller one that will ever commit.
pub(super) async fn deletions_since(client: &Object, cursor: u64) -> Result<Deletions> {
    let stmt = client
        .prepare_cached(
            "SELECT channel, head, deletion FROM channel_deletions WHERE deletion > $1 \
             ORDER BY deletion",
        )
        .await?;
    let mut out = Deletions {
        cursor,
        deleted: Vec::new(),
    };
    for row in client.query(&stmt, &[&sql_position(cursor)]).await? {
        let deletion = Deletion {
            channel: to_channel(row.try_get(0)?)?,
            head: to_u64(row.try_get(1)?, "head")?,
            number: to_u64(row.try_get(2)?, "deletion")?,
        };
        out.cursor = out.cursor.max(deletion.number);
        out.deleted.push(deletion);
    }
    Ok(out)
}

/// The largest deletion number, 0 when there is none.
pub(super) async fn deletion_cursor(client: &Object) -> Result<u64> {
    let stmt = client
        .prepare_cached("SELECT COALESCE(MAX(deletion), 0)::bigint FROM channel_deletions")
        .await?;
    to_u64(client.query_one(&stmt, &[]).await?.try_get(0)?, "deletion")
}

/// The most messages one scan of [`changes_since`] reads; a feed that
/// moved further takes several scans.
const CHANGE_SCAN_ROWS: i64 = 10_000;

/// The most scans of one [`changes_since`] call (1 000 000 messages); the
/// next call carries on from the cursor it returned.
const CHANGE_SCANS: usize = 100;

/// The channels with a message whose id is above `cursor`, with their
/// current head, ordered by name; the new cursor is the largest id seen,
/// or `cursor` when nothing moved.
///
/// Ids are in commit order because the fenced writes of a lease are
/// serialized by its advisory lock, held until after their commit is
/// visible: a snapshot that sees id `n` sees every smaller id that will
/// ever commit.
///
/// Each scan reads the messages after the cursor in id order, at most
/// [`CHANGE_SCAN_ROWS`] of them, which PostgreSQL can only answer through
/// the index on `id`: it costs what moved, not what is stored. Without
/// the `ORDER BY id LIMIT`, a plan made without the table's statistics
/// (a new or fast-growing table before autovacuum has analyzed it), or
/// the generic plan of a prepared statement (estimated without the
/// cursor's value; PostgreSQL documentation, `PREPARE`,
/// "plan_cache_mode"), scanned the whole table, so a standby's every
/// poll cost as much as all the messages stored. A full scan is followed
/// by another from the largest id it saw, until one reads fewer or
/// [`CHANGE_SCANS`] have run. Sent as
/// an unnamed statement (`query_typed`: parsed, planned and run in one
/// round trip), so that each scan is planned for its own values.
pub(super) async fn changes_since(client: &Object, cursor: u64) -> Result<ChangeFeed> {
    let mut heads: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut new_cursor = cursor;
    for _ in 0..CHANGE_SCANS {
        let rows = client
            .query_typed(
                "SELECT m.channel, c.head, m.last_id, m.n \
                 FROM (SELECT channel, MAX(id) AS last_id, COUNT(*) AS n \
                       FROM (SELECT channel, id FROM messages WHERE id > $1 ORDER BY id LIMIT $2) AS recent \
                       GROUP BY channel) AS m \
                 LEFT JOIN channels AS c ON c.name = m.channel",
                &[
                    (&sql_position(new_cursor), Type::INT8),
                    (&CHANGE_SCAN_ROWS, Type::INT8),
                ],
            )
            .await?;
        let mut read = 0_i64;
        for row in rows {
            read += row.try_get::<_, i64>(3)?;
            new_cursor = new_cursor.max(to_u64(row.try_get(2)?, "message id")?);
            // A message whose channel row is gone moved nothing to announce.
            if let Some(head) = row.try_get::<_, Option<i64>>(1)? {
                heads.insert(row.try_get(0)?, to_u64(head, "head")?);
            }
        }
        if read < CHANGE_SCAN_ROWS {
            break;
        }
    }
    let mut changed = Vec::with_capacity(heads.len());
    for (name, head) in heads {
        changed.push(ChannelHead {
            name: to_channel(name)?,
            head,
        });
    }
    Ok(ChangeFeed {
        cursor: new_cursor,
        changed,
    })
}

/// The largest message id, 0 when there is none.
pub(super) async fn change_cursor(client: &Object) -> Result<u64> {
    let stmt = client
        .prepare_cached("SELECT COALESCE(MAX(id), 0)::bigint FROM messages")
        .await?;
    to_u64(
        client.query_one(&stmt, &[]).await?.try_get(0)?,
        "message id",
    )
}

/// A trivial query that reads the schema.
pub(super) async fn ping(client: &Object) -> Result<()> {
    let stmt = client
        .prepare_cached("SELECT COUNT(*) FROM storage_leases")
        .await?;
    client.query_one(&stmt, &[]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ms_round_down_on_both_sides_of_the_epoch() {
        let at = |d: Duration| UNIX_EPOCH + d;
        assert_eq!(to_ms(at(Duration::from_micros(1_500))), 1);
        assert_eq!(to_ms(UNIX_EPOCH), 0);
        assert_eq!(to_ms(UNIX_EPOCH - Duration::from_micros(1_500)), -2);
        assert_eq!(to_ms(UNIX_EPOCH - Duration::from_millis(3)), -3);
    }
}

/// Needs the test cluster (`HERALD_TEST_DATABASE_URL`), like the
/// integration tests.
#[cfg(all(test, feature = "testing"))]
mod database_tests {
    use herald_core::FencingToken;

    use super::*;
    use crate::postgres::connect::PostgresStorage;
    use crate::postgres::session::PostgresOptions;
    use crate::testing::TestDatabase;

    /// A fencing check that failed is reported as `LeaseLost` even when the
    /// rollback after it fails too (here: the connection's backend was
    /// terminated), not as a generic `Unavailable`: the holder must stop at
    /// once, not one batch later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_reports_the_lost_lease_whatever_the_rollback_does() {
        let db = TestDatabase::create().await;
        let storage = PostgresStorage::connect(db.url(), PostgresOptions::default())
            .await
            .unwrap();
        let mut client = storage.client().await.unwrap();
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let tx = client.build_transaction().start().await.unwrap();
        let monitor = db.raw_client().await;
        monitor
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        // Wait until the backend has exited: the rollback then cannot work.
        loop {
            let alive: i64 = monitor
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .unwrap()
                .get(0);
            if alive == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let lease = Lease {
            name: "writer".to_owned(),
            holder: "node-a".to_owned(),
            holder_url: "http://node-a".to_owned(),
            token: FencingToken(3),
        };
        let error = refuse(tx, &lease).await;
        assert!(
            matches!(
                error,
                Error::LeaseLost {
                    token: FencingToken(3),
                    ..
                }
            ),
            "{error:?}"
        );
    }
}
