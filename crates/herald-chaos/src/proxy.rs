//! A TCP fault proxy between one node and its database.
//!
//! A [`FaultProxy`] listens on a loopback port; the node is given that port
//! instead of the database's. For every connection it accepts, the proxy
//! opens its own connection to the upstream address and copies bytes both
//! ways. The harness changes the proxy's [`Mode`] at any time; a change is
//! effective at once for the connections already open and for new ones.
//!
//! # What each mode models
//!
//! - [`Mode::Pass`]: a healthy network. Bytes are copied as they arrive.
//! - [`Mode::Cut`]: a connection reset, or a path that fails so that both
//!   ends find out at once. Every open connection is closed abortively (both
//!   the node and the database get a TCP reset), and every new connection is
//!   accepted and reset at once, without a connection to the upstream.
//! - [`Mode::Blackhole`]: a partition in which packets vanish. Open
//!   connections stay open, but nothing is forwarded in either direction:
//!   what the proxy reads meanwhile is discarded, never delivered later. New
//!   connections are accepted and never connected upstream; they stay dead
//!   ends for their whole life, even after the mode changes back.
//! - [`Mode::Delay`]: a slow link. Everything is forwarded in order, but each
//!   chunk read from one side is written to the other only once the delay has
//!   passed since it was read. The delay applies per direction, so a request
//!   and its answer take at least twice the delay.
//!
//! # What it does not model
//!
//! The proxy is a user-space relay: it ends each TCP connection in its own
//! kernel. Everything TCP does below the byte stream happens between each
//! peer and the proxy's host, never end to end:
//!
//! - **Keepalives and user timeouts do not see a blackhole.** In a real
//!   partition the peers' keepalive probes vanish too, and the kernel
//!   declares the connection dead after the keepalive idle time plus its
//!   probes (or when unacknowledged data outlives `TCP_USER_TIMEOUT`). Here
//!   the proxy's kernel answers the probes and acknowledges the data it then
//!   discards, so neither the node's nor PostgreSQL's kernel ever notices:
//!   TCP keepalives, `tcp_user_timeout` and PostgreSQL's
//!   `client_connection_check_interval` do not fire, and a session lock held
//!   by such a connection stays held. Only timeouts kept by the applications
//!   themselves (a client-side deadline, a server's idle or statement
//!   timeout on a session that hears nothing) end a blackholed connection.
//!   To model the kernel's eventual verdict, switch to [`Mode::Cut`] once the
//!   keepalive time has passed; for the kernel behaviour itself, drop
//!   packets below TCP (packet filter rules) instead of using this proxy.
//! - **A healed partition is not modelled by `Blackhole` then `Pass`.** Real
//!   TCP retransmits what was lost, so after a short partition the data
//!   arrives late but whole. Here the bytes discarded during the blackhole
//!   are gone and the stream resumes after a gap, which desynchronises any
//!   framed protocol (PostgreSQL's included). Connections that lived through
//!   a blackhole are best considered lost; `Blackhole`, then `Cut`, then
//!   `Pass` models a partition that ends with the connections reset.
//! - **No connection is refused or left hanging in `connect`.** A new
//!   connection's TCP handshake with the proxy always succeeds (the listen
//!   backlog completes it). Under `Cut` the client then sees a reset on its
//!   first read or write, not a refused or timed-out `connect`; under
//!   `Blackhole` it sees a connection that never answers.
//! - **Faults are symmetric.** Both directions and both ends are affected
//!   alike: there is no one-way loss, and `Cut` resets both ends together.
//! - **`Delay` is latency only**: no bandwidth limit, no jitter, no
//!   reordering, and establishing a connection is not delayed. A chunk's
//!   release time follows the current mode, not the one at the time it was
//!   read: shortening the delay, or switching to `Pass`, releases held
//!   chunks sooner; switching to `Blackhole` discards them.
//! - Bytes already written to a peer's socket before a mode change are in
//!   that peer's kernel and are delivered regardless.
//!
//! # Lifetime
//!
//! [`FaultProxy::shutdown`] (or dropping the proxy) stops the listener and
//! closes every connection abortively; every task the proxy started ends
//! with it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Size of the buffer each direction of a connection reads into.
const CHUNK_SIZE: usize = 16 * 1024;

/// How many chunks one direction holds between reading and writing them
/// before it stops reading (back-pressure, mostly relevant under `Delay`).
const QUEUE_CHUNKS: usize = 256;

/// How the proxy treats traffic; see the [module documentation](self) for
/// what each mode models and what it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Forward everything at once.
    #[default]
    Pass,
    /// Reset every open connection now, and reset new ones as soon as they
    /// are accepted.
    Cut,
    /// Keep connections open but forward nothing: bytes read are discarded.
    /// New connections are accepted but never connected upstream.
    Blackhole,
    /// Forward everything, in order, each chunk held for this long after it
    /// was read (in each direction).
    Delay(Duration),
}

