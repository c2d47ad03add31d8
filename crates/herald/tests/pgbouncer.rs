//! `herald serve` through a real PgBouncer: in transaction mode, with
//! `options` refused or dropped, and in session mode with `options`
//! dropped, the node refuses to start, names the pooler and the fix, and
//! creates nothing in the database (docs/operations.md, "Connection
//! poolers").
//!
//! The PgBouncer binary is `HERALD_TEST_PGBOUNCER` (the test command
//! installs Debian's `pgbouncer` package and sets it), else `pgbouncer` on
//! the `PATH` or in `/usr/sbin`; without one the test fails, it is never
//! skipped. Run as root, PgBouncer switches to `HERALD_TEST_PG_USER` (its
//! `user` setting), since it refuses to run as root. Set `HERALD_BIN` to
//! run against another build of the binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use herald_testkit::process::failed_start_in_data;
use herald_testkit::{within, TestDatabase, WAIT};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The PgBouncer binary to run.
fn pgbouncer_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("HERALD_TEST_PGBOUNCER") {
        return PathBuf::from(bin);
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|bin| bin.is_file());
    on_path.unwrap_or_else(|| {
        panic!(
            "PgBouncer not found: install it (Debian: apt-get install pgbouncer), set \
             HERALD_TEST_PGBOUNCER to its binary, or run ./scripts/test, which does both"
        )
    })
}

/// A PgBouncer process in front of the test cluster, killed when dropped.
struct PgBouncer {
    _child: Child,
    port: u16,
    user: String,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer with the database aliases `tx` (transaction
    /// pooling) and `session` (session pooling), both to `db`, with
    /// `options` in `ignore_startup_parameters` or not; returns once it
    /// logs that it listens.
    async fn start(db: &TestDatabase, ignore_options: bool) -> PgBouncer {
        let server = db.server_addr();
        let user = url_user(db.url());
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let auth_file = dir.path().join("users.txt");
        std::fs::write(&auth_file, format!("\"{user}\" \"\"\n")).unwrap();
        // As root, PgBouncer must switch to an unprivileged user.
        let run_as = std::env::var("HERALD_TEST_PG_USER")
            .ok()
            .filter(|_| rustix::process::geteuid().is_root())
            .map(|u| format!("user = {u}\n"))
            .unwrap_or_default();
        let ignore = if ignore_options {
            "ignore_startup_parameters = options\n"
        } else {
            ""
        };
        let (ip, server_port, dbname) = (server.ip(), server.port(), db.name());
        let config = format!(
            "[databases]\n\
             tx = host={ip} port={server_port} dbname={dbname} pool_mode=transaction\n\
             session = host={ip} port={server_port} dbname={dbname} pool_mode=session\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             {run_as}{ignore}",
            auth = auth_file.display()
        );
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini, config).unwrap();
        let mut child = Command::new(pgbouncer_bin())
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start pgbouncer");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let listening = within("pgbouncer to listen", WAIT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("listening on") {
                    return true;
                }
                seen.push(line);
            }
            false
        })
        .await;
        assert!(listening, "pgbouncer did not start:\n{}", seen.join("\n"));
        // Keep reading its log so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        PgBouncer {
            _child: child,
            port,
            user,
            _dir: dir,
        }
    }

    /// The URL of the database alias `alias` through this PgBouncer.
    fn url(&self, alias: &str) -> String {
        format!("postgres://{}@127.0.0.1:{}/{alias}", self.user, self.port)
    }
}

/// The user name of a `postgres://user[:password]@...` URL.
fn url_user(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let userinfo = rest.split_once('@').map_or("", |(userinfo, _)| userinfo);
    let user = userinfo.split(':').next().unwrap_or("");
    assert!(!user.is_empty(), "the test cluster URL names no user");
    user.to_owned()
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs `herald serve` on the database `url`, expects exit status 1, and
/// returns the `error` field of its `start-up failed` record.
async fn failed_start(cwd: &Path, url: &str) -> String {
    failed_start_in_data(cwd, &["--database", url]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_is_refused_in_every_set_up_naming_the_fix() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();

    let dropping = PgBouncer::start(&db, true).await;
    // The usual set-up, which started without a word before.
    let error = failed_start(dir.path(), &dropping.url("tx")).await;
    assert!(
        error.contains("a transaction-pooling proxy was detected"),
        "{error}"
    );
    assert!(error.contains("connect directly to PostgreSQL"), "{error}");
    // Session pooling, but the node's settings are gone.
    let error = failed_start(dir.path(), &dropping.url("session")).await;
    assert!(
        error.contains("drops the session settings") && error.contains("lock_timeout"),
        "{error}"
    );
    assert!(error.contains("connect directly to PostgreSQL"), "{error}");

    let refusing = PgBouncer::start(&db, false).await;
    let error = failed_start(dir.path(), &refusing.url("tx")).await;
    assert!(
        error.contains("a connection pooler was detected"),
        "{error}"
    );
    assert!(error.contains("unsupported startup parameter"), "{error}");
    assert!(error.contains("connect directly to PostgreSQL"), "{error}");

    assert!(
        !db.migrated().await,
        "the schema was created through PgBouncer"
    );
}
