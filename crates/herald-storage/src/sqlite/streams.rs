//! The SQL of streams on SQLite (`Storage::stream_info`, `create_stream`,
//! and a stream append inside `Storage::write`'s batch): each in a fenced
//! `BEGIN IMMEDIATE` transaction, deciding with
//! [`crate::stream_rules::decide`].

use herald_core::{
    is_json_media, ChannelName, Fork, Lease, Payload, StreamAppend, StreamAppended, StreamCreate,
    StreamCreated, StreamInfo,
};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::ops::{fenced_now, stored_payload};
use crate::decode::{sql_position, to_u64};
use crate::error::Result;
use crate::stream_rules::{
    admit_new_producer, closed_by, decide, idle_before_ms, live_state, Decision, StoredStream,
};

/// A channel's row as streams read it.
type Row = StoredStream;

const ROW_SQL: &str = "SELECT content_type, closed, closed_by, closed_by_epoch, \
     closed_by_seq, stream_seq, head, trimmed_through, ttl_s, expires_at_ms, touched_at_ms, \
     fork_of, fork_sub_offset, soft_deleted FROM channels WHERE name = ?1";

fn read_row(conn: &Connection, channel: &ChannelName) -> Result<Option<Row>> {
    let row = conn
        .prepare_cached(ROW_SQL)?
        .query_row([channel.as_str()], |r| {
            Ok((
                StoredStream {
                    content_type: r.get(0)?,
                    closed: r.get(1)?,
                    closed_by: None,
                    stream_seq: r.get(5)?,
                    head: r.get(6)?,
                    trimmed_through: r.get(7)?,
                    ttl_s: r.get(8)?,
                    expires_at_ms: r.get(9)?,
                    touched_at_ms: r.get(10)?,
                    fork_of: r.get(11)?,
                    fork_sub_offset: r.get(12)?,
                    soft_deleted: r.get(13)?,
                },
                (r.get(2)?, r.get(3)?, r.get(4)?),
            ))
        })
        .optional()?;
    row.map(|(mut stream, (id, epoch, seq))| {
        stream.closed_by = closed_by(id, epoch, seq)?;
        Ok(stream)
    })
    .transpose()
}

/// How many live forks (not deleted, not expired at `now`) `channel` has:
/// one counting statement over the `fork_of` index, the expiry rule of
/// [`StoredStream::expired`] in SQL.
fn live_forks(conn: &Connection, channel: &ChannelName, now: i64) -> Result<u64> {
    let live: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM channels WHERE fork_of = ?1 AND content_type IS NOT NULL \
             AND (expires_at_ms IS NULL OR expires_at_ms > ?2) \
             AND (ttl_s IS NULL OR touched_at_ms IS NULL OR touched_at_ms + ttl_s * 1000 > ?2)",
        )?
        .query_row(params![channel.as_str(), now], |r| r.get(0))?;
    to_u64(live, "live forks")
}

/// SQLite's clock in ms, read outside a write.
fn now_ms(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)")?
        .query_row([], |r| r.get(0))?)
}

/// `Storage::stream_info`: one read transaction.
pub(super) fn stream_info(
    conn: &mut Connection,
    channel: &ChannelName,
) -> Result<Option<StreamInfo>> {
    let tx = conn.transaction()?;
    let now = now_ms(&tx)?;
    let info = match read_row(&tx, channel)? {
        Some(row) if row.is_stream() && !row.expired(now) => {
            let mut info = row.info(channel)?;
            info.live_forks = live_forks(&tx, channel, now)?;
            Some(info)
        }
        _ => None,
    };
    tx.commit()?;
    Ok(info)
}

