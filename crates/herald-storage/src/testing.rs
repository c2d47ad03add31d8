//! Test support for the PostgreSQL backend: a throwaway database per test.
//!
//! Tests find the PostgreSQL cluster to use in the environment variable
//! [`DATABASE_URL_VAR`] (`HERALD_TEST_DATABASE_URL`), a URL naming a
//! superuser (or a role allowed to create databases), e.g.
//! `postgres://herald@127.0.0.1:5432/postgres`. The project's test command
//! (`scripts/test`) creates a disposable cluster and sets it. A test that
//! needs PostgreSQL and finds the variable unset fails; it is never skipped.
//!
//! [`FakePooler`] stands between a test and the cluster as a connection
//! pooler in session or transaction mode would. [`msg`], [`keyed`] and
//! [`candidate`] build the values that storage calls take.
//!
//! The crate `herald-testkit` re-exports this module for the tests of the
//! crates above this one; the tests of this crate use it directly (a
//! testkit that depends on this crate would give them a second copy of its
//! types).
//!
//! ```text
//! let db = TestDatabase::create().await;
//! let storage = PostgresStorage::connect(db.url(), PostgresOptions::default()).await?;
//! let raw = db.raw_client().await; // "another session", e.g. to hold row locks
//! ```

mod pooler;

pub use pooler::{FakePooler, OptionsHandling, PoolMode, PoolerSettings, Reuse};

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use herald_core::{Candidate, ChannelName, IdempotencyKey, NewMessage, DEFAULT_LEASE_NAME};
use serde_json::value::RawValue;
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

/// The environment variable that names the test cluster.
pub const DATABASE_URL_VAR: &str = "HERALD_TEST_DATABASE_URL";

/// Longest wait for connecting, creating or dropping a test database.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A message for `channel` with the JSON text `data` and no idempotency
/// key.
///
/// # Panics
/// When `channel` is not a valid channel name or `data` is not JSON.
pub fn msg(channel: &str, data: &str) -> NewMessage {
    NewMessage {
        channel: ChannelName::new(channel).expect("valid test channel name"),
        data: herald_core::Payload::Json(Arc::from(
            RawValue::from_string(data.to_owned()).expect("valid test JSON"),
        )),
        idempotency_key: None,
        tags: herald_core::Tags::default(),
    }
}

/// [`msg`] with the idempotency key `key`.
///
/// # Panics
/// As [`msg`], and when `key` is not a valid idempotency key.
pub fn keyed(channel: &str, data: &str, key: &str) -> NewMessage {
    NewMessage {
        idempotency_key: Some(IdempotencyKey::new(key).expect("valid test key")),
        ..msg(channel, data)
    }
}

/// [`msg`] with the tags `tags` (`(key, value)` pairs).
///
/// # Panics
/// As [`msg`].
pub fn tagged(channel: &str, data: &str, tags: &[(&str, &str)]) -> NewMessage {
    NewMessage {
        tags: tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..msg(channel, data)
    }
}

/// The node `node` as a candidate for the default lease
/// ([`DEFAULT_LEASE_NAME`]), advertising `http://<node>.test:8080`.
pub fn candidate(node: &str) -> Candidate {
    Candidate {
        lease_name: DEFAULT_LEASE_NAME.to_owned(),
        node_id: node.to_owned(),
        advertise_url: format!("http://{node}.test:8080"),
    }
}

/// The URL of the test cluster, from [`DATABASE_URL_VAR`].
///
/// # Panics
/// When the variable is unset or empty, with a message that says how to
/// set it.
pub fn cluster_url() -> String {
    match std::env::var(DATABASE_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "{DATABASE_URL_VAR} is not set: run ./scripts/test, which creates a disposable \
             PostgreSQL cluster, or set {DATABASE_URL_VAR} to the URL of a PostgreSQL \
             (14 or newer) superuser, e.g. postgres://user@127.0.0.1:5432/postgres"
        ),
    }
}

/// A database `herald_t_<16 hex digits>`, created empty in the test
/// cluster and dropped (best effort, `DROP DATABASE ... WITH (FORCE)`, which
/// also ends its open sessions) when this value is dropped.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
}

