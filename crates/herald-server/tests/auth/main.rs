//! Access control end to end, on SQLite and PostgreSQL: nodes served
//! in-process on a real listener with an `[auth]` config, driven over
//! HTTP, SSE and WebSocket; and Centrifugo's protocols on top of it
//! (`centrifugo/`).

mod centrifugo;
mod expiry;
mod forwarding;
mod keys;
mod limits;
mod secrets;
mod tokens;

use std::sync::Arc;

use herald_core::Candidate;
use herald_lease::{BootClock, LeaseConfig, LeaseState, StopReason, Supervisor};
use herald_server::{
    api_key_sha256, generate_api_key, serve, ApiKeyConfig, AuthConfig, JwtConfig, NamespaceRule,
    NamespacesConfig, OneOrMany, Permission, PublishRule, Secret, ServerConfig, SubscribeRule,
};
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage};
use herald_storage::{LeaseStore, Storage};
use herald_testkit::{within, TestDatabase, NODE_WAIT};
use jsonwebtoken::{encode, EncodingKey, Header};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

/// Where the nodes of a test keep their messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// One storage (a temp dir, or a fresh database), shared by a test's
/// nodes.
pub(crate) struct Place {
    pub(crate) dir: TempDir,
    /// Kept so that the database lives as long as the test (dropped at its
    /// end).
    _db: Option<TestDatabase>,
    /// The database URL the nodes use (PostgreSQL).
    pub(crate) url: Option<String>,
}

impl Place {
    pub(crate) async fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Sqlite => Self {
                dir,
                _db: None,
                url: None,
            },
            Backend::Postgres => {
                let db = TestDatabase::create().await;
                let url = db.url().to_owned();
                Self {
                    dir,
                    _db: Some(db),
                    url: Some(url),
                }
            }
        }
    }

    /// A new connection to the storage.
    pub(crate) async fn open(&self) -> (Arc<dyn Storage>, Arc<dyn LeaseStore>) {
        match &self.url {
            None => {
                let s = Arc::new(
                    SqliteStorage::open(self.dir.path(), SqliteOptions::default())
                        .await
                        .unwrap(),
                );
                (s.clone(), s)
            }
            Some(url) => {
                let s = Arc::new(
                    PostgresStorage::connect(url, PostgresOptions::default())
                        .await
                        .unwrap(),
                );
                (s.clone(), s)
            }
        }
    }
}

/// Which role a node waits for before serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Holder,
    Standby,
}

/// A node served in-process.
pub(crate) struct TestNode {
    pub(crate) base: String,
    pub(crate) ws_base: String,
    pub(crate) http: reqwest::Client,
    /// The supervisor's view of the lease.
    pub(crate) lease: herald_lease::LeaseHandle,
    shutdown: CancellationToken,
    lease_shutdown: CancellationToken,
    server: Option<JoinHandle<Result<(), herald_server::StartError>>>,
    supervisor: Option<JoinHandle<StopReason>>,
}

impl TestNode {
    /// Opens the storage of `place`, waits for `role`, then serves with
    /// `config`.
    pub(crate) async fn start(
        place: &Place,
        node_id: &str,
        role: Role,
        config: ServerConfig,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(place, node_id, role, config, listener).await
    }

    /// [`TestNode::start`] on `listener` (a restarted node keeps its
    /// address).
    pub(crate) async fn start_on(
        place: &Place,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        listener: tokio::net::TcpListener,
    ) -> Self {
        let (storage, leases) = place.open().await;
        let addr = listener.local_addr().unwrap();
        let base = format!("http://{addr}");
        let candidate = Candidate {
            lease_name: herald_core::DEFAULT_LEASE_NAME.to_owned(),
            node_id: node_id.to_owned(),
            advertise_url: base.clone(),
        };
        let lease_shutdown = CancellationToken::new();
        let (lease, supervisor) = Supervisor::start(
            leases,
            candidate,
            LeaseConfig::default(),
            Arc::new(BootClock),
            lease_shutdown.clone(),
        );
        let reached = within(
            "lease role",
            NODE_WAIT,
            lease.wait_for(|s| match role {
                Role::Holder => matches!(s, LeaseState::Holder { .. }),
                Role::Standby => matches!(s, LeaseState::Standby { holder: Some(_) }),
            }),
        )
        .await;
        assert!(reached.is_some(), "supervisor ended before {role:?}");
        let shutdown = CancellationToken::new();
        let config = ServerConfig {
            node_id: node_id.to_owned(),
            advertise_url: base.clone(),
            ..config
        };
        let server = tokio::spawn(serve(
            listener,
            storage,
            lease.clone(),
            config,
            shutdown.clone(),
        ));
        Self {
            lease,
            ws_base: format!("ws://{addr}"),
            base,
            http: reqwest::Client::new(),
            shutdown,
            lease_shutdown,
            server: Some(server),
            supervisor: Some(supervisor),
        }
    }

    /// Sends a request; returns status, headers and the body as JSON (or
    /// as a JSON string when it is not JSON).
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, HeaderMap, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, body)
    }

    /// Publishes `{"data": data}` to `channel` with `headers`.
    pub(crate) async fn publish(
        &self,
        channel: &str,
        headers: &[(&str, &str)],
        data: Value,
    ) -> (u16, HeaderMap, Value) {
        self.call(
            "POST",
            &format!("/v1/channels/{channel}/messages"),
            headers,
            Some(json!({ "data": data })),
        )
        .await
    }

    /// Opens a WebSocket to `path` with `headers`: the socket, or the
    /// status the upgrade was refused with.
    pub(crate) async fn ws(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<herald_testkit::ws::Ws, u16> {
        let mut request = format!("{}{path}", self.ws_base)
            .into_client_request()
            .unwrap();
        for (name, value) in headers {
            request.headers_mut().insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        match within(
            "WebSocket connect",
            NODE_WAIT,
            tokio_tungstenite::connect_async(request),
        )
        .await
        {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                Err(response.status().as_u16())
            }
            Err(e) => panic!("WebSocket connect failed: {e}"),
        }
    }
}

