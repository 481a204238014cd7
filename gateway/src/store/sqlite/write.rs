//! Conditional writes: each condition checked against the state before it, then applied as
//! conditional statements, and the change log they keep; a group of commits in one
//! transaction, each in a savepoint only when one fails to apply.

use berth_core::exec::Exec;
use berth_core::template::Template;
use berth_core::{Conflict, Key, Provider, Sandbox, SandboxId, Snapshot, Volume, Write};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::store::codec::{Record, encode, from_sql_version, to_sql_version};
use crate::store::{CommitError, StoreError};

use super::HEAD;

pub(super) fn version_of(tx: &Connection, key: &Key) -> Result<Option<u64>, StoreError> {
    let read = |sql: &str, key: &str| -> Result<Option<i64>, StoreError> {
        Ok(tx.prepare_cached(sql)?.query_row([key], |row| row.get(0)).optional()?)
    };
    match key {
        Key::Sandbox(id) => read("SELECT version FROM sandboxes WHERE id = ?1", id.as_str())?
            .map(|v| from_sql_version::<Sandbox>(id.as_str(), v))
            .transpose(),
        Key::Provider(name) => read("SELECT version FROM providers WHERE name = ?1", name)?
            .map(|v| from_sql_version::<Provider>(name, v))
            .transpose(),
        Key::Template(name) => read("SELECT version FROM templates WHERE name = ?1", name)?
            .map(|v| from_sql_version::<Template>(name, v))
            .transpose(),
        Key::Snapshot(name) => read("SELECT version FROM snapshots WHERE name = ?1", name)?
            .map(|v| from_sql_version::<Snapshot>(name, v))
            .transpose(),
        Key::Volume(name) => read("SELECT version FROM volumes WHERE name = ?1", name)?
            .map(|v| from_sql_version::<Volume>(name, v))
            .transpose(),
        Key::Exec(sandbox, id) => tx
            .prepare_cached("SELECT version FROM execs WHERE sandbox_id = ?1 AND id = ?2")?
            .query_row([sandbox.as_str(), id.as_str()], |row| row.get(0))
            .optional()?
            .map(|v| from_sql_version::<Exec>(id.as_str(), v))
            .transpose(),
        // A condition on the clock, which `check` asks of the clock.
        Key::Clock => Ok(None),
    }
}

