//! The web console (`docs/console.md`) in a real browser against a real
//! cluster: three `herald serve` processes on one PostgreSQL database, the
//! console enabled, its pages driven in headless Chromium by
//! `tests/clients/console.mjs` (Node.js with `playwright-core`), which
//! signs in with the keyboard, reads what the pages show and acts through
//! their forms.
//!
//! One scenario, in order:
//! 1. a page on a standby shows the holder and its fencing token, as the
//!    admin API says them, and every node;
//! 2. a message published with the publish form of one page (with an
//!    idempotency key; the same again is answered as already published)
//!    appears in the live tail of another page, on another node;
//! 3. the holder is killed with SIGKILL: the page on the standby shows the
//!    new holder and the takeover in its timeline within two seconds of
//!    the kill, and the killed node `gone` in the same rendering;
//! 4. the node that serves the live tail is killed with SIGKILL and
//!    started again on its address while messages are published: the tail
//!    shows every message exactly once, in order; a cluster page served
//!    by that node greys out every card with "as of HH:MM:SS" and stops
//!    its countdown while it reconnects, and comes back after; another
//!    page shows the killed node `silent`, coloured, with when it was last
//!    seen, and the node killed in 3. still listed `gone` after its report
//!    expired; the nodes' rates show the publishes, the deliveries and the
//!    tail's subscription;
//! 5. a page without an admin credential is refused: sign-in with an
//!    unknown key, and a deletion without a credential (401) or with a key
//!    without `admin` (403), which leave the channel as it was; with the
//!    admin key the page shows that the channel keeps no presence, its
//!    "Remove history" action (confirmed with the keyboard) removes the
//!    messages, a deletion succeeds, and both are in the audit log with
//!    the key's name;
//! 6. the main views pass the driver's accessibility checks (labels,
//!    headings, keyboard reach of the main actions);
//! 7. the holder is stopped with SIGTERM (a planned handover): the page on
//!    the other node shows the `released` takeover from the node that
//!    released, then that node `silent`, coloured apart from the holder
//!    and the gone node, with when it was last seen; and no page ever had
//!    an uncaught error or a Content Security Policy violation.
//!
//! Screenshots of each view are kept in `<target>/tmp/console-screenshots`
//! (not compared: they are for people). The test command installs the
//! packages (`npm ci` in `tests/clients`) and Debian's `chromium`.

use std::path::PathBuf;
use std::time::Duration;

use herald_testkit::api::Api;
use herald_testkit::clients::{chromium_bin, node_bin, node_clients, ClientProcess};
use herald_testkit::process::{Server, FAST_LEASE};
use herald_testkit::{within, TestDatabase, NODE_WAIT, POLL, WAIT};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::time::Instant;

/// The channel the pages publish to and tail.
const CHANNEL: &str = "news:console";

/// Bound of one driver command: starting Chromium and loading a page on a
/// busy machine takes seconds.
const BROWSER_WAIT: Duration = Duration::from_secs(60);

/// From the holder's kill to the page showing the new holder and the
/// takeover (the console's promise: a takeover after a crash takes about
/// 50 ms on PostgreSQL, and the page gets a view every second).
const SHOWN_WITHIN: Duration = Duration::from_secs(2);

/// One `node console.mjs` process, which owns the browser.
struct Driver {
    process: ClientProcess,
    /// `page_error` reports so far (uncaught errors, CSP violations).
    page_errors: Vec<Value>,
}

impl Driver {
    fn start(shots: &std::path::Path, tmp: &std::path::Path) -> Self {
        let clients = node_clients(&["playwright-core"], &["console.mjs", "chromium.mjs"]);
        let mut command = Command::new(node_bin());
        command
            .arg(clients.join("console.mjs"))
            .arg(chromium_bin())
            .arg(shots)
            .current_dir(&clients)
            .env("TMPDIR", tmp);
        Self {
            process: ClientProcess::spawn(command),
            page_errors: Vec::new(),
        }
    }

