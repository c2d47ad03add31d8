//! Conformance cases of retention: trimming by each policy, trimming
//! fenced, trimming concurrent with appends, and deletion that keeps the
//! head.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::harness::{
    acquire, assert_lost, channel, offsets, wait_expired, Harness, LONG_TTL, SHORT_TTL,
};
use crate::testing::{keyed, msg};
use crate::traits::{Page, Storage};
use crate::trim::{TrimLimits, Trimmed};

/// Trims `ch` with `limits` in transactions of at most `max_rows` until
/// done; returns every transaction's answer.
async fn trim_all(
    node: &Arc<dyn Storage>,
    lease: &herald_core::Lease,
    ch: &str,
    limits: TrimLimits,
    max_rows: usize,
) -> Vec<Trimmed> {
    let mut out = Vec::new();
    loop {
        let t = node
            .trim(lease, &channel(ch), &limits, max_rows)
            .await
            .expect("trim");
        assert!(
            t.messages <= max_rows as u64,
            "a trim removed more than its row bound: {t:?}"
        );
        out.push(t);
        if t.done {
            return out;
        }
    }
}

fn page_offsets(page: &Page) -> Vec<u64> {
    page.messages.iter().map(|m| m.offset).collect()
}

/// `max_messages` keeps the newest messages, in transactions bounded by
/// `max_rows`; the head stays; idempotency keys of trimmed messages are
/// gone (the same key publishes again), those of kept messages stay.
pub async fn trim_by_max_messages_keeps_the_newest_and_drops_their_keys(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    let batch: Vec<_> = (1..=10)
        .map(|i| keyed("r", &format!("{{\"n\":{i}}}"), &format!("k{i}")))
        .collect();
    node.append(&lease, &batch).await.unwrap();

    let limits = TrimLimits {
        max_messages: Some(3),
        ..TrimLimits::default()
    };
    let steps = trim_all(node, &lease, "r", limits, 3).await;
    assert_eq!(steps.iter().map(|t| t.messages).sum::<u64>(), 7);
    assert!(steps.len() >= 3, "7 messages in steps of 3: {steps:?}");
    let last = steps.last().unwrap();
    assert_eq!((last.earliest, last.head), (8, 10));

    let page = node.read(&channel("r"), 0, 100).await.unwrap();
    assert_eq!((page.earliest, page.head), (8, 10));
    assert_eq!(page_offsets(&page), [8, 9, 10]);

    let stats = node.channel_stats().await.unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!(
        (stats[0].head, stats[0].earliest, stats[0].messages),
        (10, 8, 3)
    );
    // `{"n":8}`, `{"n":9}` and `{"n":10}`.
    assert_eq!(stats[0].bytes, 7 + 7 + 8);

    // Nothing more to trim: the same policy again removes nothing.
    let again = node.trim(&lease, &channel("r"), &limits, 3).await.unwrap();
    assert_eq!((again.messages, again.earliest, again.done), (0, 8, true));

    let out = node
        .append(
            &lease,
            &[keyed("r", "{\"n\":1}", "k1"), keyed("r", "{\"n\":9}", "k9")],
        )
        .await
        .unwrap();
    assert_eq!(offsets(&out), [11, 9]);
    assert!(!out[0].duplicate, "a trimmed key publishes again");
    assert!(out[1].duplicate, "a kept key still answers its message");
}

/// `max_bytes` keeps the newest messages whose data fits.
pub async fn trim_by_max_bytes_keeps_what_fits(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    // Ten messages of ten bytes each.
    let batch: Vec<_> = (0..10)
        .map(|i| msg("b", &format!("\"abcdefg{i}\"")))
        .collect();
    node.append(&lease, &batch).await.unwrap();
    let before = node.channel_stats().await.unwrap();
    assert_eq!(before[0].bytes, 100);

    let limits = TrimLimits {
        max_bytes: Some(35),
        ..TrimLimits::default()
    };
    let steps = trim_all(node, &lease, "b", limits, 100).await;
    assert_eq!(steps.iter().map(|t| t.bytes).sum::<u64>(), 70);
    let page = node.read(&channel("b"), 0, 100).await.unwrap();
    assert_eq!(page_offsets(&page), [8, 9, 10]);
    let stats = node.channel_stats().await.unwrap();
    assert_eq!((stats[0].bytes, stats[0].messages), (30, 3));
}

