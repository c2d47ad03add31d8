//! Shared helpers of the end-to-end tests: a node built as the binary
//! builds it (SQLite storage in a temporary directory, the lease supervisor,
//! `serve` on a real listener on 127.0.0.1:0), small SSE and WebSocket
//! clients, and storage wrappers that slow reads down, hold appends or
//! make reads fail.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use herald_core::{
    Appended, Candidate, ChannelHead, ChannelName, Lease, LeaseInfo, Message, NewMessage, Offset,
};
use herald_lease::{BootClock, LeaseConfig, LeaseHandle, LeaseState, StopReason, Supervisor};
use herald_server::{serve, ServerConfig};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage};
use herald_storage::{Acquire, ChangeFeed, LeaseStore, Page, Storage};
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest any single wait in these tests may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Awaits `f`, failing the test after [`WAIT`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Which role `Node::start` waits for before serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Holder,
    Standby,
}

/// One running node.
pub struct Node {
    pub node_id: String,
    pub base: String,
    pub ws_base: String,
    pub storage: Arc<SqliteStorage>,
    pub lease: LeaseHandle,
    pub client: reqwest::Client,
    /// Drains the server.
    pub shutdown: CancellationToken,
    server: Option<JoinHandle<Result<(), herald_server::StartError>>>,
    lease_shutdown: CancellationToken,
    supervisor: Option<JoinHandle<StopReason>>,
}

impl Node {
    /// A holder on a fresh data directory, default settings.
    pub async fn holder(dir: &Path) -> Self {
        Self::start(dir, "node-a", Role::Holder, ServerConfig::default()).await
    }

    /// Opens the storage in `dir`, starts the supervisor, waits for `role`,
    /// then serves.
    pub async fn start(dir: &Path, node_id: &str, role: Role, config: ServerConfig) -> Self {
        Self::start_with(dir, node_id, role, config, |s| s).await
    }

    /// [`Node::start`], with the server's storage wrapped by `wrap` (the
    /// supervisor always gets the plain one).
    pub async fn start_with(
        dir: &Path,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        wrap: impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage>,
    ) -> Self {
        Self::launch(dir, node_id, role, config, wrap, None).await
    }

    /// [`Node::start`], advertising `advertise_url` in the lease instead of
    /// its own listener's URL: standbys forward publishes there.
    pub async fn start_advertising(
        dir: &Path,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        advertise_url: &str,
    ) -> Self {
        Self::launch(dir, node_id, role, config, |s| s, Some(advertise_url)).await
    }

