//! `herald serve --config FILE` and `herald config check FILE` on the real
//! binary: precedence (flag > `HERALD_*` > file > default), keys refused
//! by name, secrets masked; and the safe default: a node off loopback
//! without authentication refuses to start unless `--insecure-no-auth`.

use std::path::{Path, PathBuf};

use herald_testkit::api::Api;
use herald_testkit::process::{failed_start, herald, Server};
use herald_testkit::{within, WAIT};

/// Writes `text` as `herald.toml` in `dir`.
fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("herald.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_beats_the_environment_which_beats_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "node_id = \"from-file\"\n");
    let config = config.to_str().unwrap();
    let data = dir.path().join("data");

    let from_file = Server::start_with(&data, &["--config", config]).await;
    assert_eq!(from_file.api.status().await["node_id"], "from-file");
    drop(from_file);

    let from_env = Server::start_with_env(
        &data,
        &["--config", config],
        &[("HERALD_NODE_ID", "from-env")],
    )
    .await;
    assert_eq!(from_env.api.status().await["node_id"], "from-env");
    drop(from_env);

    let from_flag = Server::start_with_env(
        &data,
        &["--config", config, "--node-id", "from-flag"],
        &[("HERALD_NODE_ID", "from-env")],
    )
    .await;
    assert_eq!(from_flag.api.status().await["node_id"], "from-flag");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistyped_key_or_value_in_the_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // The parser names the file; serve's own checks name the settings.
    for (text, words, names_file) in [
        ("lease_tll = \"5s\"\n", "unknown key lease_tll", true),
        ("lease_ttl = \"five\"\n", "key lease_ttl", true),
        (
            "[tls]\ncertificate = \"a.pem\"\n",
            "unknown field `certificate`",
            true,
        ),
        ("lease_ttl = \"3s\"\n", "lease timing", false),
    ] {
        let config = write_config(dir.path(), text);
        let error = failed_start(
            dir.path(),
            &[
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                "data",
                "--config",
                config.to_str().unwrap(),
            ],
        )
        .await;
        assert!(error.contains(words), "{text:?}: {error}");
        assert_eq!(
            error.contains("herald.toml"),
            names_file,
            "{text:?}: {error}"
        );
    }
    assert!(
        !dir.path().join("data").exists(),
        "a refused start created the data dir"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_prints_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "database = \"postgres://herald:pg-password-1@db.internal:5432/herald\"\n\
         lease_ttl = \"20s\"\n\
         [cors]\nallowed_origins = [\"https://app.example.com\"]\n\
         [auth]\ncluster_secret = \"cluster-secret-2\"\n",
    );
    let out = within(
        "herald config check",
        WAIT,
        herald()
            .args(["config", "check", config.to_str().unwrap()])
            .env("HERALD_POOL_SIZE", "3")
            .output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "database = \"postgres://herald:****@db.internal:5432/herald\"  # file",
        "lease_ttl = \"20s\"  # file",
        "pool_size = 3  # environment HERALD_POOL_SIZE",
        // Derived from the file's 20 s ttl: ttl / 6.
        "lease_safety_margin = \"3s 333ms\"  # default, derived from lease_ttl",
        "renew_statement_timeout = \"3s 333ms\"  # default, derived from lease_ttl",
        "allowed_origins = [\"https://app.example.com\"]  # file",
        "cluster_secret = \"****\"",
    ] {
        assert!(stdout.contains(line), "{line} not in:\n{stdout}");
    }
    for secret in ["pg-password-1", "cluster-secret-2"] {
        assert!(!stdout.contains(secret), "{secret} leaked:\n{stdout}");
    }

    let bad = write_config(dir.path(), "listen = \"0.0.0.0:7700\"\n");
    let out = herald()
        .args(["config", "check", bad.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");
}

/// A TOML syntax error names its place and reason, never the line: an
/// unquoted database URL (or secret) stays out of `herald config check`'s
/// output and out of `herald serve`'s log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syntax_error_is_reported_by_place_without_the_secret_on_its_line() {
    let dir = tempfile::tempdir().unwrap();
    for text in [
        "lease_ttl = \"20s\"\ndatabase = postgres://herald:pg-Secret-77@db.internal/herald\n",
        "[auth]\ncluster_secret = pg-Secret-77\n",
        "[auth.jwt]\nhs256_secret = \"pg-Secret-77\n",
    ] {
        let config = write_config(dir.path(), text);
        let out = within(
            "herald config check",
            WAIT,
            herald()
                .args(["config", "check", config.to_str().unwrap()])
                .output(),
        )
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(1), "{text:?}");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(shown.contains("line "), "{text:?}: {shown}");
        assert!(shown.contains("column "), "{text:?}: {shown}");
        assert!(!shown.contains("Secret-77"), "{text:?}: {shown}");

        let logged = failed_start(
            dir.path(),
            &[
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                "data",
                "--config",
                config.to_str().unwrap(),
            ],
        )
        .await;
        assert!(logged.contains("line "), "{text:?}: {logged}");
        assert!(!logged.contains("Secret-77"), "{text:?}: {logged}");
    }
}

