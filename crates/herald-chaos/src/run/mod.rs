//! One chaos run, start to end: a disposable database, the nodes, the
//! clients and the lease observer, the faults of the schedule, the final
//! state and the verdict.

pub(crate) mod access;
pub(crate) mod centrifugo;
pub(crate) mod clients;
pub(crate) mod database;
pub(crate) mod faults;
pub(crate) mod lease;
pub(crate) mod node;
pub(crate) mod schedule;
pub(crate) mod streams;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_chaos::checker::{check, Report, RunSettings};
use herald_chaos::history::{write_jsonl, FinalState, StoredMessage};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use clients::Recorder;
use database::Cluster;
use node::{Node, Urls};
use schedule::FaultKind;

/// The channels the clients publish to and follow. Those in the
/// namespace `trim` keep only their newest [`access::TRIM_MAX_MESSAGES`]
/// messages (retention), so the run also judges trimming under faults.
pub(crate) const CHANNELS: [&str; 3] = ["chaos-a", "chaos-b", "trim:chaos-c"];

/// Number of publishers.
const PUBLISHERS: usize = 4;

/// The Durable Streams streams of a run, one producer each
/// (`streams.rs`; the second in namespace `trim`, which retention trims);
/// their channels are followed by the streams' followers (SSE or
/// long-poll) and by the plain SSE subscribers alike.
const STREAMS: [&str; 2] = ["ds:chaos-d0", "trim:chaos-d1"];

/// How long subscribers get to reach the final heads.
const CATCH_UP: Duration = Duration::from_secs(20);

/// Everything a run needs to know.
pub(crate) struct Settings {
    /// How long faults are injected and clients run.
    pub(crate) duration: Duration,
    /// The schedule's seed.
    pub(crate) seed: u64,
    /// How many nodes.
    pub(crate) nodes: usize,
    /// The `herald` binary.
    pub(crate) herald_bin: PathBuf,
    /// PostgreSQL's server binaries.
    pub(crate) pg_bin: PathBuf,
    /// The user that runs PostgreSQL, when the harness runs as root.
    pub(crate) pg_user: Option<String>,
    /// Where to write the history, the final state and the report.
    pub(crate) out: Option<PathBuf>,
    /// The fault kinds the schedule draws from.
    pub(crate) faults: Vec<FaultKind>,
    /// Given verbatim to every node as `HERALD_FAULT_SWITCHES` when not
    /// empty.
    pub(crate) fault_switches: String,
}

impl Settings {
    /// The settings as the report records them.
    fn recorded(&self) -> RunSettings {
        RunSettings {
            seed: self.seed,
            duration_ms: u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
            nodes: self.nodes,
            faults: self.faults.iter().map(|k| k.name().to_owned()).collect(),
            fault_switches: self.fault_switches.clone(),
        }
    }
}

