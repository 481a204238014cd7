//! DESIGN 12.2 and 12.3: snapshots, creates from them and forks. Exact outcomes, with the
//! races of a delete against a create from the snapshot, and of a fork's names, pinned.

use std::collections::BTreeMap;

use berth_core::snapshot::{FORK_LABEL, SNAPSHOT_LABEL, needs, spent_fork, still_wanted, unfinished};
use berth_core::{
    Code, Command, Effect, Error, Kind, Outcome, PhaseKind, Request, SandboxId, Snapshot, SnapshotId, SnapshotPhase,
    Write, decide,
};

use crate::world::World;

/// A world with sandbox "box" Ready.
fn ready_box() -> World {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    w.run_all_effects();
    let id = w.id("box");
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(w.sandbox("box").phase.kind(), PhaseKind::Ready);
    w
}

fn take(w: &mut World, name: &str, id: &str) -> Result<Outcome, Error> {
    w.request(Command::CreateSnapshot { id: SnapshotId::new(id), name: name.into(), sandbox: "box".into() }, None)
}

fn from_snapshot(name: &str, snapshot: &str) -> Command {
    Command::CreateFromSnapshot {
        id: SandboxId::new(format!("sb-{name}")),
        name: name.into(),
        snapshot: snapshot.into(),
        labels: [("team".to_string(), "a".to_string())].into(),
        providers: Default::default(),
        deadline: None,
    }
}

fn snapshot(w: &World, name: &str) -> Snapshot {
    w.store.snapshots.get(name).cloned().unwrap_or_else(|| panic!("no snapshot {name}"))
}

fn code(result: Result<Outcome, Error>) -> Code {
    result.expect_err("refused").code()
}

#[test]
fn a_snapshot_is_asked_for_then_confirmed_by_the_runtime() {
    let mut w = ready_box();
    let box_version = w.sandbox("box").resource_version;
    let Outcome::Snapshot(asked) = take(&mut w, "s1", "sn-1").unwrap() else { panic!("a snapshot") };
    assert_eq!(asked.phase, SnapshotPhase::Creating);
    assert_eq!(asked.source.name, "box");
    assert_eq!(asked.source.generation, 1);
    assert_eq!(asked.spec, berth_core::SandboxSpec::clone(&w.sandbox("box").spec));
    assert_eq!(
        w.effects.back(),
        Some(&Effect::Snapshot { snapshot: SnapshotId::new("sn-1"), name: "s1".into(), sandbox: w.id("box") })
    );
    // Taking a snapshot changes nothing of its source.
    assert_eq!(w.sandbox("box").resource_version, box_version);
    w.run_all_effects();
    let ready = snapshot(&w, "s1");
    assert_eq!(ready.phase, SnapshotPhase::Ready);
    assert!(ready.content.is_some());
    assert!(w.kept.contains(&SnapshotId::new("sn-1")));
    assert_eq!(unfinished(&ready), None);
}

#[test]
fn only_a_settled_sandbox_is_copied_and_names_and_the_quota_hold() {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    // Provisioning: no one consistent point to copy.
    let refused = take(&mut w, "s1", "sn-1").unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(w.store.snapshots.is_empty());

    let mut w = ready_box();
    take(&mut w, "s1", "sn-1").unwrap();
    let twice = take(&mut w, "s1", "sn-2").unwrap_err();
    assert_eq!(twice, Error::AlreadyExists { kind: Kind::Snapshot, name: "s1".into() });
    let missing = w.request(
        Command::CreateSnapshot { id: SnapshotId::new("sn-3"), name: "s3".into(), sandbox: "nobox".into() },
        None,
    );
    assert_eq!(missing.unwrap_err(), Error::NotFound { kind: Kind::Sandbox, name: "nobox".into() });
    let bad = w.request(
        Command::CreateSnapshot { id: SnapshotId::new("sn-3"), name: "Not A Name".into(), sandbox: "box".into() },
        None,
    );
    assert!(matches!(bad.unwrap_err(), Error::Invalid { field, .. } if field == "name"));

    // The store's quota: one snapshot, and it is there.
    let request = Request::new(
        Command::CreateSnapshot { id: SnapshotId::new("sn-4"), name: "s4".into(), sandbox: "box".into() },
        None,
    );
    let mut reads = w.store.reads(&request);
    reads.limits.max_snapshots = 1;
    let over = decide(&request, &reads, w.now).unwrap_err();
    assert_eq!(over.code(), Code::ResourceExhausted, "{over}");
    assert!(over.to_string().contains("--max-snapshots"), "{over}");
}

