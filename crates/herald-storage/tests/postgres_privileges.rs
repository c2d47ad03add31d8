//! A role without the privileges Herald's migrations need: on PostgreSQL
//! 15 and newer only the database's owner may create tables in its schema
//! `public`, so a role that does not own the database fails its first
//! migration. The error says what PostgreSQL said (its message and
//! SQLSTATE) and what to do, not only "db error"; the documented set-up
//! (the role owns the database) then works.
//!
//! Runs on a fresh database of the test cluster (`HERALD_TEST_DATABASE_URL`,
//! a superuser), with a role of its own that it drops again.

use std::time::Duration;

use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::testing::TestDatabase;
use herald_storage::Error;

/// Bound of one connect in this test (connect, checks and migrations).
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

async fn connect(url: &str) -> Result<PostgresStorage, Error> {
    tokio::time::timeout(
        CONNECT_LIMIT,
        PostgresStorage::connect(url, PostgresOptions::default()),
    )
    .await
    .expect("connect settles within its bounds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_cannot_create_tables_gets_the_databases_own_words() {
    // Declared before the database, so dropped after it: then the role
    // owns nothing any more, whatever point the test reached.
    let role = DroppedRole(format!("herald_r_{:016x}", rand::random::<u64>()));
    let db = TestDatabase::create().await;
    let admin = db.raw_client().await;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    let role = role.0.as_str();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC"
        ))
        .await
        .unwrap();
    let addr = db.server_addr();
    let url = format!("postgres://{role}@{addr}/{}", db.name());

    let refused = connect(&url).await;
    let error = match refused {
        Ok(_) => panic!("a role without CREATE on schema public migrated (PostgreSQL {version})"),
        Err(e) => e,
    };
    let text = error.to_string();
    assert!(matches!(error, Error::Migration { .. }), "{text}");
    assert!(
        text.contains("permission denied for schema public"),
        "{text}"
    );
    assert!(text.contains("SQLSTATE 42501"), "{text}");
    assert!(text.contains("OWNER"), "{text}");
    assert!(!db.migrated().await, "a refused start created the schema");

    // The documented set-up: the role owns the database.
    admin
        .batch_execute(&format!("ALTER DATABASE {} OWNER TO {role}", db.name()))
        .await
        .unwrap();
    if version >= 150_000 {
        // From PostgreSQL 15 on, schema public belongs to the database's
        // owner (pg_database_owner), so owning the database is enough.
    } else {
        admin
            .batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {role}"))
            .await
            .unwrap();
    }
    let storage = connect(&url).await.expect("the owner migrates");
    drop(storage);
    assert!(db.migrated().await);
}

/// A role of the test cluster, dropped (best effort) when this is.
struct DroppedRole(String);

impl Drop for DroppedRole {
    fn drop(&mut self) {
        let role = self.0.clone();
        // A runtime of its own on a thread of its own: this runs inside
        // the test's runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let config: tokio_postgres::Config =
                    herald_storage::testing::cluster_url().parse().ok()?;
                let (client, connection) = config.connect(tokio_postgres::NoTls).await.ok()?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("note: could not drop the test role {}", self.0);
        }
    }
}
