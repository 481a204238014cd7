//! How the SQL stores keep records: each whole, as JSON, next to the columns they query by (key,
//! name, version). SQLite and PostgreSQL share these rules, so a record reads back the same from
//! either, and a damaged row is reported the same way.

use berth_core::exec::Exec;
use berth_core::template::Template;
use berth_core::{Provider, Sandbox};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Page, StoreError};

/// What the store needs to know of a record kept as JSON.
pub(super) trait Record: Serialize + DeserializeOwned {
    const TABLE: &'static str;
    /// The primary key: the sandbox id, the provider name.
    fn key(&self) -> &str;
    /// What pages are ordered by.
    fn name(&self) -> &str;
    fn version(&self) -> u64;
}

impl Record for Sandbox {
    const TABLE: &'static str = "sandboxes";
    fn key(&self) -> &str {
        self.id.as_str()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> u64 {
        self.resource_version
    }
}

impl Record for Provider {
    const TABLE: &'static str = "providers";
    fn key(&self) -> &str {
        &self.name
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> u64 {
        self.resource_version
    }
}

impl Record for Template {
    const TABLE: &'static str = "templates";
    fn key(&self) -> &str {
        &self.name
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> u64 {
        self.resource_version
    }
}

impl Record for Exec {
    const TABLE: &'static str = "execs";
    /// Within its sandbox: rows are always read by sandbox.
    fn key(&self) -> &str {
        self.id.as_str()
    }
    fn name(&self) -> &str {
        self.id.as_str()
    }
    fn version(&self) -> u64 {
        self.resource_version
    }
}

/// A corrupt-row error naming the table and key, never the row's contents.
pub(super) fn corrupt<T: Record>(key: &str, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{} {key:?}: {what}", T::TABLE))
}

/// Decodes a row's `(key, version, record)` columns. The columns must agree with the record:
/// conditions are checked against the version column, so a disagreement would make them lie.
pub(super) fn decode<T: Record>(key: &str, version: i64, json: &str) -> Result<T, StoreError> {
    let version = from_sql_version::<T>(key, version)?;
    // Only where decoding failed, never serde's message: it may quote the record's contents,
    // and those include provider credentials.
    let record: T = serde_json::from_str(json).map_err(|e| {
        corrupt::<T>(
            key,
            format!("record does not decode ({:?} error at line {}, column {})", e.classify(), e.line(), e.column()),
        )
    })?;
    if record.key() != key {
        return Err(corrupt::<T>(key, format!("record is keyed {:?}", record.key())));
    }
    if record.version() != version {
        return Err(corrupt::<T>(key, format!("version column {version} but record version {}", record.version())));
    }
    Ok(record)
}

pub(super) fn encode<T: Record>(record: &T) -> Result<String, StoreError> {
    // Nothing in a record can fail to serialize (every map is keyed by strings); kept an error
    // rather than a panic all the same, without serde's message, which could quote a secret.
    serde_json::to_string(record)
        .map_err(|_| StoreError::Unavailable(format!("{} {:?}: record cannot be encoded", T::TABLE, record.key())))
}

// Versions are u64 in records and a signed 64-bit integer in SQL.
pub(super) fn to_sql_version(version: u64) -> Result<i64, StoreError> {
    i64::try_from(version)
        .map_err(|_| StoreError::Unavailable(format!("version {version} exceeds what the store can hold")))
}

pub(super) fn from_sql_version<T: Record>(key: &str, version: i64) -> Result<u64, StoreError> {
    u64::try_from(version).map_err(|_| corrupt::<T>(key, format!("negative version {version}")))
}

/// The SQL row limit for a page of `limit`: one row more, to learn whether another page follows.
pub(super) fn row_limit(limit: usize) -> i64 {
    i64::try_from(limit.max(1).saturating_add(1)).unwrap_or(i64::MAX)
}

/// The page of `rows`, fetched with [`row_limit`]`(limit)`.
pub(super) fn page<T: Record>(mut rows: Vec<T>, limit: usize) -> Page<T> {
    let limit = limit.max(1);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.name().to_owned())
    } else {
        None
    };
    Page { items: rows, next }
}
