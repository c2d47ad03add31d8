use super::*;
use crate::history::{LeaseAcquisition, PublishResult, StoredMessage, StreamPosition};

// ---- building histories -------------------------------------------------

fn publish(client: &str, channel: &str, id: &str, t: (u64, u64), result: PublishResult) -> Event {
    Event::Publish {
        client: client.into(),
        node: "n1".into(),
        channel: channel.into(),
        id: id.into(),
        idempotency_key: Some(format!("key-{id}")),
        invoke_ms: t.0,
        complete_ms: t.1,
        result,
    }
}

fn acked(client: &str, channel: &str, id: &str, offset: u64, t: (u64, u64)) -> Event {
    publish(client, channel, id, t, PublishResult::Acked { offset })
}

fn failed(client: &str, channel: &str, id: &str, code: &str, t: (u64, u64)) -> Event {
    publish(
        client,
        channel,
        id,
        t,
        PublishResult::Failed { code: code.into() },
    )
}

fn unknown(client: &str, channel: &str, id: &str, t: (u64, u64)) -> Event {
    publish(
        client,
        channel,
        id,
        t,
        PublishResult::transport_error("timeout"),
    )
}

fn subscribe(subscriber: &str, channel: &str, after: u64) -> Event {
    Event::Subscribe {
        subscriber: subscriber.into(),
        node: "n2".into(),
        channel: channel.into(),
        after,
        at_ms: 0,
    }
}

fn delivery(subscriber: &str, channel: &str, offset: u64, id: &str) -> Event {
    Event::Delivery {
        subscriber: subscriber.into(),
        node: "n2".into(),
        channel: channel.into(),
        offset,
        id: id.into(),
        at_ms: 0,
    }
}

fn fault(kind: &str, start_ms: u64) -> Event {
    Event::Fault {
        kind: kind.into(),
        target: "n1".into(),
        start_ms,
        end_ms: start_ms + 100,
    }
}

/// A final state from `(channel, offset, id, token)` rows.
fn stored(rows: &[(&str, u64, &str, u64)]) -> FinalState {
    let mut state = FinalState::default();
    for &(channel, offset, id, token) in rows {
        state
            .channels
            .entry(channel.to_owned())
            .or_default()
            .push(StoredMessage {
                offset,
                id: id.to_owned(),
                token,
                published_at_ms: offset * 10,
            });
    }
    state
}

fn s(v: &str) -> String {
    v.to_owned()
}

// ---- a clean history -----------------------------------------------------

/// Every kind of outcome, none of them wrong.
fn clean() -> (Vec<Event>, FinalState) {
    let history = vec![
        subscribe("s1", "a", 0),
        acked("c1", "a", "m1", 1, (0, 10)),
        // refused, then acknowledged on retry
        failed("c2", "a", "m2", "not_holder", (5, 8)),
        acked("c2", "a", "m2", 2, (9, 20)),
        // unknown and stored, then acknowledged by its retry at that offset
        unknown("c1", "a", "m3", (21, 40)),
        acked("c1", "a", "m3", 3, (41, 50)),
        // unknown and stored, never acknowledged
        unknown("c2", "a", "m4", (30, 60)),
        // unknown and not stored
        unknown("c3", "a", "m5", (30, 60)),
        // refused, not stored
        failed("c3", "a", "m6", "invalid_body", (61, 62)),
        failed("c3", "a", "m7", "draining", (61, 62)),
        acked("c1", "b", "m8", 1, (70, 80)),
        delivery("s1", "a", 1, "m1"),
        delivery("s1", "a", 2, "m2"),
        // reconnect with the last offset received
        subscribe("s1", "a", 2),
        delivery("s1", "a", 3, "m3"),
        delivery("s1", "a", 4, "m4"),
        // a second subscriber resuming in the middle
        subscribe("s2", "a", 3),
        delivery("s2", "a", 4, "m4"),
        // a resume point earlier than what it saw is allowed
        subscribe("s2", "a", 1),
        delivery("s2", "a", 2, "m2"),
        subscribe("s3", "b", 0),
        delivery("s3", "b", 1, "m8"),
        fault("kill_holder", 15),
        Event::Takeover {
            node: s("n2"),
            token: 2,
            at_ms: 35,
        },
    ];
    let state = stored(&[
        ("a", 1, "m1", 1),
        ("a", 2, "m2", 1),
        ("a", 3, "m3", 2),
        ("a", 4, "m4", 2),
        ("b", 1, "m8", 2),
    ]);
    (history, state)
}

#[test]
fn a_clean_history_has_no_violations() {
    let (history, state) = clean();
    let report = check(&history, &state);
    assert_eq!(report.violations, vec![]);
    assert!(report.valid);
    let c = &report.counts;
    assert_eq!(
        (c.publishes, c.acked, c.failed, c.indeterminate, c.messages),
        (10, 4, 3, 3, 8)
    );
    assert_eq!((c.subscribes, c.deliveries), (5, 7));
    assert_eq!((c.faults, c.takeovers, c.channels, c.stored), (1, 1, 2, 5));
    assert_eq!(c.lease_acquisitions, None);
    assert_eq!(c.run_ms, 115);
}

/// Runs the checker on the clean history changed by `edit` and expects
/// exactly `expected`.
fn expect_only(edit: impl FnOnce(&mut Vec<Event>, &mut FinalState), expected: Violation) -> Report {
    let (mut history, mut state) = clean();
    edit(&mut history, &mut state);
    let report = check(&history, &state);
    assert_eq!(report.violations, vec![expected.clone()]);
    assert!(!report.valid);
    assert_eq!(
        report.violations_by_kind,
        BTreeMap::from([(expected.kind().to_owned(), 1)])
    );
    report
}

fn remove_stored(state: &mut FinalState, channel: &str, offset: u64) -> StoredMessage {
    let messages = state.channels.get_mut(channel).unwrap();
    let index = messages.iter().position(|m| m.offset == offset).unwrap();
    messages.remove(index)
}

/// Stores `m<offset>` at each of `offsets` in `channel` (token 1, published
/// at ten times the offset in ms), as a run's publisher would have.
fn store(state: &mut FinalState, channel: &str, offsets: impl IntoIterator<Item = u64>) {
    let messages = state.channels.get_mut(channel).unwrap();
    for offset in offsets {
        messages.push(StoredMessage {
            offset,
            id: format!("m{offset}"),
            token: 1,
            published_at_ms: offset * 10,
        });
    }
}

// ---- one test per violation ----------------------------------------------

#[test]
fn an_acknowledged_message_that_is_not_stored_is_reported() {
    // b's only message lost: its channel's offsets stay contiguous (empty).
    expect_only(
        |history, state| {
            history.retain(|e| !matches!(e, Event::Delivery { channel, .. } if channel == "b"));
            remove_stored(state, "b", 1);
        },
        Violation::AckedNotStored {
            channel: s("b"),
            id: s("m8"),
            clients: vec![s("c1")],
            acked_offset: 1,
            stored_id: None,
            id_stored_at: vec![],
        },
    );
}

#[test]
fn an_acknowledged_message_stored_elsewhere_is_reported_with_where() {
    // c1 got offset 2 for m9 on b, but b holds m9 at 1 and something else
    // (m8's slot, re-published as m10) at 2.
    expect_only(
        |history, state| {
            history.retain(|e| !matches!(e, Event::Delivery { channel, .. } if channel == "b"));
            history.retain(|e| !matches!(e, Event::Publish { id, .. } if id == "m8"));
            history.push(acked("c1", "b", "m9", 2, (90, 95)));
            history.push(unknown("c2", "b", "m10", (90, 95)));
            state.channels.insert(s("b"), vec![]);
            let b = state.channels.get_mut("b").unwrap();
            for (offset, id) in [(1, "m9"), (2, "m10")] {
                b.push(StoredMessage {
                    offset,
                    id: s(id),
                    token: 2,
                    published_at_ms: 90,
                });
            }
        },
        Violation::AckedNotStored {
            channel: s("b"),
            id: s("m9"),
            clients: vec![s("c1")],
            acked_offset: 2,
            stored_id: Some(s("m10")),
            id_stored_at: vec![1],
        },
    );
}

