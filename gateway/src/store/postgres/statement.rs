//! A commit as statements: planned in full before the first is sent, each conditional on the
//! versions and names its writes expect, and the conflict a failed one reports.

use std::borrow::Cow;
use std::sync::LazyLock;

use berth_core::exec::Exec;
use berth_core::template::Template;
use berth_core::{Conflict, Key, Provider, Sandbox, SandboxId, Snapshot, Volume, Write};
use tokio_postgres::types::ToSql;

use crate::store::codec::{Record, encode, from_sql_version, to_sql_version};
use crate::store::{Reservation, StoreError};

use super::{NAME_TAKEN, VERSION_DIFFERS};

/// An argument of a planned statement, owned: every statement is built before the first is sent.
pub(super) type Arg = Box<dyn ToSql + Sync + Send>;

/// What a statement of a transaction's plan is for: what its failure means.
#[derive(Clone, Copy)]
pub(super) enum Role {
    /// Write `i`'s condition on its record's version.
    Version(usize),
    /// A write's condition that its sandbox's name is free.
    Name,
    /// A write's conditional statement.
    Apply,
    /// Ends the plan. After a failed statement it rolls back instead.
    Commit,
}

pub(super) struct Statement {
    pub(super) sql: Cow<'static, str>,
    pub(super) args: Vec<Arg>,
    pub(super) role: Role,
}

impl Statement {
    fn new(role: Role, sql: impl Into<Cow<'static, str>>, args: Vec<Arg>) -> Self {
        Self { sql: sql.into(), args, role }
    }
}

/// A transaction's statements after its BEGIN, in the order PostgreSQL runs them: every
/// condition against the state before it (in the order of the writes, so the first that fails is
/// the one reported, as the other stores report it), then each write's statement, then COMMIT.
/// A condition that does not hold, and a write's statement that changes no row (its condition
/// stopped holding after it was checked), fail the transaction, so the COMMIT that follows rolls
/// it back: the plan is sent whole before the first answer comes back (tokio-postgres pipelines
/// the queries of one connection), and a commit costs two round trips (BEGIN, then the plan)
/// whatever its size.
pub(super) fn plan(writes: &[Write]) -> Result<Vec<Statement>, StoreError> {
    let mut plan = Vec::with_capacity(writes.len() * 3 + 1);
    for (i, write) in writes.iter().enumerate() {
        plan.push(version_check(i, write)?);
        if let Write::CreateSandbox(s) = write {
            plan.push(name_check(s));
        }
    }
    for write in writes {
        // A rename onto a name another sandbox holds is that sandbox's conflict (should one take
        // it after this read, the unique index aborts the transaction and it runs again).
        if let Write::UpdateSandbox { record: s, .. } = write {
            plan.push(name_check(s));
        }
        plan.push(apply(write)?);
    }
    plan.push(Statement::new(Role::Commit, "COMMIT", Vec::new()));
    Ok(plan)
}

