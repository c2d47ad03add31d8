//! A node built in-process as the binary builds it: its storage (SQLite in
//! a directory of the test's, or a PostgreSQL database: [`StorageAt`]), the
//! lease supervisor, and `herald_server::serve` on a real listener on
//! 127.0.0.1:0 ([`Node`]); a stand-in for a holder
//! that accepts requests and answers none until told ([`FakeHolder`]).
//! Waits here are bounded by [`NODE_WAIT`].

use std::sync::Arc;

use herald_core::{Candidate, ChannelName, Message};
use herald_lease::{BootClock, LeaseConfig, LeaseHandle, LeaseState, StopReason, Supervisor};
use herald_server::{serve, ServerConfig};
use herald_storage::{LeaseStore, Storage};
use reqwest::header::HeaderMap;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

pub use crate::place::StorageAt;
use crate::ws::Ws;
use crate::{within, NODE_WAIT};

/// Which role `Node::start` waits for before serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The node holds the writer lease.
    Holder,
    /// The node is a standby that knows the holder.
    Standby,
}

/// One running node.
pub struct Node {
    /// The node's id (`--node-id`).
    pub node_id: String,
    /// `http://<listener address>`.
    pub base: String,
    /// `ws://<listener address>`.
    pub ws_base: String,
    /// The node's storage, unwrapped (as the supervisor has it).
    pub storage: Arc<dyn Storage>,
    /// The supervisor's handle.
    pub lease: LeaseHandle,
    /// A client for the node's API (no timeouts).
    pub client: reqwest::Client,
    /// Drains the server.
    pub shutdown: CancellationToken,
    server: Option<JoinHandle<Result<(), herald_server::StartError>>>,
    lease_shutdown: CancellationToken,
    supervisor: Option<JoinHandle<StopReason>>,
}

impl Node {
    /// A holder on fresh storage (a data directory: `&Path`, or a
    /// [`crate::place::Place`]), default settings.
    pub async fn holder(at: impl Into<StorageAt<'_>>) -> Self {
        Self::start(at, "node-a", Role::Holder, ServerConfig::default()).await
    }

    /// Opens the storage `at` (a SQLite data directory: `&Path`, or a
    /// [`crate::place::Place`] on either backend), starts the supervisor,
    /// waits for `role`, then serves.
    pub async fn start(
        at: impl Into<StorageAt<'_>>,
        node_id: &str,
        role: Role,
        config: ServerConfig,
    ) -> Self {
        Self::start_with(at, node_id, role, config, |s| s).await
    }

    /// [`Node::start`], with the server's storage wrapped by `wrap` (the
    /// supervisor always gets the plain one).
    pub async fn start_with(
        at: impl Into<StorageAt<'_>>,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        wrap: impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage>,
    ) -> Self {
        Self::launch(
            at.into(),
            node_id,
            role,
            config,
            wrap,
            None,
            None,
            LeaseConfig::default(),
        )
        .await
    }

    /// [`Node::start`] with the lease timing `lease` instead of the
    /// defaults (a short ttl, for a test that watches the renewals).
    pub async fn start_with_lease(
        at: impl Into<StorageAt<'_>>,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        lease: LeaseConfig,
    ) -> Self {
        Self::launch(at.into(), node_id, role, config, |s| s, None, None, lease).await
    }

    /// [`Node::start`] on `listener`: a node restarted after
    /// [`Node::stop`] keeps its address when the test binds a listener to
    /// the old one, so that clients can reconnect to it.
    pub async fn start_on(
        at: impl Into<StorageAt<'_>>,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        listener: tokio::net::TcpListener,
    ) -> Self {
        Self::launch(
            at.into(),
            node_id,
            role,
            config,
            |s| s,
            None,
            Some(listener),
            LeaseConfig::default(),
        )
        .await
    }

