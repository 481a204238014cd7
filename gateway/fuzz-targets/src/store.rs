//! The store's conditional writes on SQLite, in arbitrary interleavings of writers that read at
//! different times: the store must agree with a model at every step (a write applies exactly
//! when its condition holds), versions never go back, and no acknowledged write is lost.

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use berth_core::{Key, Sandbox, SandboxId, SandboxSpec, Timestamp, Write};
use berth_gateway::store::sqlite::SqliteStore;
use berth_gateway::store::{CommitError, Store};

#[derive(Arbitrary, Debug)]
enum Op {
    /// A writer reads a record (remembering its version).
    Read {
        writer: u8,
        record: u8,
    },
    /// A writer updates the record it last read, at the version it read.
    Update {
        writer: u8,
    },
    /// A writer removes the record it last read.
    Remove {
        writer: u8,
    },
    Create {
        record: u8,
        name: u8,
    },
    /// Two writers' updates in one transaction.
    Both {
        first: u8,
        second: u8,
    },
}

fn sandbox(record: u8, name: u8, version: u64) -> Sandbox {
    let spec = SandboxSpec { image: "i".into(), command: vec!["c".into()], ..Default::default() };
    Sandbox {
        resource_version: version,
        exit_fence: Default::default(),
        ..Sandbox::new(SandboxId::new(format!("sb-{record}")), &format!("n{name}"), spec, Timestamp::default())
    }
}

/// One runtime for the process: its blocking pool (SQLite's calls) outlives single inputs.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap())
}

/// One database for the process (opening one per input would dominate), on tmpfs if there is one.
fn store() -> &'static SqliteStore {
    static STORE: std::sync::OnceLock<(tempfile::TempDir, SqliteStore)> = std::sync::OnceLock::new();
    &STORE
        .get_or_init(|| {
            let shm = std::path::Path::new("/dev/shm");
            let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
            let store = SqliteStore::open(&dir.path().join("fuzz.db")).unwrap();
            (dir, store)
        })
        .1
}

/// The target's entry, for libFuzzer and the corpus replay alike.
pub fn fuzz(data: &[u8]) {
    crate::run(data, check);
}

fn check(ops: Vec<Op>) {
    let runtime = runtime();
    let store = store();
    // The model: what must be stored, by id.
    let mut model: BTreeMap<SandboxId, Sandbox> = BTreeMap::new();
    let mut seen: BTreeMap<SandboxId, u64> = BTreeMap::new();
    let mut reads: BTreeMap<u8, Sandbox> = BTreeMap::new();
    runtime.block_on(async {
        // Every input starts from an empty store, so a crash reproduces from its input alone.
        for i in 0..4u8 {
            let id = SandboxId::new(format!("sb-{i}"));
            if let Some(s) = store.sandbox(&id).await.unwrap() {
                store.commit(&[Write::RemoveSandbox { id, expected: s.resource_version }]).await.unwrap();
            }
        }
        for op in ops.iter().take(64) {
            let writes: Vec<Write> = match op {
                Op::Read { writer, record } => {
                    let id = SandboxId::new(format!("sb-{}", record % 4));
                    if let Some(s) = store.sandbox(&id).await.unwrap() {
                        reads.insert(writer % 4, s);
                    }
                    continue;
                }
                Op::Update { writer } | Op::Remove { writer } => {
                    let Some(read) = reads.get(&(writer % 4)) else { continue };
                    if matches!(op, Op::Update { .. }) {
                        let mut next = read.clone();
                        next.resource_version += 1;
                        let version = next.resource_version.to_string();
                        std::sync::Arc::make_mut(&mut next.spec).labels.insert(format!("w{writer}"), version);
                        vec![Write::UpdateSandbox { record: next, expected: read.resource_version }]
                    } else {
                        vec![Write::RemoveSandbox { id: read.id.clone(), expected: read.resource_version }]
                    }
                }
                Op::Create { record, name } => vec![Write::CreateSandbox(sandbox(record % 4, name % 3, 1))],
                Op::Both { first, second } => {
                    let (Some(a), Some(b)) = (reads.get(&(first % 4)), reads.get(&(second % 4))) else { continue };
                    if a.id == b.id {
                        continue;
                    }
                    [a, b]
                        .iter()
                        .map(|r| {
                            let mut next = (*r).clone();
                            next.resource_version += 1;
                            Write::UpdateSandbox { record: next, expected: r.resource_version }
                        })
                        .collect()
                }
            };
            // What the model says: every condition holds, or nothing applies.
            let holds = writes.iter().all(|w| {
                let current = match w.key() {
                    Key::Sandbox(id) => model.get(&id).map(|s| s.resource_version),
                    Key::Provider(_)
                    | Key::Exec(..)
                    | Key::Template(_)
                    | Key::Snapshot(_)
                    | Key::Volume(_)
                    | Key::Clock => None,
                };
                let name_free = match w {
                    Write::CreateSandbox(s) => !model.values().any(|m| m.name == s.name),
                    _ => true,
                };
                current == w.expected() && name_free
            });
            let result = store.commit(&writes).await;
            match (&result, holds) {
                (Ok(()), true) => {
                    for w in &writes {
                        match w {
                            Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => {
                                model.insert(s.id.clone(), s.clone());
                            }
                            Write::RemoveSandbox { id, .. } => {
                                model.remove(id);
                            }
                            _ => {}
                        }
                    }
                }
                (Err(CommitError::Conflict(_)), false) => {}
                other => panic!("the store and the model disagree on {writes:?}: {other:?}"),
            }
            // The whole store equals the model; versions never go back while a record lives.
            for i in 0..4u8 {
                let id = SandboxId::new(format!("sb-{i}"));
                let stored = store.sandbox(&id).await.unwrap();
                assert_eq!(stored.as_ref(), model.get(&id), "{id}");
                match stored {
                    Some(s) => {
                        let highest = seen.entry(id).or_insert(0);
                        assert!(s.resource_version >= *highest);
                        *highest = s.resource_version;
                    }
                    None => {
                        seen.remove(&id);
                    }
                }
            }
        }
    });
}