#[test]
fn a_gap_in_stored_offsets_is_reported() {
    expect_only(
        |history, state| {
            // m4 (never acknowledged) vanished from under offset 4 and b
            // jumped to offset 3; nothing was delivered from there.
            history.retain(|e| {
                !matches!(e, Event::Delivery { offset: 4, .. })
                    && !matches!(e, Event::Delivery { channel, .. } if channel == "b")
            });
            remove_stored(state, "a", 4);
            state.channels.get_mut("a").unwrap().push(StoredMessage {
                offset: 6,
                id: s("m4"),
                token: 2,
                published_at_ms: 60,
            });
        },
        Violation::OffsetsNotContiguous {
            channel: s("a"),
            head: 6,
            missing: vec![OffsetRange { first: 4, last: 5 }],
            extra: vec![],
        },
    );
}

#[test]
fn an_offset_stored_twice_is_reported_as_extra() {
    expect_only(
        |_, state| {
            let b = state.channels.get_mut("b").unwrap();
            let copy = b[0].clone();
            b.push(copy);
        },
        Violation::OffsetsNotContiguous {
            channel: s("b"),
            head: 1,
            missing: vec![],
            extra: vec![1],
        },
    );
}

#[test]
fn two_acknowledgements_of_one_offset_are_reported() {
    expect_only(
        |history, _| {
            history.push(acked("c4", "b", "m9", 1, (90, 95)));
        },
        Violation::ConflictingAcks {
            channel: s("b"),
            offset: 1,
            acks: vec![
                AckEvidence {
                    client: s("c1"),
                    id: s("m8"),
                },
                AckEvidence {
                    client: s("c4"),
                    id: s("m9"),
                },
            ],
            stored_id: Some(s("m8")),
        },
    );
}

#[test]
fn a_repeated_acknowledgement_of_one_id_is_not_a_conflict() {
    let (mut history, state) = clean();
    history.push(acked("c1", "b", "m8", 1, (90, 95)));
    history.push(acked("c4", "b", "m8", 1, (90, 95)));
    assert!(check(&history, &state).valid);
}

#[test]
fn a_subscriber_gap_is_reported() {
    expect_only(
        |history, _| {
            history.retain(|e| !matches!(e, Event::Delivery { subscriber, offset: 3, .. } if subscriber == "s1"));
        },
        Violation::DeliveryGap {
            subscriber: s("s1"),
            node: s("n2"),
            channel: s("a"),
            after: 2,
            missing: OffsetRange { first: 3, last: 3 },
        },
    );
}

#[test]
fn a_first_delivery_past_the_resume_point_is_a_gap() {
    expect_only(
        |history, _| {
            history.push(subscribe("s4", "a", 0));
            history.push(delivery("s4", "a", 2, "m2"));
        },
        Violation::DeliveryGap {
            subscriber: s("s4"),
            node: s("n2"),
            channel: s("a"),
            after: 0,
            missing: OffsetRange { first: 1, last: 1 },
        },
    );
}

#[test]
fn a_subscriber_duplicate_is_reported() {
    expect_only(
        |history, _| history.push(delivery("s2", "a", 2, "m2")),
        Violation::DeliveryDuplicate {
            subscriber: s("s2"),
            node: s("n2"),
            channel: s("a"),
            after: 1,
            offset: 2,
        },
    );
}

#[test]
fn a_delivery_at_or_below_the_resume_point_is_out_of_order() {
    expect_only(
        |history, _| history.push(delivery("s2", "a", 1, "m1")),
        Violation::DeliveryOutOfOrder {
            subscriber: s("s2"),
            node: s("n2"),
            channel: s("a"),
            after: 1,
            offset: 1,
            previous: 2,
        },
    );
}

#[test]
fn a_delivery_that_differs_from_the_store_is_reported() {
    expect_only(
        |history, _| {
            for e in history.iter_mut() {
                if let Event::Delivery {
                    subscriber,
                    id,
                    offset: 2,
                    ..
                } = e
                {
                    if subscriber == "s1" {
                        *id = s("m9");
                    }
                }
            }
        },
        Violation::DeliveryMismatch {
            subscriber: s("s1"),
            node: s("n2"),
            channel: s("a"),
            offset: 2,
            delivered_id: s("m9"),
            stored_id: Some(s("m2")),
        },
    );
}

#[test]
fn a_delivery_without_a_subscribe_is_reported() {
    expect_only(
        |history, _| history.insert(0, delivery("s9", "b", 1, "m8")),
        Violation::DeliveryWithoutSubscribe {
            subscriber: s("s9"),
            node: s("n2"),
            channel: s("b"),
            offset: 1,
        },
    );
}

#[test]
fn a_token_going_down_is_reported() {
    expect_only(
        |_, state| {
            for m in state.channels.get_mut("a").unwrap() {
                if m.offset == 4 {
                    m.token = 1;
                }
            }
        },
        Violation::TokenRegression {
            channel: s("a"),
            offset: 4,
            token: 1,
            previous_offset: 3,
            previous_token: 2,
        },
    );
}

#[test]
fn a_definitely_refused_message_that_is_stored_is_reported() {
    expect_only(
        |_, state| {
            state.channels.get_mut("a").unwrap().push(StoredMessage {
                offset: 5,
                id: s("m7"),
                token: 2,
                published_at_ms: 70,
            });
        },
        Violation::RefusedButStored {
            channel: s("a"),
            id: s("m7"),
            refusals: vec![RefusalEvidence {
                client: s("c3"),
                code: s("draining"),
            }],
            stored_at: vec![5],
        },
    );
}

#[test]
fn a_refused_attempt_after_an_unknown_one_may_be_stored() {
    // m5's first attempt had an unknown outcome; its retry was refused.
    let (mut history, mut state) = clean();
    history.push(failed("c3", "a", "m5", "not_holder", (70, 71)));
    state.channels.get_mut("a").unwrap().push(StoredMessage {
        offset: 5,
        id: s("m5"),
        token: 2,
        published_at_ms: 50,
    });
    assert_eq!(check(&history, &state).violations, vec![]);
}

#[test]
fn an_indeterminate_message_stored_twice_is_reported() {
    expect_only(
        |history, state| {
            history.push(unknown("c3", "a", "m5", (70, 80)));
            let a = state.channels.get_mut("a").unwrap();
            for offset in [5, 6] {
                a.push(StoredMessage {
                    offset,
                    id: s("m5"),
                    token: 2,
                    published_at_ms: 70,
                });
            }
        },
        Violation::IndeterminateStoredTwice {
            channel: s("a"),
            id: s("m5"),
            clients: vec![s("c3")],
            stored_at: vec![5, 6],
        },
    );
}

#[test]
fn an_acknowledged_message_stored_twice_is_reported() {
    expect_only(
        |_, state| {
            state.channels.get_mut("b").unwrap().push(StoredMessage {
                offset: 2,
                id: s("m8"),
                token: 2,
                published_at_ms: 90,
            });
        },
        Violation::DuplicateStored {
            channel: s("b"),
            id: s("m8"),
            stored_at: vec![1, 2],
        },
    );
}

#[test]
fn a_stored_message_nobody_published_is_reported() {
    expect_only(
        |_, state| {
            state.channels.get_mut("b").unwrap().push(StoredMessage {
                offset: 2,
                id: s("ghost"),
                token: 2,
                published_at_ms: 90,
            });
        },
        Violation::UnpublishedStored {
            channel: s("b"),
            offset: 2,
            id: s("ghost"),
        },
    );
}

#[test]
fn a_message_published_on_one_channel_and_stored_on_another_is_unpublished_there() {
    let (history, mut state) = clean();
    state.channels.get_mut("b").unwrap().push(StoredMessage {
        offset: 2,
        id: s("m5"),
        token: 2,
        published_at_ms: 90,
    });
    let report = check(&history, &state);
    assert_eq!(
        report.violations,
        vec![Violation::UnpublishedStored {
            channel: s("b"),
            offset: 2,
            id: s("m5"),
        }]
    );
}

// ---- availability and recovery --------------------------------------------

