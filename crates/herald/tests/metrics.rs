//! `/metrics` of a fresh `herald serve` process: every family that
//! docs/api.md documents is there from the first scrape, before its first
//! event, so an alert on it reads 0 rather than "no data"; and the
//! takeovers recorded in the database survive the process that made them.
//!
//! Set `HERALD_BIN` to run them against another build of the binary.

use herald_testkit::process::Server;
use herald_testkit::{within, WAIT};

/// The metric names of docs/api.md's `/metrics` table (first column).
fn documented_families() -> Vec<String> {
    let api = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md");
    let text = std::fs::read_to_string(&api).expect("read docs/api.md");
    let section = text
        .split("### `GET /metrics`")
        .nth(1)
        .expect("docs/api.md has a /metrics section");
    let section = section.split("\n### ").next().unwrap_or(section);
    let names: Vec<String> = section
        .lines()
        .filter_map(|line| line.strip_prefix("| `herald_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("herald_{name}"))
        .collect();
    assert!(names.len() > 20, "too few documented metrics: {names:?}");
    names
}

async fn scrape(server: &Server) -> String {
    within(
        "/metrics",
        WAIT,
        reqwest::get(format!("{}/metrics", server.url)),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap()
}

/// Whether the exposition `text` has a sample of `family` (a counter or
/// gauge by its name, a histogram by its `_count`).
fn has_family(text: &str, family: &str) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|line| {
        let name = line.split([' ', '{']).next().unwrap_or("");
        name == family || name == format!("{family}_count")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_family_is_on_the_first_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let text = scrape(&server).await;
    let missing: Vec<String> = documented_families()
        .into_iter()
        .filter(|family| !has_family(&text, family))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in:\n{text}");
    // The takeovers the database recorded are a counter (`increase()`
    // applies), and the build is named.
    assert!(
        text.lines()
            .any(|l| l == "# TYPE herald_lease_takeovers_recorded_total counter"),
        "{text}"
    );
    let build = text
        .lines()
        .find(|l| l.starts_with("herald_build_info{"))
        .unwrap_or_else(|| panic!("no herald_build_info in:\n{text}"));
    assert!(build.ends_with("} 1"), "{build}");
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{build}"
    );
    assert!(build.contains("commit=\""), "{build}");
    for line in [
        "herald_lease_watchdog_stops_total 0",
        "herald_lease_renewals_total{result=\"timeout\"} 0",
        "herald_lease_acquisitions_total{reason=\"holder_gone\"} 0",
        "herald_forwarded_writes_total{result=\"no_holder\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} not in /metrics:\n{text}"
        );
    }
}

/// The takeovers of the writer lease are counted in the database: after
/// one node acquired (`fresh`) and drained (releasing the lease), the next
/// process on the same data dir, which made only the `released` takeover,
/// shows both from its first scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_takeovers_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Server::start_holder(dir.path()).await;
    first.sigterm();
    let (status, _) = first.wait_exit(WAIT).await;
    assert!(status.success(), "{status:?}");

    let second = Server::start_holder(dir.path()).await;
    let text = scrape(&second).await;
    for line in [
        "herald_lease_takeovers_recorded_total{reason=\"fresh\"} 1",
        "herald_lease_takeovers_recorded_total{reason=\"released\"} 1",
        "herald_lease_takeovers_recorded_total{reason=\"expired\"} 0",
        // This process acquired once, for its own reason only.
        "herald_lease_acquisitions_total{reason=\"fresh\"} 0",
        "herald_lease_acquisitions_total{reason=\"released\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} not in /metrics:\n{text}"
        );
    }
}
