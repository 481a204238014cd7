//! One conformance suite for every `Store`: each check is written once against `dyn Store` and
//! run on the in-memory store, on SQLite and on PostgreSQL, so they cannot drift apart. SQLite's
//! own concerns (file mode, restarts, migrations, damaged data) follow in `sqlite_only`,
//! PostgreSQL's (an unreachable server, concurrent migrations) in `postgres_only`.
//! PostgreSQL is the one `support/postgres.rs` describes.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_core::exec::{Exec, ExecEnd, ExecId, ExecSpec, ExecState};
use berth_core::{Conflict, Intent, Key, Phase, Provider, Sandbox, SandboxId, SandboxSpec, Secret, Timestamp, Write};
use berth_gateway::store::memory::MemoryStore;
use berth_gateway::store::postgres::PostgresStore;
use berth_gateway::store::sqlite::SqliteStore;
use berth_gateway::store::{Changes, CommitError, Lease, Logged, Page, PageRequest, Store};

type Shared = Arc<dyn Store>;

#[path = "support/postgres.rs"]
mod pg;

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
    execs_are_created_once_and_written_by_version,
    exec_pages_and_open_execs,
    an_exec_admission_never_commits_after_a_sandbox_write_it_did_not_see,
    templates_are_written_by_version_and_paged,
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

fn sandbox(id: &str, name: &str) -> Sandbox {
    let spec = SandboxSpec {
        image: "alpine:3".into(),
        command: vec!["sleep".into(), "infinity".into()],
        env: [("GREETING".to_string(), "hello".to_string())].into(),
        labels: BTreeMap::new(),
        ..SandboxSpec::default()
    };
    Sandbox::new(SandboxId::new(id), name, spec, Timestamp::from_unix_millis(1))
}

fn provider(name: &str) -> Provider {
    Provider {
        endpoints: Default::default(),
        name: name.into(),
        kind: "test".into(),
        credentials: [("TOKEN".to_string(), Secret::new("hunter2"))].into(),
        resource_version: 1,
        created_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    }
}

/// `s`'s next version, as core writes it.
fn bumped(s: &Sandbox) -> Sandbox {
    let mut next = s.clone();
    next.resource_version += 1;
    next.updated_at = Timestamp(s.updated_at.0 + 1);
    next
}

fn bumped_provider(p: &Provider) -> Provider {
    let mut next = p.clone();
    next.resource_version += 1;
    next.updated_at = Timestamp(p.updated_at.0 + 1);
    next
}

fn update(s: &Sandbox) -> (Write, Sandbox) {
    let next = bumped(s);
    (Write::UpdateSandbox { record: next.clone(), expected: s.resource_version }, next)
}

fn conflict(key: Key, expected: Option<u64>, current: Option<u64>) -> Result<(), CommitError> {
    Err(CommitError::Conflict(Conflict { key, expected, current }))
}

fn sandbox_key(id: &str) -> Key {
    Key::Sandbox(SandboxId::new(id))
}

fn provider_key(name: &str) -> Key {
    Key::Provider(name.into())
}

async fn create(store: &Shared, s: &Sandbox) {
    store.commit(&[Write::CreateSandbox(s.clone())]).await.unwrap();
}

async fn read(store: &Shared, id: &str) -> Option<Sandbox> {
    store.sandbox(&SandboxId::new(id)).await.unwrap()
}

fn names(items: &[Sandbox]) -> Vec<&str> {
    items.iter().map(|s| &*s.name).collect()
}

fn selector(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Every page of sandboxes matching `selector`, `limit` at a time.
async fn all_sandbox_pages(store: &Shared, limit: usize, selector: &BTreeMap<String, String>) -> Vec<Page<Sandbox>> {
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_sandboxes(&PageRequest { after, limit }, selector).await.unwrap();
        after = page.next.clone();
        pages.push(page);
        if after.is_none() {
            return pages;
        }
        assert!(pages.len() <= 100, "paging does not end");
    }
}

/// Checks that `pages` are `sizes` long, continue from each other and hold `expected` in order.
fn assert_pages(pages: &[Page<Sandbox>], sizes: &[usize], expected: &[String]) {
    assert_eq!(pages.iter().map(|p| p.items.len()).collect::<Vec<_>>(), sizes);
    for page in &pages[..pages.len() - 1] {
        assert_eq!(page.next.as_deref(), page.items.last().map(|s| &*s.name), "next is the last name");
    }
    assert_eq!(pages.last().unwrap().next, None);
    let listed: Vec<&str> = pages.iter().flat_map(|p| names(&p.items)).collect();
    assert_eq!(listed, expected.iter().map(String::as_str).collect::<Vec<_>>());
}

async fn create_if_absent(store: Shared) {
    let a = sandbox("sb-a", "alpha");
    create(&store, &a).await;
    assert_eq!(read(&store, "sb-a").await, Some(a.clone()));
    assert_eq!(store.sandbox_by_name("alpha").await.unwrap(), Some(a.clone()));

    let mut again = a.clone();
    std::sync::Arc::make_mut(&mut again.spec).image = "busybox".into();
    assert_eq!(store.commit(&[Write::CreateSandbox(again)]).await, conflict(sandbox_key("sb-a"), None, Some(1)));
    assert_eq!(read(&store, "sb-a").await, Some(a.clone()), "a failed create leaves the record alone");

    // The name's holder is reported with its own current version.
    let (write, a2) = update(&a);
    store.commit(&[write]).await.unwrap();
    let b = sandbox("sb-b", "alpha");
    assert_eq!(store.commit(&[Write::CreateSandbox(b.clone())]).await, conflict(sandbox_key("sb-a"), None, Some(2)));
    assert_eq!(read(&store, "sb-b").await, None);
    assert_eq!(store.sandbox_by_name("alpha").await.unwrap(), Some(a2));

    store.commit(&[Write::RemoveSandbox { id: SandboxId::new("sb-a"), expected: 2 }]).await.unwrap();
    create(&store, &b).await;
    assert_eq!(store.sandbox_by_name("alpha").await.unwrap(), Some(b));
    assert_eq!(read(&store, "sb-a").await, None);

    let p = provider("p1");
    store.commit(&[Write::CreateProvider(p.clone())]).await.unwrap();
    let mut other = provider("p1");
    other.kind = "other".into();
    assert_eq!(store.commit(&[Write::CreateProvider(other)]).await, conflict(provider_key("p1"), None, Some(1)));
    assert_eq!(store.provider("p1").await.unwrap(), Some(p));
}