/// Write `i`'s condition on its record's version: it fails the transaction when the version
/// differs from the one the write expects.
pub(super) fn version_check(i: usize, write: &Write) -> Result<Statement, StoreError> {
    let expected: Arg = Box::new(write.expected().map(to_sql_version).transpose()?);
    let (sql, args): (&'static str, Vec<Arg>) = match write.key() {
        Key::Sandbox(id) => (
            "SELECT berth_expect_version((SELECT version FROM sandboxes WHERE id = $1), $2::BIGINT)",
            vec![Box::new(id.to_string()), expected],
        ),
        Key::Provider(name) => (
            "SELECT berth_expect_version((SELECT version FROM providers WHERE name = $1), $2::BIGINT)",
            vec![Box::new(name), expected],
        ),
        Key::Template(name) => (
            "SELECT berth_expect_version((SELECT version FROM templates WHERE name = $1), $2::BIGINT)",
            vec![Box::new(name), expected],
        ),
        Key::Snapshot(name) => (
            "SELECT berth_expect_version((SELECT version FROM snapshots WHERE name = $1), $2::BIGINT)",
            vec![Box::new(name), expected],
        ),
        Key::Volume(name) => (
            "SELECT berth_expect_version((SELECT version FROM volumes WHERE name = $1), $2::BIGINT)",
            vec![Box::new(name), expected],
        ),
        Key::Exec(sandbox, id) => (
            "SELECT berth_expect_version((SELECT version FROM execs WHERE sandbox_id = $1 AND id = $2), $3::BIGINT)",
            vec![Box::new(sandbox.to_string()), Box::new(id.as_str().to_string()), expected],
        ),
        // The database's own clock, read as the statement runs: once it has reached the time
        // expected, that time is what is compared, and holds; before, the clock's reading,
        // which the conflict then reports.
        Key::Clock => (
            "SELECT berth_expect_version(LEAST((extract(epoch FROM clock_timestamp()) * 1000)::BIGINT, $1::BIGINT), $1::BIGINT)",
            vec![expected],
        ),
    };
    Ok(Statement::new(Role::Version(i), sql, args))
}

/// A write's condition that no other sandbox holds the name it gives sandbox `s`.
pub(super) fn name_check(s: &Sandbox) -> Statement {
    Statement::new(
        Role::Name,
        "SELECT berth_expect_name_free(id, version, $2) FROM sandboxes WHERE name = $1",
        vec![Box::new(s.name.to_string()), Box::new(s.id.to_string())],
    )
}

/// The conflict `error`, the first a plan's statement met, reports: a condition that did not
/// hold, what it found in its detail.
pub(super) fn conflict_in(
    role: Role,
    error: &tokio_postgres::Error,
    writes: &[Write],
) -> Result<Option<Conflict>, StoreError> {
    let Some(db) = error.as_db_error() else {
        return Ok(None);
    };
    let found = db.detail().unwrap_or_default();
    let number = |text: &str| {
        text.parse::<i64>().map_err(|_| StoreError::Corrupt(format!("a condition reported the version {text:?}")))
    };
    let conflict = match (role, db.code().code()) {
        (Role::Version(i), VERSION_DIFFERS) => {
            let key = writes[i].key();
            let current = match found {
                "" => None,
                v => Some(match &key {
                    Key::Sandbox(id) => from_sql_version::<Sandbox>(id.as_str(), number(v)?)?,
                    Key::Provider(name) => from_sql_version::<Provider>(name, number(v)?)?,
                    Key::Template(name) => from_sql_version::<Template>(name, number(v)?)?,
                    Key::Snapshot(name) => from_sql_version::<Snapshot>(name, number(v)?)?,
                    Key::Volume(name) => from_sql_version::<Volume>(name, number(v)?)?,
                    Key::Exec(_, id) => from_sql_version::<Exec>(id.as_str(), number(v)?)?,
                    Key::Clock => u64::try_from(number(v)?).unwrap_or(0),
                }),
            };
            Conflict { key, expected: writes[i].expected(), current }
        }
        (Role::Name, NAME_TAKEN) => {
            let (version, holder) = found.split_once(' ').unwrap_or((found, ""));
            let current = Some(from_sql_version::<Sandbox>(holder, number(version)?)?);
            Conflict { key: Key::Sandbox(SandboxId::new(holder)), expected: None, current }
        }
        _ => return Ok(None),
    };
    Ok(Some(conflict))
}

pub(super) fn refs(args: &[Arg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| a.as_ref() as &(dyn ToSql + Sync)).collect()
}

pub(super) fn version(v: u64) -> Result<Arg, StoreError> {
    Ok(Box::new(to_sql_version(v)?))
}

