//! The group commit of SQLite (`MessageLog::write`): messages and stream
//! appends in one fenced transaction. Apart from `ops.rs`, which holds the
//! fencing check it shares with every other write, and `streams.rs`,
//! which decides each stream append, so that neither needs the other.

use herald_core::{Appended, Lease, Payload, WriteOutcome, WriteRequest};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::ops::*;
use crate::decode::to_u64;
use crate::digest::idempotency_digest;
use crate::error::{Error, Refusal, Result};

/// The fenced write (`Storage::write`): one `BEGIN IMMEDIATE` transaction
/// that first proves the lease current and unexpired, then writes the
/// batch's entries in order: messages here, stream appends by
/// [`streams::apply_append`].
pub(super) fn write(
    conn: &mut Connection,
    lease: &Lease,
    batch: &[WriteRequest],
) -> Result<Vec<WriteOutcome>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // The fencing check. It also reads the batch's commit time.
    let (now, token) = fenced_now(&tx, lease, "fenced write refused")?;

    let mut out = Vec::with_capacity(batch.len());
    {
        let mut find_key = tx.prepare_cached(
            "SELECT \"offset\", published_at_ms, idempotency_digest FROM messages \
             WHERE channel = ?1 AND idempotency_key = ?2",
        )?;
        // Without `RETURNING`: SQLite buffers a `RETURNING` statement's
        // rows in a temporary b-tree it opens (and zeroes a page for) on
        // each run; the head is read back in the same transaction instead.
        // A closed stream, an expired one, or a stream of the other kind
        // of payload takes no message: the upsert then changes no row. A
        // publish restarts a live stream's TTL, as a stream append does.
        let mut bump_head = tx.prepare_cached(&format!(
            "INSERT INTO channels (name, head, created_at_ms, bytes, json) VALUES (?1, 1, ?2, ?3, ?4) \
             ON CONFLICT (name) DO UPDATE SET head = head + 1, bytes = bytes + excluded.bytes, \
                 touched_at_ms = CASE WHEN ttl_s IS NULL THEN touched_at_ms ELSE ?2 END \
             WHERE closed = 0 AND json = excluded.json AND NOT {EXPIRED_AT_2}"
        ))?;
        let mut read_head = tx.prepare_cached("SELECT head FROM channels WHERE name = ?1")?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO messages \
             (channel, \"offset\", data, published_at_ms, idempotency_key, token, idempotency_digest, tags, body) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for (index, entry) in batch.iter().enumerate() {
            let message = match entry {
                WriteRequest::Message(message) => message,
                WriteRequest::Stream(append) => {
                    let answer = super::streams::apply_append(&tx, now, token, append)?;
                    out.push(WriteOutcome::Stream(answer));
                    continue;
                }
            };
            let channel = message.channel.as_str();
            let key = message.idempotency_key.as_ref().map(|k| k.as_str());
            let digest = key.map(|_| idempotency_digest(message));
            if let (Some(key), Some(digest)) = (key, digest) {
                // Sees this transaction's own inserts: covers keys used
                // earlier in the same batch too.
                let original = find_key
                    .query_row(params![channel, key], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Option<Vec<u8>>>(2)?,
                        ))
                    })
                    .optional()?;
                if let Some((offset, published_at_ms, stored)) = original {
                    // A key stored without a digest (schema version 1)
                    // answers the original message, as it always did.
                    if stored.is_some_and(|stored| stored != digest) {
                        // Dropping the transaction rolls the batch back.
                        return Err(Error::IdempotencyKeyReused { index });
                    }
                    out.push(WriteOutcome::Message(Appended {
                        channel: message.channel.clone(),
                        offset: to_u64(offset, "offset")?,
                        published_at_ms,
                        duplicate: true,
                    }));
                    continue;
                }
            }
            let size = data_size(message);
            let json = matches!(message.data, Payload::Json(_));
            if bump_head.execute(params![channel, now, size, json])? == 0 {
                let (closed, expired): (bool, bool) = tx
                    .prepare_cached(&format!(
                        "SELECT closed, {EXPIRED_AT_2} FROM channels WHERE name = ?1"
                    ))?
                    .query_row(params![channel, now], |r| Ok((r.get(0)?, r.get(1)?)))?;
                let refusal = if closed {
                    Refusal::Closed
                } else if expired {
                    Refusal::Expired
                } else {
                    Refusal::ContentType
                };
                // Dropping the transaction rolls the batch back.
                return Err(Error::ChannelRefuses { index, refusal });
            }
            let offset: i64 = read_head.query_row([channel], |r| r.get(0))?;
            let (data, body) = stored_payload(&message.data);
            insert.execute(params![
                channel,
                offset,
                data,
                now,
                key,
                token,
                digest.as_ref().map(<[u8; 32]>::as_slice),
                message.tags.to_json(),
                body
            ])?;
            out.push(WriteOutcome::Message(Appended {
                channel: message.channel.clone(),
                offset: to_u64(offset, "offset")?,
                published_at_ms: now,
                duplicate: false,
            }));
        }
    }
    tx.commit()?;
    Ok(out)
}
