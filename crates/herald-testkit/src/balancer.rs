//! [`Balancer`]: a TCP front for several nodes, as a load balancer with
//! health checks puts one address before a cluster. Each new connection
//! goes to the first node, in the order given, that accepts a TCP
//! connection, and lives until either side closes it; so a client that
//! reconnects after its node died (and refuses connections) lands on the
//! next one, while the client keeps the one address it was given.
//!
//! Routing can be held: connections accepted meanwhile wait, unrouted,
//! until it is released, so a test can make a client stay away while
//! something happens (a load balancer that has not yet seen the surviving
//! node healthy).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A TCP front on a loopback port for `backends`; stops accepting when
/// dropped (connections already routed live on until they close).
pub struct Balancer {
    addr: SocketAddr,
    /// The backend index each routed connection went to, in the order
    /// they were routed.
    routes: Arc<Mutex<Vec<usize>>>,
    /// Whether new connections are routed (`false`: they wait).
    open: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Balancer {
    /// Listens on a free loopback port, routing every connection.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the balancer");
        let addr = listener.local_addr().expect("the balancer's address");
        let routes = Arc::new(Mutex::new(Vec::new()));
        let (open, opened) = watch::channel(true);
        let backends = Arc::new(backends);
        let routed = routes.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let backends = backends.clone();
                let routed = routed.clone();
                let mut opened = opened.clone();
                tokio::spawn(async move {
                    if opened.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    for (index, backend) in backends.iter().enumerate() {
                        if let Ok(upstream) = TcpStream::connect(backend).await {
                            routed
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(index);
                            forward(client, upstream).await;
                            return;
                        }
                    }
                    // No backend accepts: the client's connection closes.
                });
            }
        });
        Self {
            addr,
            routes,
            open,
            accept,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The backend index of each connection routed so far, in routing
    /// order. A connection's route is recorded before any of its bytes is
    /// forwarded, so once a client saw an answer through the balancer,
    /// its connection is listed.
    pub fn routes(&self) -> Vec<usize> {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Holds routing: connections accepted from now on wait, unrouted.
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    /// Routes the connections that wait, and every one after.
    pub fn release(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways until either side closes or fails, then closes both.
async fn forward(mut client: TcpStream, mut upstream: TcpStream) {
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    tokio::select! {
        _ = tokio::io::copy(&mut client_read, &mut upstream_write) => {}
        _ = tokio::io::copy(&mut upstream_read, &mut client_write) => {}
    }
}