/// A write's conditional statement: it fails when it changes no row.
pub(super) fn apply(write: &Write) -> Result<Statement, StoreError> {
    // The tables of records keyed by their name (providers, templates): one shape.
    fn insert_named<T: Record>(record: &T) -> Result<Statement, StoreError> {
        let sql = expecting_rows(&format!(
            "INSERT INTO {} (name, version, record) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1",
            T::TABLE
        ));
        Ok(Statement::new(Role::Apply, sql, named_row(record, None)?))
    }
    fn update_named<T: Record>(record: &T, expected: u64) -> Result<Statement, StoreError> {
        let sql = expecting_rows(&format!(
            "UPDATE {} SET version = $2, record = $3 WHERE name = $1 AND version = $4 RETURNING 1",
            T::TABLE
        ));
        Ok(Statement::new(Role::Apply, sql, named_row(record, Some(expected))?))
    }
    fn remove_named<T: Record>(name: &str, expected: u64) -> Result<Statement, StoreError> {
        let sql = expecting_rows(&format!("DELETE FROM {} WHERE name = $1 AND version = $2 RETURNING 1", T::TABLE));
        Ok(Statement::new(Role::Apply, sql, vec![Box::new(name.to_string()), version(expected)?]))
    }
    static CREATE_SANDBOX: LazyLock<String> = LazyLock::new(|| {
        indexed(
            "INSERT INTO sandboxes (id, name, version, record, indexed) VALUES ($1, $2, $3, $4, $8) \
             ON CONFLICT DO NOTHING",
        )
    });
    static UPDATE_SANDBOX: LazyLock<String> = LazyLock::new(|| {
        indexed(
            "UPDATE sandboxes SET name = $2, version = $3, record = $4, indexed = $8 WHERE id = $1 AND version = $12",
        )
    });
    // The index tables' rows go with the sandbox's (their foreign keys cascade).
    static REMOVE_SANDBOX: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH changed AS (DELETE FROM sandboxes WHERE id = $1 AND version = $2 RETURNING id, version, record), \
             {} SELECT berth_expect_rows(count(*)) FROM entry",
            log_entry(true)
        )
    });
    // Locked until the commit: a write to the sandbox committed after the condition was read
    // makes this select no row (READ COMMITTED re-reads a locked row), and none can land after it.
    static NOTHING: LazyLock<String> = LazyLock::new(|| "SELECT 1".to_string());
    static CHECK_SANDBOX: LazyLock<String> =
        LazyLock::new(|| expecting_rows("SELECT 1 FROM sandboxes WHERE id = $1 AND version = $2 FOR SHARE"));
    static CREATE_EXEC: LazyLock<String> = LazyLock::new(|| {
        expecting_rows(
            "INSERT INTO execs (sandbox_id, id, version, open, record) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT DO NOTHING RETURNING 1",
        )
    });
    static UPDATE_EXEC: LazyLock<String> = LazyLock::new(|| {
        expecting_rows(
            "UPDATE execs SET version = $3, open = $4, record = $5 \
             WHERE sandbox_id = $1 AND id = $2 AND version = $6 RETURNING 1",
        )
    });
    let (sql, args): (&'static LazyLock<String>, Vec<Arg>) = match write {
        Write::CreateSandbox(s) => (&CREATE_SANDBOX, sandbox_row(s, None)?),
        Write::UpdateSandbox { record: s, expected } => (&UPDATE_SANDBOX, sandbox_row(s, Some(*expected))?),
        Write::RemoveSandbox { id, expected } => (&REMOVE_SANDBOX, vec![Box::new(id.to_string()), version(*expected)?]),
        Write::CreateProvider(p) => return insert_named(p),
        Write::UpdateProvider { record: p, expected } => return update_named(p, *expected),
        Write::RemoveProvider { name, expected } => return remove_named::<Provider>(name, *expected),
        Write::CreateTemplate(t) => return insert_named(t),
        Write::UpdateTemplate { record: t, expected } => return update_named(t, *expected),
        Write::RemoveTemplate { name, expected } => return remove_named::<Template>(name, *expected),
        Write::CreateSnapshot(s) => return insert_named(s),
        Write::UpdateSnapshot { record: s, expected } => return update_named(s, *expected),
        Write::RemoveSnapshot { name, expected } => return remove_named::<Snapshot>(name, *expected),
        Write::CreateVolume(v) => return insert_named(v),
        Write::UpdateVolume { record: v, expected } => return update_named(v, *expected),
        Write::RemoveVolume { name, expected } => return remove_named::<Volume>(name, *expected),
        Write::CheckSandbox { id, expected } => (&CHECK_SANDBOX, vec![Box::new(id.to_string()), version(*expected)?]),
        // A condition only, checked among the conditions.
        Write::NotBefore(_) => (&NOTHING, vec![]),
        Write::CreateExec(e) => (&CREATE_EXEC, exec_row(e, None)?),
        Write::UpdateExec { record: e, expected } => (&UPDATE_EXEC, exec_row(e, Some(*expected))?),
    };
    Ok(Statement::new(Role::Apply, sql.as_str(), args))
}

