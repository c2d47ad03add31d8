//! The fault proxy on loopback: an echo server upstream, each mode's effect
//! on open and new connections, shutdown, and one session of a real
//! PostgreSQL server (`HERALD_TEST_DATABASE_URL`) carried through the proxy
//! and then cut.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herald_chaos::proxy::{FaultProxy, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout, Instant};

/// How long anything that should happen promptly may take.
const PROMPT: Duration = Duration::from_secs(5);

/// How long a test watches for something that must not arrive.
const SILENCE: Duration = Duration::from_millis(300);

/// An echo server on loopback that counts the connections it accepted.
struct Echo {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl Echo {
    async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        Echo { addr, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    timeout(PROMPT, TcpStream::connect(proxy.local_addr()))
        .await
        .expect("connect timed out")
        .expect("connect failed")
}

/// Writes `message` and reads back exactly as many bytes.
async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    stream.write_all(message).await.expect("write failed");
    let mut back = vec![0u8; message.len()];
    timeout(PROMPT, stream.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .expect("reading the echo failed");
    back
}

/// Asserts that the stream ends (end of stream or an error) promptly.
async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(PROMPT, stream.read(&mut buf)).await {
        Err(_) => panic!("connection still open after {PROMPT:?}"),
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("expected the connection closed, read {n} bytes"),
    }
}

/// Asserts that nothing arrives, and the connection stays open, for `SILENCE`.
async fn assert_silent(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(SILENCE, stream.read(&mut buf)).await {
        Err(_) => {}
        Ok(Ok(0)) => panic!("connection closed, expected it open and silent"),
        Ok(Ok(n)) => panic!("expected silence, read {:?}", &buf[..n]),
        Ok(Err(error)) => panic!("connection failed, expected it open and silent: {error}"),
    }
}

/// Waits until the proxy has forwarded `expected` bytes (it counts a write
/// once it has returned, which may be just after the peer has read it).
async fn wait_forwarded(proxy: &FaultProxy, expected: u64) {
    let deadline = Instant::now() + PROMPT;
    while proxy.bytes_forwarded() != expected {
        assert!(
            Instant::now() < deadline,
            "proxy forwarded {} bytes, expected {expected}",
            proxy.bytes_forwarded()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the proxy counts `expected` open connections.
async fn wait_connections(proxy: &FaultProxy, expected: usize) {
    let deadline = Instant::now() + PROMPT;
    while proxy.connections() != expected {
        assert!(
            Instant::now() < deadline,
            "proxy has {} connections, expected {expected}",
            proxy.connections()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn pass_round_trips_bytes() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    assert_eq!(proxy.mode(), Mode::Pass);
    assert_eq!(proxy.upstream(), echo.addr);

    let mut client = connect(&proxy).await;
    assert_eq!(round_trip(&mut client, b"hello").await, b"hello");
    assert_eq!(proxy.connections(), 1);
    wait_forwarded(&proxy, 10).await; // 5 bytes each way

    // More than one chunk, written while the echo is read back.
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut read, mut write) = client.into_split();
    let sent = big.clone();
    let writer = tokio::spawn(async move {
        write.write_all(&sent).await.unwrap();
        write
    });
    let mut back = vec![0u8; big.len()];
    timeout(PROMPT, read.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    assert!(back == big, "the echo differs from what was sent");
    wait_forwarded(&proxy, 10 + 2 * big.len() as u64).await;

    // Closing the client ends the relay.
    let write = writer.await.unwrap();
    drop(write);
    drop(read);
    wait_connections(&proxy, 0).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn cut_closes_open_connections_and_new_ones_until_pass() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    let mut first = connect(&proxy).await;
    let mut second = connect(&proxy).await;
    assert_eq!(round_trip(&mut first, b"one").await, b"one");
    assert_eq!(round_trip(&mut second, b"two").await, b"two");
    assert_eq!(proxy.connections(), 2);

    proxy.set_mode(Mode::Cut);
    assert_eq!(proxy.mode(), Mode::Cut);
    assert_closed(&mut first).await;
    assert_closed(&mut second).await;
    wait_connections(&proxy, 0).await;

    // New connections are accepted and closed at once, never relayed.
    let before = echo.accepted();
    let mut refused = connect(&proxy).await;
    let _ = refused.write_all(b"anyone?").await;
    assert_closed(&mut refused).await;
    assert_eq!(echo.accepted(), before, "a cut connection reached upstream");
    assert_eq!(proxy.connections(), 0);

    proxy.set_mode(Mode::Pass);
    let mut again = connect(&proxy).await;
    assert_eq!(round_trip(&mut again, b"back").await, b"back");
    assert_eq!(echo.accepted(), before + 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn blackhole_drops_data_and_does_not_deliver_it_later() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    let mut open = connect(&proxy).await;
    assert_eq!(round_trip(&mut open, b"before").await, b"before");
    wait_forwarded(&proxy, 12).await;
    let forwarded = proxy.bytes_forwarded();

    proxy.set_mode(Mode::Blackhole);
    open.write_all(b"lost").await.unwrap();
    assert_silent(&mut open).await;

    // A new connection is accepted but never reaches upstream.
    let upstream_before = echo.accepted();
    let mut stranded = connect(&proxy).await;
    stranded.write_all(b"void").await.unwrap();
    assert_silent(&mut stranded).await;
    assert_eq!(echo.accepted(), upstream_before);
    assert_eq!(proxy.connections(), 2, "both connections are held open");
    assert_eq!(proxy.bytes_forwarded(), forwarded);

    proxy.set_mode(Mode::Pass);
    // What was sent during the blackhole is gone, not delivered now...
    assert_silent(&mut open).await;
    // ...and the connection carries what is sent after it.
    assert_eq!(round_trip(&mut open, b"after").await, b"after");
    // The connection accepted during the blackhole still leads nowhere.
    stranded.write_all(b"still there?").await.unwrap();
    assert_silent(&mut stranded).await;

    // New connections work.
    let mut fresh = connect(&proxy).await;
    assert_eq!(round_trip(&mut fresh, b"fresh").await, b"fresh");
    assert_eq!(echo.accepted(), upstream_before + 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn delay_holds_each_direction_and_keeps_order() {
    let delay = Duration::from_millis(200);
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    let mut client = connect(&proxy).await;
    assert_eq!(round_trip(&mut client, b"warm").await, b"warm");

    proxy.set_mode(Mode::Delay(delay));
    let start = Instant::now();
    assert_eq!(round_trip(&mut client, b"slow").await, b"slow");
    let elapsed = start.elapsed();
    // Held once on the way up and once on the way back.
    assert!(
        elapsed >= 2 * delay,
        "echo after {elapsed:?}, expected at least {:?}",
        2 * delay
    );
    assert!(elapsed < PROMPT, "echo after {elapsed:?}");

    // Several chunks written apart come back whole and in order.
    let start = Instant::now();
    let mut expected = Vec::new();
    for i in 0..5u8 {
        let part = [b'a' + i; 3];
        client.write_all(&part).await.unwrap();
        expected.extend_from_slice(&part);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut back = vec![0u8; expected.len()];
    timeout(PROMPT, client.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    assert_eq!(back, expected);
    assert!(start.elapsed() >= 2 * delay);

    // Switching to Pass releases what is held at once.
    proxy.set_mode(Mode::Delay(Duration::from_secs(60)));
    client.write_all(b"held").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.set_mode(Mode::Pass);
    let mut back = [0u8; 4];
    timeout(PROMPT, client.read_exact(&mut back))
        .await
        .expect("held chunk not released by Pass")
        .unwrap();
    assert_eq!(&back, b"held");
    proxy.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_every_connection_and_the_listener() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    let addr = proxy.local_addr();
    let mut relayed = connect(&proxy).await;
    assert_eq!(round_trip(&mut relayed, b"x").await, b"x");
    proxy.set_mode(Mode::Blackhole);
    let mut stranded = connect(&proxy).await;
    wait_connections(&proxy, 2).await;

    timeout(PROMPT, proxy.shutdown())
        .await
        .expect("shutdown timed out");
    assert_closed(&mut relayed).await;
    assert_closed(&mut stranded).await;
    let refused = timeout(PROMPT, TcpStream::connect(addr))
        .await
        .expect("connect timed out");
    assert!(refused.is_err(), "the listener still accepts");
}

#[tokio::test]
async fn drop_closes_every_connection() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.unwrap();
    let mut client = connect(&proxy).await;
    assert_eq!(round_trip(&mut client, b"x").await, b"x");
    drop(proxy);
    assert_closed(&mut client).await;
}

/// The upstream address of the test database, from `HERALD_TEST_DATABASE_URL`.
async fn database() -> (tokio_postgres::Config, SocketAddr) {
    let url = std::env::var("HERALD_TEST_DATABASE_URL").expect(
        "HERALD_TEST_DATABASE_URL must be set to a PostgreSQL URL \
         (postgres://user@host:port/database) for the proxy's PostgreSQL test",
    );
    let config: tokio_postgres::Config = url
        .parse()
        .expect("HERALD_TEST_DATABASE_URL is not a valid PostgreSQL URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => panic!("HERALD_TEST_DATABASE_URL must name a TCP host"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("cannot resolve the database host")
        .next()
        .expect("the database host resolves to no address");
    (config, addr)
}

/// Opens a session through the proxy; the connection's task reports how the
/// connection ended.
async fn session(
    config: &tokio_postgres::Config,
    proxy: &FaultProxy,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let stream = connect(proxy).await;
    let (client, connection) = timeout(PROMPT, config.connect_raw(stream, tokio_postgres::NoTls))
        .await
        .expect("PostgreSQL startup through the proxy timed out")
        .expect("PostgreSQL startup through the proxy failed");
    (client, tokio::spawn(connection))
}

async fn select_one(client: &tokio_postgres::Client) -> Result<i32, tokio_postgres::Error> {
    let row = timeout(PROMPT, client.query_one("SELECT 1::int4", &[]))
        .await
        .expect("query timed out")?;
    Ok(row.get(0))
}

#[tokio::test]
async fn postgres_session_runs_through_the_proxy_and_fails_when_cut() {
    let (config, upstream) = database().await;
    let proxy = FaultProxy::start(upstream).await.unwrap();

    let (client, connection) = session(&config, &proxy).await;
    assert_eq!(select_one(&client).await.unwrap(), 1);
    assert!(proxy.bytes_forwarded() > 0);

    proxy.set_mode(Mode::Cut);
    let ended = timeout(PROMPT, connection)
        .await
        .expect("the PostgreSQL connection outlived the cut")
        .unwrap();
    let error = ended.expect_err("the PostgreSQL connection ended cleanly after a cut");
    eprintln!("connection after the cut: {error}");
    let error = select_one(&client)
        .await
        .expect_err("a query succeeded after the cut");
    assert!(error.is_closed(), "unexpected error: {error}");

    proxy.set_mode(Mode::Pass);
    let (client, _connection) = session(&config, &proxy).await;
    assert_eq!(select_one(&client).await.unwrap(), 1);
    proxy.shutdown().await;
}
