//! The SQL of streams on PostgreSQL (`Storage::stream_info`,
//! `create_stream`, and a stream append inside `Storage::write`'s batch):
//! each in a fenced write that runs the one prelude ([`fenced`]), locks the
//! channel's row, decides with [`crate::stream_rules::decide`], and makes
//! the fencing check again as the decision to commit.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Object;
use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{
    is_json_media, ChannelName, Fork, Lease, Payload, StreamAppend, StreamAppended, StreamCreate,
    StreamCreated, StreamInfo,
};

use super::names::CHANGES_CHANNEL;
use super::ops::{fenced, refuse, to_ms, Decision, Fenced, Serialized, NOTIFY_SQL};
use crate::decode::{sql_position, to_u64};
use crate::error::{Error, Result};
use crate::stream_rules::{
    admit_new_producer, closed_by, decide, idle_before_ms, live_state, Decision as Rule,
    StoredStream,
};

/// A channel's row as streams read it.
type Row = StoredStream;

/// Columns of [`Row`], in order; times as ms since the Unix epoch.
const ROW_COLUMNS: &str = "content_type, closed, closed_by, closed_by_epoch, closed_by_seq, \
     stream_seq, head, trimmed_through, ttl_s, \
     floor(extract(epoch FROM expires_at) * 1000)::bigint, \
     floor(extract(epoch FROM touched_at) * 1000)::bigint, \
     fork_of, fork_sub_offset, soft_deleted";

fn to_row(r: &tokio_postgres::Row) -> Result<Row> {
    Ok(StoredStream {
        content_type: r.try_get(0)?,
        closed: r.try_get(1)?,
        closed_by: closed_by(r.try_get(2)?, r.try_get(3)?, r.try_get(4)?)?,
        stream_seq: r.try_get(5)?,
        head: r.try_get(6)?,
        trimmed_through: r.try_get(7)?,
        ttl_s: r.try_get(8)?,
        expires_at_ms: r.try_get(9)?,
        touched_at_ms: r.try_get(10)?,
        fork_of: r.try_get(11)?,
        fork_sub_offset: r.try_get(12)?,
        soft_deleted: r.try_get(13)?,
    })
}

/// `Storage::stream_info`: one statement, one snapshot, with the count of
/// the stream's live forks (not deleted, not expired).
pub(super) async fn stream_info(
    client: &Object,
    channel: &ChannelName,
) -> Result<Option<StreamInfo>> {
    let sql = format!(
        "SELECT {ROW_COLUMNS}, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, \
             (SELECT count(*) FROM channels AS f WHERE f.fork_of = $1 \
                AND f.content_type IS NOT NULL \
                AND COALESCE(LEAST(f.expires_at, f.touched_at + f.ttl_s * interval '1 second'), \
                             'infinity') > clock_timestamp()) \
         FROM channels WHERE name = $1 AND content_type IS NOT NULL"
    );
    let stmt = client.prepare_cached(&sql).await?;
    let Some(r) = client.query_opt(&stmt, &[&channel.as_str()]).await? else {
        return Ok(None);
    };
    let row = to_row(&r)?;
    let now: i64 = r.try_get(14)?;
    if row.expired(now) {
        return Ok(None);
    }
    let mut info = row.info(channel)?;
    info.live_forks = to_u64(r.try_get(15)?, "live forks")?;
    Ok(Some(info))
}

/// Reads the channel's row under `FOR UPDATE`, in `tx`.
async fn lock_row(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &ChannelName,
) -> Result<Option<Row>> {
    let sql = format!("SELECT {ROW_COLUMNS} FROM channels WHERE name = $1 FOR UPDATE");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&channel.as_str()])
        .await?
        .as_ref()
        .map(to_row)
        .transpose()
}