/// Inserts `payloads` as the messages after `head` of `channel`, with
/// commit time `now` and the writer's `token`; returns their size in bytes.
fn insert_payloads(
    tx: &Transaction<'_>,
    channel: &ChannelName,
    head: i64,
    payloads: &[Payload],
    now: i64,
    token: i64,
) -> Result<i64> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO messages (channel, \"offset\", data, published_at_ms, token, body) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut bytes = 0i64;
    for (i, payload) in payloads.iter().enumerate() {
        let (data, body) = stored_payload(payload);
        let offset = head + 1 + i64::try_from(i).unwrap_or(i64::MAX);
        insert.execute(params![channel.as_str(), offset, data, now, token, body])?;
        bytes = bytes.saturating_add(i64::try_from(payload.len()).unwrap_or(i64::MAX));
    }
    Ok(bytes)
}

/// What [`copy_fork`] did.
enum ForkCopy {
    /// Copied: the new head, the new `trimmed_through`, the bytes copied.
    Copied(i64, i64, i64),
    /// Nothing: the source is not a live stream, or the fork asks for what
    /// it does not hold.
    Unavailable,
    /// Nothing: the fork breaks its limits.
    Refused(StreamCreated),
}

/// Copies what a fork inherits into `channel` (which has no message):
/// the source's stored messages up to the fork's offset, at the same
/// offsets, then its sub-offset's part of what follows. Returns the new
/// head, the new `trimmed_through` and the bytes copied; `None`, having
/// copied nothing, when the source is not a live stream or the fork
/// asks for what it does not hold; the refusal when it breaks its
/// [`herald_core::ForkLimits`].
fn copy_fork(
    tx: &Transaction<'_>,
    channel: &ChannelName,
    fork: &Fork,
    now: i64,
    token: i64,
) -> Result<ForkCopy> {
    let Some(source) =
        read_row(tx, &fork.source)?.filter(|r| r.is_stream() && !r.expired(now) && !r.soft_deleted)
    else {
        return Ok(ForkCopy::Unavailable);
    };
    let offset = sql_position(fork.offset);
    let sub = sql_position(fork.sub_offset);
    if offset > source.head || offset < source.trimmed_through {
        return Ok(ForkCopy::Unavailable);
    }
    let source_json = source.content_type.as_deref().is_some_and(is_json_media);
    // JSON: `sub` more whole messages; bytes: a prefix of the next one.
    let through = if source_json {
        offset.saturating_add(sub)
    } else {
        offset
    };
    if through > source.head || (sub > 0 && offset == source.head) {
        return Ok(ForkCopy::Unavailable);
    }
    if let Some(refusal) = fork_limits(tx, fork, through, now)? {
        return Ok(ForkCopy::Refused(refusal));
    }
    tx.prepare_cached(
        "INSERT INTO messages (channel, \"offset\", data, published_at_ms, token, tags, body) \
         SELECT ?1, \"offset\", data, published_at_ms, ?4, tags, body FROM messages \
         WHERE channel = ?2 AND \"offset\" <= ?3",
    )?
    .execute(params![
        channel.as_str(),
        fork.source.as_str(),
        through,
        token
    ])?;
    let mut bytes: i64 = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(COALESCE(length(body), length(CAST(data AS BLOB)))), 0) \
             FROM messages WHERE channel = ?1",
        )?
        .query_row([channel.as_str()], |r| r.get(0))?;
    let mut head = through;
    if !source_json && sub > 0 {
        let next: Option<(String, Option<Vec<u8>>)> = tx
            .prepare_cached(
                "SELECT data, body FROM messages WHERE channel = ?1 AND \"offset\" = ?2",
            )?
            .query_row(params![fork.source.as_str(), offset + 1], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let Some((data, body)) = next else {
            return Ok(ForkCopy::Unavailable);
        };
        let whole = body.unwrap_or_else(|| data.into_bytes());
        let Some(prefix) = usize::try_from(sub).ok().and_then(|n| whole.get(..n)) else {
            return Ok(ForkCopy::Unavailable);
        };
        let prefix = [Payload::Bytes(std::sync::Arc::from(prefix))];
        bytes += insert_payloads(tx, channel, offset, &prefix, now, token)?;
        head = offset + 1;
    }
    Ok(ForkCopy::Copied(head, source.trimmed_through, bytes))
}

