//! Recovery on subscribe, and the rule that it never lies: the client's
//! missed publications are returned with `recovered: true` only when the
//! storage holds every one of them, in the client's epoch; otherwise
//! `recovered: false` and the client's documented path (the SDK reports
//! it, the app reloads its state) follows. Herald's history is durable, so
//! recovery succeeds for any offset the channel still holds, however old.
//!
//! A subscriber that may not read the channel's history (its namespace has
//! `history = false`; [`herald_auth::Auth::live_only_window`]) recovers
//! only what it could have seen live: the missed publications are handed
//! over only when the oldest of them was published less than the history
//! resume window ago, else the answer is `recovered: false` at the head
//! (the same rule as SSE and WebSocket, `subscription.rs`).

use herald_core::{ChannelName, Message, Offset};
use herald_storage::{Page, Storage};

use super::history::{cost, Budget};
use herald_http::error::Result;
use herald_node::node_error::StorageContext;
use herald_node::subscription::LiveOnly;

/// Most publications a subscribe reply recovers; a client further behind
/// gets `recovered: false` (and reads the history itself if it wants).
pub(crate) const MAX_RECOVERED: usize = 10_000;

/// The outcome of a recovery attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Recovery {
    /// Every publication after the client's offset, in order; live
    /// publications continue after `position`.
    Recovered {
        /// The missed publications (possibly none).
        publications: Vec<Message>,
        /// The offset of the last of them, or the client's offset.
        position: Offset,
    },
    /// Not recoverable; live publications continue after `position`, the
    /// channel's head.
    NotRecovered {
        /// The channel's head when read.
        position: Offset,
    },
}

/// Decides a recovery from `page`, the storage's answer to a read after
/// `offset` with a limit of [`MAX_RECOVERED`] + 1:
/// - the client's `epoch` is not the channel's → not recovered, except
///   an empty epoch with offset 0 (a client that saw nothing, whatever
///   the history: centrifuge-js's `getState` and `since` start so), which
///   recovers the whole channel;
/// - `offset` is beyond the head (the client saw offsets this history
///   never had) → not recovered;
/// - the first message held is not `offset + 1` (removed by retention) →
///   not recovered;
/// - more than [`MAX_RECOVERED`] missed → not recovered;
/// - with `live_only` (a subscriber that may not read history), the
///   oldest missed message is outside its window → not recovered;
/// - else recovered, with every message after `offset`.
pub(crate) fn decide(
    channel_epoch: &str,
    epoch: &str,
    offset: Offset,
    page: Page,
    live_only: Option<&LiveOnly>,
) -> Recovery {
    let not_recovered = Recovery::NotRecovered {
        position: page.head,
    };
    let from_nothing = epoch.is_empty() && offset == 0;
    let same_history = epoch == channel_epoch || from_nothing;
    if !same_history || offset > page.head || page.messages.len() > MAX_RECOVERED {
        return not_recovered;
    }
    if let (Some(live), Some(oldest)) = (live_only, page.messages.first()) {
        if !live.admits(oldest.published_at_ms) {
            return not_recovered;
        }
    }
    match page.messages.first() {
        None if page.head == offset => Recovery::Recovered {
            publications: Vec::new(),
            position: offset,
        },
        Some(first) if first.offset == offset + 1 => {
            let position = page.messages.last().map_or(offset, |m| m.offset);
            Recovery::Recovered {
                publications: page.messages,
                position,
            }
        }
        _ => not_recovered,
    }
}