/// `herald config check` shows the retention policy `herald serve` would
/// apply (the file's, with `HERALD_RETENTION_*` over it) in the file's
/// syntax, and of an API key masks only its digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_prints_the_effective_retention_and_api_keys_but_not_their_digests() {
    let dir = tempfile::tempdir().unwrap();
    let digest = "5".repeat(64);
    let config = write_config(
        dir.path(),
        &format!(
            "[retention]\nmax_messages = 100\nmax_age = \"7d\"\n\
             [retention.namespaces.chat]\nmax_age = \"90s\"\n\
             [[auth.api_keys]]\nname = \"backend\"\nsha256 = \"{digest}\"\n\
             permissions = [\"publish\", \"read\"]\nchannels = [\"orders:*\"]\n"
        ),
    );
    let out = within(
        "herald config check",
        WAIT,
        herald()
            .args(["config", "check", config.to_str().unwrap()])
            .env("HERALD_RETENTION_MAX_MESSAGES", "2")
            .env("HERALD_RETENTION_MAX_BYTES", "4096")
            .output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let retention = stdout
        .split_once("\n[retention]\n")
        .unwrap_or_else(|| panic!("no [retention] in:\n{stdout}"))
        .1;
    for line in [
        "max_messages = 2\n",
        "max_age = \"7d\"\n",
        "max_bytes = 4096\n",
        "[retention.namespaces.chat]\nmax_age = \"1m30s\"\n",
    ] {
        assert!(retention.contains(line), "{line} not in:\n{stdout}");
    }
    for line in [
        "# retention.max_messages from the environment HERALD_RETENTION_MAX_MESSAGES, over the file",
        "# retention.max_bytes from the environment HERALD_RETENTION_MAX_BYTES, over the file",
        "name = \"backend\"",
        "permissions = [\"publish\", \"read\"]",
        "channels = [\"orders:*\"]",
        "sha256 = \"****\"",
    ] {
        assert!(stdout.contains(line), "{line} not in:\n{stdout}");
    }
    assert!(!stdout.contains("max_messages = 100"), "{stdout}");
    assert!(!stdout.contains(&digest), "the digest leaked:\n{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_without_auth_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let error = failed_start(dir.path(), &["--listen", listen, "--data-dir", "data"]).await;
        assert!(error.contains("refusing to listen on"), "{error}");
        assert!(error.contains("[auth]"), "{error}");
        assert!(error.contains("--insecure-no-auth"), "{error}");
    }
    assert!(
        !dir.path().join("data").exists(),
        "a refused start created the data dir"
    );
}

/// A loopback node without authentication that a reverse proxy publishes
/// (`--trusted-proxy`) or that tells other hosts to reach it elsewhere
/// (`--advertise-url` not loopback) is as exposed as one on every
/// interface: it refuses to start, naming the cause and the fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_loopback_node_without_auth_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, cause) in [
        (["--trusted-proxy", "127.0.0.1"], "--trusted-proxy"),
        (
            ["--advertise-url", "https://herald.example"],
            "--advertise-url https://herald.example",
        ),
    ] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--data-dir", "data"];
        args.extend(flags);
        let error = failed_start(dir.path(), &args).await;
        assert!(
            error.contains("refusing to start without authentication"),
            "{error}"
        );
        assert!(error.contains(cause), "{error}");
        assert!(error.contains("[auth]"), "{error}");
        assert!(error.contains("--insecure-no-auth"), "{error}");
    }
    assert!(
        !dir.path().join("data").exists(),
        "a refused start created the data dir"
    );
}

/// A loopback node without authentication answers requests for loopback
/// host names only (DNS rebinding); with `--insecure-no-auth` behind a
/// proxy it answers any. Its data directory is the owner's only, and a
/// config file that others may read is warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_node_without_auth_refuses_foreign_host_names() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "node_id = \"loopback\"\n");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let data = dir.path().join("new").join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]).await;
    let warning = server
        .wait_log_record("the readable config file warning", WAIT, |r| {
            r["what"] == "the config file"
        })
        .await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "data dir mode {mode:o}");
    let http = reqwest::Client::new();
    let ask = |host: &'static str| {
        http.get(format!("{}/healthz", server.url))
            .header("host", host)
            .send()
    };
    let refused = ask("rebind.evil.example").await.unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
    assert_eq!(ask("localhost").await.unwrap().status().as_u16(), 200);
    drop(server);

    let server = Server::start_with(
        &dir.path().join("proxied"),
        &["--trusted-proxy", "127.0.0.1", "--insecure-no-auth"],
    )
    .await;
    let answer = http
        .get(format!("{}/healthz", server.url))
        .header("host", "herald.example")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_no_auth_starts_on_a_public_address_and_warns() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_listening(
        &dir.path().join("data"),
        "0.0.0.0:0",
        &["--insecure-no-auth"],
    )
    .await;
    let warning = server
        .wait_log_record("the insecure warning", WAIT, |r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("running without authentication"))
        })
        .await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    server.api.wait_role("holder", WAIT).await;
}