/// The refusal of a fork of `fork.source` through offset `through` that
/// breaks its limits, read before anything is copied: the source's live
/// forks, then the messages and bytes it would copy (counted over at most
/// one message more than the limit, so the check costs no more than the
/// largest allowed fork).
fn fork_limits(
    tx: &Transaction<'_>,
    fork: &Fork,
    through: i64,
    now: i64,
) -> Result<Option<StreamCreated>> {
    let forks = live_forks(tx, &fork.source, now)?;
    if forks >= fork.limits.max_forks {
        return Ok(Some(StreamCreated::TooManyForks { forks }));
    }
    let (messages, bytes): (i64, i64) = tx
        .prepare_cached(
            "SELECT count(*), COALESCE(SUM(n), 0) FROM (SELECT \
             COALESCE(length(body), length(CAST(data AS BLOB))) AS n FROM messages \
             WHERE channel = ?1 AND \"offset\" <= ?2 ORDER BY \"offset\" LIMIT ?3)",
        )?
        .query_row(
            params![
                fork.source.as_str(),
                through,
                sql_position(fork.limits.max_messages.saturating_add(1))
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
    let (messages, bytes) = (to_u64(messages, "messages")?, to_u64(bytes, "bytes")?);
    if messages > fork.limits.max_messages || bytes > fork.limits.max_bytes {
        return Ok(Some(StreamCreated::ForkTooLarge { messages, bytes }));
    }
    Ok(None)
}

/// `Storage::create_stream`.
pub(super) fn create_stream(
    conn: &mut Connection,
    lease: &Lease,
    create: &StreamCreate,
) -> Result<StreamCreated> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (now, token) = fenced_now(&tx, lease, "fenced stream creation refused")?;
    let channel = &create.channel;
    let json = is_json_media(&create.config.content_type);
    let (head, trimmed_through) = match read_row(&tx, channel)? {
        Some(row) if row.content_type.is_some() && row.expired(now) => {
            return Ok(StreamCreated::Expired)
        }
        Some(row) if row.content_type.is_some() => {
            return Ok(StreamCreated::Exists(row.info(channel)?))
        }
        // A fork takes the source's offsets: only on a channel that never
        // had a message.
        Some(row)
            if (row.head > row.trimmed_through && !json)
                || (create.fork.is_some() && row.head > 0) =>
        {
            return Ok(StreamCreated::Exists(row.info(channel)?))
        }
        // Checked here, under the write lock: a channel that gained
        // messages since the caller looked is not converted.
        Some(row) if row.head > row.trimmed_through && !create.may_convert => {
            return Ok(StreamCreated::ChannelHasMessages)
        }
        Some(row) => (row.head, row.trimmed_through),
        None => {
            tx.prepare_cached(
                "INSERT INTO channels (name, head, created_at_ms, bytes) VALUES (?1, 0, ?2, 0)",
            )?
            .execute(params![channel.as_str(), now])?;
            (0, 0)
        }
    };
    let (head, trimmed_through, inherited) = match &create.fork {
        None => (head, trimmed_through, 0),
        Some(fork) => match copy_fork(&tx, channel, fork, now, token)? {
            ForkCopy::Copied(head, trimmed_through, bytes) => (head, trimmed_through, bytes),
            ForkCopy::Refused(refusal) => return Ok(refusal),
            ForkCopy::Unavailable => {
                // Nothing was written: the answer names why.
                let source = read_row(&tx, &fork.source)?;
                return Ok(match source {
                    Some(r) if r.is_stream() && !r.expired(now) && r.soft_deleted => {
                        StreamCreated::SourceGone
                    }
                    Some(r) if r.is_stream() && !r.expired(now) => StreamCreated::ForkOutOfRange,
                    _ => StreamCreated::SourceNotFound,
                });
            }
        },
    };
    let bytes = inherited + insert_payloads(&tx, channel, head, &create.messages, now, token)?;
    let new_head = head + i64::try_from(create.messages.len()).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "UPDATE channels SET head = ?2, bytes = bytes + ?3, content_type = ?4, json = ?5, \
         closed = ?6, ttl_s = ?7, expires_at_ms = ?8, touched_at_ms = ?9, stream_seq = NULL, \
         closed_by = NULL, closed_by_epoch = NULL, closed_by_seq = NULL, \
         trimmed_through = ?10, fork_of = ?11, fork_sub_offset = ?12, soft_deleted = 0 \
         WHERE name = ?1",
    )?
    .execute(params![
        channel.as_str(),
        new_head,
        bytes,
        create.config.content_type,
        json,
        create.closed,
        create.config.ttl_s.map(sql_position),
        create.config.expires_at_ms,
        now,
        trimmed_through,
        create.fork.as_ref().map(|f| f.source.as_str()),
        create.fork.as_ref().map(|f| sql_position(f.sub_offset))
    ])?;
    tx.prepare_cached("DELETE FROM stream_producers WHERE channel = ?1")?
        .execute([channel.as_str()])?;
    let row = read_row(&tx, channel)?
        .ok_or_else(|| crate::error::Error::corrupt("a stream vanished inside its creation"))?;
    let info = row.info(channel)?;
    tx.commit()?;
    Ok(StreamCreated::Created {
        info,
        published_at_ms: now,
    })
}