/// The sandbox holding `name`, as the conflict a create of that name reports.
pub(super) fn name_conflict(tx: &Connection, name: &str) -> Result<Option<Conflict>, StoreError> {
    let holder: Option<(String, i64)> = tx
        .prepare_cached("SELECT id, version FROM sandboxes WHERE name = ?1")?
        .query_row([name], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    holder
        .map(|(id, version)| {
            let current = Some(from_sql_version::<Sandbox>(&id, version)?);
            Ok(Conflict { key: Key::Sandbox(SandboxId::new(id)), expected: None, current })
        })
        .transpose()
}

/// The write's condition against the state before the transaction, as memory.rs checks it.
pub(super) fn check(tx: &Connection, write: &Write) -> Result<Option<Conflict>, StoreError> {
    // The database is a file on this host: its clock is the host's.
    if let Write::NotBefore(_) = write {
        return Ok(crate::store::clock_reached(write, crate::clock::Clock::now(&crate::clock::SystemClock)));
    }
    let key = write.key();
    let current = version_of(tx, &key)?;
    if current != write.expected() {
        return Ok(Some(Conflict { key, expected: write.expected(), current }));
    }
    match write {
        Write::CreateSandbox(s) => name_conflict(tx, &s.name),
        _ => Ok(None),
    }
}

/// Applies one write whose condition was checked; a conflict here can only come from an earlier
/// write of the same transaction (the same record written twice, or two sandboxes given one name).
pub(super) fn apply(tx: &Connection, write: &Write) -> Result<Option<Conflict>, StoreError> {
    let changed = match write {
        Write::CreateSandbox(s) => {
            let json = encode(s)?;
            let version = to_sql_version(s.resource_version)?;
            let changed = tx
                .prepare_cached(
                    "INSERT INTO sandboxes (id, name, version, record) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                )?
                .execute(params![s.id.as_str(), s.name, version, json])?;
            log_change(tx, changed, s.id.as_str(), version, false, &json)?
        }
        // OR IGNORE turns a rename onto a taken name into "no row changed", explained below.
        Write::UpdateSandbox { record: s, expected } => {
            let json = encode(s)?;
            let version = to_sql_version(s.resource_version)?;
            let changed = tx
                .prepare_cached(
                    "UPDATE OR IGNORE sandboxes SET name = ?2, version = ?3, record = ?4 WHERE id = ?1 AND version = ?5",
                )?
                .execute(params![s.id.as_str(), s.name, version, json, to_sql_version(*expected)?])?;
            log_change(tx, changed, s.id.as_str(), version, false, &json)?
        }
        Write::RemoveSandbox { id, expected } => {
            let version = to_sql_version(*expected)?;
            let gone: Option<String> = tx
                .prepare_cached("DELETE FROM sandboxes WHERE id = ?1 AND version = ?2 RETURNING record")?
                .query_row(params![id.as_str(), version], |row| row.get(0))
                .optional()?;
            match gone {
                Some(json) => log_change(tx, 1, id.as_str(), version, true, &json)?,
                None => 0,
            }
        }
        Write::CreateProvider(p) => insert_named(tx, p)?,
        Write::UpdateProvider { record: p, expected } => update_named(tx, p, *expected)?,
        Write::RemoveProvider { name, expected } => remove_named::<Provider>(tx, name, *expected)?,
        Write::CreateTemplate(t) => insert_named(tx, t)?,
        Write::UpdateTemplate { record: t, expected } => update_named(tx, t, *expected)?,
        Write::RemoveTemplate { name, expected } => remove_named::<Template>(tx, name, *expected)?,
        Write::CreateSnapshot(s) => insert_named(tx, s)?,
        Write::UpdateSnapshot { record: s, expected } => update_named(tx, s, *expected)?,
        Write::RemoveSnapshot { name, expected } => remove_named::<Snapshot>(tx, name, *expected)?,
        Write::CreateVolume(v) => insert_named(tx, v)?,
        Write::UpdateVolume { record: v, expected } => update_named(tx, v, *expected)?,
        Write::RemoveVolume { name, expected } => remove_named::<Volume>(tx, name, *expected)?,
        // The write lock, held since the checks, keeps the sandbox as it was checked.
        Write::CheckSandbox { .. } | Write::NotBefore(_) => 1,
        Write::CreateExec(e) => tx
            .prepare_cached(
                "INSERT INTO execs (sandbox_id, id, version, open, record) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                e.sandbox.as_str(),
                e.id.as_str(),
                to_sql_version(e.resource_version)?,
                !e.state.is_terminal(),
                encode(e)?
            ])?,
        Write::UpdateExec { record: e, expected } => tx
            .prepare_cached(
                "UPDATE execs SET version = ?3, open = ?4, record = ?5 WHERE sandbox_id = ?1 AND id = ?2 AND version = ?6",
            )?
            .execute(params![
                e.sandbox.as_str(),
                e.id.as_str(),
                to_sql_version(e.resource_version)?,
                !e.state.is_terminal(),
                encode(e)?,
                to_sql_version(*expected)?
            ])?,
    };
    if changed == 0 {
        return explain(tx, write).map(Some);
    }
    if let Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } = write {
        index(tx, s)?;
    }
    Ok(None)
}

