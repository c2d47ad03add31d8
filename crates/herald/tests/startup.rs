//! `herald serve` start-up against the real binary: settings that cannot
//! work are refused with one message that names the fix, before anything
//! is created; the start-up log says what the node is and where its data
//! lives.
//!
//! Set `HERALD_BIN` to run them against another build of the binary.

use std::path::Path;

use herald_testkit::process::{failed_start, failed_start_in_data, herald, Server};
use herald_testkit::{within, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_value_that_is_not_postgres_names_the_forms_and_the_default() {
    let dir = tempfile::tempdir().unwrap();
    for (url, reason) in [
        (
            "not-a-url",
            "neither a postgres:// URL nor key=value settings",
        ),
        (
            "mysql://root:secret@db.internal/app",
            "the scheme mysql:// is not PostgreSQL",
        ),
        ("sqlite:///x.db", "SQLite is not chosen by URL"),
    ] {
        let error = failed_start_in_data(dir.path(), &["--database", url]).await;
        assert!(error.starts_with("--database: "), "{error}");
        assert!(error.contains(reason), "{url}: {error}");
        assert!(
            error.contains("postgres://user:password@host:port/dbname"),
            "{error}"
        );
        assert!(error.contains("key=value"), "{error}");
        assert!(
            error.contains("Leave --database out") || error.contains("leave --database out"),
            "{error}"
        );
        assert!(error.contains("embedded SQLite database"), "{error}");
        assert!(!error.contains("unexpected EOF"), "{error}");
        assert!(!error.contains("secret"), "the password leaked: {error}");
    }
    assert!(
        !dir.path().join("data").exists(),
        "a refused start created the data dir"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_that_cannot_be_used_is_named_once_with_its_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("afile"), "x").unwrap();
    let error = failed_start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--data-dir", "afile"],
    )
    .await;
    let absolute = dir.path().join("afile");
    assert_eq!(
        error,
        format!(
            "opening the embedded SQLite database (--data-dir): cannot use the data directory \
             {}: it exists and is not a directory",
            absolute.display()
        )
    );

    // Permissions do not stop root, so this half needs another user.
    if rustix::process::geteuid().is_root() {
        println!("running as root: the unwritable data dir case is not checked");
        return;
    }
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let mut permissions = std::fs::metadata(&locked).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o555);
    std::fs::set_permissions(&locked, permissions).unwrap();
    let error = failed_start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--data-dir", "locked/data"],
    )
    .await;
    let target = locked.join("data");
    assert!(
        error.contains(&format!(
            "cannot create the data directory {}: ",
            target.display()
        )),
        "{error}"
    );
    assert_eq!(
        error.matches("Permission denied").count(),
        1,
        "the OS error is printed once: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_refused_before_the_data_dir_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let error = failed_start(
        dir.path(),
        &["--listen", &addr.to_string(), "--data-dir", "fresh"],
    )
    .await;
    assert!(
        error.contains(&format!("port {} is already in use", addr.port())),
        "{error}"
    );
    assert!(
        error.contains("choose another port with --listen"),
        "{error}"
    );
    assert!(
        !dir.path().join("fresh").exists(),
        "the data dir was created before the listener was bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_takes_a_host_name_and_names_a_bad_value() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_listening(dir.path(), "localhost:0", &[]).await;
    let bound: std::net::SocketAddr = server.url["http://".len()..].parse().unwrap();
    assert!(bound.ip().is_loopback(), "{bound}");
    assert_eq!(server.api.status().await["role"], "holder");
    drop(server);

    // A value clap refuses: exit status 2 with the forms to write.
    for (listen, words) in [
        ("7700", "\"7700\" has no host"),
        ("::1:7700", "an IPv6 address goes in brackets"),
        ("local host:7700", "neither an IP address nor a host name"),
    ] {
        let out = within(
            "herald serve to refuse --listen",
            WAIT,
            herald()
                .args(["serve", "--listen", listen])
                .current_dir(dir.path())
                .output(),
        )
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{listen}: {stderr}");
        assert!(stderr.contains(words), "{listen}: {stderr}");
        assert!(stderr.contains("127.0.0.1:7700"), "{listen}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_log_says_the_role_the_holder_and_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let first = Server::start_with(dir.path(), &["--node-id", "node-a"]).await;
    first.api.wait_role("holder", WAIT).await;
    let token = first.api.status().await["lease"]["token"]
        .as_u64()
        .expect("a token");
    let listening = first
        .wait_log_record("listening", WAIT, |r| r["message"] == "listening")
        .await;
    assert_eq!(listening["backend"], "sqlite", "{listening}");
    let database = listening["database"].as_str().expect("a database field");
    assert!(Path::new(database).is_absolute(), "{listening}");
    assert!(database.ends_with("/herald.db"), "{listening}");
    assert_eq!(
        listening["addr"],
        first.url["http://".len()..],
        "{listening}"
    );

    let second = Server::start_with(dir.path(), &["--node-id", "node-b"]).await;
    let standby = second
        .wait_log_record("the standby's start-up record", WAIT, |r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("started as a standby"))
        })
        .await;
    assert_eq!(
        standby["message"], "started as a standby: another node holds the writer lease",
        "{standby}"
    );
    assert_eq!(standby["node_id"], "node-b", "{standby}");
    assert_eq!(standby["holder"], "node-a", "{standby}");
    assert_eq!(standby["holder_url"], first.url, "{standby}");
    assert_eq!(standby["token"], token, "{standby}");
    // The holder logs no such record.
    assert!(!first
        .log_records()
        .iter()
        .any(|r| r["message"].as_str().is_some_and(|m| m.contains("standby"))));
}