    /// [`Node::start`], advertising `advertise_url` in the lease instead of
    /// its own listener's URL: standbys forward publishes there.
    pub async fn start_advertising(
        at: impl Into<StorageAt<'_>>,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        advertise_url: &str,
    ) -> Self {
        Self::launch(
            at.into(),
            node_id,
            role,
            config,
            |s| s,
            Some(advertise_url),
            None,
            LeaseConfig::default(),
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn launch(
        at: StorageAt<'_>,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        wrap: impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage>,
        advertise_url: Option<&str>,
        listener: Option<tokio::net::TcpListener>,
        lease_config: LeaseConfig,
    ) -> Self {
        let storage = at.open().await;
        let listener = match listener {
            Some(listener) => listener,
            None => tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        };
        let addr = listener.local_addr().unwrap();
        let base = format!("http://{addr}");
        let advertise_url = advertise_url.unwrap_or(&base).to_owned();
        let candidate = Candidate {
            lease_name: herald_core::DEFAULT_LEASE_NAME.to_owned(),
            node_id: node_id.to_owned(),
            advertise_url: advertise_url.clone(),
        };
        let lease_shutdown = CancellationToken::new();
        let (lease, supervisor) = Supervisor::start(
            storage.clone() as Arc<dyn LeaseStore>,
            candidate,
            lease_config,
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
            advertise_url,
            ..config
        };
        let server = tokio::spawn(serve(
            listener,
            wrap(storage.clone()),
            lease.clone(),
            config,
            shutdown.clone(),
        ));
        Self {
            node_id: node_id.to_owned(),
            ws_base: format!("ws://{addr}"),
            base,
            storage,
            lease,
            client: reqwest::Client::new(),
            shutdown,
            server: Some(server),
            lease_shutdown,
            supervisor: Some(supervisor),
        }
    }

    /// Drains the server and waits for `serve` to return Ok; the lease is
    /// still held afterwards.
    pub async fn drain(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            within("serve returns after drain", NODE_WAIT, server)
                .await
                .expect("serve task")
                .expect("serve result");
        }
    }

    /// Stops the supervisor without waiting for it, as a drain does once
    /// the writer has ended (the server may still be serving).
    pub fn stop_lease(&self) {
        self.lease_shutdown.cancel();
    }

    /// Drains (the server closes its WebSockets with their going-away
    /// code), then stops the supervisor, which releases the lease; returns
    /// why the supervisor stopped. A test can then start a node again on
    /// the same address with [`Node::start_on`].
    ///
    /// # Panics
    /// When `serve` or the supervisor fails or takes longer than
    /// [`NODE_WAIT`].
    pub async fn stop(mut self) -> StopReason {
        self.drain().await;
        self.lease_shutdown.cancel();
        let supervisor = self.supervisor.take().unwrap();
        within("supervisor stops", NODE_WAIT, supervisor)
            .await
            .expect("supervisor task")
    }

    /// The URL of `path` (with its query) on this node.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The WebSocket URL of `path` (with its query) on this node.
    pub fn ws_url(&self, path: &str) -> String {
        format!("{}{path}", self.ws_base)
    }

    /// Sends a `method` request to `path` (with its query) with `headers`
    /// and, when given, a JSON `body`; returns status, headers and the
    /// answer's body as JSON (or as a JSON string when it is not JSON).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, HeaderMap, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut request = self.client.request(method, self.url(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("a request");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("an answer's body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, body)
    }

    /// Publishes `{"data": data}` to `channel` with `headers`; returns what
    /// [`Node::call`] returns.
    pub async fn publish_with(
        &self,
        channel: &str,
        headers: &[(&str, &str)],
        data: Value,
    ) -> (u16, HeaderMap, Value) {
        self.call(
            "POST",
            &format!("/v1/channels/{channel}/messages"),
            headers,
            Some(serde_json::json!({ "data": data })),
        )
        .await
    }

