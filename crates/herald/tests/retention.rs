//! `herald serve`'s retention settings against the real binary: a config
//! file whose `[retention]` section does not parse refuses the start; the
//! policies in force are logged at the start and at every reload; SIGHUP
//! reloads that section, and the node trims by the new policy without a
//! restart; the retention metrics read 0 before anything was trimmed.
//!
//! Set `HERALD_BIN` to run them against another build of the binary.

use std::time::Duration;

use herald_testkit::process::{failed_start_in_data, Server};
use herald_testkit::{within, WAIT};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_with_an_unknown_key_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, "[retention]\nmax_mesages = 10\n").unwrap();
    let error = failed_start_in_data(dir.path(), &["--config", file.to_str().unwrap()]).await;
    assert!(error.contains("[retention]"), "{error}");
    assert!(error.contains("max_mesages"), "{error}");
    assert!(
        !dir.path().join("data").exists(),
        "a refused start created the data dir"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_policy_file_and_the_node_trims_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    // Only `chat` is bounded at first.
    std::fs::write(&file, "[retention.namespaces.chat]\nmax_messages = 100\n").unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &[
            "--config",
            file.to_str().unwrap(),
            "--retention-trim-interval",
            "50ms",
        ],
    )
    .await;
    server.api.wait_role("holder", WAIT).await;
    let started = server
        .wait_log_record("the policies at the start", WAIT, |r| {
            r["message"] == "retention policies in force"
        })
        .await;
    assert_eq!(
        started["policies"],
        "default: unbounded; namespace chat: max_messages=100"
    );
    for i in 1..=5 {
        server.api.publish("news", &json!({ "i": i })).await;
    }
    let earliest = || async {
        server.api.history_page("news", 0, 10).await["earliest"]
            .as_u64()
            .expect("earliest")
    };
    assert_eq!(earliest().await, 1);

    std::fs::write(&file, "[retention]\nmax_messages = 2\n").unwrap();
    server.signal(rustix::process::Signal::HUP);
    let reloaded = server
        .wait_log_record("the reload", WAIT, |r| {
            r["message"] == "retention policies reloaded"
        })
        .await;
    assert_eq!(reloaded["policies"], "default: max_messages=2");
    within("news trimmed to 2 messages", WAIT, async {
        while earliest().await != 4 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // SIGHUP did not end the node.
    assert_eq!(server.api.status().await["role"], "holder");
}

/// The retention counters and gauges are on `/metrics` at 0 from the
/// start, before any trim or `truncated` event (a fresh process, so no
/// other test's events count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_metrics_read_zero_before_the_first_trim() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let text = within(
        "/metrics",
        WAIT,
        reqwest::get(format!("{}/metrics", server.url)),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    for line in [
        "herald_subscriptions_truncated_total 0",
        "herald_retention_trimmed_messages_total 0",
        "herald_retention_trimmed_bytes_total 0",
        "herald_retention_backlog_messages 0",
        "herald_retention_channels_beyond_policy 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} not in /metrics:\n{text}"
        );
    }
}
