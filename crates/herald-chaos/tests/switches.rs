//! The checker catches real bugs: each test runs a short fault-injection
//! run against a build of `herald` with the cargo feature `fault-switches`,
//! with one protection switched off (`HERALD_FAULT_SWITCHES`), and requires
//! the checker to report the violation that protection exists to prevent.
//! The control runs switch on only `zombie_holder` (a holder that never
//! steps down on its own) and must stay valid: the database's fencing alone
//! keeps such a holder from doing harm.
//!
//! The switched binary is the one named by `HERALD_TEST_SWITCHED_HERALD`
//! when set (the test command builds it once, sharing the build of every
//! dependency, and copies it out of the way of the normal binary).
//! Otherwise it is built on first use into a target directory of its own
//! (`<target>/fault-switches`), so the normal `herald` binary the other
//! tests use never contains the switches.
//!
//! Needs PostgreSQL's server binaries (`HERALD_TEST_PG_BIN`, else found on
//! `PATH` or in the usual install directory) and, when the tests run as
//! root, an unprivileged user to run them (`HERALD_TEST_PG_USER`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// The workspace's target directory: the test executable lives in
/// `<target>/<profile>/deps`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    exe.ancestors()
        .nth(3)
        .expect("the target directory")
        .to_owned()
}

/// The environment variable that names a ready `herald` binary built with
/// the cargo feature `fault-switches`.
const SWITCHED_HERALD_VAR: &str = "HERALD_TEST_SWITCHED_HERALD";

/// The `herald` binary with the fault switches compiled in: the one named
/// by [`SWITCHED_HERALD_VAR`], else built on first use into
/// `<target>/fault-switches`.
fn switched_herald() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os(SWITCHED_HERALD_VAR).filter(|v| !v.is_empty()) {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "{SWITCHED_HERALD_VAR} names no file: {}",
                bin.display()
            );
            return bin;
        }
        let dir = target_dir().join("fault-switches");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--locked",
                "-p",
                "herald",
                "--bin",
                "herald",
                "--features",
                "fault-switches",
                "--target-dir",
            ])
            .arg(&dir)
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "building herald with fault-switches failed"
        );
        let bin = dir.join("debug").join("herald");
        assert!(bin.is_file(), "no switched herald at {}", bin.display());
        bin
    })
}

/// What a run produced.
struct Outcome {
    /// The exit status of `herald-chaos`.
    status: Option<i32>,
    /// The JSON report.
    report: Value,
    /// The fault kinds injected, from the history.
    faults: BTreeSet<String>,
    /// stderr (the human report and the runner's notes).
    stderr: String,
    /// The history's events.
    history: Vec<Value>,
    /// Every node's log, one after the other.
    logs: String,
}

impl Outcome {
    /// The violation kinds reported.
    fn kinds(&self) -> BTreeSet<String> {
        self.report["violations"]
            .as_array()
            .expect("a violations list")
            .iter()
            .filter_map(|v| v["kind"].as_str().map(str::to_owned))
            .collect()
    }
}

/// Runs `herald-chaos` on the switched build with one fault kind (or
/// `none`), and checks that a fault of that kind was injected.
fn run(switches: &str, faults_arg: &str, nodes: u16, duration: &str, seed: u64) -> Outcome {
    let chaos = PathBuf::from(env!("CARGO_BIN_EXE_herald-chaos"));
    let out = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(chaos)
        .args(["--duration", duration, "--json", "--seed"])
        .arg(seed.to_string())
        .arg("--nodes")
        .arg(nodes.to_string())
        .args(["--faults", faults_arg, "--fault-switches", switches])
        .arg("--herald-bin")
        .arg(switched_herald())
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run herald-chaos");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}); stderr:\n{stderr}"));
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).expect("history");
    // The human report, shown with `--nocapture`.
    eprintln!("{stderr}");
    let history: Vec<Value> = history
        .lines()
        .map(|line| serde_json::from_str(line).expect("a history line"))
        .collect();
    let faults = history
        .iter()
        .filter(|event| event["type"] == "fault")
        .filter_map(|event| event["kind"].as_str().map(str::to_owned))
        .collect();
    let logs = (0..nodes)
        .map(|i| std::fs::read_to_string(out.path().join(format!("node-{i}.log"))).unwrap())
        .collect();
    let outcome = Outcome {
        status: output.status.code(),
        report,
        faults,
        stderr,
        history,
        logs,
    };
    if faults_arg != "none" {
        assert!(
            outcome.faults.contains(faults_arg),
            "no {faults_arg} fault was injected: {:?}",
            outcome.faults
        );
    }
    outcome
}

