//! One `herald serve` process of the run, behind its own fault proxy to the
//! database, and the shared list of the nodes' current URLs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use herald_chaos::proxy::FaultProxy;
use rustix::process::{kill_process, Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::access::Access;
use super::database::Cluster;

/// How long a node may take to log its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The lease flags every node gets: ttl 5 s, safety margin 1 s, renewal
/// every 500 ms, renewal statement timeout 500 ms (the shortest ttl where a
/// renewal that times out is retried before the safety deadline). The same
/// as `herald_testkit::process::FAST_LEASE`, kept apart on purpose: this
/// crate depends on no Herald crate.
const LEASE_FLAGS: [&str; 8] = [
    "--lease-ttl",
    "5s",
    "--lease-safety-margin",
    "1s",
    "--lease-renew-interval",
    "500ms",
    "--renew-statement-timeout",
    "500ms",
];

/// How often a node pings its Centrifugo connections
/// (`--centrifugo-ping-interval`; Centrifugo's default is 25 s): often, so
/// that the Centrifugo subscribers answer pings all through a run and tell
/// a silent connection from a live one within their 5 s bound. A pong is
/// due within 2 s (`--centrifugo-pong-timeout`).
pub(crate) const CENTRIFUGO_PING: &str = "3s";

/// How to reach the nodes: their base URLs (`http://addr`), by node index,
/// which clients read on every request because a restarted node may listen
/// elsewhere, and the run's access control (the credential clients
/// present, the config file nodes start with).
#[derive(Clone)]
pub(crate) struct Urls {
    urls: Arc<RwLock<Vec<String>>>,
    access: Arc<Access>,
}

impl Urls {
    /// No node yet; `access` for every client and node.
    pub(crate) fn new(access: Access) -> Self {
        Self {
            urls: Arc::default(),
            access: Arc::new(access),
        }
    }

    /// The URL of node `index`.
    pub(crate) fn get(&self, index: usize) -> String {
        self.urls.read().unwrap_or_else(|e| e.into_inner())[index].clone()
    }

    /// How many nodes there are.
    pub(crate) fn len(&self) -> usize {
        self.urls.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The Centrifugo subscribers' connection token.
    pub(crate) fn centrifugo_token(&self) -> String {
        self.access.centrifugo_token()
    }

    /// An HTTP client builder whose requests carry the run's credential.
    pub(crate) fn client(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder().default_headers(self.access.headers())
    }

    fn set(&self, index: usize, url: String) {
        let mut urls = self.urls.write().unwrap_or_else(|e| e.into_inner());
        if urls.len() <= index {
            urls.resize(index + 1, String::new());
        }
        urls[index] = url;
    }
}

/// One node: its process (when running), its proxy and its settings.
pub(crate) struct Node {
    /// Its index in the run.
    pub(crate) index: usize,
    /// Its `--node-id`.
    pub(crate) id: String,
    /// The proxy in front of the database for this node alone.
    pub(crate) proxy: FaultProxy,
    bin: PathBuf,
    data_dir: PathBuf,
    log_file: Option<PathBuf>,
    /// `HERALD_FAULT_SWITCHES` for the process, when not empty.
    fault_switches: String,
    addr: Option<SocketAddr>,
    child: Option<Child>,
    urls: Urls,
}

impl Node {
    /// Prepares node `index` (not started yet). A non-empty
    /// `fault_switches` is given verbatim to every process it starts as
    /// `HERALD_FAULT_SWITCHES`.
    pub(crate) async fn new(
        index: usize,
        bin: &Path,
        work_dir: &Path,
        log_dir: Option<&Path>,
        database: SocketAddr,
        urls: Urls,
        fault_switches: &str,
    ) -> anyhow::Result<Self> {
        let id = format!("node-{index}");
        let proxy = FaultProxy::start(database)
            .await
            .context("start a fault proxy")?;
        let data_dir = work_dir.join(&id);
        std::fs::create_dir_all(&data_dir).context("create a node's data dir")?;
        Ok(Self {
            index,
            log_file: log_dir.map(|d| d.join(format!("{id}.log"))),
            id,
            proxy,
            bin: bin.to_owned(),
            fault_switches: fault_switches.to_owned(),
            data_dir,
            addr: None,
            child: None,
            urls,
        })
    }

    /// Starts the process and returns once it logged its address. A
    /// restarted node first tries its previous address.
    pub(crate) async fn start(&mut self) -> anyhow::Result<()> {
        if let Some(addr) = self.addr {
            if self.spawn(addr).await.is_ok() {
                return Ok(());
            }
        }
        self.spawn(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    async fn spawn(&mut self, listen: SocketAddr) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.bin);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                cmd.env_remove(key);
            }
        }
        if !self.fault_switches.is_empty() {
            cmd.env("HERALD_FAULT_SWITCHES", &self.fault_switches);
        }
        let database = Cluster::url_at(self.proxy.local_addr());
        cmd.arg("serve")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--node-id")
            .arg(&self.id)
            .arg("--database")
            .arg(&database)
            .arg("--log-format")
            .arg("json")
            .arg("--config")
            .arg(self.urls.access.config_file())
            .args(LEASE_FLAGS)
            // A sweep every 200 ms, so that trimming runs all through the
            // run.
            .arg("--retention-trim-interval")
            .arg("200ms")
            .arg("--centrifugo-ping-interval")
            .arg(CENTRIFUGO_PING)
            .arg("--centrifugo-pong-timeout")
            .arg("2s")
            // Durable Streams' SSE keep-alive well inside the streams
            // followers' silence bound (`streams.rs`).
            .arg("--durable-streams-long-poll-timeout")
            .arg("1s")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", self.bin.display()))?;
        let stderr = child.stderr.take().context("piped stderr")?;
        let (addr_tx, addr_rx) = oneshot::channel::<String>();
        let log_file = self.log_file.clone();
        tokio::spawn(async move {
            let mut file = match log_file {
                Some(path) => tokio::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .await
                    .ok(),
                None => None,
            };
            let mut addr_tx = Some(addr_tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if addr_tx.is_some() {
                    if let Ok(record) = serde_json::from_str::<serde_json::Value>(&line) {
                        if record["message"] == "listening" {
                            if let (Some(tx), Some(addr)) =
                                (addr_tx.take(), record["addr"].as_str())
                            {
                                let _ = tx.send(addr.to_owned());
                            }
                        }
                    }
                }
                if let Some(file) = file.as_mut() {
                    let _ = file.write_all(line.as_bytes()).await;
                    let _ = file.write_all(b"\n").await;
                }
            }
        });
        let addr = tokio::select! {
            addr = addr_rx => addr.ok(),
            status = child.wait() => bail!("{} exited with {status:?} before listening", self.id),
            () = tokio::time::sleep(START_TIMEOUT) => None,
        };
        let Some(addr) = addr else {
            let _ = child.start_kill();
            bail!("{} did not log its address", self.id);
        };
        let addr: SocketAddr = addr
            .parse()
            .map_err(|e| anyhow!("{} logged a bad address {addr}: {e}", self.id))?;
        self.addr = Some(addr);
        self.urls.set(self.index, format!("http://{addr}"));
        self.child = Some(child);
        Ok(())
    }

    /// Sends `signal` to the process, if it runs.
    pub(crate) fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .with_context(|| format!("{} is not running", self.id))?;
        let pid = Pid::from_raw(i32::try_from(pid)?).context("a zero pid")?;
        kill_process(pid, signal).with_context(|| format!("signal {}", self.id))?;
        Ok(())
    }

    /// Waits up to `limit` for the process to exit. One still running then
    /// (a broken build may keep running as a zombie) is killed (SIGKILL)
    /// and reaped, and `None` is returned; either way no process is left
    /// and [`Node::start`] may follow.
    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                eprintln!(
                    "herald-chaos: {} did not exit within {} ms; killed",
                    self.id,
                    limit.as_millis()
                );
                let _ = child.kill().await;
                None
            }
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// The exit status of a process that exited on its own since the last
    /// look (it is reaped), `None` while it runs or when none was started.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Whether a process is running.
    pub(crate) fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }
}
