//! End-to-end scenarios against the real `herald` binary over HTTP: ordered
//! offsets under concurrent publishers, history, SSE resume, idempotency,
//! request validation, crash recovery after SIGKILL, standby takeover after
//! SIGTERM, the command-line clients, the load generator, and drain.
//!
//! Set `HERALD_BIN` to run them against another build of the binary.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use herald_testkit::api::Answer;
use herald_testkit::process::{herald, Server};
use herald_testkit::sse::SseEnd;
use herald_testkit::{within, WAIT};

/// Publishers of the concurrency scenario, and messages each.
const CLIENTS: u64 = 8;
const PER_CLIENT: u64 = 25;

/// Parses one line of the command-line clients' output.
fn json_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// The next line `herald tail` prints, as JSON.
async fn next_json_line(out: &mut Lines<BufReader<ChildStdout>>) -> Value {
    let line = within("a line from herald tail", WAIT, out.next_line())
        .await
        .expect("read herald tail's output")
        .expect("herald tail ended");
    json_line(&line)
}

/// Scenarios 1 to 4 on one server: concurrent publishes get exactly the
/// offsets 1..=200, history pages return them with their data, an SSE client
/// resumes after `Last-Event-ID` with no gap or repeat, an idempotency key
/// adds one message only, and malformed requests are refused without
/// writing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_history_sse_idempotency_and_validation() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let api = server.api.clone();
    let channel = "orders";

    // 1. Eight concurrent publishers, 25 messages each.
    let mut set = JoinSet::new();
    for client in 0..CLIENTS {
        let api = api.clone();
        set.spawn(async move {
            let mut acks = Vec::new();
            for seq in 0..PER_CLIENT {
                let data = json!({ "client": client, "seq": seq, "pad": "x".repeat(16) });
                let offset = api.publish(channel, &data).await;
                acks.push((offset, data));
            }
            acks
        });
    }
    let mut acked: BTreeMap<u64, Value> = BTreeMap::new();
    while let Some(acks) = set.join_next().await {
        let acks = acks.expect("publisher task");
        // One publisher's messages are sequential, so their offsets rise.
        assert!(
            acks.windows(2).all(|w| w[0].0 < w[1].0),
            "one client's offsets are not increasing: {:?}",
            acks.iter().map(|a| a.0).collect::<Vec<_>>()
        );
        for (offset, data) in acks {
            assert!(
                acked.insert(offset, data).is_none(),
                "offset {offset} acknowledged twice"
            );
        }
    }
    let total = CLIENTS * PER_CLIENT;
    assert_eq!(
        acked.keys().copied().collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>(),
        "the acknowledged offsets are not exactly 1..={total}"
    );

    // History, in pages smaller than the channel.
    let (head, messages) = api.history_all(channel, 64).await;
    assert_eq!(head, total);
    assert_eq!(messages.len() as u64, total);
    for (i, message) in messages.iter().enumerate() {
        let offset = message["offset"].as_u64().expect("offset");
        assert_eq!(offset, i as u64 + 1, "history out of order");
        assert_eq!(
            message["data"], acked[&offset],
            "offset {offset} holds other data than its publisher was acknowledged for"
        );
        assert!(message["published_at"].is_string(), "{message}");
    }
    // The largest page size is accepted, one more is not.
    let page = api.history_page(channel, 0, 1000).await;
    assert_eq!(page["messages"].as_array().unwrap().len() as u64, total);
    api.get(&format!("/v1/channels/{channel}/messages?limit=1001"))
        .await
        .assert_error(StatusCode::BAD_REQUEST, "invalid_query");

    // 2. SSE resuming after Last-Event-ID 190: the stored tail, then live.
    let mut sse = api.sse(channel, "", &[("Last-Event-ID", "190")]).await;
    for want in 191..=total {
        let (id, message) = sse.expect_message().await;
        assert_eq!(id, want, "SSE gap or repeat");
        assert_eq!(message["data"], acked[&want]);
    }
    let mut live = BTreeMap::new();
    for n in 0..5 {
        let data = json!({ "live": n });
        let offset = api.publish(channel, &data).await;
        live.insert(offset, data);
    }
    assert_eq!(
        live.keys().copied().collect::<Vec<_>>(),
        (total + 1..=total + 5).collect::<Vec<_>>()
    );
    for want in total + 1..=total + 5 {
        let (id, message) = sse.expect_message().await;
        assert_eq!(id, want, "SSE gap or repeat in the live part");
        assert_eq!(message["data"], live[&want]);
    }
    // Nothing was repeated after 205: the next event is the next message.
    let marker = api.publish(channel, &json!("marker")).await;
    let (id, message) = sse.expect_message().await;
    assert_eq!(id, marker);
    assert_eq!(message["data"], "marker");
    drop(sse);

    // 3. The same Idempotency-Key twice: one message.
    let before = api.head(channel).await;
    let key = "order-4711";
    let data = json!({ "order": 4711 });
    let first = api.try_publish(channel, &data, Some(key)).await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let second = api.try_publish(channel, &data, Some(key)).await.unwrap();
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    assert_eq!(first.body["offset"], before + 1);
    assert_eq!(second.body["offset"], first.body["offset"]);
    assert_eq!(second.body["published_at"], first.body["published_at"]);
    assert_eq!(api.head(channel).await, before + 1, "the head moved twice");
    // The key is per channel: another channel takes it as new.
    let other = api.try_publish("other", &data, Some(key)).await.unwrap();
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");

    // 4. Refused requests, each with the error shape, writing nothing.
    let head_before = api.head(channel).await;
    let channels_before = api.get("/v1/channels").await.body;
    let good_body = br#"{"data":1}"#.to_vec();
    for bad in ["bad%20name", "-x"] {
        api.post_raw(bad, good_body.clone(), None)
            .await
            .unwrap()
            .assert_error(StatusCode::BAD_REQUEST, "invalid_channel");
    }
    api.post_raw(channel, br#"{"data": "#.to_vec(), None)
        .await
        .unwrap()
        .assert_error(StatusCode::BAD_REQUEST, "invalid_json");
    let huge = format!(r#"{{"data":"{}"}}"#, "y".repeat(2 * 1024 * 1024));
    api.post_raw(channel, huge.into_bytes(), None)
        .await
        .unwrap()
        .assert_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(
        api.head(channel).await,
        head_before,
        "a refused write moved the head"
    );
    assert_eq!(
        api.get("/v1/channels").await.body,
        channels_before,
        "a refused write created a channel"
    );
}

/// Scenario 5: SIGKILL during a publishing burst loses no acknowledged
/// message, and the restarted node's history is contiguous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_burst_keeps_every_acknowledged_message() {
    const PUBLISHERS: u64 = 6;
    const KILL_AFTER: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_holder(dir.path()).await;
    let channel = "burst";

    let acked: Arc<Mutex<Vec<(u64, Value)>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(Notify::new());
    let mut set = JoinSet::new();
    for publisher in 0..PUBLISHERS {
        let (api, acked, count, progress) = (
            server.api.clone(),
            acked.clone(),
            count.clone(),
            progress.clone(),
        );
        set.spawn(async move {
            // Bounded, so a kill that never comes cannot loop forever.
            for seq in 0..5_000u64 {
                let data = json!({ "publisher": publisher, "seq": seq });
                match api.try_publish(channel, &data, None).await {
                    Ok(answer) if answer.status == StatusCode::CREATED => {
                        let offset = answer.body["offset"].as_u64().expect("offset");
                        acked.lock().unwrap().push((offset, data));
                        count.fetch_add(1, Ordering::SeqCst);
                        progress.notify_waiters();
                    }
                    // Refused or cut off: the server is gone.
                    Ok(_) | Err(_) => return,
                }
            }
        });
    }
    within("100 acknowledgements", Duration::from_secs(20), async {
        loop {
            let notified = progress.notified();
            if count.load(Ordering::SeqCst) >= KILL_AFTER {
                break;
            }
            notified.await;
        }
    })
    .await;
    server.sigkill();
    let (status, _) = server.wait_exit(WAIT).await;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    within("the publishers to stop", WAIT, async {
        while let Some(done) = set.join_next().await {
            done.expect("publisher task");
        }
    })
    .await;
    drop(server);

    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.len() >= KILL_AFTER,
        "only {} acknowledged",
        acked.len()
    );
    let mut by_offset = BTreeMap::new();
    for (offset, data) in &acked {
        assert!(
            by_offset.insert(*offset, data.clone()).is_none(),
            "offset {offset} acknowledged twice"
        );
    }
    let max_acked = *by_offset.keys().last().unwrap();

    let restarted = Server::start_holder(dir.path()).await;
    let (head, messages) = restarted.api.history_all(channel, 1000).await;
    assert!(
        head >= max_acked,
        "head {head} is below the acknowledged offset {max_acked}"
    );
    let offsets: Vec<u64> = messages
        .iter()
        .map(|m| m["offset"].as_u64().expect("offset"))
        .collect();
    assert_eq!(
        offsets,
        (1..=head).collect::<Vec<_>>(),
        "history is not contiguous 1..=head"
    );
    for (offset, data) in &by_offset {
        let stored = &messages[usize::try_from(*offset - 1).unwrap()];
        assert_eq!(
            &stored["data"], data,
            "acknowledged offset {offset} lost or changed"
        );
    }
    println!(
        "sigkill: {} acknowledged (max offset {max_acked}), head after restart {head}",
        acked.len()
    );
    // The restarted node goes on where the log ends.
    assert_eq!(
        restarted.api.publish(channel, &json!("after")).await,
        head + 1
    );
}

