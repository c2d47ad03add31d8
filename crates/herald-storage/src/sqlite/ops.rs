//! The SQL of the SQLite backend: synchronous functions that run on a
//! connection thread.
//!
//! "Now" is always read by SQLite, inside the statement that uses it, after
//! every lock the statement's transaction waits on is held. SQLite keeps
//! "now" the same for every use inside one `sqlite3_step()` call
//! (<https://www.sqlite.org/lang_datefunc.html>, "the current time").

use std::path::Path;

use herald_core::{
    Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, Message, NewMessage, Offset, Payload,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::session;
use crate::decode::{
    acquired, log_lost, log_release, lost, sql_position, sql_token, to_channel, to_payload,
    to_tags, to_token, to_u64,
};
use crate::error::{Error, Result};
use crate::stream_rules::StreamExpiry;
use crate::traits::{
    Acquire, ChangeFeed, ChannelSummary, Deletion, Deletions, LeaseTakeover, Page, TakeoverCount,
    TakeoverReason, MAX_CHANNEL_PAGE, MAX_LEASE_HISTORY,
};
use crate::trim;
use crate::trim::{ChannelStats, TrimLimits, Trimmed};

/// SQLite's clock in ms since the Unix epoch (needs SQLite >= 3.42 for
/// `'subsec'`).
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// The current lease row, for [`Acquire::Held`] and `lease_info`.
const LEASE_INFO_SQL: &str = concat!(
    "SELECT name, holder, holder_url, token, expires_at_ms - ",
    now_ms!(),
    ", ",
    now_ms!(),
    " - renewed_at_ms FROM storage_leases WHERE name = ?1"
);

fn read_lease_info(conn: &Connection, name: &str) -> Result<Option<LeaseInfo>> {
    let row = conn
        .prepare_cached(LEASE_INFO_SQL)?
        .query_row([name], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
            ))
        })
        .optional()?;
    row.map(
        |(name, holder, holder_url, token, expires_in_ms, renewed_ms_ago)| {
            Ok(LeaseInfo {
                name,
                holder,
                holder_url,
                token: to_token(token)?,
                expires_in_ms,
                renewed_ms_ago,
            })
        },
    )
    .transpose()
}

/// The lease as the storage sees it now.
pub(super) fn lease_info(conn: &mut Connection, name: &str) -> Result<Option<LeaseInfo>> {
    read_lease_info(conn, name)
}

/// Adds one acquisition of lease `name` for `reason` (with its new
/// `token`) to `lease_takeovers`, inside the acquire's transaction.
const RECORD_TAKEOVER_SQL: &str = concat!(
    "INSERT INTO lease_takeovers (name, reason, takeovers, last_token, last_at_ms)",
    " VALUES (?1, ?2, 1, ?3, ",
    now_ms!(),
    ") ON CONFLICT (name, reason) DO UPDATE SET takeovers = lease_takeovers.takeovers + 1,",
    " last_token = excluded.last_token, last_at_ms = excluded.last_at_ms"
);

/// Adds acquisition `?2` (token) of lease `?1` by node `?3`, which the row
/// named `?4` before, for reason `?5`, to the takeover timeline
/// (`lease_history`), inside the acquire's transaction.
const RECORD_HISTORY_SQL: &str = concat!(
    "INSERT INTO lease_history (name, token, holder, previous_holder, reason, acquired_at_ms)",
    " VALUES (?1, ?2, ?3, ?4, ?5, ",
    now_ms!(),
    ") ON CONFLICT (name, token) DO NOTHING"
);

/// The latest `limit` acquisitions of lease `name`, newest first
/// (`Storage::lease_history`).
pub(super) fn lease_history(
    conn: &mut Connection,
    name: &str,
    limit: usize,
) -> Result<Vec<LeaseTakeover>> {
    let mut stmt = conn.prepare_cached(
        "SELECT token, holder, previous_holder, reason, acquired_at_ms FROM lease_history \
         WHERE name = ?1 ORDER BY token DESC LIMIT ?2",
    )?;
    let limit = i64::try_from(limit.min(MAX_LEASE_HISTORY)).unwrap_or(0);
    let mut rows = stmt.query(params![name, limit])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let reason: String = row.get(3)?;
        out.push(LeaseTakeover {
            token: to_token(row.get(0)?)?,
            holder: row.get(1)?,
            previous_holder: row.get(2)?,
            reason: TakeoverReason::from_name(&reason)
                .ok_or_else(|| Error::corrupt(format!("unknown takeover reason {reason:?}")))?,
            at_ms: row.get(4)?,
        });
    }
    Ok(out)
}

