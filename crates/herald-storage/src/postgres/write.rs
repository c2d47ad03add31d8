//! The group commit of PostgreSQL (`MessageLog::write`): messages and
//! stream appends in one fenced transaction. Apart from `ops.rs`, which
//! holds the fenced-write prelude it shares with every other write, and
//! `streams.rs`, which decides each stream append, so that neither of
//! those needs the other.

use std::collections::HashMap;

use deadpool_postgres::Object;
use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{Appended, Lease, Payload, StreamAppended, WriteOutcome, WriteRequest};

use super::names::CHANGES_CHANNEL;
use super::ops::*;
use super::streams::{self, Applied};
use crate::decode::to_u64;
use crate::digest::{idempotency_digest, IdempotencyDigest};
use crate::error::{Error, Refusal, Result};

/// The fenced write (`Storage::write`): one READ COMMITTED transaction
/// that runs the fenced-write prelude ([`fenced`]: the lease's advisory
/// lock, the lease row `FOR KEY SHARE`, the fencing check), then the
/// batch's stream appends one by one ([`streams::apply_append`]: a few
/// statements each, none for a batch without them), then writes the
/// batch's messages with a constant number of set-based statements,
/// whatever their number: every idempotency key of the batch is
/// looked up in one query; each channel's head advances by its count of
/// new messages in one statement; the fencing check runs again as the
/// decision to commit, and its clock reading is the batch's
/// `published_at`; every new message is inserted in one statement, and one
/// change notice per channel written is sent, before `COMMIT`. Statements
/// that do not depend on an earlier answer are sent together (tokio-postgres
/// pipelines queries whose futures are polled together); the server still
/// runs them in order, so every check reads the clock after the waits of
/// the statements before it.
///
/// The test-only fault switch `drop_notify` (no change notices) acts here,
/// and `skip_fencing_check` through [`fenced`]: see
/// `herald_core::fault_switches::FaultSwitch`.
pub(super) async fn write(
    client: &mut Object,
    lease: &Lease,
    batch: &[WriteRequest],
) -> Result<Vec<WriteOutcome>> {
    // 1. The prelude, in one round trip: advisory lock, lease row, check.
    let Fenced { tx, fence, .. } = fenced(client, lease, Serialized::Yes, None).await?;
    let started = fence.now;
    let token = fence.token;

    // 1b. The stream appends, one after the other in batch order (each
    // locks its stream's row, decides, and updates the row): their
    // offsets come before those of the batch's messages.
    let mut applied: Vec<Applied> = Vec::new();
    for entry in batch {
        if let WriteRequest::Stream(append) = entry {
            applied.push(streams::apply_append(&tx, started, append).await?);
        }
    }

    // 2. Stored idempotency keys of the batch, in one query.
    let (key_channels, keys): (Vec<&str>, Vec<&str>) = batch
        .iter()
        .filter_map(|entry| match entry {
            WriteRequest::Message(m) => {
                Some((m.channel.as_str(), m.idempotency_key.as_ref()?.as_str()))
            }
            WriteRequest::Stream(_) => None,
        })
        .unzip();
    let found_rows = if keys.is_empty() {
        Vec::new()
    } else {
        let find_keys = tx.prepare_cached(FIND_KEYS_SQL).await?;
        tx.query(&find_keys, &[&key_channels, &keys]).await?
    };
    // Borrowed from the rows: no copy of a channel or key per lookup.
    let mut stored: HashMap<(&str, &str), StoredKey<'_>> = HashMap::new();
    for row in &found_rows {
        stored.insert(
            (row.try_get(0)?, row.try_get(1)?),
            (row.try_get(2)?, row.try_get(3)?, row.try_get(4)?),
        );
    }

    // 3. The plan: duplicates (stored, or of an earlier message of this
    // batch) and, for new messages, their rank within their channel.
    let mut planned: Vec<Planned> = Vec::with_capacity(batch.len());
    let mut written: Vec<Written<'_>> = Vec::new();
    let mut written_at: HashMap<&str, usize> = HashMap::new();
    // Keys of this batch's new messages: (written index, rank, digest).
    let mut batch_keys: HashMap<(&str, &str), (usize, i64, IdempotencyDigest)> = HashMap::new();
    // The digest of each keyed new message, in batch order, for its row.
    let mut digests: Vec<Option<IdempotencyDigest>> = Vec::with_capacity(batch.len());
    for (index, entry) in batch.iter().enumerate() {
        let WriteRequest::Message(message) = entry else {
            digests.push(None);
            planned.push(Planned::Stream);
            continue;
        };
        let channel = message.channel.as_str();
        let key = message.idempotency_key.as_ref().map(|k| k.as_str());
        let digest = key.map(|_| idempotency_digest(message));
        digests.push(digest);
        if let (Some(key), Some(digest)) = (key, digest) {
            if let Some(&(w, rank, first)) = batch_keys.get(&(channel, key)) {
                if first != digest {
                    return Err(key_reused(tx, index).await);
                }
                planned.push(Planned::DuplicateInBatch { written: w, rank });
                continue;
            }
            if let Some(&(offset, published_at, stored)) = stored.get(&(channel, key)) {
                // A key stored without a digest (schema version 1) answers
                // the original message, as it always did.
                if stored.is_some_and(|stored| stored != digest) {
                    return Err(key_reused(tx, index).await);
                }
                planned.push(Planned::Duplicate {
                    offset,
                    published_at,
                });
                continue;
            }
        }
        let json = matches!(message.data, Payload::Json(_));
        let w = *written_at.entry(channel).or_insert_with(|| {
            written.push(Written {
                channel,
                count: 0,
                first: 0,
                last: 0,
                bytes: 0,
                json,
                index,
            });
            written.len() - 1
        });
        if written[w].json != json {
            // JSON and bytes to one channel: one of them is refused.
            return Err(channel_refuses(tx, index, Refusal::ContentType).await);
        }
        let rank = written[w].count;
        written[w].count += 1;
        written[w].bytes += i64::try_from(message.data.len()).unwrap_or(i64::MAX);
        if let (Some(key), Some(digest)) = (key, digest) {
            batch_keys.insert((channel, key), (w, rank, digest));
        }
        planned.push(Planned::New { written: w, rank });
    }

    // 4. The heads, then the fencing check again, after every wait, as the
    // decision that this batch commits: the lease must still be this
    // node's and live on the database clock now. Its clock reading is the
    // batch's `published_at`. Sent together.
    let decision = if written.is_empty() {
        fence.decide(&tx, lease).await?
    } else {
        let bump_heads = tx.prepare_cached(BUMP_HEADS_SQL).await?;
        let names: Vec<&str> = written.iter().map(|w| w.channel).collect();
        let counts: Vec<i64> = written.iter().map(|w| w.count).collect();
        let sizes: Vec<i64> = written.iter().map(|w| w.bytes).collect();
        let kinds: Vec<bool> = written.iter().map(|w| w.json).collect();
        let (heads, decided) = tokio::join!(
            async {
                tx.query(&bump_heads, &[&names, &counts, &started, &sizes, &kinds])
                    .await
            },
            fence.decide(&tx, lease),
        );
        let heads = heads?;
        if heads.len() < written.len() {
            return Err(refused_channel(tx, &written, &heads, &started).await);
        }
        for row in heads {
            let name: &str = row.try_get(0)?;
            let head: i64 = row.try_get(1)?;
            let w = *written_at.get(name).ok_or_else(|| {
                Error::corrupt(format!("the head of an unexpected channel {name:?} moved"))
            })?;
            written[w].last = head;
            written[w].first = head - written[w].count + 1;
        }
        decided?
    };
    let now = match decision {
        Decision::Commit(now) => now,
        Decision::Refuse => return Err(refuse(tx, lease).await),
    };
    let now_ms = to_ms(now);

    // 5. The answers, the rows, and one change notice per channel written.
    let mut out = Vec::with_capacity(batch.len());
    let mut rows_channel: Vec<&str> = Vec::new();
    let mut rows_offset: Vec<i64> = Vec::new();
    let mut rows_data: Vec<Option<&str>> = Vec::new();
    let mut rows_body: Vec<Option<&[u8]>> = Vec::new();
    let mut rows_key: Vec<Option<&str>> = Vec::new();
    let mut rows_digest: Vec<Option<&[u8]>> = Vec::new();
    let mut rows_tags: Vec<Option<String>> = Vec::new();
    // The change notices: one per channel written, `(channel, first,
    // last)`; a channel's stream appends and messages of one batch have
    // contiguous offsets.
    let mut notices: Vec<(&str, i64, i64)> = written
        .iter()
        .map(|w| (w.channel, w.first, w.last))
        .collect();
    let mut applied = applied.into_iter();
    for ((entry, plan), digest) in batch.iter().zip(planned).zip(&digests) {
        let message = match entry {
            WriteRequest::Message(message) => message,
            WriteRequest::Stream(append) => {
                let answer = match applied.next() {
                    Some(Applied::Answer(answer)) => answer,
                    Some(Applied::Write {
                        first,
                        head,
                        closed,
                    }) => {
                        let channel = append.channel.as_str();
                        for (offset, payload) in (first..).zip(&append.messages) {
                            rows_channel.push(channel);
                            rows_offset.push(offset);
                            match payload {
                                Payload::Json(json) => {
                                    rows_data.push(Some(json.get()));
                                    rows_body.push(None);
                                }
                                Payload::Bytes(bytes) => {
                                    rows_data.push(None);
                                    rows_body.push(Some(bytes));
                                }
                            }
                            rows_key.push(None);
                            rows_digest.push(None);
                            rows_tags.push(None);
                        }
                        if first <= head {
                            match notices.iter_mut().find(|n| n.0 == channel) {
                                Some(notice) => {
                                    notice.1 = notice.1.min(first);
                                    notice.2 = notice.2.max(head);
                                }
                                None => notices.push((channel, first, head)),
                            }
                        }
                        StreamAppended::Appended {
                            first: to_u64(first, "offset")?,
                            head: to_u64(head, "head")?,
                            published_at_ms: now_ms,
                            closed,
                        }
                    }
                    None => return Err(Error::corrupt("a stream append of the batch was lost")),
                };
                out.push(WriteOutcome::Stream(answer));
                continue;
            }
        };
        let (offset, published_at_ms, duplicate) = match plan {
            Planned::Stream => {
                return Err(Error::corrupt("a message was planned as a stream append"))
            }
            Planned::Duplicate {
                offset,
                published_at,
            } => (offset, to_ms(published_at), true),
            Planned::DuplicateInBatch { written: w, rank } => {
                (written[w].first + rank, now_ms, true)
            }
            Planned::New { written: w, rank } => {
                let offset = written[w].first + rank;
                rows_channel.push(message.channel.as_str());
                rows_offset.push(offset);
                match &message.data {
                    Payload::Json(json) => {
                        rows_data.push(Some(json.get()));
                        rows_body.push(None);
                    }
                    Payload::Bytes(bytes) => {
                        rows_data.push(None);
                        rows_body.push(Some(bytes));
                    }
                }
                rows_key.push(message.idempotency_key.as_ref().map(|k| k.as_str()));
                rows_digest.push(digest.as_ref().map(<[u8; 32]>::as_slice));
                rows_tags.push(message.tags.to_json());
                (offset, now_ms, false)
            }
        };
        out.push(WriteOutcome::Message(Appended {
            channel: message.channel.clone(),
            offset: to_u64(offset, "offset")?,
            published_at_ms,
            duplicate,
        }));
    }
    if !rows_channel.is_empty() {
        let insert = tx.prepare_cached(INSERT_MESSAGES_SQL).await?;
        let inserted = async {
            tx.execute(
                &insert,
                &[
                    &rows_channel,
                    &rows_offset,
                    &rows_data,
                    &rows_key,
                    &now,
                    &token,
                    &rows_digest,
                    &rows_tags,
                    &rows_body,
                ],
            )
            .await
        };
        if fault_switches::enabled(FaultSwitch::DropNotify) {
            inserted.await?;
        } else {
            let notify = tx.prepare_cached(NOTIFY_SQL).await?;
            let channels: Vec<&str> = notices.iter().map(|n| n.0).collect();
            let firsts: Vec<i64> = notices.iter().map(|n| n.1).collect();
            let lasts: Vec<i64> = notices.iter().map(|n| n.2).collect();
            let (inserted, notified) = tokio::join!(inserted, async {
                tx.query(&notify, &[&CHANGES_CHANNEL, &channels, &firsts, &lasts])
                    .await
            });
            inserted?;
            notified?;
        }
    }
    tx.commit().await?;
    Ok(out)
}
