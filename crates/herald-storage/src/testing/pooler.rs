//! A small connection pooler for tests, speaking the PostgreSQL wire
//! protocol (version 3.0, PostgreSQL documentation, "Frontend/Backend
//! Protocol", "Message Flow" and "Message Formats"), that behaves like
//! PgBouncer in the respects Herald's start-up check looks at
//! (PgBouncer documentation, "Features" and "Configuration":
//! <https://www.pgbouncer.org/features.html>,
//! <https://www.pgbouncer.org/config.html>):
//!
//! - it answers a client's start-up itself (authentication OK, a made-up
//!   backend key, ready) and opens server connections of its own, with the
//!   client's user and database;
//! - in [`PoolMode::Transaction`] a client is given a server connection
//!   from a shared pool for one transaction: from its first message until
//!   the server's `ReadyForQuery` says "idle" (not in a transaction); then
//!   the server connection goes back to the pool, and the client's next
//!   transaction may run on another one, while another client's may run on
//!   this one. In [`PoolMode::Session`] a client keeps one server connection
//!   of its own until it disconnects;
//! - the start-up parameter `options` is refused (as PgBouncer without
//!   `ignore_startup_parameters = options`), dropped (with it), or passed
//!   to the server connections opened for that client
//!   ([`OptionsHandling`]);
//! - an idle server connection is handed out last-released first
//!   (PgBouncer's default, `server_round_robin = 0`) or in turn
//!   ([`Reuse`]).
//!
//! It needs a server that lets its user in without a password (`trust`,
//! as the test cluster does) and understands only what this crate's driver
//! sends: simple and extended queries ending in `Sync`, no `COPY`, no
//! `Flush`, no TLS. Notifications of a server connection reach whichever
//! client holds it next, if any.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// Protocol version 3.0 in a start-up message.
const PROTOCOL_3_0: i32 = 196_608;
/// The request code of `SSLRequest`.
const SSL_REQUEST: i32 = 80_877_103;
/// The request code of `GSSENCRequest`.
const GSSENC_REQUEST: i32 = 80_877_104;
/// Longest message accepted, in bytes.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// How long a client keeps a server connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// For its whole life (PgBouncer's `pool_mode = session`).
    Session,
    /// For one transaction (PgBouncer's `pool_mode = transaction`).
    Transaction,
}

/// What becomes of the start-up parameter `options` (`-c name=value`
/// session settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionsHandling {
    /// Refused: the client gets `FATAL: unsupported startup parameter:
    /// options` (SQLSTATE 08P01), as from PgBouncer up to 1.19 when
    /// `options` is not in `ignore_startup_parameters`.
    Refuse,
    /// Accepted and dropped: the server connections never see it, as with
    /// PgBouncer's `ignore_startup_parameters = options`.
    Drop,
    /// Passed to the server connections opened for the client (a pooler
    /// that tracks the settings; server connections opened for one client
    /// may serve another).
    Pass,
}

/// Which idle server connection a client is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// The one released last (PgBouncer's default,
    /// `server_round_robin = 0`).
    LastReleased,
    /// The one idle longest (`server_round_robin = 1`).
    InTurn,
}

/// How a [`FakePooler`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolerSettings {
    /// Session or transaction pooling.
    pub mode: PoolMode,
    /// What becomes of `options`.
    pub options: OptionsHandling,
    /// Which idle server connection is handed out.
    pub reuse: Reuse,
    /// Most server connections per user and database (PgBouncer's
    /// `default_pool_size`); a client waits when all are in use.
    pub pool_size: usize,
    /// Server connections opened at the first client of a user and
    /// database, before it is served (PgBouncer's `min_pool_size`), at most
    /// `pool_size`.
    pub warm: usize,
}

impl PoolerSettings {
    /// Transaction pooling with `options` handled as given, last-released
    /// reuse, 8 server connections, none opened in advance.
    pub fn transaction(options: OptionsHandling) -> Self {
        Self {
            mode: PoolMode::Transaction,
            options,
            reuse: Reuse::LastReleased,
            pool_size: 8,
            warm: 0,
        }
    }

    /// Session pooling with `options` handled as given, 8 server
    /// connections.
    pub fn session(options: OptionsHandling) -> Self {
        Self {
            mode: PoolMode::Session,
            ..Self::transaction(options)
        }
    }
}