#[test]
fn availability_counts_buckets_with_publishes_in_flight() {
    let history = vec![
        acked("c1", "a", "p1", 1, (0, 50)), // bucket 0: acked
        failed("c1", "a", "p2", "not_holder", (120, 180)), // bucket 1
        unknown("c1", "a", "p3", (250, 520)), // buckets 2..=5
        acked("c2", "a", "p4", 2, (530, 590)), // bucket 5: acked
        acked("c2", "a", "p5", 3, (1000, 1010)), // bucket 10: acked
    ];
    let state = stored(&[("a", 1, "p1", 1), ("a", 2, "p4", 1), ("a", 3, "p5", 1)]);
    let report = check(&history, &state);
    assert!(report.valid, "{report}");
    let a = &report.availability;
    assert_eq!(a.bucket_ms, 100);
    assert_eq!(a.buckets_attempted, 7); // 0..=5 and 10; 6..=9 had no publish
    assert_eq!(a.buckets_available, 3);
    assert_eq!(a.ratio, Some(3.0 / 7.0));
    assert_eq!(a.longest_outage_ms, 400); // 1..=4
}

#[test]
fn availability_is_undefined_without_publishes() {
    let report = check(&[], &FinalState::default());
    assert_eq!(report.availability.ratio, None);
    assert_eq!(report.availability.buckets_attempted, 0);
    assert!(report.recovery.is_empty());
    assert!(report.valid);
}

#[test]
fn recovery_is_measured_to_the_first_ack_sent_after_each_fault() {
    let mut history = vec![
        fault("kill_holder", 1000),
        fault("kill_holder", 3000),
        fault("kill_holder", 5000),
        fault("pause_holder", 6000),
        fault("pause_holder", 6500),
        fault("partition_db", 9000),
    ];
    let acks = [
        (900, 1100), // sent before the first fault: ignored for it
        (1100, 1450),
        (1200, 1400), // first kill: 400
        (3100, 3200), // second kill: 200
        (5000, 5800), // third kill: 800
        (6100, 6700), // first pause: 700
        (7000, 7100), // second pause: 600
    ];
    let mut rows = Vec::new();
    let ids: Vec<String> = (0..acks.len()).map(|i| format!("r{i}")).collect();
    for (i, &(invoke, complete)) in acks.iter().enumerate() {
        let offset = i as u64 + 1;
        history.push(acked("c1", "a", &ids[i], offset, (invoke, complete)));
        rows.push(("a", offset, ids[i].as_str(), 1));
    }
    history.push(unknown("c1", "a", "late", (9100, 14100)));
    let report = check(&history, &stored(&rows));
    assert!(report.valid, "{report}");
    assert_eq!(
        report.recovery["kill_holder"],
        RecoveryStats {
            faults: 3,
            recovered: 3,
            min_ms: Some(200),
            median_ms: Some(400),
            max_ms: Some(800),
        }
    );
    assert_eq!(
        report.recovery["pause_holder"],
        RecoveryStats {
            faults: 2,
            recovered: 2,
            min_ms: Some(600),
            median_ms: Some(650),
            max_ms: Some(700),
        }
    );
    assert_eq!(
        report.recovery["partition_db"],
        RecoveryStats {
            faults: 1,
            recovered: 0,
            min_ms: None,
            median_ms: None,
            max_ms: None,
        }
    );
    assert_eq!(report.counts.run_ms, 14100);
    assert_eq!(report.availability.longest_outage_ms, 5100); // 91..=141
}

// ---- rendering ------------------------------------------------------------

#[test]
fn the_report_renders_as_json_and_as_a_table() {
    let (history, mut state) = clean();
    remove_stored(&mut state, "b", 1);
    state.lease_history = Some(vec![
        LeaseAcquisition {
            token: 1,
            acquired_at_ms: 0,
        },
        LeaseAcquisition {
            token: 2,
            acquired_at_ms: 30,
        },
    ]);
    let report = check(&history, &state);
    assert_eq!(report.counts.lease_acquisitions, Some(2));

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["valid"], false);
    assert_eq!(json["violations"][0]["kind"], "acked_not_stored");
    assert_eq!(json["violations"][0]["id"], "m8");
    assert_eq!(json["recovery"]["kill_holder"]["min_ms"], 35);
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);

    let text = report.to_string();
    assert!(text.contains("INVALID (2 violations)"), "{text}");
    assert!(text.contains("kill_holder"), "{text}");
    assert!(
        text.contains("acked_not_stored: b/m8 acked at 1 to c1; stored there: nothing"),
        "{text}"
    );
    assert!(text.contains("delivery_mismatch"), "{text}");
    assert!(text.contains("lease acquisitions 2"), "{text}");

    let (history, state) = clean();
    let text = check(&history, &state).to_string();
    assert!(text.starts_with("verdict       VALID\n"), "{text}");
    assert!(!text.contains("violations"), "{text}");
}

// ---- generated histories ----------------------------------------------------

/// A small deterministic generator (xorshift64*), enough for test data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const CHANNELS: [&str; 3] = ["a", "b", "c"];
const CLIENTS: [&str; 4] = ["c0", "c1", "c2", "c3"];
const FAULTS: [&str; 3] = ["kill_holder", "pause_holder", "partition_db"];

/// Simulates a correct cluster for `ops` operations.
struct Sim {
    rng: Rng,
    now: u64,
    token: u64,
    history: Vec<Event>,
    state: FinalState,
}

impl Sim {
    fn attempt(&mut self, client: &str, channel: &str, id: &str, result: PublishResult) {
        let invoke = self.now;
        self.now += 1 + self.rng.below(30);
        let node = format!("n{}", self.rng.below(3));
        self.history.push(Event::Publish {
            client: client.into(),
            node,
            channel: channel.into(),
            id: id.into(),
            idempotency_key: Some(format!("key-{id}")),
            invoke_ms: invoke,
            complete_ms: self.now,
            result,
        });
    }

    fn store(&mut self, channel: &str, id: &str) -> u64 {
        let messages = self.state.channels.entry(channel.to_owned()).or_default();
        let offset = messages.len() as u64 + 1;
        messages.push(StoredMessage {
            offset,
            id: id.to_owned(),
            token: self.token,
            published_at_ms: self.now,
        });
        offset
    }

    fn publish(&mut self, n: usize) {
        let channel = *self.rng.pick(&CHANNELS);
        let client = *self.rng.pick(&CLIENTS);
        let id = format!("m{n}");
        let refusal = || PublishResult::Failed {
            code: s("not_holder"),
        };
        let lost = || PublishResult::transport_error("connection reset");
        match self.rng.below(100) {
            0..=64 => {
                // sometimes a first attempt that stored nothing
                match self.rng.below(10) {
                    0 => self.attempt(client, channel, &id, refusal()),
                    1 => self.attempt(client, channel, &id, lost()),
                    _ => {}
                }
                let offset = self.store(channel, &id);
                self.attempt(client, channel, &id, PublishResult::Acked { offset });
            }
            65..=74 => self.attempt(client, channel, &id, refusal()),
            75..=84 => {
                let offset = self.store(channel, &id);
                self.attempt(client, channel, &id, lost());
                if self.rng.below(2) == 0 {
                    // the retry finds the original by its key
                    self.attempt(client, channel, &id, PublishResult::Acked { offset });
                }
            }
            _ => self.attempt(client, channel, &id, lost()),
        }
    }

    fn fault(&mut self) {
        let kind = *self.rng.pick(&FAULTS);
        let start = self.now;
        let duration = 100 + self.rng.below(900);
        self.history.push(Event::Fault {
            kind: kind.into(),
            target: s("n0"),
            start_ms: start,
            end_ms: start + duration,
        });
        self.token += 1;
        let acquired = start + self.rng.below(duration);
        self.history.push(Event::Takeover {
            node: format!("n{}", self.rng.below(3)),
            token: self.token,
            at_ms: acquired,
        });
        self.state.lease_history.get_or_insert_with(Vec::new).push(
            crate::history::LeaseAcquisition {
                token: self.token,
                acquired_at_ms: acquired,
            },
        );
        self.now = acquired;
    }