async fn write_if_version(store: Shared) {
    let a = sandbox("sb-a", "alpha");
    create(&store, &a).await;
    let mut next = bumped(&a);
    next.intent = Intent::Stopped;
    next.phase = Phase::Stopping;
    store.commit(&[Write::UpdateSandbox { record: next.clone(), expected: 1 }]).await.unwrap();
    let got = read(&store, "sb-a").await.unwrap();
    assert_eq!((got.resource_version, &got), (2, &next));

    let mut stale = bumped(&a);
    stale.intent = Intent::Deleted;
    assert_eq!(
        store.commit(&[Write::UpdateSandbox { record: stale, expected: 1 }]).await,
        conflict(sandbox_key("sb-a"), Some(1), Some(2))
    );
    assert_eq!(read(&store, "sb-a").await, Some(next.clone()), "nothing written on conflict");

    let ghost = bumped(&sandbox("sb-ghost", "ghost"));
    assert_eq!(
        store.commit(&[Write::UpdateSandbox { record: ghost, expected: 1 }]).await,
        conflict(sandbox_key("sb-ghost"), Some(1), None)
    );
    assert_eq!(read(&store, "sb-ghost").await, None);
    assert_eq!(store.sandbox_by_name("ghost").await.unwrap(), None);

    let p = provider("p1");
    store.commit(&[Write::CreateProvider(p.clone())]).await.unwrap();
    let mut p2 = bumped_provider(&p);
    p2.credentials.insert("OTHER".into(), Secret::new("s2"));
    store.commit(&[Write::UpdateProvider { record: p2.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.provider("p1").await.unwrap(), Some(p2.clone()));
    assert_eq!(
        store.commit(&[Write::UpdateProvider { record: bumped_provider(&p), expected: 1 }]).await,
        conflict(provider_key("p1"), Some(1), Some(2))
    );
    assert_eq!(
        store.commit(&[Write::UpdateProvider { record: bumped_provider(&provider("p9")), expected: 1 }]).await,
        conflict(provider_key("p9"), Some(1), None)
    );
    assert_eq!(store.provider("p1").await.unwrap(), Some(p2));
    assert_eq!(store.provider("p9").await.unwrap(), None);
}

async fn delete_if_version(store: Shared) {
    let mut a = sandbox("sb-a", "alpha");
    std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
    create(&store, &a).await;
    let remove = |expected| Write::RemoveSandbox { id: SandboxId::new("sb-a"), expected };
    assert_eq!(store.commit(&[remove(7)]).await, conflict(sandbox_key("sb-a"), Some(7), Some(1)));
    assert_eq!(read(&store, "sb-a").await, Some(a.clone()));
    store.commit(&[remove(1)]).await.unwrap();
    assert_eq!(read(&store, "sb-a").await, None);
    assert_eq!(store.sandbox_by_name("alpha").await.unwrap(), None);
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![]);
    assert_eq!(store.commit(&[remove(1)]).await, conflict(sandbox_key("sb-a"), Some(1), None));

    let p = provider("p1");
    store.commit(&[Write::CreateProvider(p.clone())]).await.unwrap();
    let remove = |expected| Write::RemoveProvider { name: "p1".into(), expected };
    assert_eq!(store.commit(&[remove(2)]).await, conflict(provider_key("p1"), Some(2), Some(1)));
    assert_eq!(store.provider("p1").await.unwrap(), Some(p));
    store.commit(&[remove(1)]).await.unwrap();
    assert_eq!(store.provider("p1").await.unwrap(), None);
    assert_eq!(store.commit(&[remove(1)]).await, conflict(provider_key("p1"), Some(1), None));
    assert_eq!(store.list_providers(&PageRequest { after: None, limit: 10 }).await.unwrap().items, vec![]);
}

async fn transactions_are_atomic(store: Shared) {
    let a = sandbox("sb-a", "alpha");
    let b = sandbox("sb-b", "beta");
    let p = provider("p1");
    store
        .commit(&[Write::CreateSandbox(a.clone()), Write::CreateSandbox(b.clone()), Write::CreateProvider(p.clone())])
        .await
        .unwrap();

    let (to_a2, a2) = update(&a);
    let p2 = bumped_provider(&p);
    let to_p2 = Write::UpdateProvider { record: p2.clone(), expected: 1 };
    let mut c = sandbox("sb-c", "gamma");
    std::sync::Arc::make_mut(&mut c.providers).insert("p1".into());
    let stale_b = Write::UpdateSandbox { record: bumped(&b), expected: 5 };
    for failing in [
        vec![to_a2.clone(), to_p2.clone(), stale_b.clone()],
        vec![Write::CreateSandbox(c.clone()), to_a2.clone(), stale_b.clone()],
    ] {
        assert_eq!(store.commit(&failing).await, conflict(sandbox_key("sb-b"), Some(5), Some(1)));
        assert_eq!(read(&store, "sb-a").await, Some(a.clone()));
        assert_eq!(store.provider("p1").await.unwrap(), Some(p.clone()));
        assert_eq!(read(&store, "sb-c").await, None);
        assert_eq!(store.sandbox_by_name("gamma").await.unwrap(), None);
        assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![]);
    }

    // Of several failing conditions, the first in the transaction is reported.
    let stale_p = Write::RemoveProvider { name: "p1".into(), expected: 9 };
    assert_eq!(store.commit(&[to_a2.clone(), stale_p, stale_b]).await, conflict(provider_key("p1"), Some(9), Some(1)));
    // Conditions are checked against the state before the transaction: a record created earlier
    // in it is still absent to a later write.
    let c2 = bumped(&c);
    assert_eq!(
        store.commit(&[Write::CreateSandbox(c.clone()), Write::UpdateSandbox { record: c2, expected: 1 }]).await,
        conflict(sandbox_key("sb-c"), Some(1), None)
    );
    assert_eq!(read(&store, "sb-c").await, None);

    store.commit(&[to_a2, to_p2, Write::CreateSandbox(c.clone())]).await.unwrap();
    assert_eq!(read(&store, "sb-a").await, Some(a2));
    assert_eq!(store.provider("p1").await.unwrap(), Some(p2));
    assert_eq!(read(&store, "sb-c").await, Some(c.clone()));
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![c]);
    assert_eq!(read(&store, "sb-b").await, Some(b));
}