/// Publishes `{"data": data}` to the node at `base` as a node that already
/// forwarded it once would (`Herald-Forwarded-By`): a standby answers it
/// itself instead of forwarding it again.
async fn publish_as_forwarded(base: &str, channel: &str, data: &Value) -> Answer {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/channels/{channel}/messages"))
        .header("herald-forwarded-by", "another-node")
        .json(&json!({ "data": data }))
        .send()
        .await
        .expect("publish request");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer { status, body }
}

/// Scenario 6: a second node on the same data directory is a standby that
/// forwards publishes to the holder (and points an already forwarded one at
/// the holder), and takes over soon after the holder drains on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_after_the_holder_drains() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Server::start_holder(dir.path()).await;
    let channel = "handover";
    for n in 1..=3u64 {
        assert_eq!(first.api.publish(channel, &json!({ "n": n })).await, n);
    }

    let second = Server::start(dir.path()).await;
    assert_ne!(first.url, second.url);
    let status = second.api.status().await;
    assert_eq!(status["role"], "standby", "{status}");
    // The standby refuses forwarded writes; once it has read the lease row,
    // the answer names the holder.
    let deadline = Instant::now() + WAIT;
    let refused = loop {
        let answer = publish_as_forwarded(&second.url, channel, &json!("to the standby")).await;
        answer.assert_error(StatusCode::SERVICE_UNAVAILABLE, "not_holder");
        if !answer.body["error"]["holder_url"].is_null() || Instant::now() >= deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        refused.body["error"]["holder_url"], first.url,
        "{refused:?}"
    );
    assert_eq!(first.api.status().await["role"], "holder");
    assert_eq!(second.api.status().await["role"], "standby");
    assert_eq!(first.api.head(channel).await, 3, "the standby wrote");
    // A plain publish to the standby is forwarded to the holder.
    assert_eq!(second.api.publish(channel, &json!({ "n": 4 })).await, 4);
    assert_eq!(first.api.head(channel).await, 4);
    assert_eq!(second.api.status().await["role"], "standby");

    first.sigterm();
    let (status, exited) = first.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(0), "the holder did not drain cleanly");

    // Publish to the standby until it accepts.
    let accepted = loop {
        let answer = second
            .api
            .try_publish(channel, &json!({ "n": 5 }), None)
            .await
            .unwrap();
        if answer.status == StatusCode::CREATED {
            break answer;
        }
        // Until it takes over, the standby has no holder to forward to.
        answer.assert_error(StatusCode::SERVICE_UNAVAILABLE, "no_holder");
        assert!(
            exited.elapsed() < WAIT,
            "the standby never took over: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let takeover = exited.elapsed();
    println!(
        "takeover: the standby accepted a write {} ms after the holder exited",
        takeover.as_millis()
    );
    assert!(
        takeover < Duration::from_secs(2),
        "takeover took {takeover:?}"
    );
    assert_eq!(
        accepted.body["offset"], 5,
        "the new holder lost the log's end"
    );
    assert_eq!(second.api.status().await["role"], "holder");
    let (head, messages) = second.api.history_all(channel, 1000).await;
    assert_eq!(head, 5);
    let data: Vec<Value> = messages.iter().map(|m| m["data"].clone()).collect();
    assert_eq!(data, (1..=5).map(|n| json!({ "n": n })).collect::<Vec<_>>());
}

/// Scenario 7: `herald publish`, `herald history` and `herald tail`
/// against a running server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_line_clients_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let channel = "cli";

    let cli = |args: &[&str]| {
        let mut cmd = herald();
        cmd.args(args).args(["--server", &server.url]);
        cmd
    };
    for x in 1..=2 {
        let out = within(
            "herald publish",
            WAIT,
            cli(&["publish", channel, &format!(r#"{{"x":{x}}}"#)]).output(),
        )
        .await
        .unwrap();
        assert!(out.status.success(), "publish: {out:?}");
        let answer = json_line(String::from_utf8(out.stdout).unwrap().trim());
        assert_eq!(answer["channel"], channel);
        assert_eq!(answer["offset"], x);
    }

    let out = within("herald history", WAIT, cli(&["history", channel]).output())
        .await
        .unwrap();
    assert!(out.status.success(), "history: {out:?}");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(json_line)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["offset"], i + 1);
        assert_eq!(line["data"], json!({ "x": i + 1 }));
    }

    let mut tail = cli(&["tail", channel, "--after", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(tail.stdout.take().unwrap()).lines();
    for x in 1..=2u64 {
        let line = next_json_line(&mut out).await;
        assert_eq!(line["offset"], x);
        assert_eq!(line["data"], json!({ "x": x }));
    }
    // Published after tail caught up: printed live, in order.
    for x in 3..=4u64 {
        assert_eq!(server.api.publish(channel, &json!({ "x": x })).await, x);
    }
    for x in 3..=4u64 {
        let line = next_json_line(&mut out).await;
        assert_eq!(line["offset"], x);
        assert_eq!(line["data"], json!({ "x": x }));
    }
    tail.start_kill().unwrap();
    within("herald tail to exit", WAIT, tail.wait())
        .await
        .unwrap();

    // A whole request body given as the data is refused, naming the fix.
    let run = |mut cmd: tokio::process::Command| async move {
        let out = within("herald", WAIT, cmd.output()).await.unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        (out.status.code(), stdout, stderr)
    };
    let wrapped = r#"{"data":{"x":5}}"#;
    let (code, stdout, stderr) = run(cli(&["publish", channel, wrapped])).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("takes the message's data itself"),
        "{stderr}"
    );
    assert!(stderr.contains(r#"'{"x":5}'"#), "{stderr}");
    assert!(stderr.contains("add --raw"), "{stderr}");
    assert_eq!(server.api.head(channel).await, 4, "a refused publish wrote");
    // With --raw it is stored as it is.
    let (code, stdout, stderr) = run(cli(&["publish", "--raw", channel, wrapped])).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(json_line(stdout.trim())["offset"], 5);
    let (_, messages) = server.api.history_all(channel, 1000).await;
    assert_eq!(messages[4]["data"], json!({ "data": { "x": 5 } }));

    // A repeated idempotency key: the same answer, and a note on stderr.
    let keyed = || cli(&["publish", channel, "6", "--idempotency-key", "k-6"]);
    let (code, first, stderr) = run(keyed()).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("duplicate"), "{stderr}");
    let (code, second, stderr) = run(keyed()).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(first, second);
    assert!(
        stderr.contains("duplicate: already published at offset 6"),
        "{stderr}"
    );
    assert_eq!(server.api.head(channel).await, 6);

    // --server values that cannot work, each refused naming the fix.
    let addr = &server.url["http://".len()..];
    let with_server = |server_url: String| {
        let mut cmd = herald();
        cmd.args(["status", "--server", &server_url]);
        cmd
    };
    let (code, _, stderr) = run(with_server(addr.to_owned())).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "add http:// (or https://), e.g. --server http://{addr}"
        )),
        "{stderr}"
    );
    let (code, _, stderr) = run(with_server(format!("{}/v1", server.url))).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("ends with /v1"), "{stderr}");
    assert!(
        stderr.contains(&format!("--server {}", server.url)),
        "{stderr}"
    );
    // https:// is spoken: against this plain-HTTP port the TLS handshake
    // fails (a build without TLS would refuse the URL itself).
    let (code, _, stderr) = run(with_server(format!("https://{addr}"))).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "request to https://{addr}/v1/status failed: cannot connect"
        )),
        "{stderr}"
    );
    // A path prefix is kept; when it is wrong, the URL tried is shown.
    let (code, _, stderr) = run(with_server(format!("{}/herald", server.url))).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not_found"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the URL requested was {}/herald/v1/status (check --server)",
            server.url
        )),
        "{stderr}"
    );
}

