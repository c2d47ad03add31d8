//! The shared conformance suite against the SQLite backend: every case gets
//! a new temporary data directory, and each node of a cluster is a separate
//! `SqliteStorage` on it (its own connections and session, like a separate
//! process).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use herald_storage::conformance::{Cluster, Harness};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage, DATABASE_FILE};
use herald_storage::Storage;

struct SqliteHarness;

#[async_trait]
impl Harness for SqliteHarness {
    async fn cluster(&self, n: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut nodes: Vec<Arc<dyn Storage>> = Vec::with_capacity(n);
        for _ in 0..n {
            let storage = SqliteStorage::open(dir.path(), SqliteOptions::default())
                .await
                .expect("open sqlite storage");
            nodes.push(Arc::new(storage));
        }
        Cluster {
            nodes,
            guard: Box::new(dir),
        }
    }

    async fn row_counts(&self, cluster: &Cluster) -> BTreeMap<String, u64> {
        let dir = cluster
            .guard
            .downcast_ref::<tempfile::TempDir>()
            .expect("the cluster's directory");
        let path = dir.path().join(DATABASE_FILE);
        tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open_with_flags(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .expect("open the database read-only");
            let tables: Vec<String> = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            tables
                .into_iter()
                .map(|table| {
                    let rows: i64 = conn
                        .query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |r| r.get(0))
                        .unwrap();
                    (table, u64::try_from(rows).unwrap())
                })
                .collect()
        })
        .await
        .unwrap()
    }
}

herald_storage::conformance_tests!(SqliteHarness);

#[tokio::test]
async fn backend_is_sqlite() {
    let cluster = SqliteHarness.cluster(1).await;
    assert_eq!(cluster.node(0).backend(), "sqlite");
}

/// A channel whose epoch was stored by an older version (a
/// `channel_epochs` row) keeps it; a channel without one gets the derived
/// epoch, and asking writes no row.
#[tokio::test]
async fn a_stored_epoch_is_kept() {
    let cluster = SqliteHarness.cluster(1).await;
    let dir = cluster
        .guard
        .downcast_ref::<tempfile::TempDir>()
        .expect("the cluster's directory");
    let conn = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    conn.execute(
        "INSERT INTO channel_epochs (name, epoch, created_at_ms) VALUES ('old', '0123456789abcdef', 0)",
        [],
    )
    .unwrap();
    let node = cluster.node(0);
    let old = herald_core::ChannelName::new("old").unwrap();
    assert_eq!(node.channel_epoch(&old).await.unwrap(), "0123456789abcdef");
    let new = herald_core::ChannelName::new("new").unwrap();
    assert_ne!(node.channel_epoch(&new).await.unwrap(), "0123456789abcdef");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM channel_epochs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
}
