//! Conformance cases of streams (`Storage::stream_info`, `create_stream`,
//! `append_stream`, stream appends in `write`'s groups) and of what
//! streams change for every channel.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_core::{
    ForkLimits, Lease, Payload, Producer, ProducerLimits, StreamAppend, StreamAppended,
    StreamConfig, StreamCreate, StreamCreated, WriteOutcome, WriteRequest,
};
use serde_json::value::RawValue;

use super::harness::{acquire, assert_lost, channel, wait_expired, LONG_TTL, SHORT_TTL};
use super::Harness;
use crate::error::{Error, Refusal};
use crate::testing::msg;
use crate::traits::Storage;

fn bytes(b: &[u8]) -> Payload {
    Payload::Bytes(Arc::from(b))
}

fn json(text: &str) -> Payload {
    Payload::Json(Arc::from(RawValue::from_string(text.to_owned()).unwrap()))
}

fn create(name: &str, content_type: &str, messages: Vec<Payload>) -> StreamCreate {
    StreamCreate {
        channel: channel(name),
        config: StreamConfig {
            content_type: content_type.to_owned(),
            ttl_s: None,
            expires_at_ms: None,
        },
        closed: false,
        messages,
        fork: None,
        may_convert: true,
    }
}

/// Fork limits no case here reaches.
const UNLIMITED: ForkLimits = ForkLimits {
    max_messages: u64::MAX / 2,
    max_bytes: u64::MAX / 2,
    max_forks: u64::MAX / 2,
};

fn append(name: &str, messages: Vec<Payload>, producer: Option<(u64, u64)>) -> StreamAppend {
    StreamAppend {
        channel: channel(name),
        content_type: Some("text/plain".to_owned()),
        messages,
        producer: producer.map(|(epoch, seq)| Producer {
            id: "producer-1".to_owned(),
            epoch,
            seq,
        }),
        stream_seq: None,
        close: false,
        producer_limits: ProducerLimits::default(),
    }
}

async fn created(node: &Arc<dyn Storage>, lease: &Lease, create: &StreamCreate) -> u64 {
    match node.create_stream(lease, create).await.unwrap() {
        StreamCreated::Created { info, .. } => info.head,
        other => panic!("expected Created, got {other:?}"),
    }
}