/// Start-up failures that come from elsewhere name where they looked: an
/// unreachable PostgreSQL by its host and port, and lease timings that
/// cannot work by the flags to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_databases_and_bad_lease_timings_name_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    // Port 1 on loopback: nothing listens there, the connect is refused.
    let error = failed_start_in_data(
        dir.path(),
        &["--database", "postgres://herald@127.0.0.1:1/herald"],
    )
    .await;
    assert!(error.contains("--database"), "{error}");
    assert!(error.contains("herald@127.0.0.1:1/herald"), "{error}");

    // A ttl too short for derived timings: refused, naming the flags and
    // that such a ttl needs its timings given.
    let error = failed_start_in_data(dir.path(), &["--lease-ttl", "4s"]).await;
    assert!(
        error.contains("--lease-ttl") && error.contains("--lease-safety-margin"),
        "{error}"
    );
    assert!(
        error.contains("a shorter ttl needs them all given"),
        "{error}"
    );

    // Explicit timings that cannot fit are still refused: a 10 s ttl with
    // a 5 s margin leaves 5 s after a renewal is sent, but one renewal may
    // take 7 s before it is given up.
    let error = failed_start_in_data(
        dir.path(),
        &[
            "--lease-ttl",
            "10s",
            "--lease-safety-margin",
            "5s",
            "--renew-statement-timeout",
            "5s",
        ],
    )
    .await;
    assert!(
        error.contains("retried before the safety deadline"),
        "{error}"
    );
    assert!(error.contains("--renew-statement-timeout"), "{error}");
}

/// `--lease-ttl` alone is enough: the other timings follow it, so a node
/// started with only a 10 s (or 6 s) ttl starts, takes the lease and says
/// the ttl in its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_ttl_alone_starts_a_holder() {
    for ttl in ["10s", "6s"] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start_with(dir.path(), &["--lease-ttl", ttl]).await;
        server.api.wait_role("holder", WAIT).await;
    }
}

/// Through a pooler in transaction mode that drops the session settings
/// (PgBouncer's `pool_mode = transaction` with `ignore_startup_parameters =
/// options`, here the test pooler `FakePooler` that behaves so), the node
/// refuses to start, says why and what to do, and leaves the database
/// unmigrated; without the check it started without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_is_refused_naming_the_fix() {
    use herald_testkit::database::{FakePooler, OptionsHandling, PoolerSettings, TestDatabase};

    let db = TestDatabase::create().await;
    let pooler = FakePooler::start(
        db.server_addr(),
        PoolerSettings::transaction(OptionsHandling::Drop),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let error = failed_start_in_data(dir.path(), &["--database", &db.url_via(pooler.addr())]).await;
    assert!(error.contains("--database"), "{error}");
    assert!(
        error.contains("a transaction-pooling proxy was detected"),
        "{error}"
    );
    assert!(error.contains("connect directly to PostgreSQL"), "{error}");
    assert!(error.contains("pooler in session mode"), "{error}");
    let migrated: bool = db
        .raw_client()
        .await
        .query_one("SELECT to_regclass('storage_leases') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!migrated, "the schema was created through the pooler");
}

/// With `--log-format json`, every record of a node's life carries its
/// `node_id` (docs/operations.md, "Log lines"): on the first start, when
/// the id is made, and on a restart, when it is read back, from the first
/// record to the drain's last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_record_carries_the_node_id() {
    let dir = tempfile::tempdir().unwrap();
    for start in ["first", "restart"] {
        let mut server = Server::start_holder(dir.path()).await;
        server
            .api
            .publish("logged", &serde_json::json!({"start": start}))
            .await;
        server.sigterm();
        server.wait_exit(WAIT).await;
        server
            .wait_log_record("the drain's last record", WAIT, |r| {
                r["message"] == "drained"
            })
            .await;
        let node_id = std::fs::read_to_string(dir.path().join("node-id")).unwrap();
        let records = server.log_records();
        assert!(records.len() > 5, "{start}: {records:?}");
        for record in &records {
            assert_eq!(
                record["node_id"].as_str(),
                Some(node_id.trim()),
                "{start}: {record}"
            );
        }
    }
}