/// A public node with an API key in the file's `[auth]` starts, and the
/// key is enforced: the file's section reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_section_with_an_api_key_lets_a_public_node_start_and_enforces_it() {
    let dir = tempfile::tempdir().unwrap();
    let key = herald_auth::generate_api_key();
    let config = write_config(
        dir.path(),
        &format!(
            "[auth]\napi_keys = [{{ name = \"backend\", sha256 = \"{}\", permissions = [\"publish\", \"read\"] }}]\n",
            herald_auth::api_key_sha256(&key)
        ),
    );
    let server = Server::start_listening(
        &dir.path().join("data"),
        "0.0.0.0:0",
        &["--config", config.to_str().unwrap()],
    )
    .await;
    assert!(
        !server.log_text().contains("running without authentication"),
        "{}",
        server.log_text()
    );
    server.api.wait_role("holder", WAIT).await;
    let data = serde_json::json!("x");
    server
        .api
        .try_publish("a", &data, None)
        .await
        .unwrap()
        .assert_error(reqwest::StatusCode::UNAUTHORIZED, "unauthorized");
    let with_key = Api::with_builder(&server.api.base, || {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("x-api-key", key.parse().unwrap());
        reqwest::Client::builder().default_headers(headers)
    });
    assert_eq!(with_key.publish("a", &data).await, 1);
    assert_eq!(
        server.log_text().matches(key.as_str()).count(),
        0,
        "the key is never logged"
    );
}

/// `herald keys generate >> herald.toml` appends config lines that a
/// node accepts, and never the key itself: the key goes to stderr only,
/// and it is the key whose SHA-256 the appended lines hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_generate_keeps_the_key_out_of_what_is_appended_to_the_config() {
    let out = within(
        "herald keys generate",
        WAIT,
        herald()
            .args(["keys", "generate", "--name", "backend"])
            .output(),
    )
    .await
    .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let key = stderr
        .lines()
        .map(str::trim)
        .find(|line| line.len() == 43 && !line.contains(' '))
        .unwrap_or_else(|| panic!("no key on stderr:\n{stderr}"));
    assert!(!stdout.contains(key), "the key is on stdout:\n{stdout}");
    let file: toml::Table = stdout.parse().unwrap();
    let auth: herald_auth::AuthConfig = file["auth"].clone().try_into().unwrap();
    assert_eq!(auth.api_keys[0].sha256, herald_auth::api_key_sha256(key));
}

/// `[[auth.api_keys]]` lines for `key` with `extra` lines after them.
fn key_lines(key: &str, extra: &str) -> String {
    format!(
        "[[auth.api_keys]]\nname = \"backend\"\nsha256 = \"{}\"\npermissions = [\"publish\"]\n{extra}",
        herald_auth::api_key_sha256(key)
    )
}

/// Access control on a shared (PostgreSQL) database without a cluster
/// secret would make the holder refuse every publish a standby forwards:
/// `herald serve` refuses to start, and `herald config check` refuses the
/// file, both naming `cluster_secret`; with one, the file is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_on_postgres_without_a_cluster_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = herald_auth::generate_api_key();
    let config = write_config(dir.path(), &key_lines(&key, ""));
    // Refused before connecting: nothing listens at this address.
    let error = failed_start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "data",
            "--config",
            config.to_str().unwrap(),
            "--database",
            "postgres://herald@127.0.0.1:9/herald",
        ],
    )
    .await;
    assert!(error.contains("no cluster_secret"), "{error}");
    assert!(error.contains("the same on every node"), "{error}");

    let check = |text: String| {
        let config = write_config(dir.path(), &text);
        async move {
            within(
                "herald config check",
                WAIT,
                herald()
                    .args(["config", "check", config.to_str().unwrap()])
                    .output(),
            )
            .await
            .unwrap()
        }
    };
    let database = "database = \"postgres://herald@127.0.0.1:9/herald\"\n";
    let out = check(format!("{database}{}", key_lines(&key, ""))).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no cluster_secret"), "{stderr}");

    let out = check(format!(
        "{database}[auth]\ncluster_secret = \"a-cluster-secret-of-32-bytes-ok!\"\n\n{}",
        key_lines(&key, "")
    ))
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The effective settings show the publish rates, defaults included.
    assert!(
        stdout.contains("#   token subjects: 100/s, burst 200"),
        "{stdout}"
    );
    assert!(
        stdout.contains("#   API key \"backend\": no limit"),
        "{stdout}"
    );
}

