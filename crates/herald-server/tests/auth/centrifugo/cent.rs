//! `cent` (PyPI), Centrifugo's Python server API client, against Herald
//! unchanged (`tests/clients/python/cent_api.py`): publish
//! (idempotent with a key), broadcast, history, batch, channels (the
//! channels with subscribers only), info,
//! presence answered "not available", a publish with tags, and
//! history_remove (the history goes, the position stays), its publishes in
//! the sequence of Herald's own publish route. centrifuge-python,
//! Centrifugo's Python client SDK, runs the scenarios of `sdk.rs`.
//!
//! The test command makes a virtualenv from the committed
//! `tests/clients/python/requirements.lock` and names its Python in
//! `HERALD_TEST_PYTHON`.

use herald_testkit::clients::{python_bin as python, python_script};
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};

use super::client::Client;
use crate::{Backend, Creds, Node, Place, Role};

/// `tests/clients/python/cent_api.py`.
fn script() -> std::path::PathBuf {
    python_script("cent_api.py")
}

async fn cent(backend: Backend) {
    let place = Place::new(backend).await;
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    // An admin key that may also publish and read, as a backend's key.
    let bearer = Creds::bearer(&creds.publisher);
    let own = holder
        .publish_with(
            "news:cent",
            &[("authorization", bearer.as_str())],
            json!({"n": 0}),
        )
        .await;
    assert_eq!(own.2["offset"], 1);
    // One subscriber to news:cent: `channels` lists the channels with
    // subscribers, not the other channels with history (news:cent-b).
    let token = creds.token_for("cleo", json!({"channels": ["news:*"]}));
    let (mut cleo, _) = Client::connect(&holder, &token).await;
    let r = cleo
        .command("subscribe", json!({"channel": "news:cent"}))
        .await;
    assert!(r["subscribe"].is_object(), "{r}");
    let output = within(
        "cent_api.py",
        NODE_WAIT,
        tokio::process::Command::new(python())
            .arg(script())
            .arg(format!("{}/api", holder.base))
            .arg(&creds.backend)
            .arg("news:cent")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cent_api.py: {stderr}");
    let steps: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step = |name: &str| -> Vec<&Value> { steps.iter().filter(|s| s["step"] == name).collect() };

    let published = step("publish");
    assert_eq!(published[0]["offset"], 2, "{steps:?}");
    assert_eq!(published[1]["offset"], 3);
    let epoch = published[0]["epoch"].as_str().unwrap();
    assert_eq!(epoch.len(), 16);
    let keyed = step("publish_keyed");
    assert_eq!(keyed[0]["offset"], 4);
    assert_eq!(keyed[1]["offset"], 4, "the repeated key stored nothing");
    assert_eq!(step("broadcast")[0]["offsets"], json!([5, 1]));
    let history = step("history")[0];
    assert_eq!(history["offsets"], json!([1, 2, 3, 4, 5]));
    assert_eq!(history["data"][1], json!({"n": 1}));
    assert_eq!(history["epoch"], epoch);
    assert_eq!(history["offset"], 5);
    let batch = step("batch")[0];
    assert_eq!(batch["publish_offset"], 6);
    assert_eq!(batch["history_offset"], 6);
    let channels = &step("channels")[0];
    assert_eq!(channels["channels"], json!(["news:cent"]), "{channels}");
    assert_eq!(channels["num_clients"], json!([1]), "{channels}");
    assert_eq!(step("info")[0]["uids"], json!(["node-a"]));
    assert_eq!(step("presence")[0]["code"], 108);
    assert_eq!(step("publish_tagged")[0]["offset"], 7);
    let tags = &step("history_tags")[0]["tags"];
    assert_eq!(tags[5], Value::Null, "{tags}");
    assert_eq!(tags[6], json!({"kind": "tagged"}), "{tags}");
    let removed = step("history_removed")[0];
    assert_eq!(removed["offsets"], json!([]), "{removed}");
    assert_eq!(removed["offset"], 7, "the position is kept");
    assert_eq!(removed["epoch"], epoch);
    assert_eq!(holder.stored("news:cent").await, []);
    // Herald's own route sees the same sequence.
    let next = holder
        .publish_with(
            "news:cent",
            &[("authorization", bearer.as_str())],
            json!({"n": 8}),
        )
        .await;
    assert_eq!(next.2["offset"], 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cent_on_sqlite() {
    cent(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cent_on_postgres() {
    cent(Backend::Postgres).await;
}
