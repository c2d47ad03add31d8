//! Connection poolers between a node and PostgreSQL: `PostgresStorage::
//! connect` refuses, before it changes anything, a pooler that runs one
//! connection's transactions in different server sessions or that refuses
//! or drops the session settings sent at connection start; it works through
//! a pooler in session mode that passes them on.
//!
//! The pooler is `herald_storage::testing::FakePooler`, a small pooler
//! that speaks the wire protocol and hands out server connections per
//! transaction (or per client) as PgBouncer does. Every test runs on a
//! fresh database of the test cluster (`HERALD_TEST_DATABASE_URL`).

use std::time::Duration;

use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::testing::{
    FakePooler, OptionsHandling, PoolMode, PoolerSettings, Reuse, TestDatabase,
};
use herald_storage::{Error, PoolerEvidence, Storage};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// Bound of one connect attempt in these tests (connect timeout + 1 s,
/// plus the check and the migrations, with room to spare).
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

async fn pooler(db: &TestDatabase, settings: PoolerSettings) -> (FakePooler, String) {
    let pooler = FakePooler::start(db.server_addr(), settings).await;
    let url = db.url_via(pooler.addr());
    (pooler, url)
}

async fn connect(url: &str) -> Result<PostgresStorage, Error> {
    tokio::time::timeout(
        CONNECT_LIMIT,
        PostgresStorage::connect(url, PostgresOptions::default()),
    )
    .await
    .expect("connect settles within its bounds")
}

async fn raw_via(url: &str) -> Client {
    let (client, connection) = url
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

async fn backend_pid(client: &Client) -> String {
    let messages = client
        .simple_query("SELECT pg_backend_pid()")
        .await
        .unwrap();
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap()
}

fn refused(result: Result<PostgresStorage, Error>) -> PoolerEvidence {
    match result {
        Err(Error::UnsupportedPooler(evidence)) => evidence,
        Err(other) => panic!("expected UnsupportedPooler, got {other:?}"),
        Ok(storage) => panic!("connected through the pooler: {storage:?}"),
    }
}

/// The fake pooler does what the tests below rely on: in transaction mode
/// consecutive transactions of one client run in different server
/// sessions (here, with two idle server connections handed out in turn),
/// in session mode they do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_pooler_pools_per_transaction_or_per_session() {
    let db = TestDatabase::create().await;
    let in_turn = PoolerSettings {
        reuse: Reuse::InTurn,
        warm: 2,
        ..PoolerSettings::transaction(OptionsHandling::Drop)
    };
    let (_transaction, url) = pooler(&db, in_turn).await;
    let client = raw_via(&url).await;
    assert_ne!(backend_pid(&client).await, backend_pid(&client).await);

    let (_session, url) = pooler(
        &db,
        PoolerSettings {
            mode: PoolMode::Session,
            ..in_turn
        },
    )
    .await;
    let client = raw_via(&url).await;
    assert_eq!(backend_pid(&client).await, backend_pid(&client).await);
}

/// PgBouncer's default: `options` is refused at connection start. The
/// error names the pooler and what to do, not only the server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_that_refuses_options_is_named() {
    let db = TestDatabase::create().await;
    let (_pooler, url) = pooler(&db, PoolerSettings::transaction(OptionsHandling::Refuse)).await;
    let result = connect(&url).await;
    let text = match &result {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    assert_eq!(
        refused(result),
        PoolerEvidence::OptionsRefused {
            server_message: "unsupported startup parameter: options".to_owned()
        }
    );
    assert!(text.contains("a connection pooler was detected"), "{text}");
    assert!(text.contains("connect directly to PostgreSQL"), "{text}");
    assert!(text.contains("pooler in session mode"), "{text}");
    assert!(!db.migrated().await);
}

/// PgBouncer with `ignore_startup_parameters = options` in transaction
/// mode, its usual set-up: the start went through without a word before.
/// Here the server connection released last is handed out again: the
/// node's second check connection gets the first one's server session,
/// and the first one's next transaction gets another one (or, if the
/// second one's commit came first, the same one: shared either way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_that_drops_options_is_refused_before_anything_changes() {
    let db = TestDatabase::create().await;
    let (_pooler, url) = pooler(&db, PoolerSettings::transaction(OptionsHandling::Drop)).await;
    let result = connect(&url).await;
    let text = match &result {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    assert!(
        matches!(
            refused(result),
            PoolerEvidence::BackendChanged { .. } | PoolerEvidence::SharedBackend { .. }
        ),
        "{text}"
    );
    assert!(
        text.starts_with("a transaction-pooling proxy was detected"),
        "{text}"
    );
    assert!(text.contains("connect directly to PostgreSQL"), "{text}");
    assert!(!db.migrated().await);
}

/// A transaction pooler that passes the settings on, so that only the
/// server sessions tell: handing out idle server connections in turn, one
/// connection's next transaction runs in another session; handing out
/// the one released last, a second connection runs in the first one's
/// (and the first one's next transaction, while the second holds it, in
/// another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_is_refused_by_the_server_sessions_it_hands_out() {
    let db = TestDatabase::create().await;
    let in_turn = PoolerSettings {
        reuse: Reuse::InTurn,
        warm: 2,
        ..PoolerSettings::transaction(OptionsHandling::Pass)
    };
    let (_pooler, url) = pooler(&db, in_turn).await;
    let evidence = refused(connect(&url).await);
    assert!(
        matches!(evidence, PoolerEvidence::BackendChanged { first, then } if first != then),
        "{evidence:?}"
    );

    let (_pooler, url) = pooler(&db, PoolerSettings::transaction(OptionsHandling::Pass)).await;
    let evidence = refused(connect(&url).await);
    assert!(
        matches!(
            evidence,
            PoolerEvidence::BackendChanged { .. } | PoolerEvidence::SharedBackend { .. }
        ),
        "{evidence:?}"
    );
    assert!(!db.migrated().await);
}

/// A pooler in session mode that drops `options`: one session per
/// connection, but none of the node's timeouts would be in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pooler_that_drops_options_is_refused() {
    let db = TestDatabase::create().await;
    let (_pooler, url) = pooler(&db, PoolerSettings::session(OptionsHandling::Drop)).await;
    let evidence = refused(connect(&url).await);
    assert_eq!(
        evidence,
        PoolerEvidence::SettingsDropped {
            setting: "lock_timeout".to_owned(),
            sent: "60000".to_owned(),
            found: "0".to_owned(),
        }
    );
    assert!(!db.migrated().await);
}

/// Through a pooler in session mode that passes `options` on, and directly,
/// the check passes and the node works with its settings in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_connection_and_a_session_pooler_that_passes_options_are_accepted() {
    let db = TestDatabase::create().await;
    let direct = connect(db.url()).await.expect("a direct connection");
    direct.ping().await.unwrap();
    drop(direct);

    let (_pooler, url) = pooler(&db, PoolerSettings::session(OptionsHandling::Pass)).await;
    let storage = connect(&url).await.expect("through a session pooler");
    storage.ping().await.unwrap();
    let settings = storage.session_settings().await.unwrap();
    assert_eq!(settings.pool.statement_timeout, "5s");
}