/// Requires an INVALID verdict with at least one violation of `expected`.
fn assert_caught(outcome: &Outcome, expected: &[&str]) {
    let kinds = outcome.kinds();
    assert_eq!(
        outcome.status,
        Some(1),
        "expected exit 1 (violations); kinds {kinds:?}; stderr:\n{}",
        outcome.stderr
    );
    assert_eq!(outcome.report["valid"], false);
    assert!(
        expected.iter().any(|k| kinds.contains(*k)),
        "expected one of {expected:?}, the checker reported {kinds:?}; stderr:\n{}",
        outcome.stderr
    );
}

/// Requires that some node's log has `line`.
fn assert_logged(outcome: &Outcome, line: &str) {
    assert!(
        outcome.logs.contains(line),
        "no node logged {line:?}; stderr:\n{}",
        outcome.stderr
    );
}

/// Requires a VALID verdict.
fn assert_valid(outcome: &Outcome) {
    assert_eq!(
        outcome.status,
        Some(0),
        "expected a valid run; kinds {:?}; stderr:\n{}",
        outcome.kinds(),
        outcome.stderr
    );
    assert_eq!(outcome.report["valid"], true);
    assert!(
        outcome.report["counts"]["acked"].as_u64().unwrap_or(0) > 0,
        "nothing acknowledged: {:#}",
        outcome.report
    );
}

/// A holder that never steps down on its own, paused past its lease: a
/// standby takes over, and when the old holder resumes the database's
/// fencing check refuses every write it tries. Nothing is broken.
#[test]
fn a_zombie_holder_alone_is_fenced_off() {
    let outcome = run("zombie_holder", "stop_holder", 3, "25s", 1);
    assert_valid(&outcome);
    // The scenario happened: a takeover, a holder that stayed holder, and
    // its writes refused by the database.
    assert!(
        outcome.report["counts"]["takeovers"].as_u64().unwrap_or(0) >= 2,
        "{:#}",
        outcome.report
    );
    assert_logged(&outcome, "fault switch zombie_holder: ignored");
    assert_logged(&outcome, "writer lease lost: fenced write refused");
}

/// The same zombie with the fencing check skipped: it writes with its old
/// token after the takeover.
#[test]
fn skipping_the_fencing_check_is_caught() {
    let outcome = run(
        "zombie_holder,skip_fencing_check",
        "stop_holder",
        3,
        "25s",
        1,
    );
    assert_caught(&outcome, &["token_regression"]);
}

/// Acknowledging a batch before its commit: the batch that waits behind a
/// long lock of the lease row fails after its messages were acknowledged.
#[test]
fn acknowledging_before_commit_is_caught() {
    let outcome = run("ack_before_commit", "lock_lease_long", 3, "20s", 1);
    assert_caught(&outcome, &["acked_not_stored", "conflicting_acks"]);
}

/// A single zombie node paused past its lease, with nobody to take over:
/// with the renewal's expiry guard, its renewals fail once the lease
/// expired (valid)...
#[test]
fn a_lone_zombie_does_not_renew_an_expired_lease() {
    let outcome = run("zombie_holder", "stop_holder", 1, "25s", 1);
    assert_valid(&outcome);
    // The scenario happened: the lease was seen expired, and the holder
    // kept trying to renew it.
    assert!(
        outcome
            .history
            .iter()
            .any(|e| e["type"] == "lease" && e["expired"] == true && e["holder"].is_string()),
        "the lease was never seen expired"
    );
    assert_logged(&outcome, "fault switch zombie_holder: ignored");
}

/// ...and without it, a renewal brings the expired lease back.
#[test]
fn renewing_an_expired_lease_is_caught() {
    let outcome = run("zombie_holder,renew_expired", "stop_holder", 1, "25s", 1);
    assert_caught(&outcome, &["lease_resurrected"]);
}

/// Commits that send no change notice, with no safety poll to make up
/// for it: subscribers on standbys stall while the channel moves.
#[test]
fn dropping_change_notices_is_caught() {
    let outcome = run("drop_notify", "none", 3, "15s", 1);
    assert!(outcome.faults.is_empty(), "{:?}", outcome.faults);
    assert_caught(&outcome, &["delivery_stalled"]);
}
