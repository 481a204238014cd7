//! SQLite's own concerns: file mode, restarts, migrations, damaged data.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use berth_core::{Key, SandboxId, Write};
use berth_gateway::store::sqlite::SqliteStore;
use berth_gateway::store::{CommitError, PageRequest, StoreError};

use super::{Shared, provider, sandbox, selector};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn open(path: &Path) -> Shared {
    Arc::new(SqliteStore::open(path).unwrap())
}

fn user_version(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap()
}

#[tokio::test]
async fn database_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let store = open(&path);
    store.commit(&[Write::CreateProvider(provider("p1"))]).await.unwrap();
    assert_eq!(mode(&path), 0o600);
    for sidecar in ["berth.db-wal", "berth.db-shm"] {
        let sidecar = dir.path().join(sidecar);
        assert!(sidecar.exists(), "WAL mode keeps {}", sidecar.display());
        assert_eq!(mode(&sidecar), 0o600, "{}", sidecar.display());
    }
    drop(store);

    // A database left readable by others is tightened when opened.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = open(&path);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(store.provider("p1").await.unwrap(), Some(provider("p1")));
}

#[tokio::test]
async fn reopening_keeps_every_write_and_migrates_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let mut a = sandbox("sb-a", "alpha");
    std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
    std::sync::Arc::make_mut(&mut a.spec).labels.insert("team".into(), "a".into());
    let b = sandbox("sb-b", "beta");
    let store = open(&path);
    store
        .commit(&[
            Write::CreateSandbox(a.clone()),
            Write::CreateSandbox(b.clone()),
            Write::CreateProvider(provider("p1")),
        ])
        .await
        .unwrap();
    let version = user_version(&path);
    assert!(version >= 1, "migrations ran: user_version {version}");
    drop(store);

    for _restart in 0..2 {
        let store = open(&path);
        assert_eq!(user_version(&path), version);
        assert_eq!(store.sandbox(&SandboxId::new("sb-a")).await.unwrap(), Some(a.clone()));
        assert_eq!(store.sandbox_by_name("beta").await.unwrap(), Some(b.clone()));
        assert_eq!(store.provider("p1").await.unwrap(), Some(provider("p1")));
        // The index tables survive too.
        assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![a.clone()]);
        let page = store.list_sandboxes(&PageRequest { after: None, limit: 10 }, &selector(&[("team", "a")])).await;
        assert_eq!(page.unwrap().items, vec![a.clone()]);
        // Conditions still hold against what was stored before the restart.
        assert!(matches!(
            store.commit(&[Write::CreateSandbox(sandbox("sb-c", "alpha"))]).await,
            Err(CommitError::Conflict(c)) if c.key == Key::Sandbox(SandboxId::new("sb-a"))
        ));
    }
}

#[tokio::test]
async fn version_column_is_the_records_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let store = open(&path);
    let a = sandbox("sb-a", "alpha");
    let (write, a2) = super::update(&a);
    store.commit(&[Write::CreateSandbox(a)]).await.unwrap();
    store.commit(&[write]).await.unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.query_row("SELECT version FROM sandboxes WHERE id = 'sb-a'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, 2);
    assert_eq!(store.sandbox(&SandboxId::new("sb-a")).await.unwrap(), Some(a2));
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    drop(open(&path));
    let newer = user_version(&path) + 1;
    rusqlite::Connection::open(&path).unwrap().pragma_update(None, "user_version", newer).unwrap();
    match SqliteStore::open(&path) {
        Err(StoreError::Unavailable(message)) => assert!(message.contains("newer"), "{message}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a database from a newer build was opened"),
    }
    assert_eq!(user_version(&path), newer, "the refused database is left as it was");
}

#[tokio::test]
async fn an_unopenable_path_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let result = SqliteStore::open(&dir.path().join("missing").join("berth.db"));
    assert!(matches!(result, Err(StoreError::Unavailable(_))));
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    match SqliteStore::open(&path) {
        Err(StoreError::Corrupt(message)) => assert!(message.contains("berth.db"), "{message}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a text file was opened as a database"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), vec![b'x'; 4096], "the file is left as it was");
}