/// The recorded acquisitions of lease `name` by reason
/// (`LeaseStore::takeover_counts`).
pub(super) fn takeover_counts(conn: &mut Connection, name: &str) -> Result<Vec<TakeoverCount>> {
    let mut stmt = conn.prepare_cached(
        "SELECT reason, takeovers FROM lease_takeovers WHERE name = ?1 AND takeovers > 0",
    )?;
    let rows = stmt
        .query_map([name], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<std::result::Result<Vec<_>, _>>()?;
    TakeoverCount::from_rows(rows)
}

/// The lease row as acquire needs it: holder, holder session, and whether
/// it has expired on the database clock.
type CurrentLease = Option<(Option<String>, Option<String>, bool)>;

/// Reads [`CurrentLease`] (in whatever transaction `conn` is in).
fn current_lease(conn: &Connection, name: &str) -> Result<CurrentLease> {
    Ok(conn
        .prepare_cached(concat!(
            "SELECT holder, holder_session, expires_at_ms <= ",
            now_ms!(),
            " FROM storage_leases WHERE name = ?1"
        ))?
        .query_row([name], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, bool>(2)?,
            ))
        })
        .optional()?)
}

/// The node that released lease `name` last (schema version 14), while no
/// node has acquired it since.
fn released_by(conn: &Connection, name: &str) -> Result<Option<String>> {
    Ok(conn
        .prepare_cached("SELECT released_by FROM storage_leases WHERE name = ?1")?
        .query_row([name], |r| r.get::<_, Option<String>>(0))
        .optional()?
        .flatten())
}

/// Whether a takeover looks possible on `current`: the row is missing,
/// released, expired, this storage's own, or its holder's session is gone.
fn takeover_possible(current: &CurrentLease, sessions_dir: &Path, own_session: &str) -> bool {
    match current {
        None | Some((None, _, _)) | Some((Some(_), _, true)) => true,
        Some((Some(_), Some(session), false)) => {
            session == own_session || session::is_gone(sessions_dir, session)
        }
        Some((Some(_), None, false)) => false,
    }
}

/// Whether the lease `name`, found held with `token`, may be taken over
/// now: a plain read under no lock; true when it was released, expired or
/// changed hands (another token), or its holder's session is gone.
pub(super) fn takeover_looks_possible(
    conn: &mut Connection,
    sessions_dir: &Path,
    own_session: &str,
    name: &str,
    token: herald_core::FencingToken,
) -> Result<bool> {
    let current = current_lease(conn, name)?;
    if takeover_possible(&current, sessions_dir, own_session) {
        return Ok(true);
    }
    Ok(read_lease_info(conn, name)?.is_none_or(|info| info.token != token))
}