    /// Subscribers that read each channel to its head over several
    /// connections, each resuming at or before what it last received.
    fn subscribers(&mut self) {
        for channel in CHANNELS {
            let stored: Vec<StoredMessage> = self
                .state
                .channels
                .get(channel)
                .cloned()
                .unwrap_or_default();
            let head = stored.len() as u64;
            for k in 0..2 {
                let subscriber = format!("s-{channel}-{k}");
                let mut received = 0;
                loop {
                    let after = received - self.rng.below(received.min(3) + 1);
                    self.history.push(Event::Subscribe {
                        subscriber: subscriber.clone(),
                        node: format!("n{}", self.rng.below(3)),
                        channel: channel.into(),
                        after,
                        at_ms: self.now,
                    });
                    let end = head.min(after + 1 + self.rng.below(40));
                    for m in &stored[after as usize..end as usize] {
                        self.now += 1;
                        self.history.push(Event::Delivery {
                            subscriber: subscriber.clone(),
                            node: s("n?"),
                            channel: channel.into(),
                            offset: m.offset,
                            id: m.id.clone(),
                            at_ms: self.now,
                        });
                    }
                    received = end;
                    if received == head {
                        break;
                    }
                }
            }
        }
    }
}

fn generate(seed: u64, ops: usize) -> (Vec<Event>, FinalState) {
    let mut sim = Sim {
        rng: Rng::new(seed),
        now: 0,
        token: 1,
        history: Vec::new(),
        state: FinalState {
            lease_history: Some(vec![crate::history::LeaseAcquisition {
                token: 1,
                acquired_at_ms: 0,
            }]),
            ..FinalState::default()
        },
    };
    for n in 0..ops {
        if sim.rng.below(100) < 3 {
            sim.fault();
        }
        sim.publish(n);
        sim.now += sim.rng.below(20);
    }
    sim.subscribers();
    (sim.history, sim.state)
}

/// Every acknowledgement in a history: (channel, offset, id).
fn acks(history: &[Event]) -> Vec<(String, u64, String)> {
    let mut acks: Vec<_> = history
        .iter()
        .filter_map(|e| match e {
            Event::Publish {
                channel,
                id,
                result: PublishResult::Acked { offset },
                ..
            } => Some((channel.clone(), *offset, id.clone())),
            _ => None,
        })
        .collect();
    acks.sort();
    acks.dedup();
    acks
}

/// The clients acknowledged for a message, in the order they were.
fn ack_clients(history: &[Event], channel: &str, id: &str) -> Vec<String> {
    let mut clients: Vec<String> = Vec::new();
    for e in history {
        if let Event::Publish {
            client,
            channel: c,
            id: i,
            result: PublishResult::Acked { .. },
            ..
        } = e
        {
            if c == channel && i == id && !clients.contains(client) {
                clients.push(client.clone());
            }
        }
    }
    clients
}

fn message_mut<'a>(state: &'a mut FinalState, channel: &str, offset: u64) -> &'a mut StoredMessage {
    state
        .channels
        .get_mut(channel)
        .unwrap()
        .iter_mut()
        .find(|m| m.offset == offset)
        .unwrap()
}

const SEEDS: std::ops::Range<u64> = 1..41;
const OPS: usize = 500;

#[test]
fn generated_clean_histories_pass() {
    for seed in SEEDS {
        let (history, state) = generate(seed, OPS);
        let report = check(&history, &state);
        assert!(report.valid, "seed {seed}: {report}");
        let c = &report.counts;
        assert!(c.publishes >= OPS, "seed {seed}");
        assert!(
            c.acked > 0 && c.failed > 0 && c.indeterminate > 0,
            "seed {seed}"
        );
        assert!(c.deliveries >= 2 * c.stored, "seed {seed}");
        assert_eq!(c.lease_acquisitions, Some(c.takeovers + 1), "seed {seed}");
        assert!(
            report.availability.ratio.is_some_and(|r| r > 0.5),
            "seed {seed}"
        );
    }
}

#[test]
fn dropping_a_stored_acknowledged_message_is_caught() {
    for seed in SEEDS {
        let (history, mut state) = generate(seed, OPS);
        let mut rng = Rng::new(seed ^ 0xD0);
        let (channel, offset, id) = rng.pick(&acks(&history)).clone();
        remove_stored(&mut state, &channel, offset);
        let report = check(&history, &state);
        let expected = Violation::AckedNotStored {
            channel: channel.clone(),
            id: id.clone(),
            clients: ack_clients(&history, &channel, &id),
            acked_offset: offset,
            stored_id: None,
            id_stored_at: vec![],
        };
        assert!(
            report.violations.contains(&expected),
            "seed {seed}: {report}"
        );
        assert_eq!(
            report.violations_of("acked_not_stored").len(),
            1,
            "seed {seed}"
        );
        // every subscriber that read past it notices too
        assert!(
            !report.violations_of("delivery_mismatch").is_empty(),
            "seed {seed}"
        );
    }
}

#[test]
fn duplicating_a_stored_acknowledged_message_is_caught() {
    for seed in SEEDS {
        let (history, mut state) = generate(seed, OPS);
        let mut rng = Rng::new(seed ^ 0xD1);
        let (channel, offset, id) = rng.pick(&acks(&history)).clone();
        let messages = state.channels.get_mut(&channel).unwrap();
        let mut copy = messages
            .iter()
            .find(|m| m.offset == offset)
            .unwrap()
            .clone();
        copy.offset = messages.len() as u64 + 1;
        copy.token = messages.iter().map(|m| m.token).max().unwrap();
        let copy_offset = copy.offset;
        messages.push(copy);
        let report = check(&history, &state);
        assert_eq!(
            report.violations,
            vec![Violation::DuplicateStored {
                channel,
                id,
                stored_at: vec![offset, copy_offset],
            }],
            "seed {seed}"
        );
    }
}

#[test]
fn swapping_two_stored_offsets_is_caught() {
    for seed in SEEDS {
        let (history, mut state) = generate(seed, OPS);
        let mut rng = Rng::new(seed ^ 0xD2);
        let acks = acks(&history);
        let (channel, first, first_id) = rng.pick(&acks).clone();
        let others: Vec<_> = acks
            .iter()
            .filter(|(c, o, _)| *c == channel && *o != first)
            .collect();
        let (_, second, second_id) = (*rng.pick(&others)).clone();
        message_mut(&mut state, &channel, first).offset = 0;
        message_mut(&mut state, &channel, second).offset = first;
        message_mut(&mut state, &channel, 0).offset = second;
        let report = check(&history, &state);
        for (id, acked_offset, stored_id, other) in [
            (&first_id, first, &second_id, second),
            (&second_id, second, &first_id, first),
        ] {
            let expected = Violation::AckedNotStored {
                channel: channel.clone(),
                id: id.clone(),
                clients: ack_clients(&history, &channel, id),
                acked_offset,
                stored_id: Some(stored_id.clone()),
                id_stored_at: vec![other],
            };
            assert!(
                report.violations.contains(&expected),
                "seed {seed}: {report}"
            );
        }
    }
}

#[test]
fn lowering_a_token_is_caught() {
    for seed in SEEDS {
        let (history, mut state) = generate(seed, OPS);
        let mut rng = Rng::new(seed ^ 0xD3);
        let channel = *rng.pick(&CHANNELS);
        let messages = &state.channels[channel];
        let offset = 2 + rng.below(messages.len() as u64 - 1);
        let (previous_offset, previous_token) = messages
            .iter()
            .filter(|m| m.offset < offset)
            .map(|m| (m.offset, m.token))
            // the highest token, at its lowest offset
            .min_by_key(|&(o, t)| (std::cmp::Reverse(t), o))
            .unwrap();
        message_mut(&mut state, channel, offset).token = previous_token - 1;
        let report = check(&history, &state);
        assert!(
            report.violations.contains(&Violation::TokenRegression {
                channel: channel.into(),
                offset,
                token: previous_token - 1,
                previous_offset,
                previous_token,
            }),
            "seed {seed}: {report}"
        );
        assert!(
            report
                .violations
                .iter()
                .all(|v| v.kind() == "token_regression"),
            "seed {seed}: {report}"
        );
    }
}

// ---- the lease observer's rule ------------------------------------------------

/// A lease observation at `at_ms` (harness clock) of a row last renewed at
/// `renewed_ms` and expiring at `expires_ms` (database clock, ms).
fn lease(
    token: u64,
    holder: Option<&str>,
    expired: bool,
    at_ms: u64,
    renewed_ms: i64,
    expires_ms: i64,
) -> Event {
    Event::Lease {
        token,
        holder: holder.map(str::to_owned),
        expired,
        expires_at_us: expires_ms * 1000,
        renewed_at_us: renewed_ms * 1000,
        at_ms,
    }
}