#[test]
fn a_sandbox_made_from_a_snapshot_holds_it_until_its_first_run_started() {
    let mut w = ready_box();
    take(&mut w, "s1", "sn-1").unwrap();
    // Not Ready yet: nothing can be made from it.
    let early = w.request(from_snapshot("copy", "s1"), None);
    assert_eq!(code(early), Code::FailedPrecondition);
    w.run_all_effects();
    let before = snapshot(&w, "s1");
    let Outcome::Sandbox(copy) = w.request(from_snapshot("copy", "s1"), None).unwrap() else { panic!("a sandbox") };
    assert_eq!(copy.generation, 1);
    assert_eq!(copy.spec.image, before.spec.image);
    assert_eq!(copy.spec.labels.get(SNAPSHOT_LABEL), Some(&"s1".to_string()));
    assert_eq!(copy.spec.labels.get("team"), Some(&"a".to_string()));
    assert!(needs(&copy, &before.id));
    // The create wrote the snapshot too: a delete decided before it conflicts.
    assert_eq!(snapshot(&w, "s1").resource_version, before.resource_version + 1);

    let held = w.request(Command::DeleteSnapshot { name: "s1".into() }, None).unwrap_err();
    assert_eq!(held, Error::SnapshotInUse { snapshot: "s1".into(), sandboxes: vec!["copy".into()] });
    assert_eq!(held.code(), Code::FailedPrecondition);

    // Its start runs; the runtime's reply records it seeded.
    w.run_all_effects();
    assert!(!needs(&w.sandbox("copy"), &before.id));
    let Outcome::Snapshot(deleting) = w.request(Command::DeleteSnapshot { name: "s1".into() }, None).unwrap() else {
        panic!("a snapshot")
    };
    assert_eq!(deleting.phase, SnapshotPhase::Deleting);
    // An acknowledged delete completes: the record goes only with the runtime's copy.
    assert!(w.kept.contains(&before.id));
    w.run_all_effects();
    assert!(w.store.snapshots.is_empty());
    assert!(w.kept.is_empty());
    // The sandbox made from it lives on.
    assert!(w.store.by_name("copy").is_some());
}

#[test]
fn a_delete_committed_between_a_creates_read_and_its_write_wins_and_the_create_is_decided_again() {
    let mut w = ready_box();
    take(&mut w, "s1", "sn-1").unwrap();
    w.run_all_effects();
    // The create reads the snapshot Ready and decides ...
    let create = Request::new(from_snapshot("copy", "s1"), None);
    let decided = decide(&create, &w.store.reads(&create), w.now).unwrap();
    // ... a delete, seeing no user yet, commits in between ...
    w.request(Command::DeleteSnapshot { name: "s1".into() }, None).unwrap();
    // ... so the create's write of the snapshot conflicts, and nothing of it is written.
    let conflict = w.store.commit(&decided.writes).unwrap_err();
    assert_eq!(conflict.key, berth_core::Key::Snapshot("s1".into()));
    assert!(w.store.by_name("copy").is_none());
    // Decided again, it meets the delete.
    let again = w.request(from_snapshot("copy", "s1"), None).unwrap_err();
    assert_eq!(
        again,
        Error::SnapshotPhase { snapshot: "s1".into(), action: "create a sandbox from", phase: "Deleting" }
    );
}

#[test]
fn an_answer_for_a_snapshot_being_deleted_changes_nothing_and_the_removal_follows() {
    let mut w = ready_box();
    take(&mut w, "s1", "sn-1").unwrap();
    let copy = w.effects.pop_back().unwrap();
    w.request(Command::DeleteSnapshot { name: "s1".into() }, None).unwrap();
    let deleting = snapshot(&w, "s1");
    assert!(!still_wanted(Some(&deleting), &copy), "a copy of a snapshot being deleted is not made");
    // A copy that ran anyway (it was under way) answers late: the record stays Deleting.
    let answer = Request::new(w.perform_snapshot(&copy), None);
    let decision = decide(&answer, &w.store.reads(&answer), w.now).unwrap();
    assert_eq!(decision.writes, Vec::<Write>::new());
    w.run_all_effects();
    assert!(w.store.snapshots.is_empty());
    assert!(w.kept.is_empty(), "the late copy is removed with the snapshot");
}

#[test]
fn a_failed_copy_leaves_the_snapshot_in_error_and_nothing_can_be_made_from_it() {
    let mut w = ready_box();
    take(&mut w, "s1", "sn-1").unwrap();
    w.effects.clear();
    let failed =
        Command::SnapshotTaken { name: "s1".into(), id: SnapshotId::new("sn-1"), result: Err("disk full".into()) };
    w.request(failed, None).unwrap();
    assert_eq!(snapshot(&w, "s1").phase, SnapshotPhase::Error("disk full".into()));
    assert_eq!(code(w.request(from_snapshot("copy", "s1"), None)), Code::FailedPrecondition);
    // An answer for another snapshot of the same name changes nothing.
    let other = Command::SnapshotTaken { name: "s1".into(), id: SnapshotId::new("sn-0"), result: Err("stale".into()) };
    assert!(matches!(w.request(other, None).unwrap(), Outcome::Removed));
}

fn fork(names: &[&str]) -> Command {
    Command::ForkSandbox {
        name: "box".into(),
        snapshot: SnapshotId::new("sn-f"),
        snapshot_name: "fork-1".into(),
        forks: names.iter().map(|n| (SandboxId::new(format!("sb-{n}")), n.to_string())).collect(),
        labels: BTreeMap::from([("run".to_string(), "7".to_string())]),
    }
}

