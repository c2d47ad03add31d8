//! Latency of `LeaseStore::renew` on a PostgreSQL holder, idle and while
//! publishers saturate the writer.
//!
//! ```text
//! cargo run --release -p herald-storage --example renewal_latency -- <database url> \
//!     [--renewals N] [--pause-ms MS] [--appenders N] [--hot-hold-ms MS] [--hot-gap-ms MS]
//!     [--trim-keep N] [--trim-pause-ms MS] [--trim-interval-ms MS] [--json]
//! ```
//!
//! The URL names a role that may create databases. The benchmark creates a
//! fresh database `herald_bench_<16 hex digits>` on that server, works only
//! there, and drops it at the end (also after an error or Ctrl-C).
//!
//! One [`PostgresStorage`] acquires the writer lease and sends renewals one
//! after the other, each followed by a short pause (`--pause-ms`, 20 ms),
//! in two phases of `--renewals` renewals each (200):
//!
//! 1. **idle**: nothing else uses the database.
//! 2. **loaded**: `--appenders` tasks (64) append one message per fenced
//!    write, as fast as they can, through clones of the same storage, so
//!    they share its pool of 10 connections as a node's publishers do. One
//!    appender in eight writes to the channel `hot`, the others to channels
//!    of their own. Meanwhile another session takes `hot`'s row
//!    `FOR UPDATE` in cycles: held for `--hot-hold-ms` (1500), then free
//!    for `--hot-gap-ms` (500). While it is held, the fenced write that
//!    reaches `hot` first keeps the lease row `FOR KEY SHARE` (and the
//!    lease's advisory lock) and waits on that channel row, the other
//!    fenced writes queue on the advisory lock and the remaining appenders
//!    wait for a pool connection. While it is free, the appenders keep the
//!    server busy. A renewal must not wait behind either.
//!
//! With `--trim-keep N`, the loaded phase also runs retention's trimming
//! as fast as messages arrive: one task trims every channel to its newest
//! N messages (`Storage::trim`, 500 rows per transaction), sweep after
//! sweep. By default it never pauses; `--trim-pause-ms` (a pause after each
//! transaction that removed something) and `--trim-interval-ms` (a pause
//! after each sweep) pace it as the server's trimming task does with
//! `--retention-trim-pause` and `--retention-trim-interval` (10 ms and
//! 1000 ms there by default). Run once with and once without it to see what trimming
//! costs renewals and appends.
//!
//! Pool timeouts: a fenced write waits on `hot` for up to one hold, and the
//! writes queued behind it about as long, so the pool's `statement_timeout`
//! and `pool_wait_timeout` are set to the hold + 5 s: no queued write is
//! cancelled, and the appenders stay saturated for the whole phase. The
//! renewal connection keeps its defaults (statement timeout 5 s, abandoned
//! 1 s later), so a renewal that did wait would show as a latency of
//! seconds or as an error.
//!
//! Each phase starts with one renewal that is not counted (the first one
//! opens the renewal connection). A latency is the time from calling
//! `renew` until it returns, measured on the client, recorded in
//! microseconds and reported in milliseconds; failed renewals are counted
//! as errors and left out of the percentiles. The loaded phase also
//! reports the renewals that ran entirely while the hot row was held, the
//! appends per second over the measured window, and what a sampler of
//! `pg_stat_activity` (every 100 ms) saw: how often a fenced write was
//! waiting on a row lock, and the most fenced writes waiting on the
//! advisory lock at once. The ratios loaded/idle compare the two phases of
//! the same run; there are no pass/fail thresholds. A phase stops early
//! after 20 s.

use herald_storage::MessageLog;
use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use herald_core::{Candidate, ChannelName, Lease, NewMessage, DEFAULT_LEASE_NAME};
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::{Acquire, Error, LeaseStore};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_postgres::{Client, Config, NoTls};

/// Command-line synopsis, printed on a usage error.
const USAGE: &str = "usage: renewal_latency <database url> [--renewals N] [--pause-ms MS] \
     [--appenders N] [--hot-hold-ms MS] [--hot-gap-ms MS] [--trim-keep N] [--trim-pause-ms MS] \
     [--trim-interval-ms MS] [--json]";

