//! The conformance suite: the cases every [`Storage`](crate::traits::Storage) backend must pass,
//! unchanged.
//!
//! A backend's test file implements [`Harness`] (how to make `n` nodes that
//! share one new, empty database) and expands
//! [`conformance_tests!`](crate::conformance_tests) with it, which writes one
//! `#[tokio::test]` per case:
//!
//! ```text
//! struct MyHarness;
//!
//! #[async_trait::async_trait]
//! impl herald_storage::conformance::Harness for MyHarness {
//!     async fn cluster(&self, n: usize) -> herald_storage::conformance::Cluster {
//!         // open `n` storages on one fresh database
//!         # unimplemented!()
//!     }
//! }
//!
//! herald_storage::conformance_tests!(MyHarness);
//! ```
//!
//! The test crate needs `tokio` (features `macros`, `rt-multi-thread`).
//! Every case is also a public `async fn` taking `&dyn Harness`, so it can be
//! run by hand. Cases that need a lease to expire use a ttl of 100 ms and
//! poll [`crate::LeaseStore::lease_info`] until `expires_in_ms <= 0`; they never
//! sleep a fixed time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::{ChannelHead, FencingToken, Lease, NewMessage, DEFAULT_LEASE_NAME};

use crate::testing::{keyed, msg, tagged};

use crate::error::Error;
use crate::traits::{
    Acquire, ChannelClients, ClientInfo, NodeReport, PresenceEntry, PresenceEvent,
    PresenceEventKind, TakeoverCount, TakeoverReason,
};

mod console;
mod harness;
mod retention;
mod streams;

pub use console::{channel_pages_search_resume_and_count, lease_history_is_the_takeover_timeline};
use harness::{
    acquire, assert_lost, candidate, channel, offsets, wait_expired, EXPIRY_WAIT, HOLDER_GONE_WAIT,
    LONG_TTL, SHORT_TTL,
};
pub use harness::{Cluster, Harness};
pub use retention::{
    concurrent_append_and_trim_keep_offsets_contiguous, delete_keeps_the_head,
    deletions_are_numbered_shared_and_fenced,
    trim_and_deletion_are_fenced_by_token_holder_and_expiry,
    trim_by_max_age_removes_only_old_messages, trim_by_max_bytes_keeps_what_fits,
    trim_by_max_messages_keeps_the_newest_and_drops_their_keys,
    trim_with_a_lost_lease_removes_nothing,
};
pub use streams::{
    a_channel_with_messages_is_converted_only_when_allowed, a_closed_stream_refuses_every_append,
    a_deleted_stream_starts_afresh, a_fork_copies_its_source_up_to_its_offset,
    a_mixed_group_commits_without_its_refused_stream_appends,
    a_renewal_restarts_the_ttl_of_live_streams_only, a_soft_deleted_stream_is_gone_until_deleted,
    an_expired_stream_is_gone, an_expired_stream_reads_as_deleted_until_swept,
    fork_limits_are_checked_before_copying, json_publishes_are_refused_by_byte_streams,
    stream_producers_are_bounded_and_forgotten_when_idle,
    stream_producers_are_exactly_once_across_a_takeover, stream_writes_are_fenced,
    streams_store_bytes_exactly,
};

/// Expands into one `#[tokio::test]` per conformance case, each running the
/// case against a fresh [`Harness`](crate::conformance::Harness) made by
/// evaluating `$harness`.
///
/// Use it at the top level of an integration test file; the test crate needs
/// `tokio` with the `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            acquire_fresh_gets_token_1_and_others_see_held,
            streams_store_bytes_exactly,
            stream_producers_are_exactly_once_across_a_takeover,
            stream_producers_are_bounded_and_forgotten_when_idle,
            a_closed_stream_refuses_every_append,
            a_mixed_group_commits_without_its_refused_stream_appends,
            json_publishes_are_refused_by_byte_streams,
            a_deleted_stream_starts_afresh,
            stream_writes_are_fenced,
            an_expired_stream_is_gone,
            an_expired_stream_reads_as_deleted_until_swept,
            a_renewal_restarts_the_ttl_of_live_streams_only,
            a_fork_copies_its_source_up_to_its_offset,
            a_soft_deleted_stream_is_gone_until_deleted,
            a_channel_with_messages_is_converted_only_when_allowed,
            fork_limits_are_checked_before_copying,
            renew_extends_expiry,
            renew_with_wrong_token_or_holder_is_lost,
            renew_after_expiry_is_lost,
            release_lets_another_node_acquire_at_once,
            reacquire_after_release_gets_larger_token,
            tokens_only_grow,
            takeover_after_expiry_has_reason_expired,
            takeover_after_holder_dropped_has_reason_holder_gone,
            own_live_lease_is_reclaimed_with_a_new_token,
            takeover_counts_are_recorded_by_reason_and_outlive_the_nodes,
            takeover_hint_fires_when_the_holder_is_dropped,
            takeover_hint_fires_when_the_holder_releases,
            append_offsets_are_contiguous_across_batches,
            append_interleaves_channels_in_one_batch,
            idempotency_key_repeated_in_later_batch_is_duplicate,
            idempotency_key_repeated_in_same_batch_is_duplicate,
            idempotency_key_is_per_channel,
            idempotency_key_reused_for_another_message_is_refused,
            large_mixed_batch_keeps_offsets_and_keys,
            append_with_stale_lease_after_takeover_is_lost,
            append_with_superseded_token_of_same_holder_is_lost,
            append_after_expiry_is_lost,
            read_pages_with_after_and_limit,
            unknown_channel_reads_empty,
            channels_are_sorted_with_heads,
            changes_since_reports_exactly_the_moved_channels,
            json_data_round_trips_byte_exactly,
            tags_are_stored_with_their_message,
            concurrent_appends_never_duplicate_or_skip,
            ping_answers,
            trim_by_max_messages_keeps_the_newest_and_drops_their_keys,
            trim_by_max_bytes_keeps_what_fits,
            trim_by_max_age_removes_only_old_messages,
            trim_with_a_lost_lease_removes_nothing,
            trim_and_deletion_are_fenced_by_token_holder_and_expiry,
            delete_keeps_the_head,
            deletions_are_numbered_shared_and_fenced,
            concurrent_append_and_trim_keep_offsets_contiguous,
            channel_epoch_is_stable_and_shared,
            reads_create_no_rows,
            channel_epoch_is_stable_across_the_first_publish,
            presence_is_shared_renewed_and_expires,
            presence_events_reach_the_other_nodes_in_order,
            node_reports_are_shared_replaced_and_expire,
            node_channels_are_summed_replaced_and_expire,
            lease_history_is_the_takeover_timeline,
            channel_pages_search_resume_and_count,
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let harness = $harness;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}

/// The first acquisition gets token 1 and reason `Fresh`; a second node then
/// gets `Held` naming the holder; nothing changes by it.
pub async fn acquire_fresh_gets_token_1_and_others_see_held(h: &dyn Harness) {
    let c = h.cluster(2).await;
    assert_eq!(
        c.node(0).lease_info(DEFAULT_LEASE_NAME).await.unwrap(),
        None
    );

    let (lease, reason) = acquire(c.node(0), 0, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Fresh);
    assert_eq!(lease.token, FencingToken(1));
    assert_eq!(lease.name, DEFAULT_LEASE_NAME);
    assert_eq!(lease.holder, "node-0");
    assert_eq!(lease.holder_url, "http://node-0.test:8080");

    match c.node(1).acquire(&candidate(1), LONG_TTL).await.unwrap() {
        Acquire::Held(info) => {
            assert_eq!(info.holder.as_deref(), Some("node-0"));
            assert_eq!(info.holder_url.as_deref(), Some("http://node-0.test:8080"));
            assert_eq!(info.token, FencingToken(1));
            assert!(info.is_held());
        }
        other => panic!("second node must see Held, got {other:?}"),
    }
    let info = c
        .node(1)
        .lease_info(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.holder.as_deref(), Some("node-0"));
    assert_eq!(info.token, FencingToken(1));
    assert!(
        info.expires_in_ms > 0 && info.expires_in_ms <= 60_000,
        "{info:?}"
    );
}

