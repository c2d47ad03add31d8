//! `herald bench publish`: a load generator for the publish path, in the
//! spirit of pgbench and redis-benchmark.
//!
//! C workers share a counter up to M messages; message `i` goes to channel
//! `bench:<run id>-<i % N>`, where the run id is fresh per run (8 hex
//! digits). The channels stay on the server after the run; the `bench:`
//! prefix tells them apart from application channels. Each request
//! has a timeout, a 503 is retried after its `Retry-After` a bounded number
//! of times, so the run always ends.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use herald_core::ChannelName;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{self, Api, ApiError, ClientError, ServerArg};

/// Metric name of the server's histogram of messages per committed batch.
const BATCH_METRIC: &str = "herald_writer_batch_messages";

/// Highest latency the histogram tracks, in µs (one hour); longer ones are
/// recorded as this.
const MAX_TRACKED_LATENCY_US: u64 = 3_600_000_000;

/// Wait before retrying a 503 that carries no `Retry-After`.
const DEFAULT_RETRY_WAIT: Duration = Duration::from_millis(100);

/// Subcommands of `herald bench`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum BenchCommand {
    /// Publish M messages from C concurrent workers; report throughput,
    /// latency percentiles and the server's mean commit batch size. Exits
    /// non-zero when any message failed.
    Publish(BenchPublishArgs),
    /// S subscribers (SSE or WebSocket) over K channels, a publisher at R
    /// messages/s for D seconds; report deliveries/s, publish→delivery
    /// latency, missed and duplicated messages (must be 0) and the
    /// server's resident memory per subscriber. Exits non-zero when any
    /// message was missed or duplicated.
    Fanout(crate::fanout::BenchFanoutArgs),
}

/// Flags of `herald bench publish`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchPublishArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Channels to spread the messages over, named `bench:<run id>-<i>`;
    /// they stay on the server after the run.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    channels: u64,
    /// Concurrent workers, each with one request in flight.
    #[arg(long, value_name = "C", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// Messages to publish in total.
    #[arg(long, value_name = "M", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Size of each message's `data` JSON in bytes: a string padded to it.
    #[arg(long, value_name = "BYTES", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    size: u32,
    /// Timeout of one request, e.g. `10s` or `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Messages per request: above 1, each request is a batch publish
    /// (`POST /v1/messages`) of this many messages, all to one channel, and
    /// latencies are per request.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch: u64,
    /// With `--batch`: message `i` of the run goes to channel `i % N`, so
    /// one request spreads over consecutive channels (e.g. to give many
    /// channels a first message quickly), instead of all to one channel.
    #[arg(long, requires = "batch")]
    spread: bool,
    /// Retries of one message after a 503 before it counts as an error.
    #[arg(long, value_name = "N", default_value_t = 10)]
    max_retries: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs a `herald bench` subcommand.
pub(crate) async fn run(command: BenchCommand) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Publish(args) => run_publish(args).await,
        BenchCommand::Fanout(args) => crate::fanout::run_fanout(args).await,
    }
}

/// A JSON value whose text is exactly `size` bytes: a string of `x` padded
/// to that size (the number `0` for one byte).
pub(crate) fn payload(size: usize) -> String {
    if size < 2 {
        return "0".to_owned();
    }
    let mut text = String::with_capacity(size);
    text.push('"');
    text.extend(std::iter::repeat_n('x', size - 2));
    text.push('"');
    text
}

/// What the workers counted, merged.
#[derive(Debug)]
struct Tally {
    ok: u64,
    retries: u64,
    errors: BTreeMap<String, u64>,
    /// Latency of each successful request, in µs.
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            ok: 0,
            retries: 0,
            errors: BTreeMap::new(),
            latency_us: Histogram::new_with_bounds(1, MAX_TRACKED_LATENCY_US, 3)?,
        })
    }

    fn merge(&mut self, other: Tally) -> anyhow::Result<()> {
        self.ok += other.ok;
        self.retries += other.retries;
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
        self.latency_us.add(&other.latency_us)?;
        Ok(())
    }
}

