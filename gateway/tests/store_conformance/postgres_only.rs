//! PostgreSQL's own concerns: an unreachable server, concurrent migrations.

use std::sync::Arc;

use berth_core::Write;
use berth_gateway::store::postgres::{PostgresStore, Settings};
use berth_gateway::store::{PageRequest, Store, StoreError};

use super::pg::{fresh_schema, in_schema, server_ca, server_url};
use super::{postgres, provider, sandbox};

#[tokio::test]
async fn an_unreachable_database_is_unavailable_and_its_password_never_shown() {
    let err = PostgresStore::connect("postgres://berth:hunter2-secret@127.0.0.1:1/berth").await.err().unwrap();
    let StoreError::Unavailable(message) = &err else { panic!("{err:?}") };
    assert!(message.contains("berth@127.0.0.1:1/berth"), "names where it tried: {message}");
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    let err = PostgresStore::connect("mysql://x").await.err().unwrap();
    assert!(matches!(err, StoreError::Unavailable(ref m) if m.contains("not a PostgreSQL URL")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateways_starting_together_migrate_once_and_share_records() {
    let Some(first) = postgres("migrate_together").await else { return };
    let url = in_schema(&server_url("migrate_together").unwrap(), "test_migrate_together");
    // The schema is already current; more gateways racing to start must all get through.
    let starts = (0..4).map(|_| PostgresStore::connect(&url));
    let others: Vec<PostgresStore> =
        futures_util::future::join_all(starts).await.into_iter().map(Result::unwrap).collect();
    first.commit(&[Write::CreateSandbox(sandbox("sb-1", "one"))]).await.unwrap();
    for other in &others {
        assert_eq!(other.sandbox_by_name("one").await.unwrap().unwrap().id.as_str(), "sb-1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateways_starting_together_agree_on_the_identity() {
    let Some(url) = fresh_schema("identity_together").await else { return };
    // Each races the others to make it, on a database that has none yet.
    let starts = (0..4).map(|_| PostgresStore::connect(&url));
    let stores: Vec<PostgresStore> =
        futures_util::future::join_all(starts).await.into_iter().map(Result::unwrap).collect();
    let identity = stores[0].identity().to_string();
    assert_eq!(identity.len(), 32, "{identity}");
    for store in &stores {
        assert_eq!(store.identity(), identity);
    }
    assert_eq!(PostgresStore::connect(&url).await.unwrap().identity(), identity, "reconnected");
    let Some(other) = postgres("identity_other").await else { return };
    assert_ne!(other.identity(), identity, "another database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_newer_schema_is_refused() {
    let Some(store) = postgres("newer_schema").await else { return };
    let url = server_url("newer_schema").unwrap();
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    admin.batch_execute("UPDATE test_newer_schema.berth_schema SET version = version + 1").await.unwrap();
    drop(store);
    let err = PostgresStore::connect(&format!("{url}?options=-csearch_path%3Dtest_newer_schema")).await.err().unwrap();
    assert!(matches!(err, StoreError::Unavailable(ref m) if m.contains("newer than this build")), "{err:?}");
}

/// A row written before rows kept the key of their index tables' contents (or whose key is
/// otherwise not the record's) is written whole, index tables included, and keeps the key after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_without_its_index_key_gets_its_index_tables_written() {
    let Some(store) = postgres("index_key").await else { return };
    let (admin, connection) =
        tokio_postgres::connect(&server_url("index_key").unwrap(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let mut a = super::sandbox("sb-a", "alpha");
    std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
    store.commit(&[Write::CreateSandbox(a.clone())]).await.unwrap();
    admin.batch_execute("UPDATE test_index_key.sandboxes SET indexed = NULL").await.unwrap();
    let mut a2 = super::bumped(&a);
    a2.providers = std::sync::Arc::new(["p2".to_string()].into());
    store.commit(&[Write::UpdateSandbox { record: a2.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![]);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![a2.clone()]);
    let row = admin.query_one("SELECT indexed FROM test_index_key.sandboxes", &[]).await.unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some(r#"[["p2"],{}]"#));
    // The next write that leaves them alone changes the record only.
    let a3 = super::bumped(&a2);
    store.commit(&[Write::UpdateSandbox { record: a3.clone(), expected: 2 }]).await.unwrap();
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![a3]);
}

/// A commit whose caller goes away (a cancelled RPC) may stop anywhere: before its BEGIN,
/// inside its transaction, after its COMMIT. Whatever the point, it lands whole or not at
/// all, and the connection it had serves no later commit from inside its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_abandoned_part_way_lands_whole_or_not_and_leaves_no_transaction_open() {
    let Some(url) = fresh_schema("abandoned_commits").await else { return };
    // One connection, so that the commit after an abandoned one gets its connection.
    let settings = berth_gateway::store::postgres::Settings { connections: 1, ..Default::default() };
    let store = PostgresStore::connect_with(&url, settings).await.unwrap();
    let (observer, connection) =
        tokio_postgres::connect(&server_url("abandoned_commits").unwrap(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let exists = async |table: &str, name: &str| {
        let sql = format!("SELECT 1 FROM test_abandoned_commits.{table} WHERE name = $1");
        observer.query_opt(&sql, &[&name]).await.unwrap().is_some()
    };
    // Both halves of a commit read in one statement, so one snapshot: an abandoned commit's
    // connection is closed, but a COMMIT already in the server's socket buffer still runs,
    // and may land between two reads made one after the other.
    let halves = async |sandbox: &str, provider: &str| {
        let sql = "SELECT EXISTS (SELECT 1 FROM test_abandoned_commits.sandboxes WHERE name = $1), \
                   EXISTS (SELECT 1 FROM test_abandoned_commits.providers WHERE name = $2)";
        let row = observer.query_one(sql, &[&sandbox, &provider]).await.unwrap();
        (row.get::<_, bool>(0), row.get::<_, bool>(1))
    };
    let commit = |i: u64| {
        [
            Write::CreateSandbox(sandbox(&format!("sb-a{i}"), &format!("a{i}"))),
            Write::CreateProvider(provider(&format!("p{i}"))),
        ]
    };
    // The moments given reach from none to twice a whole commit's time on this machine now.
    let started = std::time::Instant::now();
    for i in 1000..1010 {
        store.commit(&commit(i)).await.unwrap();
    }
    let whole = started.elapsed() / 10;
    for i in 0..300u64 {
        let (a, p) = (format!("a{i}"), format!("p{i}"));
        let writes = commit(i);
        let finished = tokio::time::timeout(whole * (i as u32) / 150, store.commit(&writes)).await.is_ok();
        let b = format!("b{i}");
        store.commit(&[Write::CreateSandbox(sandbox(&format!("sb-b{i}"), &b))]).await.unwrap();
        assert!(exists("sandboxes", &b).await, "commit {i} after an abandoned one is visible to others");
        let (sandbox_landed, provider_landed) = halves(&a, &p).await;
        assert_eq!(sandbox_landed, provider_landed, "abandoned commit {i} landed whole or not at all");
        assert!(sandbox_landed || !finished, "commit {i} finished, so it landed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pages_come_in_byte_order_whatever_the_locale() {
    let Some(store) = postgres("byte_order").await else { return };
    let store: Arc<dyn Store> = Arc::new(store);
    for name in ["b1", "b-1", "B", "b"] {
        store.commit(&[Write::CreateProvider(provider(name))]).await.unwrap();
    }
    let page = store.list_providers(&PageRequest { after: None, limit: 10 }).await.unwrap();
    let names: Vec<&str> = page.items.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["B", "b", "b-1", "b1"]);
}

/// Whether every connection named `application` speaks TLS (and there is one).
async fn encrypted(url: &str, application: &str) -> bool {
    let (admin, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty(), "no connection named {application}");
    rows.iter().all(|row| row.get::<_, bool>(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_speaks_tls_and_checks_the_certificate_and_its_name() {
    let Some(url) = fresh_schema("store_tls").await else { return };
    let Some(ca) = server_ca("store_tls") else { return };
    let with_ca = |ca: &std::path::Path| Settings { ca: Some(ca.to_path_buf()), ..Settings::default() };
    let tls = format!("{url}&sslmode=require&application_name=berth_store_tls_on");
    let store = PostgresStore::connect_with(&tls, with_ca(&ca)).await.unwrap();
    store.commit(&[Write::CreateSandbox(sandbox("sb-1", "one"))]).await.unwrap();
    assert_eq!(store.sandbox_by_name("one").await.unwrap().unwrap().id.as_str(), "sb-1");
    let admin = server_url("store_tls").unwrap();
    assert!(encrypted(&admin, "berth_store_tls_on").await, "sslmode=require is spoken over TLS");
    // Without it, as before: plaintext.
    let plain = PostgresStore::connect(&format!("{url}&application_name=berth_store_tls_off")).await.unwrap();
    assert_eq!(plain.sandbox_by_name("one").await.unwrap().unwrap().id.as_str(), "sb-1");
    assert!(!encrypted(&admin, "berth_store_tls_off").await);

    let unavailable = |err: StoreError| match err {
        StoreError::Unavailable(message) => message,
        other => panic!("{other:?}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let stranger = dir.path().join("stranger.pem");
    std::fs::write(&stranger, rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap().cert.pem())
        .unwrap();
    let message = unavailable(PostgresStore::connect_with(&tls, with_ca(&stranger)).await.err().unwrap());
    assert!(message.contains("invalid peer certificate: UnknownIssuer"), "another CA's is refused: {message}");
    // The certificate is for the address 127.0.0.1, not the name localhost.
    let by_name = tls.replacen("127.0.0.1", "localhost", 1);
    let message = unavailable(PostgresStore::connect_with(&by_name, with_ca(&ca)).await.err().unwrap());
    assert!(message.contains("certificate not valid for name \"localhost\""), "its name is checked: {message}");

    let message = unavailable(PostgresStore::connect_with(&url, with_ca(&ca)).await.err().unwrap());
    assert!(message.starts_with("store_ca:") && message.contains("sslmode=require"), "{message}");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let message = unavailable(PostgresStore::connect_with(&tls, with_ca(&empty)).await.err().unwrap());
    assert!(message.starts_with("store_ca:") && message.contains("holds no PEM certificate"), "{message}");
    let message = unavailable(PostgresStore::connect(&format!("{url}&sslmode=verify-full")).await.err().unwrap());
    assert!(message.contains("as libpq's verify-full does"), "{message}");
}
