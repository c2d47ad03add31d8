//! `herald serve` as a child process: [`herald`] builds the command,
//! [`Server`] runs one node (killed when dropped) and reads its JSON log,
//! [`failed_start`] runs a start that must be refused. [`FAST_LEASE`] holds
//! the lease timings that the multi-node tests run with.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::api::Api;
use crate::tls::{IssuedCert, TestCa};
use crate::{within, WAIT};

/// Lease timings short enough for tests: ttl 5 s, margin 1 s (safety
/// deadline 4 s after a renewal is sent), renewal every 500 ms, statement
/// timeout 500 ms: a renewal that times out (2.5 s) is still retried
/// (500 ms later, the retry interval derived from the ttl) before the
/// safety deadline. `herald serve` flags.
pub const FAST_LEASE: &[&str] = &[
    "--lease-ttl",
    "5s",
    "--lease-safety-margin",
    "1s",
    "--lease-renew-interval",
    "500ms",
    "--renew-statement-timeout",
    "500ms",
];

/// The binary under test: `HERALD_BIN` when set (a release build, say),
/// else the `herald` that Cargo built for the running test.
///
/// Cargo builds a package's binaries before it runs the package's
/// integration tests, into the directory above the tests' executables
/// (`<target>/<profile>/deps`); `CARGO_BIN_EXE_herald` names it where
/// Cargo sets that at run time.
///
/// # Panics
/// When neither variable is set and no `herald` lies there: the test is
/// not one of the `herald` package's.
pub fn herald_bin() -> PathBuf {
    if let Some(bin) =
        std::env::var_os("HERALD_BIN").or_else(|| std::env::var_os("CARGO_BIN_EXE_herald"))
    {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("the test's own executable");
    let built = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(format!("herald{}", std::env::consts::EXE_SUFFIX)));
    match built {
        Some(bin) if bin.is_file() => bin,
        _ => panic!(
            "no herald binary next to {}: run the tests of the herald package, or set HERALD_BIN",
            exe.display()
        ),
    }
}

/// A `herald` command with no `HERALD_*` settings inherited, logging at
/// `info`, no stdin, killed when dropped.
pub fn herald() -> Command {
    herald_under(&[])
}

/// Like [`herald`], started through `wrapper` (a program and its first
/// arguments, the `herald` binary's path and arguments following), e.g.
/// `["sh", "-c", "ulimit -Sn 200 && exec \"$@\"", "sh"]`; with an empty
/// `wrapper`, [`herald`] itself.
pub fn herald_under(wrapper: &[&str]) -> Command {
    let mut cmd = match wrapper.split_first() {
        None => Command::new(herald_bin()),
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(herald_bin());
            cmd
        }
    };
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

/// One `herald serve` process.
pub struct Server {
    child: Child,
    /// `http://<bound address>`, or `https://` when it serves TLS.
    pub url: String,
    /// A client of this server's API.
    pub api: Api,
    /// The process's stderr, one record per line.
    log: Arc<Mutex<Vec<String>>>,
    /// Woken after each line is added to `log`.
    logged: Arc<Notify>,
}