/// Runs `herald bench <args> --server <server> --json`, expects success and
/// returns its one-line JSON report.
async fn bench_json(server: &Server, args: &[&str]) -> Value {
    let out = within(
        "herald bench",
        Duration::from_secs(60),
        herald()
            .arg("bench")
            .args(args)
            .args(["--server", &server.url, "--json"])
            .output(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "herald bench {args:?}: {out:?}");
    json_line(String::from_utf8(out.stdout).unwrap().trim())
}

/// Scenario 8: `herald bench publish --json` reports a complete run, and
/// the server holds every message it counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_publish_reports_a_complete_run() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let report = bench_json(
        &server,
        &[
            "publish",
            "--messages",
            "300",
            "--concurrency",
            "8",
            "--size",
            "200",
        ],
    )
    .await;
    assert_eq!(report["messages"], 300, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert!(
        report["throughput_msgs_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["throughput_mb_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let latency = &report["latency_ms"];
    let percentile = |name: &str| latency[name].as_f64().unwrap_or(0.0);
    for name in ["p50", "p90", "p99", "p99.9", "max"] {
        assert!(percentile(name) > 0.0, "{name} in {report}");
    }
    assert!(percentile("p50") <= percentile("p99"), "{report}");
    assert!(percentile("p99") <= percentile("max"), "{report}");
    println!(
        "bench: {} msg/s, p50 {} ms, p99 {} ms",
        report["throughput_msgs_per_s"],
        percentile("p50"),
        percentile("p99")
    );

    // The one bench channel, named in the bench namespace, holds exactly
    // what was reported.
    let run_id = report["run_id"].as_str().expect("run_id");
    let prefix = report["channel_prefix"].as_str().expect("channel_prefix");
    assert_eq!(prefix, format!("bench:{run_id}-"));
    let channel = format!("{prefix}0");
    let (head, messages) = server.api.history_all(&channel, 1000).await;
    assert_eq!(head, 300);
    assert_eq!(messages.len(), 300);
    assert!(messages.iter().all(|m| m["data"] == "x".repeat(198)));
}

/// `herald bench publish --batch 25`: every message goes through batch
/// publishes, and the server holds each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_publish_in_batches_stores_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let report = bench_json(
        &server,
        &[
            "publish",
            "--messages",
            "310",
            "--concurrency",
            "4",
            "--batch",
            "25",
        ],
    )
    .await;
    assert_eq!(report["messages"], 310, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    let prefix = report["channel_prefix"].as_str().expect("channel_prefix");
    let (head, messages) = server.api.history_all(&format!("{prefix}0"), 1000).await;
    assert_eq!(head, 310);
    assert_eq!(messages.len(), 310);
}

/// `herald bench fanout --json`, over both transports: every subscriber
/// receives every message of its channel exactly once, the report counts
/// them, and the server's resident memory per subscriber is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fanout_reports_complete_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    for transport in ["sse", "ws"] {
        let report = bench_json(
            &server,
            &[
                "fanout",
                "--subscribers",
                "30",
                "--channels",
                "3",
                "--rate",
                "40",
                "--duration",
                "1s",
                "--transport",
                transport,
            ],
        )
        .await;
        assert_eq!(report["transport"], transport, "{report}");
        assert_eq!(report["publish_errors"], 0, "{report}");
        let published = report["published"].as_u64().unwrap();
        assert_eq!(published, 40, "{report}");
        // 30 subscribers over 3 channels: each message reaches 10.
        assert_eq!(report["expected_deliveries"], published * 10, "{report}");
        assert_eq!(report["deliveries"], published * 10, "{report}");
        assert_eq!(report["missed"], 0, "{report}");
        assert_eq!(report["duplicated"], 0, "{report}");
        let p50 = report["latency_ms_p50"].as_f64().unwrap();
        let max = report["latency_ms_max"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= max, "{report}");
        assert!(
            report["resident_bytes_per_subscriber"].is_number(),
            "{report}"
        );
    }
}

