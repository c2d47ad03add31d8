//! Where an in-process node keeps its messages: SQLite files in a
//! directory, or a PostgreSQL database ([`StorageAt`]); and a place of a
//! test's own on either backend, removed when dropped ([`Place`]), so that
//! one scenario runs on both.

use std::path::Path;
use std::sync::Arc;

use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage};
use herald_storage::Storage;
use tempfile::TempDir;

use crate::database::TestDatabase;

/// The storage backend a [`Place`] is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite files in a temp dir.
    Sqlite,
    /// A fresh database of the shared PostgreSQL test cluster
    /// (`HERALD_TEST_DATABASE_URL`).
    Postgres,
}

/// Where a node's storage is: what [`crate::node::Node`] opens. A `&Path`
/// (SQLite) or a `&Place` (either backend) converts into it.
#[derive(Debug, Clone, Copy)]
pub enum StorageAt<'a> {
    /// SQLite files in this directory.
    Sqlite(&'a Path),
    /// The PostgreSQL database at this URL.
    Postgres(&'a str),
}

impl StorageAt<'_> {
    /// Opens a new connection to the storage, default options.
    ///
    /// # Panics
    /// When the storage cannot be opened.
    pub async fn open(self) -> Arc<dyn Storage> {
        match self {
            Self::Sqlite(dir) => Arc::new(
                SqliteStorage::open(dir, SqliteOptions::default())
                    .await
                    .expect("open SQLite storage"),
            ),
            Self::Postgres(url) => Arc::new(
                PostgresStorage::connect(url, PostgresOptions::default())
                    .await
                    .expect("connect to PostgreSQL storage"),
            ),
        }
    }
}

impl<'a> From<&'a Path> for StorageAt<'a> {
    fn from(dir: &'a Path) -> Self {
        Self::Sqlite(dir)
    }
}

impl<'a> From<&'a Place> for StorageAt<'a> {
    fn from(place: &'a Place) -> Self {
        match &place.url {
            None => Self::Sqlite(place.dir.path()),
            Some(url) => Self::Postgres(url),
        }
    }
}

/// One storage of a test's own, shared by its nodes: a temp dir, and on
/// PostgreSQL a fresh database; both removed when dropped (drop the nodes
/// first).
pub struct Place {
    /// The temp dir (SQLite's files; free for other files on PostgreSQL).
    pub dir: TempDir,
    /// The database URL the nodes connect to (PostgreSQL only). A test may
    /// change it before starting nodes, e.g. to add a password.
    pub url: Option<String>,
    /// Kept so that the database lives as long as the place.
    _db: Option<TestDatabase>,
}

impl Place {
    /// A new place on `backend`.
    pub async fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        match backend {
            Backend::Sqlite => Self {
                dir,
                url: None,
                _db: None,
            },
            Backend::Postgres => {
                let db = TestDatabase::create().await;
                Self {
                    dir,
                    url: Some(db.url().to_owned()),
                    _db: Some(db),
                }
            }
        }
    }
}

/// The two tests of a scenario `async fn(Backend)`: `$sqlite` runs it on
/// SQLite, `$postgres` on PostgreSQL (each a `#[tokio::test]`).
#[macro_export]
macro_rules! on_both_backends {
    ($scenario:ident: $sqlite:ident, $postgres:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            $scenario($crate::place::Backend::Sqlite).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $scenario($crate::place::Backend::Postgres).await;
        }
    };
}