impl Server {
    /// Starts `herald serve` on `data_dir` and returns once its log says
    /// which address it bound.
    pub async fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[]).await
    }

    /// Like [`Server::start`], with more `herald serve` flags.
    pub async fn start_with(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_listening(data_dir, "127.0.0.1:0", extra).await
    }

    /// Like [`Server::start_with`], listening on `listen`.
    pub async fn start_listening(data_dir: &Path, listen: &str, extra: &[&str]) -> Self {
        Self::launch(data_dir, listen, extra, &[], None).await
    }

    /// Like [`Server::start_with`], with `HERALD_*` (or other) environment
    /// variables set for the process.
    pub async fn start_with_env(data_dir: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::launch(data_dir, "127.0.0.1:0", extra, envs, None).await
    }

    /// Like [`Server::start_with`], started through `wrapper` (see
    /// [`herald_under`]); a wrapper that `exec`s keeps the process id, so
    /// [`Server::pid`] is the server's.
    pub async fn start_under(data_dir: &Path, wrapper: &[&str], extra: &[&str]) -> Self {
        Self::launch_under(wrapper, data_dir, "127.0.0.1:0", extra, &[], None).await
    }

    /// Like [`Server::start_with`], serving HTTPS with `cert` (issued by
    /// `ca`, which the server's [`Api`] trusts); [`Server::url`] is
    /// `https://`.
    pub async fn start_tls(
        data_dir: &Path,
        cert: &IssuedCert,
        ca: &TestCa,
        extra: &[&str],
    ) -> Self {
        let mut all = vec![
            "--tls-cert".to_owned(),
            cert.cert.display().to_string(),
            "--tls-key".to_owned(),
            cert.key.display().to_string(),
        ];
        all.extend(extra.iter().map(|s| (*s).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        Self::launch(data_dir, "127.0.0.1:0", &all, &[], Some(ca)).await
    }

    /// Starts `herald serve` with `envs` set; its API client trusts `ca`
    /// when given.
    async fn launch(
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
        ca: Option<&TestCa>,
    ) -> Self {
        Self::launch_under(&[], data_dir, listen, extra, envs, ca).await
    }

    /// [`Server::launch`] through `wrapper` (see [`herald_under`]).
    async fn launch_under(
        wrapper: &[&str],
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
        ca: Option<&TestCa>,
    ) -> Self {
        let mut child = herald_under(wrapper)
            .envs(envs.iter().copied())
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
        // The URL of the address the server logs as bound.
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
                            let scheme = if record["tls"] == true {
                                "https"
                            } else {
                                "http"
                            };
                            let _ = tx.send(format!("{scheme}://{addr}"));
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
        let url = addr;
        let api = match ca {
            Some(ca) => Api::with_builder(&url, || ca.client_builder()),
            None => Api::new(&url),
        };
        Self {
            child,
            api,
            url,
            log,
            logged,
        }
    }

    /// Starts a server and waits until it holds the writer lease.
    pub async fn start_holder(data_dir: &Path) -> Self {
        let server = Self::start(data_dir).await;
        server.api.wait_role("holder", WAIT).await;
        server
    }

    /// The process id of the server (of its wrapper's last `exec`).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server is still running")
    }

    /// Sends SIGTERM (drain).
    pub fn sigterm(&self) {
        let pid = self.child.id().expect("the server is still running");
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid fits i32"))
            .expect("a non-zero pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("send SIGTERM");
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...).
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = self.child.id().expect("the server is still running");
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid fits i32"))
            .expect("a non-zero pid");
        rustix::process::kill_process(pid, signal).expect("send a signal");
    }

    /// Sends SIGKILL.
    pub fn sigkill(&mut self) {
        self.child.start_kill().expect("send SIGKILL");
    }

    /// Waits for the process to exit; returns its status and when it was seen.
    pub async fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, Instant) {
        let status = within("herald serve to exit", limit, self.child.wait())
            .await
            .expect("wait for herald serve");
        (status, Instant::now())
    }

    /// The stderr lines so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The JSON log records so far (`--log-format json`).
    pub fn log_records(&self) -> Vec<Value> {
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
    pub async fn wait_log_record(
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
    pub async fn acquisition(&self, after_token: u64, limit: Duration) -> Value {
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

/// Runs `herald serve --log-format json` in `cwd` with `args`, expects exit
/// status 1, and returns the `error` field of its `start-up failed` record.
///
/// # Panics
/// When the process does not exit within [`WAIT`], exits otherwise, or
/// logs no such record.
pub async fn failed_start(cwd: &Path, args: &[&str]) -> String {
    let out = within(
        "herald serve to fail",
        WAIT,
        herald()
            .current_dir(cwd)
            .args(["serve", "--log-format", "json"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .expect("run herald serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    let record = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|r| r["message"] == "start-up failed")
        .unwrap_or_else(|| panic!("{args:?}: no start-up failed record in:\n{stderr}"));
    record["error"].as_str().expect("an error field").to_owned()
}

/// [`failed_start`] listening on a free port with the data dir `data`
/// (relative to `cwd`), plus `args`.
pub async fn failed_start_in_data(cwd: &Path, args: &[&str]) -> String {
    let mut all = vec!["--listen", "127.0.0.1:0", "--data-dir", "data"];
    all.extend_from_slice(args);
    failed_start(cwd, &all).await
}