/// `herald bench fanout` with URL templates (the form that measures any
/// server), pointed at Herald's own URLs: the same complete delivery, the
/// memory left to the caller; `--hold` connects and reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fanout_with_url_templates() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_holder(dir.path()).await;
    let subscribe = format!("{}/v1/channels/{{channel}}/events", server.url);
    let publish = format!("{}/v1/channels/{{channel}}/messages", server.url);
    let report = bench_json(
        &server,
        &[
            "fanout",
            "--subscribers",
            "20",
            "--channels",
            "2",
            "--rate",
            "40",
            "--duration",
            "1s",
            "--channel-prefix",
            "templated-",
            "--subscribe-url",
            &subscribe,
            "--publish-url",
            &publish,
        ],
    )
    .await;
    assert_eq!(report["publish_errors"], 0, "{report}");
    let published = report["published"].as_u64().unwrap();
    assert_eq!(published, 40, "{report}");
    assert_eq!(report["deliveries"], published * 10, "{report}");
    assert_eq!(report["missed"], 0, "{report}");
    assert_eq!(report["duplicated"], 0, "{report}");
    assert!(
        report["resident_bytes_per_subscriber"].is_null(),
        "{report}"
    );
    let (head, _) = server.api.history_all("templated-1", 1000).await;
    assert_eq!(head, 20);

    let mut hold = herald()
        .args([
            "bench",
            "fanout",
            "--hold",
            "--subscribers",
            "5",
            "--subscribe-url",
            &subscribe,
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(hold.stdout.take().unwrap()).lines();
    let line = next_json_line(&mut out).await;
    assert_eq!(line["connected"], 5, "{line}");
    hold.kill().await.unwrap();
}

/// Drain: SIGTERM while an SSE subscriber is connected ends its response
/// body, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_sse_streams_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_holder(dir.path()).await;
    let channel = "drain";
    for n in 1..=3u64 {
        server.api.publish(channel, &json!(n)).await;
    }
    let mut sse = server.api.sse(channel, "?after=0", &[]).await;
    for want in 1..=3u64 {
        assert_eq!(sse.expect_message().await.0, want);
    }

    let started = Instant::now();
    server.sigterm();
    let end = within("the next SSE event", WAIT, sse.read_message()).await;
    assert_eq!(
        end.err(),
        Some(SseEnd::Closed),
        "the stream did not end cleanly"
    );
    let (status, _) = server.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    println!(
        "drain: exited {} ms after SIGTERM",
        started.elapsed().as_millis()
    );

    // A new node on the directory becomes holder and finds the messages.
    let next = Server::start_holder(dir.path()).await;
    assert_eq!(next.api.head(channel).await, 3);
    let seen: HashSet<u64> = next
        .api
        .history_all(channel, 1000)
        .await
        .1
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(seen, (1..=3).collect());
}