/// First a plain read, under no lock: a live lease of a live holder is
/// answered `Held` at once, so a standby never takes the database's write
/// lock (and never delays the holder's writes and renewals) while there is
/// nothing to take over. Declining on that read is always safe. Otherwise
/// one `BEGIN IMMEDIATE` transaction: the lease row is read again, and the
/// decision taken, only once the database write lock is held.
pub(super) fn acquire(
    conn: &mut Connection,
    sessions_dir: &Path,
    own_session: &str,
    candidate: &Candidate,
    ttl_ms: i64,
) -> Result<Acquire> {
    let glance = current_lease(conn, &candidate.lease_name)?;
    if !takeover_possible(&glance, sessions_dir, own_session) {
        if let Some(info) = read_lease_info(conn, &candidate.lease_name)? {
            return Ok(Acquire::Held(info));
        }
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current = current_lease(&tx, &candidate.lease_name)?;
    let (reason, previous) = match current {
        None => (TakeoverReason::Fresh, None),
        // The row names no holder: the node that released it is the
        // previous one.
        Some((None, _, _)) => (
            TakeoverReason::Released,
            released_by(&tx, &candidate.lease_name)?,
        ),
        Some((Some(holder), _, true)) => (TakeoverReason::Expired, Some(holder)),
        // A live lease of this very storage: an earlier acquire of ours
        // that committed after its caller gave up waiting. Nobody holds its
        // token, so it is taken again with a new one.
        Some((Some(holder), Some(session), false))
            if session == own_session && holder == candidate.node_id =>
        {
            (TakeoverReason::Reclaimed, Some(holder))
        }
        Some((Some(holder), Some(session), false))
            if session != own_session && session::is_gone(sessions_dir, &session) =>
        {
            (TakeoverReason::HolderGone, Some(holder))
        }
        Some(_) => {
            let info = read_lease_info(&tx, &candidate.lease_name)?
                .ok_or_else(|| Error::corrupt("the lease row vanished inside a transaction"))?;
            return Ok(Acquire::Held(info));
        }
    };
    let token: i64 = tx
        .prepare_cached(concat!(
            "INSERT INTO storage_leases (name, holder, holder_url, holder_session, token,",
            " expires_at_ms, acquired_at_ms, renewed_at_ms)",
            " VALUES (?1, ?2, ?3, ?4, 1, ",
            now_ms!(),
            " + ?5, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ") ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,",
            " holder_url = excluded.holder_url, holder_session = excluded.holder_session,",
            " token = storage_leases.token + 1, expires_at_ms = excluded.expires_at_ms,",
            " acquired_at_ms = excluded.acquired_at_ms, renewed_at_ms = excluded.renewed_at_ms,",
            " released_by = NULL",
            " RETURNING token"
        ))?
        .query_row(
            params![
                candidate.lease_name,
                candidate.node_id,
                candidate.advertise_url,
                own_session,
                ttl_ms
            ],
            |r| r.get(0),
        )?;
    tx.prepare_cached(RECORD_TAKEOVER_SQL)?.execute(params![
        candidate.lease_name,
        reason.as_str(),
        token
    ])?;
    tx.prepare_cached(RECORD_HISTORY_SQL)?.execute(params![
        candidate.lease_name,
        token,
        candidate.node_id,
        previous,
        reason.as_str()
    ])?;
    tx.prepare_cached("DELETE FROM lease_history WHERE name = ?1 AND token <= ?2 - 1000")?
        .execute(params![candidate.lease_name, token])?;
    tx.commit()?;
    Ok(acquired(
        candidate,
        to_token(token)?,
        reason,
        previous.as_deref(),
    ))
}

/// `BEGIN IMMEDIATE` (the only wait, bounded by the connection's busy
/// timeout), then the guarded `UPDATE`, whose clock is read after the lock
/// is held: a lease that expired during the wait is lost, not extended.
pub(super) fn renew(conn: &mut Connection, lease: &Lease, ttl_ms: i64) -> Result<()> {
    let token = sql_token(lease)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let updated = tx
        .prepare_cached(concat!(
            "UPDATE storage_leases SET expires_at_ms = ",
            now_ms!(),
            " + ?4, renewed_at_ms = ",
            now_ms!(),
            " WHERE name = ?1 AND holder = ?2 AND token = ?3 AND expires_at_ms > ",
            now_ms!()
        ))?
        .execute(params![lease.name, lease.holder, token, ttl_ms])?;
    if updated == 0 {
        drop(tx);
        log_lost(lease, "renewal matched no current lease");
        return Err(lost(lease));
    }
    tx.commit()?;
    Ok(())
}

/// Clears the holder if `lease` is current, recording it as
/// `released_by` (schema version 14) for the next acquisition's takeover
/// record; the token stays.
pub(super) fn release(conn: &mut Connection, lease: &Lease) -> Result<()> {
    let Ok(token) = sql_token(lease) else {
        return Ok(());
    };
    let updated = conn
        .prepare_cached(concat!(
            "UPDATE storage_leases SET released_by = holder, holder = NULL, holder_url = NULL,",
            " holder_session = NULL,",
            " expires_at_ms = ",
            now_ms!(),
            " WHERE name = ?1 AND holder = ?2 AND token = ?3"
        ))?
        .execute(params![lease.name, lease.holder, token])?;
    log_release(lease, updated > 0);
    Ok(())
}

