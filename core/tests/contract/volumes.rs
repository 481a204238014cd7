//! DESIGN 13.2: volumes, their mounts and their two-step delete. Exact outcomes, with the
//! races of a delete against a create that mounts the volume pinned in both orders.

use berth_core::spec::Mount;
use berth_core::volume::{label, mounts, unfinished};
use berth_core::{
    Code, Command, Effect, Error, Key, Outcome, Request, SandboxId, SandboxSpec, Volume, VolumeId, VolumePhase, decide,
};

use crate::world::{World, spec};

fn make(w: &mut World, name: &str, id: &str) -> Result<Outcome, Error> {
    w.request(Command::CreateVolume { id: VolumeId::new(id), name: name.into() }, None)
}

fn mounting(name: &str, mounts: &[(&str, &str, bool)]) -> Command {
    let volumes =
        mounts.iter().map(|(v, p, ro)| Mount { volume: v.to_string(), path: p.to_string(), read_only: *ro }).collect();
    Command::CreateSandbox {
        id: SandboxId::new(format!("sb-{name}")),
        name: name.into(),
        spec: SandboxSpec { volumes, ..spec() },
        providers: Default::default(),
        deadline: None,
    }
}

fn volume(w: &World, name: &str) -> Volume {
    w.store.volumes.get(name).cloned().unwrap_or_else(|| panic!("no volume {name}"))
}

fn delete(w: &mut World, name: &str) -> Result<Outcome, Error> {
    w.request(Command::DeleteVolume { name: name.into() }, None)
}

#[test]
fn a_mount_binds_the_sandbox_to_the_volume_it_found_and_the_run_makes_its_files() {
    let mut w = World::default();
    let Outcome::Volume(made) = make(&mut w, "data", "vol-1").unwrap() else { panic!("a volume") };
    assert_eq!((made.phase, made.resource_version), (VolumePhase::Ready, 1));
    assert_eq!(make(&mut w, "data", "vol-2").unwrap_err().code(), Code::AlreadyExists);

    w.request(mounting("app", &[("data", "/data", false), ("data", "/config", true)]), None).unwrap();
    let app = w.sandbox("app");
    assert_eq!(app.spec.labels.get(&label("data")), Some(&"vol-1".to_string()));
    let bound: Vec<(VolumeId, String, bool)> =
        mounts(&app.spec).into_iter().map(|(id, m)| (id, m.path.clone(), m.read_only)).collect();
    assert_eq!(
        bound,
        vec![(VolumeId::new("vol-1"), "/data".into(), false), (VolumeId::new("vol-1"), "/config".into(), true)]
    );
    // One write of the volume, however often it is mounted: what a racing delete conflicts on.
    assert_eq!(volume(&w, "data").resource_version, 2);
    assert!(w.volumes_kept.is_empty());
    w.run_all_effects();
    assert!(w.volumes_kept.contains(&VolumeId::new("vol-1")));
}

#[test]
fn a_mount_names_a_volume_that_is_there_and_not_being_deleted_at_a_clean_path() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    let unknown = w.request(mounting("app", &[("nope", "/data", false)]), None).unwrap_err();
    assert_eq!(unknown, Error::UnknownVolume { volume: "nope".into(), field: "spec.volumes[0].volume".into() });
    assert_eq!(unknown.code(), Code::FailedPrecondition);
    for (path, field) in [
        ("data", "spec.volumes[0].path"),
        ("/", "spec.volumes[0].path"),
        ("/a//b", "spec.volumes[0].path"),
        ("/a/../b", "spec.volumes[0].path"),
        ("/a/", "spec.volumes[0].path"),
        ("/workspace", "spec.volumes[0].path"),
        ("/proc/x", "spec.volumes[0].path"),
        ("/dev", "spec.volumes[0].path"),
    ] {
        let bad = w.request(mounting("app", &[("data", path, false)]), None).unwrap_err();
        assert!(matches!(&bad, Error::Invalid { field: f, .. } if f == field), "{path}: {bad}");
    }
    let twice = w.request(mounting("app", &[("data", "/a", false), ("data", "/a", true)]), None).unwrap_err();
    assert!(matches!(&twice, Error::Invalid { field, .. } if field == "spec.volumes[1].path"), "{twice}");
    let long = "v".repeat(51);
    let bad = w.request(mounting("app", &[(&long, "/a", false)]), None).unwrap_err();
    assert!(matches!(&bad, Error::Invalid { field, .. } if field == "spec.volumes[0].volume"), "{bad}");
    // Nothing of a refused create is written: the volume's version is its create's.
    assert!(w.store.by_name("app").is_none());
    assert_eq!(volume(&w, "data").resource_version, 1);

    delete(&mut w, "data").unwrap();
    let deleting = w.request(mounting("app", &[("data", "/data", false)]), None).unwrap_err();
    assert_eq!(deleting, Error::VolumeDeleting { volume: "data".into(), field: "spec.volumes[0].volume".into() });
}