/// A running fake pooler on a loopback port, forwarding to one server.
/// Dropping it stops it and closes every connection.
#[derive(Debug)]
pub struct FakePooler {
    addr: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl FakePooler {
    /// Starts a pooler in front of the PostgreSQL server at `server`, on
    /// the current Tokio runtime.
    ///
    /// # Panics
    /// When no loopback port can be bound: this is test code.
    pub async fn start(server: SocketAddr, settings: PoolerSettings) -> FakePooler {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the fake pooler");
        let addr = listener.local_addr().expect("the fake pooler's address");
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let shared = Arc::new(Shared {
            server,
            settings,
            pools: Mutex::new(HashMap::new()),
        });
        let clients = Arc::clone(&tasks);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let task = tokio::spawn(async move {
                    // A client that breaks the protocol is just dropped.
                    let _ = serve_client(client, &shared).await;
                });
                lock(&clients).push(task);
            }
        });
        lock(&tasks).push(accept);
        FakePooler { addr, tasks }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for FakePooler {
    fn drop(&mut self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type IoResult<T> = std::io::Result<T>;

fn protocol_error(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

struct Shared {
    server: SocketAddr,
    settings: PoolerSettings,
    /// One pool per (user, database).
    pools: Mutex<HashMap<(String, String), Arc<Pool>>>,
}

/// The server connections of one user and database.
struct Pool {
    /// One permit per server connection in use or that may be opened.
    slots: Arc<Semaphore>,
    idle: Mutex<VecDeque<TcpStream>>,
}

/// A server connection lent to a client, with its slot.
struct Lent {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Pool {
    /// An idle server connection, or a new one opened with `params`.
    async fn lend(&self, shared: &Shared, params: &[(String, String)]) -> IoResult<Lent> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| protocol_error("pool closed"))?;
        let idle = {
            let mut idle = lock(&self.idle);
            match shared.settings.reuse {
                Reuse::LastReleased => idle.pop_back(),
                Reuse::InTurn => idle.pop_front(),
            }
        };
        let stream = match idle {
            Some(stream) => stream,
            None => open_server(shared.server, params).await?,
        };
        Ok(Lent {
            stream,
            _slot: slot,
        })
    }

    /// Takes back a server connection that is idle (not in a transaction).
    fn give_back(&self, lent: Lent) {
        lock(&self.idle).push_back(lent.stream);
    }
}

/// One client connection, from its start-up to its end.
async fn serve_client(mut client: TcpStream, shared: &Shared) -> IoResult<()> {
    let params = read_startup(&mut client).await?;
    let has_options = params.iter().any(|(k, _)| k == "options");
    if has_options && shared.settings.options == OptionsHandling::Refuse {
        client
            .write_all(&error_response(
                "08P01",
                "unsupported startup parameter: options",
            ))
            .await?;
        return Ok(());
    }
    let server_params: Vec<(String, String)> = params
        .iter()
        .filter(|(k, _)| k != "options" || shared.settings.options == OptionsHandling::Pass)
        .cloned()
        .collect();
    let get = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let user = get("user").unwrap_or_default();
    let database = get("database").unwrap_or_else(|| user.clone());
    let (pool, first) = {
        let mut pools = lock(&shared.pools);
        let key = (user, database);
        let first = !pools.contains_key(&key);
        let pool = pools
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Pool {
                    slots: Arc::new(Semaphore::new(shared.settings.pool_size.max(1))),
                    idle: Mutex::new(VecDeque::new()),
                })
            })
            .clone();
        (pool, first)
    };
    if first {
        for _ in 0..shared.settings.warm.min(shared.settings.pool_size) {
            let opened = open_server(shared.server, &server_params).await?;
            lock(&pool.idle).push_back(opened);
        }
    }
    // The pooler's own answer to the start-up: trusted, a made-up key,
    // ready.
    let mut hello = message(b'R', &0i32.to_be_bytes());
    let mut key = Vec::new();
    key.extend_from_slice(&1i32.to_be_bytes());
    key.extend_from_slice(&2i32.to_be_bytes());
    hello.extend(message(b'K', &key));
    hello.extend(message(b'Z', b"I"));
    client.write_all(&hello).await?;

    let mut held: Option<Lent> = None;
    loop {
        let (tag, frame) = read_message(&mut client).await?;
        if tag == b'X' {
            // Terminate. A server connection left inside a transaction is
            // closed, not given back.
            return Ok(());
        }
        let mut lent = match held.take() {
            Some(lent) => lent,
            None => pool.lend(shared, &server_params).await?,
        };
        lent.stream.write_all(&frame).await?;
        if !matches!(tag, b'Q' | b'S') {
            // More of the same request follows, up to its Sync.
            held = Some(lent);
            continue;
        }
        let idle = loop {
            let (tag, frame) = read_message(&mut lent.stream).await?;
            client.write_all(&frame).await?;
            if tag == b'Z' {
                break frame.last() == Some(&b'I');
            }
        };
        if idle && shared.settings.mode == PoolMode::Transaction {
            pool.give_back(lent);
        } else {
            held = Some(lent);
        }
    }
}