/// A running fault proxy; see the [module documentation](self).
///
/// Must be started, used and dropped within a Tokio runtime.
#[derive(Debug)]
pub struct FaultProxy {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept_task: Option<JoinHandle<()>>,
}

/// State shared by the handle and the proxy's tasks.
#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    /// The token the connections accepted since the last switch to `Cut`
    /// hold; a switch to `Cut` cancels it and puts a fresh one in its place.
    /// The mode changes under this lock too, so a new connection reads the
    /// mode and takes the token consistently.
    cut: Mutex<CancellationToken>,
    /// Cancelled when the proxy shuts down; parent of every `cut` token.
    shutdown: CancellationToken,
    connections: AtomicUsize,
    bytes_forwarded: AtomicU64,
}

impl Shared {
    fn current_mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// The mode a new connection starts under and the token that ends it.
    fn admit(&self) -> (Mode, CancellationToken) {
        let cut = self.cut.lock().unwrap_or_else(PoisonError::into_inner);
        (self.current_mode(), cut.clone())
    }
}

impl FaultProxy {
    /// Listens on `127.0.0.1` (an ephemeral port, see
    /// [`local_addr`](Self::local_addr)) and relays every accepted connection
    /// to `upstream`, starting in [`Mode::Pass`].
    ///
    /// # Errors
    ///
    /// If the listening socket cannot be bound.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let local_addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            upstream,
            mode: watch::Sender::new(Mode::Pass),
            cut: Mutex::new(shutdown.child_token()),
            shutdown,
            connections: AtomicUsize::new(0),
            bytes_forwarded: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        tracing::debug!(%local_addr, %upstream, "fault proxy started");
        Ok(FaultProxy {
            local_addr,
            shared,
            accept_task: Some(accept_task),
        })
    }

    /// The address clients connect to instead of the upstream's.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address every relayed connection goes to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.current_mode()
    }

    /// Switches to `mode`, at once, for open and new connections.
    ///
    /// Switching to [`Mode::Cut`] starts closing every open connection
    /// before this returns; the connections are gone (and
    /// [`connections`](Self::connections) has dropped) a moment later, once
    /// their tasks have run.
    pub fn set_mode(&self, mode: Mode) {
        let mut cut = self
            .shared
            .cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let previous = self.shared.mode.send_replace(mode);
        if mode == Mode::Cut {
            cut.cancel();
            *cut = self.shared.shutdown.child_token();
        }
        drop(cut);
        if previous != mode {
            tracing::debug!(local_addr = %self.local_addr, ?previous, ?mode, "fault proxy mode");
        }
    }

    /// How many accepted client connections are open now: relayed ones, and
    /// those accepted under [`Mode::Blackhole`] that lead nowhere.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// How many bytes the proxy has written to either side since it started,
    /// both directions together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.shared.bytes_forwarded.load(Ordering::Relaxed)
    }

    /// Stops the listener, resets every connection and waits until every
    /// task of the proxy has ended.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(task) = self.accept_task.take() {
            if let Err(error) = task.await {
                tracing::warn!(%error, "fault proxy accept task failed");
            }
        }
    }
}

impl Drop for FaultProxy {
    /// Stops the listener and resets every connection; the proxy's tasks end
    /// promptly on their own.
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// Accepts connections until shutdown, then waits for every connection task.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = shared.shutdown.cancelled() => break,
            Some(done) = tasks.join_next(), if !tasks.is_empty() => log_task_end(done),
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    let (mode, cut) = shared.admit();
                    if mode == Mode::Cut {
                        tracing::debug!(%peer, "fault proxy: cut, resetting new connection");
                        reset(&client);
                        continue;
                    }
                    let open = OpenConnection::new(Arc::clone(&shared));
                    tasks.spawn(handle_connection(client, peer, mode, cut, open));
                }
                Err(error) => {
                    // Typically out of file descriptors; do not spin.
                    tracing::warn!(%error, "fault proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    while let Some(done) = tasks.join_next().await {
        log_task_end(done);
    }
}

fn log_task_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(error) = done {
        tracing::warn!(%error, "fault proxy connection task failed");
    }
}

/// Counts an open client connection for as long as it lives.
struct OpenConnection(Arc<Shared>);