/// 25 sandboxes `box-00`..`box-24`, created in a scrambled order; even ones carry `team=a`,
/// odd ones `team=b`, and multiples of four also `tier=gold`.
async fn create_boxes(store: &Shared) -> Vec<String> {
    for i in (0..25).map(|i| i * 11 % 25) {
        let mut s = sandbox(&format!("sb-{i}"), &format!("box-{i:02}"));
        std::sync::Arc::make_mut(&mut s.spec).labels.insert("team".into(), if i % 2 == 0 { "a" } else { "b" }.into());
        if i % 4 == 0 {
            std::sync::Arc::make_mut(&mut s.spec).labels.insert("tier".into(), "gold".into());
        }
        create(store, &s).await;
    }
    (0..25).map(|i| format!("box-{i:02}")).collect()
}

async fn sandbox_pages(store: Shared) {
    let all = create_boxes(&store).await;
    let everything = BTreeMap::new();
    assert_pages(&all_sandbox_pages(&store, 10, &everything).await, &[10, 10, 5], &all);
    // A page exactly as long as what is left is the last one.
    assert_pages(&all_sandbox_pages(&store, 25, &everything).await, &[25], &all);
    assert_pages(&all_sandbox_pages(&store, 5, &everything).await, &[5; 5], &all);
    // A zero limit still makes progress, one at a time.
    assert_pages(&all_sandbox_pages(&store, 0, &everything).await, &[1; 25], &all);

    // A cursor need not be a stored name.
    let page = store.list_sandboxes(&PageRequest { after: Some("box-09x".into()), limit: 3 }, &everything).await;
    let page = page.unwrap();
    assert_eq!((names(&page.items), page.next.as_deref()), (vec!["box-10", "box-11", "box-12"], Some("box-12")));
    let page = store.list_sandboxes(&PageRequest { after: Some("box-24".into()), limit: 3 }, &everything).await;
    assert_eq!(page.unwrap(), Page { items: vec![], next: None });
}

async fn label_selected_pages(store: Shared) {
    let all = create_boxes(&store).await;
    let even: Vec<String> = all.iter().step_by(2).cloned().collect();
    let team_a = selector(&[("team", "a")]);
    assert_pages(&all_sandbox_pages(&store, 5, &team_a).await, &[5, 5, 3], &even);
    assert_pages(&all_sandbox_pages(&store, 13, &team_a).await, &[13], &even);

    let odd: Vec<String> = all.iter().skip(1).step_by(2).cloned().collect();
    assert_pages(&all_sandbox_pages(&store, 10, &selector(&[("team", "b")])).await, &[10, 2], &odd);

    let gold: Vec<String> = all.iter().step_by(4).cloned().collect();
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("team", "a"), ("tier", "gold")])).await, &[3, 3, 1], &gold);
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("team", "b"), ("tier", "gold")])).await, &[0], &[]);
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("team", "c")])).await, &[0], &[]);
    // A key is matched as a whole, not as a prefix or a pattern.
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("tea", "a")])).await, &[0], &[]);
    assert_pages(&all_sandbox_pages(&store, 3, &selector(&[("te%", "a")])).await, &[0], &[]);
}

async fn label_selection_follows_writes(store: Shared) {
    let mut a = sandbox("sb-a", "alpha");
    let labels = &mut std::sync::Arc::make_mut(&mut a.spec).labels;
    labels.extend([("team", "a"), ("tier", "gold"), ("zone", "x")].map(|(k, v)| (k.to_string(), v.to_string())));
    create(&store, &a).await;
    let b = sandbox("sb-b", "beta");
    create(&store, &b).await;
    let selected = async |pairs: &[(&str, &str)]| -> Vec<String> {
        let page = store.list_sandboxes(&PageRequest { after: None, limit: 10 }, &selector(pairs)).await.unwrap();
        names(&page.items).into_iter().map(str::to_string).collect()
    };
    assert_eq!(selected(&[("team", "a"), ("zone", "x")]).await, ["alpha"]);

    // One label's value changes, one goes, one stays, one comes; another sandbox gains one.
    let mut a2 = bumped(&a);
    let labels = &mut std::sync::Arc::make_mut(&mut a2.spec).labels;
    labels.insert("team".into(), "b".into());
    labels.remove("tier");
    labels.insert("owner".into(), "ops".into());
    let mut b2 = bumped(&b);
    std::sync::Arc::make_mut(&mut b2.spec).labels.insert("team".into(), "b".into());
    for s in [&a2, &b2] {
        store.commit(&[Write::UpdateSandbox { record: s.clone(), expected: 1 }]).await.unwrap();
    }
    assert_eq!(selected(&[("team", "a")]).await, Vec::<String>::new());
    assert_eq!(selected(&[("team", "b")]).await, ["alpha", "beta"]);
    assert_eq!(selected(&[("tier", "gold")]).await, Vec::<String>::new());
    assert_eq!(selected(&[("zone", "x"), ("owner", "ops"), ("team", "b")]).await, ["alpha"]);

    // A write that leaves the labels alone leaves the selection alone.
    let a3 = bumped(&a2);
    store.commit(&[Write::UpdateSandbox { record: a3, expected: 2 }]).await.unwrap();
    assert_eq!(selected(&[("zone", "x"), ("owner", "ops"), ("team", "b")]).await, ["alpha"]);
    // A refused write changes none of them.
    let mut stale = bumped(&a2);
    std::sync::Arc::make_mut(&mut stale.spec).labels.clear();
    assert!(store.commit(&[Write::UpdateSandbox { record: stale, expected: 2 }]).await.is_err());
    assert_eq!(selected(&[("zone", "x")]).await, ["alpha"]);
}