/// The holder tells the operator what its clients are told: a WARN when
/// it refuses a forwarded request for its cluster secret (with the
/// forwarding node), and a WARN when a publish rate first refuses (with
/// the key and the setting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_logs_a_refused_forward_and_the_first_rate_limit_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let key = herald_auth::generate_api_key();
    let config = write_config(
        dir.path(),
        &format!(
            "[auth]\ncluster_secret = \"a-cluster-secret-of-32-bytes-ok!\"\n\n{}",
            key_lines(&key, "publish_rate_per_s = 0.001\npublish_burst = 1\n")
        ),
    );
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    server.api.wait_role("holder", WAIT).await;
    let http = reqwest::Client::new();
    let publish = |headers: Vec<(&'static str, String)>| {
        let mut req = http
            .post(format!("{}/v1/channels/orders/messages", server.url))
            .header("content-type", "application/json")
            .body("{\"data\": 1}");
        for (name, value) in headers {
            req = req.header(name, value);
        }
        async move {
            let resp = within("a publish", WAIT, req.send()).await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };

    let forwarded = publish(vec![("herald-forwarded-by", "node-x".to_owned())]).await;
    assert_eq!(forwarded.0, 401, "{}", forwarded.1);
    let warning = server
        .wait_log_record("the refused forward", WAIT, |r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("refused a forwarded request"))
        })
        .await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["forwarded_by"], "node-x", "{warning}");
    assert_eq!(
        warning["reason"], "the request carries no cluster secret",
        "{warning}"
    );

    let bearer = vec![("authorization", format!("Bearer {key}"))];
    assert_eq!(publish(bearer.clone()).await.0, 201);
    let refused = publish(bearer).await;
    assert_eq!(refused.0, 429, "{}", refused.1);
    let warning = server
        .wait_log_record("the rate limit's refusal", WAIT, |r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("rate limit reached"))
        })
        .await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["limited"], "API key \"backend\"", "{warning}");
    assert!(
        warning["setting"]
            .as_str()
            .is_some_and(|s| s.contains("[[auth.api_keys]] \"backend\"")),
        "{warning}"
    );
}

/// SIGHUP puts a changed `[auth]` in force: an open node given an API key
/// refuses anonymous publishes from then on. A changed setting that needs
/// a restart is named in a WARN; a reload that would turn access control
/// off is refused, and the keys in force stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_auth_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cors = "[cors]\nallowed_origins = [\"https://a.example\"]\n";
    let config = write_config(dir.path(), cors);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    server.api.wait_role("holder", WAIT).await;
    let http = reqwest::Client::new();
    let publish = |key: Option<&str>| {
        let mut req = http
            .post(format!("{}/v1/channels/orders/messages", server.url))
            .header("content-type", "application/json")
            .body("{\"data\": 1}");
        if let Some(key) = key {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        async move {
            within("a publish", WAIT, req.send())
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(publish(None).await, 201, "an open node");

    let key = herald_auth::generate_api_key();
    write_config(
        dir.path(),
        &format!(
            "[cors]\nallowed_origins = [\"https://b.example\"]\n{}",
            key_lines(&key, "")
        ),
    );
    server.signal(rustix::process::Signal::HUP);
    let reloaded = server
        .wait_log_record("the reload", WAIT, |r| {
            r["message"] == "access control reloaded"
        })
        .await;
    assert_eq!(reloaded["api_keys"], 1, "{reloaded}");
    assert_eq!(publish(None).await, 401, "anonymous, after the reload");
    assert_eq!(publish(Some(&key)).await, 201, "with the new key");
    let warning = server
        .wait_log_record("the restart warning", WAIT, |r| {
            r["setting"] == "cors.allowed_origins"
        })
        .await;
    assert_eq!(warning["level"], "WARN", "{warning}");

    // Without the key: access control would go off; refused.
    write_config(dir.path(), cors);
    server.signal(rustix::process::Signal::HUP);
    let refused = server
        .wait_log_record("the refused reload", WAIT, |r| {
            r["message"] == "access control not reloaded; the settings in force stay"
        })
        .await;
    assert_eq!(refused["level"], "ERROR", "{refused}");
    assert_eq!(publish(None).await, 401, "the key stays in force");
    assert_eq!(publish(Some(&key)).await, 201);
}