impl OpenConnection {
    fn new(shared: Arc<Shared>) -> Self {
        shared.connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(shared)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Makes the socket's close send a TCP reset instead of a FIN.
fn reset(stream: &TcpStream) {
    // Failing only means the close is graceful.
    let _ = stream.set_zero_linger();
}

/// Serves one accepted client connection until it ends or is cut.
async fn handle_connection(
    client: TcpStream,
    peer: SocketAddr,
    mode: Mode,
    cut: CancellationToken,
    open: OpenConnection,
) {
    let shared = &open.0;
    let _ = client.set_nodelay(true);
    if mode == Mode::Blackhole {
        tracing::debug!(%peer, "fault proxy: blackhole, new connection leads nowhere");
        dead_end(client, &cut).await;
        return;
    }
    let connected = tokio::select! {
        () = cut.cancelled() => {
            reset(&client);
            return;
        }
        connected = TcpStream::connect(shared.upstream) => connected,
    };
    let upstream = match connected {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::debug!(%peer, %error, "fault proxy: upstream connect failed");
            reset(&client);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    relay(client, upstream, peer, &cut, shared).await;
}

/// Reads and discards what the client sends until it closes or the
/// connection is cut.
async fn dead_end(mut client: TcpStream, cut: &CancellationToken) {
    let mut buf = vec![0u8; CHUNK_SIZE];
    let cancelled = tokio::select! {
        () = cut.cancelled() => true,
        () = async {
            while let Ok(n) = client.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        } => false,
    };
    if cancelled {
        reset(&client);
    }
}

/// Copies both ways until both directions have ended cleanly; on an error in
/// either direction, or when cut, resets both sides.
async fn relay(
    mut client: TcpStream,
    mut upstream: TcpStream,
    peer: SocketAddr,
    cut: &CancellationToken,
    shared: &Shared,
) {
    let clean = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let both = async {
            tokio::try_join!(
                direction(client_read, upstream_write, shared),
                direction(upstream_read, client_write, shared),
            )
        };
        tokio::select! {
            () = cut.cancelled() => {
                tracing::debug!(%peer, "fault proxy: connection cut");
                false
            }
            ended = both => match ended {
                Ok(_) => true,
                Err(error) => {
                    tracing::debug!(%peer, %error, "fault proxy: connection failed");
                    false
                }
            },
        }
    };
    if !clean {
        reset(&client);
        reset(&upstream);
    }
}

/// What one direction carries from its reader to its writer.
enum Item {
    Data(Vec<u8>),
    /// The source closed its side: shut down the destination's write side.
    Eof,
}

/// An item and when it was read.
struct Chunk {
    item: Item,
    read_at: Instant,
}

/// Copies one direction: a reader that applies the mode to what it reads,
/// and a writer that holds each chunk as the mode says, in order.
async fn direction<R, W>(from: R, to: W, shared: &Shared) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, rx) = mpsc::channel(QUEUE_CHUNKS);
    tokio::try_join!(read_side(from, tx, shared), write_side(to, rx, shared))?;
    Ok(())
}

async fn read_side<R>(mut from: R, tx: mpsc::Sender<Chunk>, shared: &Shared) -> io::Result<()>
where
    R: AsyncRead + Unpin,
{
    let mut buf = vec![0u8; CHUNK_SIZE];
    loop {
        let n = from.read(&mut buf).await?;
        let read_at = Instant::now();
        let forwarded = matches!(shared.current_mode(), Mode::Pass | Mode::Delay(_));
        if n == 0 {
            // Under a blackhole the end of stream vanishes like data: the
            // writer ends without shutting the other side down.
            if forwarded {
                let _ = tx
                    .send(Chunk {
                        item: Item::Eof,
                        read_at,
                    })
                    .await;
            }
            return Ok(());
        }
        if !forwarded {
            continue;
        }
        let chunk = Chunk {
            item: Item::Data(buf[..n].to_vec()),
            read_at,
        };
        if tx.send(chunk).await.is_err() {
            // The writer has ended.
            return Ok(());
        }
    }
}

async fn write_side<W>(mut to: W, mut rx: mpsc::Receiver<Chunk>, shared: &Shared) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut mode = shared.mode.subscribe();
    while let Some(chunk) = rx.recv().await {
        if !release(chunk.read_at, &mut mode).await {
            continue;
        }
        match chunk.item {
            Item::Data(bytes) => {
                to.write_all(&bytes).await?;
                shared
                    .bytes_forwarded
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            Item::Eof => to.shutdown().await?,
        }
    }
    Ok(())
}

/// Waits until a chunk read at `read_at` may be written under the current
/// mode, following mode changes. False if the chunk must be discarded.
async fn release(read_at: Instant, mode: &mut watch::Receiver<Mode>) -> bool {
    loop {
        let current = *mode.borrow_and_update();
        let due = match current {
            Mode::Pass => return true,
            Mode::Cut | Mode::Blackhole => return false,
            Mode::Delay(delay) => read_at + delay,
        };
        if Instant::now() >= due {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep_until(due) => return true,
            changed = mode.changed() => {
                if changed.is_err() {
                    // The proxy is gone; hold the chunk as last told.
                    tokio::time::sleep_until(due).await;
                    return true;
                }
            }
        }
    }
}