#[test]
fn a_renewal_after_an_expiry_seen_is_reported_once() {
    expect_only(
        |history, _| {
            history.extend([
                lease(1, Some("n1"), false, 100, 0, 4000),
                lease(1, Some("n1"), true, 4100, 0, 4000),
                // the renewal that brought it back, then more of the same
                lease(1, Some("n1"), false, 4700, 4650, 8650),
                lease(1, Some("n1"), true, 9000, 4650, 8650),
                lease(1, Some("n1"), false, 9400, 9350, 13350),
                lease(2, Some("n2"), false, 9500, 9450, 13450),
            ]);
        },
        Violation::LeaseResurrected {
            token: 1,
            holder: Some(s("n1")),
            expired_at_ms: 4100,
            unexpired_at_ms: 4700,
            expires_at_us: 4_000_000,
            renewed_at_us: 4_650_000,
        },
    );
}

#[test]
fn a_renewal_decided_before_the_expiry_but_seen_after_it_is_correct() {
    // The renewal's UPDATE judged the lease live at 3999 ms; its commit
    // became visible after the observer read the old row as expired. The
    // next renewals, after 4000 ms, renew the row it wrote, which is live.
    let seen = [
        lease(1, Some("n1"), false, 100, 0, 4000),
        lease(1, Some("n1"), true, 4001, 0, 4000),
        lease(1, Some("n1"), false, 4003, 3999, 7999),
        lease(1, Some("n1"), false, 4700, 4650, 8650),
        // released on drain: expired again, never renewed
        lease(1, None, true, 5000, 4650, 4990),
    ];
    let (mut history, state) = clean();
    history.extend(seen.clone());
    assert_eq!(check(&history, &state).violations, vec![]);
    // Decided at the expiry itself: a resurrection.
    let (mut history, state) = clean();
    history.extend(seen[..2].iter().cloned());
    history.push(lease(1, Some("n1"), false, 4003, 4000, 8000));
    let kinds: Vec<&str> = check(&history, &state)
        .violations
        .iter()
        .map(Violation::kind)
        .collect();
    assert_eq!(kinds, ["lease_resurrected"]);
}

#[test]
fn lease_observations_are_judged_by_time_not_by_their_order() {
    expect_only(
        |history, _| {
            history.extend([
                lease(3, Some("n2"), false, 7000, 6500, 10500),
                lease(3, Some("n2"), true, 6000, 1000, 5000),
            ]);
        },
        Violation::LeaseResurrected {
            token: 3,
            holder: Some(s("n2")),
            expired_at_ms: 6000,
            unexpired_at_ms: 7000,
            expires_at_us: 5_000_000,
            renewed_at_us: 6_500_000,
        },
    );
    // The same observations with the times the other way round: a lease
    // renewed in time that later expired.
    let (mut history, state) = clean();
    history.extend([
        lease(3, Some("n2"), true, 7000, 1000, 5000),
        lease(3, Some("n2"), false, 6000, 1000, 5000),
    ]);
    assert_eq!(check(&history, &state).violations, vec![]);
}

#[test]
fn expiry_release_and_new_tokens_are_not_resurrections() {
    let (mut history, state) = clean();
    history.extend([
        // acquired, renewed, expired, taken over with a new token
        lease(1, Some("n1"), false, 100, 0, 4000),
        lease(1, Some("n1"), true, 4100, 0, 4000),
        lease(2, Some("n2"), false, 4200, 4150, 8150),
        // released on drain: the token stays, expired; the next acquire
        // takes a new one, also by the same node
        lease(2, None, true, 8000, 4150, 7990),
        lease(3, Some("n2"), false, 8300, 8250, 12250),
        // reclaimed or taken over while live: a new token too
        lease(4, Some("n2"), false, 9000, 8950, 12950),
        lease(5, Some("n3"), false, 9500, 9450, 13450),
        lease(5, Some("n3"), true, 14000, 9450, 13450),
    ]);
    let report = check(&history, &state);
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.counts.lease_observations, 8);
    assert_eq!(report.counts.lease_tokens, 5);
    assert!(report
        .to_string()
        .contains("lease         8 changes seen, 5 tokens"));
}

// ---- the liveness rule ------------------------------------------------------

fn subscribe_at(subscriber: &str, channel: &str, after: u64, at_ms: u64) -> Event {
    Event::Subscribe {
        subscriber: subscriber.into(),
        node: "n2".into(),
        channel: channel.into(),
        after,
        at_ms,
    }
}

fn delivery_at(subscriber: &str, channel: &str, offset: u64, at_ms: u64) -> Event {
    Event::Delivery {
        subscriber: subscriber.into(),
        node: "n2".into(),
        channel: channel.into(),
        offset,
        id: format!("l{offset}"),
        at_ms,
    }
}

fn fault_span(kind: &str, start_ms: u64, end_ms: u64) -> Event {
    Event::Fault {
        kind: kind.into(),
        target: "n1".into(),
        start_ms,
        end_ms,
    }
}

/// When message `l<offset>` of channel `a` is acknowledged in
/// [`live_history`]: from 10 s, one every 100 ms.
fn ack_ms(offset: u64) -> u64 {
    10_000 + 100 * (offset - 1)
}

/// Ten messages on channel `a`, acknowledged at [`ack_ms`]; subscriber
/// `s1` follows `a` from the start (`after` 0, at 0 ms) and receives
/// offset `o` `delays[o - 1]` ms after its acknowledgement, or never for
/// `None` (a later offset may not be received after a missing one: that is
/// a gap). The history goes on to 40 s.
fn live_history(delays: &[Option<u64>; 10]) -> (Vec<Event>, FinalState) {
    let mut history = vec![subscribe_at("s1", "a", 0, 0)];
    let mut rows = Vec::new();
    let ids: Vec<String> = (1..=10).map(|o| format!("l{o}")).collect();
    for offset in 1..=10u64 {
        let id = ids[offset as usize - 1].as_str();
        let t = ack_ms(offset);
        history.push(acked("c1", "a", id, offset, (t - 5, t)));
        rows.push(("a", offset, id, 1));
    }
    for (i, delay) in delays.iter().enumerate() {
        let offset = i as u64 + 1;
        if let Some(delay) = delay {
            history.push(delivery_at("s1", "a", offset, ack_ms(offset) + delay));
        }
    }
    history.push(Event::Takeover {
        node: s("n2"),
        token: 1,
        at_ms: 40_000,
    });
    (history, stored(&rows))
}

/// Offsets 1..=3 received 10 ms after their acknowledgement, then nothing.
fn stalled_after_three() -> [Option<u64>; 10] {
    let mut delays = [None; 10];
    for d in delays.iter_mut().take(3) {
        *d = Some(10);
    }
    delays
}

fn stall(first_missed: u64, missed: usize) -> Violation {
    Violation::DeliveryStalled {
        subscriber: s("s1"),
        node: s("n2"),
        channel: s("a"),
        after: 0,
        subscribed_at_ms: 0,
        first_missed,
        acked_at_ms: ack_ms(first_missed),
        missed,
    }
}

#[test]
fn deliveries_in_time_are_not_a_stall() {
    let (history, state) = live_history(&[Some(10); 10]);
    assert_eq!(check(&history, &state).violations, vec![]);
    // STALL_MS late is still in time
    let (history, state) = live_history(&[Some(STALL_MS); 10]);
    assert_eq!(check(&history, &state).violations, vec![]);
}

#[test]
fn a_connection_that_stops_receiving_is_one_stall() {
    let (history, state) = live_history(&stalled_after_three());
    let report = check(&history, &state);
    assert_eq!(report.violations, vec![stall(4, 7)]);
    assert_eq!(
        report.violations_by_kind,
        BTreeMap::from([(s("delivery_stalled"), 1)])
    );
    let text = report.to_string();
    assert!(
        text.contains(&format!(
            "delivery_stalled: s1 on n2 a after 0 (opened at 0 ms): 7 acked offsets not \
             received within {STALL_MS} ms, first 4 acked at 10300 ms"
        )),
        "{text}"
    );
}