/// `max_age` removes the messages published at least that long ago on the
/// storage's clock, and none published later. The storage's clock is read
/// through the `published_at_ms` of probe appends before and after the
/// trim, so the case asserts only what those readings decide, whatever
/// the machine's speed.
pub async fn trim_by_max_age_removes_only_old_messages(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    let clock =
        || async { node.append(&lease, &[msg("clock", "0")]).await.unwrap()[0].published_at_ms };
    let old = node
        .append(&lease, &[msg("a", "1"), msg("a", "2")])
        .await
        .unwrap();
    let age_ms: i64 = 300;
    // Wait for the storage's clock (an event, observed by probing it).
    while clock().await < old[1].published_at_ms + age_ms {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let young = node.append(&lease, &[msg("a", "3")]).await.unwrap();

    let limits = TrimLimits {
        max_age_ms: Some(age_ms.unsigned_abs()),
        ..TrimLimits::default()
    };
    let steps = trim_all(node, &lease, "a", limits, 100).await;
    let after = clock().await;
    let page = node.read(&channel("a"), 0, 100).await.unwrap();
    if after < young[0].published_at_ms + age_ms {
        // The trim ran before message 3 was old enough: only 1 and 2 go.
        assert_eq!(page.earliest, 3, "{steps:?}");
        assert_eq!(page_offsets(&page), [3]);
    } else {
        assert!(page.earliest >= 3, "{steps:?}");
    }
}

/// A trim with a lease that another node took over removes nothing.
pub async fn trim_with_a_lost_lease_removes_nothing(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (old, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    let batch: Vec<_> = (1..=5).map(|i| msg("f", &i.to_string())).collect();
    c.node(0).append(&old, &batch).await.unwrap();
    wait_expired(c.node(1), &old.name).await;
    let (new, _) = acquire(c.node(1), 1, LONG_TTL).await;

    let limits = TrimLimits {
        max_messages: Some(0),
        ..TrimLimits::default()
    };
    assert_lost(
        c.node(0).trim(&old, &channel("f"), &limits, 100).await,
        &old,
    );
    let page = c.node(1).read(&channel("f"), 0, 100).await.unwrap();
    assert_eq!((page.earliest, page.head), (1, 5));
    assert_eq!(page.messages.len(), 5);

    let t = c
        .node(1)
        .trim(&new, &channel("f"), &limits, 100)
        .await
        .unwrap();
    assert_eq!((t.messages, t.earliest, t.head), (5, 6, 5));
}

/// A trim and a deletion are fenced like an append, on every part of the
/// check: after the lease expired (nobody took it), with a superseded
/// token of the same holder, and with the current token under another
/// holder's name, each is `LeaseLost` and changes nothing.
pub async fn trim_and_deletion_are_fenced_by_token_holder_and_expiry(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let all = TrimLimits {
        max_messages: Some(0),
        ..TrimLimits::default()
    };
    let (expired, _) = acquire(node, 0, SHORT_TTL).await;
    let batch: Vec<_> = (1..=3).map(|i| msg("g", &i.to_string())).collect();
    node.append(&expired, &batch).await.unwrap();
    wait_expired(node, &expired.name).await;
    assert_lost(
        node.trim(&expired, &channel("g"), &all, 100).await,
        &expired,
    );
    assert_lost(
        node.record_deletion(&expired, &channel("g"), 3).await,
        &expired,
    );

    let (first, _) = acquire(node, 0, LONG_TTL).await;
    node.release(&first).await.unwrap();
    let (second, _) = acquire(node, 0, LONG_TTL).await;
    assert_eq!(first.holder, second.holder);
    let impostor = herald_core::Lease {
        holder: "node-9".to_owned(),
        ..second.clone()
    };
    for lost in [&first, &impostor] {
        assert_lost(node.trim(lost, &channel("g"), &all, 100).await, lost);
        assert_lost(node.record_deletion(lost, &channel("g"), 3).await, lost);
    }

    let page = node.read(&channel("g"), 0, 10).await.unwrap();
    assert_eq!((page.earliest, page.head, page.deletion), (1, 3, 0));
    assert_eq!(page.messages.len(), 3);
    assert_eq!(node.deletion_cursor().await.unwrap(), 0);
    let t = node.trim(&second, &channel("g"), &all, 100).await.unwrap();
    assert_eq!((t.messages, t.earliest, t.head), (3, 4, 3));
    assert_eq!(
        node.record_deletion(&second, &channel("g"), 3)
            .await
            .unwrap(),
        1
    );
}

/// Deleting a channel (`up_to` its head) removes every message and key but
/// keeps the head: the next message continues after it. An unknown channel
/// trims nothing and reads earliest 1.
pub async fn delete_keeps_the_head(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    let batch: Vec<_> = (1..=5)
        .map(|i| keyed("d", &i.to_string(), &format!("k{i}")))
        .collect();
    node.append(&lease, &batch).await.unwrap();

    let limits = TrimLimits {
        up_to: Some(5),
        ..TrimLimits::default()
    };
    let steps = trim_all(node, &lease, "d", limits, 2).await;
    assert_eq!(steps.iter().map(|t| t.messages).sum::<u64>(), 5);
    let page = node.read(&channel("d"), 0, 100).await.unwrap();
    assert_eq!((page.earliest, page.head), (6, 5));
    assert!(page.messages.is_empty());
    let stats = node.channel_stats().await.unwrap();
    assert_eq!(
        (
            stats[0].head,
            stats[0].earliest,
            stats[0].messages,
            stats[0].bytes
        ),
        (5, 6, 0, 0)
    );

    let out = node.append(&lease, &[keyed("d", "1", "k1")]).await.unwrap();
    assert_eq!(offsets(&out), [6]);
    assert!(!out[0].duplicate);

    let unknown = node
        .trim(&lease, &channel("nobody"), &limits, 10)
        .await
        .unwrap();
    assert_eq!(
        (unknown.messages, unknown.earliest, unknown.head),
        (0, 1, 0)
    );
    let page = node.read(&channel("nobody"), 0, 10).await.unwrap();
    assert_eq!((page.earliest, page.head), (1, 0));
}

/// Appends and trims running at once on one channel: every trim keeps at
/// least `max_messages` (nothing newer than the policy is removed), every
/// read sees contiguous offsets from the channel's earliest to its head,
/// and at the end exactly the newest `max_messages` remain.
pub async fn concurrent_append_and_trim_keep_offsets_contiguous(h: &dyn Harness) {
    const KEEP: u64 = 20;
    const BATCHES: u64 = 60;
    const PER_BATCH: u64 = 5;
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let limits = TrimLimits {
        max_messages: Some(KEEP),
        ..TrimLimits::default()
    };
    let writer = {
        let node = Arc::clone(c.node(0));
        let lease = lease.clone();
        tokio::spawn(async move {
            for b in 0..BATCHES {
                let batch: Vec<_> = (0..PER_BATCH)
                    .map(|i| msg("cc", &(b * PER_BATCH + i).to_string()))
                    .collect();
                node.append(&lease, &batch).await.unwrap();
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut trimmed = 0;
    while !writer.is_finished() {
        assert!(Instant::now() < deadline, "the appends never finished");
        let t = c
            .node(0)
            .trim(&lease, &channel("cc"), &limits, 7)
            .await
            .unwrap();
        trimmed += t.messages;
        assert!(
            t.head < KEEP || t.earliest <= t.head + 1 - KEEP,
            "a trim removed messages within the policy: {t:?}"
        );
        let page = c.node(1).read(&channel("cc"), 0, 1000).await.unwrap();
        let expected: Vec<u64> = (page.earliest..=page.head).collect();
        assert_eq!(page_offsets(&page), expected);
    }
    writer.await.unwrap();
    let steps = trim_all(c.node(0), &lease, "cc", limits, 7).await;
    trimmed += steps.iter().map(|t| t.messages).sum::<u64>();
    let total = BATCHES * PER_BATCH;
    assert_eq!(trimmed, total - KEEP);
    let page = c.node(1).read(&channel("cc"), 0, 1000).await.unwrap();
    assert_eq!((page.earliest, page.head), (total - KEEP + 1, total));
    assert_eq!(
        page_offsets(&page),
        (total - KEEP + 1..=total).collect::<Vec<_>>()
    );
}

/// A deletion is a fenced, durable record every node reads: numbered from
/// 1 across channels in commit order, the latest per channel kept, seen in
/// reads (`Page::deletion`) and in `deletions_since` from another node; a
/// channel never written can be deleted; a lost lease records nothing.
pub async fn deletions_are_numbered_shared_and_fenced(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (holder, follower) = (c.node(0), c.node(1));
    let (lease, _) = acquire(holder, 0, LONG_TTL).await;
    holder
        .append(&lease, &[msg("a", "1"), msg("a", "2"), msg("b", "3")])
        .await
        .unwrap();
    assert_eq!(follower.deletion_cursor().await.unwrap(), 0);
    let empty = follower.deletions_since(0).await.unwrap();
    assert_eq!((empty.cursor, empty.deleted.len()), (0, 0));
    assert_eq!(
        follower.read(&channel("a"), 0, 10).await.unwrap().deletion,
        0
    );

    let limits = TrimLimits {
        up_to: Some(2),
        ..TrimLimits::default()
    };
    trim_all(holder, &lease, "a", limits, 10).await;
    assert_eq!(
        holder
            .record_deletion(&lease, &channel("a"), 2)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        holder
            .record_deletion(&lease, &channel("b"), 1)
            .await
            .unwrap(),
        2
    );
    // Deleted again (with what came since): only the latest is kept.
    holder.append(&lease, &[msg("a", "4")]).await.unwrap();
    assert_eq!(
        holder
            .record_deletion(&lease, &channel("a"), 3)
            .await
            .unwrap(),
        3
    );
    // Never written.
    assert_eq!(
        holder
            .record_deletion(&lease, &channel("nobody"), 0)
            .await
            .unwrap(),
        4
    );

    let all = follower.deletions_since(0).await.unwrap();
    let seen: Vec<_> = all
        .deleted
        .iter()
        .map(|d| (d.channel.as_str(), d.head, d.number))
        .collect();
    assert_eq!(seen, [("b", 1, 2), ("a", 3, 3), ("nobody", 0, 4)]);
    assert_eq!(all.cursor, 4);
    let later = follower.deletions_since(2).await.unwrap();
    assert_eq!(
        later.deleted.iter().map(|d| d.number).collect::<Vec<_>>(),
        [3, 4]
    );
    assert_eq!(later.cursor, 4);
    let none = follower.deletions_since(4).await.unwrap();
    assert_eq!((none.cursor, none.deleted.len()), (4, 0));
    assert_eq!(follower.deletion_cursor().await.unwrap(), 4);
    assert_eq!(
        follower.read(&channel("a"), 0, 10).await.unwrap().deletion,
        3
    );
    assert_eq!(
        follower.read(&channel("b"), 0, 10).await.unwrap().deletion,
        2
    );
    assert_eq!(
        follower.read(&channel("c"), 0, 10).await.unwrap().deletion,
        0
    );

    // After a takeover, the old lease records nothing.
    holder.release(&lease).await.unwrap();
    acquire(follower, 1, LONG_TTL).await;
    assert_lost(
        holder.record_deletion(&lease, &channel("a"), 3).await,
        &lease,
    );
    assert_eq!(follower.deletion_cursor().await.unwrap(), 4);
    assert_eq!(
        follower.read(&channel("a"), 0, 10).await.unwrap().deletion,
        3
    );
}