/// What every worker shares.
struct Work {
    api: Api,
    /// The request body `{"data": <payload>}`.
    body: Box<RawValue>,
    /// The messages path of each bench channel.
    paths: Vec<String>,
    /// The bench channels' names.
    names: Vec<String>,
    /// Messages per request (1: single publishes).
    batch: u64,
    /// A batch's messages go to consecutive channels (`--spread`).
    spread: bool,
    /// The payload (`data`) text.
    payload: String,
    /// Index of the next message to publish.
    next: AtomicU64,
    total: u64,
    max_retries: u32,
    timeout: Duration,
}

/// Publishes messages until the shared counter reaches the total.
async fn worker(work: Arc<Work>) -> anyhow::Result<Tally> {
    let mut tally = Tally::new()?;
    let channels = work.paths.len() as u64;
    loop {
        let i = work.next.fetch_add(work.batch, Ordering::Relaxed);
        if i >= work.total {
            return Ok(tally);
        }
        // Messages in this request.
        let n = work.batch.min(work.total - i);
        let index = usize::try_from((i / work.batch) % channels)?;
        let (path, body) = if work.batch > 1 {
            let entry =
                |channel: &str| format!("{{\"channel\":\"{channel}\",\"data\":{}}}", work.payload);
            let entries = if work.spread {
                (i..i + n)
                    .map(|m| Ok(entry(&work.names[usize::try_from(m % channels)?])))
                    .collect::<anyhow::Result<Vec<_>>>()?
                    .join(",")
            } else {
                vec![entry(&work.names[index]); usize::try_from(n)?].join(",")
            };
            (
                "/v1/messages",
                RawValue::from_string(format!("{{\"messages\":[{entries}]}}"))?,
            )
        } else {
            (work.paths[index].as_str(), work.body.clone())
        };
        let mut attempt = 0;
        loop {
            let sent = Instant::now();
            let result = work
                .api
                .post_json::<RawValue, serde::de::IgnoredAny>(path, &body, None)
                .await;
            match result {
                Ok(_) => {
                    let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                    tally.latency_us.saturating_record(us.max(1));
                    tally.ok += n;
                }
                Err(ClientError::Api(e)) if retry_here(&e) && attempt < work.max_retries => {
                    attempt += 1;
                    tally.retries += 1;
                    let wait = e
                        .retry_after
                        .unwrap_or(DEFAULT_RETRY_WAIT)
                        .min(work.timeout);
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Err(e) => *tally.errors.entry(e.code()).or_default() += n,
            }
            break;
        }
    }
}

/// `true` for a 503 that the same node may succeed on later. `not_holder`
/// (a standby) and `draining` (a node shutting down) carry 503 too, but
/// asking that node again is futile.
fn retry_here(e: &ApiError) -> bool {
    e.status == 503 && !matches!(e.code.as_str(), "not_holder" | "draining")
}

/// Runs `herald bench publish`.
async fn run_publish(args: BenchPublishArgs) -> anyhow::Result<ExitCode> {
    let workers = u64::from(args.concurrency).min(args.messages);
    let http = args
        .server
        .http_builder()?
        .timeout(args.timeout)
        .pool_max_idle_per_host(usize::try_from(workers)?)
        .build()?;
    let api =
        Api::new(&args.server.server, http).with_credential(args.server.api_key.as_deref())?;
    let run_id = format!("{:08x}", rand::random::<u32>());
    let names = (0..args.channels.min(args.messages))
        .map(|i| ChannelName::new(format!("{}{i}", channel_prefix(&run_id))))
        .collect::<Result<Vec<_>, _>>()?;
    let paths = names.iter().map(client::messages_path).collect();
    let data = payload(usize::try_from(args.size)?);
    let body = RawValue::from_string(format!("{{\"data\":{data}}}"))?;

    let before = match scrape_batch_stats(&api).await {
        // A server that has committed nothing yet has no histogram: zero.
        Ok(stats) => Some(stats.unwrap_or(BatchStats {
            sum: 0.0,
            count: 0.0,
        })),
        Err(ClientError::Api(_)) => None,
        Err(e) => return Err(anyhow::Error::new(e).context("cannot reach the server")),
    };
    let work = Arc::new(Work {
        api: api.clone(),
        body,
        paths,
        names: names.iter().map(|n| n.as_str().to_owned()).collect(),
        batch: args.batch,
        spread: args.spread,
        payload: data,
        next: AtomicU64::new(0),
        total: args.messages,
        max_retries: args.max_retries,
        timeout: args.timeout,
    });
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..workers {
        set.spawn(worker(Arc::clone(&work)));
    }
    let mut tally = Tally::new()?;
    while let Some(done) = set.join_next().await {
        tally.merge(done??)?;
    }
    let elapsed = started.elapsed();
    let after = scrape_batch_stats(&api).await.unwrap_or(None);

    let report = Report::new(&args, run_id, &tally, elapsed, mean_batch(before, after));
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        write!(out, "{}", report.render_text())?;
    }
    out.flush()?;
    Ok(if report.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The `_sum` and `_count` of the batch-size histogram, summed over its
/// label sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BatchStats {
    /// Messages committed.
    pub(crate) sum: f64,
    /// Batches committed.
    pub(crate) count: f64,
}

/// Scrapes `/metrics`; `None` when the text has no batch-size histogram.
async fn scrape_batch_stats(api: &Api) -> Result<Option<BatchStats>, ClientError> {
    Ok(parse_batch_stats(&api.get_text("/metrics").await?))
}

/// Finds `herald_writer_batch_messages_sum` and `_count` in Prometheus
/// text, adding up the samples of all label sets.
pub(crate) fn parse_batch_stats(text: &str) -> Option<BatchStats> {
    let (mut sum, mut count) = (None::<f64>, None::<f64>);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let slot = match line[..name_end].strip_prefix(BATCH_METRIC) {
            Some("_sum") => &mut sum,
            Some("_count") => &mut count,
            _ => continue,
        };
        // The value follows the name, or the label set when there is one.
        let rest = if line[name_end..].starts_with('{') {
            line.rfind('}').map_or("", |end| &line[end + 1..])
        } else {
            &line[name_end..]
        };
        if let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *slot = Some(slot.unwrap_or(0.0) + value);
        }
    }
    Some(BatchStats {
        sum: sum?,
        count: count?,
    })
}