/// Starts `herald serve` through a shell that first runs `ulimit` with
/// each of `limits` in turn (e.g. `-Sn 200`), as a service manager starts
/// it with its own limits; `exec` keeps the process id, so `/proc/<pid>` is
/// the server's.
async fn start_with_ulimit(data_dir: &Path, limits: &[&str], extra: &[&str]) -> Server {
    let mut script = String::new();
    for limit in limits {
        script.push_str(&format!("ulimit {limit} && "));
    }
    script.push_str("exec \"$@\"");
    Server::start_under(data_dir, &["sh", "-c", &script, "sh"], extra).await
}

/// The soft and hard `Max open files` of a process, from
/// `/proc/<pid>/limits` (proc_pid_limits(5)); `None` for `unlimited`.
fn open_file_limits(pid: u32) -> (Option<u64>, Option<u64>) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no Max open files in:\n{limits}"));
    let mut values = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| v.parse::<u64>().ok());
    (values.next().flatten(), values.next().flatten())
}

/// A node started with a low soft limit on open files (a shell's `ulimit
/// -Sn`; systemd starts services with 1024) raises it to the hard limit,
/// logs the limit in force, and then holds more connections at once than
/// the limit it was started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_soft_open_file_limit_is_raised_to_the_hard_limit_and_logged() {
    const STARTED_WITH: u64 = 200;
    const CONNECTIONS: usize = 300;
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    if hard.is_some_and(|hard| hard < 1024) {
        println!("the hard open file limit is {hard:?}: too low to show the raise; not checked");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_ulimit(
        dir.path(),
        &[&format!("-Sn {STARTED_WITH}")],
        // Idle kept-alive connections stay open for the whole test.
        &[
            "--max-connections-per-ip",
            "1000",
            "--header-read-timeout",
            "300s",
        ],
    )
    .await;

    let (soft, hard_in_force) = open_file_limits(server.pid());
    assert_eq!(hard_in_force, hard, "the hard limit is inherited unchanged");
    match hard {
        Some(hard) => assert_eq!(soft, Some(hard), "the soft limit was not raised"),
        None => assert!(soft.is_some_and(|soft| soft > STARTED_WITH), "{soft:?}"),
    }
    let record = server
        .wait_log_record("the open file limit", WAIT, |r| {
            r["message"] == "open file limit"
        })
        .await;
    assert_eq!(record["level"], "INFO", "{record}");
    assert_eq!(
        record["nofile_at_start"],
        STARTED_WITH.to_string(),
        "{record}"
    );
    assert_eq!(record["nofile_soft"], soft.unwrap().to_string(), "{record}");
    assert!(
        !server.log_records().iter().any(|r| r["message"]
            .as_str()
            .is_some_and(|m| m.contains("limit is low"))),
        "{}",
        server.log_text()
    );

    // The process metric says the same.
    let metrics = within(
        "/metrics",
        WAIT,
        reqwest::get(format!("{}/metrics", server.url)),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let max_fds = metrics
        .lines()
        .find_map(|l| l.strip_prefix("process_max_fds "))
        .unwrap_or_else(|| panic!("no process_max_fds in:\n{metrics}"));
    assert_eq!(max_fds.parse::<f64>().unwrap(), soft.unwrap() as f64);

    // More connections open at once than the limit it was started with:
    // each is accepted and answered, and stays open (kept alive) while the
    // next ones are made.
    let addr = &server.url["http://".len()..];
    let mut open = Vec::with_capacity(CONNECTIONS);
    for n in 0..CONNECTIONS {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = within(
            &format!("the answer on connection {n}"),
            WAIT,
            healthz_on(&mut stream, addr),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200"), "connection {n}: {head}");
        open.push(stream);
    }
    assert_eq!(server.api.get("/healthz").await.status, 200);
}

/// Sends `GET /healthz` on `stream` (kept alive) and returns the answer's
/// head.
async fn healthz_on(stream: &mut tokio::net::TcpStream, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before an answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// When the hard limit itself is low, the raise cannot help: the node says
/// so at WARN, with the limit it wants for its settings and how many
/// clients the limit leaves room for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_hard_open_file_limit_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_ulimit(dir.path(), &["-Sn 200", "-Hn 300"], &[]).await;
    assert_eq!(open_file_limits(server.pid()), (Some(300), Some(300)));
    let warning = server
        .wait_log_record("the low limit warning", WAIT, |r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("the open file limit is low"))
        })
        .await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["nofile_soft"], "300", "{warning}");
    assert_eq!(warning["nofile_wanted"], 4096, "{warning}");
    assert_eq!(warning["clients_at_most"], 300 - 64, "{warning}");
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("LimitNOFILE="),
        "{warning}"
    );
}
