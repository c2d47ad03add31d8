//! No secret (an API key, the JWT secret, the cluster secret, a token,
//! the database password in the URL) appears in the log, in `/v1/status`
//! or in an error body, whatever the requests.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tracing_subscriber::fmt::MakeWriter;

use crate::{now_s, on_both_backends, Backend, Creds, Node, Place, Role};

/// A log sink shared with the test.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The JSON records written so far (a subscriber with `.json()`).
    pub(crate) fn records(&self) -> Vec<serde_json::Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// One request: method, path and query, headers.
type Probe = (&'static str, String, Vec<(&'static str, String)>);

async fn no_secret_leaks(backend: Backend) {
    let log = Captured::default();
    // Every record of every level, of this (current-thread) runtime's
    // tasks: the nodes run on this thread.
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut place = Place::new(backend).await;
    let password = format!("pw{}", now_s());
    if let Some(url) = &place.url {
        // The test cluster trusts local connections: the password is
        // sent, and ignored.
        let (scheme, rest) = url.split_once("://").unwrap();
        let (user, host) = rest.split_once('@').unwrap();
        place.url = Some(format!("{scheme}://{user}:{password}@{host}"));
    }
    let creds = Creds::new();
    let holder = Node::start(&place, "node-a", Role::Holder, creds.config()).await;
    let standby = Node::start(&place, "node-b", Role::Standby, creds.config()).await;
    let token = creds.token_for("u1", json!({"channels": ["news:*"], "publish": ["room:*"]}));
    let expired = creds.token(json!({"sub": "u1", "exp": now_s() - 10}));
    let key = |k: &str| Creds::bearer(k);
    let mut bodies = Vec::new();
    let requests: Vec<Probe> = vec![
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![("authorization", key(&creds.publisher))],
        ),
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![("authorization", key(&format!("{}x", creds.publisher)))],
        ),
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![("x-api-key", format!("{}x", creds.admin))],
        ),
        (
            "POST",
            "/v1/channels/other/messages".into(),
            vec![("authorization", key(&creds.publisher))],
        ),
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![("authorization", key(&token))],
        ),
        (
            "POST",
            "/v1/channels/room:1/messages".into(),
            vec![("authorization", key(&token))],
        ),
        (
            "POST",
            "/v1/channels/room:1/messages".into(),
            vec![("authorization", key(&format!("{token}x")))],
        ),
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![("authorization", key(&expired))],
        ),
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![("authorization", format!("Basic {}", creds.reader))],
        ),
        (
            "POST",
            "/v1/channels/news:a/messages".into(),
            vec![
                ("herald-forwarded-by", "x".into()),
                (
                    "herald-cluster-secret",
                    format!("{}x", creds.cluster_secret),
                ),
            ],
        ),
        (
            "GET",
            "/v1/channels/news:a/messages".into(),
            vec![("authorization", key(&creds.reader))],
        ),
        (
            "GET",
            format!("/v1/channels/news:a/events?token={}x", token),
            vec![],
        ),
        (
            "GET",
            format!("/v1/channels/news:a/events?token={}", expired),
            vec![],
        ),
        (
            "GET",
            "/v1/status".into(),
            vec![("authorization", key(&creds.admin))],
        ),
        ("GET", "/v1/status".into(), vec![]),
        (
            "GET",
            "/v1/channels".into(),
            vec![("authorization", key(&creds.admin))],
        ),
        (
            "GET",
            "/metrics".into(),
            vec![("authorization", key(&creds.reader))],
        ),
    ];
    for node in [&holder, &standby] {
        for (method, path, headers) in &requests {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let answer = node
                .call(method, path, &headers, Some(json!({"data": 1})))
                .await;
            bodies.push(answer.2.to_string());
        }
    }
    drop(holder);
    drop(standby);
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("node-b") && log.contains("forwarded"),
        "the log was captured: {log}"
    );
    let mut secrets = vec![
        ("publisher key", creds.publisher.clone()),
        ("reader key", creds.reader.clone()),
        ("admin key", creds.admin.clone()),
        ("JWT secret", creds.jwt_secret.clone()),
        ("cluster secret", creds.cluster_secret.clone()),
        ("token", token.clone()),
        ("expired token", expired.clone()),
    ];
    if place.url.is_some() {
        secrets.push(("database password", password.clone()));
    }
    for (what, secret) in &secrets {
        assert!(!log.contains(secret.as_str()), "the {what} is in the log");
        for body in &bodies {
            assert!(
                !body.contains(secret.as_str()),
                "the {what} is in an answer: {body}"
            );
        }
    }
}

on_both_backends!(
    no_secret_leaks: no_secret_in_logs_status_or_errors_on_sqlite,
    no_secret_in_logs_status_or_errors_on_postgres
);