/// Mean messages per batch committed between two scrapes.
pub(crate) fn mean_batch(before: Option<BatchStats>, after: Option<BatchStats>) -> Option<f64> {
    let (before, after) = (before?, after?);
    let batches = after.count - before.count;
    (batches > 0.0).then(|| (after.sum - before.sum) / batches)
}

/// Latency percentiles, in ms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    #[serde(rename = "p99.9")]
    p99_9: f64,
    max: f64,
}

impl Latency {
    /// Percentiles of a histogram of µs; `None` when it is empty.
    fn from_histogram(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}

/// What every bench channel's name starts with, before the run id.
pub(crate) const BENCH_CHANNEL_PREFIX: &str = "bench:";

/// The names of one run's channels start with this: `bench:<run id>-`,
/// followed by the channel's index from 0.
fn channel_prefix(run_id: &str) -> String {
    format!("{BENCH_CHANNEL_PREFIX}{run_id}-")
}

/// The outcome of a run, as printed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    run_id: String,
    /// The run's channels are this followed by 0, 1, ...: `bench:<run id>-`.
    channel_prefix: String,
    channels: u64,
    concurrency: u32,
    size_bytes: u32,
    /// Messages published successfully.
    messages: u64,
    /// Messages that failed.
    errors: u64,
    errors_by_code: BTreeMap<String, u64>,
    /// 503 answers that were retried.
    retries: u64,
    elapsed_s: f64,
    throughput_msgs_per_s: f64,
    /// Payload (`data`) bytes per second, in MB (10^6 bytes).
    throughput_mb_per_s: f64,
    /// `null` when no message succeeded.
    latency_ms: Option<Latency>,
    /// Absent when the server exposes no batch-size histogram.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_mean_batch_messages: Option<f64>,
}

/// `x` rounded to `digits` decimals.
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

impl Report {
    fn new(
        args: &BenchPublishArgs,
        run_id: String,
        tally: &Tally,
        elapsed: Duration,
        server_mean_batch_messages: Option<f64>,
    ) -> Self {
        let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let per_s = tally.ok as f64 / secs;
        Self {
            channel_prefix: channel_prefix(&run_id),
            run_id,
            channels: args.channels,
            concurrency: args.concurrency,
            size_bytes: args.size,
            messages: tally.ok,
            errors: tally.errors.values().sum(),
            errors_by_code: tally.errors.clone(),
            retries: tally.retries,
            elapsed_s: round(elapsed.as_secs_f64(), 3),
            throughput_msgs_per_s: round(per_s, 1),
            throughput_mb_per_s: round(per_s * f64::from(args.size) / 1e6, 3),
            latency_ms: Latency::from_histogram(&tally.latency_us),
            server_mean_batch_messages: server_mean_batch_messages.map(|m| round(m, 2)),
        }
    }

