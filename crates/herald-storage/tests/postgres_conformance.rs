//! The shared conformance suite against the PostgreSQL backend: every case
//! gets a fresh database in the test cluster (`HERALD_TEST_DATABASE_URL`),
//! and each node of a cluster is a separate `PostgresStorage` on it (its own
//! pool and renewal connection, like a separate process).

use std::collections::BTreeMap;
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

    async fn row_counts(&self, cluster: &Cluster) -> BTreeMap<String, u64> {
        let db = cluster
            .guard
            .downcast_ref::<TestDatabase>()
            .expect("the cluster's database");
        let client = db.raw_client().await;
        let tables = client
            .query(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
                &[],
            )
            .await
            .unwrap();
        let mut counts = BTreeMap::new();
        for row in tables {
            let table: String = row.get(0);
            let rows: i64 = client
                .query_one(&format!("SELECT count(*) FROM \"{table}\""), &[])
                .await
                .unwrap()
                .get(0);
            counts.insert(table, u64::try_from(rows).unwrap());
        }
        counts
    }
}

herald_storage::conformance_tests!(PostgresHarness);

#[tokio::test]
async fn backend_is_postgres() {
    let cluster = PostgresHarness.cluster(1).await;
    assert_eq!(cluster.node(0).backend(), "postgres");
}

/// A channel whose epoch was stored by an older version (a
/// `channel_epochs` row) keeps it; a channel without one gets the derived
/// epoch, and asking writes no row.
#[tokio::test]
async fn a_stored_epoch_is_kept() {
    let cluster = PostgresHarness.cluster(1).await;
    let db = cluster
        .guard
        .downcast_ref::<TestDatabase>()
        .expect("the cluster's database");
    let client = db.raw_client().await;
    client
        .execute(
            "INSERT INTO channel_epochs (name, epoch, created_at) VALUES ('old', '0123456789abcdef', now())",
            &[],
        )
        .await
        .unwrap();
    let node = cluster.node(0);
    let old = herald_core::ChannelName::new("old").unwrap();
    assert_eq!(node.channel_epoch(&old).await.unwrap(), "0123456789abcdef");
    let new = herald_core::ChannelName::new("new").unwrap();
    assert_ne!(node.channel_epoch(&new).await.unwrap(), "0123456789abcdef");
    let rows: i64 = client
        .query_one("SELECT count(*) FROM channel_epochs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
}
