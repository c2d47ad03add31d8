//! Failover figures: how long writes pause when the holder dies (kill -9),
//! hands over (SIGTERM) or hangs (SIGSTOP), on both backends. A benchmark,
//! not a pass/fail test: it prints min / median / max over 10 runs of each
//! and asserts only that every run ended with a write acknowledged by the
//! new holder. Ignored by default (about three minutes); run it with
//!
//! ```text
//! cargo test -p herald --test failover_figures -- --ignored --nocapture
//! ```
//!
//! (`HERALD_TEST_DATABASE_URL` must name a PostgreSQL cluster, as the test
//! command provides.) Each run starts a holder and a standby with ttl 5 s;
//! a client publishes through the standby every 20 ms, each attempt with
//! its own idempotency key and a 250 ms timeout, and the figure is the
//! time from the fault to its first acknowledged publish.

use std::time::Duration;

use herald_testkit::process::{Server, FAST_LEASE};
use herald_testkit::{TestDatabase, WAIT};
use reqwest::StatusCode;
use serde_json::json;
use tokio::time::Instant;

const CHANNEL: &str = "figures";
const RUNS: usize = 10;
/// The ttl the nodes run with.
const TTL: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Term,
    Stop,
}

/// Where the two nodes keep their data.
enum Backend {
    Sqlite,
    Postgres,
}

/// Starts a holder and a standby; returns them with the guards that must
/// outlive them.
async fn pair(backend: &Backend) -> (Server, Server, tempfile::TempDir, Option<TestDatabase>) {
    let dir = tempfile::tempdir().unwrap();
    let db = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(TestDatabase::create().await),
    };
    let mut nodes = Vec::new();
    for i in 0..2 {
        let id = format!("node-{i}");
        let mut flags = vec!["--node-id", id.as_str()];
        flags.extend_from_slice(FAST_LEASE);
        // On SQLite both processes share one data dir (one database file);
        // on PostgreSQL each has its own.
        let data = match &db {
            Some(db) => {
                flags.extend_from_slice(&["--database", db.url()]);
                dir.path().join(&id)
            }
            None => dir.path().join("shared"),
        };
        let node = Server::start_with(&data, &flags).await;
        node.api
            .wait_role(if i == 0 { "holder" } else { "standby" }, WAIT)
            .await;
        nodes.push(node);
    }
    let standby = nodes.pop().unwrap();
    let holder = nodes.pop().unwrap();
    (holder, standby, dir, db)
}

/// Publishes through `via` every 20 ms until one publish is acknowledged;
/// returns the time since `since`.
async fn first_ack(via: &Server, since: Instant) -> Duration {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    let mut n = 0;
    loop {
        n += 1;
        let key = format!("probe-{n}");
        let sent = http
            .post(format!("{}/v1/channels/{CHANNEL}/messages", via.url))
            .header("Idempotency-Key", &key)
            .json(&json!({ "data": { "n": n } }))
            .send()
            .await;
        if sent.is_ok_and(|r| r.status() == StatusCode::CREATED) {
            return since.elapsed();
        }
        assert!(since.elapsed() < WAIT * 3, "no write acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn one_run(backend: &Backend, fault: Fault) -> Duration {
    let (mut holder, standby, _dir, _db) = pair(backend).await;
    standby.api.publish(CHANNEL, &json!("warm-up")).await;
    let at = Instant::now();
    match fault {
        Fault::Kill => holder.sigkill(),
        Fault::Term => holder.sigterm(),
        Fault::Stop => holder.signal(rustix::process::Signal::STOP),
    }
    let took = first_ack(&standby, at).await;
    assert_eq!(standby.api.status().await["role"], "holder");
    if let Fault::Stop = fault {
        holder.signal(rustix::process::Signal::CONT);
    }
    holder.sigkill();
    took
}

fn summary(mut figures: Vec<Duration>) -> String {
    figures.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:.0} / {:.0} / {:.0} ms",
        ms(figures[0]),
        ms(figures[figures.len() / 2]),
        ms(*figures.last().unwrap())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark of about three minutes; run with --ignored --nocapture"]
async fn failover_figures() {
    for (name, backend) in [("sqlite", Backend::Sqlite), ("postgres", Backend::Postgres)] {
        for fault in [Fault::Kill, Fault::Term, Fault::Stop] {
            let mut figures = Vec::new();
            for _ in 0..RUNS {
                figures.push(one_run(&backend, fault).await);
            }
            let extra = match fault {
                Fault::Stop => format!(" (ttl {} s)", TTL.as_secs()),
                _ => String::new(),
            };
            println!(
                "{name:8} {fault:?}: first acknowledged publish after the fault, min / median / max over {RUNS}: {}{extra}",
                summary(figures)
            );
        }
    }
}