/// Logs a sandbox write that `changed` a row, in its transaction: the change log is exactly the
/// writes committed. Returns `changed`.
pub(super) fn log_change(
    tx: &Connection,
    changed: usize,
    id: &str,
    version: i64,
    removed: bool,
    json: &str,
) -> Result<usize, StoreError> {
    if changed > 0 {
        tx.prepare_cached(
            "INSERT INTO sandbox_changes (sandbox_id, version, removed, record) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![id, version, removed, json])?;
    }
    Ok(changed)
}

/// Drops the entries older than the newest `keep`, in steps of an eighth of it, so that most
/// groups delete nothing.
pub(super) fn trim(tx: &Connection, keep: u64) -> Result<(), StoreError> {
    let head = sql_position(tx.query_row(HEAD, [], |row| row.get(0))?)?;
    let trimmed = trimmed_through(tx)?;
    if head.saturating_sub(trimmed) <= keep + keep / 8 {
        return Ok(());
    }
    let through = to_sql_position(head - keep)?;
    tx.prepare_cached("DELETE FROM sandbox_changes WHERE seq <= ?1")?.execute([through])?;
    tx.prepare_cached("UPDATE change_log SET trimmed_through = ?1")?.execute([through])?;
    Ok(())
}

pub(super) fn trimmed_through(conn: &Connection) -> Result<u64, StoreError> {
    sql_position(conn.prepare_cached("SELECT trimmed_through FROM change_log")?.query_row([], |row| row.get(0))?)
}

pub(super) fn sql_position(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("the change log holds a negative position {n}")))
}

pub(super) fn to_sql_position(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Unavailable(format!("change log position {n} is past SQLite's range")))
}

// The tables of records keyed by their name (providers, templates): one shape, one set of
// statements.

pub(super) fn insert_named<T: Record>(tx: &Connection, record: &T) -> Result<usize, StoreError> {
    let sql = format!("INSERT INTO {} (name, version, record) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING", T::TABLE);
    Ok(tx.prepare_cached(&sql)?.execute(params![record.key(), to_sql_version(record.version())?, encode(record)?])?)
}

pub(super) fn update_named<T: Record>(tx: &Connection, record: &T, expected: u64) -> Result<usize, StoreError> {
    let sql = format!("UPDATE {} SET version = ?2, record = ?3 WHERE name = ?1 AND version = ?4", T::TABLE);
    Ok(tx.prepare_cached(&sql)?.execute(params![
        record.key(),
        to_sql_version(record.version())?,
        encode(record)?,
        to_sql_version(expected)?
    ])?)
}

pub(super) fn remove_named<T: Record>(tx: &Connection, name: &str, expected: u64) -> Result<usize, StoreError> {
    let sql = format!("DELETE FROM {} WHERE name = ?1 AND version = ?2", T::TABLE);
    Ok(tx.prepare_cached(&sql)?.execute(params![name, to_sql_version(expected)?])?)
}

/// Why a conditional statement changed no row.
pub(super) fn explain(tx: &Connection, write: &Write) -> Result<Conflict, StoreError> {
    let key = write.key();
    let current = version_of(tx, &key)?;
    if current != write.expected() {
        return Ok(Conflict { key, expected: write.expected(), current });
    }
    // The version held, so only the name's uniqueness can have refused the row.
    if let Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } = write
        && let Some(conflict) = name_conflict(tx, &s.name)?
        && conflict.key != key
    {
        return Ok(conflict);
    }
    Err(StoreError::Unavailable(format!("a write to {key:?} changed no row although its condition held")))
}

