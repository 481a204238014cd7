//! Writes by version: create-if-absent, compare-and-swap, deletes, atomic transactions, and
//! concurrent commits (none lost, each told its own outcome).

use super::*;

pub(crate) async fn create_if_absent(store: Shared) {
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

pub(crate) async fn write_if_version(store: Shared) {
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

pub(crate) async fn delete_if_version(store: Shared) {
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

pub(crate) async fn transactions_are_atomic(store: Shared) {
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

pub(crate) async fn versions_increase_and_reads_see_writes(store: Shared) {
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

pub(crate) async fn concurrent_compare_and_swap_loses_no_update(store: Shared) {
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
pub(crate) async fn commits_arriving_together_each_get_their_own_outcome(store: Shared) {
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

/// A write that time alone justifies commits only once the store's own clock has reached that
/// time (PostgreSQL's, read in the transaction; not the gateway's estimate of it): before, the
/// conflict is on the clock, with the time expected and the clock's reading, and nothing of the
/// transaction is written.
pub(crate) async fn a_write_waits_for_the_stores_clock(store: Shared) {
    let a = sandbox("sb-a", "alpha");
    create(&store, &a).await;
    let (to_a2, a2) = update(&a);
    let now = store.now();
    let later = now.plus(std::time::Duration::from_secs(3600));
    let refused = store.commit(&[to_a2.clone(), Write::NotBefore(later)]).await;
    let Err(CommitError::Conflict(Conflict { key: Key::Clock, expected, current: Some(read_at) })) = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(expected, Some(berth_core::decision::clock_millis(later)));
    // The store's clock as it read it: about now (the gateway's estimate of it), not the time asked.
    let read_at = i64::try_from(read_at).unwrap();
    assert!((read_at - now.unix_millis()).abs() < 60_000, "{read_at} against {}", now.unix_millis());
    assert_eq!(read(&store, "sb-a").await, Some(a.clone()), "nothing of the transaction was written");

    let past = Timestamp::from_unix_millis(now.unix_millis() - 60_000);
    store.commit(&[to_a2, Write::NotBefore(past)]).await.unwrap();
    assert_eq!(read(&store, "sb-a").await, Some(a2));
}
