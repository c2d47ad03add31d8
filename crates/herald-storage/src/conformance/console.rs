//! Conformance cases of what the web console reads: the lease's takeover
//! timeline (`Storage::lease_history`) and pages of channels
//! (`Storage::channel_page`).

use std::time::{Duration, Instant};

use herald_core::{FencingToken, DEFAULT_LEASE_NAME};

use super::harness::{acquire, channel, wait_expired, EXPIRY_WAIT, LONG_TTL, SHORT_TTL};
use super::Harness;
use crate::testing::msg;
use crate::traits::{ChannelClients, NodeReport, TakeoverReason};

/// Every acquisition is added to the lease's timeline in its own
/// transaction, with the node that acquired, the node the row named
/// before (after a release: the node that released) and the reason; every storage reads the same timeline, newest
/// first, in token order, and a limit keeps the newest.
pub async fn lease_history_is_the_takeover_timeline(h: &dyn Harness) {
    let c = h.cluster(2).await;
    assert!(c
        .node(1)
        .lease_history(DEFAULT_LEASE_NAME, 10)
        .await
        .unwrap()
        .is_empty());
    let (first, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    wait_expired(c.node(1), &first.name).await;
    let (second, _) = acquire(c.node(1), 1, LONG_TTL).await;
    c.node(1).release(&second).await.unwrap();
    let (third, _) = acquire(c.node(0), 0, LONG_TTL).await;

    let timeline = c
        .node(1)
        .lease_history(DEFAULT_LEASE_NAME, 10)
        .await
        .unwrap();
    let seen: Vec<(FencingToken, &str, Option<&str>, TakeoverReason)> = timeline
        .iter()
        .map(|t| {
            (
                t.token,
                t.holder.as_str(),
                t.previous_holder.as_deref(),
                t.reason,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                third.token,
                "node-0",
                Some("node-1"),
                TakeoverReason::Released
            ),
            (
                second.token,
                "node-1",
                Some("node-0"),
                TakeoverReason::Expired
            ),
            (first.token, "node-0", None, TakeoverReason::Fresh),
        ]
    );
    assert!(
        timeline.windows(2).all(|w| w[0].at_ms >= w[1].at_ms),
        "times follow the tokens: {timeline:?}"
    );
    assert_eq!(
        c.node(0)
            .lease_history(DEFAULT_LEASE_NAME, 10)
            .await
            .unwrap(),
        timeline,
        "every storage reads the same timeline"
    );
    let newest = c
        .node(0)
        .lease_history(DEFAULT_LEASE_NAME, 1)
        .await
        .unwrap();
    assert_eq!(newest, timeline[..1]);
    assert!(c
        .node(0)
        .lease_history("other", 10)
        .await
        .unwrap()
        .is_empty());
}

/// Pages of channels: by name in byte order, resumed after the last name
/// of the previous page, filtered by a substring, with each channel's
/// sizes, the publish time of its head message, and its subscribers
/// summed over the node reports.
pub async fn channel_pages_search_resume_and_count(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (lease, _) = acquire(c.node(0), 0, LONG_TTL).await;
    c.node(0)
        .append(
            &lease,
            &[
                msg("b:1", "1"),
                msg("a:2", "22"),
                msg("a:1", "1"),
                msg("b:2", "2"),
                msg("c:x", "3"),
                msg("a:2", "333"),
            ],
        )
        .await
        .unwrap();
    let report = |node_id: &str| NodeReport {
        node_id: node_id.to_owned(),
        version: "1.2.3".to_owned(),
        uptime_s: 1,
        clients: 0,
        users: 0,
        subs: 0,
        channels: 1,
        url: String::new(),
        subscriptions: 3,
        reported_ms_ago: 0,
        reported_at_ms: 0,
    };
    let subscribed = |n: u64| {
        vec![ChannelClients {
            channel: channel("a:2"),
            clients: 0,
            subscribers: n,
        }]
    };
    c.node(0)
        .report_node(&report("node-a"), &subscribed(3), LONG_TTL)
        .await
        .unwrap();
    c.node(1)
        .report_node(&report("node-b"), &subscribed(2), LONG_TTL)
        .await
        .unwrap();

    let names = |page: &[crate::traits::ChannelSummary]| -> Vec<String> {
        page.iter().map(|c| c.name.as_str().to_owned()).collect()
    };
    let first = c.node(1).channel_page("", None, 2).await.unwrap();
    assert_eq!(names(&first), ["a:1", "a:2"]);
    let second = c
        .node(1)
        .channel_page("", Some(&first[1].name), 2)
        .await
        .unwrap();
    assert_eq!(names(&second), ["b:1", "b:2"]);
    let last = c
        .node(1)
        .channel_page("", Some(&second[1].name), 2)
        .await
        .unwrap();
    assert_eq!(names(&last), ["c:x"]);
    let searched = c.node(1).channel_page(":2", None, 10).await.unwrap();
    assert_eq!(names(&searched), ["a:2", "b:2"]);
    assert!(c
        .node(1)
        .channel_page("nothing", None, 10)
        .await
        .unwrap()
        .is_empty());

    let a2 = &first[1];
    assert_eq!((a2.head, a2.earliest, a2.messages, a2.bytes), (2, 1, 2, 5));
    assert_eq!(a2.subscribers, 5, "summed over both nodes' reports");
    assert_eq!(first[0].subscribers, 0);
    assert_eq!(a2.content_type, None);
    let page = c.node(1).read(&channel("a:2"), 1, 1).await.unwrap();
    assert_eq!(
        a2.last_published_at_ms,
        Some(page.messages[0].published_at_ms),
        "the head message's publish time"
    );

    // An expired report no longer counts.
    c.node(1)
        .report_node(&report("node-b"), &subscribed(2), SHORT_TTL)
        .await
        .unwrap();
    let deadline = Instant::now() + EXPIRY_WAIT;
    loop {
        let page = c.node(0).channel_page(":2", None, 1).await.unwrap();
        if page[0].subscribers == 3 {
            break;
        }
        assert_eq!(page[0].subscribers, 5, "{page:?}");
        assert!(Instant::now() < deadline, "the report did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
