//! A short chaos run of the built binaries: three nodes on a disposable
//! PostgreSQL cluster, a seed whose schedule has several fault kinds, and a
//! valid verdict.
//!
//! Needs PostgreSQL's server binaries (`HERALD_TEST_PG_BIN`, else found on
//! `PATH` or in the usual install directory) and, when the tests run as
//! root, an unprivileged user to run them (`HERALD_TEST_PG_USER`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The target directory's profile directory (`target/debug`): the test
/// executable lives in its `deps` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    let deps = exe.parent().expect("the deps directory");
    deps.parent().expect("the profile directory").to_owned()
}

/// A binary of the workspace in the profile directory, built on demand
/// when only this package's tests were built.
fn workspace_bin(name: &str, package: &str) -> PathBuf {
    let path = profile_dir().join(name);
    if !path.is_file() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", package, "--bin", name])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build -p {package} failed");
    }
    assert!(path.is_file(), "no {name} at {}", path.display());
    path
}

#[test]
fn a_short_run_with_faults_is_valid() {
    let chaos = PathBuf::from(env!("CARGO_BIN_EXE_herald-chaos"));
    let herald = workspace_bin("herald", "herald");
    let out_dir = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(chaos)
        .args(["--duration", "20s", "--seed", "3", "--json", "--out"])
        .arg(out_dir.path())
        .arg("--herald-bin")
        .arg(&herald)
        .output()
        .expect("run herald-chaos");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr:\n{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["valid"], true, "{report:#}");
    assert_eq!(report["violations"].as_array().map(Vec::len), Some(0));
    assert!(
        report["counts"]["acked"].as_u64().unwrap_or(0) > 0,
        "nothing acknowledged: {report:#}"
    );
    for file in ["history.jsonl", "final.json", "report.json"] {
        assert!(out_dir.path().join(file).is_file(), "{file} not written");
    }
    let history = std::fs::read_to_string(out_dir.path().join("history.jsonl")).unwrap();
    let kinds: BTreeSet<String> = history
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["type"] == "fault")
        .filter_map(|event| event["kind"].as_str().map(str::to_owned))
        .collect();
    assert!(kinds.len() >= 3, "fault kinds injected: {kinds:?}");
}