/// Whether the channel row is a stream that expired at `?2` (ms since the
/// Unix epoch): the sooner of its absolute expiry and its last write plus
/// its TTL has passed (`stream_rules::expiry_ms`, in SQL).
pub(super) const EXPIRED_AT_2: &str = "(content_type IS NOT NULL AND COALESCE( \
     CASE WHEN ttl_s IS NOT NULL AND touched_at_ms IS NOT NULL \
          THEN min(touched_at_ms + ttl_s * 1000, COALESCE(expires_at_ms, touched_at_ms + ttl_s * 1000)) \
          ELSE expires_at_ms END, 9223372036854775807) <= ?2)";

/// A payload as SQLite stores it (migration 11): JSON in `data` with no
/// `body`, bytes in `body` with an empty `data`.
pub(super) fn stored_payload(payload: &Payload) -> (&str, Option<&[u8]>) {
    match payload {
        Payload::Json(json) => (json.get(), None),
        Payload::Bytes(bytes) => ("", Some(bytes)),
    }
}

/// A page of one channel, read in one snapshot with the channel's head.
/// An expired stream reads as deleted: no message, earliest `head + 1`.
pub(super) fn read(
    conn: &mut Connection,
    channel: &ChannelName,
    after: Offset,
    limit: usize,
) -> Result<Page> {
    let tx = conn.transaction()?;
    let (head, trimmed_through, expired): (i64, i64, bool) = tx
        .prepare_cached(
            "SELECT head, trimmed_through, content_type IS NOT NULL, ttl_s, touched_at_ms, \
             expires_at_ms, CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             FROM channels WHERE name = ?1",
        )?
        .query_row([channel.as_str()], |r| {
            let expiry = StreamExpiry {
                is_stream: r.get(2)?,
                ttl_s: r.get(3)?,
                touched_at_ms: r.get(4)?,
                expires_at_ms: r.get(5)?,
            };
            Ok((r.get(0)?, r.get(1)?, expiry.expired(r.get(6)?)))
        })
        .optional()?
        .unwrap_or((0, 0, false));
    // An expired stream's messages are withheld, as if it were deleted.
    let trimmed_through = if expired { head } else { trimmed_through };
    let deletion: i64 = tx
        .prepare_cached("SELECT deletion FROM channel_deletions WHERE channel = ?1")?
        .query_row([channel.as_str()], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut messages = Vec::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT \"offset\", data, published_at_ms, tags, body FROM messages \
             WHERE channel = ?1 AND \"offset\" > ?2 ORDER BY \"offset\" LIMIT ?3",
        )?;
        let after = if expired { head } else { sql_position(after) };
        let mut rows = stmt.query(params![channel.as_str(), after, limit])?;
        while let Some(row) = rows.next()? {
            messages.push(Message {
                offset: to_u64(row.get(0)?, "offset")?,
                data: to_payload(row.get(1)?, row.get(4)?)?,
                published_at_ms: row.get(2)?,
                tags: to_tags(row.get(3)?)?,
            });
        }
    }
    tx.commit()?;
    Ok(Page {
        head: to_u64(head, "head")?,
        earliest: to_u64(trimmed_through, "trimmed_through")? + 1,
        messages,
        deletion: to_u64(deletion, "deletion")?,
    })
}

/// Every channel with its head, earliest offset and size, by name in byte
/// order.
pub(super) fn channel_stats(conn: &mut Connection) -> Result<Vec<ChannelStats>> {
    let mut stmt = conn
        .prepare_cached("SELECT name, head, trimmed_through, bytes FROM channels ORDER BY name")?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let head = to_u64(row.get(1)?, "head")?;
        let trimmed_through = to_u64(row.get(2)?, "trimmed_through")?;
        out.push(ChannelStats {
            name: to_channel(row.get(0)?)?,
            head,
            earliest: trimmed_through + 1,
            messages: head.saturating_sub(trimmed_through),
            bytes: to_u64(row.get(3)?, "bytes")?,
        });
    }
    Ok(out)
}

