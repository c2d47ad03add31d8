//! Databases for tests: a fresh database per test in the shared test
//! cluster ([`TestDatabase`], from `herald_storage::testing`, which also
//! holds [`FakePooler`]), and a PostgreSQL cluster of a test's own
//! ([`PrivateCluster`]) for faults that would disturb other tests.

use std::path::PathBuf;
use std::process::Stdio;

pub use herald_storage::testing::{
    cluster_url, FakePooler, OptionsHandling, PoolMode, PoolerSettings, Reuse, TestDatabase,
    DATABASE_URL_VAR,
};

/// A PostgreSQL cluster of a test's own, for faults that would disturb
/// other tests (a restart). Made with the server binaries that the test
/// command names in `HERALD_TEST_PG_BIN`, run as `HERALD_TEST_PG_USER` when
/// the tests run as root; stopped and removed on drop.
pub struct PrivateCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<String>,
    port: u16,
}

impl PrivateCluster {
    /// Creates and starts the cluster on a free loopback port.
    pub async fn start() -> Self {
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
    pub fn url(&self) -> String {
        format!("postgres://herald@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl restart -m fast`: every session ends; the server is back
    /// when this returns.
    pub fn restart_fast(&self) {
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
    pub fn stop_fast(&self) {
        assert!(
            self.try_pg_ctl(&["stop", "-m", "fast", "-w", "-t", "30"]),
            "pg_ctl stop failed"
        );
    }

    /// Starts the stopped server again on the same port; it accepts
    /// connections when this returns.
    pub fn start_again(&self) {
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
