//! Does a standby's acquire cost the holder anything? The latency of the
//! holder's fenced writes on PostgreSQL with no standby and with standbys
//! acquiring, in the same run.
//!
//! ```text
//! HERALD_TEST_DATABASE_URL=postgres://... \
//!   cargo run --release -p herald-storage --example standby_contention -- \
//!   [--seconds S] [--standbys N] [--acquire-ms MS] [--appenders N]
//! ```
//!
//! `HERALD_TEST_DATABASE_URL` names a role that may create databases; the
//! run works in a fresh database it drops at the end. One storage acquires
//! the writer lease; `--appenders` tasks (8) append one message per fenced
//! write to channels of their own through it, as fast as they can, for
//! `--seconds` (10) per phase:
//!
//! 1. **alone**: nothing else uses the database;
//! 2. **with standbys**: `--standbys` other storages (5), each a node of
//!    its own, call `acquire` every `--acquire-ms` (100 ms, ten times the
//!    default rate, to make any cost visible). Each finds the lease held.
//!
//! A standby that locked the lease row `FOR UPDATE` before deciding would
//! make the holder's writes (`FOR KEY SHARE`) wait; one that decides on a
//! plain read first does not. The report gives p50, p99 and max of the
//! append latency per phase (time from calling `append` until it returns,
//! on the client) and the ratio of the two p99s. No thresholds: a figure.

use herald_storage::MessageLog;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_core::{Candidate, ChannelName, NewMessage, DEFAULT_LEASE_NAME};
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::testing::TestDatabase;
use herald_storage::{Acquire, LeaseStore};
use serde_json::value::RawValue;

struct Args {
    seconds: u64,
    standbys: usize,
    acquire_ms: u64,
    appenders: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seconds: 10,
        standbys: 5,
        acquire_ms: 100,
        appenders: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse::<u64>()
            .map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--seconds" => args.seconds = value.max(1),
            "--standbys" => args.standbys = usize::try_from(value).unwrap_or(usize::MAX),
            "--acquire-ms" => args.acquire_ms = value.max(1),
            "--appenders" => args.appenders = usize::try_from(value).unwrap_or(1).max(1),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

fn candidate(node: &str) -> Candidate {
    Candidate {
        lease_name: DEFAULT_LEASE_NAME.to_owned(),
        node_id: node.to_owned(),
        advertise_url: format!("http://{node}"),
    }
}

/// Latencies of one phase, sorted: (p50, p99, max) in ms, and the count.
fn percentiles(mut latencies: Vec<Duration>) -> (f64, f64, f64, usize) {
    latencies.sort();
    let n = latencies.len().max(1);
    let at = |q: f64| {
        let i = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    (at(0.50), at(0.99), at(1.0), latencies.len())
}

/// Appends for `span` from `appenders` tasks; returns every latency.
async fn phase(
    holder: &PostgresStorage,
    lease: &herald_core::Lease,
    appenders: usize,
    span: Duration,
) -> Vec<Duration> {
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + span;
    let mut tasks = Vec::new();
    for a in 0..appenders {
        let holder = holder.clone();
        let lease = lease.clone();
        let latencies = latencies.clone();
        tasks.push(tokio::spawn(async move {
            let channel = ChannelName::new(format!("bench-{a}")).expect("a valid channel name");
            while Instant::now() < end {
                let message = NewMessage {
                    channel: channel.clone(),
                    data: herald_core::Payload::Json(
                        RawValue::from_string("\"x\"".to_owned())
                            .expect("valid JSON")
                            .into(),
                    ),
                    idempotency_key: None,
                    tags: herald_core::Tags::default(),
                };
                let started = Instant::now();
                holder
                    .append(&lease, &[message])
                    .await
                    .expect("the holder's append");
                latencies.lock().unwrap().push(started.elapsed());
            }
        }));
    }
    for t in tasks {
        t.await.expect("an appender");
    }
    let mut latencies = latencies.lock().unwrap();
    std::mem::take(&mut *latencies)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), String> {
    let args = parse()?;
    let db = TestDatabase::create().await;
    let options = PostgresOptions::default();
    let holder = PostgresStorage::connect(db.url(), options.clone())
        .await
        .map_err(|e| e.to_string())?;
    let lease = match holder
        .acquire(&candidate("holder"), Duration::from_secs(600))
        .await
        .map_err(|e| e.to_string())?
    {
        Acquire::Acquired { lease, .. } => lease,
        Acquire::Held(info) => return Err(format!("the lease is held: {info:?}")),
    };
    let span = Duration::from_secs(args.seconds);

    let alone = percentiles(phase(&holder, &lease, args.appenders, span).await);

    let stop = Arc::new(AtomicBool::new(false));
    let mut standbys = Vec::new();
    for s in 0..args.standbys {
        let storage = PostgresStorage::connect(db.url(), options.clone())
            .await
            .map_err(|e| e.to_string())?;
        let stop = stop.clone();
        let period = Duration::from_millis(args.acquire_ms);
        standbys.push(tokio::spawn(async move {
            let me = candidate(&format!("standby-{s}"));
            let mut tick = tokio::time::interval(period);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                match storage.acquire(&me, Duration::from_secs(600)).await {
                    Ok(Acquire::Held(_)) | Err(_) => {}
                    Ok(Acquire::Acquired { .. }) => panic!("a standby took a live lease"),
                }
            }
        }));
    }
    let with = percentiles(phase(&holder, &lease, args.appenders, span).await);
    stop.store(true, Ordering::Relaxed);
    for s in standbys {
        s.await.map_err(|e| e.to_string())?;
    }

    println!(
        "holder appends, {} appenders, {} s per phase; latency p50 / p99 / max in ms",
        args.appenders, args.seconds
    );
    println!(
        "  alone:          {:.2} / {:.2} / {:.2}  ({} appends)",
        alone.0, alone.1, alone.2, alone.3
    );
    println!(
        "  {} standbys:    {:.2} / {:.2} / {:.2}  ({} appends; each acquires every {} ms)",
        args.standbys, with.0, with.1, with.2, with.3, args.acquire_ms
    );
    println!(
        "  p99 with standbys / alone: {:.2}",
        with.1 / alone.1.max(1e-9)
    );
    Ok(())
}