/// Bytes are stored byte for byte, every value 0 to 255, and read back as
/// bytes; a stream is created once, and a second creation finds it.
pub async fn streams_store_bytes_exactly(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    let all: Vec<u8> = (0..=255).collect();
    let head = created(
        node,
        &lease,
        &create("s", "application/octet-stream", vec![bytes(&all)]),
    )
    .await;
    assert_eq!(head, 1);
    let got = node
        .append_stream(&lease, &{
            let mut a = append("s", vec![bytes(b""), bytes(b"\0tail")], None);
            a.content_type = Some("APPLICATION/octet-stream; x=1".to_owned());
            a
        })
        .await
        .unwrap();
    assert!(
        matches!(
            got,
            StreamAppended::Appended {
                first: 2,
                head: 3,
                closed: false,
                ..
            }
        ),
        "{got:?}"
    );
    let page = c.node(1).read(&channel("s"), 0, 10).await.unwrap();
    let stored: Vec<Payload> = page.messages.into_iter().map(|m| m.data).collect();
    assert_eq!(stored, [bytes(&all), bytes(b""), bytes(b"\0tail")]);
    let info = c.node(1).stream_info(&channel("s")).await.unwrap().unwrap();
    assert_eq!((info.head, info.earliest, info.closed), (3, 1, false));
    assert_eq!(info.config.content_type, "application/octet-stream");
    match node
        .create_stream(&lease, &create("s", "text/plain", vec![bytes(b"x")]))
        .await
        .unwrap()
    {
        StreamCreated::Exists(info) => assert_eq!(info.head, 3),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(node.read(&channel("s"), 0, 10).await.unwrap().head, 3);
    assert!(node.stream_info(&channel("plain")).await.unwrap().is_none());
}

/// A producer's sequence is stored with its append: a retry on another
/// node, after a takeover, is a duplicate exactly when the append
/// committed; older epochs are fenced off, gaps refused.
pub async fn stream_producers_are_exactly_once_across_a_takeover(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (first, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    created(c.node(0), &first, &create("p", "text/plain", Vec::new())).await;
    for seq in 0..2 {
        let got = c
            .node(0)
            .append_stream(&first, &append("p", vec![bytes(b"m")], Some((0, seq))))
            .await
            .unwrap();
        assert!(matches!(got, StreamAppended::Appended { .. }), "{got:?}");
    }
    wait_expired(c.node(1), &first.name).await;
    let (second, _) = acquire(c.node(1), 1, LONG_TTL).await;
    assert_lost(
        c.node(0)
            .append_stream(&first, &append("p", vec![bytes(b"m")], Some((0, 2))))
            .await,
        &first,
    );
    let node = c.node(1);
    assert_eq!(
        node.append_stream(&second, &append("p", vec![bytes(b"again")], Some((0, 1))))
            .await
            .unwrap(),
        StreamAppended::Duplicate {
            head: 2,
            last_seq: 1,
            closed: false
        }
    );
    assert_eq!(
        node.append_stream(&second, &append("p", vec![bytes(b"m")], Some((0, 3))))
            .await
            .unwrap(),
        StreamAppended::SeqGap {
            expected: 2,
            received: 3
        }
    );
    let got = node
        .append_stream(&second, &append("p", vec![bytes(b"m")], Some((1, 0))))
        .await
        .unwrap();
    assert!(
        matches!(got, StreamAppended::Appended { head: 3, .. }),
        "{got:?}"
    );
    assert_eq!(
        node.append_stream(&second, &append("p", vec![bytes(b"m")], Some((0, 2))))
            .await
            .unwrap(),
        StreamAppended::StaleEpoch { epoch: 1 }
    );
    assert_eq!(node.read(&channel("p"), 0, 10).await.unwrap().head, 3);
}

/// A stream keeps state for at most `max_per_stream` producers: one more
/// is refused and stores nothing, until the others are idle longer than
/// `idle_ms`, when they are forgotten (a forgotten producer is new again:
/// its next sequence number must be 0). An append with no message and no
/// close is refused without using up the producer's sequence number.
pub async fn stream_producers_are_bounded_and_forgotten_when_idle(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(node, &lease, &create("bounded", "text/plain", Vec::new())).await;
    let by = |id: &str, seq: u64, idle_ms: u64| {
        let mut a = append("bounded", vec![bytes(b"m")], Some((0, seq)));
        if let Some(p) = a.producer.as_mut() {
            p.id = id.to_owned();
        }
        a.producer_limits = ProducerLimits {
            max_per_stream: 2,
            idle_ms,
        };
        a
    };
    const HOUR_MS: u64 = 3_600_000;
    let mut empty = by("a", 0, HOUR_MS);
    empty.messages.clear();
    assert_eq!(
        node.append_stream(&lease, &empty).await.unwrap(),
        StreamAppended::Empty
    );
    for (id, head) in [("a", 1), ("b", 2)] {
        let got = node
            .append_stream(&lease, &by(id, 0, HOUR_MS))
            .await
            .unwrap();
        assert!(
            matches!(got, StreamAppended::Appended { head: h, .. } if h == head),
            "{id}: {got:?}"
        );
    }
    assert_eq!(
        node.append_stream(&lease, &by("c", 0, HOUR_MS))
            .await
            .unwrap(),
        StreamAppended::TooManyProducers { limit: 2 }
    );
    let known = node
        .append_stream(&lease, &by("a", 1, HOUR_MS))
        .await
        .unwrap();
    assert!(
        matches!(known, StreamAppended::Appended { head: 3, .. }),
        "{known:?}"
    );
    assert_eq!(node.read(&channel("bounded"), 0, 10).await.unwrap().head, 3);
    // Idle for longer than 1 ms: "a" and "b" are forgotten, "c" admitted.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let admitted = node.append_stream(&lease, &by("c", 0, 1)).await.unwrap();
    assert!(
        matches!(admitted, StreamAppended::Appended { head: 4, .. }),
        "{admitted:?}"
    );
    assert_eq!(
        node.append_stream(&lease, &by("a", 2, HOUR_MS))
            .await
            .unwrap(),
        StreamAppended::SeqGap {
            expected: 0,
            received: 2
        }
    );
    let again = node
        .append_stream(&lease, &by("a", 0, HOUR_MS))
        .await
        .unwrap();
    assert!(
        matches!(again, StreamAppended::Appended { head: 5, .. }),
        "{again:?}"
    );
}

/// A closed stream takes no message, from a stream append or a plain
/// publish, and keeps its final head; the append that closed it is a
/// duplicate when retried.
pub async fn a_closed_stream_refuses_every_append(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(
        node,
        &lease,
        &create("c", "application/json", vec![json("1")]),
    )
    .await;
    let mut closing = append("c", vec![json("2")], Some((0, 0)));
    closing.content_type = Some("application/json".to_owned());
    closing.close = true;
    let got = node.append_stream(&lease, &closing).await.unwrap();
    assert!(
        matches!(
            got,
            StreamAppended::Appended {
                head: 2,
                closed: true,
                ..
            }
        ),
        "{got:?}"
    );
    assert_eq!(
        node.append_stream(&lease, &closing).await.unwrap(),
        StreamAppended::Duplicate {
            head: 2,
            last_seq: 0,
            closed: true
        }
    );
    let mut later = append("c", vec![json("3")], None);
    later.content_type = Some("application/json".to_owned());
    assert_eq!(
        node.append_stream(&lease, &later).await.unwrap(),
        StreamAppended::Closed { head: 2 }
    );
    match node
        .append(&lease, &[msg("other", "1"), msg("c", "3")])
        .await
    {
        Err(Error::ChannelRefuses {
            index: 1,
            refusal: Refusal::Closed,
        }) => {}
        other => panic!("expected ChannelRefuses {{ index: 1, Closed }}, got {other:?}"),
    }
    assert_eq!(node.read(&channel("other"), 0, 10).await.unwrap().head, 0);
    let info = node.stream_info(&channel("c")).await.unwrap().unwrap();
    assert_eq!((info.head, info.closed), (2, true));
}

/// A publish of JSON to a stream of another content type is refused;
/// JSON to a JSON stream and to a plain channel goes through.
pub async fn json_publishes_are_refused_by_byte_streams(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(node, &lease, &create("b", "text/plain", Vec::new())).await;
    created(
        node,
        &lease,
        &create("j", "application/json; charset=utf-8", Vec::new()),
    )
    .await;
    match node.append(&lease, &[msg("b", "1")]).await {
        Err(Error::ChannelRefuses {
            index: 0,
            refusal: Refusal::ContentType,
        }) => {}
        other => panic!("expected ChannelRefuses {{ index: 0, ContentType }}, got {other:?}"),
    }
    let out = node
        .append(&lease, &[msg("j", "1"), msg("plain", "2")])
        .await
        .unwrap();
    assert_eq!(out.iter().map(|a| a.offset).collect::<Vec<_>>(), [1, 1]);
    // A plain channel with JSON messages becomes a JSON stream, never a
    // byte stream.
    match node
        .create_stream(&lease, &create("plain", "text/plain", Vec::new()))
        .await
        .unwrap()
    {
        StreamCreated::Exists(info) => assert_eq!(info.config.content_type, "application/json"),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(
        created(
            node,
            &lease,
            &create("plain", "application/json", vec![json("3")])
        )
        .await,
        2
    );
}

/// A deleted stream is a stream no more: no content type, no producers;
/// created again, it goes on from its head with fresh producers.
pub async fn a_deleted_stream_starts_afresh(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(node, &lease, &create("d", "text/plain", vec![bytes(b"a")])).await;
    node.append_stream(&lease, &append("d", vec![bytes(b"b")], Some((3, 0))))
        .await
        .unwrap();
    let limits = crate::trim::TrimLimits {
        up_to: Some(2),
        ..crate::trim::TrimLimits::default()
    };
    node.trim(&lease, &channel("d"), &limits, 100)
        .await
        .unwrap();
    node.record_deletion(&lease, &channel("d"), 2)
        .await
        .unwrap();
    assert!(node.stream_info(&channel("d")).await.unwrap().is_none());
    assert_eq!(
        node.append_stream(&lease, &append("d", vec![bytes(b"c")], None))
            .await
            .unwrap(),
        StreamAppended::NotFound
    );
    assert_eq!(
        created(node, &lease, &create("d", "text/plain", Vec::new())).await,
        2
    );
    let info = node.stream_info(&channel("d")).await.unwrap().unwrap();
    assert_eq!((info.earliest, info.head), (3, 2));
    let got = node
        .append_stream(&lease, &append("d", vec![bytes(b"c")], Some((0, 0))))
        .await
        .unwrap();
    assert!(
        matches!(
            got,
            StreamAppended::Appended {
                first: 3,
                head: 3,
                ..
            }
        ),
        "{got:?}"
    );
}

/// Stream writes are fenced like appends.
pub async fn stream_writes_are_fenced(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let (first, _) = acquire(c.node(0), 0, SHORT_TTL).await;
    wait_expired(c.node(0), &first.name).await;
    let (_second, _) = acquire(c.node(1), 1, LONG_TTL).await;
    assert_lost(
        c.node(0)
            .create_stream(&first, &create("f", "text/plain", Vec::new()))
            .await,
        &first,
    );
    assert_lost(
        c.node(0)
            .append_stream(&first, &append("f", vec![bytes(b"x")], None))
            .await,
        &first,
    );
    assert!(c
        .node(1)
        .stream_info(&channel("f"))
        .await
        .unwrap()
        .is_none());
}

/// A renewal (what a read does to a stream, `Storage::renew_streams`)
/// restarts the TTL of live streams that have one, on every node of the
/// database; it never revives an expired stream, leaves streams without
/// a TTL, plain and unknown channels alone, and is fenced.
pub async fn a_renewal_restarts_the_ttl_of_live_streams_only(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    let mut long = create("r:long", "text/plain", vec![bytes(b"a")]);
    long.config.ttl_s = Some(3600);
    created(node, &lease, &long).await;
    let mut short = create("r:short", "text/plain", vec![bytes(b"b")]);
    short.config.ttl_s = Some(1);
    created(node, &lease, &short).await;
    created(node, &lease, &create("r:none", "text/plain", Vec::new())).await;
    node.append(&lease, &[msg("r:plain", "1")]).await.unwrap();
    let expiry = |info: Option<herald_core::StreamInfo>| info.and_then(|i| i.expires_at_ms);
    let before = expiry(node.stream_info(&channel("r:long")).await.unwrap())
        .expect("a stream with a TTL expires");

    // The one-second stream expires on the storage's clock (polled).
    let deadline = std::time::Instant::now() + super::harness::EXPIRY_WAIT;
    while node
        .stream_info(&channel("r:short"))
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "a 1 s TTL never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let names = [
        "r:long",
        "r:short",
        "r:none",
        "r:plain",
        "r:unknown",
        "r:long",
    ]
    .map(channel);
    assert_eq!(node.renew_streams(&lease, &names).await.unwrap(), 1);
    // Renewed after more than a second of the storage's clock: its TTL
    // runs from the renewal, as every node sees it.
    let after =
        expiry(c.node(1).stream_info(&channel("r:long")).await.unwrap()).expect("still live");
    assert!(after >= before + 900, "expiry {before} → {after}");
    // The expired one stays expired: gone, unreadable, swept.
    assert!(node
        .stream_info(&channel("r:short"))
        .await
        .unwrap()
        .is_none());
    assert!(node
        .read(&channel("r:short"), 0, 10)
        .await
        .unwrap()
        .messages
        .is_empty());
    assert_eq!(
        node.expired_streams(10).await.unwrap(),
        vec![channel("r:short")]
    );
    assert_eq!(
        expiry(node.stream_info(&channel("r:none")).await.unwrap()),
        None
    );

    // Fenced: a token that is not current renews nothing.
    let stale = Lease {
        token: herald_core::FencingToken(lease.token.0 + 1),
        ..lease.clone()
    };
    assert_lost(node.renew_streams(&stale, &names).await, &stale);
    assert_eq!(
        expiry(node.stream_info(&channel("r:long")).await.unwrap()),
        Some(after)
    );
}

/// A stream past its expiry is gone for readers and writers, and a
/// creation is told to delete it first.
pub async fn an_expired_stream_is_gone(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    // A minute ago on this host's clock: past on the database's too,
    // whatever their skew within a minute.
    let past = SystemTime::now() - Duration::from_secs(60);
    let past_ms = i64::try_from(past.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
    let mut expired = create("e", "text/plain", vec![bytes(b"x")]);
    expired.config.expires_at_ms = Some(past_ms);
    created(node, &lease, &expired).await;
    assert!(node.stream_info(&channel("e")).await.unwrap().is_none());
    assert_eq!(
        node.append_stream(&lease, &append("e", vec![bytes(b"y")], None))
            .await
            .unwrap(),
        StreamAppended::NotFound
    );
    assert_eq!(
        node.create_stream(&lease, &create("e", "text/plain", Vec::new()))
            .await
            .unwrap(),
        StreamCreated::Expired
    );
    // A publish through Herald's API or Centrifugo is refused too: it
    // would revive the withheld messages (and restart the TTL), or be
    // deleted with them by the sweep after it was acknowledged.
    let mut with_messages = create("ej", "application/json", vec![json("1")]);
    with_messages.config.expires_at_ms = Some(past_ms);
    created(node, &lease, &with_messages).await;
    match node
        .append(&lease, &[msg("other", "1"), msg("ej", "2")])
        .await
    {
        Err(Error::ChannelRefuses {
            index: 1,
            refusal: Refusal::Expired,
        }) => {}
        other => panic!("expected ChannelRefuses {{ index: 1, Expired }}, got {other:?}"),
    }
    assert_eq!(node.read(&channel("other"), 0, 10).await.unwrap().head, 0);
    let page = node.read(&channel("ej"), 0, 10).await.unwrap();
    assert_eq!((page.head, page.messages.len()), (1, 0));
    let mut later = create("e2", "text/plain", Vec::new());
    later.config.expires_at_ms = Some(past_ms + 3_600_000);
    later.config.ttl_s = Some(3600);
    created(node, &lease, &later).await;
    let info = node.stream_info(&channel("e2")).await.unwrap().unwrap();
    assert_eq!(info.config.ttl_s, Some(3600));
    assert!(info
        .expires_at_ms
        .is_some_and(|at| at <= past_ms + 3_600_000));
}

/// An expired stream reads as a deleted channel does (no message,
/// earliest `head + 1`, the head kept) on every read, and is listed for
/// the sweep, which lists no live stream and no plain channel.
pub async fn an_expired_stream_reads_as_deleted_until_swept(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    let now_ms = |shift: Duration, past: bool| {
        let at = if past {
            SystemTime::now() - shift
        } else {
            SystemTime::now() + shift
        };
        i64::try_from(at.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
    };
    // A minute either side on this host's clock: past or future on the
    // database's too, whatever their skew within a minute.
    let mut expired = create("x:old", "text/plain", vec![bytes(b"a"), bytes(b"b")]);
    expired.config.expires_at_ms = Some(now_ms(Duration::from_secs(60), true));
    created(node, &lease, &expired).await;
    let mut live = create("x:live", "text/plain", vec![bytes(b"c")]);
    live.config.expires_at_ms = Some(now_ms(Duration::from_secs(3600), false));
    live.config.ttl_s = Some(3600);
    created(node, &lease, &live).await;
    node.append(&lease, &[msg("x:plain", "1")]).await.unwrap();

    for after in [0, 1, 2] {
        let page = node.read(&channel("x:old"), after, 10).await.unwrap();
        assert!(page.messages.is_empty(), "from {after}: {page:?}");
        assert_eq!((page.head, page.earliest), (2, 3), "from {after}");
    }
    let page = node.read(&channel("x:live"), 0, 10).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    let page = node.read(&channel("x:plain"), 0, 10).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(
        node.expired_streams(10).await.unwrap(),
        vec![channel("x:old")]
    );
    assert!(node.expired_streams(0).await.unwrap().is_empty());
    // Deleted, it is listed no more.
    node.trim(
        &lease,
        &channel("x:old"),
        &crate::TrimLimits {
            up_to: Some(2),
            ..crate::TrimLimits::default()
        },
        100,
    )
    .await
    .unwrap();
    node.record_deletion(&lease, &channel("x:old"), 2)
        .await
        .unwrap();
    assert!(node.expired_streams(10).await.unwrap().is_empty());
}

/// A fork starts with its source's messages up to its offset (and its
/// sub-offset's part of the next: a byte prefix, or more JSON messages),
/// at the same offsets, then goes its own way; a fork of a missing source,
/// or beyond its head, writes nothing.
pub async fn a_fork_copies_its_source_up_to_its_offset(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(
        node,
        &lease,
        &create("src", "text/plain", vec![bytes(b"ab"), bytes(b"cdef")]),
    )
    .await;
    let fork = |name: &str, offset, sub_offset| {
        let mut f = create(name, "text/plain", vec![bytes(b"Z")]);
        f.fork = Some(herald_core::Fork {
            source: channel("src"),
            offset,
            sub_offset,
            limits: UNLIMITED,
        });
        f
    };
    assert_eq!(created(node, &lease, &fork("f1", 1, 0)).await, 2);
    assert_eq!(created(node, &lease, &fork("f2", 1, 3)).await, 3);
    let texts = |page: crate::traits::Page| -> Vec<Payload> {
        page.messages.into_iter().map(|m| m.data).collect()
    };
    assert_eq!(
        texts(node.read(&channel("f1"), 0, 10).await.unwrap()),
        [bytes(b"ab"), bytes(b"Z")]
    );
    assert_eq!(
        texts(node.read(&channel("f2"), 0, 10).await.unwrap()),
        [bytes(b"ab"), bytes(b"cde"), bytes(b"Z")]
    );
    // The source goes on unchanged.
    assert_eq!(node.read(&channel("src"), 0, 10).await.unwrap().head, 2);
    for (name, refused) in [
        ("f3", fork("f3", 3, 0)),
        ("f4", fork("f4", 1, 9)),
        ("f5", fork("f5", 2, 1)),
    ] {
        assert_eq!(
            node.create_stream(&lease, &refused).await.unwrap(),
            StreamCreated::ForkOutOfRange,
            "{name}"
        );
        assert!(
            node.stream_info(&channel(name)).await.unwrap().is_none(),
            "{name}"
        );
    }
    let mut orphan = fork("f6", 0, 0);
    orphan.fork.as_mut().unwrap().source = channel("nobody");
    assert_eq!(
        node.create_stream(&lease, &orphan).await.unwrap(),
        StreamCreated::SourceNotFound
    );
}

/// A stream with live forks can be marked deleted: it is gone for
/// appends and forks, its content kept; a deletion makes it a plain
/// channel again.
pub async fn a_soft_deleted_stream_is_gone_until_deleted(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(node, &lease, &create("s", "text/plain", vec![bytes(b"a")])).await;
    let mut fork = create("f", "text/plain", Vec::new());
    fork.fork = Some(herald_core::Fork {
        source: channel("s"),
        offset: 1,
        sub_offset: 0,
        limits: UNLIMITED,
    });
    created(node, &lease, &fork).await;
    let info = node.stream_info(&channel("s")).await.unwrap().unwrap();
    assert_eq!((info.live_forks, info.soft_deleted), (1, false));
    let f = node.stream_info(&channel("f")).await.unwrap().unwrap();
    assert_eq!(f.fork_of, Some(channel("s")));
    assert!(node
        .soft_delete_stream(&lease, &channel("s"))
        .await
        .unwrap());
    assert!(
        node.stream_info(&channel("s"))
            .await
            .unwrap()
            .unwrap()
            .soft_deleted
    );
    assert_eq!(
        node.append_stream(&lease, &append("s", vec![bytes(b"b")], None))
            .await
            .unwrap(),
        StreamAppended::Gone
    );
    let mut again = fork.clone();
    again.channel = channel("g");
    assert_eq!(
        node.create_stream(&lease, &again).await.unwrap(),
        StreamCreated::SourceGone
    );
    match node
        .create_stream(&lease, &create("s", "text/plain", Vec::new()))
        .await
        .unwrap()
    {
        StreamCreated::Exists(info) => assert!(info.soft_deleted),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(
        node.read(&channel("s"), 0, 10)
            .await
            .unwrap()
            .messages
            .len(),
        1
    );
    node.record_deletion(&lease, &channel("s"), 1)
        .await
        .unwrap();
    assert!(node.stream_info(&channel("s")).await.unwrap().is_none());
    // Its fork keeps its copy and is a fork of it no more.
    let f = node.stream_info(&channel("f")).await.unwrap().unwrap();
    assert_eq!(f.fork_of, None);
    assert!(!node
        .soft_delete_stream(&lease, &channel("s"))
        .await
        .unwrap());
}

/// A channel that holds messages becomes a stream only when the creation
/// may convert it, decided inside the fenced creation; refused, nothing
/// changes.
pub async fn a_channel_with_messages_is_converted_only_when_allowed(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    node.append(&lease, &[msg("plain", "1")]).await.unwrap();
    let mut convert = create("plain", "application/json", Vec::new());
    convert.may_convert = false;
    assert_eq!(
        node.create_stream(&lease, &convert).await.unwrap(),
        StreamCreated::ChannelHasMessages
    );
    assert!(node.stream_info(&channel("plain")).await.unwrap().is_none());
    // A channel without messages needs no such right.
    let mut empty = create("empty", "application/json", Vec::new());
    empty.may_convert = false;
    created(node, &lease, &empty).await;
    convert.may_convert = true;
    assert_eq!(created(node, &lease, &convert).await, 1);
}

/// A fork is refused, copying nothing, when it would copy more messages
/// or bytes than its limits allow, or when its source has as many live
/// forks as allowed; live forks are counted whatever their number.
pub async fn fork_limits_are_checked_before_copying(h: &dyn Harness) {
    let c = h.cluster(1).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(
        node,
        &lease,
        &create(
            "src",
            "text/plain",
            vec![bytes(b"ab"), bytes(b"cd"), bytes(b"ef")],
        ),
    )
    .await;
    let fork = |name: &str, offset, limits| {
        let mut f = create(name, "text/plain", Vec::new());
        f.fork = Some(herald_core::Fork {
            source: channel("src"),
            offset,
            sub_offset: 0,
            limits,
        });
        f
    };
    let few = ForkLimits {
        max_messages: 2,
        ..UNLIMITED
    };
    assert_eq!(
        node.create_stream(&lease, &fork("f1", 3, few))
            .await
            .unwrap(),
        StreamCreated::ForkTooLarge {
            messages: 3,
            bytes: 6
        }
    );
    assert!(node.stream_info(&channel("f1")).await.unwrap().is_none());
    let small = ForkLimits {
        max_bytes: 3,
        ..UNLIMITED
    };
    assert_eq!(
        node.create_stream(&lease, &fork("f1", 2, small))
            .await
            .unwrap(),
        StreamCreated::ForkTooLarge {
            messages: 2,
            bytes: 4
        }
    );
    // Within the limits, up to the offset asked.
    assert_eq!(created(node, &lease, &fork("f1", 2, few)).await, 2);
    let one = ForkLimits {
        max_forks: 2,
        ..UNLIMITED
    };
    assert_eq!(created(node, &lease, &fork("f2", 0, one)).await, 0);
    assert_eq!(
        node.create_stream(&lease, &fork("f3", 0, one))
            .await
            .unwrap(),
        StreamCreated::TooManyForks { forks: 2 }
    );
    assert!(node.stream_info(&channel("f3")).await.unwrap().is_none());
    let info = node.stream_info(&channel("src")).await.unwrap().unwrap();
    assert_eq!(info.live_forks, 2);
}

/// One group commit (`Storage::write`) of messages and stream appends:
/// every refused stream append (closed stream, producer sequence gap,
/// content type) is answered alone and writes nothing, while the rest of
/// the group commits, in batch order, with one commit time; a producer's
/// retry within the group is a duplicate. A refused message (a publish to
/// a closed stream) fails the whole group as before, stream appends
/// included: nothing of it is stored, and the group without it commits.
pub async fn a_mixed_group_commits_without_its_refused_stream_appends(h: &dyn Harness) {
    let c = h.cluster(2).await;
    let node = c.node(0);
    let (lease, _) = acquire(node, 0, LONG_TTL).await;
    created(node, &lease, &create("g1", "text/plain", Vec::new())).await;
    let mut closed = create("g2", "text/plain", Vec::new());
    closed.closed = true;
    created(node, &lease, &closed).await;
    let mut other_type = append("g1", vec![json("1")], None);
    other_type.content_type = Some("application/json".to_owned());
    let group = [
        WriteRequest::Message(msg("plain", "1")),
        WriteRequest::Stream(append("g1", vec![bytes(b"a")], Some((0, 0)))),
        WriteRequest::Stream(append("g2", vec![bytes(b"x")], None)),
        WriteRequest::Stream(append("g1", vec![bytes(b"b")], Some((0, 2)))),
        WriteRequest::Stream(append("g1", vec![bytes(b"c"), bytes(b"d")], Some((0, 1)))),
        WriteRequest::Stream(other_type),
        WriteRequest::Message(msg("plain", "2")),
        WriteRequest::Stream(append("g1", vec![bytes(b"a")], Some((0, 0)))),
    ];
    let outcomes = node.write(&lease, &group).await.unwrap();
    assert_eq!(outcomes.len(), group.len(), "{outcomes:?}");
    let (at, first_message) = match &outcomes[0] {
        WriteOutcome::Message(a) => (a.published_at_ms, a.offset),
        other => panic!("expected a message, got {other:?}"),
    };
    assert_eq!(first_message, 1);
    match &outcomes[6] {
        WriteOutcome::Message(a) => {
            assert_eq!((a.offset, a.duplicate, a.published_at_ms), (2, false, at));
        }
        other => panic!("expected a message, got {other:?}"),
    }
    let stream = |i: usize| match &outcomes[i] {
        WriteOutcome::Stream(s) => s.clone(),
        other => panic!("entry {i}: expected a stream append, got {other:?}"),
    };
    assert_eq!(
        stream(1),
        StreamAppended::Appended {
            first: 1,
            head: 1,
            published_at_ms: at,
            closed: false
        }
    );
    assert_eq!(stream(2), StreamAppended::Closed { head: 0 });
    assert_eq!(
        stream(3),
        StreamAppended::SeqGap {
            expected: 1,
            received: 2
        }
    );
    assert_eq!(
        stream(4),
        StreamAppended::Appended {
            first: 2,
            head: 3,
            published_at_ms: at,
            closed: false
        }
    );
    assert_eq!(
        stream(5),
        StreamAppended::ContentTypeMismatch {
            content_type: "text/plain".to_owned()
        }
    );
    assert_eq!(
        stream(7),
        StreamAppended::Duplicate {
            head: 3,
            last_seq: 1,
            closed: false
        }
    );
    let other = c.node(1);
    let page = other.read(&channel("g1"), 0, 10).await.unwrap();
    let stored: Vec<(u64, Payload, i64)> = page
        .messages
        .into_iter()
        .map(|m| (m.offset, m.data, m.published_at_ms))
        .collect();
    assert_eq!(
        stored,
        [
            (1, bytes(b"a"), at),
            (2, bytes(b"c"), at),
            (3, bytes(b"d"), at)
        ]
    );
    assert_eq!(other.read(&channel("plain"), 0, 10).await.unwrap().head, 2);
    let g2 = other.stream_info(&channel("g2")).await.unwrap().unwrap();
    assert_eq!((g2.head, g2.closed), (0, true));

    // A refused message rolls the whole group back, its stream appends too.
    let next = WriteRequest::Stream(append("g1", vec![bytes(b"e")], Some((0, 2))));
    match node
        .write(
            &lease,
            &[next.clone(), WriteRequest::Message(msg("g2", "1"))],
        )
        .await
    {
        Err(Error::ChannelRefuses {
            index: 1,
            refusal: Refusal::Closed,
        }) => {}
        other => panic!("expected ChannelRefuses {{ index: 1, Closed }}, got {other:?}"),
    }
    assert_eq!(other.read(&channel("g1"), 0, 10).await.unwrap().head, 3);
    let retried = node.write(&lease, &[next]).await.unwrap();
    assert!(
        matches!(
            retried.as_slice(),
            [WriteOutcome::Stream(StreamAppended::Appended {
                first: 4,
                head: 4,
                ..
            })]
        ),
        "{retried:?}"
    );
}
