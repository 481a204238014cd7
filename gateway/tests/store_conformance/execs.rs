//! Execs: created once, written by version, paged, and admitted only against the sandbox's
//! current version.

use super::*;

pub(crate) fn exec(sandbox: &str, id: &str) -> Exec {
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

pub(crate) fn exec_key(sandbox: &str, id: &str) -> Key {
    Key::Exec(SandboxId::new(sandbox), ExecId::parse("exec_id", id).unwrap())
}

/// The admission of `e` against the sandbox at `version`, as core writes it.
pub(crate) fn admission(e: &Exec, version: u64) -> [Write; 2] {
    [Write::CheckSandbox { id: e.sandbox.clone(), expected: version }, Write::CreateExec(e.clone())]
}

pub(crate) fn ended(e: &Exec) -> Exec {
    let mut next = e.clone();
    next.state = ExecState::Ended { end: ExecEnd::Exited(0), message: String::new() };
    next.resource_version += 1;
    next
}

pub(crate) async fn read_exec(store: &Shared, sandbox: &str, id: &str) -> Option<Exec> {
    store.exec(&SandboxId::new(sandbox), &ExecId::parse("exec_id", id).unwrap()).await.unwrap()
}

pub(crate) async fn execs_are_created_once_and_written_by_version(store: Shared) {
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

pub(crate) async fn exec_pages_and_open_execs(store: Shared) {
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
pub(crate) async fn an_exec_admission_never_commits_after_a_sandbox_write_it_did_not_see(store: Shared) {
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