#[test]
fn a_volume_is_not_deleted_under_a_sandbox_and_a_sandbox_being_deleted_never_blocks_it() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    w.request(mounting("a", &[("data", "/data", false)]), None).unwrap();
    w.request(mounting("b", &[("data", "/data", true)]), None).unwrap();
    w.run_all_effects();
    let refused = delete(&mut w, "data").unwrap_err();
    assert_eq!(refused, Error::VolumeInUse { volume: "data".into(), sandboxes: vec!["a".into(), "b".into()] });
    assert_eq!(refused.code(), Code::FailedPrecondition);

    // Both deletes asked for, their runs not yet removed: the volume's delete is taken at once,
    // its removal held until no record mounting it is left.
    w.delete("a").unwrap();
    w.delete("b").unwrap();
    let Outcome::Volume(deleting) = delete(&mut w, "data").unwrap() else { panic!("a volume") };
    assert_eq!(deleting.phase, VolumePhase::Deleting);
    assert!(!w.effects.iter().any(|e| matches!(e, Effect::RemoveVolume { .. })), "{:?}", w.effects);
    // A second delete changes nothing.
    let Outcome::Volume(again) = delete(&mut w, "data").unwrap() else { panic!("a volume") };
    assert_eq!(again.resource_version, deleting.resource_version);

    // The world's runtime asserts that nothing is removed under a container that mounts it.
    w.run_all_effects();
    assert!(w.store.by_name("a").is_none() && w.store.by_name("b").is_none());
    let remove = unfinished(&volume(&w, "data"), &[]).expect("owed its removal");
    assert_eq!(remove, Effect::RemoveVolume { volume: VolumeId::new("vol-1"), name: "data".into() });
    // A delete asked again now asks for the removal too, as a sweep does.
    delete(&mut w, "data").unwrap();
    assert_eq!(w.effects.back(), Some(&remove));
    w.run_all_effects();
    assert!(w.store.volumes.is_empty());
    assert!(w.volumes_kept.is_empty());
    // The name is free again, for a volume that shares nothing with the old one.
    make(&mut w, "data", "vol-2").unwrap();
}

#[test]
fn a_delete_of_an_unused_volume_asks_for_its_removal_in_the_same_decision() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    let request = Request::new(Command::DeleteVolume { name: "data".into() }, None);
    let decision = decide(&request, &w.store.reads(&request), w.now).unwrap();
    assert_eq!(decision.effects, vec![Effect::RemoveVolume { volume: VolumeId::new("vol-1"), name: "data".into() }]);
    // A stale version is refused with both.
    let stale = w.request(Command::DeleteVolume { name: "data".into() }, Some(7)).unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    // A removal's answer for a volume made again under the name changes nothing of the new one.
    delete(&mut w, "data").unwrap();
    w.run_all_effects();
    make(&mut w, "data", "vol-2").unwrap();
    let late = w.request(Command::VolumeRemoved { name: "data".into(), id: VolumeId::new("vol-1") }, None).unwrap();
    assert_eq!(late, Outcome::Removed, "the volume it was about is gone");
    assert_eq!((volume(&w, "data").id, volume(&w, "data").phase), (VolumeId::new("vol-2"), VolumePhase::Ready));
}