impl TestNode {
    /// Drains the server (its WebSockets are closed with their going-away
    /// code), then stops the supervisor, which releases the lease.
    pub(crate) async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            let _ = within("server drain", NODE_WAIT, server).await;
        }
        self.lease_shutdown.cancel();
        if let Some(supervisor) = self.supervisor.take() {
            let _ = within("lease release", NODE_WAIT, supervisor).await;
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.lease_shutdown.cancel();
        if let Some(server) = self.server.take() {
            server.abort();
        }
        if let Some(supervisor) = self.supervisor.take() {
            supervisor.abort();
        }
    }
}

/// The credentials of a test, all generated now.
pub(crate) struct Creds {
    /// `publish` on `news:*`, `room:*`, `open:*`.
    pub(crate) publisher: String,
    /// `read` on `news:*`.
    pub(crate) reader: String,
    /// `admin`.
    pub(crate) admin: String,
    /// `publish`, `read` and `admin` on every channel, as an application
    /// backend's key for Centrifugo's server API.
    pub(crate) backend: String,
    /// `publish` on every channel, 3 at once then one per 1000 s.
    pub(crate) limited: String,
    pub(crate) jwt_secret: String,
    pub(crate) cluster_secret: String,
}

impl Creds {
    pub(crate) fn new() -> Self {
        Self {
            publisher: generate_api_key(),
            reader: generate_api_key(),
            admin: generate_api_key(),
            backend: generate_api_key(),
            limited: generate_api_key(),
            jwt_secret: generate_api_key(),
            cluster_secret: generate_api_key(),
        }
    }

    /// `Authorization: Bearer <credential>`.
    pub(crate) fn bearer(credential: &str) -> String {
        format!("Bearer {credential}")
    }

    /// An HS256 token with `claims`, signed with this test's secret.
    pub(crate) fn token(&self, claims: Value) -> String {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(self.jwt_secret.as_bytes()),
        )
        .unwrap()
    }

    /// A token for `sub`, valid for 5 minutes, with `extra` claims.
    pub(crate) fn token_for(&self, sub: &str, extra: Value) -> String {
        let mut claims = json!({ "sub": sub, "exp": now_s() + 300, "iat": now_s() });
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        self.token(claims)
    }

    /// The server config of the tests: the keys above, the JWT secret,
    /// the cluster secret, namespaces `open` (public subscribe), `keyonly`
    /// (subscribe with a key), `room` (token publishes, no history for
    /// tokens); default rules elsewhere; protected metrics; no rate limit
    /// except the `limited` key's.
    pub(crate) fn config(&self) -> ServerConfig {
        let key = |name: &str,
                   key: &str,
                   permissions: Vec<Permission>,
                   channels: Option<Vec<&str>>| ApiKeyConfig {
            name: name.to_owned(),
            sha256: api_key_sha256(key),
            permissions,
            channels: channels.map(|c| c.into_iter().map(str::to_owned).collect()),
            publish_rate_per_s: None,
            publish_burst: None,
        };
        let mut limited = key("limited", &self.limited, vec![Permission::Publish], None);
        limited.publish_rate_per_s = Some(0.001);
        limited.publish_burst = Some(3);
        let auth = AuthConfig {
            api_keys: vec![
                key(
                    "publisher",
                    &self.publisher,
                    vec![Permission::Publish],
                    Some(vec!["news:*", "room:*", "open:*"]),
                ),
                key(
                    "reader",
                    &self.reader,
                    vec![Permission::Read],
                    Some(vec!["news:*"]),
                ),
                key("admin", &self.admin, vec![Permission::Admin], None),
                key(
                    "backend",
                    &self.backend,
                    vec![Permission::Publish, Permission::Read, Permission::Admin],
                    None,
                ),
                limited,
            ],
            jwt: Some(JwtConfig {
                hs256_secret: OneOrMany::One(Secret::new(&self.jwt_secret)),
                ..JwtConfig::default()
            }),
            cluster_secret: Some(Secret::new(&self.cluster_secret)),
            protect_metrics: true,
            publish_rate_per_s: Some(0.0),
            ..AuthConfig::default()
        };
        let mut namespaces = NamespacesConfig::new();
        let rule = |subscribe, publish, history| NamespaceRule {
            subscribe,
            publish,
            history,
        };
        namespaces.insert(
            "open".to_owned(),
            rule(SubscribeRule::Public, PublishRule::Key, true),
        );
        namespaces.insert(
            "keyonly".to_owned(),
            rule(SubscribeRule::Key, PublishRule::Key, true),
        );
        namespaces.insert(
            "room".to_owned(),
            rule(SubscribeRule::Token, PublishRule::Token, false),
        );
        ServerConfig {
            auth,
            namespaces,
            ..ServerConfig::default()
        }
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_s() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// Asserts an error answer's status and code.
pub(crate) fn assert_refused(answer: &(u16, HeaderMap, Value), status: u16, code: &str) {
    assert_eq!(answer.0, status, "{}", answer.2);
    assert_eq!(answer.2["error"]["code"], code, "{}", answer.2);
}
