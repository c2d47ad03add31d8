//! Helpers of the scenario tests: the `herald` binary run as a child
//! process (killed when its guard is dropped), a small HTTP client for the
//! API, an SSE reader, and bounded waits. Each test binary uses a part of
//! them.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// Default bound of any wait on another process.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Pause between two looks at something another process changes.
const POLL: Duration = Duration::from_millis(20);

/// The binary under test: `HERALD_BIN` when set (a release build, say),
/// else the one Cargo built for this test.
pub(crate) fn herald_bin() -> PathBuf {
    std::env::var_os("HERALD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_herald")))
}

/// A `herald` command with no `HERALD_*` settings inherited, logging at
/// `info`, no stdin, killed when dropped.
pub(crate) fn herald() -> Command {
    let mut cmd = Command::new(herald_bin());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HERALD_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Awaits `f`, failing the test after `limit`.
pub(crate) async fn within<T>(what: &str, limit: Duration, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// One `herald serve` process.
pub(crate) struct Server {
    child: Child,
    /// `http://<bound address>`.
    pub(crate) url: String,
    /// A client of this server's API.
    pub(crate) api: Api,
    /// The process's stderr, one record per line.
    log: Arc<Mutex<Vec<String>>>,
    /// Woken after each line is added to `log`.
    logged: Arc<Notify>,
}

impl Server {
    /// Starts `herald serve` on `data_dir` and returns once its log says
    /// which address it bound.
    pub(crate) async fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[]).await
    }

    /// Like [`Server::start`], with more `herald serve` flags.
    pub(crate) async fn start_with(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_listening(data_dir, "127.0.0.1:0", extra).await
    }

    /// Like [`Server::start_with`], listening on `listen`.
    pub(crate) async fn start_listening(data_dir: &Path, listen: &str, extra: &[&str]) -> Self {
        let mut child = herald()
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--log-format")
            .arg("json")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn herald serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let logged = Arc::new(Notify::new());
        let (addr_tx, addr_rx) = oneshot::channel::<String>();
        let lines = log.clone();
        let line_logged = logged.clone();
        tokio::spawn(async move {
            let mut addr_tx = Some(addr_tx);
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(record) = serde_json::from_str::<Value>(&line) {
                    if record["message"] == "listening" {
                        if let (Some(tx), Some(addr)) = (addr_tx.take(), record["addr"].as_str()) {
                            let _ = tx.send(addr.to_owned());
                        }
                    }
                }
                lines.lock().unwrap().push(line);
                line_logged.notify_waiters();
            }
        });
        let addr = tokio::select! {
            addr = addr_rx => addr.ok(),
            status = child.wait() => {
                panic!("herald serve exited with {status:?} before listening")
            }
            () = tokio::time::sleep(WAIT) => None,
        };
        let Some(addr) = addr else {
            panic!(
                "herald serve did not log its address; log:\n{}",
                log.lock().unwrap().join("\n")
            );
        };
        let url = format!("http://{addr}");
        Self {
            child,
            api: Api::new(&url),
            url,
            log,
            logged,
        }
    }

    /// Starts a server and waits until it holds the writer lease.
    pub(crate) async fn start_holder(data_dir: &Path) -> Self {
        let server = Self::start(data_dir).await;
        server.api.wait_role("holder", WAIT).await;
        server
    }

    /// Sends SIGTERM (drain).
    pub(crate) fn sigterm(&self) {
        let pid = self.child.id().expect("the server is still running");
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid fits i32"))
            .expect("a non-zero pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("send SIGTERM");
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...).
    pub(crate) fn signal(&self, signal: rustix::process::Signal) {
        let pid = self.child.id().expect("the server is still running");
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid fits i32"))
            .expect("a non-zero pid");
        rustix::process::kill_process(pid, signal).expect("send a signal");
    }

    /// Sends SIGKILL.
    pub(crate) fn sigkill(&mut self) {
        self.child.start_kill().expect("send SIGKILL");
    }

    /// Waits for the process to exit; returns its status and when it was seen.
    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, Instant) {
        let status = within("herald serve to exit", limit, self.child.wait())
            .await
            .expect("wait for herald serve");
        (status, Instant::now())
    }

    /// The stderr lines so far.
    pub(crate) fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The JSON log records so far (`--log-format json`).
    pub(crate) fn log_records(&self) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Server {
    /// Waits up to `limit` for a JSON log record for which `matches` is
    /// true, and returns the first such record; panics (with the log)
    /// when none came.
    pub(crate) async fn wait_log_record(
        &self,
        what: &str,
        limit: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            // Registered before the check, so a line added in between
            // still wakes this waiter.
            let logged = self.logged.notified();
            if let Some(record) = self.log_records().into_iter().find(|r| matches(r)) {
                return record;
            }
            if tokio::time::timeout_at(deadline, logged).await.is_err() {
                panic!(
                    "{} never logged {what} within {limit:?}; log:\n{}",
                    self.url,
                    self.log_text()
                );
            }
        }
    }

    /// The record of this node's most recent acquisition of the writer
    /// lease (`writer lease acquired`, with `token`, `reason` and
    /// `previous_holder`), waiting up to `limit` for one whose token is
    /// above `after_token`.
    pub(crate) async fn acquisition(&self, after_token: u64, limit: Duration) -> Value {
        self.wait_log_record("a lease acquisition", limit, |r| {
            r["message"] == "writer lease acquired"
                && r["token"].as_u64().is_some_and(|t| t > after_token)
        })
        .await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.url, self.log_text());
        }
    }
}