async fn provider_pages(store: Shared) {
    for i in (0..12).map(|i| i * 5 % 12) {
        store.commit(&[Write::CreateProvider(provider(&format!("prov-{i:02}")))]).await.unwrap();
    }
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_providers(&PageRequest { after, limit: 5 }).await.unwrap();
        after = page.next.clone();
        if let Some(next) = &page.next {
            assert_eq!(Some(next), page.items.last().map(|p| &p.name), "next is the last name");
        }
        pages.push(page);
        if after.is_none() {
            break;
        }
    }
    assert_eq!(pages.iter().map(|p| p.items.len()).collect::<Vec<_>>(), vec![5, 5, 2]);
    let listed: Vec<String> = pages.iter().flat_map(|p| p.items.iter().map(|p| p.name.clone())).collect();
    assert_eq!(listed, (0..12).map(|i| format!("prov-{i:02}")).collect::<Vec<_>>());
    assert_eq!(pages[0].items[0], provider("prov-00"), "records come back whole, credentials included");

    let whole = store.list_providers(&PageRequest { after: None, limit: 12 }).await.unwrap();
    assert_eq!((whole.items.len(), whole.next), (12, None));
    let one = store.list_providers(&PageRequest { after: Some("prov-03".into()), limit: 0 }).await.unwrap();
    assert_eq!((one.items, one.next.as_deref()), (vec![provider("prov-04")], Some("prov-04")));
}