    /// Opens a WebSocket to `path` (with its query) with `headers`: the
    /// socket, or the HTTP status the upgrade was refused with.
    ///
    /// # Panics
    /// When the connection fails otherwise or takes longer than
    /// [`NODE_WAIT`].
    pub async fn ws(&self, path: &str, headers: &[(&str, &str)]) -> Result<Ws, u16> {
        let mut request = self.ws_url(path).into_client_request().expect("a URL");
        for (name, value) in headers {
            request.headers_mut().insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                value.parse().expect("a header value"),
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

    /// Publishes `data` and returns (status, body).
    pub async fn publish(&self, channel: &str, data: Value) -> (u16, Value) {
        let response = self
            .client
            .post(self.url(&format!("/v1/channels/{channel}/messages")))
            .json(&serde_json::json!({ "data": data }))
            .send()
            .await
            .expect("publish request");
        let status = response.status().as_u16();
        (
            status,
            response.json().await.expect("publish answer is JSON"),
        )
    }

    /// GETs `path` and returns (status, body).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.expect("answer is JSON"))
    }

    /// The text of `/metrics`.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The channel's head, read from the storage directly.
    pub async fn head(&self, channel: &str) -> u64 {
        self.storage
            .read(&ChannelName::new(channel).unwrap(), 0, 1)
            .await
            .unwrap()
            .head
    }

    /// Every stored message of `channel`, from the storage directly.
    pub async fn stored(&self, channel: &str) -> Vec<Message> {
        let channel = ChannelName::new(channel).unwrap();
        let mut out: Vec<Message> = Vec::new();
        loop {
            let after = out.last().map_or(0, |m| m.offset);
            let page = self.storage.read(&channel, after, 1000).await.unwrap();
            let n = page.messages.len();
            out.extend(page.messages);
            if n < 1000 {
                return out;
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A failed test must not leave tasks or ports behind.
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

/// A stand-in for a holder's HTTP API at [`FakeHolder::url`]: it accepts
/// connections and reads each request (head and `Content-Length` body) but
/// answers nothing, like a frozen process, until [`FakeHolder::answer`]
/// tells it what to answer.
pub struct FakeHolder {
    /// `http://<listener address>`.
    pub url: String,
    requests: watch::Sender<usize>,
    answer: watch::Sender<Option<(u16, String)>>,
    task: JoinHandle<()>,
}

impl FakeHolder {
    /// Listens on a free port of 127.0.0.1, frozen.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = watch::channel(0).0;
        let answer = watch::channel(None).0;
        let task = tokio::spawn({
            let requests = requests.clone();
            let answer = answer.clone();
            async move {
                // Connections live in the set: aborting this task closes them.
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((socket, _)) = listener.accept().await {
                    connections.spawn(Self::serve(socket, requests.clone(), answer.subscribe()));
                }
            }
        });
        Self {
            url,
            requests,
            answer,
            task,
        }
    }

    async fn serve(
        mut socket: tokio::net::TcpStream,
        requests: watch::Sender<usize>,
        mut answer: watch::Receiver<Option<(u16, String)>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < head_end + length {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        requests.send_modify(|n| *n += 1);
        let (status, body) = match answer.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone().unwrap(),
            Err(_) => return,
        };
        let response = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(response.as_bytes()).await;
        let _ = socket.shutdown().await;
    }

    /// Waits until `n` whole requests have arrived in total.
    pub async fn wait_requests(&self, n: usize) {
        let mut requests = self.requests.subscribe();
        within(
            "requests reach the holder",
            NODE_WAIT,
            requests.wait_for(|r| *r >= n),
        )
        .await
        .unwrap();
    }

    /// Answers every request held and to come with `status` and the JSON
    /// `body`.
    pub fn answer(&self, status: u16, body: &str) {
        self.answer.send_replace(Some((status, body.to_owned())));
    }
}

impl Drop for FakeHolder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Publishes `n` messages `{"i": k}` on `channel` one after another and
/// checks that they got offsets `first..first+n`.
pub async fn publish_n(node: &Node, channel: &str, first: u64, n: u64) {
    for k in 0..n {
        let (status, body) = node
            .publish(channel, serde_json::json!({ "i": first + k }))
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["offset"], first + k);
    }
}