/// One stream append of a `Storage::write` batch, inside its fenced
/// transaction `tx` (commit time `now`, the writer's `token`): decides it
/// against the stream's row and its producer's state as the batch left
/// them, and writes only what the decision allows; a refusal writes
/// nothing, so the rest of the batch commits without it.
pub(super) fn apply_append(
    tx: &Transaction<'_>,
    now: i64,
    token: i64,
    append: &StreamAppend,
) -> Result<StreamAppended> {
    let channel = &append.channel;
    let row = read_row(tx, channel)?;
    let rules_row = row.as_ref().map(|r| r.rules_row(now)).transpose()?;
    let limits = &append.producer_limits;
    let stored = match &append.producer {
        Some(p) => tx
            .prepare_cached(
                "SELECT epoch, last_seq, last_append_at_ms FROM stream_producers \
                 WHERE channel = ?1 AND producer = ?2",
            )?
            .query_row(params![channel.as_str(), p.id], |r| {
                Ok((
                    r.get::<_, i64>(0)?.max(0) as u64,
                    r.get::<_, i64>(1)?.max(0) as u64,
                    r.get::<_, i64>(2)?,
                ))
            })
            .optional()?,
        None => None,
    };
    let state = live_state(stored, now, limits);
    if let Decision::Answer(answer) = decide(rules_row.as_ref(), state, append) {
        return Ok(answer);
    }
    if append.producer.is_some() && state.is_none() {
        // A producer new to the stream (or idle so long it was forgotten):
        // the producers not idle must leave it room; the idle ones' rows
        // go once it is admitted (a refusal writes nothing).
        let idle_before = idle_before_ms(now, limits);
        let live: i64 = tx
            .prepare_cached(
                "SELECT count(*) FROM stream_producers \
                 WHERE channel = ?1 AND last_append_at_ms >= ?2",
            )?
            .query_row(params![channel.as_str(), idle_before], |r| r.get(0))?;
        if let Some(answer) = admit_new_producer(live.max(0) as u64, limits) {
            return Ok(answer);
        }
        tx.prepare_cached(
            "DELETE FROM stream_producers WHERE channel = ?1 AND last_append_at_ms < ?2",
        )?
        .execute(params![channel.as_str(), idle_before])?;
    }
    let Some(row) = row else {
        return Err(crate::error::Error::corrupt(
            "a stream append was allowed without a stream",
        ));
    };
    let bytes = insert_payloads(tx, channel, row.head, &append.messages, now, token)?;
    let head = row.head + i64::try_from(append.messages.len()).unwrap_or(i64::MAX);
    let closed_by = append.producer.as_ref().filter(|_| append.close);
    tx.prepare_cached(
        "UPDATE channels SET head = ?2, bytes = bytes + ?3, touched_at_ms = ?4, \
         closed = closed OR ?5, stream_seq = COALESCE(?6, stream_seq), \
         closed_by = COALESCE(?7, closed_by), closed_by_epoch = COALESCE(?8, closed_by_epoch), \
         closed_by_seq = COALESCE(?9, closed_by_seq) WHERE name = ?1",
    )?
    .execute(params![
        channel.as_str(),
        head,
        bytes,
        now,
        append.close,
        append.stream_seq,
        closed_by.map(|p| p.id.as_str()),
        closed_by.map(|p| sql_position(p.epoch)),
        closed_by.map(|p| sql_position(p.seq)),
    ])?;
    if let Some(p) = &append.producer {
        tx.prepare_cached(
            "INSERT INTO stream_producers (channel, producer, epoch, last_seq, last_append_at_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (channel, producer) \
             DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, \
             last_append_at_ms = excluded.last_append_at_ms",
        )?
        .execute(params![
            channel.as_str(),
            p.id,
            sql_position(p.epoch),
            sql_position(p.seq),
            now
        ])?;
    }
    Ok(StreamAppended::Appended {
        first: to_u64(row.head, "head")? + 1,
        head: to_u64(head, "head")?,
        published_at_ms: now,
        closed: row.closed || append.close,
    })
}