/// `sql`, a statement returning a row for each it changed, made to fail when it changes none.
pub(super) fn expecting_rows(sql: &str) -> String {
    format!("WITH changed AS ({sql}) SELECT berth_expect_rows(count(*)) FROM changed")
}

/// The change log's entry for the sandbox row the common table expression `changed` returns, as
/// one named `entry`.
pub(super) fn log_entry(removed: bool) -> String {
    format!(
        "entry AS (INSERT INTO sandbox_changes (sandbox_id, version, removed, record) \
         SELECT id, version, {removed}, record FROM changed RETURNING 1)"
    )
}

/// The statement of a sandbox write that keeps it: `change`, a conditional write of its row
/// (`$1` its id) logged in the change log, with the index tables brought in line with the
/// record (`$5`, `$6` and `$7` its providers, label keys and label values, `$9`, `$10` and
/// `$11` its [`Reservation`]'s node (null: none), CPU and memory, `$8` their `index_key`; rows
/// that stay are left alone). It fails when it changes no row, which undoes
/// all of it.
pub(super) fn indexed(change: &str) -> String {
    format!(
        "WITH changed AS ({change} RETURNING id, version, record), {}, \
         providers_gone AS (DELETE FROM sandbox_providers \
             WHERE sandbox_id = (SELECT id FROM changed) AND provider <> ALL ($5::TEXT[])), \
         providers_made AS (INSERT INTO sandbox_providers (sandbox_id, provider) \
             SELECT id, p FROM changed, UNNEST($5::TEXT[]) AS p ON CONFLICT DO NOTHING), \
         labels_gone AS (DELETE FROM sandbox_labels \
             WHERE sandbox_id = (SELECT id FROM changed) AND key <> ALL ($6::TEXT[])), \
         labels_made AS (INSERT INTO sandbox_labels (sandbox_id, key, value) \
             SELECT id, k, v FROM changed, UNNEST($6::TEXT[], $7::TEXT[]) AS l (k, v) \
             ON CONFLICT (sandbox_id, key) DO UPDATE SET value = EXCLUDED.value \
             WHERE sandbox_labels.value <> EXCLUDED.value), \
         placement_gone AS (DELETE FROM sandbox_placements \
             WHERE sandbox_id = (SELECT id FROM changed) AND $9::TEXT IS NULL), \
         placement_made AS (INSERT INTO sandbox_placements (sandbox_id, node, cpu_millis, memory_bytes) \
             SELECT id, $9::TEXT, $10::BIGINT, $11::BIGINT FROM changed WHERE $9::TEXT IS NOT NULL \
             ON CONFLICT (sandbox_id) DO UPDATE SET node = EXCLUDED.node, cpu_millis = EXCLUDED.cpu_millis, \
             memory_bytes = EXCLUDED.memory_bytes) \
         SELECT berth_expect_rows(count(*)) FROM entry",
        log_entry(false)
    )
}

// A record's row as its statements take it: its columns, then, for an update, the version it
// must have.