/// Reads a client's start-up, refusing TLS and GSS encryption, and
/// returns its parameters.
async fn read_startup(client: &mut TcpStream) -> IoResult<Vec<(String, String)>> {
    loop {
        let len = usize::try_from(client.read_i32().await?)
            .map_err(|_| protocol_error("negative start-up length"))?;
        if !(8..=MAX_MESSAGE).contains(&len) {
            return Err(protocol_error("bad start-up length"));
        }
        let code = client.read_i32().await?;
        let mut body = vec![0u8; len - 8];
        client.read_exact(&mut body).await?;
        match code {
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await?,
            PROTOCOL_3_0 => return parse_params(&body),
            _ => return Err(protocol_error("unsupported protocol")),
        }
    }
}

/// `name\0value\0...\0` as pairs.
fn parse_params(body: &[u8]) -> IoResult<Vec<(String, String)>> {
    let mut fields = body.split(|b| *b == 0).map(String::from_utf8_lossy);
    let mut params = Vec::new();
    while let Some(name) = fields.next() {
        if name.is_empty() {
            break;
        }
        let value = fields
            .next()
            .ok_or_else(|| protocol_error("start-up parameter without a value"))?;
        params.push((name.into_owned(), value.into_owned()));
    }
    Ok(params)
}

/// Opens a server connection with `params` and reads up to its first
/// `ReadyForQuery`.
async fn open_server(server: SocketAddr, params: &[(String, String)]) -> IoResult<TcpStream> {
    let mut stream = TcpStream::connect(server).await?;
    let mut body = Vec::new();
    body.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
    for (name, value) in params {
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let len = i32::try_from(body.len() + 4).map_err(|_| protocol_error("start-up too long"))?;
    let mut startup = len.to_be_bytes().to_vec();
    startup.extend(body);
    stream.write_all(&startup).await?;
    loop {
        let (tag, frame) = read_message(&mut stream).await?;
        match tag {
            b'R' if frame.get(5..9) == Some(&[0, 0, 0, 0]) => {}
            b'R' => {
                return Err(protocol_error(
                    "the fake pooler supports servers that trust it (no password) only",
                ))
            }
            b'E' => {
                return Err(protocol_error(&format!(
                    "the server refused the fake pooler: {}",
                    String::from_utf8_lossy(&frame[5..])
                )))
            }
            b'Z' => return Ok(stream),
            _ => {}
        }
    }
}

/// Reads one message: its tag and the whole frame (tag, length, body).
async fn read_message(stream: &mut TcpStream) -> IoResult<(u8, Vec<u8>)> {
    let tag = stream.read_u8().await?;
    let len = stream.read_i32().await?;
    let len = usize::try_from(len).map_err(|_| protocol_error("negative message length"))?;
    if !(4..=MAX_MESSAGE).contains(&len) {
        return Err(protocol_error("bad message length"));
    }
    let mut frame = Vec::with_capacity(len + 1);
    frame.push(tag);
    frame.extend_from_slice(&(len as i32).to_be_bytes());
    frame.resize(len + 1, 0);
    stream.read_exact(&mut frame[5..]).await?;
    Ok((tag, frame))
}

/// A message frame with `tag` and `body`.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![tag];
    frame.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    frame.extend_from_slice(body);
    frame
}

/// A FATAL `ErrorResponse` with SQLSTATE `code` and `text`.
fn error_response(code: &str, text: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', code), (b'M', text)] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    message(b'E', &body)
}
