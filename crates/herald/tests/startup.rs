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
