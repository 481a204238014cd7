//! The database file, readable by its owner alone, and its schema: the migrations that bring
//! it up to date, and the identity it is known by.

use std::fs::{OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::store::StoreError;

/// Schema migrations; applying `MIGRATIONS[i]` takes `PRAGMA user_version` from `i` to `i + 1`.
/// Append only: a released step is never edited, since databases already past it never rerun it.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sandboxes (
    id      TEXT    NOT NULL PRIMARY KEY,
    name    TEXT    NOT NULL UNIQUE,
    version INTEGER NOT NULL,
    record  TEXT    NOT NULL
) STRICT;

CREATE TABLE sandbox_providers (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    provider   TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, provider)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_providers_by_provider ON sandbox_providers (provider, sandbox_id);

CREATE TABLE sandbox_labels (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_labels_by_pair ON sandbox_labels (key, value, sandbox_id);

CREATE TABLE providers (
    name    TEXT    NOT NULL PRIMARY KEY,
    version INTEGER NOT NULL,
    record  TEXT    NOT NULL
) STRICT;
"#,
    r#"
CREATE TABLE leases (
    name       TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT,
    term       INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
"#,
    r#"
CREATE TABLE store_identity (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    id        TEXT    NOT NULL
) STRICT;
"#,
    r#"
CREATE TABLE execs (
    sandbox_id TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    id         TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    open       INTEGER NOT NULL,
    record     TEXT    NOT NULL,
    PRIMARY KEY (sandbox_id, id)
) STRICT;
CREATE INDEX execs_open ON execs (sandbox_id, id) WHERE open = 1;
"#,
    r#"
CREATE TABLE templates (
    name    TEXT    NOT NULL PRIMARY KEY,
    version INTEGER NOT NULL,
    record  TEXT    NOT NULL
) STRICT;
"#,
    // The change log. One writer commits in seq order, so seq is commit order; AUTOINCREMENT
    // never hands out a position again, even once the entries before it are trimmed.
    r#"
CREATE TABLE sandbox_changes (
    seq        INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    removed    INTEGER NOT NULL,
    record     TEXT    NOT NULL
) STRICT;
CREATE TABLE change_log (
    singleton       INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    trimmed_through INTEGER NOT NULL
) STRICT;
INSERT INTO change_log (singleton, trimmed_through) VALUES (1, 0);
"#,
    r#"
CREATE TABLE snapshots (
    name    TEXT    NOT NULL PRIMARY KEY,
    version INTEGER NOT NULL,
    record  TEXT    NOT NULL
) STRICT;
"#,
    r#"
CREATE TABLE volumes (
    name    TEXT    NOT NULL PRIMARY KEY,
    version INTEGER NOT NULL,
    record  TEXT    NOT NULL
) STRICT;
"#,
    r#"
CREATE TABLE nodes (
    id         TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    draining   INTEGER NOT NULL,
    offer      TEXT    NOT NULL
) STRICT;
"#,
    // A deleted node's row stays, marked, so that its epochs go on from where they were if it
    // registers again: an effect sent under an epoch from before the delete never matches one
    // granted after it.
    r#"
ALTER TABLE nodes ADD COLUMN removed INTEGER NOT NULL DEFAULT 0;
"#,
    // What each sandbox placed on a node reserves there (`placement::reserves`): a row per
    // sandbox that counts, summed by node when a run is placed.
    r#"
CREATE TABLE sandbox_placements (
    sandbox_id   TEXT    NOT NULL PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
    node         TEXT    NOT NULL,
    cpu_millis   INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_placements_by_node ON sandbox_placements (node, cpu_millis, memory_bytes);
"#,
];

// A handful of steps: the cast cannot truncate.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Creates `path` readable by its owner only, or tightens an existing file to that: it holds
/// provider credentials.
pub(super) fn create_private(path: &Path) -> Result<(), StoreError> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", path.display())))?;
    // The mode given at creation is reduced by the umask and ignored for an existing file.
    restrict(path, true)
}

pub(super) fn restrict(path: &Path, must_exist: bool) -> Result<(), StoreError> {
    match std::fs::set_permissions(path, Permissions::from_mode(0o600)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && !must_exist => Ok(()),
        Err(e) => Err(StoreError::Unavailable(format!("cannot restrict {} to its owner: {e}", path.display()))),
        Ok(()) => Ok(()),
    }
}

pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let found = schema_version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::Unavailable(format!(
            "database schema version {found} is newer than this build supports ({SCHEMA_VERSION}); \
             refusing to open it rather than misread it: run a newer berth-gateway"
        )));
    }
    for (to, sql) in (1..).zip(MIGRATIONS).skip_while(|(to, _)| *to <= found) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Another process may have applied this step since the version was read; the write lock
        // now held rules that out from here on.
        if schema_version(&tx)? >= to {
            continue;
        }
        tx.execute_batch(sql).map_err(|e| StoreError::Unavailable(format!("schema migration {to} failed: {e}")))?;
        tx.pragma_update(None, "user_version", to)?;
        tx.commit()?;
    }
    Ok(())
}

/// The store's identity, made by whichever process opens the database first.
pub(super) fn identify(conn: &mut Connection) -> Result<String, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "INSERT INTO store_identity (singleton, id) VALUES (1, ?1) ON CONFLICT DO NOTHING",
        [crate::store::new_identity()?],
    )?;
    let identity: String = tx.query_row("SELECT id FROM store_identity", [], |row| row.get(0))?;
    tx.commit()?;
    Ok(identity)
}

pub(super) fn schema_version(conn: &Connection) -> Result<i64, StoreError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if version < 0 {
        return Err(StoreError::Unavailable(format!("database schema version {version} is not one Berth writes")));
    }
    Ok(version)
}