/// A client that never finishes its request cannot hold the lease hostage:
/// on SIGTERM the holder releases the lease as soon as its writer is done,
/// the standby takes over at once, and the old holder closes the stuck
/// connection at its drain deadline and still exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_client_does_not_delay_the_handover() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Server::start_with(dir.path(), &["--drain-timeout", "3s"]).await;
    first.api.wait_role("holder", WAIT).await;
    let second = Server::start(dir.path()).await;
    second.api.wait_role("standby", WAIT).await;
    assert_eq!(first.api.publish("stuck", &json!(1)).await, 1);

    // Half a request: the headers never end.
    let addr = first.url.trim_start_matches("http://").to_owned();
    let mut stuck = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stuck, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();

    first.sigterm();
    let signalled = Instant::now();
    let accepted = loop {
        let answer = second
            .api
            .try_publish("stuck", &json!(2), None)
            .await
            .unwrap();
        if answer.status == StatusCode::CREATED {
            break answer;
        }
        // Until it takes over, the standby forwards to the draining holder
        // (which answers `draining`) or has no holder to forward to.
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        let code = answer.body["error"]["code"].as_str().unwrap_or_default();
        assert!(
            code == "draining" || code == "no_holder",
            "unexpected answer during the handover: {answer:?}"
        );
        assert!(signalled.elapsed() < WAIT, "the standby never took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = signalled.elapsed();
    println!("handover with a stuck client: {} ms", took.as_millis());
    assert!(
        took < Duration::from_secs(2),
        "the standby waited {took:?} for the stuck client (drain timeout 3 s)"
    );
    assert_eq!(accepted.body["offset"], 2);
    let (status, _) = first.wait_exit(WAIT).await;
    assert_eq!(
        status.code(),
        Some(0),
        "a drain that closes stuck clients still exits 0"
    );
    drop(stuck);
}