/// `Storage::soft_delete_stream`: marks the stream deleted while forks of
/// it remain, in a fenced `BEGIN IMMEDIATE` transaction.
pub(super) fn soft_delete_stream(
    conn: &mut Connection,
    lease: &Lease,
    channel: &ChannelName,
) -> Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    fenced_now(&tx, lease, "fenced stream soft deletion refused")?;
    let marked = tx
        .prepare_cached(
            "UPDATE channels SET soft_deleted = 1 WHERE name = ?1 AND content_type IS NOT NULL",
        )?
        .execute([channel.as_str()])?;
    tx.commit()?;
    Ok(marked > 0)
}

/// `Storage::renew_streams`: restarts the TTL of every live stream of
/// `channels` that has one, in a fenced `BEGIN IMMEDIATE` transaction;
/// an expired or soft-deleted stream is left as it is.
pub(super) fn renew_streams(
    conn: &mut Connection,
    lease: &Lease,
    channels: &[ChannelName],
) -> Result<u64> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (now, _) = fenced_now(&tx, lease, "fenced stream renewal refused")?;
    let mut renewed = 0u64;
    {
        let mut renew = tx.prepare_cached(
            "UPDATE channels SET touched_at_ms = max(touched_at_ms, ?2) \
             WHERE name = ?1 AND content_type IS NOT NULL AND soft_deleted = 0 \
               AND ttl_s IS NOT NULL AND touched_at_ms IS NOT NULL \
               AND touched_at_ms + ttl_s * 1000 > ?2 \
               AND (expires_at_ms IS NULL OR expires_at_ms > ?2)",
        )?;
        let mut seen = std::collections::HashSet::with_capacity(channels.len());
        for channel in channels {
            if seen.insert(channel.as_str()) {
                renewed += u64::try_from(renew.execute(params![channel.as_str(), now])?)
                    .unwrap_or(u64::MAX);
            }
        }
    }
    tx.commit()?;
    Ok(renewed)
}

/// `Storage::expired_streams`: the streams whose expiry passed on
/// SQLite's clock, by name in byte order, at most `limit`.
pub(super) fn expired_streams(conn: &mut Connection, limit: usize) -> Result<Vec<ChannelName>> {
    let now = now_ms(conn)?;
    let mut stmt = conn.prepare_cached(
        "SELECT name FROM channels WHERE content_type IS NOT NULL \
         AND (ttl_s IS NOT NULL OR expires_at_ms IS NOT NULL) ORDER BY name",
    )?;
    let names: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<std::result::Result<_, _>>()?;
    let mut expired = Vec::new();
    for name in names {
        if expired.len() >= limit {
            break;
        }
        let channel = crate::decode::to_channel(name)?;
        if read_row(conn, &channel)?.is_some_and(|r| r.expired(now)) {
            expired.push(channel);
        }
    }
    Ok(expired)
}
