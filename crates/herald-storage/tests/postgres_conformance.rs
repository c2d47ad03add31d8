//! The shared conformance suite against the PostgreSQL backend: every case
//! gets a fresh database in the test cluster (`HERALD_TEST_DATABASE_URL`),
//! and each node of a cluster is a separate `PostgresStorage` on it (its own
//! pool and renewal connection, like a separate process).

use std::sync::Arc;

use async_trait::async_trait;
use herald_storage::conformance::{Cluster, Harness};
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::testing::TestDatabase;
use herald_storage::Storage;

struct PostgresHarness;

#[async_trait]
impl Harness for PostgresHarness {
    async fn cluster(&self, n: usize) -> Cluster {
        let db = TestDatabase::create().await;
        let mut nodes: Vec<Arc<dyn Storage>> = Vec::with_capacity(n);
        for _ in 0..n {
            let storage = PostgresStorage::connect(db.url(), PostgresOptions::default())
                .await
                .expect("connect to the test database");
            nodes.push(Arc::new(storage));
        }
        Cluster {
            nodes,
            guard: Box::new(db),
        }
    }
}

herald_storage::conformance_tests!(PostgresHarness);

#[tokio::test]
async fn backend_is_postgres() {
    let cluster = PostgresHarness.cluster(1).await;
    assert_eq!(cluster.node(0).backend(), "postgres");
}