/// One page of channels (`Storage::channel_page`): names after `after`
/// containing `search`, by name in byte order, with the head message's
/// publish time and the subscribers in the unexpired node reports.
pub(super) fn channel_page(
    conn: &mut Connection,
    search: &str,
    after: Option<&ChannelName>,
    limit: usize,
) -> Result<Vec<ChannelSummary>> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT c.name, c.head, c.trimmed_through, c.bytes, c.content_type,",
        " (SELECT m.published_at_ms FROM messages m WHERE m.channel = c.name AND m.\"offset\" = c.head),",
        " (SELECT COALESCE(SUM(cc.num_subscribers), 0) FROM cluster_channels cc",
        "  JOIN cluster_nodes n ON n.node_id = cc.node_id",
        "  WHERE cc.channel = c.name AND n.expires_at_ms > ",
        now_ms!(),
        ")",
        " FROM channels c WHERE c.name > ?1 AND instr(c.name, ?2) > 0",
        " ORDER BY c.name LIMIT ?3"
    ))?;
    let after = after.map_or("", ChannelName::as_str);
    let limit = i64::try_from(limit.min(MAX_CHANNEL_PAGE)).unwrap_or(0);
    let mut rows = stmt.query(params![after, search, limit])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let head = to_u64(row.get(1)?, "head")?;
        let trimmed_through = to_u64(row.get(2)?, "trimmed_through")?;
        out.push(ChannelSummary {
            name: to_channel(row.get(0)?)?,
            head,
            earliest: trimmed_through + 1,
            messages: head.saturating_sub(trimmed_through),
            bytes: to_u64(row.get(3)?, "bytes")?,
            content_type: row.get(4)?,
            last_published_at_ms: row.get(5)?,
            subscribers: to_u64(row.get(6)?, "num_subscribers")?,
        });
    }
    Ok(out)
}

/// The fenced trim: one `BEGIN IMMEDIATE` transaction (which holds the
/// database's write lock, so no append runs meanwhile) that proves the
/// lease current and unexpired as [`append`] does, reads the channel's row
/// and its `max_rows` oldest messages, removes the prefix that
/// [`trim::plan`] picks and records the new `trimmed_through` and `bytes`.
/// After the commit, when the database is in incremental auto-vacuum mode,
/// returns up to [`VACUUM_PAGES`] free pages to the file system in a
/// transaction of their own.
pub(super) fn trim(
    conn: &mut Connection,
    lease: &Lease,
    channel: &ChannelName,
    limits: &TrimLimits,
    max_rows: usize,
) -> Result<Trimmed> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    check_lease(&tx, lease, "fenced trim refused")?;
    let window = tx
        .prepare_cached("SELECT head, trimmed_through, bytes FROM channels WHERE name = ?1")?
        .query_row([channel.as_str()], |r| {
            Ok(trim::ChannelWindow {
                head: r.get(0)?,
                trimmed_through: r.get(1)?,
                bytes: r.get(2)?,
            })
        })
        .optional()?;
    let Some(window) = window else {
        return Ok(Trimmed {
            earliest: 1,
            done: true,
            ..Trimmed::default()
        });
    };
    let rows_limit = i64::try_from(max_rows).unwrap_or(i64::MAX);
    let max_age_ms = limits
        .max_age_ms
        .map_or(i64::MIN, |ms| i64::try_from(ms).unwrap_or(i64::MAX));
    let mut candidates = Vec::new();
    {
        let mut stmt = tx.prepare_cached(concat!(
            "SELECT \"offset\", COALESCE(length(body), length(CAST(data AS BLOB))), published_at_ms <= ",
            now_ms!(),
            " - ?3 FROM messages WHERE channel = ?1 AND \"offset\" > ?2",
            " ORDER BY \"offset\" LIMIT ?4"
        ))?;
        let mut rows = stmt.query(params![
            channel.as_str(),
            window.trimmed_through,
            max_age_ms,
            rows_limit
        ])?;
        while let Some(row) = rows.next()? {
            candidates.push(trim::Candidate {
                offset: row.get(0)?,
                size: row.get(1)?,
                expired: row.get(2)?,
            });
        }
    }
    let plan = trim::plan(window, &candidates, limits, max_rows);
    if plan.messages > 0 {
        tx.prepare_cached(
            "DELETE FROM messages WHERE channel = ?1 AND \"offset\" > ?2 AND \"offset\" <= ?3",
        )?
        .execute(params![
            channel.as_str(),
            window.trimmed_through,
            plan.through
        ])?;
        tx.prepare_cached(
            "UPDATE channels SET trimmed_through = ?2, bytes = bytes - ?3 WHERE name = ?1",
        )?
        .execute(params![channel.as_str(), plan.through, plan.bytes])?;
    }
    tx.commit()?;
    if plan.messages > 0 {
        incremental_vacuum(conn)?;
    }
    Ok(Trimmed {
        messages: to_u64(plan.messages, "messages trimmed")?,
        bytes: to_u64(plan.bytes, "bytes trimmed")?,
        earliest: to_u64(plan.through, "trimmed_through")? + 1,
        head: to_u64(window.head, "head")?,
        done: plan.done,
    })
}