#[test]
fn deliveries_that_arrive_too_late_are_a_stall() {
    let mut delays = [Some(10); 10];
    for d in delays.iter_mut().skip(4) {
        *d = Some(STALL_MS + 1);
    }
    let (history, state) = live_history(&delays);
    assert_eq!(check(&history, &state).violations, vec![stall(5, 6)]);
}

#[test]
fn a_stall_near_a_fault_is_not_judged() {
    // A fault during the stall, one starting less than 1 s after a
    // deadline, one that ended less than 5 s before an acknowledgement.
    for (start, end) in [
        (10_500, 11_500),
        (
            ack_ms(4) + STALL_MS + FAULT_LEAD_MS - 100,
            ack_ms(4) + STALL_MS + FAULT_LEAD_MS,
        ),
        (5_000, 6_000),
        (12_500, 12_500),
    ] {
        let (mut history, state) = live_history(&stalled_after_three());
        history.push(fault_span("kill_standby", start, end));
        let report = check(&history, &state);
        assert_eq!(report.violations, vec![], "fault {start}..{end}");
    }
    // Faults further away excuse nothing: one ending 5 s before the
    // first missed acknowledgement, one starting 1 s after the last
    // deadline.
    for (start, end) in [
        (4_000, ack_ms(4) - FAULT_TAIL_MS - 1),
        (ack_ms(10) + STALL_MS + FAULT_LEAD_MS + 1, 20_000),
    ] {
        let (mut history, state) = live_history(&stalled_after_three());
        history.push(fault_span("kill_standby", start, end));
        let report = check(&history, &state);
        assert_eq!(report.violations, vec![stall(4, 7)], "fault {start}..{end}");
    }
    // A fault that covers only the later acknowledgements leaves the
    // earlier ones judged.
    let (mut history, state) = live_history(&stalled_after_three());
    history.push(fault_span(
        "delay_db",
        ack_ms(7) + STALL_MS + FAULT_LEAD_MS,
        20_000,
    ));
    assert_eq!(check(&history, &state).violations, vec![stall(4, 3)]);
}

#[test]
fn a_reconnection_within_the_window_is_not_a_stall() {
    let (mut history, state) = live_history(&stalled_after_three());
    // The subscriber's own silence timeout fired: it reconnects with its
    // last offset and reads the rest.
    let reconnect = ack_ms(4) + STALL_MS - 1;
    history.push(subscribe_at("s1", "a", 3, reconnect));
    for offset in 4..=10 {
        history.push(delivery_at("s1", "a", offset, reconnect + offset));
    }
    assert_eq!(check(&history, &state).violations, vec![]);
}

#[test]
fn a_reconnection_after_the_window_does_not_excuse_the_stall() {
    let (mut history, state) = live_history(&stalled_after_three());
    // Acknowledgements up to offset 5 had their deadline before the
    // reconnection; 6..=10 were replaced in time.
    let reconnect = ack_ms(5) + STALL_MS;
    history.push(subscribe_at("s1", "a", 3, reconnect));
    for offset in 4..=10 {
        history.push(delivery_at("s1", "a", offset, reconnect + offset));
    }
    assert_eq!(check(&history, &state).violations, vec![stall(4, 2)]);
}

#[test]
fn a_stall_is_judged_only_where_the_history_reaches_past_its_deadline() {
    let (mut history, state) = live_history(&stalled_after_three());
    history.retain(|e| !matches!(e, Event::Takeover { .. }));
    assert_eq!(check(&history, &state).violations, vec![]);
    // The history ends between the deadlines of offsets 5 and 6.
    history.push(Event::Takeover {
        node: s("n2"),
        token: 1,
        at_ms: ack_ms(5) + STALL_MS + 1,
    });
    assert_eq!(check(&history, &state).violations, vec![stall(4, 2)]);
}

#[test]
fn only_acknowledgements_after_the_opening_and_the_resume_point_count() {
    // Opened after every acknowledgement: nothing to judge, though it
    // receives nothing.
    let (mut history, state) = live_history(&[Some(10); 10]);
    history.push(subscribe_at("s2", "a", 0, ack_ms(10) + 1));
    assert_eq!(check(&history, &state).violations, vec![]);
    // Opened before, resuming after the last offset: nothing to judge.
    let (mut history, state) = live_history(&[Some(10); 10]);
    history.push(subscribe_at("s2", "a", 10, 0));
    assert_eq!(check(&history, &state).violations, vec![]);
    // Opened in the middle, resuming at 6: 7..=10 were due.
    let (mut history, state) = live_history(&[Some(10); 10]);
    history.push(subscribe_at("s2", "a", 6, ack_ms(5)));
    assert_eq!(
        check(&history, &state).violations,
        vec![Violation::DeliveryStalled {
            subscriber: s("s2"),
            node: s("n2"),
            channel: s("a"),
            after: 6,
            subscribed_at_ms: ack_ms(5),
            first_missed: 7,
            acked_at_ms: ack_ms(7),
            missed: 4,
        }]
    );
    // Another channel's acknowledgements are not due.
    let (mut history, state) = live_history(&[Some(10); 10]);
    history.push(subscribe_at("s3", "b", 0, 0));
    assert_eq!(check(&history, &state).violations, vec![]);
}

#[test]
fn a_repeated_acknowledgement_is_due_from_its_own_time() {
    // Offset 4 acknowledged again (a retry found it by its key) late, to a
    // connection opened after the first acknowledgement that never gets
    // it.
    let (mut history, state) = live_history(&[Some(10); 10]);
    history.push(subscribe_at("s2", "a", 3, 12_500));
    history.push(acked("c2", "a", "l4", 4, (12_995, 13_000)));
    assert_eq!(
        check(&history, &state).violations,
        vec![Violation::DeliveryStalled {
            subscriber: s("s2"),
            node: s("n2"),
            channel: s("a"),
            after: 3,
            subscribed_at_ms: 12_500,
            first_missed: 4,
            acked_at_ms: 13_000,
            missed: 1,
        }]
    );
}

/// Many connections and acknowledgements, delivered in time except where
/// `stalled` says, with faults sprinkled in: clean runs pass, and a stall
/// away from faults is caught once.
fn generated_live(seed: u64, stalled: bool) -> (Vec<Event>, FinalState, Option<Violation>) {
    let mut rng = Rng::new(seed);
    let mut history = Vec::new();
    let mut rows: Vec<(String, u64, String)> = Vec::new();
    let subscribers = ["s0", "s1", "s2"];
    let mut t = 0u64;
    let mut acks = Vec::new();
    for offset in 1..=3000u64 {
        t += 1 + rng.below(20);
        let id = format!("l{offset}");
        history.push(acked("c0", "a", &id, offset, (t - 1, t)));
        rows.push((s("a"), offset, id));
        acks.push(t);
    }
    let end = t + 2 * STALL_MS;
    // Faults somewhere in the middle.
    let mut faults = Vec::new();
    for _ in 0..2 {
        let start = rng.below(t);
        let len = rng.below(2000);
        faults.push((start, start + len));
        history.push(fault_span("kill_holder", start, start + len));
    }
    let mut expected = None;
    // With `stalled`, s2's connection at that point receives nothing from
    // offset `stall_from` on, an acknowledgement far from every fault.
    let stall_from = stalled.then(|| {
        (100..2500u64)
            .find(|&o| {
                let ta = acks[o as usize - 1];
                let due = ta + STALL_MS;
                acks[2999] > due + STALL_MS
                    && faults.iter().all(|&(s0, e0)| {
                        s0.saturating_sub(FAULT_LEAD_MS) > due || e0 + FAULT_TAIL_MS < ta
                    })
            })
            .expect("an acknowledgement away from faults")
    });
    for name in subscribers {
        // Each subscriber reconnects every ~700 acknowledgements.
        let mut last = 0u64;
        let mut opened = 0u64;
        history.push(subscribe_at(name, "a", 0, 0));
        let mut offset = 1u64;
        while offset <= 3000 {
            if name == "s2" && stall_from == Some(offset) {
                // No more deliveries; the history goes on without a
                // reconnection.
                let missed: Vec<u64> = (offset..=3000)
                    .filter(|&o| {
                        let ta = acks[o as usize - 1];
                        ta >= opened
                            && end > ta + STALL_MS
                            && !faults.iter().any(|&(s0, e0)| {
                                s0.saturating_sub(FAULT_LEAD_MS) <= ta + STALL_MS
                                    && e0 + FAULT_TAIL_MS >= ta
                            })
                    })
                    .collect();
                expected = Some(Violation::DeliveryStalled {
                    subscriber: s("s2"),
                    node: s("n2"),
                    channel: s("a"),
                    after: last,
                    subscribed_at_ms: opened,
                    first_missed: missed[0],
                    acked_at_ms: acks[missed[0] as usize - 1],
                    missed: missed.len(),
                });
                break;
            }
            let ta = acks[offset as usize - 1];
            history.push(delivery_at(name, "a", offset, ta + rng.below(STALL_MS)));
            if rng.below(700) == 0 && offset < 3000 && stall_from.is_none_or(|f| offset + 1 < f) {
                // reconnect: the new connection opens at the last delivery
                // and resumes from it
                last = offset;
                opened = ta;
                history.push(subscribe_at(name, "a", last, opened));
            }
            offset += 1;
        }
    }
    history.push(Event::Takeover {
        node: s("n1"),
        token: 1,
        at_ms: end,
    });
    let rows: Vec<(&str, u64, &str, u64)> = rows
        .iter()
        .map(|(c, o, i)| (c.as_str(), *o, i.as_str(), 1))
        .collect();
    (history, stored(&rows), expected)
}

