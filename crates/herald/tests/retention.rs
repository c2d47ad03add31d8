//! `herald serve`'s retention settings against the real binary: a config
//! file whose `[retention]` section does not parse refuses the start;
//! SIGHUP reloads that section, and the node trims by the new policy
//! without a restart.
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
    server
        .wait_log_record("the reload", WAIT, |r| {
            r["message"] == "retention policies reloaded"
        })
        .await;
    within("news trimmed to 2 messages", WAIT, async {
        while earliest().await != 4 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // SIGHUP did not end the node.
    assert_eq!(server.api.status().await["role"], "holder");
}