    /// The report as aligned text lines.
    pub(crate) fn render_text(&self) -> String {
        let mut s = format!(
            "run           {} ({} channel{}, {} worker{}, {}-byte data)\n",
            self.run_id,
            self.channels,
            plural(self.channels),
            self.concurrency,
            plural(u64::from(self.concurrency)),
            self.size_bytes,
        );
        let last = match self.channels {
            0 | 1 => String::new(),
            n => format!(" to {}{}", self.channel_prefix, n - 1),
        };
        s.push_str(&format!(
            "channels      {}0{last} (they stay on the server)\n",
            self.channel_prefix
        ));
        s.push_str(&format!(
            "messages      {} published, {} errors, {} retries\n",
            self.messages, self.errors, self.retries
        ));
        s.push_str(&format!("elapsed       {:.3} s\n", self.elapsed_s));
        s.push_str(&format!(
            "throughput    {:.1} messages/s, {:.3} MB/s\n",
            self.throughput_msgs_per_s, self.throughput_mb_per_s
        ));
        match &self.latency_ms {
            Some(l) => s.push_str(&format!(
                "latency (ms)  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}\n",
                l.p50, l.p90, l.p99, l.p99_9, l.max
            )),
            None => s.push_str("latency (ms)  n/a (no message published)\n"),
        }
        if let Some(mean) = self.server_mean_batch_messages {
            s.push_str(&format!(
                "server batch  {mean:.2} messages per commit (mean)\n"
            ));
        }
        if !self.errors_by_code.is_empty() {
            let by_code: Vec<String> = self
                .errors_by_code
                .iter()
                .map(|(code, n)| format!("{code} {n}"))
                .collect();
            s.push_str(&format!("errors        {}\n", by_code.join(", ")));
        }
        s
    }
}