#[test]
fn a_fork_makes_all_its_sandboxes_in_the_write_that_confirms_its_copy() {
    let mut w = ready_box();
    let Outcome::Snapshot(asked) = w.request(fork(&["box-1", "box-2", "box-3"]), None).unwrap() else {
        panic!("a snapshot")
    };
    assert_eq!(asked.fork.as_ref().map(|f| f.sandboxes.len()), Some(3));
    assert!(w.store.by_name("box-1").is_none(), "nothing is made before the copy");
    // The copy's answer: one write makes the snapshot Ready and all three sandboxes.
    let copy = w.effects.pop_back().unwrap();
    let answer = Request::new(w.perform_snapshot(&copy), None);
    let decision = decide(&answer, &w.store.reads(&answer), w.now).unwrap();
    let made: Vec<_> = decision
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::CreateSandbox(s) => Some(s.name.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(made, ["box-1", "box-2", "box-3"]);
    w.store.commit(&decision.writes).unwrap();
    w.effects.extend(decision.effects);
    let one = w.sandbox("box-2");
    assert_eq!(one.spec.labels.get(FORK_LABEL), Some(&"box".to_string()));
    assert_eq!(one.spec.labels.get("run"), Some(&"7".to_string()));
    assert_eq!(one.generation, 1);
    // The fork's snapshot stays while a fork still needs its files ...
    let users: Vec<_> = w.store.sandboxes.values().cloned().collect();
    assert!(!spent_fork(&snapshot(&w, "fork-1"), &users));
    w.run_all_effects();
    // ... and is spent once all have their files; the source runs on.
    let users: Vec<_> = w.store.sandboxes.values().cloned().collect();
    assert!(spent_fork(&snapshot(&w, "fork-1"), &users));
    assert_eq!(w.sandbox("box").phase.kind(), PhaseKind::Ready);
}

#[test]
fn a_fork_whose_name_is_taken_meanwhile_makes_none_of_its_sandboxes() {
    let mut w = ready_box();
    // A name taken already is refused at once.
    let taken = w.request(fork(&["box"]), None).unwrap_err();
    assert!(matches!(taken, Error::Invalid { ref field, .. } if field == "names"), "{taken}");
    w.request(fork(&["box-1", "box-2"]), None).unwrap();
    // Taken between the fork and its copy's answer.
    w.create("box-2", &[]).unwrap();
    w.run_all_effects();
    let failed = snapshot(&w, "fork-1");
    assert!(matches!(failed.phase, SnapshotPhase::Error(ref m) if m.contains("box-2")), "{:?}", failed.phase);
    assert!(w.store.by_name("box-1").is_none(), "all or nothing");
    assert!(spent_fork(&failed, &[]));
    // Counts and names are checked before anything is written.
    assert_eq!(code(w.request(fork(&[]), None)), Code::InvalidArgument);
    assert_eq!(code(w.request(fork(&["a", "a"]), None)), Code::InvalidArgument);
}

#[test]
fn a_fork_past_the_gateways_bound_on_lifetimes_is_refused_or_fails_whole() {
    let mut w = World::default();
    let mut spec = crate::world::spec();
    spec.lifetime.ttl = Some(core::time::Duration::from_secs(3600));
    let create = Command::CreateSandbox {
        id: SandboxId::new("sb-t"),
        name: "box".into(),
        spec,
        providers: Default::default(),
        deadline: None,
    };
    w.request(create, None).unwrap();
    w.run_all_effects();
    let id = w.id("box");
    w.connect_live_supervisor(&id).unwrap().unwrap();
    // Asked for under a bound the source's TTL is past: refused, naming the field.
    let request = Request::new(fork(&["box-1", "box-2"]), None);
    let mut reads = w.store.reads(&request);
    reads.limits.max_ttl = core::time::Duration::from_secs(60);
    let refused = decide(&request, &reads, w.now).unwrap_err();
    assert!(matches!(refused, Error::Invalid { ref field, .. } if field == "spec.lifetime.ttl_ms"), "{refused}");
    // The bound lowered between the ask and the copy: the fork fails whole.
    w.request(fork(&["box-1", "box-2"]), None).unwrap();
    let copy = w.effects.pop_back().unwrap();
    let answer = Request::new(w.perform_snapshot(&copy), None);
    let mut reads = w.store.reads(&answer);
    reads.limits.max_ttl = core::time::Duration::from_secs(60);
    let decision = decide(&answer, &reads, w.now).unwrap();
    assert!(!decision.writes.iter().any(|w| matches!(w, Write::CreateSandbox(_))), "nothing of it is made");
    w.store.commit(&decision.writes).unwrap();
    assert!(matches!(snapshot(&w, "fork-1").phase, SnapshotPhase::Error(ref m) if m.contains("ttl")));
}