impl TestDatabase {
    /// Creates a new, empty database in the cluster named by
    /// [`DATABASE_URL_VAR`].
    ///
    /// # Panics
    /// When the variable is unset, or the database cannot be created: this
    /// is test code.
    pub async fn create() -> TestDatabase {
        let admin_url = cluster_url();
        let name = format!("herald_t_{:016x}", rand::random::<u64>());
        let admin = connect(&admin_url).await;
        tokio::time::timeout(
            ADMIN_TIMEOUT,
            admin.batch_execute(&format!("CREATE DATABASE {name}")),
        )
        .await
        .unwrap_or_else(|_| panic!("CREATE DATABASE {name} did not finish in time"))
        .unwrap_or_else(|e| {
            panic!(
                "CREATE DATABASE {name} failed: {}",
                crate::error::Error::from(e)
            )
        });
        let url = with_database(&admin_url, &name);
        TestDatabase {
            name,
            url,
            admin_url,
        }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection URL (or key=value string, like the cluster's) for this
    /// database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// This database's URL with the server address replaced by `addr`, for
    /// connecting through a proxy that forwards to [`Self::server_addr`].
    ///
    /// # Panics
    /// When the cluster's URL is a key=value string, not a `postgres://`
    /// URL.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        with_address(&self.url, addr)
    }

    /// The TCP address of the test cluster's server (its first host).
    ///
    /// # Panics
    /// When the cluster is reached through a Unix socket or its host name
    /// does not resolve.
    pub fn server_addr(&self) -> SocketAddr {
        let config: Config = self.url.parse().expect("the test URL parses");
        let port = config.get_ports().first().copied().unwrap_or(5432);
        if let Some(ip) = config.get_hostaddrs().first() {
            return SocketAddr::new(*ip, port);
        }
        match config.get_hosts().first() {
            Some(Host::Tcp(host)) => match host.parse::<IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, port),
                Err(_) => (host.as_str(), port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut addrs| addrs.next())
                    .unwrap_or_else(|| panic!("test database host {host:?} does not resolve")),
            },
            _ => panic!("the test cluster must be reached over TCP for this test"),
        }
    }

    /// A plain client on this database, outside any storage: "another
    /// session", e.g. to hold row locks. Its connection task runs on the
    /// current Tokio runtime.
    ///
    /// # Panics
    /// When the connection fails.
    pub async fn raw_client(&self) -> Client {
        connect(&self.url).await
    }

    /// Whether Herald's schema exists in this database (its lease table
    /// does): a start that was refused must not have created it.
    ///
    /// # Panics
    /// When the database cannot be reached.
    pub async fn migrated(&self) -> bool {
        self.raw_client()
            .await
            .query_one("SELECT to_regclass('storage_leases') IS NOT NULL", &[])
            .await
            .expect("look for the schema")
            .get(0)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // A runtime of its own on a thread of its own: this may run inside
        // another runtime, and outside of any.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let config: Config = admin_url.parse().ok()?;
                let (client, connection) =
                    tokio::time::timeout(ADMIN_TIMEOUT, config.connect(NoTls))
                        .await
                        .ok()?
                        .ok()?;
                tokio::spawn(connection);
                tokio::time::timeout(
                    ADMIN_TIMEOUT,
                    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")),
                )
                .await
                .ok()?
                .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("note: could not drop the test database {}", self.name);
        }
    }
}

/// Connects to `url` and spawns the connection task on the current runtime.
async fn connect(url: &str) -> Client {
    let config: Config = url
        .parse()
        .unwrap_or_else(|e| panic!("{DATABASE_URL_VAR} does not parse: {e}"));
    let (client, connection) = tokio::time::timeout(ADMIN_TIMEOUT, config.connect(NoTls))
        .await
        .unwrap_or_else(|_| panic!("no connection to the test cluster within {ADMIN_TIMEOUT:?}"))
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to the test cluster ({DATABASE_URL_VAR}): {}",
                crate::error::Error::from(e)
            )
        });
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Splits a `postgres://` or `postgresql://` URL into the part up to and
/// including the authority (`scheme://userinfo@hosts`), the path, and the
/// query (with its `?`), or `None` for a key=value string.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let scheme_len = url.len() - rest.len();
    let authority_len = rest.find(['/', '?']).unwrap_or(rest.len());
    let (head, tail) = url.split_at(scheme_len + authority_len);
    let (path, query) = tail.split_at(tail.find('?').unwrap_or(tail.len()));
    Some((head, path, query))
}

/// `url` with its database name replaced by `dbname` (a plain identifier).
/// A key=value string gets ` dbname=...` appended, which overrides an
/// earlier one.
fn with_database(url: &str, dbname: &str) -> String {
    match split_url(url) {
        Some((head, _path, query)) => format!("{head}/{dbname}{query}"),
        None => format!("{url} dbname={dbname}"),
    }
}

/// `url` (a `postgres://` URL) with its hosts and ports replaced by the one
/// address `addr`.
///
/// # Panics
/// On a key=value connection string.
fn with_address(url: &str, addr: SocketAddr) -> String {
    let host = match addr.ip() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    match split_url(url) {
        Some((head, path, query)) => {
            let (scheme_and_user, _hosts) = match head.rfind('@') {
                Some(at) => head.split_at(at + 1),
                None => {
                    let scheme = if head.starts_with("postgresql://") {
                        "postgresql://".len()
                    } else {
                        "postgres://".len()
                    };
                    head.split_at(scheme)
                }
            };
            // A host or port given as query parameters would override the
            // authority; this helper does not rewrite those.
            format!("{scheme_and_user}{host}:{}{path}{query}", addr.port())
        }
        // Repeated `host` or `port` keys add hosts instead of replacing them.
        None => panic!("connecting through another address needs a postgres:// URL"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_replaced() {
        assert_eq!(
            with_database("postgres://u@127.0.0.1:5432/postgres", "x"),
            "postgres://u@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgresql://u:p@h/db?sslmode=disable", "x"),
            "postgresql://u:p@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(
            with_database("postgres://h?application_name=a", "x"),
            "postgres://h/x?application_name=a"
        );
        assert_eq!(
            with_database("host=h user=u dbname=postgres", "x"),
            "host=h user=u dbname=postgres dbname=x"
        );
        let parsed: Config = with_database("host=h dbname=postgres", "x")
            .parse()
            .unwrap();
        assert_eq!(parsed.get_dbname(), Some("x"));
    }

    #[test]
    fn addresses_are_replaced() {
        let addr: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        assert_eq!(
            with_address("postgres://u:p@db.test:5432/x?sslmode=disable", addr),
            "postgres://u:p@127.0.0.1:6000/x?sslmode=disable"
        );
        assert_eq!(
            with_address("postgres://a,b:1/x", addr),
            "postgres://127.0.0.1:6000/x"
        );
    }
}