#[test]
fn generated_live_histories_pass_and_a_stall_in_them_is_caught() {
    for seed in 1..21 {
        let (history, state, _) = generated_live(seed, false);
        let report = check(&history, &state);
        assert!(report.valid, "seed {seed}: {report}");
        let (history, state, expected) = generated_live(seed, true);
        let report = check(&history, &state);
        let expected = expected.expect("a stall was generated");
        assert_eq!(report.violations, vec![expected], "seed {seed}");
    }
}

#[test]
fn the_runs_settings_are_reported_when_the_runner_gives_them() {
    let (history, state) = clean();
    let mut report = check(&history, &state);
    let json = serde_json::to_value(&report).unwrap();
    assert!(json.get("settings").is_none(), "{json}");
    assert!(!report.to_string().contains("switches"));

    report.settings = Some(RunSettings {
        seed: 3,
        duration_ms: 20_000,
        nodes: 3,
        faults: vec![s("stop_holder"), s("delay_db")],
        fault_switches: s("zombie_holder,renew_expired"),
    });
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["settings"]["seed"], 3);
    assert_eq!(json["settings"]["duration_ms"], 20_000);
    assert_eq!(json["settings"]["nodes"], 3);
    assert_eq!(
        json["settings"]["faults"],
        serde_json::json!(["stop_holder", "delay_db"])
    );
    assert_eq!(
        json["settings"]["fault_switches"],
        "zombie_holder,renew_expired"
    );
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
    let text = report.to_string();
    assert!(text.starts_with("verdict       VALID\n"), "{text}");
    assert!(
        text.contains("settings      seed 3, 3 nodes, 20000 ms\n"),
        "{text}"
    );
    assert!(
        text.contains("fault kinds   stop_holder,delay_db\n"),
        "{text}"
    );
    assert!(
        text.contains("switches      zombie_holder,renew_expired\n"),
        "{text}"
    );

    // No switches, no fault: no switches line, kinds `none`.
    if let Some(settings) = report.settings.as_mut() {
        settings.fault_switches.clear();
        settings.faults.clear();
    }
    let text = report.to_string();
    assert!(!text.contains("switches"), "{text}");
    assert!(text.contains("fault kinds   none\n"), "{text}");
}

// ---- retention -------------------------------------------------------------

fn truncated(subscriber: &str, channel: &str, requested_after: u64, earliest: u64) -> Event {
    Event::Truncated {
        subscriber: subscriber.into(),
        node: "n2".into(),
        channel: channel.into(),
        requested_after,
        earliest,
        at_ms: 0,
    }
}

/// Channel `t` with offsets 1..=5 acknowledged, of which 1..=3 were
/// trimmed (final earliest 4), and a subscriber told so.
fn trimmed_run() -> (Vec<Event>, FinalState) {
    let mut history: Vec<Event> = (1..=5)
        .map(|o| acked("c1", "t", &format!("m{o}"), o, (o * 10, o * 10 + 1)))
        .collect();
    history.push(subscribe("s1", "t", 1));
    history.push(truncated("s1", "t", 1, 4));
    history.push(delivery("s1", "t", 4, "m4"));
    history.push(delivery("s1", "t", 5, "m5"));
    let mut state = stored(&[("t", 4, "m4", 1), ("t", 5, "m5", 1)]);
    state.earliest.insert(s("t"), 4);
    (history, state)
}

#[test]
fn offsets_trimmed_below_the_announced_earliest_are_accepted() {
    let (history, state) = trimmed_run();
    let report = check(&history, &state);
    assert!(report.valid, "{report}");
    assert_eq!(report.counts.truncations, 1);
}

#[test]
fn a_truncation_beyond_the_final_earliest_is_reported() {
    let (mut history, state) = trimmed_run();
    // Claims 4 was trimmed too, though it is still stored.
    history[6] = truncated("s1", "t", 1, 5);
    history.remove(7);
    let report = check(&history, &state);
    assert_eq!(
        report.violations,
        vec![Violation::TruncatedWrongly {
            subscriber: s("s1"),
            node: s("n2"),
            channel: s("t"),
            position: 1,
            requested_after: 1,
            earliest: 5,
            final_earliest: 4,
        }]
    );
}

#[test]
fn a_truncation_that_does_not_start_at_the_position_is_reported() {
    let (mut history, state) = trimmed_run();
    history[6] = truncated("s1", "t", 0, 4);
    let report = check(&history, &state);
    assert_eq!(
        report.violations_of("truncated_wrongly").len(),
        1,
        "{report}"
    );
}

#[test]
fn a_gap_without_a_truncation_is_still_a_gap_after_trimming() {
    let (mut history, state) = trimmed_run();
    history.remove(6);
    let report = check(&history, &state);
    assert_eq!(report.violations_of("delivery_gap").len(), 1, "{report}");
}

#[test]
fn an_acknowledged_message_missing_at_or_above_the_final_earliest_is_reported() {
    let (history, mut state) = trimmed_run();
    remove_stored(&mut state, "t", 4);
    let report = check(&history, &state);
    assert!(
        !report.violations_of("acked_not_stored").is_empty(),
        "{report}"
    );
    // Offsets 1..=3, below the final earliest, are not.
    assert!(report.violations_of("acked_not_stored").iter().all(
        |v| matches!(v, Violation::AckedNotStored { acked_offset, .. } if *acked_offset >= 4)
    ));
}

#[test]
fn a_message_stored_below_the_final_earliest_is_extra() {
    let (history, mut state) = trimmed_run();
    store(&mut state, "t", [2]);
    let report = check(&history, &state);
    assert_eq!(
        report.violations_of("offsets_not_contiguous").len(),
        1,
        "{report}"
    );
}

// ---- Centrifugo clients -----------------------------------------------------

const EPOCH: &str = "0123456789abcdef";

fn position(offset: u64) -> Option<StreamPosition> {
    Some(StreamPosition {
        offset,
        epoch: EPOCH.into(),
    })
}

/// A Centrifugo subscribe reply to `z1` for channel `t`.
fn z_subscribed(from: Option<StreamPosition>, recovered: bool, epoch: &str, offset: u64) -> Event {
    Event::CentrifugoSubscribed {
        subscriber: s("z1"),
        node: s("n2"),
        channel: s("t"),
        recover_from: from,
        recovered,
        epoch: epoch.into(),
        offset,
        publications: 0,
        at_ms: 0,
    }
}

/// `z1`'s history read of `t` after `recovered: false`.
fn z_history(first: Option<u64>, offset: u64) -> Event {
    Event::CentrifugoHistory {
        subscriber: s("z1"),
        node: s("n2"),
        channel: s("t"),
        first,
        offset,
        epoch: EPOCH.into(),
        at_ms: 0,
    }
}

