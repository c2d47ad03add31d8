//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! `herald-chaos`: runs a Herald cluster through faults and judges what its
//! clients observed.
//!
//! A run creates a disposable PostgreSQL cluster, starts `--nodes` `herald
//! serve` processes on it (each behind its own fault proxy), runs careful
//! publishers and reconnecting SSE and Centrifugo subscribers, watches the lease row
//! straight from the database, injects the faults of a schedule drawn from
//! `--seed`, `--duration`, `--nodes` and `--faults` (the kinds allowed),
//! heals them, reads the database's final contents and runs the checker.
//! `--fault-switches` is handed verbatim to every node as
//! `HERALD_FAULT_SWITCHES` (it means something only to a build of `herald`
//! with its test-only fault switches). The exit status is 0 when no
//! guarantee was broken, 1 when one was, 2 when the run itself failed or
//! the command line was wrong. What each fault models is documented in
//! `run::faults`; `docs/testing.md` explains how to read the report.

mod run;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use run::schedule::FaultKind;

/// The fault kinds a `--faults` list allows.
#[derive(Debug, Clone)]
struct FaultList(Vec<FaultKind>);

fn parse_fault_list(list: &str) -> Result<FaultList, String> {
    run::schedule::parse_kinds(list).map(FaultList)
}

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "herald-chaos",
    about = "Fault-injection runs against a Herald cluster"
)]
struct Args {
    /// How long clients run and faults are injected (e.g. `90s`, `15m`).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many `herald serve` nodes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    nodes: u16,
    /// The `herald` binary (default: the one next to this executable).
    #[arg(long)]
    herald_bin: Option<PathBuf>,
    /// PostgreSQL's server binaries (`initdb`, `pg_ctl`).
    #[arg(long, env = "HERALD_TEST_PG_BIN")]
    pg_bin: Option<PathBuf>,
    /// The user that runs PostgreSQL (through `runuser`) when this runs as
    /// root.
    #[arg(long, env = "HERALD_TEST_PG_USER")]
    pg_user: Option<String>,
    /// Directory for `history.jsonl`, `final.json`, `report.json` and the
    /// nodes' logs.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the report as JSON on stdout (the human report then goes to
    /// stderr).
    #[arg(long)]
    json: bool,
    /// Print the fault schedule and exit.
    #[arg(long)]
    print_schedule: bool,
    /// The fault kinds to inject, comma-separated (`kill_holder`,
    /// `kill_standby`, `stop_holder`, `term_holder`, `restart_db`, `cut_db`,
    /// `blackhole_db`, `delay_db`, `lock_lease_brief`, `lock_lease_long`,
    /// `lock_channel`), or `none` (default: every kind).
    #[arg(long, value_name = "LIST", value_parser = parse_fault_list)]
    faults: Option<FaultList>,
    /// Passed verbatim to every node as the environment variable
    /// `HERALD_FAULT_SWITCHES` (test-only switches of a `herald` built with
    /// the `fault-switches` feature; empty: not set).
    #[arg(long, value_name = "LIST")]
    fault_switches: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let faults = args
        .faults
        .clone()
        .map_or_else(|| FaultKind::ALL.to_vec(), |list| list.0);
    if args.print_schedule {
        let plan = run::schedule::draw(
            args.seed,
            args.duration,
            usize::from(args.nodes),
            run::CHANNELS.len(),
            &faults,
        );
        println!(
            "schedule for seed {} over {} on {} nodes ({} faults)",
            args.seed,
            humantime::format_duration(args.duration),
            args.nodes,
            plan.len()
        );
        if faults.len() < FaultKind::ALL.len() {
            println!("fault kinds: {}", run::schedule::kind_names(&faults));
        }
        for planned in &plan {
            println!("{planned}");
        }
        return ExitCode::SUCCESS;
    }
    match main_run(args, faults) {
        Ok(valid) => {
            if valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("herald-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn main_run(args: Args, faults: Vec<FaultKind>) -> anyhow::Result<bool> {
    let herald_bin = match args.herald_bin {
        Some(path) => path,
        None => std::env::current_exe()
            .context("locate this executable")?
            .with_file_name("herald"),
    };
    anyhow::ensure!(
        herald_bin.is_file(),
        "no herald binary at {}; build it or pass --herald-bin",
        herald_bin.display()
    );
    let pg_bin = args
        .pg_bin
        .or_else(run::database::default_pg_bin)
        .context("no PostgreSQL binaries found; pass --pg-bin")?;
    let pg_user = args
        .pg_user
        .filter(|_| rustix::process::geteuid().is_root());
    let settings = run::Settings {
        duration: args.duration,
        seed: args.seed,
        nodes: usize::from(args.nodes),
        herald_bin,
        pg_bin,
        pg_user,
        out: args.out,
        faults,
        fault_switches: args.fault_switches.unwrap_or_default(),
    };
    let runtime = tokio::runtime::Runtime::new().context("start the runtime")?;
    let report = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        // Interrupted (Ctrl-C, or a CI runner's SIGTERM or SIGHUP): unwind,
        // so that the nodes are killed and the database removed.
        let mut term = signal(SignalKind::terminate()).context("handle SIGTERM")?;
        let mut hangup = signal(SignalKind::hangup()).context("handle SIGHUP")?;
        tokio::select! {
            report = run::run(settings) => report,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            _ = term.recv() => Err(anyhow::anyhow!("terminated (SIGTERM)")),
            _ = hangup.recv() => Err(anyhow::anyhow!("hung up (SIGHUP)")),
        }
    })?;
    // Dropping the runtime ends every task; nodes are killed and the
    // database stopped and removed by their guards as the run unwinds.
    drop(runtime);
    if args.json {
        eprint!("{report}");
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(report.valid)
}