pub(super) fn named_row<T: Record>(record: &T, expected: Option<u64>) -> Result<Vec<Arg>, StoreError> {
    let row: Vec<Arg> = vec![Box::new(record.key().to_string()), version(record.version())?, Box::new(encode(record)?)];
    with_expected(row, expected)
}

pub(super) fn sandbox_row(s: &Sandbox, expected: Option<u64>) -> Result<Vec<Arg>, StoreError> {
    let providers: Vec<String> = s.providers.iter().cloned().collect();
    let keys: Vec<String> = s.spec.labels.keys().cloned().collect();
    let values: Vec<String> = s.spec.labels.values().cloned().collect();
    let reservation = Reservation::of(s)?;
    let mut row = sandbox_columns(s)?;
    row.extend::<[Arg; 7]>([
        Box::new(providers),
        Box::new(keys),
        Box::new(values),
        Box::new(index_key(s)?),
        Box::new(reservation.as_ref().map(|r| r.node.clone())),
        Box::new(reservation.as_ref().map_or(0, |r| r.cpu_millis)),
        Box::new(reservation.as_ref().map_or(0, |r| r.memory_bytes)),
    ]);
    with_expected(row, expected)
}

/// A sandbox row's own columns: id, name, version, record.
pub(super) fn sandbox_columns(s: &Sandbox) -> Result<Vec<Arg>, StoreError> {
    Ok(vec![
        Box::new(s.id.to_string()),
        Box::new(s.name.to_string()),
        version(s.resource_version)?,
        Box::new(encode(s)?),
    ])
}

/// What the index tables hold for sandbox `s`: its providers, labels and reservation, in a
/// canonical text (both sets are ordered).
pub(super) fn index_key(s: &Sandbox) -> Result<String, StoreError> {
    // A sandbox reserving nothing keeps the key rows had before reservations were kept.
    match Reservation::of(s)? {
        None => serde_json::to_string(&(&*s.providers, &s.spec.labels)),
        Some(r) => serde_json::to_string(&(&*s.providers, &s.spec.labels, (r.node, r.cpu_millis, r.memory_bytes))),
    }
    .map_err(|e| StoreError::Unavailable(format!("sandbox {}: cannot encode its index key: {e}", s.id)))
}

/// A lone update of a sandbox that leaves its index tables alone: it applies only if the row's
/// index key is the record's (`$6`), so the providers and labels it holds are unchanged; else it
/// changes nothing, and the commit runs again as a transaction, which brings the tables in line.
/// Most writes (every phase change) are such, and the index tables' statements are most of a
/// write's work for the server.
pub(super) fn lean_update(s: &Sandbox, expected: u64) -> Result<Statement, StoreError> {
    static LEAN: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH changed AS (UPDATE sandboxes SET name = $2, version = $3, record = $4 \
             WHERE id = $1 AND version = $5 AND indexed = $6 RETURNING id, version, record), \
             {} SELECT berth_expect_rows(count(*)) FROM entry",
            log_entry(false)
        )
    });
    let mut args = sandbox_columns(s)?;
    args.extend([version(expected)?, Box::new(index_key(s)?)]);
    Ok(Statement::new(Role::Apply, LEAN.as_str(), args))
}

pub(super) fn exec_row(e: &Exec, expected: Option<u64>) -> Result<Vec<Arg>, StoreError> {
    let row: Vec<Arg> = vec![
        Box::new(e.sandbox.to_string()),
        Box::new(e.id.as_str().to_string()),
        version(e.resource_version)?,
        Box::new(!e.state.is_terminal()),
        Box::new(encode(e)?),
    ];
    with_expected(row, expected)
}

pub(super) fn with_expected(mut row: Vec<Arg>, expected: Option<u64>) -> Result<Vec<Arg>, StoreError> {
    if let Some(expected) = expected {
        row.push(version(expected)?);
    }
    Ok(row)
}
