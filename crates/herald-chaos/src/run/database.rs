//! A disposable PostgreSQL cluster: created with `initdb` in a temporary
//! directory, started with `pg_ctl` on a free loopback port, stopped and
//! removed when dropped (also when the run fails or is interrupted). Like
//! `herald_testkit::database::PrivateCluster`, kept apart on purpose: this
//! crate depends on no Herald crate.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

/// The role every node and the harness connect as.
const ROLE: &str = "herald";

/// A running cluster of the run's own.
pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<String>,
    port: u16,
}

impl Cluster {
    /// Creates and starts a cluster with the server binaries in `bin`, run
    /// as `user` (through `runuser`) when given.
    pub(crate) fn start(bin: &Path, user: Option<String>) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("herald-chaos-pg-")
            .tempdir()
            .context("create a temporary directory for PostgreSQL")?;
        if let Some(user) = &user {
            let status = Command::new("chown")
                .arg(user)
                .arg(dir.path())
                .status()
                .context("run chown")?;
            if !status.success() {
                bail!("chown {user} {} failed", dir.path().display());
            }
        }
        let mut cluster = Self {
            dir,
            bin: bin.to_owned(),
            user,
            port: 0,
        };
        let data = cluster.data();
        let out = cluster
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", ROLE, "--auth=trust", "--no-sync"])
            .output()
            .context("run initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        for _ in 0..20 {
            cluster.port = free_port()?;
            let options = cluster.options();
            if cluster.pg_ctl(&["start", "-w", "-t", "30", "-o", &options]) {
                return Ok(cluster);
            }
        }
        bail!(
            "could not start PostgreSQL; see {}",
            cluster.dir.path().join("server.log").display()
        )
    }

    /// The cluster's address.
    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The URL of the `postgres` database at `addr` (the cluster's own or a
    /// proxy's).
    pub(crate) fn url_at(addr: std::net::SocketAddr) -> String {
        format!("postgres://{ROLE}@{addr}/postgres")
    }

    /// The URL of the cluster's `postgres` database, without any proxy.
    pub(crate) fn url(&self) -> String {
        Self::url_at(self.addr())
    }

    /// `pg_ctl restart -m fast`: every session ends; returns once the
    /// server accepts connections again. Blocks.
    pub(crate) fn restart_fast(&self) -> anyhow::Result<()> {
        let options = self.options();
        if !self.pg_ctl(&["restart", "-m", "fast", "-w", "-t", "30", "-o", &options]) {
            bail!("pg_ctl restart failed");
        }
        Ok(())
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn options(&self) -> String {
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        )
    }

    fn pg_ctl(&self, args: &[&str]) -> bool {
        self.command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        match &self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(program);
                c
            }
            None => Command::new(program),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }
}

/// A loopback port that was free a moment ago.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("bind a port to find a free one")?;
    Ok(listener.local_addr()?.port())
}

/// Where PostgreSQL's server binaries are when nothing names them: the
/// directory of an `initdb` on `PATH`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (the Debian layout).
pub(crate) fn default_pg_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() {
                return Some(dir);
            }
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// Connects to `url` without TLS; the connection is driven by a task of
/// its own.
pub(crate) async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