/// `"s"` unless `n` is 1.
fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn retries_only_where_the_same_node_may_succeed() {
        let e = |status, code: &str| {
            crate::client::decode_error(
                status,
                None,
                format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#).as_bytes(),
            )
        };
        assert!(retry_here(&e(503, "queue_full")));
        assert!(retry_here(&e(503, "storage_unavailable")));
        assert!(!retry_here(&e(503, "not_holder")));
        assert!(!retry_here(&e(503, "draining")));
        assert!(!retry_here(&e(400, "invalid_json")));
    }

    #[test]
    fn payload_has_the_asked_size_and_is_json() {
        for size in [1, 2, 3, 200, 4096] {
            let p = payload(size);
            assert_eq!(p.len(), size);
            serde_json::from_str::<serde_json::Value>(&p).unwrap();
        }
    }

    #[test]
    fn parses_batch_histogram_sum_and_count() {
        let text = "\
# HELP herald_writer_batch_messages Messages per committed batch.
# TYPE herald_writer_batch_messages histogram
herald_writer_batch_messages_bucket{le=\"1\"} 3
herald_writer_batch_messages_bucket{le=\"+Inf\"} 10
herald_writer_batch_messages_sum 57
herald_writer_batch_messages_count 10
herald_writer_batch_messages_sum_other 1
herald_writer_batch_messages_total 99
";
        assert_eq!(
            parse_batch_stats(text),
            Some(BatchStats {
                sum: 57.0,
                count: 10.0
            })
        );
        // Label sets (spaces and braces in values too) add up; timestamps are ignored.
        let text = "\
herald_writer_batch_messages_sum{node=\"a b\",x=\"}\"} 1.5e1 1700000000000
herald_writer_batch_messages_sum{node=\"c\"} 5
herald_writer_batch_messages_count{node=\"a b\",x=\"}\"} 3
herald_writer_batch_messages_count{node=\"c\"} 1
";
        assert_eq!(
            parse_batch_stats(text),
            Some(BatchStats {
                sum: 20.0,
                count: 4.0
            })
        );
        assert_eq!(
            parse_batch_stats("herald_writer_batch_messages_sum 3\n"),
            None
        );
        assert_eq!(parse_batch_stats("other_sum 1\nother_count 1\n"), None);
    }

    #[test]
    fn mean_batch_uses_the_delta() {
        let at = |sum, count| Some(BatchStats { sum, count });
        assert_eq!(mean_batch(at(10.0, 5.0), at(110.0, 15.0)), Some(10.0));
        assert_eq!(mean_batch(at(10.0, 5.0), at(10.0, 5.0)), None);
        assert_eq!(mean_batch(None, at(1.0, 1.0)), None);
        assert_eq!(mean_batch(at(1.0, 1.0), None), None);
    }

    #[test]
    fn latency_percentiles_from_a_histogram() {
        let mut h = Histogram::<u64>::new_with_bounds(1, MAX_TRACKED_LATENCY_US, 3).unwrap();
        assert_eq!(Latency::from_histogram(&h), None);
        for ms in 1..=1000u64 {
            h.record(ms * 1000).unwrap();
        }
        let l = Latency::from_histogram(&h).unwrap();
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.002;
        assert!(near(l.p50, 500.0), "{l:?}");
        assert!(near(l.p90, 900.0), "{l:?}");
        assert!(near(l.p99, 990.0), "{l:?}");
        assert!(near(l.p99_9, 999.0), "{l:?}");
        assert!(near(l.max, 1000.0), "{l:?}");
    }

    /// The flags of a default run, as the command line gives them.
    fn default_args() -> BenchPublishArgs {
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            bench: BenchCommand,
        }
        match Cli::parse_from(["herald", "publish"]).bench {
            BenchCommand::Publish(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn sample_report() -> Report {
        let mut tally = Tally::new().unwrap();
        tally.ok = 9_998;
        tally.retries = 4;
        tally.errors.insert("timeout".into(), 1);
        tally.errors.insert("unavailable".into(), 1);
        for _ in 0..9_998 {
            tally.latency_us.record(1_500).unwrap();
        }
        Report::new(
            &default_args(),
            "0badcafe".into(),
            &tally,
            Duration::from_millis(2_500),
            Some(12.345),
        )
    }

    #[test]
    fn defaults_match_the_documentation() {
        let args = default_args();
        assert_eq!(
            (args.channels, args.concurrency, args.messages, args.size),
            (1, 16, 10_000, 200)
        );
        assert_eq!(args.timeout, Duration::from_secs(10));
        assert!(!args.json);
    }

    #[test]
    fn renders_the_text_report() {
        let text = sample_report().render_text();
        let want = "\
run           0badcafe (1 channel, 16 workers, 200-byte data)
channels      bench:0badcafe-0 (they stay on the server)
messages      9998 published, 2 errors, 4 retries
elapsed       2.500 s
throughput    3999.2 messages/s, 0.800 MB/s
latency (ms)  p50 1.500  p90 1.500  p99 1.500  p99.9 1.500  max 1.500
server batch  12.35 messages per commit (mean)
errors        timeout 1, unavailable 1
";
        assert_eq!(text, want);
    }

    #[test]
    fn renders_the_json_report() {
        let json: serde_json::Value = serde_json::to_value(sample_report()).unwrap();
        assert_eq!(json["run_id"], "0badcafe");
        assert_eq!(json["channel_prefix"], "bench:0badcafe-");
        assert!(ChannelName::new(format!("{}0", json["channel_prefix"].as_str().unwrap())).is_ok());
        assert_eq!(json["messages"], 9_998);
        assert_eq!(json["errors"], 2);
        assert_eq!(json["errors_by_code"]["timeout"], 1);
        assert_eq!(json["throughput_msgs_per_s"], 3999.2);
        assert_eq!(json["latency_ms"]["p99.9"], 1.5);
        assert_eq!(json["server_mean_batch_messages"], 12.35);

        let mut report = sample_report();
        report.server_mean_batch_messages = None;
        report.latency_ms = None;
        let json = serde_json::to_value(&report).unwrap();
        assert!(json.get("server_mean_batch_messages").is_none());
        assert!(json["latency_ms"].is_null());
        assert!(report.render_text().contains("n/a"));
        assert!(!report.render_text().contains("server batch"));
    }
}
