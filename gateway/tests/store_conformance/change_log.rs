//! The change log (the fleet watch reads it): every sandbox write in commit order, cursors
//! that split it at a listing's snapshot, readers under concurrent commits, trimming.

use super::*;

/// The whole log after `after`, a batch at a time.
pub(crate) async fn log_after(store: &Shared, mut after: u64) -> Changes {
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

pub(crate) fn logged(entries: &[Logged]) -> Vec<(&str, u64, bool)> {
    entries.iter().map(|e| (&*e.sandbox.name, e.sandbox.resource_version, e.removed)).collect()
}

pub(crate) async fn the_change_log_holds_every_sandbox_write_in_commit_order(store: Shared) {
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
pub(crate) fn replayed(entries: &[Logged], cursor: u64) -> BTreeMap<String, u64> {
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

pub(crate) async fn a_listing_cursor_splits_the_log_at_the_listing_snapshot(store: Shared) {
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

pub(crate) async fn readers_following_the_log_under_concurrent_commits_miss_nothing_and_see_nothing_twice(
    store: Shared,
) {
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

pub(crate) async fn the_change_log_keeps_its_newest_entries_and_says_what_it_dropped(store: Shared) {
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