    async fn launch(
        dir: &Path,
        node_id: &str,
        role: Role,
        config: ServerConfig,
        wrap: impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage>,
        advertise_url: Option<&str>,
    ) -> Self {
        let storage = Arc::new(
            SqliteStorage::open(dir, SqliteOptions::default())
                .await
                .expect("open storage"),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
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
            LeaseConfig::default(),
            Arc::new(BootClock),
            lease_shutdown.clone(),
        );
        let reached = within(
            "lease role",
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
            wrap(storage.clone() as Arc<dyn Storage>),
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
            within("serve returns after drain", server)
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

    /// Drains, then stops the supervisor (which releases the lease).
    pub async fn stop(mut self) -> StopReason {
        self.drain().await;
        self.lease_shutdown.cancel();
        let supervisor = self.supervisor.take().unwrap();
        within("supervisor stops", supervisor)
            .await
            .expect("supervisor task")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
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
        within("requests reach the holder", requests.wait_for(|r| *r >= n))
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

/// One parsed SSE event (WHATWG HTML, "Server-sent events").
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// One block of an event stream.
#[derive(Debug, Clone)]
pub enum SseItem {
    /// A block with at least one field.
    Event(SseEvent),
    /// A block of comment lines only (`:`), such as a heartbeat; the raw
    /// text.
    Comment(String),
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A minimal SSE client over reqwest's byte stream.
pub struct SseClient {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    stream: ByteStream,
    buf: String,
}

impl SseClient {
    /// Opens `url`, sending `Last-Event-ID` when given.
    pub async fn connect(client: &reqwest::Client, url: &str, last_event_id: Option<&str>) -> Self {
        let mut request = client.get(url).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = within("SSE connect", request.send())
            .await
            .expect("SSE request");
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            stream: Box::pin(response.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event (comments skipped); `None` when the stream ended.
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            match self.next_item().await? {
                SseItem::Event(event) => return Some(event),
                SseItem::Comment(_) => {}
            }
        }
    }

    /// The next event or comment block (a heartbeat); `None` when the
    /// stream ended.
    pub async fn next_item(&mut self) -> Option<SseItem> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut event = SseEvent {
                    id: None,
                    event: None,
                    data: String::new(),
                };
                let mut has_field = false;
                let mut data_lines: Vec<&str> = Vec::new();
                for line in block.lines() {
                    if line.is_empty() || line.starts_with(':') {
                        continue;
                    }
                    has_field = true;
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "id" => event.id = Some(value.to_owned()),
                        "event" => event.event = Some(value.to_owned()),
                        "data" => data_lines.push(value),
                        _ => {}
                    }
                }
                event.data = data_lines.join("\n");
                if has_field {
                    return Some(SseItem::Event(event));
                }
                return Some(SseItem::Comment(block));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self
                    .buf
                    .push_str(std::str::from_utf8(&chunk).expect("UTF-8")),
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// The next message event's payload, with its id checked against the
    /// payload's offset.
    pub async fn next_message(&mut self) -> Option<Value> {
        let event = self.next_event().await?;
        assert_eq!(event.event.as_deref(), Some("message"));
        let value: Value = serde_json::from_str(&event.data).expect("event data is JSON");
        assert_eq!(
            event.id.as_deref(),
            Some(value["offset"].to_string().as_str())
        );
        Some(value)
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

/// A small deterministic pseudo-random sequence (xorshift64*), seeded per
/// test run; the seed is printed so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn from_time() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        println!("rng seed {seed}");
        Self(seed)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// A storage whose history reads return late (by up to `max_delay`), to
/// widen the window between a subscriber's history read and its switch to
/// live notices, and to make live receivers lag behind while they read.
/// Deliberate latency injection, not a wait for an event.
pub struct SlowReads {
    inner: Arc<dyn Storage>,
    max_delay: Duration,
    rng: std::sync::Mutex<Rng>,
}

impl SlowReads {
    pub fn wrap(inner: Arc<dyn Storage>, max_delay: Duration) -> Arc<dyn Storage> {
        Arc::new(Self {
            inner,
            max_delay,
            rng: std::sync::Mutex::new(Rng::from_time()),
        })
    }
}

#[async_trait::async_trait]
impl LeaseStore for SlowReads {
    async fn acquire(
        &self,
        candidate: &Candidate,
        ttl: Duration,
    ) -> herald_storage::Result<Acquire> {
        self.inner.acquire(candidate, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> herald_storage::Result<()> {
        self.inner.renew(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> herald_storage::Result<()> {
        self.inner.release(lease).await
    }
    async fn lease_info(&self, name: &str) -> herald_storage::Result<Option<LeaseInfo>> {
        self.inner.lease_info(name).await
    }
}

#[async_trait::async_trait]
impl Storage for SlowReads {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn append(
        &self,
        lease: &Lease,
        batch: &[NewMessage],
    ) -> herald_storage::Result<Vec<Appended>> {
        self.inner.append(lease, batch).await
    }
    async fn read(
        &self,
        channel: &ChannelName,
        after: Offset,
        limit: usize,
    ) -> herald_storage::Result<Page> {
        let page = self.inner.read(channel, after, limit).await?;
        let micros = self.max_delay.as_micros() as u64;
        let delay = self.rng.lock().unwrap().below(micros + 1);
        tokio::time::sleep(Duration::from_micros(delay)).await;
        Ok(page)
    }
    async fn channels(&self) -> herald_storage::Result<Vec<ChannelHead>> {
        self.inner.channels().await
    }
    async fn changes_since(&self, cursor: u64) -> herald_storage::Result<ChangeFeed> {
        self.inner.changes_since(cursor).await
    }
    async fn change_cursor(&self) -> herald_storage::Result<u64> {
        self.inner.change_cursor().await
    }
    async fn ping(&self) -> herald_storage::Result<()> {
        self.inner.ping().await
    }
}

/// Holds every `append` until opened, and counts the appends that started.
pub struct AppendGate {
    open: watch::Sender<bool>,
    started: watch::Sender<usize>,
}

impl AppendGate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            open: watch::channel(false).0,
            started: watch::channel(0).0,
        })
    }

    /// Lets every held and future append through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Holds appends that start from now on.
    pub fn close(&self) {
        self.open.send_replace(false);
    }

    /// Appends started so far.
    pub fn started(&self) -> usize {
        *self.started.borrow()
    }

    /// Waits until `n` appends have started.
    pub async fn wait_started(&self, n: usize) {
        let mut started = self.started.subscribe();
        within("appends start", started.wait_for(|s| *s >= n))
            .await
            .unwrap();
    }

    /// Wraps `inner` so that its appends wait for this gate.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Storage>) -> Arc<dyn Storage> {
        Arc::new(Gated {
            inner,
            gate: Arc::clone(self),
        })
    }
}

struct Gated {
    inner: Arc<dyn Storage>,
    gate: Arc<AppendGate>,
}

#[async_trait::async_trait]
impl LeaseStore for Gated {
    async fn acquire(
        &self,
        candidate: &Candidate,
        ttl: Duration,
    ) -> herald_storage::Result<Acquire> {
        self.inner.acquire(candidate, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> herald_storage::Result<()> {
        self.inner.renew(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> herald_storage::Result<()> {
        self.inner.release(lease).await
    }
    async fn lease_info(&self, name: &str) -> herald_storage::Result<Option<LeaseInfo>> {
        self.inner.lease_info(name).await
    }
}

#[async_trait::async_trait]
impl Storage for Gated {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn append(
        &self,
        lease: &Lease,
        batch: &[NewMessage],
    ) -> herald_storage::Result<Vec<Appended>> {
        self.gate.started.send_modify(|s| *s += 1);
        let mut open = self.gate.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
        self.inner.append(lease, batch).await
    }
    async fn read(
        &self,
        channel: &ChannelName,
        after: Offset,
        limit: usize,
    ) -> herald_storage::Result<Page> {
        self.inner.read(channel, after, limit).await
    }
    async fn channels(&self) -> herald_storage::Result<Vec<ChannelHead>> {
        self.inner.channels().await
    }
    async fn changes_since(&self, cursor: u64) -> herald_storage::Result<ChangeFeed> {
        self.inner.changes_since(cursor).await
    }
    async fn change_cursor(&self) -> herald_storage::Result<u64> {
        self.inner.change_cursor().await
    }
    async fn ping(&self) -> herald_storage::Result<()> {
        self.inner.ping().await
    }
}

/// A WebSocket client connection.
pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket to `path` on `node`, expecting the upgrade (101).
pub async fn ws_connect(node: &Node, path: &str) -> Ws {
    let url = format!("{}{path}", node.ws_base);
    let (ws, response) = within("WebSocket connect", tokio_tungstenite::connect_async(url))
        .await
        .expect("WebSocket handshake");
    assert_eq!(response.status().as_u16(), 101);
    ws
}

/// The next message frame's JSON; `None` when the socket closed (the close
/// frame's code, if any, is returned through `closed`).
pub async fn ws_next(ws: &mut Ws, closed: &mut Option<u16>) -> Option<Value> {
    use tokio_tungstenite::tungstenite::Message as Frame;
    loop {
        match ws.next().await? {
            Ok(Frame::Text(text)) => {
                return Some(serde_json::from_str(&text).expect("frame is JSON"))
            }
            Ok(Frame::Close(frame)) => {
                *closed = frame.map(|f| u16::from(f.code));
                // Keep reading: that sends the protocol's Close reply and
                // sees the server end the connection.
                while let Some(Ok(_)) = ws.next().await {}
                return None;
            }
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// Switches a storage outage for reads on and off: while it is on, every
/// `read` of a wrapped storage fails with `Unavailable` (a transient error,
/// as when the database is down or restarting); everything else passes.
/// Counts the failed reads per channel, so that tests can await them.
pub struct ReadOutage {
    on: std::sync::atomic::AtomicBool,
    failed: watch::Sender<BTreeMap<String, usize>>,
}

impl ReadOutage {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            on: std::sync::atomic::AtomicBool::new(false),
            failed: watch::channel(BTreeMap::new()).0,
        })
    }

    /// Reads fail from now on.
    pub fn start(&self) {
        self.on.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Reads pass again.
    pub fn end(&self) {
        self.on.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until `n` reads of `channel` have failed in total.
    pub async fn wait_failed(&self, channel: &str, n: usize) {
        let mut failed = self.failed.subscribe();
        within(
            &format!("{n} failed reads of {channel}"),
            failed.wait_for(|f| f.get(channel).copied().unwrap_or(0) >= n),
        )
        .await
        .unwrap();
    }

    /// Wraps `inner` so that its reads fail while the outage is on.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Storage>) -> Arc<dyn Storage> {
        Arc::new(OutageReads {
            inner,
            outage: Arc::clone(self),
        })
    }
}

struct OutageReads {
    inner: Arc<dyn Storage>,
    outage: Arc<ReadOutage>,
}

#[async_trait::async_trait]
impl LeaseStore for OutageReads {
    async fn acquire(
        &self,
        candidate: &Candidate,
        ttl: Duration,
    ) -> herald_storage::Result<Acquire> {
        self.inner.acquire(candidate, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> herald_storage::Result<()> {
        self.inner.renew(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> herald_storage::Result<()> {
        self.inner.release(lease).await
    }
    async fn lease_info(&self, name: &str) -> herald_storage::Result<Option<LeaseInfo>> {
        self.inner.lease_info(name).await
    }
}

#[async_trait::async_trait]
impl Storage for OutageReads {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn append(
        &self,
        lease: &Lease,
        batch: &[NewMessage],
    ) -> herald_storage::Result<Vec<Appended>> {
        self.inner.append(lease, batch).await
    }
    async fn read(
        &self,
        channel: &ChannelName,
        after: Offset,
        limit: usize,
    ) -> herald_storage::Result<Page> {
        if self.outage.on.load(std::sync::atomic::Ordering::SeqCst) {
            self.outage.failed.send_modify(|f| {
                *f.entry(channel.as_str().to_owned()).or_default() += 1;
            });
            return Err(herald_storage::Error::unavailable("injected outage"));
        }
        self.inner.read(channel, after, limit).await
    }
    async fn channels(&self) -> herald_storage::Result<Vec<ChannelHead>> {
        self.inner.channels().await
    }
    async fn changes_since(&self, cursor: u64) -> herald_storage::Result<ChangeFeed> {
        self.inner.changes_since(cursor).await
    }
    async fn change_cursor(&self) -> herald_storage::Result<u64> {
        self.inner.change_cursor().await
    }
    async fn ping(&self) -> herald_storage::Result<()> {
        self.inner.ping().await
    }
}