/// Inserts `payloads` as the messages after `head` of `channel` at time
/// `now` with `token`, in one statement; returns their size in bytes.
async fn insert_payloads(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &ChannelName,
    head: i64,
    payloads: &[Payload],
    now: SystemTime,
    token: i64,
) -> Result<i64> {
    if payloads.is_empty() {
        return Ok(0);
    }
    let mut offsets = Vec::with_capacity(payloads.len());
    let mut data: Vec<Option<&str>> = Vec::with_capacity(payloads.len());
    let mut body: Vec<Option<&[u8]>> = Vec::with_capacity(payloads.len());
    let mut bytes = 0i64;
    for (i, payload) in payloads.iter().enumerate() {
        offsets.push(head + 1 + i64::try_from(i).unwrap_or(i64::MAX));
        match payload {
            Payload::Json(json) => {
                data.push(Some(json.get()));
                body.push(None);
            }
            Payload::Bytes(b) => {
                data.push(None);
                body.push(Some(b));
            }
        }
        bytes = bytes.saturating_add(i64::try_from(payload.len()).unwrap_or(i64::MAX));
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO messages (channel, \"offset\", data, published_at, token, body) \
             SELECT $1, o, d, $4, $5, b \
             FROM unnest($2::bigint[], $3::text[], $6::bytea[]) WITH ORDINALITY AS u(o, d, b, position) \
             ORDER BY position",
        )
        .await?;
    tx.execute(
        &stmt,
        &[&channel.as_str(), &offsets, &data, &now, &token, &body],
    )
    .await?;
    Ok(bytes)
}

/// The decision to commit, then the change notice of `first..=last` (if
/// any message was written), then `COMMIT`; returns the commit time.
async fn commit(
    tx: deadpool_postgres::Transaction<'_>,
    fence: &super::ops::Fence,
    lease: &Lease,
    channel: &ChannelName,
    first: i64,
    last: i64,
) -> Result<SystemTime> {
    let now = match fence.decide(&tx, lease).await? {
        Decision::Commit(now) => now,
        Decision::Refuse => return Err(refuse(tx, lease).await),
    };
    if first <= last && !fault_switches::enabled(FaultSwitch::DropNotify) {
        let notify = tx.prepare_cached(NOTIFY_SQL).await?;
        tx.query(
            &notify,
            &[
                &CHANGES_CHANNEL,
                &vec![channel.as_str()],
                &vec![first],
                &vec![last],
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(now)
}

/// Copies what a fork inherits into `channel` (which has no message):
/// the source's stored messages up to the fork's offset, at the same
/// offsets, then its sub-offset's part of what follows. Returns the head
/// after them, the new `trimmed_through` and the bytes copied; or the
/// refusal, having copied nothing (the caller's transaction is then
/// dropped, which rolls it back).
async fn copy_fork(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &ChannelName,
    fork: &Fork,
    now_ms: i64,
    token: i64,
    now: SystemTime,
) -> Result<std::result::Result<(i64, i64, i64), StreamCreated>> {
    let source = lock_row(tx, &fork.source)
        .await?
        .filter(|r| r.is_stream() && !r.expired(now_ms));
    let Some(source) = source else {
        return Ok(Err(StreamCreated::SourceNotFound));
    };
    if source.soft_deleted {
        return Ok(Err(StreamCreated::SourceGone));
    }
    let offset = sql_position(fork.offset);
    let sub = sql_position(fork.sub_offset);
    let source_json = source.content_type.as_deref().is_some_and(is_json_media);
    // JSON: `sub` more whole messages; bytes: a prefix of the next one.
    let through = if source_json {
        offset.saturating_add(sub)
    } else {
        offset
    };
    if offset > source.head
        || offset < source.trimmed_through
        || through > source.head
        || (sub > 0 && offset == source.head)
    {
        return Ok(Err(StreamCreated::ForkOutOfRange));
    }
    // The source's row is locked: concurrent forks of it are counted one
    // after the other.
    if let Some(refusal) = fork_limits(tx, fork, through).await? {
        return Ok(Err(refusal));
    }
    let copy = tx
        .prepare_cached(
            "INSERT INTO messages (channel, \"offset\", data, published_at, token, tags, body) \
             SELECT $1, \"offset\", data, published_at, $4, tags, body FROM messages \
             WHERE channel = $2 AND \"offset\" <= $3 ORDER BY \"offset\"",
        )
        .await?;
    tx.execute(
        &copy,
        &[&channel.as_str(), &fork.source.as_str(), &through, &token],
    )
    .await?;
    let size = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(COALESCE(octet_length(body), octet_length(data))), 0)::bigint \
             FROM messages WHERE channel = $1",
        )
        .await?;
    let mut bytes: i64 = tx
        .query_one(&size, &[&channel.as_str()])
        .await?
        .try_get(0)?;
    let mut head = through;
    if !source_json && sub > 0 {
        let next = tx
            .prepare_cached(
                "SELECT COALESCE(body, convert_to(data, 'UTF8')) FROM messages \
                 WHERE channel = $1 AND \"offset\" = $2",
            )
            .await?;
        let Some(row) = tx
            .query_opt(&next, &[&fork.source.as_str(), &(offset + 1)])
            .await?
        else {
            return Ok(Err(StreamCreated::ForkOutOfRange));
        };
        let whole: Vec<u8> = row.try_get(0)?;
        let Some(prefix) = usize::try_from(sub).ok().and_then(|n| whole.get(..n)) else {
            return Ok(Err(StreamCreated::ForkOutOfRange));
        };
        let prefix = [Payload::Bytes(std::sync::Arc::from(prefix))];
        bytes += insert_payloads(tx, channel, offset, &prefix, now, token).await?;
        head = offset + 1;
    }
    Ok(Ok((head, source.trimmed_through, bytes)))
}

/// The refusal of a fork of `fork.source` through offset `through` that
/// breaks its limits, read before anything is copied: the source's live
/// forks, then the messages and bytes it would copy (counted over at most
/// one message more than the limit, so the check costs no more than the
/// largest allowed fork).
async fn fork_limits(
    tx: &deadpool_postgres::Transaction<'_>,
    fork: &Fork,
    through: i64,
) -> Result<Option<StreamCreated>> {
    let stmt = tx
        .prepare_cached(
            "SELECT (SELECT count(*) FROM channels AS f WHERE f.fork_of = $1 \
                AND f.content_type IS NOT NULL \
                AND COALESCE(LEAST(f.expires_at, f.touched_at + f.ttl_s * interval '1 second'), \
                             'infinity') > clock_timestamp()), \
             count(*), COALESCE(SUM(n), 0)::bigint FROM (SELECT \
                COALESCE(octet_length(body), octet_length(data)) AS n FROM messages \
                WHERE channel = $1 AND \"offset\" <= $2 ORDER BY \"offset\" LIMIT $3) AS m",
        )
        .await?;
    let r = tx
        .query_one(
            &stmt,
            &[
                &fork.source.as_str(),
                &through,
                &sql_position(fork.limits.max_messages.saturating_add(1)),
            ],
        )
        .await?;
    let forks = to_u64(r.try_get(0)?, "live forks")?;
    if forks >= fork.limits.max_forks {
        return Ok(Some(StreamCreated::TooManyForks { forks }));
    }
    let messages = to_u64(r.try_get(1)?, "messages")?;
    let bytes = to_u64(r.try_get(2)?, "bytes")?;
    if messages > fork.limits.max_messages || bytes > fork.limits.max_bytes {
        return Ok(Some(StreamCreated::ForkTooLarge { messages, bytes }));
    }
    Ok(None)
}

/// `Storage::create_stream`.
pub(super) async fn create_stream(
    client: &mut Object,
    lease: &Lease,
    create: &StreamCreate,
) -> Result<StreamCreated> {
    let Fenced { tx, fence, .. } = fenced(client, lease, Serialized::Yes, None).await?;
    let channel = &create.channel;
    let now_ms = to_ms(fence.now);
    let json = is_json_media(&create.config.content_type);
    let insert = tx
        .prepare_cached(
            "INSERT INTO channels (name, head, created_at, bytes) VALUES ($1, 0, $2, 0) \
             ON CONFLICT (name) DO NOTHING",
        )
        .await?;
    tx.execute(&insert, &[&channel.as_str(), &fence.now])
        .await?;
    let row = lock_row(&tx, channel)
        .await?
        .ok_or_else(|| Error::corrupt("a channel row vanished inside a stream's creation"))?;
    if row.content_type.is_some() && row.expired(now_ms) {
        return Ok(StreamCreated::Expired);
    }
    // A fork takes the source's offsets: only on a channel that never had
    // a message.
    if row.content_type.is_some()
        || (row.head > row.trimmed_through && !json)
        || (create.fork.is_some() && row.head > 0)
    {
        return Ok(StreamCreated::Exists(row.info(channel)?));
    }
    // Checked here, with the row locked: a channel that gained messages
    // since the caller looked is not converted.
    if row.head > row.trimmed_through && !create.may_convert {
        return Ok(StreamCreated::ChannelHasMessages);
    }
    let (start, trimmed_through, inherited) = match &create.fork {
        None => (row.head, row.trimmed_through, 0),
        Some(fork) => match copy_fork(&tx, channel, fork, now_ms, fence.token, fence.now).await? {
            Ok(copied) => copied,
            Err(refusal) => return Ok(refusal),
        },
    };
    let bytes = inherited
        + insert_payloads(
            &tx,
            channel,
            start,
            &create.messages,
            fence.now,
            fence.token,
        )
        .await?;
    let head = start + i64::try_from(create.messages.len()).unwrap_or(i64::MAX);
    let update = tx
        .prepare_cached(
            "UPDATE channels SET head = $2, bytes = bytes + $3, content_type = $4, json = $5, \
             closed = $6, ttl_s = $7, expires_at = to_timestamp($8::bigint / 1000.0), \
             touched_at = $9, stream_seq = NULL, closed_by = NULL, closed_by_epoch = NULL, \
             closed_by_seq = NULL, trimmed_through = $10, fork_of = $11, \
             fork_sub_offset = $12, soft_deleted = false WHERE name = $1",
        )
        .await?;
    tx.execute(
        &update,
        &[
            &channel.as_str(),
            &head,
            &bytes,
            &create.config.content_type,
            &json,
            &create.closed,
            &create.config.ttl_s.map(sql_position),
            &create.config.expires_at_ms,
            &fence.now,
            &trimmed_through,
            &create.fork.as_ref().map(|f| f.source.as_str()),
            &create.fork.as_ref().map(|f| sql_position(f.sub_offset)),
        ],
    )
    .await?;
    let forget = tx
        .prepare_cached("DELETE FROM stream_producers WHERE channel = $1")
        .await?;
    tx.execute(&forget, &[&channel.as_str()]).await?;
    let info = lock_row(&tx, channel)
        .await?
        .ok_or_else(|| Error::corrupt("a stream vanished inside its creation"))?
        .info(channel)?;
    let now = commit(
        tx,
        &fence,
        lease,
        channel,
        trimmed_through.max(row.head) + 1,
        head,
    )
    .await?;
    Ok(StreamCreated::Created {
        info,
        published_at_ms: to_ms(now),
    })
}

/// What one stream append of a `Storage::write` batch did in the batch's
/// transaction ([`apply_append`]).
pub(super) enum Applied {
    /// Nothing was written: the append's answer.
    Answer(StreamAppended),
    /// The stream's row and its producer's state are updated; its messages
    /// are to be inserted at offsets `first..=head` with the batch's commit
    /// time, before the batch commits.
    Write {
        /// Offset of its first message (`head + 1` when it has none).
        first: i64,
        /// The stream's head after it.
        head: i64,
        /// Whether the stream is closed now.
        closed: bool,
    },
}

/// One stream append of a `Storage::write` batch, inside its fenced
/// transaction `tx` (prelude clock reading `now`): locks the stream's row
/// and its producer's state, decides the append against them as the
/// batch left them, and, when allowed, updates the row (head, bytes,
/// closure, `Stream-Seq`, TTL) and the producer's state; the caller
/// inserts the messages. A refusal writes nothing, so the rest of the
/// batch commits without it.
pub(super) async fn apply_append(
    tx: &deadpool_postgres::Transaction<'_>,
    now: SystemTime,
    append: &StreamAppend,
) -> Result<Applied> {
    let channel = &append.channel;
    let row = lock_row(tx, channel).await?;
    let stored = match &append.producer {
        Some(p) => {
            let stmt = tx
                .prepare_cached(
                    "SELECT epoch, last_seq, last_append_at FROM stream_producers \
                     WHERE channel = $1 AND producer = $2 FOR UPDATE",
                )
                .await?;
            match tx.query_opt(&stmt, &[&channel.as_str(), &p.id]).await? {
                Some(r) => Some((
                    to_u64(r.try_get(0)?, "producer epoch")?,
                    to_u64(r.try_get(1)?, "producer seq")?,
                    to_ms(r.try_get::<_, SystemTime>(2)?),
                )),
                None => None,
            }
        }
        None => None,
    };
    let now_ms = to_ms(now);
    let limits = &append.producer_limits;
    let state = live_state(stored, now_ms, limits);
    let rules_row = row.as_ref().map(|r| r.rules_row(now_ms)).transpose()?;
    if let Rule::Answer(answer) = decide(rules_row.as_ref(), state, append) {
        return Ok(Applied::Answer(answer));
    }
    if append.producer.is_some() && state.is_none() {
        // A producer new to the stream (or idle so long it was forgotten):
        // the producers not idle must leave it room; the idle ones' rows
        // go once it is admitted (a refusal writes nothing). The channel's
        // row is locked, so no other append counts meanwhile.
        let idle_before = UNIX_EPOCH
            + Duration::from_millis(idle_before_ms(now_ms, limits).max(0).unsigned_abs());
        let count = tx
            .prepare_cached(
                "SELECT count(*) FROM stream_producers \
                 WHERE channel = $1 AND last_append_at >= $2",
            )
            .await?;
        let live: i64 = tx
            .query_one(&count, &[&channel.as_str(), &idle_before])
            .await?
            .try_get(0)?;
        if let Some(answer) = admit_new_producer(live.max(0).unsigned_abs(), limits) {
            return Ok(Applied::Answer(answer));
        }
        let forget = tx
            .prepare_cached(
                "DELETE FROM stream_producers WHERE channel = $1 AND last_append_at < $2",
            )
            .await?;
        tx.execute(&forget, &[&channel.as_str(), &idle_before])
            .await?;
    }
    let Some(row) = row else {
        return Err(Error::corrupt(
            "a stream append was allowed without a stream",
        ));
    };
    let bytes = append.messages.iter().fold(0i64, |sum, payload| {
        sum.saturating_add(i64::try_from(payload.len()).unwrap_or(i64::MAX))
    });
    let head = row.head + i64::try_from(append.messages.len()).unwrap_or(i64::MAX);
    let closed_by = append.producer.as_ref().filter(|_| append.close);
    let update = tx
        .prepare_cached(
            "UPDATE channels SET head = $2, bytes = bytes + $3, touched_at = $4, \
             closed = closed OR $5, stream_seq = COALESCE($6, stream_seq), \
             closed_by = COALESCE($7, closed_by), \
             closed_by_epoch = COALESCE($8, closed_by_epoch), \
             closed_by_seq = COALESCE($9, closed_by_seq) WHERE name = $1",
        )
        .await?;
    tx.execute(
        &update,
        &[
            &channel.as_str(),
            &head,
            &bytes,
            &now,
            &append.close,
            &append.stream_seq,
            &closed_by.map(|p| p.id.as_str()),
            &closed_by.map(|p| sql_position(p.epoch)),
            &closed_by.map(|p| sql_position(p.seq)),
        ],
    )
    .await?;
    if let Some(p) = &append.producer {
        let upsert = tx
            .prepare_cached(
                "INSERT INTO stream_producers (channel, producer, epoch, last_seq, last_append_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (channel, producer) \
                 DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, \
                 last_append_at = excluded.last_append_at",
            )
            .await?;
        tx.execute(
            &upsert,
            &[
                &channel.as_str(),
                &p.id,
                &sql_position(p.epoch),
                &sql_position(p.seq),
                &now,
            ],
        )
        .await?;
    }
    Ok(Applied::Write {
        first: row.head + 1,
        head,
        closed: row.closed || append.close,
    })
}

/// `Storage::soft_delete_stream`: marks the stream deleted while forks of
/// it remain, a fenced write.
pub(super) async fn soft_delete_stream(
    client: &mut Object,
    lease: &Lease,
    channel: &ChannelName,
) -> Result<bool> {
    let Fenced { tx, fence, .. } = fenced(client, lease, Serialized::Yes, None).await?;
    let mark = tx
        .prepare_cached(
            "UPDATE channels SET soft_deleted = true WHERE name = $1 AND content_type IS NOT NULL",
        )
        .await?;
    let marked = tx.execute(&mark, &[&channel.as_str()]).await?;
    commit(tx, &fence, lease, channel, 1, 0).await?;
    Ok(marked > 0)
}

/// `Storage::renew_streams`: restarts the TTL of every live stream of
/// `channels` that has one, a fenced write. It takes the fenced-write
/// lock (as an append does) so that its row locks, taken in no set order,
/// never wait in a circle with an append's.
pub(super) async fn renew_streams(
    client: &mut Object,
    lease: &Lease,
    channels: &[ChannelName],
) -> Result<u64> {
    let Fenced { tx, fence, .. } = fenced(client, lease, Serialized::Yes, None).await?;
    let renew = tx
        .prepare_cached(
            "UPDATE channels SET touched_at = GREATEST(touched_at, $2) \
             WHERE name = ANY($1::text[]) AND content_type IS NOT NULL AND NOT soft_deleted \
               AND ttl_s IS NOT NULL AND touched_at IS NOT NULL \
               AND touched_at + ttl_s * interval '1 second' > $2 \
               AND (expires_at IS NULL OR expires_at > $2)",
        )
        .await?;
    let names: Vec<&str> = channels.iter().map(ChannelName::as_str).collect();
    let renewed = tx.execute(&renew, &[&names, &fence.now]).await?;
    match fence.decide(&tx, lease).await? {
        Decision::Commit(_) => {}
        Decision::Refuse => return Err(refuse(tx, lease).await),
    }
    tx.commit().await?;
    Ok(renewed)
}

/// `Storage::expired_streams`: the streams whose expiry passed on the
/// database's clock, by name in byte order, at most `limit`.
pub(super) async fn expired_streams(client: &Object, limit: usize) -> Result<Vec<ChannelName>> {
    let stmt = client
        .prepare_cached(
            "SELECT name FROM channels WHERE content_type IS NOT NULL \
             AND LEAST(expires_at, touched_at + ttl_s * interval '1 second') <= clock_timestamp() \
             ORDER BY name COLLATE \"C\" LIMIT $1",
        )
        .await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    client
        .query(&stmt, &[&limit])
        .await?
        .into_iter()
        .map(|row| crate::decode::to_channel(row.try_get(0)?))
        .collect()
}
