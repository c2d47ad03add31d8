//! The shared conformance suite against the SQLite backend: every case gets
//! a new temporary data directory, and each node of a cluster is a separate
//! `SqliteStorage` on it (its own connections and session, like a separate
//! process).

use std::sync::Arc;

use async_trait::async_trait;
use herald_storage::conformance::{Cluster, Harness};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage};
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
}

herald_storage::conformance_tests!(SqliteHarness);

#[tokio::test]
async fn backend_is_sqlite() {
    let cluster = SqliteHarness.cluster(1).await;
    assert_eq!(cluster.node(0).backend(), "sqlite");
}