/// A renewal with the current lease succeeds and pushes `expires_in_ms` up;
/// the token stays.
pub async fn renew_extends_expiry(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, Duration::from_secs(5)).await;
    let before = c.node(0).lease_info(&lease.name).await.unwrap().unwrap();
    assert!(before.expires_in_ms <= 5_000, "{before:?}");

    c.node(0).renew(&lease, LONG_TTL).await.unwrap();
    let after = c.node(0).lease_info(&lease.name).await.unwrap().unwrap();
    assert!(after.expires_in_ms > 5_000, "{after:?}");
    assert!(after.expires_in_ms <= 60_000, "{after:?}");
    assert_eq!(after.token, lease.token);
    assert_eq!(after.holder.as_deref(), Some("node-0"));
}

/// A renewal with a wrong token or another holder's name is `LeaseLost` and
/// extends nothing.
pub async fn renew_with_wrong_token_or_holder_is_lost(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, Duration::from_secs(5)).await;

    let newer = Lease {
        token: FencingToken(lease.token.0 + 1),
        ..lease.clone()
    };
    assert_lost(c.node(0).renew(&newer, LONG_TTL).await, &newer);
    let older = Lease {
        token: FencingToken(0),
        ..lease.clone()
    };
    assert_lost(c.node(0).renew(&older, LONG_TTL).await, &older);
    let impostor = Lease {
        holder: "node-1".to_owned(),
        holder_url: "http://node-1.test:8080".to_owned(),
        ..lease.clone()
    };
    assert_lost(c.node(1).renew(&impostor, LONG_TTL).await, &impostor);

    let info = c.node(0).lease_info(&lease.name).await.unwrap().unwrap();
    assert!(
        info.expires_in_ms <= 5_000,
        "a refused renewal extended the lease: {info:?}"
    );
    assert_eq!(info.holder.as_deref(), Some("node-0"));
    assert_eq!(info.token, lease.token);
}

/// A renewal of an expired lease is `LeaseLost` and does not extend it,
/// although nobody else took it.
pub async fn renew_after_expiry_is_lost(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    wait_expired(c.node(0), &lease.name).await;

    assert_lost(c.node(0).renew(&lease, LONG_TTL).await, &lease);
    let info = c.node(0).lease_info(&lease.name).await.unwrap().unwrap();
    assert!(
        info.expires_in_ms <= 0,
        "an expired lease was extended: {info:?}"
    );
    assert!(!info.is_held());
}

/// After a release, another node acquires at once with token + 1 and reason
/// `Released`; releasing the old lease again changes nothing.
pub async fn release_lets_another_node_acquire_at_once(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (first, _) = acquire(c.node(0), 0, LONG_TTL).await;
    c.node(0).release(&first).await.unwrap();

    let info = c.node(1).lease_info(&first.name).await.unwrap().unwrap();
    assert_eq!(info.holder, None);
    assert_eq!(info.holder_url, None);
    assert_eq!(info.token, first.token, "release must not change the token");
    assert!(!info.is_held());

    let (second, reason) = acquire(c.node(1), 1, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Released);
    assert_eq!(second.token, FencingToken(first.token.0 + 1));
    assert_eq!(second.holder, "node-1");

    // A stale release is a no-op.
    c.node(0).release(&first).await.unwrap();
    let info = c.node(0).lease_info(&first.name).await.unwrap().unwrap();
    assert_eq!(info.holder.as_deref(), Some("node-1"));
    assert_eq!(info.token, second.token);
    assert!(info.is_held());
}

/// The same node re-acquiring after its own release gets a larger token.
pub async fn reacquire_after_release_gets_larger_token(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (first, _) = acquire(c.node(0), 0, LONG_TTL).await;
    c.node(0).release(&first).await.unwrap();
    let (second, reason) = acquire(c.node(0), 0, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Released);
    assert!(second.token > first.token);
    assert_eq!(second.token, FencingToken(first.token.0 + 1));
}

/// Over many acquire/release rounds by several nodes (including the same
/// node twice in a row), every acquisition gets exactly the previous token
/// + 1, and a refused acquisition changes no token.
pub async fn tokens_only_grow(h: &dyn Harness) {
    let c = h.cluster(3).await;
    let order = [0, 0, 1, 2, 2, 1, 0, 2, 1, 1, 0, 0];
    let mut last = 0;
    for (round, &i) in order.iter().enumerate() {
        let (lease, reason) = acquire(c.node(i), i, LONG_TTL).await;
        let expected_reason = if round == 0 {
            TakeoverReason::Fresh
        } else {
            TakeoverReason::Released
        };
        assert_eq!(reason, expected_reason, "round {round}");
        assert_eq!(lease.token, FencingToken(last + 1), "round {round}");
        last = lease.token.0;

        let other = (i + 1) % 3;
        assert!(matches!(
            c.node(other)
                .acquire(&candidate(other), LONG_TTL)
                .await
                .unwrap(),
            Acquire::Held(_)
        ));
        let info = c
            .node(other)
            .lease_info(&lease.name)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            info.token, lease.token,
            "a refused acquire changed the token"
        );
        c.node(i).release(&lease).await.unwrap();
    }
    let info = c
        .node(0)
        .lease_info(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.token, FencingToken(order.len() as u64));
}