/// A client of one server's HTTP API.
#[derive(Clone)]
pub(crate) struct Api {
    /// Base URL without a trailing `/`.
    pub(crate) base: String,
    /// For one-shot requests (10 s timeout each).
    http: reqwest::Client,
    /// For streams: no total timeout.
    stream_http: reqwest::Client,
}

/// The answer to one request: status and JSON body (`null` when the body
/// is not JSON).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
}

impl Answer {
    /// Asserts the `{"error":{"code","message"}}` shape with `code`.
    pub(crate) fn assert_error(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.body["error"]["code"], code, "{self:?}");
        let message = self.body["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "an error without a message: {self:?}");
    }
}

impl Api {
    /// A client of the server at `base`.
    pub(crate) fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .timeout(WAIT)
                .build()
                .expect("build the HTTP client"),
            stream_http: reqwest::Client::builder()
                .connect_timeout(WAIT)
                .build()
                .expect("build the HTTP client"),
        }
    }

    fn messages_url(&self, channel: &str) -> String {
        format!("{}/v1/channels/{channel}/messages", self.base)
    }

    async fn answer(resp: reqwest::Response) -> Result<Answer, reqwest::Error> {
        let status = resp.status();
        let bytes = resp.bytes().await?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// `POST` a raw body to a channel's messages.
    pub(crate) async fn post_raw(
        &self,
        channel: &str,
        body: Vec<u8>,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        let mut req = self
            .http
            .post(self.messages_url(channel))
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key);
        }
        Self::answer(req.send().await?).await
    }

    /// Publishes `{"data": data}`.
    pub(crate) async fn try_publish(
        &self,
        channel: &str,
        data: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        let body = serde_json::to_vec(&json!({ "data": data })).expect("serialize");
        self.post_raw(channel, body, idempotency_key).await
    }

    /// Publishes `data`, expecting 201; returns the acknowledged offset.
    pub(crate) async fn publish(&self, channel: &str, data: &Value) -> u64 {
        let answer = self
            .try_publish(channel, data, None)
            .await
            .expect("publish request");
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        assert_eq!(answer.body["channel"], channel, "{answer:?}");
        assert!(answer.body["published_at"].is_string(), "{answer:?}");
        answer.body["offset"].as_u64().expect("an offset")
    }

    /// `GET` a path (with its query), expecting a JSON answer.
    pub(crate) async fn get(&self, path_and_query: &str) -> Answer {
        let resp = self
            .http
            .get(format!("{}{path_and_query}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"));
        Self::answer(resp)
            .await
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"))
    }

    /// One history page.
    pub(crate) async fn history_page(&self, channel: &str, after: u64, limit: u32) -> Value {
        let answer = self
            .get(&format!(
                "/v1/channels/{channel}/messages?after={after}&limit={limit}"
            ))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.body
    }

    /// The channel's head (0 for a channel never written).
    pub(crate) async fn head(&self, channel: &str) -> u64 {
        self.history_page(channel, 0, 1).await["head"]
            .as_u64()
            .expect("a head")
    }

    /// Every stored message of `channel`, paging `limit` at a time, and the
    /// head of the first page. Checks each page's shape on the way.
    pub(crate) async fn history_all(&self, channel: &str, limit: u32) -> (u64, Vec<Value>) {
        let mut after = 0;
        let mut head = None;
        let mut all = Vec::new();
        loop {
            let page = self.history_page(channel, after, limit).await;
            assert_eq!(page["channel"], channel, "{page}");
            head.get_or_insert(page["head"].as_u64().expect("a head"));
            let messages = page["messages"].as_array().expect("messages").clone();
            assert!(messages.len() <= limit as usize, "page over its limit");
            let Some(last) = messages.last() else { break };
            after = last["offset"].as_u64().expect("an offset");
            all.extend(messages);
        }
        (head.unwrap_or(0), all)
    }

    /// `/v1/status`.
    pub(crate) async fn status(&self) -> Value {
        let answer = self.get("/v1/status").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.body
    }

    /// Polls `/v1/status` until `role` shows, failing after `limit`.
    pub(crate) async fn wait_role(&self, role: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let status = self.status().await;
            if status["role"] == role {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not become {role} within {limit:?}: {status}",
                self.base
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Opens a channel's SSE stream with extra `headers` and `query`.
    pub(crate) async fn sse(
        &self,
        channel: &str,
        query: &str,
        headers: &[(&str, &str)],
    ) -> SseStream {
        let mut req = self
            .stream_http
            .get(format!("{}/v1/channels/{channel}/events{query}", self.base))
            .header("accept", "text/event-stream");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = within("the SSE answer", WAIT, req.send())
            .await
            .expect("open the SSE stream");
        assert_eq!(resp.status(), StatusCode::OK);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        SseStream {
            events: Box::pin(resp.bytes_stream().eventsource()),
        }
    }
}

/// What `eventsource-stream` makes of a response body.
type EventResult =
    Result<eventsource_stream::Event, eventsource_stream::EventStreamError<reqwest::Error>>;

/// Message events of one SSE response.
pub(crate) struct SseStream {
    events: Pin<Box<dyn Stream<Item = EventResult> + Send>>,
}

/// How an SSE stream ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SseEnd {
    /// The body finished cleanly.
    Closed,
    /// The body broke.
    Broken(String),
}