fn z_closed(code: Option<u16>) -> Event {
    Event::CentrifugoClosed {
        subscriber: s("z1"),
        node: s("n2"),
        channels: vec![s("t")],
        code,
        reason: s("test"),
        pongs: 2,
        at_ms: 7,
    }
}

/// Channel `t`, offsets 1..=6 acknowledged, 1..=3 trimmed (final earliest
/// 4). The Centrifugo client `z1` subscribes at 0, receives 1, is closed
/// with 3010, recovers after 1: `recovered: false` (head 5), reads the
/// history (first 4), announces 2..=3 as skipped, receives 4 and 5 from
/// the history and 6 live.
fn centrifugo_run() -> (Vec<Event>, FinalState) {
    let mut history: Vec<Event> = (1..=6)
        .map(|o| acked("c1", "t", &format!("m{o}"), o, (o * 10, o * 10 + 1)))
        .collect();
    history.extend([
        z_subscribed(None, false, EPOCH, 0),
        subscribe("z1", "t", 0),
        delivery("z1", "t", 1, "m1"),
        z_closed(Some(CLOSE_INSUFFICIENT_STATE)),
        z_subscribed(position(1), false, EPOCH, 5),
        subscribe("z1", "t", 1),
        z_history(Some(4), 5),
        truncated("z1", "t", 1, 4),
        delivery("z1", "t", 4, "m4"),
        delivery("z1", "t", 5, "m5"),
        delivery("z1", "t", 6, "m6"),
        z_closed(None),
        // Reconnected: recovers after 6 with nothing missed.
        z_subscribed(position(6), true, EPOCH, 6),
        subscribe("z1", "t", 6),
    ]);
    let mut state = stored(&[("t", 4, "m4", 1), ("t", 5, "m5", 1), ("t", 6, "m6", 1)]);
    state.earliest.insert(s("t"), 4);
    (history, state)
}

/// The index of the first event that matches.
fn find(history: &[Event], wanted: impl Fn(&Event) -> bool) -> usize {
    history.iter().position(wanted).expect("such an event")
}

#[test]
fn a_centrifugo_client_that_recovers_or_reloads_past_trimmed_offsets_is_valid() {
    let (history, state) = centrifugo_run();
    let report = check(&history, &state);
    assert!(report.valid, "{report}");
    let z = &report.counts.centrifugo;
    assert_eq!((z.connections, z.subscribes, z.first_subscribes), (2, 3, 1));
    assert_eq!((z.recovered, z.not_recovered, z.history_reloads), (1, 1, 1));
    assert_eq!((z.deliveries, z.pongs), (4, 4));
    assert_eq!(z.closes.get("3010"), Some(&1));
    assert_eq!(z.closes.get("none"), Some(&1));
    let text = report.to_string();
    assert!(
        text.contains(
            "centrifugo    2 connections, 3 subscribes (1 first, 1 recovered with 0 \
             publications, 1 not recovered), 1 history reloads, 4 deliveries, 4 pongs\n"
        ),
        "{text}"
    );
    assert!(text.contains("  closed by   3010: 1, none: 1\n"), "{text}");
}

#[test]
fn not_recovered_while_the_history_read_after_it_still_holds_the_resume_point_is_reported() {
    let (mut history, mut state) = centrifugo_run();
    // Nothing was trimmed: the history read starts at 2, right after the
    // resume point, and the client reloads 2..=5 from it.
    let read = find(&history, |e| matches!(e, Event::CentrifugoHistory { .. }));
    history[read] = z_history(Some(2), 5);
    history.remove(read + 1);
    history.splice(
        read + 1..read + 1,
        [delivery("z1", "t", 2, "m2"), delivery("z1", "t", 3, "m3")],
    );
    state.earliest.insert(s("t"), 2);
    store(&mut state, "t", [2, 3]);
    let report = check(&history, &state);
    assert_eq!(
        report.violations,
        vec![Violation::NotRecovered {
            subscriber: s("z1"),
            node: s("n2"),
            channel: s("t"),
            resume_after: 1,
            head: 5,
            earliest: 2,
        }],
        "{report}"
    );
}

#[test]
fn not_recovered_at_or_above_the_final_earliest_is_reported_without_a_history_read() {
    let (mut history, state) = centrifugo_run();
    // The connection ends before the history read; the client had reached
    // 3, and the final earliest is 4: 4 is held, so was everything after 3.
    let read = find(&history, |e| matches!(e, Event::CentrifugoHistory { .. }));
    history.truncate(read);
    history.push(z_closed(None));
    let refused = find(&history, |e| {
        matches!(
            e,
            Event::CentrifugoSubscribed {
                recovered: false,
                recover_from: Some(_),
                ..
            }
        )
    });
    history[refused] = z_subscribed(position(3), false, EPOCH, 5);
    history[refused + 1] = subscribe("z1", "t", 3);
    let report = check(&history, &state);
    assert_eq!(report.violations_of("not_recovered").len(), 1, "{report}");
    // After 2 (3 trimmed by the end) it is accepted.
    history[refused] = z_subscribed(position(2), false, EPOCH, 5);
    history[refused + 1] = subscribe("z1", "t", 2);
    let report = check(&history, &state);
    assert!(report.violations_of("not_recovered").is_empty(), "{report}");
}

#[test]
fn not_recovered_in_another_epoch_is_judged_as_an_epoch_change() {
    let (mut history, state) = centrifugo_run();
    let refused = find(&history, |e| {
        matches!(
            e,
            Event::CentrifugoSubscribed {
                recovered: false,
                recover_from: Some(_),
                ..
            }
        )
    });
    history[refused] = z_subscribed(position(1), false, "fedcba9876543210", 5);
    let report = check(&history, &state);
    assert_eq!(
        report.violations,
        vec![Violation::EpochChanged {
            subscriber: s("z1"),
            node: s("n2"),
            channel: s("t"),
            epoch: s("fedcba9876543210"),
            first_epoch: s(EPOCH),
        }],
        "{report}"
    );
}

#[test]
fn a_recovery_that_skips_publications_is_a_gap() {
    let (mut history, state) = centrifugo_run();
    // Recovered after 6 ... and then 8 comes, 7 never did.
    history.push(acked("c1", "t", "m7", 7, (70, 71)));
    history.push(acked("c1", "t", "m8", 8, (80, 81)));
    history.push(delivery("z1", "t", 8, "m8"));
    let mut state = state;
    store(&mut state, "t", [7, 8]);
    let report = check(&history, &state);
    assert_eq!(report.violations_of("delivery_gap").len(), 1, "{report}");
}

#[test]
fn a_reload_that_claims_held_offsets_trimmed_is_reported() {
    let (mut history, state) = centrifugo_run();
    // The history read starts at 5 although 4 is still stored.
    let read = find(&history, |e| matches!(e, Event::CentrifugoHistory { .. }));
    history[read] = z_history(Some(5), 5);
    history[read + 1] = truncated("z1", "t", 1, 5);
    history.remove(read + 2);
    let report = check(&history, &state);
    assert_eq!(
        report.violations_of("truncated_wrongly").len(),
        1,
        "{report}"
    );
}

#[test]
fn insufficient_state_followed_by_full_recovery_is_reported() {
    let (mut history, state) = centrifugo_run();
    // After the 3010 the client recovers every publication after 1.
    let refused = find(&history, |e| {
        matches!(
            e,
            Event::CentrifugoSubscribed {
                recovered: false,
                recover_from: Some(_),
                ..
            }
        )
    });
    let end = find(&history, |e| {
        matches!(e, Event::CentrifugoClosed { code: None, .. })
    });
    let mut recovered = vec![
        z_subscribed(position(1), true, EPOCH, 6),
        subscribe("z1", "t", 1),
    ];
    recovered.extend((2..=6).map(|o| delivery("z1", "t", o, &format!("m{o}"))));
    history.splice(refused..end, recovered);
    // Nothing was trimmed in this version of the run.
    let mut state = state;
    state.earliest.insert(s("t"), 1);
    store(&mut state, "t", [1, 2, 3]);
    let report = check(&history, &state);
    assert_eq!(
        report.violations,
        vec![Violation::InsufficientStateWrongly {
            subscriber: s("z1"),
            node: s("n2"),
            channels: vec![s("t")],
            closed_at_ms: 7,
        }],
        "{report}"
    );
}