/// The ttl every renewal asks for.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// The channel whose row the other session locks.
const HOT_CHANNEL: &str = "hot";
/// One appender in this many writes to [`HOT_CHANNEL`].
const HOT_EVERY: usize = 8;
/// Channels each of the other appenders cycles through.
const CHANNELS_PER_APPENDER: usize = 8;
/// Longest a phase's renewals may take before the phase stops early.
const PHASE_LIMIT: Duration = Duration::from_secs(20);
/// Time the load runs before the loaded phase starts measuring.
const LOAD_WARMUP: Duration = Duration::from_millis(500);
/// How often the sampler reads `pg_stat_activity`.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for the load tasks to finish once told to stop; the rest
/// are aborted.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(10);
/// Longest wait for connecting, creating or dropping the database.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause of an appender after a failed append, so that a broken database
/// does not turn it into a busy loop.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Margin of the pool timeouts above the hot row's hold time.
const POOL_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);
/// Largest `--hot-hold-ms` accepted.
const MAX_HOT_HOLD: Duration = Duration::from_secs(10);

/// Takes the hot channel's row lock in the other session.
const HOT_LOCK_SQL: &str = "SELECT 1 FROM channels WHERE name = $1 FOR UPDATE";

/// Fenced writes waiting on a row lock while bumping a channel's head (the
/// lease row stays `FOR KEY SHARE` meanwhile), and fenced writes waiting on
/// the lease's advisory lock, in this database.
const WAITERS_SQL: &str = "SELECT \
     count(*) FILTER (WHERE wait_event_type = 'Lock' \
         AND wait_event IN ('transactionid', 'tuple') \
         AND query LIKE 'INSERT INTO channels%'), \
     count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'advisory') \
     FROM pg_stat_activity WHERE datname = current_database()";

/// Any error of this program, as text for the user.
type BoxError = Box<dyn StdError + Send + Sync>;
/// The result of this program's fallible steps.
type BenchResult<T> = Result<T, BoxError>;

/// The command line.
#[derive(Debug, Clone)]
struct Args {
    /// Where to create the benchmark's database.
    url: String,
    /// Renewals per phase.
    renewals: usize,
    /// Pause after each renewal.
    pause: Duration,
    /// Appender tasks in the loaded phase.
    appenders: usize,
    /// How long the other session holds the hot row per cycle.
    hot_hold: Duration,
    /// How long the hot row stays free between holds.
    hot_gap: Duration,
    /// Trim every channel to this many newest messages during the loaded
    /// phase, continuously.
    trim_keep: Option<u64>,
    /// Pause of the trimming task after each transaction that removed
    /// something (0: none).
    trim_pause: Duration,
    /// Pause of the trimming task after each sweep (0: none).
    trim_interval: Duration,
    /// Print one JSON object instead of a table.
    json: bool,
}

impl Args {
    /// Parses the arguments after the program name.
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut url = None;
        let mut parsed = Self {
            url: String::new(),
            renewals: 200,
            pause: Duration::from_millis(20),
            appenders: 64,
            hot_hold: Duration::from_millis(1500),
            hot_gap: Duration::from_millis(500),
            trim_keep: None,
            trim_pause: Duration::ZERO,
            trim_interval: Duration::ZERO,
            json: false,
        };
        while let Some(arg) = args.next() {
            let mut number = |flag: &str| -> Result<u64, String> {
                let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
                value
                    .parse()
                    .map_err(|_| format!("{flag}: {value:?} is not a whole number"))
            };
            match arg.as_str() {
                "--renewals" => parsed.renewals = to_usize(number("--renewals")?),
                "--pause-ms" => parsed.pause = Duration::from_millis(number("--pause-ms")?),
                "--appenders" => parsed.appenders = to_usize(number("--appenders")?),
                "--hot-hold-ms" => {
                    parsed.hot_hold = Duration::from_millis(number("--hot-hold-ms")?);
                }
                "--hot-gap-ms" => parsed.hot_gap = Duration::from_millis(number("--hot-gap-ms")?),
                "--trim-keep" => parsed.trim_keep = Some(number("--trim-keep")?),
                "--trim-pause-ms" => {
                    parsed.trim_pause = Duration::from_millis(number("--trim-pause-ms")?);
                }
                "--trim-interval-ms" => {
                    parsed.trim_interval = Duration::from_millis(number("--trim-interval-ms")?);
                }
                "--json" => parsed.json = true,
                "-h" | "--help" => return Err(String::new()),
                flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
                _ if url.is_none() => url = Some(arg),
                _ => return Err(format!("unexpected argument {arg:?}")),
            }
        }
        parsed.url = url.ok_or("the database URL is missing")?;
        if parsed.renewals == 0 {
            return Err("--renewals must be at least 1".into());
        }
        if parsed.appenders == 0 {
            return Err("--appenders must be at least 1".into());
        }
        if parsed.hot_hold.is_zero() || parsed.hot_hold > MAX_HOT_HOLD {
            return Err(format!(
                "--hot-hold-ms must be between 1 and {}",
                MAX_HOT_HOLD.as_millis()
            ));
        }
        Ok(parsed)
    }

    /// The storage settings of the benchmark: defaults, except the pool
    /// timeouts, which outlast a hold of the hot row (see the module docs).
    fn options(&self) -> PostgresOptions {
        PostgresOptions {
            statement_timeout: self.hot_hold + POOL_TIMEOUT_MARGIN,
            pool_wait_timeout: self.hot_hold + POOL_TIMEOUT_MARGIN,
            ..PostgresOptions::default()
        }
    }
}