/// The fencing check of a fenced write other than `append`, inside its
/// `BEGIN IMMEDIATE` transaction: `lease`'s holder and token current and
/// not expired on the database clock.
///
/// # Errors
/// [`Error::LeaseLost`] when it is not (logged with `what`); the caller
/// drops the transaction, which rolls it back.
/// The fencing check of a stream write (as [`append`]'s): the database's
/// clock in ms, which is the write's commit time, and the token as stored.
///
/// # Errors
/// [`Error::LeaseLost`] when `lease` is not current (logged with `what`).
pub(super) fn fenced_now(
    tx: &rusqlite::Transaction<'_>,
    lease: &Lease,
    what: &str,
) -> Result<(i64, i64)> {
    let token = sql_token(lease)?;
    let now: Option<i64> = tx
        .prepare_cached(concat!(
            "SELECT ",
            now_ms!(),
            " FROM storage_leases WHERE name = ?1 AND holder = ?2 AND token = ?3",
            " AND expires_at_ms > ",
            now_ms!()
        ))?
        .query_row(params![lease.name, lease.holder, token], |r| r.get(0))
        .optional()?;
    match now {
        Some(now) => Ok((now, token)),
        None => {
            log_lost(lease, what);
            Err(lost(lease))
        }
    }
}

fn check_lease(tx: &rusqlite::Transaction<'_>, lease: &Lease, what: &str) -> Result<()> {
    let token = sql_token(lease)?;
    let live: Option<i64> = tx
        .prepare_cached(concat!(
            "SELECT 1 FROM storage_leases WHERE name = ?1 AND holder = ?2 AND token = ?3",
            " AND expires_at_ms > ",
            now_ms!()
        ))?
        .query_row(params![lease.name, lease.holder, token], |r| r.get(0))
        .optional()?;
    if live.is_none() {
        log_lost(lease, what);
        return Err(lost(lease));
    }
    Ok(())
}

/// The fenced record of a channel's deletion: one `BEGIN IMMEDIATE`
/// transaction (the database's write lock, so deletions are numbered in
/// commit order) that makes the fencing check, then upserts the channel's
/// row of `channel_deletions` with the next number; returns it.
pub(super) fn record_deletion(
    conn: &mut Connection,
    lease: &Lease,
    channel: &ChannelName,
    head: Offset,
) -> Result<u64> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    check_lease(&tx, lease, "fenced deletion refused")?;
    let number: i64 = tx
        .prepare_cached(concat!(
            "INSERT INTO channel_deletions (channel, deletion, head, deleted_at_ms) ",
            "VALUES (?1, (SELECT COALESCE(MAX(deletion), 0) + 1 FROM channel_deletions), ?2, ",
            now_ms!(),
            ") ON CONFLICT (channel) DO UPDATE SET deletion = excluded.deletion, ",
            "head = excluded.head, deleted_at_ms = excluded.deleted_at_ms ",
            "RETURNING deletion"
        ))?
        .query_row(params![channel.as_str(), sql_position(head)], |r| r.get(0))?;
    // A deleted stream is a stream no more.
    tx.prepare_cached(
        "UPDATE channels SET content_type = NULL, json = 1, closed = 0, ttl_s = NULL, \
         expires_at_ms = NULL, touched_at_ms = NULL, stream_seq = NULL, closed_by = NULL, \
         closed_by_epoch = NULL, closed_by_seq = NULL, fork_of = NULL, fork_sub_offset = NULL, \
         soft_deleted = 0 WHERE name = ?1",
    )?
    .execute([channel.as_str()])?;
    tx.prepare_cached("DELETE FROM stream_producers WHERE channel = ?1")?
        .execute([channel.as_str()])?;
    // Its forks hold their own copies: they are forks of it no more (a
    // stream created again at its name starts without forks).
    tx.prepare_cached("UPDATE channels SET fork_of = NULL WHERE fork_of = ?1")?
        .execute([channel.as_str()])?;
    tx.commit()?;
    to_u64(number, "deletion")
}