impl SseStream {
    /// The next message event as `(id, message JSON)`, or how the stream
    /// ended; fails after `limit`.
    pub(crate) async fn next_message(&mut self, limit: Duration) -> Result<(u64, Value), SseEnd> {
        within("the next SSE event", limit, async {
            loop {
                match self.events.next().await {
                    None => return Err(SseEnd::Closed),
                    Some(Err(e)) => return Err(SseEnd::Broken(e.to_string())),
                    Some(Ok(event)) if event.event == "message" => {
                        let id: u64 = event.id.parse().expect("a numeric event id");
                        let message: Value =
                            serde_json::from_str(&event.data).expect("JSON event data");
                        assert_eq!(message["offset"], id, "the id is the message's offset");
                        return Ok((id, message));
                    }
                    Some(Ok(_)) => {}
                }
            }
        })
        .await
    }

    /// The next message event; fails the test when the stream ends.
    pub(crate) async fn expect_message(&mut self) -> (u64, Value) {
        self.next_message(WAIT)
            .await
            .unwrap_or_else(|end| panic!("the SSE stream ended: {end:?}"))
    }
}

/// A PostgreSQL cluster of a test's own, for faults that would disturb
/// other tests (a restart). Made with the server binaries that the test
/// command names in `HERALD_TEST_PG_BIN`, run as `HERALD_TEST_PG_USER` when
/// the tests run as root; stopped and removed on drop.
pub(crate) struct PrivateCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<String>,
    port: u16,
}

impl PrivateCluster {
    /// Creates and starts the cluster on a free loopback port.
    pub(crate) async fn start() -> Self {
        let bin =
            PathBuf::from(std::env::var("HERALD_TEST_PG_BIN").expect(
                "HERALD_TEST_PG_BIN names PostgreSQL's server binaries; run ./scripts/test",
            ));
        let user = std::env::var("HERALD_TEST_PG_USER")
            .ok()
            .filter(|_| rustix::process::geteuid().is_root());
        let dir = tempfile::tempdir().expect("a temp dir");
        if let Some(user) = &user {
            let status = std::process::Command::new("chown")
                .arg(user)
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown {user} failed");
        }
        let cluster = Self {
            dir,
            bin,
            user,
            port: 0,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "herald",
                "--auth=trust",
                "--no-sync",
            ],
        );
        let mut cluster = cluster;
        for _ in 0..20 {
            let port = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
                l.local_addr().unwrap().port()
            };
            cluster.port = port;
            if cluster.try_pg_ctl(&["start", "-w", "-t", "30", "-o", &cluster.options()]) {
                return cluster;
            }
        }
        panic!("could not start a private PostgreSQL cluster");
    }

    /// URL of the cluster's `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://herald@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl restart -m fast`: every session ends; the server is back
    /// when this returns.
    pub(crate) fn restart_fast(&self) {
        assert!(
            self.try_pg_ctl(&[
                "restart",
                "-m",
                "fast",
                "-w",
                "-t",
                "30",
                "-o",
                &self.options()
            ]),
            "pg_ctl restart failed"
        );
    }

    /// `pg_ctl stop -m fast`: every session ends and the server is down
    /// when this returns (connections are refused until [`Self::start_again`]).
    pub(crate) fn stop_fast(&self) {
        assert!(
            self.try_pg_ctl(&["stop", "-m", "fast", "-w", "-t", "30"]),
            "pg_ctl stop failed"
        );
    }

    /// Starts the stopped server again on the same port; it accepts
    /// connections when this returns.
    pub(crate) fn start_again(&self) {
        assert!(
            self.try_pg_ctl(&["start", "-w", "-t", "30", "-o", &self.options()]),
            "pg_ctl start failed"
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn options(&self) -> String {
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        )
    }

    fn try_pg_ctl(&self, args: &[&str]) -> bool {
        let data = self.data();
        let log = self.dir.path().join("server.log");
        let mut full = vec!["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap()];
        full.extend_from_slice(args);
        self.command("pg_ctl", &full)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = self
            .command(tool, args)
            .output()
            .expect("run a PostgreSQL tool");
        assert!(
            out.status.success(),
            "{tool} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, tool: &str, args: &[&str]) -> std::process::Command {
        let program = self.bin.join(tool);
        match &self.user {
            Some(user) => {
                let mut c = std::process::Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(program).args(args);
                c
            }
            None => {
                let mut c = std::process::Command::new(program);
                c.args(args);
                c
            }
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.try_pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }
}