    fn stderr_text(&self) -> String {
        self.process.stderr_text()
    }

    /// Sends `command` and returns its answer, which must say `ok`.
    async fn call(&mut self, command: Value) -> Value {
        let answer = self.try_call(command.clone()).await;
        assert_eq!(
            answer["ok"],
            true,
            "{command} -> {answer}; stderr:\n{}",
            self.stderr_text()
        );
        answer
    }

    /// Sends `command` and returns its answer, whatever it says.
    async fn try_call(&mut self, command: Value) -> Value {
        self.process.send_line(&command.to_string()).await;
        loop {
            let line = within(
                &format!("the answer to {command}"),
                BROWSER_WAIT,
                self.process.reports.next_line(),
            )
            .await
            .expect("read the driver's stdout");
            let Some(line) = line else {
                let status = within("console.mjs to exit", WAIT, self.process.child.wait()).await;
                panic!(
                    "console.mjs ended ({status:?}) before answering {command}; stderr:\n{}",
                    self.stderr_text()
                );
            };
            let record: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a line that is not JSON ({e}): {line}"));
            match record["type"].as_str() {
                Some("answer") => return record,
                Some("page_error") => self.page_errors.push(record),
                _ => panic!("an unexpected record: {record}"),
            }
        }
    }

    /// Asks what page `page` shows of the cluster until `done` holds.
    async fn cluster_until(&mut self, page: &str, what: &str, done: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + NODE_WAIT;
        loop {
            let shown = self.call(json!({"cmd": "cluster", "page": page})).await;
            if done(&shown) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "page {page} did not show {what} within {NODE_WAIT:?}: {shown}"
            );
            // Pacing between two looks at the page.
            tokio::time::sleep(POLL).await;
        }
    }

    async fn quit(mut self) -> Vec<Value> {
        let _ = self.try_call(json!({"cmd": "quit"})).await;
        let _ = within("console.mjs to exit", WAIT, self.process.child.wait()).await;
        self.page_errors
    }
}

/// The directory the screenshots are kept in: `<target>/tmp/console-screenshots`.
fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir
}

/// The config file: the console on; an admin key `ops`, a key `app` that
/// may publish and read but not administer, and a cluster secret.
fn write_config(path: &std::path::Path, admin: &str, app: &str) {
    let cluster_secret = herald_auth::generate_api_key();
    std::fs::write(
        path,
        format!(
            "[console]\n\
             enabled = true\n\
             \n\
             [auth]\n\
             cluster_secret = \"{cluster_secret}\"\n\
             api_keys = [\n\
             {{ name = \"ops\", sha256 = \"{}\", permissions = [\"publish\", \"read\", \"admin\"] }},\n\
             {{ name = \"app\", sha256 = \"{}\", permissions = [\"publish\", \"read\"] }},\n\
             ]\n",
            herald_auth::api_key_sha256(admin),
            herald_auth::api_key_sha256(app),
        ),
    )
    .expect("write the config file");
}

/// The cluster as `api`'s node answers it (`GET /v1/admin/cluster`).
async fn cluster(api: &Api) -> Value {
    let answer = api.get("/v1/admin/cluster").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body
}

/// Report TTL of a node (`REPORT_TTL` of the server's node reports): a
/// node silent for longer has no report row left in the storage.
const REPORT_TTL: Duration = Duration::from_secs(10);

/// The node row `node_id` of a `cluster` answer.
fn node_row<'a>(shown: &'a Value, node_id: &str) -> &'a Value {
    shown["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node_id"] == node_id))
        .unwrap_or_else(|| panic!("no row of {node_id}: {shown}"))
}

/// Whether `text` is "as of HH:MM:SS UTC".
fn is_as_of(text: &Value) -> bool {
    text.as_str().is_some_and(|t| {
        let Some(clock) = t
            .strip_prefix("as of ")
            .and_then(|t| t.strip_suffix(" UTC"))
        else {
            return false;
        };
        clock.len() == 8
            && clock.chars().enumerate().all(|(i, ch)| {
                if i == 2 || i == 5 {
                    ch == ':'
                } else {
                    ch.is_ascii_digit()
                }
            })
    })
}