/// Brings the sandbox's rows in the index tables in line with its record.
pub(super) fn index(tx: &Connection, s: &Sandbox) -> Result<(), StoreError> {
    let id = s.id.as_str();
    tx.prepare_cached("DELETE FROM sandbox_providers WHERE sandbox_id = ?1")?.execute([id])?;
    tx.prepare_cached("DELETE FROM sandbox_labels WHERE sandbox_id = ?1")?.execute([id])?;
    let mut insert = tx.prepare_cached("INSERT INTO sandbox_providers (sandbox_id, provider) VALUES (?1, ?2)")?;
    for provider in s.providers.iter() {
        insert.execute([id, provider])?;
    }
    let mut insert = tx.prepare_cached("INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?1, ?2, ?3)")?;
    for (key, value) in &s.spec.labels {
        insert.execute([id, key, value])?;
    }
    tx.prepare_cached("DELETE FROM sandbox_placements WHERE sandbox_id = ?1")?.execute([id])?;
    if let Some(r) = super::super::Reservation::of(s)? {
        tx.prepare_cached(
            "INSERT INTO sandbox_placements (sandbox_id, node, cpu_millis, memory_bytes) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(rusqlite::params![id, r.node, r.cpu_millis, r.memory_bytes])?;
    }
    Ok(())
}

/// The first of a commit's writes whose condition fails on the state before them, if any.
pub(super) fn first_conflict(conn: &Connection, writes: &[Write]) -> Result<Option<Conflict>, StoreError> {
    for write in writes {
        if let Some(conflict) = check(conn, write)? {
            return Ok(Some(conflict));
        }
    }
    Ok(None)
}

/// Applies a commit's checked writes, stopping at the first that conflicts with the commit's
/// own earlier ones (see `apply`).
pub(super) fn apply_all(conn: &Connection, writes: &[Write]) -> Result<Option<Conflict>, StoreError> {
    for write in writes {
        if let Some(conflict) = apply(conn, write)? {
            return Ok(Some(conflict));
        }
    }
    Ok(None)
}

/// One commit's writes, all or none, on the state before them.
pub(super) fn commit(conn: &Connection, writes: &[Write]) -> Result<(), CommitError> {
    let conflict = match first_conflict(conn, writes)? {
        Some(conflict) => Some(conflict),
        None => apply_all(conn, writes)?,
    };
    conflict.map_or(Ok(()), |c| Err(CommitError::Conflict(c)))
}

/// A group of commits in one transaction: the outcome of each, once the transaction holding
/// those that applied is durable. An error of the transaction itself is every commit's.
///
/// Each commit's checks read the state the group's earlier commits left, and checks write
/// nothing, so a commit refused by them needs nothing undone; one that passes them fails to
/// apply only against its own writes (one name given twice, a rename onto a taken name) or on an
/// error. So the group is first committed without savepoints, which cost the writer more than
/// the checks do, and only a group in which a checked commit failed to apply is rolled back and
/// redone with a savepoint per commit, so that commit's writes roll back alone.
pub(super) fn commit_group(
    conn: &mut Connection,
    group: &[Vec<Write>],
    keep: u64,
) -> Result<Vec<Result<(), CommitError>>, StoreError> {
    match commit_group_unless_one_fails_to_apply(conn, group, keep)? {
        Some(outcomes) => Ok(outcomes),
        None => commit_group_in_savepoints(conn, group, keep),
    }
}

/// The group's outcomes, or `None` (and nothing written) if a commit that passed its checks
/// failed to apply.
pub(super) fn commit_group_unless_one_fails_to_apply(
    conn: &mut Connection,
    group: &[Vec<Write>],
    keep: u64,
) -> Result<Option<Vec<Result<(), CommitError>>>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut outcomes = Vec::with_capacity(group.len());
    for writes in group {
        let outcome = match first_conflict(&tx, writes) {
            Ok(Some(conflict)) => Err(CommitError::Conflict(conflict)),
            Err(e) => Err(CommitError::Store(e)),
            // Dropping the transaction rolls back the whole group.
            Ok(None) => match apply_all(&tx, writes) {
                Ok(None) => Ok(()),
                Ok(Some(_)) | Err(_) => return Ok(None),
            },
        };
        outcomes.push(outcome);
    }
    trim(&tx, keep)?;
    tx.commit()?;
    Ok(Some(outcomes))
}

/// The group in one transaction, each commit in its savepoint.
pub(super) fn commit_group_in_savepoints(
    conn: &mut Connection,
    group: &[Vec<Write>],
    keep: u64,
) -> Result<Vec<Result<(), CommitError>>, StoreError> {
    let mut tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut outcomes = Vec::with_capacity(group.len());
    for writes in group {
        let savepoint = tx.savepoint()?;
        let outcome = commit(&savepoint, writes);
        match outcome {
            Ok(()) => savepoint.commit()?,
            // Dropping the savepoint rolls back what this commit applied, and only that.
            Err(_) => drop(savepoint),
        }
        outcomes.push(outcome);
    }
    trim(&tx, keep)?;
    tx.commit()?;
    Ok(outcomes)
}