/// Reads what [`decide`] needs, in pages of `budget.page` messages, and
/// decides; `live_only` is the history resume window of a subscriber that
/// may not read the channel's history (`None` when it may). Missed
/// publications of more than `budget.bytes` (see
/// [`super::history::cost`]) are not recovered either: the reading stops
/// there, so that a recovery never holds more than the budget and a page.
///
/// # Errors
/// [`herald_http::error::Error::Storage`] when a read fails.
pub(crate) async fn recover(
    storage: &dyn Storage,
    channel: &ChannelName,
    channel_epoch: &str,
    epoch: &str,
    offset: Offset,
    live_only: Option<std::time::Duration>,
    budget: Budget,
) -> Result<Recovery> {
    let read = |after: Offset| async move {
        storage
            .read(channel, after, budget.page.min(MAX_RECOVERED + 1))
            .await
            .during("read", Some(channel))
    };
    let mut page = read(offset).await?;
    let mut bytes: usize = page.messages.iter().map(cost).sum();
    let mut last = page.messages.len();
    while last == budget.page && page.messages.len() <= MAX_RECOVERED {
        if bytes > budget.bytes {
            return Ok(Recovery::NotRecovered {
                position: page.head,
            });
        }
        let after = page.messages.last().map_or(offset, |m| m.offset);
        let next = read(after).await?;
        if next.messages.first().is_some_and(|m| m.offset != after + 1) {
            // Trimmed between the reads.
            return Ok(Recovery::NotRecovered {
                position: next.head,
            });
        }
        bytes += next.messages.iter().map(cost).sum::<usize>();
        last = next.messages.len();
        page.head = next.head;
        page.deletion = next.deletion;
        page.messages.extend(next.messages);
    }
    if bytes > budget.bytes {
        return Ok(Recovery::NotRecovered {
            position: page.head,
        });
    }
    let live_only = live_only.map(|window| LiveOnly {
        resume: Some(offset),
        window,
        now_ms: herald_node::subscription::wall_clock_ms,
    });
    Ok(decide(
        channel_epoch,
        epoch,
        offset,
        page,
        live_only.as_ref(),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::value::RawValue;

    use super::*;

    fn page(head: Offset, offsets: &[Offset]) -> Page {
        Page {
            head,
            earliest: offsets.first().copied().unwrap_or(head + 1),
            messages: offsets
                .iter()
                .map(|&offset| Message {
                    offset,
                    data: herald_core::Payload::Json(Arc::from(
                        RawValue::from_string("1".to_owned()).unwrap(),
                    )),
                    published_at_ms: 0,
                    tags: herald_core::Tags::default(),
                })
                .collect(),
            deletion: 0,
        }
    }

    fn offsets(r: &Recovery) -> Option<(Vec<Offset>, Offset)> {
        match r {
            Recovery::Recovered {
                publications,
                position,
            } => Some((publications.iter().map(|m| m.offset).collect(), *position)),
            Recovery::NotRecovered { .. } => None,
        }
    }

    #[test]
    fn recovers_every_missed_publication_in_the_same_epoch() {
        let r = decide("e1", "e1", 2, page(5, &[3, 4, 5]), None);
        assert_eq!(offsets(&r), Some((vec![3, 4, 5], 5)));
    }

    #[test]
    fn nothing_missed_is_recovered_with_no_publications() {
        let r = decide("e1", "e1", 5, page(5, &[]), None);
        assert_eq!(offsets(&r), Some((vec![], 5)));
    }

    #[test]
    fn another_epoch_is_not_recovered() {
        let r = decide("e1", "e0", 2, page(5, &[3, 4, 5]), None);
        assert_eq!(r, Recovery::NotRecovered { position: 5 });
    }

    #[test]
    fn an_empty_epoch_recovers_only_from_nothing() {
        let r = decide("e1", "", 0, page(3, &[1, 2, 3]), None);
        assert_eq!(offsets(&r), Some((vec![1, 2, 3], 3)), "offset 0: all of it");
        let r = decide("e1", "", 2, page(3, &[3]), None);
        assert_eq!(
            r,
            Recovery::NotRecovered { position: 3 },
            "an offset of another history"
        );
        let r = decide("e1", "", 0, page(5, &[3, 4, 5]), None);
        assert_eq!(r, Recovery::NotRecovered { position: 5 }, "1 and 2 removed");
    }

    #[test]
    fn an_offset_beyond_the_head_is_not_recovered() {
        let r = decide("e1", "e1", 9, page(5, &[]), None);
        assert_eq!(r, Recovery::NotRecovered { position: 5 });
    }

    #[test]
    fn a_gap_before_the_first_held_publication_is_not_recovered() {
        // Offsets 3 and 4 were removed (retention): 5 does not follow 2.
        let r = decide("e1", "e1", 2, page(6, &[5, 6]), None);
        assert_eq!(r, Recovery::NotRecovered { position: 6 });
        let r = decide("e1", "e1", 2, page(6, &[]), None);
        assert_eq!(r, Recovery::NotRecovered { position: 6 });
    }

    #[test]
    fn too_many_missed_is_not_recovered() {
        let all: Vec<Offset> = (1..=(MAX_RECOVERED as Offset + 1)).collect();
        let head = *all.last().unwrap();
        let r = decide("e1", "e1", 0, page(head, &all), None);
        assert_eq!(r, Recovery::NotRecovered { position: head });
    }

    /// A subscriber that may not read history recovers only when the
    /// oldest missed publication is inside its window (the page's are
    /// stamped 0 ms; the clock reads 30 s).
    #[test]
    fn a_live_only_subscriber_recovers_only_inside_its_window() {
        let live = |window_ms| LiveOnly {
            resume: Some(2),
            window: std::time::Duration::from_millis(window_ms),
            now_ms: || 30_000,
        };
        let r = decide("e1", "e1", 2, page(5, &[3, 4, 5]), Some(&live(30_000)));
        assert_eq!(r, Recovery::NotRecovered { position: 5 });
        let r = decide("e1", "e1", 2, page(5, &[3, 4, 5]), Some(&live(30_001)));
        assert_eq!(offsets(&r), Some((vec![3, 4, 5], 5)));
        // Nothing missed hands nothing over: recovered.
        let r = decide("e1", "e1", 5, page(5, &[]), Some(&live(0)));
        assert_eq!(offsets(&r), Some((vec![], 5)));
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;
    use herald_node::testing::MemoryStorage;

    #[tokio::test]
    async fn a_recovery_holds_at_most_its_budget() {
        let storage = MemoryStorage::new();
        let data = format!("\"{}\"", "x".repeat(998));
        for _ in 0..50 {
            storage.append_as_other_node("news:b", &data);
        }
        let channel = ChannelName::new("news:b").unwrap();
        // 1066 bytes a message: 9 fit in 10 000, read 10 at a time.
        let budget = Budget::new(10_000, 1_000);
        let recover_from = |offset| {
            let storage = storage.clone();
            let channel = channel.clone();
            async move {
                recover(&*storage, &channel, "e", "e", offset, None, budget)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(
            recover_from(0).await,
            Recovery::NotRecovered { position: 50 }
        );
        assert_eq!(
            recover_from(40).await,
            Recovery::NotRecovered { position: 50 }
        );
        match recover_from(41).await {
            Recovery::Recovered {
                publications,
                position,
            } => {
                let offsets: Vec<Offset> = publications.iter().map(|m| m.offset).collect();
                assert_eq!(offsets, (42..=50).collect::<Vec<_>>());
                assert_eq!(position, 50);
            }
            r => panic!("{r:?}"),
        }
        // Several pages within the budget.
        let wide = Budget::new(1 << 20, 100_000);
        match recover(&*storage, &channel, "e", "e", 5, None, wide)
            .await
            .unwrap()
        {
            Recovery::Recovered { publications, .. } => {
                let offsets: Vec<Offset> = publications.iter().map(|m| m.offset).collect();
                assert_eq!(offsets, (6..=50).collect::<Vec<_>>());
            }
            r => panic!("{r:?}"),
        }
    }
}
