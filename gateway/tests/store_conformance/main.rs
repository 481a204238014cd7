//! One conformance suite for every `Store`: each check is written once against `dyn Store` and
//! run on the in-memory store, on SQLite and on PostgreSQL, so they cannot drift apart. SQLite's
//! own concerns (file mode, restarts, migrations, damaged data) follow in `sqlite_only`,
//! PostgreSQL's (an unreachable server, concurrent migrations) in `postgres_only`.
//! PostgreSQL is the one `support/postgres.rs` describes.
//!
//! This file is the harness (each check instantiated per store); the checks live in modules by
//! concern: `versions`, `pages`, `leases`, `nodes`, `execs`, `templates`, `change_log`, with the records
//! and reads they share in `fixtures`.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_core::exec::{Exec, ExecEnd, ExecId, ExecSpec, ExecState};
use berth_core::{Conflict, Intent, Key, Phase, Provider, Sandbox, SandboxId, SandboxSpec, Secret, Timestamp, Write};
use berth_gateway::store::memory::MemoryStore;
use berth_gateway::store::postgres::PostgresStore;
use berth_gateway::store::sqlite::SqliteStore;
use berth_gateway::store::{Changes, CommitError, Lease, Logged, Page, PageRequest, Store};

type Shared = Arc<dyn Store>;

#[path = "../support/postgres.rs"]
mod pg;

mod change_log;
mod execs;
mod fixtures;
mod leases;
mod nodes;
mod pages;
mod postgres_only;
mod sqlite_only;
mod templates;
mod versions;

use change_log::*;
use execs::*;
use fixtures::*;
use leases::*;
use nodes::*;
use pages::*;
use templates::*;
use versions::*;

/// A PostgreSQL store in a fresh schema named after `test`, or `None` when no database is
/// configured and none is required.
async fn postgres(test: &str) -> Option<PostgresStore> {
    Some(PostgresStore::connect(&pg::fresh_schema(test).await?).await.unwrap())
}

/// Instantiates every check once per store, as `memory::<check>`, `sqlite::<check>` and
/// `postgres::<check>`.
macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    super::$check(std::sync::Arc::new(super::MemoryStore::new())).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = super::SqliteStore::open(&dir.path().join("berth.db")).unwrap();
                    super::$check(std::sync::Arc::new(store)).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    if let Some(store) = super::postgres(stringify!($check)).await {
                        super::$check(std::sync::Arc::new(store)).await;
                    }
                }
            )*
        }
    };
}

conformance!(
    create_if_absent,
    write_if_version,
    delete_if_version,
    transactions_are_atomic,
    a_write_waits_for_the_stores_clock,
    sandbox_pages,
    label_selected_pages,
    label_selection_follows_writes,
    provider_pages,
    sandboxes_using_follows_writes,
    versions_increase_and_reads_see_writes,
    concurrent_compare_and_swap_loses_no_update,
    commits_arriving_together_each_get_their_own_outcome,
    the_lease_has_one_holder_at_a_time,
    gateways_racing_for_the_lease_agree_on_one_holder,
    the_identity_is_stable,
    a_node_lease_keeps_its_epoch_while_renewed_and_gets_a_new_one_after_a_lapse,
    nodes_are_listed_in_id_order_and_drain_across_renewals,
    processes_racing_for_a_node_agree_on_one_holder,
    a_node_is_deleted_only_while_its_lease_is_not_held,
    what_a_node_holds_follows_every_sandbox_write_and_keeps_it_from_deletion,
    execs_are_created_once_and_written_by_version,
    exec_pages_and_open_execs,
    an_exec_admission_never_commits_after_a_sandbox_write_it_did_not_see,
    templates_are_written_by_version_and_paged,
    snapshots_are_written_by_version_and_paged,
    the_change_log_holds_every_sandbox_write_in_commit_order,
    a_listing_cursor_splits_the_log_at_the_listing_snapshot,
    readers_following_the_log_under_concurrent_commits_miss_nothing_and_see_nothing_twice,
);

/// The conformance checks of a change log that keeps only its newest `KEPT` entries.
const KEPT: u64 = 8;

macro_rules! trimmed_log {
    ($($check:ident),* $(,)?) => {
        mod kept_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    super::$check(std::sync::Arc::new(super::MemoryStore::new().keeping_changes(super::KEPT))).await;
                }
            )*
        }
        mod kept_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = super::SqliteStore::keeping_changes(&dir.path().join("berth.db"), super::KEPT).unwrap();
                    super::$check(std::sync::Arc::new(store)).await;
                }
            )*
        }
        mod kept_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $check() {
                    let Some(url) = super::pg::fresh_schema(stringify!($check)).await else { return };
                    let settings = berth_gateway::store::postgres::Settings { changes_kept: super::KEPT, ..Default::default() };
                    let store = super::PostgresStore::connect_with(&url, settings).await.unwrap();
                    super::$check(std::sync::Arc::new(store)).await;
                }
            )*
        }
    };
}

trimmed_log!(the_change_log_keeps_its_newest_entries_and_says_what_it_dropped);

#[test]
fn memory_stores_each_have_their_own_identity() {
    let (a, b) = (MemoryStore::new(), MemoryStore::new());
    assert_ne!(a.identity(), b.identity());
}