/// Runs the whole thing and returns the checker's report.
pub(crate) async fn run(settings: Settings) -> anyhow::Result<Report> {
    let channels: Vec<String> = CHANNELS.iter().map(|c| (*c).to_owned()).collect();
    let plan = schedule::draw(
        settings.seed,
        settings.duration,
        settings.nodes,
        channels.len(),
        &settings.faults,
    );
    if let Some(out) = &settings.out {
        std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    }
    let work = tempfile::Builder::new()
        .prefix("herald-chaos-")
        .tempdir()
        .context("create a work directory")?;
    let (bin, user) = (settings.pg_bin.clone(), settings.pg_user.clone());
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || Cluster::start(&bin, user))
            .await
            .context("the database start task")??,
    );

    let recorder = Recorder::new();
    let epoch_ms = db_now_ms(&cluster.url()).await?;
    let start = Instant::now();

    let urls = Urls::new(access::Access::create(work.path(), &CHANNELS)?);
    let mut nodes = Vec::new();
    for index in 0..settings.nodes {
        let mut node = Node::new(
            index,
            &settings.herald_bin,
            work.path(),
            settings.out.as_deref(),
            cluster.addr(),
            urls.clone(),
            &settings.fault_switches,
        )
        .await?;
        node.start().await?;
        nodes.push(node);
    }

    let stop_publishers = CancellationToken::new();
    let stop_followers = CancellationToken::new();
    let monitor = clients::monitor(urls.clone(), recorder.clone(), stop_followers.clone());
    let observer = lease::observer(cluster.url(), recorder.clone(), stop_followers.clone());
    // Per node, one SSE subscriber per channel and one Centrifugo
    // subscriber that follows every channel on one connection.
    let mut followed = Vec::new();
    let mut followers = Vec::new();
    for node in 0..settings.nodes {
        for channel in &channels {
            let last = Arc::new(AtomicU64::new(0));
            followers.push(clients::subscriber(
                node,
                channel.clone(),
                urls.clone(),
                recorder.clone(),
                Arc::clone(&last),
                stop_followers.clone(),
            ));
            followed.push((channel.clone(), last));
        }
        let centrifugo: Vec<centrifugo::Followed> = channels
            .iter()
            .map(|channel| centrifugo::Followed {
                channel: channel.clone(),
                last: Arc::new(AtomicU64::new(0)),
            })
            .collect();
        followed.extend(
            centrifugo
                .iter()
                .map(|f| (f.channel.clone(), Arc::clone(&f.last))),
        );
        followers.push(centrifugo::subscriber(
            node,
            centrifugo,
            urls.clone(),
            recorder.clone(),
            stop_followers.clone(),
        ));
    }
    let stream_channels: Vec<String> = STREAMS.iter().map(|c| (*c).to_owned()).collect();
    for node in 0..settings.nodes {
        for channel in &stream_channels {
            let last = Arc::new(AtomicU64::new(0));
            // SSE from the even nodes, long-poll from the odd ones.
            let live = if node % 2 == 0 {
                streams::Live::Sse
            } else {
                streams::Live::LongPoll
            };
            followers.push(streams::follower(
                node,
                live,
                channel.clone(),
                urls.clone(),
                recorder.clone(),
                Arc::clone(&last),
                stop_followers.clone(),
            ));
            followed.push((channel.clone(), last));
            let last = Arc::new(AtomicU64::new(0));
            followers.push(clients::subscriber(
                node,
                channel.clone(),
                urls.clone(),
                recorder.clone(),
                Arc::clone(&last),
                stop_followers.clone(),
            ));
            followed.push((channel.clone(), last));
        }
    }
    let producers: Vec<_> = stream_channels
        .iter()
        .enumerate()
        .map(|(i, channel)| {
            streams::producer(
                i,
                channel.clone(),
                urls.clone(),
                recorder.clone(),
                stop_publishers.clone(),
            )
        })
        .collect();
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|worker| {
            clients::publisher(
                worker,
                channels[worker % channels.len()].clone(),
                urls.clone(),
                recorder.clone(),
                stop_publishers.clone(),
            )
        })
        .collect();

    let mut world = faults::World {
        nodes: &mut nodes,
        cluster: &cluster,
        channels: &channels,
        recorder: &recorder,
        urls: &urls,
    };
    let mut next_free = start;
    for planned in &plan {
        let at = (start + planned.at).max(next_free);
        if at + planned.hold >= start + settings.duration {
            break;
        }
        world.wait_until(at).await?;
        world.inject(planned).await?;
        next_free = Instant::now() + planned.gap;
    }
    world.wait_until(start + settings.duration).await?;
    world.heal().await?;

    stop_publishers.cancel();
    for task in publishers.into_iter().chain(producers) {
        let _ = task.await;
    }
    let judged: Vec<String> = channels.iter().chain(&stream_channels).cloned().collect();
    // The heads are final now (nothing is published any more); the
    // subscribers get some time to reach them.
    let heads = read_final_state(&cluster.url(), epoch_ms, &judged).await?;
    let deadline = Instant::now() + CATCH_UP;
    for (channel, last) in &followed {
        let head = heads
            .channels
            .get(channel)
            .map_or(0, |m| m.iter().map(|m| m.offset).max().unwrap_or(0));
        while last.load(std::sync::atomic::Ordering::SeqCst) < head && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    stop_followers.cancel();
    for task in followers {
        let _ = task.await;
    }
    let _ = monitor.await;
    let _ = observer.await;
    // The state the checker judges is read after every client stopped: the
    // holder's trimming goes on while subscribers catch up, and a
    // truncation one of them saw must not be judged against an earliest
    // read before it.
    let final_state = read_final_state(&cluster.url(), epoch_ms, &judged).await?;

    let history = recorder.events();
    let mut report = check(&history, &final_state);
    report.settings = Some(settings.recorded());
    if let Some(out) = &settings.out {
        let file = std::fs::File::create(out.join("history.jsonl"))?;
        write_jsonl(std::io::BufWriter::new(file), &history)?;
        std::fs::write(
            out.join("final.json"),
            serde_json::to_vec_pretty(&final_state)?,
        )?;
        std::fs::write(out.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
    }
    for node in &mut nodes {
        node.kill().await;
    }
    for node in nodes {
        node.proxy.shutdown().await;
    }
    drop(cluster);
    Ok(report)
}

/// The database's clock now, in ms since the Unix epoch.
async fn db_now_ms(url: &str) -> anyhow::Result<i64> {
    let client = database::connect(url).await?;
    let row = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Every stored message, as `(offset, id from data, token, published_at)`
/// per channel; times in ms since `epoch_ms`.
async fn read_final_state(
    url: &str,
    epoch_ms: i64,
    channels: &[String],
) -> anyhow::Result<FinalState> {
    let mut last_error = None;
    for _ in 0..20 {
        match database::connect(url).await {
            Ok(mut client) => {
                // One snapshot for the messages and the earliest offsets:
                // the holder's trimming goes on while this reads, and two
                // statements apart would see different moments.
                let snapshot = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await?;
                let rows = snapshot
                    .query(
                        "SELECT channel, \"offset\", data, token, \
                         (extract(epoch FROM published_at) * 1000)::bigint \
                         FROM messages ORDER BY channel, \"offset\"",
                        &[],
                    )
                    .await?;
                let mut state = FinalState::default();
                for channel in channels {
                    state.channels.insert(channel.clone(), Vec::new());
                }
                for row in snapshot
                    .query("SELECT name, trimmed_through + 1 FROM channels", &[])
                    .await?
                {
                    let earliest: i64 = row.get(1);
                    state.earliest.insert(row.get(0), u64::try_from(earliest)?);
                }
                for row in rows {
                    let channel: String = row.get(0);
                    let offset: i64 = row.get(1);
                    let data: String = row.get(2);
                    let token: i64 = row.get(3);
                    let published: i64 = row.get(4);
                    let value: serde_json::Value =
                        serde_json::from_str(&data).unwrap_or(serde_json::Value::Null);
                    let id = value["id"]
                        .as_str()
                        .map_or_else(|| data.clone(), str::to_owned);
                    state
                        .channels
                        .entry(channel)
                        .or_default()
                        .push(StoredMessage {
                            offset: u64::try_from(offset)?,
                            id,
                            token: u64::try_from(token)?,
                            published_at_ms: u64::try_from((published - epoch_ms).max(0))?,
                        });
                }
                snapshot.commit().await?;
                return Ok(state);
            }
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no connection")))
}