/// The latest deletion of every channel deleted after number `cursor`, in
/// number order, and the largest number seen (`cursor` when none).
pub(super) fn deletions_since(conn: &mut Connection, cursor: u64) -> Result<Deletions> {
    let mut stmt = conn.prepare_cached(
        "SELECT channel, head, deletion FROM channel_deletions WHERE deletion > ?1 \
         ORDER BY deletion",
    )?;
    let mut rows = stmt.query([sql_position(cursor)])?;
    let mut out = Deletions {
        cursor,
        deleted: Vec::new(),
    };
    while let Some(row) = rows.next()? {
        let deletion = Deletion {
            channel: to_channel(row.get(0)?)?,
            head: to_u64(row.get(1)?, "head")?,
            number: to_u64(row.get(2)?, "deletion")?,
        };
        out.cursor = out.cursor.max(deletion.number);
        out.deleted.push(deletion);
    }
    Ok(out)
}

/// The largest deletion number, 0 when there is none.
pub(super) fn deletion_cursor(conn: &mut Connection) -> Result<u64> {
    let number: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(deletion), 0) FROM channel_deletions")?
        .query_row([], |r| r.get(0))?;
    to_u64(number, "deletion")
}

/// Free pages returned to the file system after each trim that removed
/// something, at most (4 KiB pages: 1 MiB): a small step, so the write
/// lock is held briefly.
pub(super) const VACUUM_PAGES: i64 = 256;

/// `PRAGMA incremental_vacuum(VACUUM_PAGES)` when the database is in
/// incremental auto-vacuum mode (`PRAGMA auto_vacuum` = 2); nothing
/// otherwise: a database created before schema version 3 keeps its mode
/// (changing it needs a full `VACUUM`), and SQLite reuses its free pages
/// for new rows (<https://www.sqlite.org/pragma.html#pragma_auto_vacuum>).
fn incremental_vacuum(conn: &mut Connection) -> Result<()> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if mode == 2 {
        // The pragma frees pages as its statement is stepped.
        let mut stmt = conn.prepare(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))?;
        let mut rows = stmt.query([])?;
        while rows.next()?.is_some() {}
    }
    Ok(())
}

/// The size of a message's data as stored, in bytes.
pub(super) fn data_size(message: &NewMessage) -> i64 {
    i64::try_from(message.data.len()).unwrap_or(i64::MAX)
}

/// Every channel with its head, by name in byte order.
pub(super) fn channels(conn: &mut Connection) -> Result<Vec<ChannelHead>> {
    let mut stmt = conn.prepare_cached("SELECT name, head FROM channels ORDER BY name")?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(ChannelHead {
            name: to_channel(row.get(0)?)?,
            head: to_u64(row.get(1)?, "head")?,
        });
    }
    Ok(out)
}

/// The channels with a message whose id is above `cursor`, with their
/// current head (in the same snapshot), ordered by name; the new cursor is
/// the largest id seen, or `cursor` when nothing moved.
pub(super) fn changes_since(conn: &mut Connection, cursor: u64) -> Result<ChangeFeed> {
    let tx = conn.transaction()?;
    let mut new_cursor = cursor;
    let mut changed = Vec::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT c.name, c.head, m.last_id \
             FROM (SELECT channel, MAX(id) AS last_id FROM messages WHERE id > ?1 GROUP BY channel) m \
             JOIN channels c ON c.name = m.channel ORDER BY c.name",
        )?;
        let mut rows = stmt.query([sql_position(cursor)])?;
        while let Some(row) = rows.next()? {
            changed.push(ChannelHead {
                name: to_channel(row.get(0)?)?,
                head: to_u64(row.get(1)?, "head")?,
            });
            new_cursor = new_cursor.max(to_u64(row.get(2)?, "message id")?);
        }
    }
    tx.commit()?;
    Ok(ChangeFeed {
        cursor: new_cursor,
        changed,
    })
}

/// The largest message id, 0 when there is none.
pub(super) fn change_cursor(conn: &mut Connection) -> Result<u64> {
    let id: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM messages")?
        .query_row([], |r| r.get(0))?;
    to_u64(id, "message id")
}

/// A trivial query that touches the database file.
pub(super) fn ping(conn: &mut Connection) -> Result<()> {
    conn.prepare_cached("SELECT COUNT(*) FROM storage_leases")?
        .query_row([], |r| r.get::<_, i64>(0))?;
    Ok(())
}