/// A takeover of an expired lease has reason `Expired` and token + 1; the
/// old holder's renewal is then `LeaseLost` and its acquire sees `Held`.
pub async fn takeover_after_expiry_has_reason_expired(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (old, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    wait_expired(c.node(1), &old.name).await;

    let (new, reason) = acquire(c.node(1), 1, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Expired);
    assert_eq!(new.token, FencingToken(old.token.0 + 1));

    assert_lost(c.node(0).renew(&old, LONG_TTL).await, &old);
    match c.node(0).acquire(&candidate(0), LONG_TTL).await.unwrap() {
        Acquire::Held(info) => assert_eq!(info.holder.as_deref(), Some("node-1")),
        other => panic!("expected Held, got {other:?}"),
    }
}

/// An acquire whose answer its caller never saw (it gave up waiting, the
/// commit happened anyway) leaves a live lease of this very storage. The
/// next acquire of the same storage takes it again with a new token instead
/// of waiting for the expiry, and the unseen token can no longer write.
pub async fn own_live_lease_is_reclaimed_with_a_new_token(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (unseen, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let (again, reason) = acquire(c.node(0), 0, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Reclaimed);
    assert_eq!(again.token.0, unseen.token.0 + 1);
    assert_lost(c.node(0).append(&unseen, &[msg("ch", "1")]).await, &unseen);
    c.node(0)
        .append(&again, &[msg("ch", "2")])
        .await
        .expect("append");
    // Another storage still sees the lease held.
    match c.node(1).acquire(&candidate(1), LONG_TTL).await.unwrap() {
        Acquire::Held(info) => assert_eq!(info.token, again.token),
        other => panic!("expected Held, got {other:?}"),
    }
}

/// Every acquisition is recorded in the database with its reason, so the
/// counts outlive the process that acquired: after a fresh acquire, an
/// expiry takeover, a release, a reclaim and a takeover over a holder
/// whose storage is gone, a node that made none of the later ones reads
/// one of each, and the counts of another lease name are apart.
pub async fn takeover_counts_are_recorded_by_reason_and_outlive_the_nodes(h: &dyn Harness) {
    let mut c = h.cluster(2).await;
    assert_eq!(
        c.node(1).takeover_counts(DEFAULT_LEASE_NAME).await.unwrap(),
        vec![]
    );
    let (first, reason) = acquire(c.node(0), 0, SHORT_TTL).await;
    assert_eq!(reason, TakeoverReason::Fresh);
    wait_expired(c.node(1), &first.name).await;
    let (second, reason) = acquire(c.node(1), 1, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Expired);
    c.node(1).release(&second).await.unwrap();
    let (_, reason) = acquire(c.node(0), 0, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Released);
    let (_, reason) = acquire(c.node(0), 0, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Reclaimed);

    // Node 0, the holder, goes away entirely; node 1 takes over.
    drop(c.nodes.remove(0));
    let standby = c.node(0);
    let started = Instant::now();
    loop {
        match standby.acquire(&candidate(1), LONG_TTL).await.unwrap() {
            Acquire::Acquired { reason, .. } => {
                assert_eq!(reason, TakeoverReason::HolderGone);
                break;
            }
            Acquire::Held(info) => {
                assert!(
                    started.elapsed() < HOLDER_GONE_WAIT,
                    "the dropped holder was not found gone within {HOLDER_GONE_WAIT:?}: {info:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let one = |reason| TakeoverCount {
        reason,
        takeovers: 1,
    };
    assert_eq!(
        standby.takeover_counts(DEFAULT_LEASE_NAME).await.unwrap(),
        TakeoverReason::ALL.into_iter().map(one).collect::<Vec<_>>()
    );
    assert_eq!(standby.takeover_counts("another").await.unwrap(), vec![]);
}

/// A holder whose storage is dropped (every handle, as when its process
/// ends or crashes) is provably gone: another node takes over long before
/// the lease expires, with reason `HolderGone` and token + 1. While the
/// holder's storage is open, the other node sees `Held`.
pub async fn takeover_after_holder_dropped_has_reason_holder_gone(h: &dyn Harness) {
    let mut c = h.cluster(2).await;
    let (old, _) = acquire(c.node(0), 0, LONG_TTL).await;
    match c.node(1).acquire(&candidate(1), LONG_TTL).await.unwrap() {
        Acquire::Held(info) => assert_eq!(info.holder.as_deref(), Some("node-0")),
        other => panic!("a live holder must be Held, got {other:?}"),
    }

    // Node 0's storage goes away entirely; node 1 is now `c.node(0)`.
    drop(c.nodes.remove(0));
    let standby = c.node(0);
    let started = Instant::now();
    let (new, reason) = loop {
        match standby.acquire(&candidate(1), LONG_TTL).await.unwrap() {
            Acquire::Acquired { lease, reason } => break (lease, reason),
            Acquire::Held(info) => {
                assert_eq!(info.holder.as_deref(), Some("node-0"));
                assert!(
                    started.elapsed() < HOLDER_GONE_WAIT,
                    "the dropped holder was not found gone within {HOLDER_GONE_WAIT:?}: {info:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(reason, TakeoverReason::HolderGone);
    assert_eq!(new.holder, "node-1");
    assert_eq!(new.token, FencingToken(old.token.0 + 1));
    let info = standby
        .lease_info(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.holder.as_deref(), Some("node-1"));
    assert_eq!(info.token, new.token);
    assert!(info.expires_in_ms > 50_000, "{info:?}");
}

/// Node 1's acquire finds the lease held by node 0; node 1 then waits on
/// its takeover hint, which must stay pending while node 0 holds the lease
/// (a hint that resolved here would be spurious: allowed, but then not the
/// proof these cases are after).
async fn standby_waiting_on_its_hint(c: &Cluster) -> tokio::task::JoinHandle<()> {
    let info = match c.node(1).acquire(&candidate(1), LONG_TTL).await.unwrap() {
        Acquire::Held(info) => info,
        other => panic!("a live holder must be Held, got {other:?}"),
    };
    assert_eq!(info.holder.as_deref(), Some("node-0"));
    let standby = c.nodes[1].clone();
    let mut waiting = tokio::spawn(async move { standby.takeover_hint(&info).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "the hint fired while node 0 held the lease"
    );
    waiting
}

/// A standby waiting on [`LeaseStore::takeover_hint`](crate::traits::LeaseStore::takeover_hint) is woken when the
/// holder's storage goes away (its process ended), and then takes over
/// with reason `HolderGone`. While the holder lives the hint stays pending.
pub async fn takeover_hint_fires_when_the_holder_is_dropped(h: &dyn Harness) {
    let mut c = h.cluster(2).await;
    let (old, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let waiting = standby_waiting_on_its_hint(&c).await;
    drop(c.nodes.remove(0));
    tokio::time::timeout(HOLDER_GONE_WAIT, waiting)
        .await
        .expect("the hint fires once the holder is gone")
        .unwrap();
    let (new, reason) = acquire(c.node(0), 1, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::HolderGone);
    assert_eq!(new.token, FencingToken(old.token.0 + 1));
}

/// A standby waiting on [`LeaseStore::takeover_hint`](crate::traits::LeaseStore::takeover_hint) is woken by the
/// holder's release, and then acquires with reason `Released`.
pub async fn takeover_hint_fires_when_the_holder_releases(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (old, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let waiting = standby_waiting_on_its_hint(&c).await;
    c.node(0).release(&old).await.unwrap();
    tokio::time::timeout(HOLDER_GONE_WAIT, waiting)
        .await
        .expect("the hint fires on a release")
        .unwrap();
    let (_, reason) = acquire(c.node(1), 1, LONG_TTL).await;
    assert_eq!(reason, TakeoverReason::Released);
}

/// Offsets of one channel are 1..n, contiguous across batches, in batch
/// order; the head follows.
pub async fn append_offsets_are_contiguous_across_batches(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);

    let first = node
        .append(
            &lease,
            &[msg("orders", "1"), msg("orders", "2"), msg("orders", "3")],
        )
        .await
        .unwrap();
    assert_eq!(offsets(&first), [1, 2, 3]);
    assert!(first
        .iter()
        .all(|a| !a.duplicate && a.channel.as_str() == "orders"));
    assert!(first.iter().all(|a| a.published_at_ms > 0));

    let second = node
        .append(&lease, &[msg("orders", "4"), msg("orders", "5")])
        .await
        .unwrap();
    assert_eq!(offsets(&second), [4, 5]);
    assert!(second[0].published_at_ms >= first[0].published_at_ms);

    let page = node.read(&channel("orders"), 0, 100).await.unwrap();
    assert_eq!(page.head, 5);
    let got: Vec<_> = page
        .messages
        .iter()
        .map(|m| (m.offset, m.data.to_json_text().into_owned()))
        .collect();
    let want: Vec<_> = (1..=5).map(|i| (i, i.to_string())).collect();
    assert_eq!(got, want);
    assert_eq!(page.messages[0].published_at_ms, first[0].published_at_ms);
    assert_eq!(page.messages[4].published_at_ms, second[1].published_at_ms);
    assert!(node.append(&lease, &[]).await.unwrap().is_empty());
}

/// One batch over several channels gives each channel its own contiguous
/// offsets; the results come back in input order.
pub async fn append_interleaves_channels_in_one_batch(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);

    let batch = [
        msg("a", "\"a1\""),
        msg("b", "\"b1\""),
        msg("a", "\"a2\""),
        msg("c", "\"c1\""),
        msg("b", "\"b2\""),
        msg("a", "\"a3\""),
    ];
    let out = node.append(&lease, &batch).await.unwrap();
    let got: Vec<_> = out
        .iter()
        .map(|a| (a.channel.as_str().to_owned(), a.offset))
        .collect();
    let want = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2), ("a", 3)]
        .map(|(ch, o)| (ch.to_owned(), o));
    assert_eq!(got, want);

    let out = node
        .append(&lease, &[msg("b", "\"b3\""), msg("a", "\"a4\"")])
        .await
        .unwrap();
    assert_eq!(offsets(&out), [3, 4]);

    for (ch, n) in [("a", 4), ("b", 3), ("c", 1)] {
        let page = node.read(&channel(ch), 0, 100).await.unwrap();
        assert_eq!(page.head, n);
        let data: Vec<_> = page
            .messages
            .iter()
            .map(|m| m.data.to_json_text().into_owned())
            .collect();
        let want: Vec<_> = (1..=n).map(|i| format!("\"{ch}{i}\"")).collect();
        assert_eq!(data, want, "channel {ch}");
    }
}

/// A large batch over many channels, with keys repeated inside it and
/// keys stored by an earlier batch: each channel's new messages get
/// contiguous offsets in batch order, a key seen earlier in the batch
/// answers that message's offset, a stored key answers the stored message,
/// and exactly the new messages are stored, in order.
pub async fn large_mixed_batch_keeps_offsets_and_keys(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);
    let channels: Vec<String> = (0..7).map(|i| format!("mix-{i}")).collect();
    // An earlier batch stores key "k-0" .. "k-9" on mix-0 (offsets 1..=10).
    let earlier: Vec<NewMessage> = (0..10)
        .map(|i| keyed("mix-0", &format!("\"early-{i}\""), &format!("k-{i}")))
        .collect();
    node.append(&lease, &earlier).await.unwrap();

    // 300 messages round-robin over 7 channels; every 5th carries a key:
    // on mix-0 the keys repeat the earlier batch's, elsewhere each key is
    // used twice within the batch.
    let mut batch = Vec::new();
    for i in 0..300usize {
        let ch = &channels[i % channels.len()];
        let data = format!("{i}");
        // A key's repeats carry the same data as its first use (a retry):
        // a key reused for other data is refused instead (see
        // `idempotency_key_reused_for_another_message_is_refused`).
        batch.push(if i % 5 != 0 {
            msg(ch, &data)
        } else if ch == "mix-0" {
            let k = (i / 5) % 10;
            keyed(ch, &format!("\"early-{k}\""), &format!("k-{k}"))
        } else {
            // The same channel's keyed messages are 35 apart: two of them
            // share each 70-wide block's key.
            keyed(
                ch,
                &format!("\"{ch}-b-{}\"", i / 70),
                &format!("b-{}", i / 70),
            )
        });
    }
    let out = node.append(&lease, &batch).await.unwrap();
    assert_eq!(out.len(), batch.len());

    // Replay the rules to know what each answer must be.
    let mut heads: BTreeMap<&str, u64> = channels.iter().map(|c| (c.as_str(), 0)).collect();
    *heads.get_mut("mix-0").unwrap() = 10;
    let mut keys: BTreeMap<(&str, String), u64> = (0..10)
        .map(|i| (("mix-0", format!("k-{i}")), i + 1))
        .collect();
    let mut stored: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let (mut from_earlier, mut from_this_batch) = (0, 0);
    for (m, a) in batch.iter().zip(&out) {
        let ch = m.channel.as_str();
        assert_eq!(a.channel, m.channel);
        let key = m
            .idempotency_key
            .as_ref()
            .map(|k| (ch, k.as_str().to_owned()));
        match key.as_ref().and_then(|k| keys.get(k)) {
            Some(&offset) => {
                assert!(a.duplicate, "{m:?} must be a duplicate");
                assert_eq!(a.offset, offset, "{m:?}");
                if ch == "mix-0" {
                    from_earlier += 1;
                } else {
                    from_this_batch += 1;
                }
            }
            None => {
                let head = heads.get_mut(ch).unwrap();
                *head += 1;
                assert!(!a.duplicate, "{m:?} is new");
                assert_eq!(a.offset, *head, "{m:?}");
                if let Some(k) = key {
                    keys.insert(k, *head);
                }
                stored
                    .entry(ch)
                    .or_default()
                    .push(m.data.to_json_text().into_owned());
            }
        }
    }
    assert!(
        from_earlier > 0 && from_this_batch > 0,
        "{from_earlier} {from_this_batch}"
    );
    for ch in &channels {
        let page = node.read(&channel(ch), 0, 1000).await.unwrap();
        assert_eq!(page.head, heads[ch.as_str()], "{ch}");
        let offsets: Vec<u64> = page.messages.iter().map(|m| m.offset).collect();
        assert_eq!(offsets, (1..=page.head).collect::<Vec<_>>(), "{ch}");
        let new: Vec<String> = page
            .messages
            .iter()
            .skip(if ch == "mix-0" { 10 } else { 0 })
            .map(|m| m.data.to_json_text().into_owned())
            .collect();
        let expected: Vec<&str> = stored
            .get(ch.as_str())
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(new, expected, "{ch}");
    }
}

/// A key used again in a later batch is a duplicate: original offset and
/// time, nothing added, the original data kept.
pub async fn idempotency_key_repeated_in_later_batch_is_duplicate(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);

    let first = node
        .append(
            &lease,
            &[msg("pay", "0"), keyed("pay", "\"original\"", "order-42")],
        )
        .await
        .unwrap();
    assert_eq!(offsets(&first), [1, 2]);
    assert!(!first[1].duplicate);

    let again = node
        .append(
            &lease,
            &[keyed("pay", "\"original\"", "order-42"), msg("pay", "3")],
        )
        .await
        .unwrap();
    assert!(again[0].duplicate);
    assert_eq!(again[0].offset, 2);
    assert_eq!(again[0].published_at_ms, first[1].published_at_ms);
    assert!(!again[1].duplicate);
    assert_eq!(again[1].offset, 3, "a duplicate must not use up an offset");

    let page = node.read(&channel("pay"), 0, 100).await.unwrap();
    assert_eq!(page.head, 3);
    let data: Vec<_> = page
        .messages
        .iter()
        .map(|m| m.data.to_json_text())
        .collect();
    assert_eq!(data, ["0", "\"original\"", "3"]);
}

/// A key repeated inside one batch: the second is a duplicate of the first.
pub async fn idempotency_key_repeated_in_same_batch_is_duplicate(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);

    let out = node
        .append(
            &lease,
            &[
                keyed("q", "\"first\"", "k-1"),
                keyed("q", "\"first\"", "k-1"),
                msg("q", "\"third\""),
                keyed("q", "\"first\"", "k-1"),
            ],
        )
        .await
        .unwrap();
    let got: Vec<_> = out.iter().map(|a| (a.offset, a.duplicate)).collect();
    assert_eq!(got, [(1, false), (1, true), (2, false), (1, true)]);
    assert_eq!(out[1].published_at_ms, out[0].published_at_ms);

    let page = node.read(&channel("q"), 0, 100).await.unwrap();
    assert_eq!(page.head, 2);
    let data: Vec<_> = page
        .messages
        .iter()
        .map(|m| m.data.to_json_text())
        .collect();
    assert_eq!(data, ["\"first\"", "\"third\""]);
}

/// Keys are per channel: another channel may use the same key.
pub async fn idempotency_key_is_per_channel(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);

    let out = node
        .append(&lease, &[keyed("x", "1", "same"), keyed("y", "2", "same")])
        .await
        .unwrap();
    assert!(out.iter().all(|a| !a.duplicate && a.offset == 1));
    let out = node
        .append(&lease, &[keyed("z", "3", "same")])
        .await
        .unwrap();
    assert!(!out[0].duplicate);
    for ch in ["x", "y", "z"] {
        assert_eq!(node.read(&channel(ch), 0, 10).await.unwrap().head, 1);
    }
}

/// A key used again on its channel for another message (other data, even
/// only other whitespace) refuses the whole batch with
/// `IdempotencyKeyReused` naming the message, and commits nothing of it;
/// the same message again is a duplicate; another channel may use the key.
pub async fn idempotency_key_reused_for_another_message_is_refused(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let node = c.node(0);
    let out = node
        .append(&lease, &[keyed("r", "{\"n\":1}", "k")])
        .await
        .unwrap();
    assert_eq!(offsets(&out), [1]);
    let cursor = node.change_cursor().await.unwrap();

    for (batch, index) in [
        (vec![msg("r", "2"), keyed("r", "{\"n\":2}", "k")], 1),
        (vec![keyed("r", "{\"n\": 1}", "k")], 0),
        // Within one batch: the second use of a new key.
        (
            vec![
                msg("other", "1"),
                keyed("s", "1", "j"),
                keyed("s", "2", "j"),
            ],
            2,
        ),
    ] {
        match node.append(&lease, &batch).await {
            Err(Error::IdempotencyKeyReused { index: got }) => assert_eq!(got, index),
            other => panic!("expected IdempotencyKeyReused {{ index: {index} }}, got {other:?}"),
        }
    }
    // Nothing of the refused batches was committed.
    assert_eq!(node.changes_since(cursor).await.unwrap().changed, []);
    for (ch, head) in [("r", 1), ("s", 0), ("other", 0)] {
        assert_eq!(
            node.read(&channel(ch), 0, 10).await.unwrap().head,
            head,
            "{ch}"
        );
    }

    // A retry of the same message is a duplicate; the key is free on
    // another channel; after a refusal the node writes on.
    let out = node
        .append(
            &lease,
            &[
                keyed("r", "{\"n\":1}", "k"),
                keyed("s", "2", "k"),
                msg("r", "3"),
            ],
        )
        .await
        .unwrap();
    let got: Vec<_> = out.iter().map(|a| (a.offset, a.duplicate)).collect();
    assert_eq!(got, [(1, true), (1, false), (2, false)]);
    let page = node.read(&channel("r"), 0, 10).await.unwrap();
    let data: Vec<_> = page
        .messages
        .iter()
        .map(|m| m.data.to_json_text())
        .collect();
    assert_eq!(data, ["{\"n\":1}", "3"]);
}

/// After another node took over (expiry), the old holder's fenced write is
/// `LeaseLost` and commits nothing; the new holder continues the offsets.
pub async fn append_with_stale_lease_after_takeover_is_lost(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (old, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    c.node(0).append(&old, &[msg("log", "1")]).await.unwrap();
    let cursor = c.node(0).change_cursor().await.unwrap();
    wait_expired(c.node(1), &old.name).await;
    let (new, _) = acquire(c.node(1), 1, LONG_TTL).await;

    let result = c
        .node(0)
        .append(&old, &[msg("log", "2"), msg("fresh", "1")])
        .await;
    assert_lost(result, &old);
    let page = c.node(1).read(&channel("log"), 0, 10).await.unwrap();
    assert_eq!(page.head, 1);
    assert_eq!(page.messages.len(), 1);
    assert_eq!(
        c.node(1).read(&channel("fresh"), 0, 10).await.unwrap().head,
        0
    );
    assert_eq!(c.node(1).change_cursor().await.unwrap(), cursor);

    let out = c.node(1).append(&new, &[msg("log", "2")]).await.unwrap();
    assert_eq!(offsets(&out), [2]);
}

/// A fenced write presenting a superseded token of the same holder (same
/// node id, an earlier acquisition) is `LeaseLost`, and so is one that
/// names another holder with the current token: the token and the holder
/// are both checked.
pub async fn append_with_superseded_token_of_same_holder_is_lost(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (first, _) = acquire(node, 0, LONG_TTL).await;
    node.append(&first, &[msg("t", "1")]).await.unwrap();
    node.release(&first).await.unwrap();
    let (second, _) = acquire(node, 0, LONG_TTL).await;
    assert_eq!(first.holder, second.holder);

    assert_lost(node.append(&first, &[msg("t", "2")]).await, &first);
    let impostor = Lease {
        holder: "node-9".to_owned(),
        ..second.clone()
    };
    assert_lost(node.append(&impostor, &[msg("t", "2")]).await, &impostor);
    assert_eq!(node.read(&channel("t"), 0, 10).await.unwrap().head, 1);

    let out = node.append(&second, &[msg("t", "2")]).await.unwrap();
    assert_eq!(offsets(&out), [2]);
}

/// A fenced write after the lease expired is `LeaseLost` and commits
/// nothing, although nobody else took the lease.
pub async fn append_after_expiry_is_lost(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, SHORT_TTL).await;
    node.append(&lease, &[msg("e", "1")]).await.unwrap();
    wait_expired(node, &lease.name).await;

    assert_lost(node.append(&lease, &[msg("e", "2")]).await, &lease);
    let page = node.read(&channel("e"), 0, 10).await.unwrap();
    assert_eq!(page.head, 1);
    assert_eq!(page.messages.len(), 1);
}

/// `read` pages with `after` and `limit` and always reports the head.
pub async fn read_pages_with_after_and_limit(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let batch: Vec<_> = (1..=10)
        .map(|i| msg("p", &format!("{{\"n\":{i}}}")))
        .collect();
    c.node(0).append(&lease, &batch).await.unwrap();

    // Read through the other node: reads see committed writes of any node.
    let node = c.node(1);
    let ch = channel("p");
    let offsets_of =
        |page: &crate::traits::Page| page.messages.iter().map(|m| m.offset).collect::<Vec<_>>();

    let page = node.read(&ch, 0, 3).await.unwrap();
    assert_eq!(page.head, 10);
    assert_eq!(offsets_of(&page), [1, 2, 3]);
    assert_eq!(page.messages[0].data.to_json_text(), "{\"n\":1}");

    let page = node.read(&ch, 3, 3).await.unwrap();
    assert_eq!(offsets_of(&page), [4, 5, 6]);
    assert_eq!(page.messages[2].data.to_json_text(), "{\"n\":6}");

    let page = node.read(&ch, 8, 100).await.unwrap();
    assert_eq!(offsets_of(&page), [9, 10]);
    assert_eq!(page.head, 10);

    let page = node.read(&ch, 10, 100).await.unwrap();
    assert!(page.messages.is_empty());
    assert_eq!(page.head, 10);

    let page = node.read(&ch, u64::MAX, 100).await.unwrap();
    assert!(page.messages.is_empty());

    let page = node.read(&ch, 0, 0).await.unwrap();
    assert!(page.messages.is_empty());
    assert_eq!(page.head, 10);
}

/// An unknown channel has head 0 and no messages.
pub async fn unknown_channel_reads_empty(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let page = c
        .node(0)
        .read(&channel("nobody-here"), 0, 100)
        .await
        .unwrap();
    assert_eq!(page.head, 0);
    assert!(page.messages.is_empty());
    assert!(c.node(0).channels().await.unwrap().is_empty());
}

/// `channels()` lists every channel with its head, ordered by name in byte
/// order (the order of [`ChannelName`](herald_core::ChannelName)'s `Ord`: digits, then upper case,
/// then lower case).
pub async fn channels_are_sorted_with_heads(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let counts = [
        ("zeta", 1),
        ("alpha", 3),
        ("Beta", 2),
        ("9lives", 1),
        ("alpha.2", 2),
        ("alpha-2", 1),
    ];
    let batch: Vec<_> = counts
        .iter()
        .flat_map(|&(ch, n)| (0..n).map(move |i| msg(ch, &i.to_string())))
        .collect();
    c.node(0).append(&lease, &batch).await.unwrap();

    let got = c.node(0).channels().await.unwrap();
    let mut want: Vec<_> = counts
        .iter()
        .map(|&(ch, n)| ChannelHead {
            name: channel(ch),
            head: n,
        })
        .collect();
    want.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(got, want);
}

/// `changes_since` and `change_cursor` report exactly the channels whose head
/// moved after a cursor, with their current head; a duplicate-only or
/// refused write moves nothing.
pub async fn changes_since_reports_exactly_the_moved_channels(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let writer = c.node(0);
    let follower = c.node(1);
    let sorted = |mut v: Vec<ChannelHead>| {
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    let head = |ch: &str, head: u64| ChannelHead {
        name: channel(ch),
        head,
    };

    assert_eq!(follower.change_cursor().await.unwrap(), 0);
    let empty = follower.changes_since(0).await.unwrap();
    assert_eq!(empty.cursor, 0);
    assert!(empty.changed.is_empty());

    writer
        .append(
            &lease,
            &[msg("a", "1"), keyed("b", "1", "k"), msg("a", "2")],
        )
        .await
        .unwrap();
    let feed = follower.changes_since(0).await.unwrap();
    assert!(feed.cursor > 0);
    assert_eq!(sorted(feed.changed), [head("a", 2), head("b", 1)]);
    assert_eq!(follower.change_cursor().await.unwrap(), feed.cursor);
    let c1 = feed.cursor;

    let still = follower.changes_since(c1).await.unwrap();
    assert_eq!(still.cursor, c1);
    assert!(still.changed.is_empty());

    writer
        .append(&lease, &[msg("c", "1"), msg("b", "2")])
        .await
        .unwrap();
    let feed = follower.changes_since(c1).await.unwrap();
    assert!(feed.cursor > c1);
    assert_eq!(sorted(feed.changed), [head("b", 2), head("c", 1)]);
    let c2 = feed.cursor;
    assert_eq!(follower.change_cursor().await.unwrap(), c2);

    // Everything since the beginning, with current heads.
    let all = follower.changes_since(0).await.unwrap();
    assert_eq!(all.cursor, c2);
    assert_eq!(
        sorted(all.changed),
        [head("a", 2), head("b", 2), head("c", 1)]
    );

    // A duplicate-only write and a refused write move nothing.
    let dup = writer
        .append(&lease, &[keyed("b", "1", "k")])
        .await
        .unwrap();
    assert!(dup[0].duplicate);
    let stale = Lease {
        token: FencingToken(lease.token.0 + 7),
        ..lease.clone()
    };
    assert_lost(writer.append(&stale, &[msg("d", "1")]).await, &stale);
    let none = follower.changes_since(c2).await.unwrap();
    assert_eq!(none.cursor, c2);
    assert!(none.changed.is_empty());
    assert_eq!(follower.change_cursor().await.unwrap(), c2);
}

/// Message data comes back as the exact JSON text sent: key order,
/// whitespace inside, number spellings, escapes and non-ASCII text.
pub async fn json_data_round_trips_byte_exactly(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let big = format!("\"{}\"", "x".repeat(64 * 1024));
    let texts: Vec<String> = [
        r#"{"b":1,"a":[1.0e10,-0.0,1E-7,123456789012345678901234567890,2.50]}"#,
        "{ \"spaced\" :  [ 1 ,\t2 ] ,\n  \"nested\": {\"deeper\": {\"deepest\": [[], {}]}} }",
        r#""héllo wörld ✓ 😀 \"quoted\" \\ \u00e9 \n \ud83d\ude00""#,
        r#"[true,false,null,0,-1,3.14159,2.5E+300]"#,
        "42",
        "null",
        "\"\"",
        r#"{"z":null,"a":"ordered as sent","m":{"é":"ü"}}"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([big])
    .collect();
    let batch: Vec<_> = texts.iter().map(|t| msg("json", t)).collect();
    c.node(0).append(&lease, &batch).await.unwrap();

    let page = c.node(0).read(&channel("json"), 0, 100).await.unwrap();
    let got: Vec<_> = page
        .messages
        .iter()
        .map(|m| m.data.to_json_text().into_owned())
        .collect();
    assert_eq!(got, texts);
}

/// Tags are stored with their message and read back with it, by any node,
/// as the same map (keys and values byte for byte); a message without tags
/// reads back without. An idempotency key repeated with the same data and
/// tags is a duplicate; with other tags, or none, it is a reuse of the key
/// for another message.
pub async fn tags_are_stored_with_their_message(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    let spaced = [("kind", "a b"), ("ü", "\"quoted\" ✓"), ("", "")];
    let keyed_tagged = |data: &str, tags: &[(&str, &str)]| NewMessage {
        idempotency_key: Some(herald_core::IdempotencyKey::new("key").unwrap()),
        ..tagged("t", data, tags)
    };
    // Tagged and untagged messages in one batch, on two channels.
    let out = c
        .node(0)
        .append(
            &lease,
            &[
                msg("t", "1"),
                tagged("t", "2", &spaced),
                keyed_tagged("3", &[("k", "v")]),
                tagged("u", "4", &[("only", "u")]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(offsets(&out), [1, 2, 3, 1]);

    let page = c.node(1).read(&channel("t"), 0, 10).await.unwrap();
    let tags: Vec<Vec<(&str, &str)>> = page
        .messages
        .iter()
        .map(|m| m.tags.iter().collect())
        .collect();
    let mut sorted = spaced.to_vec();
    sorted.sort_unstable();
    assert_eq!(tags, [vec![], sorted, vec![("k", "v")]]);
    assert!(page.messages[0].tags.is_empty());
    let u = c.node(1).read(&channel("u"), 0, 10).await.unwrap();
    assert_eq!(u.messages[0].tags.get("only"), Some("u"));

    // The same data and tags again: a duplicate of offset 3.
    let again = c
        .node(0)
        .append(&lease, &[keyed_tagged("3", &[("k", "v")])])
        .await
        .unwrap();
    assert_eq!((again[0].offset, again[0].duplicate), (3, true));
    // Other tags, or none, with the same key and data: refused.
    for other in [keyed_tagged("3", &[("k", "w")]), keyed("t", "3", "key")] {
        match c.node(0).append(&lease, &[other]).await {
            Err(Error::IdempotencyKeyReused { index: 0 }) => {}
            got => panic!("expected IdempotencyKeyReused, got {got:?}"),
        }
    }
    assert_eq!(c.node(1).read(&channel("t"), 0, 10).await.unwrap().head, 3);
}

/// Appends from many tasks at once with the same lease: every offset of a
/// channel is used exactly once, 1..n with no gap, each batch's messages get
/// consecutive offsets, and every message is stored exactly once.
pub async fn concurrent_appends_never_duplicate_or_skip(h: &dyn Harness) {
    const TASKS: usize = 8;
    const BATCHES: usize = 15;
    let c = h.cluster(1).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let node = Arc::clone(c.node(0));
        let lease = lease.clone();
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for b in 0..BATCHES {
                let size = 1 + (t + b) % 3;
                let mut batch: Vec<_> = (0..size)
                    .map(|i| msg("busy", &format!("{{\"t\":{t},\"b\":{b},\"i\":{i}}}")))
                    .collect();
                if b % 2 == 0 {
                    batch.push(msg("side", &format!("{{\"t\":{t},\"b\":{b}}}")));
                }
                let out = node.append(&lease, &batch).await.expect("append");
                assert_eq!(out.len(), batch.len());
                results.push(out);
            }
            results
        }));
    }

    let mut per_channel: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for task in tasks {
        for out in task.await.expect("task") {
            let busy: Vec<_> = out
                .iter()
                .filter(|a| a.channel.as_str() == "busy")
                .map(|a| a.offset)
                .collect();
            assert!(
                busy.windows(2).all(|w| w[1] == w[0] + 1),
                "a batch's offsets are not consecutive: {busy:?}"
            );
            for a in out {
                assert!(!a.duplicate);
                per_channel
                    .entry(a.channel.as_str().to_owned())
                    .or_default()
                    .push(a.offset);
            }
        }
    }
    for (ch, mut offs) in per_channel {
        offs.sort_unstable();
        let n = offs.len() as u64;
        assert_eq!(offs, (1..=n).collect::<Vec<_>>(), "channel {ch}");
        let page = c.node(0).read(&channel(&ch), 0, 10_000).await.unwrap();
        assert_eq!(page.head, n);
        let stored: BTreeSet<_> = page
            .messages
            .iter()
            .map(|m| m.data.to_json_text().into_owned())
            .collect();
        assert_eq!(
            stored.len() as u64,
            n,
            "channel {ch}: a message was stored twice"
        );
    }
}

/// `ping` answers and `backend` names the backend.
pub async fn ping_answers(h: &dyn Harness) {
    let c = h.cluster(1).await;
    c.node(0).ping().await.unwrap();
    assert!(!c.node(0).backend().is_empty());
}

/// A channel's epoch is there on first ask (before any message), is the
/// same on every node, stays the same after messages and a takeover,
/// differs between channels, and adds no channel to `channels()`.
pub async fn channel_epoch_is_stable_and_shared(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let news = channel("news");
    let first = c.node(1).channel_epoch(&news).await.unwrap();
    assert_eq!(first.len(), 16, "epoch {first:?}");
    assert!(
        first.bytes().all(|b| b.is_ascii_hexdigit()),
        "epoch {first:?}"
    );
    assert!(
        c.node(0).channels().await.unwrap().is_empty(),
        "an epoch is not a message"
    );
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    c.node(0).append(&lease, &[msg("news", "1")]).await.unwrap();
    assert_eq!(c.node(0).channel_epoch(&news).await.unwrap(), first);
    c.node(0).release(&lease).await.unwrap();
    let (lease, _) = acquire(c.node(1), 1, LONG_TTL).await;
    c.node(1).append(&lease, &[msg("news", "2")]).await.unwrap();
    assert_eq!(c.node(1).channel_epoch(&news).await.unwrap(), first);
    assert_eq!(c.node(0).channel_epoch(&news).await.unwrap(), first);
    let other = c.node(0).channel_epoch(&channel("sport")).await.unwrap();
    assert_ne!(other, first);
    // Both nodes asking for a new channel's epoch at once get one answer.
    let fresh = channel("fresh");
    let (a, b) = tokio::join!(
        c.node(0).channel_epoch(&fresh),
        c.node(1).channel_epoch(&fresh)
    );
    assert_eq!(a.unwrap(), b.unwrap());
}

/// Reading writes nothing: asking for the epoch of channel names never
/// published to (from every node, holder or standby), reading their
/// history, their heads, the channel list and the change feed leaves
/// every table of the database with the rows it had. So a client that
/// may subscribe or read cannot make the database grow by naming new
/// channels.
pub async fn reads_create_no_rows(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    c.node(0).append(&lease, &[msg("kept", "1")]).await.unwrap();
    let before = h.row_counts(&c).await;
    assert!(before.values().any(|&rows| rows > 0), "{before:?}");
    for i in 0..200 {
        let name = channel(&format!("never:{i}"));
        let node = c.node(i % 2);
        let epoch = node.channel_epoch(&name).await.unwrap();
        assert_eq!(epoch.len(), 16, "epoch {epoch:?}");
        let page = node.read(&name, 0, 10).await.unwrap();
        assert_eq!(page.head, 0);
        node.read(&name, u64::MAX, 1).await.unwrap();
    }
    c.node(1).channel_epoch(&channel("kept")).await.unwrap();
    c.node(1).channels().await.unwrap();
    c.node(1).changes_since(0).await.unwrap();
    assert_eq!(h.row_counts(&c).await, before, "a read wrote rows");
}

/// The epoch a channel shows before its first message is the one it keeps
/// after it, on every node, without a row written for it by the reads;
/// a new database shows the same channel another epoch.
pub async fn channel_epoch_is_stable_across_the_first_publish(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let name = channel("first");
    let before = c.node(1).channel_epoch(&name).await.unwrap();
    assert_eq!(c.node(0).channel_epoch(&name).await.unwrap(), before);
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    c.node(0)
        .append(&lease, &[msg("first", "1")])
        .await
        .unwrap();
    for i in 0..2 {
        assert_eq!(c.node(i).channel_epoch(&name).await.unwrap(), before);
    }
    // After a takeover and more messages, still the same.
    c.node(0).release(&lease).await.unwrap();
    let (lease, _) = acquire(c.node(1), 1, LONG_TTL).await;
    c.node(1)
        .append(&lease, &[msg("first", "2")])
        .await
        .unwrap();
    assert_eq!(c.node(0).channel_epoch(&name).await.unwrap(), before);
    // Another database: another history, another epoch.
    let other = h.cluster(1).await;
    assert_ne!(other.node(0).channel_epoch(&name).await.unwrap(), before);
}

/// Presence entries are seen by every node, replaced per (channel,
/// client), removed on request, kept alive by their session's
/// `presence_touch`, and gone once their ttl passes without one.
pub async fn presence_is_shared_renewed_and_expires(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let room = channel("room");
    let entry = |client: &str, user: &str| PresenceEntry {
        channel: room.clone(),
        client: client.to_owned(),
        user: user.to_owned(),
    };
    c.node(0)
        .presence_add("s0", &entry("c1", "ann"), LONG_TTL)
        .await
        .unwrap();
    c.node(1)
        .presence_add("s1", &entry("c2", "bob"), LONG_TTL)
        .await
        .unwrap();
    c.node(1)
        .presence_add("s1", &entry("c2", "bob"), LONG_TTL)
        .await
        .unwrap();
    assert_eq!(
        c.node(0).presence(&room).await.unwrap(),
        vec![entry("c1", "ann"), entry("c2", "bob")]
    );
    assert!(c
        .node(0)
        .presence(&channel("other"))
        .await
        .unwrap()
        .is_empty());
    c.node(0).presence_remove(&room, "c1").await.unwrap();
    assert_eq!(
        c.node(1).presence(&room).await.unwrap(),
        vec![entry("c2", "bob")]
    );

    // Session s1's entries live only while it renews them.
    c.node(1).presence_touch("s1", SHORT_TTL).await.unwrap();
    let deadline = Instant::now() + EXPIRY_WAIT;
    while !c.node(0).presence(&room).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the entry did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewed before expiry, an entry stays.
    c.node(0)
        .presence_add("s0", &entry("c3", "cid"), SHORT_TTL)
        .await
        .unwrap();
    c.node(0).presence_touch("s0", LONG_TTL).await.unwrap();
    assert_eq!(
        c.node(1).presence(&room).await.unwrap(),
        vec![entry("c3", "cid")]
    );
}

/// Join and leave events that one node sends reach every other node's
/// receivers in the order sent, each once (a join repeated after a leave
/// too), and never the sender's own receivers; an event too long for the
/// backend's transport arrives without its infos (or with them, where
/// nothing limits it) and holds back none of the others. A backend with
/// no way between processes has no receivers and sends nothing.
pub async fn presence_events_reach_the_other_nodes_in_order(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let event = |kind, client: &str, conn_info: Option<String>| PresenceEvent {
        kind,
        channel: channel("chat:room"),
        info: ClientInfo {
            user: "ann".to_owned(),
            client: client.to_owned(),
            conn_info,
            chan_info: Some("{\"seat\":3}".to_owned()),
        },
    };
    let (join, leave) = (PresenceEventKind::Join, PresenceEventKind::Leave);
    let Some(mut theirs) = c.node(1).watch_presence_events() else {
        assert!(c.node(0).watch_presence_events().is_none());
        c.node(0)
            .send_presence_events(&[event(join, "c1", None)])
            .await
            .unwrap();
        return;
    };
    let mut own = c.node(0).watch_presence_events().expect("both nodes watch");
    let info = Some("{\"name\":\"Ann\"}".to_owned());
    let big = Some(format!("\"{}\"", "x".repeat(10_000)));
    let sent = [
        event(join, "c1", info.clone()),
        event(leave, "c1", info.clone()),
        event(join, "c1", info),
        event(join, "c2", big),
        event(leave, "c2", None),
    ];
    c.node(0).send_presence_events(&sent[..3]).await.unwrap();
    c.node(0).send_presence_events(&sent[3..]).await.unwrap();
    let answer = event(join, "c9", None);
    c.node(1)
        .send_presence_events(std::slice::from_ref(&answer))
        .await
        .unwrap();
    for (i, expected) in sent.iter().enumerate() {
        let got = next(&mut theirs).await;
        if i == 3 && got.info.conn_info.is_none() {
            let mut trimmed = expected.clone();
            trimmed.info.conn_info = None;
            trimmed.info.chan_info = None;
            assert_eq!(got, trimmed, "event {i}");
        } else {
            assert_eq!(&got, expected, "event {i}");
        }
    }
    // Node 0 hears node 1's event, sent after its own five, first.
    assert_eq!(next(&mut own).await, answer);
}

/// The next event of `rx`, within [`EXPIRY_WAIT`].
async fn next(rx: &mut tokio::sync::broadcast::Receiver<PresenceEvent>) -> PresenceEvent {
    tokio::time::timeout(EXPIRY_WAIT, rx.recv())
        .await
        .expect("an event within the wait")
        .expect("a receiver that did not lag")
}

/// Node reports (Centrifugo's `info`): each node's report is read by every
/// node, replaced by the node's next report, and expires unless reported
/// again.
pub async fn node_reports_are_shared_replaced_and_expire(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let report = |node_id: &str, clients: u64| NodeReport {
        node_id: node_id.to_owned(),
        version: "1.2.3".to_owned(),
        uptime_s: 7,
        clients,
        users: 1,
        subs: 2,
        channels: 3,
        url: format!("http://{node_id}.example:4000"),
        subscriptions: clients * 2,
        reported_ms_ago: 0,
        reported_at_ms: 0,
    };
    assert!(c.node(1).node_reports().await.unwrap().is_empty());
    c.node(0)
        .report_node(&report("node-b", 4), &[], LONG_TTL)
        .await
        .unwrap();
    c.node(1)
        .report_node(&report("node-a", 1), &[], LONG_TTL)
        .await
        .unwrap();
    c.node(0)
        .report_node(&report("node-b", 5), &[], LONG_TTL)
        .await
        .unwrap();
    assert_eq!(
        written_now(c.node(1).node_reports().await.unwrap()),
        vec![report("node-a", 1), report("node-b", 5)]
    );

    // A report lives only while it is renewed.
    c.node(0)
        .report_node(&report("node-b", 5), &[], SHORT_TTL)
        .await
        .unwrap();
    let deadline = Instant::now() + EXPIRY_WAIT;
    while c.node(1).node_reports().await.unwrap().len() > 1 {
        assert!(Instant::now() < deadline, "the report did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        written_now(c.node(0).node_reports().await.unwrap()),
        vec![report("node-a", 1)]
    );
}

/// `reports` with their age checked (a report read back within the test
/// was written less than a minute before, at a time on the storage's
/// clock) and set to 0, as written.
fn written_now(reports: Vec<NodeReport>) -> Vec<NodeReport> {
    reports
        .into_iter()
        .map(|mut r| {
            assert!(
                r.reported_ms_ago < 60_000,
                "report of {} aged {} ms",
                r.node_id,
                r.reported_ms_ago
            );
            assert!(r.reported_at_ms > 0, "{r:?}");
            r.reported_ms_ago = 0;
            r.reported_at_ms = 0;
            r
        })
        .collect()
}

/// The channels of node reports (Centrifugo's `channels`): every node
/// reads the channels of every other node's report, summed per channel;
/// a node's next report replaces its channels, and they expire with its
/// report.
pub async fn node_channels_are_summed_replaced_and_expire(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let report = |node_id: &str| NodeReport {
        node_id: node_id.to_owned(),
        version: "1.2.3".to_owned(),
        uptime_s: 7,
        clients: 1,
        users: 1,
        subs: 2,
        channels: 2,
        url: String::new(),
        subscriptions: 2,
        reported_ms_ago: 0,
        reported_at_ms: 0,
    };
    let counts = |pairs: &[(&str, u64)]| -> Vec<ChannelClients> {
        pairs
            .iter()
            .map(|&(name, clients)| ChannelClients {
                channel: channel(name),
                clients,
                // Every Centrifugo connection, and as many other
                // subscriptions again.
                subscribers: clients * 2,
            })
            .collect()
    };
    assert!(c
        .node(0)
        .cluster_channels("node-a")
        .await
        .unwrap()
        .is_empty());
    c.node(0)
        .report_node(
            &report("node-a"),
            &counts(&[("room:x", 2), ("room:y", 1)]),
            LONG_TTL,
        )
        .await
        .unwrap();
    c.node(1)
        .report_node(
            &report("node-b"),
            &counts(&[("room:x", 3), ("room:z", 4)]),
            LONG_TTL,
        )
        .await
        .unwrap();
    // Summed over every node but the one named.
    assert_eq!(
        c.node(1).cluster_channels("node-c").await.unwrap(),
        counts(&[("room:x", 5), ("room:y", 1), ("room:z", 4)])
    );
    assert_eq!(
        c.node(1).cluster_channels("node-a").await.unwrap(),
        counts(&[("room:x", 3), ("room:z", 4)])
    );
    assert_eq!(
        c.node(0).cluster_channels("node-b").await.unwrap(),
        counts(&[("room:x", 2), ("room:y", 1)])
    );

    // The next report replaces the node's channels: one gone, one changed.
    c.node(0)
        .report_node(&report("node-a"), &counts(&[("room:y", 6)]), LONG_TTL)
        .await
        .unwrap();
    assert_eq!(
        c.node(1).cluster_channels("node-c").await.unwrap(),
        counts(&[("room:x", 3), ("room:y", 6), ("room:z", 4)])
    );

    // A node's channels live only while its report is renewed.
    c.node(1)
        .report_node(
            &report("node-b"),
            &counts(&[("room:x", 3), ("room:z", 4)]),
            SHORT_TTL,
        )
        .await
        .unwrap();
    let deadline = Instant::now() + EXPIRY_WAIT;
    while c.node(0).node_reports().await.unwrap().len() > 1 {
        assert!(Instant::now() < deadline, "the report did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        c.node(0).cluster_channels("node-c").await.unwrap(),
        counts(&[("room:y", 6)])
    );
    // A report with no channels leaves the node none; a node whose report
    // expired starts again from its next report's channels.
    c.node(0)
        .report_node(&report("node-a"), &[], LONG_TTL)
        .await
        .unwrap();
    c.node(1)
        .report_node(&report("node-b"), &counts(&[("room:z", 1)]), LONG_TTL)
        .await
        .unwrap();
    assert_eq!(
        c.node(0).cluster_channels("node-c").await.unwrap(),
        counts(&[("room:z", 1)])
    );
}