async fn sandboxes_using_follows_writes(store: Shared) {
    let mut a = sandbox("sb-a", "alpha");
    std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
    let mut b = sandbox("sb-b", "beta");
    std::sync::Arc::make_mut(&mut b.providers).extend(["p1".to_string(), "p2".to_string()]);
    let c = sandbox("sb-c", "gamma");
    // Created out of name order: results are ordered by name.
    for s in [&b, &c, &a] {
        create(&store, s).await;
    }
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![a.clone(), b.clone()]);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![b.clone()]);
    assert_eq!(store.sandboxes_using("p3").await.unwrap(), vec![]);

    let mut b2 = bumped(&b);
    b2.providers = std::sync::Arc::new(["p2".to_string(), "p3".to_string()].into());
    store.commit(&[Write::UpdateSandbox { record: b2.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![a.clone()]);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![b2.clone()], "the current record is returned");
    assert_eq!(store.sandboxes_using("p3").await.unwrap(), vec![b2.clone()]);

    store.commit(&[Write::RemoveSandbox { id: a.id.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(store.sandboxes_using("p1").await.unwrap(), vec![]);
    // A sandbox's references do not depend on the provider record existing.
    assert_eq!(store.provider("p2").await.unwrap(), None);
    assert_eq!(store.sandboxes_using("p2").await.unwrap(), vec![b2]);
}

async fn versions_increase_and_reads_see_writes(store: Shared) {
    let mut s = sandbox("sb-a", "alpha");
    create(&store, &s).await;
    let mut p = provider("p1");
    store.commit(&[Write::CreateProvider(p.clone())]).await.unwrap();
    let mut seen = vec![1];
    for step in 0..20 {
        let mut next = bumped(&s);
        std::sync::Arc::make_mut(&mut next.spec).env.insert("STEP".into(), step.to_string());
        let p_next = bumped_provider(&p);
        store
            .commit(&[
                Write::UpdateSandbox { record: next.clone(), expected: s.resource_version },
                Write::UpdateProvider { record: p_next.clone(), expected: p.resource_version },
            ])
            .await
            .unwrap();
        let got = read(&store, "sb-a").await.unwrap();
        assert_eq!(got, next, "a read after a commit sees it");
        assert_eq!(store.sandbox_by_name("alpha").await.unwrap().as_ref(), Some(&next));
        assert_eq!(store.provider("p1").await.unwrap().as_ref(), Some(&p_next));
        seen.push(got.resource_version);
        s = next;
        p = p_next;
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "versions strictly increase: {seen:?}");
    assert_eq!(seen.last(), Some(&21));
    assert_eq!(p.resource_version, 21);
}

async fn concurrent_compare_and_swap_loses_no_update(store: Shared) {
    const TASKS: usize = 8;
    const INCREMENTS: u64 = 50;
    create(&store, &sandbox("sb-a", "alpha")).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for _ in 0..INCREMENTS {
                    loop {
                        let current = read(&store, "sb-a").await.unwrap();
                        let mut next = bumped(&current);
                        for counter in ["TOTAL".to_string(), format!("TASK_{task}")] {
                            let n: u64 = next.spec.env.get(&counter).map_or(0, |v| v.parse().unwrap());
                            std::sync::Arc::make_mut(&mut next.spec).env.insert(counter, (n + 1).to_string());
                        }
                        let write = Write::UpdateSandbox { record: next, expected: current.resource_version };
                        match store.commit(&[write]).await {
                            Ok(()) => break,
                            Err(CommitError::Conflict(c)) => {
                                assert!(c.current > Some(current.resource_version), "{c:?}");
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let last = read(&store, "sb-a").await.unwrap();
    let total = TASKS as u64 * INCREMENTS;
    assert_eq!(last.resource_version, 1 + total);
    assert_eq!(last.spec.env.get("TOTAL"), Some(&total.to_string()));
    for task in 0..TASKS {
        assert_eq!(last.spec.env.get(&format!("TASK_{task}")), Some(&INCREMENTS.to_string()), "task {task}");
    }
}

/// Many commits at once (which SQLite's writer takes as one group): the one commit that wins a
/// contested name applies whole, every commit that loses it applies nothing (not even its
/// uncontested write), a commit that gives one name twice applies nothing (it passes every
/// check and fails only as it applies), and the uncontested commits all apply, each told its
/// own outcome.
async fn commits_arriving_together_each_get_their_own_outcome(store: Shared) {
    const CONTESTED: usize = 24;
    const FREE: usize = 24;
    const TWICE: usize = 8;
    let twice = |i: usize| (CONTESTED + FREE..CONTESTED + FREE + TWICE).contains(&i);
    let tasks: Vec<_> = (0..CONTESTED + FREE + TWICE)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut writes = vec![Write::CreateSandbox(sandbox(&format!("sb-{i}"), &format!("own-{i}")))];
                if i < CONTESTED {
                    writes.push(Write::CreateSandbox(sandbox(&format!("sb-{i}-shared"), "shared")));
                }
                if twice(i) {
                    for copy in ["a", "b"] {
                        writes.push(Write::CreateSandbox(sandbox(&format!("sb-{i}-{copy}"), &format!("twice-{i}"))));
                    }
                }
                (i, store.commit(&writes).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (i, outcome) = task.await.unwrap();
        match outcome {
            Ok(()) => {
                assert!(!twice(i), "commit {i} gave one name twice and applied");
                winners.extend((i < CONTESTED).then_some(i));
            }
            Err(CommitError::Conflict(c)) => {
                assert!(i < CONTESTED || twice(i), "commit {i} contested nothing: {c:?}");
                assert_eq!((c.expected, c.current), (None, Some(1)), "{c:?}");
            }
            Err(e) => panic!("commit {i}: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "one commit gets the name: {winners:?}");
    for i in 0..CONTESTED + FREE + TWICE {
        let applied = (CONTESTED..CONTESTED + FREE).contains(&i) || winners == [i];
        assert_eq!(read(&store, &format!("sb-{i}")).await.is_some(), applied, "commit {i}");
        if twice(i) {
            assert_eq!(store.sandbox_by_name(&format!("twice-{i}")).await.unwrap(), None, "commit {i}");
        }
    }
    let shared = store.sandbox_by_name("shared").await.unwrap().unwrap();
    assert_eq!(shared.id.as_str(), format!("sb-{}-shared", winners[0]));
}

fn held(holder: &str, term: u64) -> Lease {
    Lease { holder: Some(holder.to_string()), term }
}

async fn the_lease_has_one_holder_at_a_time(store: Shared) {
    let long = std::time::Duration::from_secs(60);
    let first = store.acquire_lease("a", long).await.unwrap();
    assert!(first.held_by("a"), "{first:?}");
    let term = first.term;
    // Held and not lapsed: another gateway cannot take it; its holder renews it in the same term.
    assert_eq!(store.acquire_lease("b", long).await.unwrap(), held("a", term));
    assert_eq!(store.acquire_lease("a", long).await.unwrap(), held("a", term));
    // Only the holder releases it.
    store.release_lease("b").await.unwrap();
    assert_eq!(store.acquire_lease("b", long).await.unwrap(), held("a", term));
    store.release_lease("a").await.unwrap();
    // Released: taken at once, in a new term.
    let short = std::time::Duration::from_millis(200);
    assert_eq!(store.acquire_lease("b", short).await.unwrap(), held("b", term + 1));
    // Lapsed without a renewal: taken over.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(store.acquire_lease("a", long).await.unwrap(), held("a", term + 2));
    assert_eq!(store.acquire_lease("b", long).await.unwrap(), held("a", term + 2));
}

async fn gateways_racing_for_the_lease_agree_on_one_holder(store: Shared) {
    const GATEWAYS: usize = 8;
    let long = std::time::Duration::from_secs(60);
    let tasks: Vec<_> = (0..GATEWAYS)
        .map(|g| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { (format!("g{g}"), store.acquire_lease(&format!("g{g}"), long).await.unwrap()) })
        })
        .collect();
    let mut seen = Vec::new();
    let mut holders = 0;
    for task in tasks {
        let (gateway, lease) = task.await.unwrap();
        holders += usize::from(lease.held_by(&gateway));
        seen.push(lease);
    }
    assert_eq!(holders, 1, "{seen:?}");
    assert!(seen.iter().all(|l| *l == seen[0]), "every gateway sees the one holder: {seen:?}");
}

async fn the_identity_is_stable(store: Shared) {
    let identity = store.identity().to_string();
    assert!(!identity.is_empty());
    store.commit(&[Write::CreateSandbox(sandbox("sb-a", "alpha"))]).await.unwrap();
    store.acquire_lease("g1", std::time::Duration::from_secs(5)).await.unwrap();
    assert_eq!(store.identity(), identity);
}

#[test]
fn memory_stores_each_have_their_own_identity() {
    let (a, b) = (MemoryStore::new(), MemoryStore::new());
    assert_ne!(a.identity(), b.identity());
}

mod sqlite_only {
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
        // Schema version 2 had neither identities (migration 3), execs (migration 4),
        // templates (migration 5) nor a change log (migration 6).
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(
            "DROP TABLE store_identity; DROP TABLE execs; DROP TABLE templates; \
             DROP TABLE sandbox_changes; DROP TABLE change_log; DELETE FROM sqlite_sequence",
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
}

mod postgres_only {
    use std::sync::Arc;

    use berth_core::Write;
    use berth_gateway::store::postgres::PostgresStore;
    use berth_gateway::store::{PageRequest, Store, StoreError};

    use super::pg::{fresh_schema, in_schema, server_url};
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
        let err =
            PostgresStore::connect(&format!("{url}?options=-csearch_path%3Dtest_newer_schema")).await.err().unwrap();
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
}

fn exec(sandbox: &str, id: &str) -> Exec {
    Exec {
        sandbox: SandboxId::new(sandbox),
        id: ExecId::parse("exec_id", id).unwrap(),
        spec: ExecSpec { argv: vec!["echo".into(), "hi".into()], ..Default::default() },
        generation: 1,
        state: ExecState::Admitted,
        cancel_requested: false,
        output_bytes: None,
        resource_version: 1,
        admitted_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    }
}

fn exec_key(sandbox: &str, id: &str) -> Key {
    Key::Exec(SandboxId::new(sandbox), ExecId::parse("exec_id", id).unwrap())
}

/// The admission of `e` against the sandbox at `version`, as core writes it.
fn admission(e: &Exec, version: u64) -> [Write; 2] {
    [Write::CheckSandbox { id: e.sandbox.clone(), expected: version }, Write::CreateExec(e.clone())]
}

fn ended(e: &Exec) -> Exec {
    let mut next = e.clone();
    next.state = ExecState::Ended { end: ExecEnd::Exited(0), message: String::new() };
    next.resource_version += 1;
    next
}

async fn read_exec(store: &Shared, sandbox: &str, id: &str) -> Option<Exec> {
    store.exec(&SandboxId::new(sandbox), &ExecId::parse("exec_id", id).unwrap()).await.unwrap()
}

async fn execs_are_created_once_and_written_by_version(store: Shared) {
    let a = sandbox("sb-a", "alpha");
    create(&store, &a).await;
    let e = exec("sb-a", "e1");
    // Against a version the sandbox does not have: nothing is written.
    assert_eq!(store.commit(&admission(&e, 2)).await, conflict(sandbox_key("sb-a"), Some(2), Some(1)));
    assert_eq!(read_exec(&store, "sb-a", "e1").await, None);
    assert_eq!(store.commit(&admission(&exec("sb-x", "e1"), 1)).await, conflict(sandbox_key("sb-x"), Some(1), None));
    store.commit(&admission(&e, 1)).await.unwrap();
    assert_eq!(read_exec(&store, "sb-a", "e1").await, Some(e.clone()));
    assert_eq!(read(&store, "sb-a").await.unwrap().resource_version, 1, "a check writes nothing");
    assert_eq!(store.commit(&admission(&e, 1)).await, conflict(exec_key("sb-a", "e1"), None, Some(1)));
    let done = ended(&e);
    let write = Write::UpdateExec { record: done.clone(), expected: 1 };
    store.commit(std::slice::from_ref(&write)).await.unwrap();
    assert_eq!(store.commit(&[write]).await, conflict(exec_key("sb-a", "e1"), Some(1), Some(2)));
    assert_eq!(read_exec(&store, "sb-a", "e1").await, Some(done));
    // One id in two sandboxes is two execs; removing a sandbox removes its own.
    let b = sandbox("sb-b", "bravo");
    create(&store, &b).await;
    store.commit(&admission(&exec("sb-b", "e1"), 1)).await.unwrap();
    store.commit(&[Write::RemoveSandbox { id: a.id.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(read_exec(&store, "sb-a", "e1").await, None);
    assert_eq!(read_exec(&store, "sb-b", "e1").await, Some(exec("sb-b", "e1")));
}

async fn exec_pages_and_open_execs(store: Shared) {
    for (id, name) in [("sb-a", "alpha"), ("sb-b", "bravo")] {
        create(&store, &sandbox(id, name)).await;
    }
    for id in ["e3", "e1", "e2", "e10"] {
        store.commit(&admission(&exec("sb-a", id), 1)).await.unwrap();
    }
    store.commit(&admission(&exec("sb-b", "e0"), 1)).await.unwrap();
    let done = ended(&exec("sb-a", "e2"));
    store.commit(&[Write::UpdateExec { record: done, expected: 1 }]).await.unwrap();
    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_execs(&SandboxId::new("sb-a"), &PageRequest { after, limit: 3 }).await.unwrap();
        ids.push(page.items.iter().map(|e| e.id.to_string()).collect::<Vec<_>>());
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(ids, vec![vec!["e1", "e10", "e2"], vec!["e3"]]);
    let open: Vec<(String, String)> =
        store.open_execs(None).await.unwrap().iter().map(|e| (e.sandbox.to_string(), e.id.to_string())).collect();
    let expected = [("sb-a", "e1"), ("sb-a", "e10"), ("sb-a", "e3"), ("sb-b", "e0")];
    assert_eq!(open, expected.map(|(s, e)| (s.to_string(), e.to_string())));
    let of_b = store.open_execs(Some(&SandboxId::new("sb-b"))).await.unwrap();
    assert_eq!(of_b.iter().map(|e| e.id.to_string()).collect::<Vec<_>>(), ["e0"]);
}

/// Admissions race a writer that stops the sandbox: once the stop's commit returned, no
/// admission checked against an earlier version may land (one that serialized before the stop
/// has committed by then).
async fn an_exec_admission_never_commits_after_a_sandbox_write_it_did_not_see(store: Shared) {
    const ADMITTERS: usize = 6;
    let mut ready = sandbox("sb-a", "alpha");
    ready.phase = Phase::Ready;
    create(&store, &ready).await;
    let admitters: Vec<_> = (0..ADMITTERS)
        .map(|task| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for n in 0.. {
                    let current = read(&store, "sb-a").await.unwrap();
                    if current.phase != Phase::Ready {
                        return;
                    }
                    let e = exec("sb-a", &format!("t{task}-{n}"));
                    match store.commit(&admission(&e, current.resource_version)).await {
                        Ok(()) | Err(CommitError::Conflict(_)) => {}
                        Err(other) => panic!("{other}"),
                    }
                }
            })
        })
        .collect();
    let all = || async {
        let page = PageRequest { after: None, limit: 100_000 };
        store.list_execs(&SandboxId::new("sb-a"), &page).await.unwrap().items
    };
    // Unrelated writes while admissions land, then the stop.
    let mut writes = 0;
    loop {
        let current = read(&store, "sb-a").await.unwrap();
        let mut next = bumped(&current);
        writes += 1;
        let stop = writes >= 40 && all().await.len() >= 20;
        if stop {
            next.phase = Phase::Stopping;
        }
        match store.commit(&[Write::UpdateSandbox { record: next, expected: current.resource_version }]).await {
            Ok(()) if stop => break,
            Ok(()) => {}
            Err(e) => panic!("{e}"),
        }
        tokio::task::yield_now().await;
    }
    let at_stop = all().await;
    for task in admitters {
        task.await.unwrap();
    }
    assert_eq!(all().await.len(), at_stop.len(), "admissions landed after the stop committed");
}

/// Templates (DESIGN 9.4): created once, written and removed by version, read back whole
/// (spec and pool size), paged by name; a fill's two writes (member and template) all or none.
async fn templates_are_written_by_version_and_paged(store: Shared) {
    use berth_core::template::Template;
    let template = |name: &str| Template {
        name: name.into(),
        spec: SandboxSpec::clone(&sandbox("x", "x").spec),
        min_ready: 2,
        made: 0,
        resource_version: 1,
        created_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    };
    let key = |name: &str| Key::Template(name.into());
    let web = template("web");
    store.commit(&[Write::CreateTemplate(web.clone())]).await.unwrap();
    assert_eq!(store.commit(&[Write::CreateTemplate(template("web"))]).await, conflict(key("web"), None, Some(1)));
    assert_eq!(store.template("web").await.unwrap(), Some(web.clone()));

    let grown = Template { min_ready: 5, made: 1, resource_version: 2, ..web.clone() };
    // A fill: the member and the template's bump together, or neither.
    let member = sandbox("sb-m", "web-00000001");
    let stale = Template { resource_version: 2, ..web.clone() };
    store.commit(&[Write::UpdateTemplate { record: grown.clone(), expected: 1 }]).await.unwrap();
    assert_eq!(
        store
            .commit(&[Write::CreateSandbox(member.clone()), Write::UpdateTemplate { record: stale, expected: 1 }])
            .await,
        conflict(key("web"), Some(1), Some(2))
    );
    assert_eq!(read(&store, "sb-m").await, None, "nothing of a failed fill is written");
    assert_eq!(store.template("web").await.unwrap(), Some(grown.clone()));

    for name in ["api", "zeta"] {
        store.commit(&[Write::CreateTemplate(template(name))]).await.unwrap();
    }
    let first = store.list_templates(&PageRequest { after: None, limit: 2 }).await.unwrap();
    let names: Vec<&str> = first.items.iter().map(|t| t.name.as_str()).collect();
    assert_eq!((names, first.next.as_deref()), (vec!["api", "web"], Some("web")));
    let rest = store.list_templates(&PageRequest { after: first.next, limit: 2 }).await.unwrap();
    assert_eq!((rest.items.len(), rest.next), (1, None));

    assert_eq!(
        store.commit(&[Write::RemoveTemplate { name: "web".into(), expected: 1 }]).await,
        conflict(key("web"), Some(1), Some(2))
    );
    store.commit(&[Write::RemoveTemplate { name: "web".into(), expected: 2 }]).await.unwrap();
    assert_eq!(store.template("web").await.unwrap(), None);
}

// The change log (the fleet watch reads it).

/// The whole log after `after`, a batch at a time.
async fn log_after(store: &Shared, mut after: u64) -> Changes {
    let mut all = Changes::default();
    loop {
        let batch = store.changes(after, 7).await.unwrap();
        let more = batch.entries.len() == 7;
        if let Some(last) = batch.entries.last() {
            after = last.seq;
        }
        all.entries.extend(batch.entries);
        all.head = batch.head;
        all.trimmed_through = batch.trimmed_through;
        if !more {
            return all;
        }
    }
}

fn logged(entries: &[Logged]) -> Vec<(&str, u64, bool)> {
    entries.iter().map(|e| (&*e.sandbox.name, e.sandbox.resource_version, e.removed)).collect()
}

async fn the_change_log_holds_every_sandbox_write_in_commit_order(store: Shared) {
    let start = store.changes(0, 100).await.unwrap();
    assert_eq!((start.entries.len(), start.head, start.trimmed_through), (0, 0, 0), "a new store's log is empty");
    let a = sandbox("sb-a", "a");
    create(&store, &a).await;
    let (write, a2) = update(&a);
    store.commit(&[write]).await.unwrap();
    // Refused writes, and writes of other records, log nothing.
    assert!(store.commit(&[Write::CreateSandbox(sandbox("sb-other", "a"))]).await.is_err());
    assert!(store.commit(&[Write::UpdateSandbox { record: bumped(&a2), expected: 1 }]).await.is_err());
    store.commit(&[Write::CreateProvider(provider("p"))]).await.unwrap();
    let b = sandbox("sb-b", "b");
    // One transaction's writes are logged together, in the order they were given.
    store
        .commit(&[Write::CreateSandbox(b.clone()), Write::RemoveSandbox { id: a.id.clone(), expected: 2 }])
        .await
        .unwrap();

    let log = log_after(&store, 0).await;
    assert_eq!(logged(&log.entries), [("a", 1, false), ("a", 2, false), ("b", 1, false), ("a", 2, true)]);
    let seqs: Vec<u64> = log.entries.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "positions increase: {seqs:?}");
    assert_eq!(log.head, *seqs.last().unwrap());
    // An entry is the whole record; a removal's is the record as it was removed.
    assert_eq!(log.entries[1].sandbox, a2);
    assert_eq!(log.entries[3].sandbox, a2);
    // Reading after a position starts just after it.
    assert_eq!(logged(&log_after(&store, seqs[1]).await.entries), [("b", 1, false), ("a", 2, true)]);
    assert!(store.changes(log.head, 10).await.unwrap().entries.is_empty());
}

/// Replays `entries` up to `cursor`: each sandbox's version then, for those still there.
fn replayed(entries: &[Logged], cursor: u64) -> BTreeMap<String, u64> {
    let mut state = BTreeMap::new();
    for e in entries.iter().filter(|e| e.seq <= cursor) {
        if e.removed {
            state.remove(&*e.sandbox.name);
        } else {
            state.insert(e.sandbox.name.to_string(), e.sandbox.resource_version);
        }
    }
    state
}

async fn a_listing_cursor_splits_the_log_at_the_listing_snapshot(store: Shared) {
    let boxes: Vec<Sandbox> = (0..6).map(|i| sandbox(&format!("sb-{i}"), &format!("box-{i}"))).collect();
    for s in &boxes {
        create(&store, s).await;
    }
    // Writers bump and recreate the sandboxes while listings are taken.
    let writers: Vec<_> = boxes
        .iter()
        .cloned()
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut current = s;
                for round in 0..15 {
                    let (write, next) = update(&current);
                    store.commit(&[write]).await.unwrap();
                    current = next;
                    if round % 5 == 4 {
                        store
                            .commit(&[Write::RemoveSandbox {
                                id: current.id.clone(),
                                expected: current.resource_version,
                            }])
                            .await
                            .unwrap();
                        current.resource_version += 1;
                        store.commit(&[Write::CreateSandbox(current.clone())]).await.unwrap();
                    }
                }
            })
        })
        .collect();
    let mut listings = Vec::new();
    while listings.len() < 40 {
        let listing =
            store.list_sandboxes_at(&PageRequest { after: None, limit: 100 }, &BTreeMap::new()).await.unwrap();
        listings.push(listing);
        tokio::task::yield_now().await;
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let log = log_after(&store, 0).await;
    for listing in listings {
        let listed: BTreeMap<String, u64> =
            listing.page.items.iter().map(|s| (s.name.to_string(), s.resource_version)).collect();
        assert_eq!(
            listed,
            replayed(&log.entries, listing.cursor),
            "the log up to the listing's cursor {} is exactly what it shows",
            listing.cursor
        );
    }
}

async fn readers_following_the_log_under_concurrent_commits_miss_nothing_and_see_nothing_twice(store: Shared) {
    const WRITERS: usize = 8;
    const ROUNDS: u64 = 12;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut current = sandbox(&format!("sb-w{w}"), &format!("w{w}"));
                create(&store, &current).await;
                for _ in 1..ROUNDS {
                    let (write, next) = update(&current);
                    store.commit(&[write]).await.unwrap();
                    current = next;
                }
            })
        })
        .collect();
    // Readers follow the log as it is written, each from where it last was.
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut at = 0;
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let batch = store.changes(at, 5).await.unwrap();
                    if let Some(last) = batch.entries.last() {
                        at = last.seq;
                    }
                    let empty = batch.entries.is_empty();
                    seen.extend(batch.entries);
                    if finished && empty {
                        return seen;
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let log = log_after(&store, 0).await;
    assert_eq!(log.entries.len(), WRITERS * ROUNDS as usize, "every write is logged once");
    for reader in readers {
        let seen = reader.await.unwrap();
        assert_eq!(logged(&seen), logged(&log.entries), "a follower sees the log whole, once, in order");
    }
    // Each sandbox's entries come in the order its writes committed.
    for w in 0..WRITERS {
        let versions: Vec<u64> = log
            .entries
            .iter()
            .filter(|e| *e.sandbox.name == *format!("w{w}"))
            .map(|e| e.sandbox.resource_version)
            .collect();
        assert_eq!(versions, (1..=ROUNDS).collect::<Vec<_>>());
    }
}

async fn the_change_log_keeps_its_newest_entries_and_says_what_it_dropped(store: Shared) {
    let mut current = sandbox("sb-a", "a");
    create(&store, &current).await;
    for _ in 1..40 {
        let (write, next) = update(&current);
        store.commit(&[write]).await.unwrap();
        current = next;
    }
    // A PostgreSQL log trims as it sequences: reading the head first sequences the writes.
    let head = store.changes(0, 0).await.unwrap().head;
    assert_eq!(head, 40);
    let kept = store.changes(0, 100).await.unwrap();
    assert!(kept.trimmed_through > 0, "some entries were dropped");
    assert!(head - kept.trimmed_through >= KEPT, "at least the newest {KEPT} are kept: {kept:?}");
    // What is kept is every entry after the trimmed ones.
    let seqs: Vec<u64> = kept.entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (kept.trimmed_through + 1..=head).collect::<Vec<_>>());
    assert_eq!(kept.entries.last().unwrap().sandbox, current);
}