/// Publishes `{"n": n}` through `api`, retried until acknowledged at
/// offset `n` ([`Api::publish_numbered`]): a restart or a takeover makes
/// answers fail for a moment.
async fn publish(api: &Api, n: u64) {
    api.publish_numbered(CHANNEL, n, NODE_WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_follows_a_cluster_through_a_takeover_and_a_restart() {
    // Fail at once, before a server starts, when the set-up is missing.
    node_clients(&["playwright-core"], &["console.mjs", "chromium.mjs"]);
    chromium_bin();

    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = dir.path().join("herald.toml");
    let admin = herald_auth::generate_api_key();
    let app = herald_auth::generate_api_key();
    write_config(&config, &admin, &app);
    let config = config.to_str().expect("a UTF-8 path").to_owned();
    let flags = |node: &'static str| {
        let mut flags = vec![
            "--database",
            db.url(),
            "--node-id",
            node,
            "--config",
            &config,
        ];
        flags.extend_from_slice(FAST_LEASE);
        flags
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<Vec<String>>()
    };
    let start = |node: &'static str, listen: String| {
        let data = dir.path().join(node);
        let flags = flags(node);
        async move {
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            Server::start_listening(&data, &listen, &flags).await
        }
    };
    let mut a = start("node-a", "127.0.0.1:0".to_owned()).await;
    a.api.wait_role("holder", NODE_WAIT).await;
    let b = start("node-b", "127.0.0.1:0".to_owned()).await;
    b.api.wait_role("standby", NODE_WAIT).await;
    let mut c = start("node-c", "127.0.0.1:0".to_owned()).await;
    c.api.wait_role("standby", NODE_WAIT).await;
    let b_api = Api::with_api_key(&b.url, &admin);

    let shots = screenshot_dir();
    let tmp = dir.path().join("browser-tmp");
    std::fs::create_dir(&tmp).expect("a temp dir for the browser");
    let mut driver = Driver::start(&shots, &tmp);

    // 1. A page on standby b shows the holder, its token, every node.
    let before = cluster(&b_api).await;
    assert_eq!(before["lease"]["holder"], "node-a", "{before}");
    let token = before["lease"]["token"].as_u64().expect("a token");
    let opened = driver
        .call(
            json!({"cmd": "open", "page": "A", "url": format!("{}/console/", b.url), "key": admin}),
        )
        .await;
    assert_eq!(opened["signed_in"], true, "{opened}");
    driver
        .cluster_until("A", "the holder, its token and three nodes", |shown| {
            shown["holder"] == "node-a"
                && shown["token"] == token
                && shown["status"] == "live"
                && shown["nodes"].as_array().is_some_and(|n| n.len() == 3)
        })
        .await;
    let shown = driver.call(json!({"cmd": "cluster", "page": "A"})).await;
    let roles: Vec<(&str, &str)> = shown["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["node_id"].as_str().unwrap_or(""),
                n["role"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [
            ("node-a", "holder"),
            ("node-b", "standby"),
            ("node-c", "standby")
        ],
        "{shown}"
    );
    driver
        .call(json!({"cmd": "screenshot", "page": "A", "name": "cluster"}))
        .await;
    let a11y = driver.call(json!({"cmd": "a11y", "page": "A"})).await;
    assert_eq!(a11y["problems"], json!([]), "cluster view: {a11y}");

    // 2. Page B on standby c tails the channel; page A publishes through
    // its form (on b, which forwards to the holder).
    let opened = driver
        .call(
            json!({"cmd": "open", "page": "B", "url": format!("{}/console/", c.url), "key": admin}),
        )
        .await;
    assert_eq!(opened["signed_in"], true, "{opened}");
    driver
        .call(json!({"cmd": "tail", "page": "B", "channel": CHANNEL}))
        .await;
    let published = driver
        .call(json!({"cmd": "publish", "page": "A", "channel": CHANNEL,
                     "data": "{\"n\": 1}", "idempotency_key": "n-1"}))
        .await;
    assert_eq!(published["offset"], 1, "{published}");
    let again = driver
        .call(json!({"cmd": "publish", "page": "A", "channel": CHANNEL,
                     "data": "{\"n\": 1}", "idempotency_key": "n-1"}))
        .await;
    assert_eq!(again["offset"], 1, "a retry is the same message: {again}");
    assert!(
        again["text"]
            .as_str()
            .is_some_and(|t| t.to_lowercase().contains("already")),
        "{again}"
    );
    let tail = driver
        .call(json!({"cmd": "wait_tail", "page": "B", "count": 1}))
        .await;
    assert_eq!(tail["offsets"], json!([1]), "{tail}");
    let a11y = driver.call(json!({"cmd": "a11y", "page": "A"})).await;
    assert_eq!(a11y["problems"], json!([]), "channel view: {a11y}");
    driver
        .call(json!({"cmd": "screenshot", "page": "A", "name": "channel"}))
        .await;

    // 3. The holder dies; page A must show the takeover within two
    // seconds of the kill.
    let killed = Instant::now();
    a.sigkill();
    let (status, _) = a.wait_exit(WAIT).await;
    assert!(!status.success(), "the holder was killed: {status}");
    let deadline = Instant::now() + NODE_WAIT;
    let after = loop {
        let now = cluster(&b_api).await;
        let held = now["lease"]["expires_in_ms"].as_i64().unwrap_or(0) > 0;
        if held && now["lease"]["holder"] != "node-a" && now["lease"]["holder"].is_string() {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "no takeover within {NODE_WAIT:?}: {now}"
        );
        // Pacing between two reads of the admin API.
        tokio::time::sleep(POLL).await;
    };
    let readable = Instant::now();
    let new_holder = after["lease"]["holder"]
        .as_str()
        .expect("a holder")
        .to_owned();
    let new_token = after["lease"]["token"].as_u64().expect("a token");
    assert!(new_token > token, "{after}");
    let shown = driver
        .call(json!({"cmd": "wait_holder", "page": "A", "not": "node-a",
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}))
        .await;
    let took = killed.elapsed();
    println!(
        "the page showed the takeover {} ms after the kill, {} ms after the admin API did",
        took.as_millis(),
        readable.elapsed().as_millis()
    );
    assert!(
        took <= SHOWN_WITHIN,
        "the page showed the takeover {took:?} after the kill: {shown}"
    );
    assert_eq!(shown["holder"], new_holder.as_str(), "{shown}");
    assert_eq!(shown["token"], new_token, "{shown}");
    assert_eq!(shown["takeover"]["from"], "node-a", "{shown}");
    assert_eq!(shown["takeover"]["to"], new_holder.as_str(), "{shown}");
    assert!(
        ["holder_gone", "expired"].contains(&shown["takeover"]["reason"].as_str().unwrap_or("")),
        "{shown}"
    );
    // The database saw the holder's sessions end: in the very rendering
    // that shows that takeover, the killed node is gone.
    if shown["takeover"]["reason"] == "holder_gone" {
        let then = shown["nodes_then"].as_array().expect("nodes_then");
        let a_then = then
            .iter()
            .find(|n| n["node_id"] == "node-a")
            .unwrap_or_else(|| panic!("node-a not listed: {shown}"));
        assert_eq!(a_then["role"], "gone", "{shown}");
    } else {
        println!(
            "the takeover was {}, not holder_gone",
            shown["takeover"]["reason"]
        );
    }
    driver
        .call(json!({"cmd": "screenshot", "page": "A", "name": "takeover"}))
        .await;

    // 4. Node c, which serves page B's tail, is killed and restarted
    // while messages are published through b: the tail shows each once,
    // in order.
    for n in 2..=4 {
        publish(&b_api, n).await;
    }
    // Page D shows the cluster as node c serves it.
    let opened = driver
        .call(
            json!({"cmd": "open", "page": "D", "url": format!("{}/console/", c.url), "key": admin}),
        )
        .await;
    assert_eq!(opened["signed_in"], true, "{opened}");
    let fresh = driver
        .call(json!({"cmd": "wait_cluster", "page": "D", "stale": false}))
        .await;
    assert_eq!(fresh["cards"].as_array().map(Vec::len), Some(3), "{fresh}");
    let c_addr = c.url.trim_start_matches("http://").to_owned();
    c.sigkill();
    let (status, _) = c.wait_exit(NODE_WAIT).await;
    assert!(!status.success(), "node c was killed: {status}");
    // While its node is down, page D greys out every card and says as of
    // when; the lease countdown stands at the last view's figure.
    let stale = driver
        .call(json!({"cmd": "wait_cluster", "page": "D", "stale": true,
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}))
        .await;
    assert_ne!(stale["status"], "live", "{stale}");
    let cards = stale["cards"].as_array().expect("cards");
    assert_eq!(cards.len(), 3, "{stale}");
    for card in cards {
        assert_eq!(card["stale"], true, "{stale}");
        assert!(is_as_of(&card["as_of"]), "{stale}");
    }
    let expires_in_ms = stale["expiry"]["expires_in_ms"]
        .as_f64()
        .expect("expires_in_ms");
    let standing = if expires_in_ms > 0.0 {
        format!("{:.1} s", expires_in_ms / 1000.0)
    } else {
        "expired".to_owned()
    };
    assert_eq!(stale["expiry"]["text"], standing.as_str(), "{stale}");
    driver
        .call(json!({"cmd": "screenshot", "page": "D", "name": "reconnecting"}))
        .await;
    for n in 5..=7 {
        publish(&b_api, n).await;
    }
    // Page A, on b, shows c silent (no report for two report intervals),
    // or gone when c held the lease (its takeover found it gone), coloured,
    // with when it was last seen.
    let c_role = if new_holder == "node-c" {
        "gone"
    } else {
        "silent"
    };
    let silent = driver
        .call(
            json!({"cmd": "wait_cluster", "page": "A", "node": "node-c", "role": c_role,
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}),
        )
        .await;
    let c_row = node_row(&silent, "node-c");
    let b_row = node_row(&silent, "node-b");
    assert!(
        c_row["last_seen"]
            .as_str()
            .is_some_and(|t| t.contains(" UTC (") && t.ends_with(" ago)")),
        "{silent}"
    );
    assert_ne!(c_row["role_color"], b_row["role_color"], "{silent}");
    let c_before = c;
    let c = start("node-c", c_addr).await;
    let back = driver
        .call(json!({"cmd": "wait_cluster", "page": "D", "stale": false,
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}))
        .await;
    assert_eq!(back["status"], "live", "{back}");
    assert!(
        back["cards"]
            .as_array()
            .is_some_and(|cards| cards.iter().all(|c| c["as_of"].is_null())),
        "{back}"
    );
    for n in 8..=10 {
        publish(&b_api, n).await;
    }
    let tail = driver
        .call(json!({"cmd": "wait_tail", "page": "B", "count": 10,
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}))
        .await;
    let expected: Vec<u64> = (1..=10).collect();
    assert_eq!(tail["offsets"], json!(expected), "{tail}");
    assert_eq!(tail["status"], "live", "{tail}");
    driver
        .call(json!({"cmd": "screenshot", "page": "B", "name": "live-tail"}))
        .await;
    // Node a, killed in 3., is still listed, gone, once its report has
    // expired from the storage.
    let kept = driver
        .call(
            json!({"cmd": "wait_cluster", "page": "A", "node": "node-a", "role": "gone",
                     "min_age_ms": (REPORT_TTL + Duration::from_secs(2)).as_millis() as u64,
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}),
        )
        .await;
    let a_row = node_row(&kept, "node-a");
    assert!(
        a_row["last_seen"]
            .as_str()
            .is_some_and(|t| t.contains(" UTC (") && t.ends_with(" ago)")),
        "{kept}"
    );
    let b_row = node_row(&kept, "node-b");
    assert_ne!(a_row["role_color"], b_row["role_color"], "{kept}");
    driver
        .call(json!({"cmd": "screenshot", "page": "A", "name": "gone"}))
        .await;
    // Each process's own rates: b forwarded or made the publishes, the
    // restarted c delivered the tail's messages to its subscription.
    let rates = |api: Api| async move {
        let answer = api.get("/v1/admin/rates").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.body["samples"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let seen = |samples: &[Value], field: &str| {
        samples
            .iter()
            .filter_map(|s| s[field].as_f64())
            .fold(0.0, f64::max)
    };
    let c_api = Api::with_api_key(&c.url, &admin);
    let deadline = Instant::now() + NODE_WAIT;
    loop {
        let (on_b, on_c) = (rates(b_api.clone()).await, rates(c_api.clone()).await);
        if seen(&on_b, "publishes_per_s") > 0.0
            && seen(&on_c, "deliveries_per_s") > 0.0
            && seen(&on_c, "subscribers") >= 1.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rates without the scenario's work: b {on_b:?}, c {on_c:?}"
        );
        // Pacing between two reads; a sample is taken every second.
        tokio::time::sleep(POLL).await;
    }

    // 5. Without an admin credential, nothing is done.
    let refused = driver
        .call(
            json!({"cmd": "open", "page": "C", "url": format!("{}/console/", c.url),
                     "key": herald_auth::generate_api_key()}),
        )
        .await;
    assert_eq!(refused["signed_in"], false, "{refused}");
    assert!(refused["alert"].is_string(), "{refused}");
    driver
        .call(json!({"cmd": "screenshot", "page": "C", "name": "sign-in-refused"}))
        .await;
    let path = format!("/v1/channels/{CHANNEL}");
    let anonymous = driver
        .call(json!({"cmd": "fetch", "page": "A", "method": "DELETE", "path": path, "auth": false}))
        .await;
    assert_eq!(anonymous["status"], 401, "{anonymous}");
    let app_api = Api::with_api_key(&b.url, &app);
    let answer = app_api.get("/v1/admin/cluster").await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
    let deleted = reqwest::Client::new()
        .delete(format!("{}{path}", b.url))
        .bearer_auth(&app)
        .send()
        .await
        .expect("a deletion with the app key");
    assert_eq!(deleted.status(), StatusCode::FORBIDDEN);
    assert_eq!(b_api.head(CHANNEL).await, 10);
    let history = b_api.get(&format!("{path}/messages")).await;
    assert_eq!(
        history.body["messages"].as_array().map(Vec::len),
        Some(10),
        "{history:?}"
    );
    // The channel's namespace keeps no presence: the page says so.
    let presence = driver
        .call(json!({"cmd": "presence", "page": "A", "channel": CHANNEL}))
        .await;
    assert!(
        presence["text"]
            .as_str()
            .is_some_and(|t| t.contains("not enabled")),
        "{presence}"
    );
    // With the admin key, the page's "Remove history" (confirmed with the
    // keyboard) removes the messages and keeps the head; the audit log
    // says who did it.
    let removed = driver
        .call(json!({"cmd": "action", "page": "A", "channel": CHANNEL, "action": "Remove history"}))
        .await;
    assert!(
        removed["text"]
            .as_str()
            .is_some_and(|t| t.contains("removed")),
        "{removed}"
    );
    assert_eq!(removed["alert"], Value::Null, "{removed}");
    assert_eq!(b_api.head(CHANNEL).await, 10);
    let history = b_api.get(&format!("{path}/messages")).await;
    assert_eq!(history.body["earliest"], 11, "{history:?}");
    let deleted = driver
        .call(json!({"cmd": "fetch", "page": "A", "method": "DELETE", "path": path}))
        .await;
    assert_eq!(deleted["status"], 200, "{deleted}");
    let audit: Vec<Value> = b
        .log_records()
        .into_iter()
        .filter(|r| r["target"] == "herald::audit")
        .collect();
    let actions: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|r| {
            (
                r["actor"].as_str().unwrap_or(""),
                r["action"].as_str().unwrap_or(""),
                r["channel"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("key:ops", "history_remove", CHANNEL),
            ("key:ops", "delete_channel", CHANNEL)
        ],
        "node b's audit log: {audit:?}"
    );

    // 6. The other views, their accessibility, and no page error anywhere.
    let channels = driver
        .call(json!({"cmd": "goto", "page": "A", "view": "channels", "search": "console"}))
        .await;
    assert_eq!(channels["rows"], json!([CHANNEL]), "{channels}");
    let a11y = driver.call(json!({"cmd": "a11y", "page": "A"})).await;
    assert_eq!(a11y["problems"], json!([]), "channels view: {a11y}");
    driver
        .call(json!({"cmd": "screenshot", "page": "A", "name": "channels"}))
        .await;
    driver
        .call(json!({"cmd": "goto", "page": "A", "view": "rates"}))
        .await;
    let a11y = driver.call(json!({"cmd": "a11y", "page": "A"})).await;
    assert_eq!(a11y["problems"], json!([]), "rates view: {a11y}");
    driver
        .call(json!({"cmd": "screenshot", "page": "A", "name": "rates"}))
        .await;

    // 7. A planned handover: the holder drains (SIGTERM) and releases the
    // lease; the page on the other node shows the takeover from it.
    let now = cluster(&b_api).await;
    let holder = now["lease"]["holder"]
        .as_str()
        .expect("a holder")
        .to_owned();
    let (draining, page, other) = match holder.as_str() {
        "node-b" => (&b, "D", "node-c"),
        "node-c" => (&c, "A", "node-b"),
        _ => panic!("an unexpected holder: {now}"),
    };
    driver
        .call(json!({"cmd": "goto", "page": page, "view": "cluster"}))
        .await;
    draining.sigterm();
    let handed = driver
        .call(
            json!({"cmd": "wait_cluster", "page": page, "reason": "released",
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}),
        )
        .await;
    let released = handed["takeovers"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["reason"] == "released"))
        .unwrap_or_else(|| panic!("no released takeover: {handed}"));
    assert_eq!(released["from"], holder.as_str(), "{handed}");
    assert_eq!(released["to"], other, "{handed}");
    // The drained node stopped reporting: silent (its sessions ended by a
    // release, not found gone), coloured apart from the new holder and
    // from node a, gone, with when it was last seen. (A page on node c,
    // restarted after node a's report expired, does not list node a: a
    // node lists the silent and gone nodes whose reports it read.)
    let quiet = driver
        .call(
            json!({"cmd": "wait_cluster", "page": page, "node": holder, "role": "silent",
                     "timeout_ms": BROWSER_WAIT.as_millis() as u64}),
        )
        .await;
    let drained_row = node_row(&quiet, &holder);
    assert!(
        drained_row["last_seen"]
            .as_str()
            .is_some_and(|t| t.contains(" UTC (") && t.ends_with(" ago)")),
        "{quiet}"
    );
    let silent_colour = &drained_row["role_color"];
    assert_ne!(
        silent_colour,
        &node_row(&quiet, other)["role_color"],
        "silent and holder in one colour: {quiet}"
    );
    if page == "A" {
        assert_ne!(
            silent_colour,
            &node_row(&quiet, "node-a")["role_color"],
            "silent and gone in one colour: {quiet}"
        );
    }
    driver
        .call(json!({"cmd": "screenshot", "page": page, "name": "handover"}))
        .await;

    let page_errors = driver.quit().await;
    assert!(page_errors.is_empty(), "page errors: {page_errors:?}");
    for server in [&a, &b, &c_before, &c] {
        assert!(
            !server.log_text().contains(&admin),
            "the admin key is in a node's log"
        );
    }
    println!("screenshots: {}", shots.display());
}