/// A count from the command line as `usize`, saturating.
fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Milliseconds of a duration, as a float.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whole milliseconds of a duration, saturating.
fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Renewal latencies of one phase (or a subset of one).
struct Latencies {
    /// Successful renewals, in microseconds.
    hist: Histogram<u64>,
    /// Failed renewals.
    errors: u64,
    /// The first failure, as text.
    first_error: Option<String>,
}

impl Latencies {
    /// An empty record: 1 µs to 1 min, three significant digits.
    fn new() -> BenchResult<Self> {
        Ok(Self {
            hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            errors: 0,
            first_error: None,
        })
    }

    /// Records one renewal that took `took`.
    fn record(&mut self, took: Duration, outcome: &Result<(), Error>) {
        match outcome {
            Ok(()) => {
                let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                self.hist.saturating_record(us.max(1));
            }
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// Count, errors and percentiles in ms.
    fn summary(&self) -> Summary {
        let at = |q: f64| (!self.hist.is_empty()).then(|| us_to_ms(self.hist.value_at_quantile(q)));
        Summary {
            count: self.hist.len(),
            errors: self.errors,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: (!self.hist.is_empty()).then(|| us_to_ms(self.hist.max())),
            first_error: self.first_error.clone(),
        }
    }
}

/// Microseconds as milliseconds.
fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// What a [`Latencies`] reports; `None` percentiles when nothing succeeded.
#[derive(Debug, Clone)]
struct Summary {
    /// Successful renewals.
    count: u64,
    /// Failed renewals.
    errors: u64,
    /// Median, ms.
    p50: Option<f64>,
    /// 90th percentile, ms.
    p90: Option<f64>,
    /// 99th percentile, ms.
    p99: Option<f64>,
    /// Slowest, ms.
    max: Option<f64>,
    /// The first failure, as text.
    first_error: Option<String>,
}

impl Summary {
    /// The summary as a JSON object.
    fn to_json(&self) -> Value {
        json!({
            "count": self.count,
            "errors": self.errors,
            "p50_ms": self.p50,
            "p90_ms": self.p90,
            "p99_ms": self.p99,
            "max_ms": self.max,
            "first_error": self.first_error,
        })
    }

    /// One row of the human table.
    fn row(&self, label: &str) -> String {
        let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        format!(
            "{label:<22} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9}",
            self.count,
            self.errors,
            cell(self.p50),
            cell(self.p90),
            cell(self.p99),
            cell(self.max)
        )
    }
}

/// The renewals of one phase.
struct Renewals {
    /// Every counted renewal.
    all: Latencies,
    /// The renewals during which the hot row stayed held from start to end
    /// (loaded phase only).
    while_hot: Latencies,
    /// Wall time of the phase's renewals, pauses included.
    elapsed: Duration,
}

/// State of the hot row, shared with the renewal loop: a counter that the
/// session holding the row increments when it takes the row and again when
/// it lets it go, so an odd value means "held" and an unchanged value
/// means "the same hold".
type HotState = Arc<AtomicU64>;

/// Counters of the appenders.
#[derive(Default)]
struct LoadCounters {
    /// Appends committed.
    appended: AtomicU64,
    /// Appends that failed.
    failed: AtomicU64,
    /// The first failure, as text.
    first_error: Mutex<Option<String>>,
    /// Messages removed by the trimming task.
    trimmed: AtomicU64,
    /// Trim transactions that failed.
    trim_failed: AtomicU64,
}

/// What the `pg_stat_activity` sampler saw.
#[derive(Debug, Clone, Copy, Default)]
struct WaitSamples {
    /// Samples taken.
    samples: u64,
    /// Samples in which at least one fenced write waited on a row lock.
    with_row_lock_wait: u64,
    /// Most fenced writes waiting on the lease's advisory lock at once.
    max_advisory_waiters: i64,
}

/// Results of the loaded phase besides its renewals.
struct LoadReport {
    /// Appender tasks.
    appenders: usize,
    /// Appenders writing to the hot channel.
    hot_appenders: usize,
    /// Appends committed during the measured window.
    appends: u64,
    /// Length of the measured window.
    window: Duration,
    /// Appends that failed during the whole phase.
    append_errors: u64,
    /// The first failed append, as text.
    first_append_error: Option<String>,
    /// Holds of the hot row taken during the phase.
    hot_cycles: u64,
    /// Failure of the session holding the hot row, if any.
    hot_error: Option<String>,
    /// What the sampler saw.
    waits: WaitSamples,
    /// Messages trimmed during the measured window (`None` without
    /// `--trim-keep`).
    trimmed: Option<u64>,
    /// Trim transactions that failed during the whole phase.
    trim_errors: u64,
}

impl LoadReport {
    /// Appends per second over the measured window.
    fn appends_per_s(&self) -> f64 {
        let secs = self.window.as_secs_f64();
        if secs > 0.0 {
            self.appends as f64 / secs
        } else {
            0.0
        }
    }
}

/// Everything one run measured.
struct Report {
    /// `server_version` of the server.
    server_version: String,
    /// The settings the storage ran with.
    options: PostgresOptions,
    /// The idle phase.
    idle: Renewals,
    /// The loaded phase.
    loaded: Renewals,
    /// The load of the loaded phase.
    load: LoadReport,
}

/// `a / b`, when both exist and `b` is positive.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

impl Report {
    /// The report as one JSON object.
    fn to_json(&self, args: &Args) -> Value {
        let idle = self.idle.all.summary();
        let loaded = self.loaded.all.summary();
        json!({
            "server_version": self.server_version,
            "settings": {
                "renewals": args.renewals,
                "pause_ms": whole_ms(args.pause),
                "ttl_ms": whole_ms(LEASE_TTL),
                "appenders": self.load.appenders,
                "hot_appenders": self.load.hot_appenders,
                "hot_hold_ms": whole_ms(args.hot_hold),
                "hot_gap_ms": whole_ms(args.hot_gap),
                "pool_size": self.options.pool_size,
                "pool_statement_timeout_ms": whole_ms(self.options.statement_timeout),
                "pool_wait_timeout_ms": whole_ms(self.options.pool_wait_timeout),
                "renew_statement_timeout_ms": whole_ms(self.options.renew_statement_timeout),
            },
            "idle": {
                "renewals": idle.to_json(),
                "elapsed_ms": ms(self.idle.elapsed),
            },
            "loaded": {
                "renewals": loaded.to_json(),
                "renewals_while_hot_row_held": self.loaded.while_hot.summary().to_json(),
                "elapsed_ms": ms(self.loaded.elapsed),
                "appends": self.load.appends,
                "appends_per_s": self.load.appends_per_s(),
                "append_errors": self.load.append_errors,
                "first_append_error": self.load.first_append_error,
                "hot_cycles": self.load.hot_cycles,
                "trim_keep": args.trim_keep,
                "trim_pause_ms": whole_ms(args.trim_pause),
                "trim_interval_ms": whole_ms(args.trim_interval),
                "trimmed": self.load.trimmed,
                "trim_errors": self.load.trim_errors,
                "hot_error": self.load.hot_error,
                "wait_samples": self.load.waits.samples,
                "samples_with_fenced_write_on_row_lock": self.load.waits.with_row_lock_wait,
                "max_advisory_lock_waiters": self.load.waits.max_advisory_waiters,
            },
            "ratio_loaded_over_idle": {
                "p50": ratio(loaded.p50, idle.p50),
                "p99": ratio(loaded.p99, idle.p99),
            },
        })
    }

    /// The report as a short table with a few lines of context.
    fn to_text(&self, args: &Args) -> String {
        let idle = self.idle.all.summary();
        let loaded = self.loaded.all.summary();
        let hot = self.loaded.while_hot.summary();
        let fmt_ratio = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"));
        let mut out = Vec::new();
        out.push(format!(
            "LeaseStore::renew latency, PostgresStorage (PostgreSQL {}), ms",
            self.server_version
        ));
        out.push(format!(
            "{:<22} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9}",
            "phase", "count", "errors", "p50", "p90", "p99", "max"
        ));
        out.push(idle.row("idle"));
        out.push(loaded.row("loaded"));
        out.push(hot.row("  of which hot held"));
        out.push(format!(
            "loaded/idle: p50 {}, p99 {}",
            fmt_ratio(ratio(loaded.p50, idle.p50)),
            fmt_ratio(ratio(loaded.p99, idle.p99))
        ));
        out.push(format!(
            "load: {} appenders ({} on '{HOT_CHANNEL}'), {:.0} appends/s ({} in {:.1} s), {} append errors",
            self.load.appenders,
            self.load.hot_appenders,
            self.load.appends_per_s(),
            self.load.appends,
            self.load.window.as_secs_f64(),
            self.load.append_errors
        ));
        if let Some(trimmed) = self.load.trimmed {
            out.push(format!(
                "trimming: every channel to its newest {} messages, {trimmed} trimmed in the window \
                 ({:.0}/s), {} trim errors",
                args.trim_keep.unwrap_or(0),
                trimmed as f64 / self.load.window.as_secs_f64().max(f64::MIN_POSITIVE),
                self.load.trim_errors
            ));
        }
        out.push(format!(
            "hot row: held {} ms, free {} ms, {} holds; a fenced write waited on a row lock in {} of {} samples; \
             up to {} fenced writes queued on the advisory lock",
            whole_ms(args.hot_hold),
            whole_ms(args.hot_gap),
            self.load.hot_cycles,
            self.load.waits.with_row_lock_wait,
            self.load.waits.samples,
            self.load.waits.max_advisory_waiters
        ));
        out.push(format!(
            "pool: {} connections, statement_timeout {} ms, pool_wait_timeout {} ms; renewal statement timeout {} ms",
            self.options.pool_size,
            whole_ms(self.options.statement_timeout),
            whole_ms(self.options.pool_wait_timeout),
            whole_ms(self.options.renew_statement_timeout)
        ));
        for (what, error) in [
            ("idle renewal", &idle.first_error),
            ("loaded renewal", &loaded.first_error),
            ("append", &self.load.first_append_error),
            ("hot row session", &self.load.hot_error),
        ] {
            if let Some(error) = error {
                out.push(format!("first {what} error: {error}"));
            }
        }
        out.join("\n")
    }
}

/// Parses the command line, runs the benchmark and prints its report.
#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("renewal_latency: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args).await {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json(&args));
            } else {
                println!("{}", report.to_text(&args));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("renewal_latency: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Creates the benchmark's database, runs both phases in it and drops it,
/// whatever happened in between.
async fn run(args: &Args) -> BenchResult<Report> {
    let admin_config: Config = args.url.parse()?;
    let admin = connect(&admin_config).await?;
    let server_version: String = admin
        .query_one("SELECT current_setting('server_version')", &[])
        .await?
        .try_get(0)?;
    let name = format!("herald_bench_{:016x}", rand::random::<u64>());
    let url = database_url(&args.url, &name)?;
    within(
        "CREATE DATABASE",
        admin.batch_execute(&format!("CREATE DATABASE {name}")),
    )
    .await?;
    eprintln!("renewal_latency: created database {name}");

    let mut bench_config = admin_config.clone();
    bench_config.dbname(&name);
    let outcome = tokio::select! {
        outcome = bench(args, &url, &bench_config) => outcome,
        _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
    };

    let dropped = within(
        "DROP DATABASE",
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")),
    )
    .await;
    match &dropped {
        Ok(()) => eprintln!("renewal_latency: dropped database {name}"),
        Err(e) => eprintln!("renewal_latency: could not drop database {name}: {e}"),
    }
    let (idle, loaded, load, options) = outcome?;
    dropped?;
    Ok(Report {
        server_version,
        options,
        idle,
        loaded,
        load,
    })
}

/// Runs `what` with [`ADMIN_TIMEOUT`].
async fn within<T>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> BenchResult<T> {
    match tokio::time::timeout(ADMIN_TIMEOUT, work).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(format!("{what} did not finish within {ADMIN_TIMEOUT:?}").into()),
    }
}

/// Opens a plain session and spawns its connection task.
async fn connect(config: &Config) -> BenchResult<Client> {
    let (client, connection) = within("connecting", config.connect(NoTls)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// `url` with its database replaced by `name`: the path of a
/// `postgres://` or `postgresql://` URL, or an added `dbname=` of a
/// key=value string. Checks the outcome by parsing it.
fn database_url(url: &str, name: &str) -> BenchResult<String> {
    let rewritten = match url.split_once("://") {
        Some((scheme, rest)) if scheme == "postgres" || scheme == "postgresql" => {
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(authority_end);
            let query = tail.find('?').map_or("", |at| &tail[at..]);
            format!("{scheme}://{authority}/{name}{query}")
        }
        _ => format!("{url} dbname={name}"),
    };
    let parsed: Config = rewritten.parse()?;
    if parsed.get_dbname() != Some(name) {
        return Err(format!(
            "could not point the URL at the database {name}; give the URL without a dbname query parameter"
        )
        .into());
    }
    Ok(rewritten)
}

/// The phases' results and the options they ran with.
type Phases = (Renewals, Renewals, LoadReport, PostgresOptions);

/// Connects the holder, acquires the lease and runs both phases.
async fn bench(args: &Args, url: &str, config: &Config) -> BenchResult<Phases> {
    let options = args.options();
    let storage = PostgresStorage::connect(url, options.clone()).await?;
    let candidate = Candidate {
        lease_name: DEFAULT_LEASE_NAME.to_owned(),
        node_id: "bench-holder".to_owned(),
        advertise_url: "http://bench-holder.invalid".to_owned(),
    };
    let lease = match storage.acquire(&candidate, LEASE_TTL).await? {
        Acquire::Acquired { lease, .. } => lease,
        Acquire::Held(info) => {
            return Err(format!("the fresh database's lease is held: {info:?}").into())
        }
    };
    // The hot channel's row must exist for the other session to lock it.
    storage
        .append(&lease, &[message(&ChannelName::new(HOT_CHANNEL)?, 0)?])
        .await?;

    eprintln!("renewal_latency: idle phase");
    storage.renew(&lease, LEASE_TTL).await?;
    let idle = measure_renewals(&storage, &lease, args, None).await?;

    eprintln!("renewal_latency: loaded phase");
    let (loaded, load) = loaded_phase(&storage, &lease, args, config).await?;
    Ok((idle, loaded, load, options))
}

/// A message of one small JSON object to `channel`.
fn message(channel: &ChannelName, seq: u64) -> BenchResult<NewMessage> {
    let data = RawValue::from_string(format!("{{\"seq\":{seq}}}"))?;
    Ok(NewMessage {
        channel: channel.clone(),
        data: herald_core::Payload::Json(Arc::from(data)),
        idempotency_key: None,
        tags: herald_core::Tags::default(),
    })
}

/// Sends `args.renewals` renewals (after one that is not counted), each
/// followed by `args.pause`, and records their latencies. With `hot`, also
/// records apart those that ran entirely within one hold of the hot row.
/// Stops early after [`PHASE_LIMIT`] or when the lease is lost.
async fn measure_renewals(
    storage: &PostgresStorage,
    lease: &Lease,
    args: &Args,
    hot: Option<&AtomicU64>,
) -> BenchResult<Renewals> {
    let mut all = Latencies::new()?;
    let mut while_hot = Latencies::new()?;
    // Not counted: the first renewal of a phase may open a connection.
    let _ = storage.renew(lease, LEASE_TTL).await;
    let started = Instant::now();
    for _ in 0..args.renewals {
        if started.elapsed() > PHASE_LIMIT {
            eprintln!("renewal_latency: phase stopped early after {PHASE_LIMIT:?}");
            break;
        }
        let before = hot.map(|state| state.load(Ordering::SeqCst));
        let sent = Instant::now();
        let outcome = storage.renew(lease, LEASE_TTL).await;
        let took = sent.elapsed();
        let after = hot.map(|state| state.load(Ordering::SeqCst));
        all.record(took, &outcome);
        if matches!((before, after), (Some(b), Some(a)) if a == b && b % 2 == 1) {
            while_hot.record(took, &outcome);
        }
        if let Err(e @ Error::LeaseLost { .. }) = outcome {
            return Err(format!("the lease was lost; cannot go on: {e}").into());
        }
        tokio::time::sleep(args.pause).await;
    }
    Ok(Renewals {
        all,
        while_hot,
        elapsed: started.elapsed(),
    })
}

/// Starts the appenders and the session that cycles the hot row's lock,
/// measures renewals under that load, then stops everything.
async fn loaded_phase(
    storage: &PostgresStorage,
    lease: &Lease,
    args: &Args,
    config: &Config,
) -> BenchResult<(Renewals, LoadReport)> {
    let hot_session = connect(config).await?;
    let sampler_session = connect(config).await?;
    let (stop, stopped) = watch::channel(false);
    let counters = Arc::new(LoadCounters::default());
    let hot_state: HotState = Arc::new(AtomicU64::new(0));

    // Dropping a JoinSet aborts its tasks, so an early return (or Ctrl-C)
    // leaves nothing running.
    let mut appenders = JoinSet::new();
    let mut hot_appenders = 0;
    for id in 0..args.appenders {
        let channels = if id % HOT_EVERY == 0 {
            hot_appenders += 1;
            vec![ChannelName::new(HOT_CHANNEL)?]
        } else {
            (0..CHANNELS_PER_APPENDER)
                .map(|k| ChannelName::new(format!("a{id:03}-{k}")))
                .collect::<Result<_, _>>()?
        };
        appenders.spawn(append_loop(
            storage.clone(),
            lease.clone(),
            channels,
            Arc::clone(&counters),
            stopped.clone(),
        ));
    }
    if let Some(keep) = args.trim_keep {
        appenders.spawn(trim_loop(
            storage.clone(),
            lease.clone(),
            TrimPace {
                keep,
                pause: args.trim_pause,
                interval: args.trim_interval,
            },
            Arc::clone(&counters),
            stopped.clone(),
        ));
    }
    let mut hot = JoinSet::new();
    hot.spawn(cycle_hot_lock(
        hot_session,
        args.hot_hold,
        args.hot_gap,
        Arc::clone(&hot_state),
        stopped.clone(),
    ));

    tokio::time::sleep(LOAD_WARMUP).await;
    let (stop_sampler, sampler_stopped) = watch::channel(false);
    let mut sampler = JoinSet::new();
    sampler.spawn(sample_waiters(sampler_session, sampler_stopped));
    let appended_before = counters.appended.load(Ordering::SeqCst);
    let trimmed_before = counters.trimmed.load(Ordering::SeqCst);
    let window_start = Instant::now();
    let renewals = measure_renewals(storage, lease, args, Some(&hot_state)).await;
    let window = window_start.elapsed();
    let appends = counters.appended.load(Ordering::SeqCst) - appended_before;
    let trimmed = counters.trimmed.load(Ordering::SeqCst) - trimmed_before;

    let _ = stop_sampler.send(true);
    let waits = match sampler.join_next().await {
        Some(Ok(Ok(waits))) => waits,
        Some(Ok(Err(e))) => return Err(format!("the pg_stat_activity sampler failed: {e}").into()),
        Some(Err(e)) => return Err(format!("the pg_stat_activity sampler ended: {e}").into()),
        None => WaitSamples::default(),
    };

    let _ = stop.send(true);
    let finished = tokio::time::timeout(SHUTDOWN_LIMIT, async {
        while appenders.join_next().await.is_some() {}
        hot.join_next().await
    })
    .await;
    let (hot_cycles, hot_error) = match finished {
        Ok(Some(Ok(Ok(cycles)))) => (cycles, None),
        Ok(Some(Ok(Err(e)))) => (0, Some(e)),
        Ok(Some(Err(e))) => (0, Some(e.to_string())),
        Ok(None) => (0, None),
        Err(_) => {
            eprintln!(
                "renewal_latency: load tasks did not stop within {SHUTDOWN_LIMIT:?}; aborting them"
            );
            appenders.shutdown().await;
            hot.shutdown().await;
            (0, Some("did not stop in time".to_owned()))
        }
    };

    let first_append_error = counters
        .first_error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let load = LoadReport {
        appenders: args.appenders,
        hot_appenders,
        appends,
        window,
        append_errors: counters.failed.load(Ordering::SeqCst),
        first_append_error,
        hot_cycles,
        hot_error,
        waits,
        trimmed: args.trim_keep.map(|_| trimmed),
        trim_errors: counters.trim_failed.load(Ordering::SeqCst),
    };
    Ok((renewals?, load))
}

/// One appender: appends one message at a time to its channels in turn,
/// as fast as the storage takes them, until told to stop.
async fn append_loop(
    storage: PostgresStorage,
    lease: Lease,
    channels: Vec<ChannelName>,
    counters: Arc<LoadCounters>,
    stop: watch::Receiver<bool>,
) {
    let mut seq = 0u64;
    for channel in channels.iter().cycle() {
        if *stop.borrow() {
            break;
        }
        seq += 1;
        let outcome = match message(channel, seq) {
            Ok(msg) => storage
                .append(&lease, std::slice::from_ref(&msg))
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(_) => {
                counters.appended.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                counters.failed.fetch_add(1, Ordering::SeqCst);
                counters
                    .first_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(e);
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
        }
    }
}

/// What the trimming task of `--trim-keep` keeps and how it paces itself.
struct TrimPace {
    /// Newest messages kept per channel.
    keep: u64,
    /// Pause after each transaction that removed something.
    pause: Duration,
    /// Pause after each sweep.
    interval: Duration,
}

/// The trimming task of `--trim-keep`: sweeps every channel, trimming each
/// to its newest `pace.keep` messages in transactions of 500, with the
/// pauses of `pace`, until told to stop.
async fn trim_loop(
    storage: PostgresStorage,
    lease: Lease,
    pace: TrimPace,
    counters: Arc<LoadCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let limits = herald_storage::TrimLimits {
        max_messages: Some(pace.keep),
        ..herald_storage::TrimLimits::default()
    };
    while !*stop.borrow() {
        let channels = match storage.channel_stats().await {
            Ok(channels) => channels,
            Err(_) => {
                counters.trim_failed.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        for channel in channels.iter().filter(|c| c.messages > pace.keep) {
            if *stop.borrow() {
                return;
            }
            match storage.trim(&lease, &channel.name, &limits, 500).await {
                Ok(t) => {
                    counters.trimmed.fetch_add(t.messages, Ordering::SeqCst);
                    if t.messages > 0
                        && !pace.pause.is_zero()
                        && sleep_or_stop(&mut stop, pace.pause).await
                    {
                        return;
                    }
                }
                Err(_) => {
                    counters.trim_failed.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
        }
        if !pace.interval.is_zero() && sleep_or_stop(&mut stop, pace.interval).await {
            return;
        }
    }
}

/// Sleeps for `d`, or less if told to stop; `true` when told to stop.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|&s| s) => return true,
    }
    *stop.borrow()
}

/// The other session: takes the hot channel's row `FOR UPDATE` in a
/// transaction, keeps it for `hold`, commits, waits `gap`, and again, until
/// told to stop. Marks each hold in `state` (odd while held). Returns the
/// number of holds.
async fn cycle_hot_lock(
    mut client: Client,
    hold: Duration,
    gap: Duration,
    state: HotState,
    mut stop: watch::Receiver<bool>,
) -> Result<u64, String> {
    let mut cycles = 0;
    while !*stop.borrow() {
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        tx.query_one(HOT_LOCK_SQL, &[&HOT_CHANNEL])
            .await
            .map_err(|e| e.to_string())?;
        state.fetch_add(1, Ordering::SeqCst);
        cycles += 1;
        let told = sleep_or_stop(&mut stop, hold).await;
        state.fetch_add(1, Ordering::SeqCst);
        tx.commit().await.map_err(|e| e.to_string())?;
        if told || sleep_or_stop(&mut stop, gap).await {
            break;
        }
    }
    Ok(cycles)
}

/// Reads [`WAITERS_SQL`] every [`SAMPLE_EVERY`] until told to stop.
async fn sample_waiters(
    client: Client,
    mut stop: watch::Receiver<bool>,
) -> Result<WaitSamples, String> {
    let statement = client
        .prepare(WAITERS_SQL)
        .await
        .map_err(|e| e.to_string())?;
    let mut waits = WaitSamples::default();
    loop {
        let row = client
            .query_one(&statement, &[])
            .await
            .map_err(|e| e.to_string())?;
        let on_row: i64 = row.try_get(0).map_err(|e| e.to_string())?;
        let on_advisory: i64 = row.try_get(1).map_err(|e| e.to_string())?;
        waits.samples += 1;
        waits.with_row_lock_wait += u64::from(on_row > 0);
        waits.max_advisory_waiters = waits.max_advisory_waiters.max(on_advisory);
        if sleep_or_stop(&mut stop, SAMPLE_EVERY).await {
            return Ok(waits);
        }
    }
}