#[test]
fn a_delete_committed_between_a_creates_read_and_its_write_wins_and_the_create_is_refused() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    // The create reads the volume Ready and decides ...
    let create = Request::new(mounting("app", &[("data", "/data", false)]), None);
    let decided = decide(&create, &w.store.reads(&create), w.now).unwrap();
    // ... a delete, seeing no user yet, commits in between ...
    delete(&mut w, "data").unwrap();
    // ... so the create's write of the volume conflicts, and nothing of it is written.
    let conflict = w.store.commit(&decided.writes).unwrap_err();
    assert_eq!(conflict.key, Key::Volume("data".into()));
    assert!(w.store.by_name("app").is_none());
    let again = w.request(mounting("app", &[("data", "/data", false)]), None).unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
}

#[test]
fn a_create_committed_between_a_deletes_read_and_its_write_wins_and_the_delete_is_refused() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    // The delete reads no user and decides ...
    let request = Request::new(Command::DeleteVolume { name: "data".into() }, None);
    let decided = decide(&request, &w.store.reads(&request), w.now).unwrap();
    // ... a create that mounts the volume commits in between ...
    w.request(mounting("app", &[("data", "/data", false)]), None).unwrap();
    // ... so the delete's write conflicts: the volume is not removed under the new sandbox.
    let conflict = w.store.commit(&decided.writes).unwrap_err();
    assert_eq!(conflict.key, Key::Volume("data".into()));
    assert_eq!(volume(&w, "data").phase, VolumePhase::Ready);
    let again = delete(&mut w, "data").unwrap_err();
    assert_eq!(again, Error::VolumeInUse { volume: "data".into(), sandboxes: vec!["app".into()] });
}

#[test]
fn volumes_stay_with_the_sandbox_that_named_them() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    // A pool's members are made ahead of any claimant.
    let template = Command::CreateTemplate {
        name: "web".into(),
        spec: SandboxSpec {
            volumes: vec![Mount { volume: "data".into(), path: "/d".into(), read_only: false }],
            ..spec()
        },
        min_ready: 0,
    };
    let refused = w.request(template, None).unwrap_err();
    assert!(matches!(&refused, Error::Invalid { field, .. } if field == "spec.volumes"), "{refused}");
}

#[test]
fn a_user_whose_record_goes_between_a_deletes_read_and_its_write_makes_the_delete_ask_for_the_removal() {
    let mut w = World::default();
    make(&mut w, "data", "vol-1").unwrap();
    w.request(mounting("a", &[("data", "/data", false)]), None).unwrap();
    w.run_all_effects();
    w.delete("a").unwrap();
    // The volume's delete reads "a" still there, being deleted, and decides to wait for it ...
    let request = Request::new(Command::DeleteVolume { name: "data".into() }, None);
    let decided = decide(&request, &w.store.reads(&request), w.now).unwrap();
    assert!(decided.effects.is_empty(), "{:?}", decided.effects);
    // ... "a"'s record goes in between, its removal finding the volume not yet being deleted ...
    w.run_all_effects();
    assert!(w.store.by_name("a").is_none());
    // ... so the delete conflicts on "a", and decided again asks for the removal itself.
    let conflict = w.store.commit(&decided.writes).unwrap_err();
    assert_eq!(conflict.key, Key::Sandbox(SandboxId::new("sb-a")));
    delete(&mut w, "data").unwrap();
    assert_eq!(w.effects.back(), Some(&Effect::RemoveVolume { volume: VolumeId::new("vol-1"), name: "data".into() }));
    w.run_all_effects();
    assert!(w.store.volumes.is_empty() && w.volumes_kept.is_empty());
}
