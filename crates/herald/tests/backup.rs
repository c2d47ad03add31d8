//! `herald backup` and `herald restore` on the real binary: a backup taken
//! while the node serves is consistent and never overwrites a file; a
//! restore refuses while a node runs, and the restored database serves
//! the backup's messages under new channel epochs and a writer lease whose
//! fencing token lies past every token handed out before.
//!
//! Set `HERALD_BIN` to run them against another build of the binary.

use std::path::Path;

use herald_testkit::process::{herald, Server};
use herald_testkit::{within, WAIT};
use serde_json::{json, Value};

/// Runs `herald ARGS`; returns its exit code and its stdout and stderr.
async fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = within("herald", WAIT, herald().args(args).output())
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The channel's epoch, as Centrifugo's server API tells it.
async fn epoch(server: &Server, channel: &str) -> String {
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/api/history", server.url))
        .json(&json!({"channel": channel, "limit": 0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["result"]["epoch"]
        .as_str()
        .unwrap_or_else(|| panic!("no epoch in {answer}"))
        .to_owned()
}

async fn token(server: &Server) -> u64 {
    server.api.status().await["lease"]["token"]
        .as_u64()
        .expect("a token")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_as_a_new_history() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("herald-backup.db");
    let mut server = Server::start_holder(&data).await;
    for i in 1..=3 {
        server.api.publish("orders", &json!({ "i": i })).await;
    }
    let epoch_before = epoch(&server, "orders").await;
    let token_before = token(&server).await;

    let (code, out) = run(&["backup", "--data-dir", path(&data), path(&file)]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("1 channels, 3 messages"), "{out}");
    // Never overwritten.
    let (code, out) = run(&["backup", "--data-dir", path(&data), path(&file)]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("never overwritten"), "{out}");

    // Written after the backup: gone after the restore.
    server.api.publish("orders", &json!({"i": 4})).await;
    let (code, out) = run(&["restore", "--data-dir", path(&data), path(&file)]).await;
    assert_eq!(code, Some(1), "a node runs: {out}");
    assert!(out.contains("stop every node"), "{out}");

    server.sigterm();
    let (status, _) = server.wait_exit(WAIT).await;
    assert!(status.success(), "{status:?}");
    let (code, out) = run(&["restore", "--data-dir", path(&data), path(&file)]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("the database it replaced is kept as"), "{out}");

    let server = Server::start_holder(&data).await;
    assert_eq!(server.api.head("orders").await, 3);
    assert_ne!(
        epoch(&server, "orders").await,
        epoch_before,
        "a restored history has a new epoch"
    );
    let token_after = token(&server).await;
    assert!(
        token_after > token_before + (1 << 40),
        "{token_before} then {token_after}"
    );
    assert_eq!(server.api.publish("orders", &json!({"i": "new"})).await, 4);
}
