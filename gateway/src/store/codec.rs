//! How the SQL stores keep records: each whole, as JSON, next to the columns they query by (key,
//! name, version). SQLite and PostgreSQL share these rules, so a record reads back the same from
//! either, and a damaged row is reported the same way.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use berth_core::exec::Exec;
use berth_core::template::Template;
use berth_core::{NodeId, Provider, Sandbox, Snapshot, Volume};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Lease, Node, NodeOffer, Page, StoreError};

/// What the store needs to know of a record kept as JSON.
pub(super) trait Record: Serialize + DeserializeOwned + Clone {
    const TABLE: &'static str;
    /// The primary key: the sandbox id, the provider name.
    fn key(&self) -> &str;
    /// What pages are ordered by.
    fn name(&self) -> &str;
    fn version(&self) -> u64;
    /// Where `decoded` keeps records of this kind, each with its JSON, if it keeps them.
    fn kept(_decoded: &Decoded) -> Option<&Mutex<HashMap<String, (String, Self)>>> {
        None
    }
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
    fn kept(decoded: &Decoded) -> Option<&Mutex<HashMap<String, (String, Self)>>> {
        Some(&decoded.sandboxes)
    }
}

/// A record keyed by its name, in `table`.
macro_rules! named_record {
    ($($record:ty => $table:literal),*) => {
        $(
            impl Record for $record {
                const TABLE: &'static str = $table;
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
        )*
    };
}

named_record!(Provider => "providers", Template => "templates", Snapshot => "snapshots", Volume => "volumes");

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

/// A node's offer as its row keeps it.
pub(super) fn offer_json(offer: &NodeOffer) -> String {
    serde_json::to_string(offer).expect("an offer's strings and numbers always make JSON")
}

/// The columns of a node's row (`id, holder, epoch, live, draining, offer`) as a [`Node`].
pub(super) fn node(
    id: String,
    holder: Option<String>,
    epoch: i64,
    live: bool,
    draining: bool,
    offer: &str,
) -> Result<Node, StoreError> {
    let broken = |what: String| StoreError::Corrupt(format!("nodes {id:?}: {what}"));
    let term = u64::try_from(epoch).map_err(|_| broken(format!("a negative epoch {epoch}")))?;
    let offer = serde_json::from_str(offer).map_err(|e| broken(format!("its offer: {e}")))?;
    Ok(Node { id: NodeId::new(id), offer, draining, lease: Lease { holder, term }, live })
}

/// The sandboxes a store last decoded, by id, each with the JSON it was decoded from. A row
/// whose version column and JSON are the ones decoded before decodes to the same record, so it is
/// handed out again: a comparison of the bytes and a few reference counts (the spec and providers
/// are shared), where decoding costs about a microsecond and a dozen allocations, most of a
/// ListSandboxes' work. Whatever the writers do (a sandbox deleted and made again under its id,
/// a row rewritten in place), a row that differs in any byte is decoded. Sandboxes deleted, here
/// or by another gateway, stay until the map is full; then it starts again empty, so it holds at
/// most [`DECODED_KEPT`].
#[derive(Default)]
pub(super) struct Decoded {
    sandboxes: Mutex<HashMap<String, (String, Sandbox)>>,
}

/// How many records [`Decoded`] holds at most: a few megabytes.
const DECODED_KEPT: usize = 4_096;

impl Decoded {
    /// Decodes a row's `(key, version, record)` columns. The columns must agree with the
    /// record: conditions are checked against the version column, so a disagreement would make
    /// them lie.
    pub(super) fn decode<T: Record>(&self, key: &str, version: i64, json: &str) -> Result<T, StoreError> {
        let version = from_sql_version::<T>(key, version)?;
        let kept = T::kept(self).map(|kept| kept.lock().unwrap_or_else(PoisonError::into_inner));
        let hit =
            kept.as_ref().and_then(|kept| kept.get(key)).filter(|(from, r)| r.version() == version && from == json);
        if let Some((_, record)) = hit {
            return Ok(record.clone());
        }
        // Decoded without the lock, which other readers' hits need.
        drop(kept);
        let record = decode::<T>(key, version, json)?;
        if let Some(kept) = T::kept(self) {
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.len() >= DECODED_KEPT && !kept.contains_key(key) {
                kept.clear();
            }
            kept.insert(key.to_owned(), (json.to_owned(), record.clone()));
        }
        Ok(record)
    }
}

fn decode<T: Record>(key: &str, version: u64, json: &str) -> Result<T, StoreError> {
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

#[cfg(test)]
mod tests {
    use berth_core::Timestamp;

    use super::*;
    use crate::engine::tests::ready_sandbox;

    fn json(record: &impl Serialize) -> String {
        serde_json::to_string(record).unwrap()
    }

    #[test]
    fn a_row_is_decoded_again_unless_its_version_and_json_are_the_ones_decoded_before() {
        let decoded = Decoded::default();
        let first = ready_sandbox("a");
        let key = first.id.to_string();
        assert_eq!(decoded.decode::<Sandbox>(&key, 1, &json(&first)).unwrap(), first);
        assert_eq!(decoded.decode::<Sandbox>(&key, 1, &json(&first)).unwrap(), first);
        // Deleted and made again under its id, at version 1 again: the row is new.
        let mut again = first.clone();
        again.phase = berth_core::Phase::Provisioning;
        assert_eq!(decoded.decode::<Sandbox>(&key, 1, &json(&again)).unwrap(), again);
        let mut second = again.clone();
        second.resource_version = 2;
        second.updated_at = Timestamp(2);
        assert_eq!(decoded.decode::<Sandbox>(&key, 2, &json(&second)).unwrap(), second);
        // A version column the record disagrees with, or a damaged row, is still refused.
        assert!(matches!(decoded.decode::<Sandbox>(&key, 3, &json(&second)), Err(StoreError::Corrupt(_))));
        assert!(matches!(decoded.decode::<Sandbox>(&key, 2, "{"), Err(StoreError::Corrupt(_))));
        assert_eq!(decoded.decode::<Sandbox>(&key, 2, &json(&second)).unwrap(), second);
    }

    #[test]
    fn records_other_than_sandboxes_are_decoded_every_time() {
        let decoded = Decoded::default();
        let provider = Provider {
            name: "p".into(),
            kind: "test".into(),
            credentials: Default::default(),
            endpoints: Default::default(),
            resource_version: 1,
            created_at: Timestamp(1),
            updated_at: Timestamp(1),
        };
        assert_eq!(decoded.decode::<Provider>("p", 1, &json(&provider)).unwrap(), provider);
        assert!(matches!(decoded.decode::<Provider>("p", 1, "{"), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn it_holds_at_most_its_bound_and_always_the_newest() {
        let decoded = Decoded::default();
        for i in 0..=DECODED_KEPT {
            let mut s = ready_sandbox("a");
            s.id = berth_core::SandboxId::new(format!("sb-{i}"));
            decoded.decode::<Sandbox>(s.id.as_str(), 1, &json(&s)).unwrap();
        }
        let kept = decoded.sandboxes.lock().unwrap();
        assert!(kept.len() <= DECODED_KEPT, "{} kept", kept.len());
        assert!(kept.contains_key(&format!("sb-{DECODED_KEPT}")));
    }
}