#[tokio::test]
async fn damaged_records_are_reported_not_panicked_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let store = open(&path);
    let mut a = sandbox("sb-a", "alpha");
    std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
    store
        .commit(&[
            Write::CreateSandbox(a),
            Write::CreateSandbox(sandbox("sb-b", "beta")),
            Write::CreateProvider(provider("p1")),
        ])
        .await
        .unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute("UPDATE sandboxes SET record = '{\"id\": \"sb-a\", garbage' WHERE id = 'sb-a'", []).unwrap();
    // Valid JSON of the wrong shape, whose serde message would quote the secret.
    raw.execute(r#"UPDATE providers SET record = '{"name": "p1", "credentials": "hunter2"}'"#, []).unwrap();
    // A well-formed record whose version column disagrees with it.
    raw.execute("UPDATE sandboxes SET version = 9 WHERE id = 'sb-b'", []).unwrap();

    let corrupt = |result: Result<_, StoreError>, names: &[&str]| match result {
        Err(StoreError::Corrupt(message)) => {
            for name in names {
                assert!(message.contains(name), "{message:?} does not name {name}");
            }
            assert!(!message.contains("hunter2"), "{message:?} shows a secret");
        }
        other => panic!("expected a corrupt record, got {other:?}"),
    };
    corrupt(store.sandbox(&SandboxId::new("sb-a")).await.map(drop), &["sandboxes", "sb-a"]);
    corrupt(store.sandbox_by_name("alpha").await.map(drop), &["sandboxes", "sb-a"]);
    corrupt(store.sandboxes_using("p1").await.map(drop), &["sandboxes", "sb-a"]);
    corrupt(store.list_sandboxes(&PageRequest::default(), &Default::default()).await.map(drop), &["sb-a"]);
    corrupt(store.sandbox(&SandboxId::new("sb-b")).await.map(drop), &["sandboxes", "sb-b", "9"]);
    corrupt(store.provider("p1").await.map(drop), &["providers", "p1"]);
    corrupt(store.list_providers(&PageRequest::default()).await.map(drop), &["providers", "p1"]);

    // The store keeps working for what is intact.
    store.commit(&[Write::CreateSandbox(sandbox("sb-c", "gamma"))]).await.unwrap();
    assert_eq!(store.sandbox(&SandboxId::new("sb-c")).await.unwrap(), Some(sandbox("sb-c", "gamma")));
}

#[tokio::test]
async fn the_identity_is_the_databases_own_and_made_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let identity = open(&path).identity().to_string();
    assert_eq!(identity.len(), 32, "{identity}");
    assert_eq!(open(&path).identity(), identity, "reopened");
    let (a, b) = (open(&path), open(&path));
    assert_eq!((a.identity(), b.identity()), (identity.as_str(), identity.as_str()), "two connections");
    assert_ne!(open(&dir.path().join("other.db")).identity(), identity, "another database");
}

#[tokio::test]
async fn a_database_from_before_identities_gets_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    open(&path).commit(&[Write::CreateSandbox(sandbox("sb-a", "alpha"))]).await.unwrap();
    let current = user_version(&path);
    // Schema version 2 had neither identities (migration 3), execs (migration 4), templates
    // (migration 5), a change log (migration 6), snapshots (migration 7), volumes (migration 8),
    // nodes (migration 9) nor placements (migration 11).
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "DROP TABLE store_identity; DROP TABLE execs; DROP TABLE templates; \
         DROP TABLE sandbox_changes; DROP TABLE change_log; DROP TABLE snapshots; DROP TABLE volumes; DROP TABLE nodes; \
         DROP TABLE sandbox_placements; \
         DELETE FROM sqlite_sequence",
    )
    .unwrap();
    raw.pragma_update(None, "user_version", 2).unwrap();
    drop(raw);
    let store = open(&path);
    assert_eq!(user_version(&path), current);
    assert_eq!(store.identity().len(), 32);
    assert!(store.sandbox(&SandboxId::new("sb-a")).await.unwrap().is_some());
    assert_eq!(open(&path).identity(), store.identity());
    // The log starts with the migration: the sandbox made before it is in the listings, not
    // in the log, and the next write is its first entry.
    let listing = store.list_sandboxes_at(&PageRequest { after: None, limit: 10 }, &selector(&[])).await.unwrap();
    assert_eq!((listing.page.items.len(), listing.cursor), (1, 0));
    store.commit(&[Write::CreateSandbox(sandbox("sb-b", "beta"))]).await.unwrap();
    let log = store.changes(0, 10).await.unwrap();
    assert_eq!(log.entries.iter().map(|e| (e.seq, &*e.sandbox.name)).collect::<Vec<_>>(), [(1, "beta")]);
}

#[tokio::test]
async fn a_locked_database_is_unavailable_not_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let store = open(&path);
    store.commit(&[Write::CreateSandbox(sandbox("sb-a", "alpha"))]).await.unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    let result = store.commit(&[Write::CreateSandbox(sandbox("sb-b", "beta"))]).await;
    assert!(matches!(result, Err(CommitError::Store(StoreError::Unavailable(_)))), "{result:?}");
    // WAL readers are not blocked by the writer.
    assert!(store.sandbox(&SandboxId::new("sb-a")).await.unwrap().is_some());
    raw.execute_batch("ROLLBACK").unwrap();
    store.commit(&[Write::CreateSandbox(sandbox("sb-b", "beta"))]).await.unwrap();
}
