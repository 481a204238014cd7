//! S2 for volumes (DESIGN 13.2, 16): a volume's files are never removed while a run of a
//! sandbox that mounts it is alive, and an acknowledged delete of one completes and leaves
//! nothing behind.
//!
//! The first is judged at each removal the runtime is asked for, against the runs the runtime
//! keeps; the second at the end of the quiet phase, against what the host keeps.

use berth_core::volume::mounts;
use berth_core::{Intent, Sandbox, SandboxId, Volume, VolumeId, VolumePhase};

/// The problem with removing volume `volume`'s files now, if a sandbox of `records` that
/// mounts it has a live run (`alive`).
pub fn removed_under_run(volume: &VolumeId, records: &[Sandbox], alive: impl Fn(&SandboxId) -> bool) -> Option<String> {
    let users: Vec<&str> = records
        .iter()
        .filter(|s| mounts(&s.spec).iter().any(|(id, _)| id == volume) && alive(&s.id))
        .map(|s| &*s.name)
        .collect();
    (!users.is_empty())
        .then(|| format!("volume {volume}'s files were removed while {} still ran with it mounted", users.join(", ")))
}

/// The problems after the quiet phase: a volume still being deleted, files the host keeps of
/// a volume without a record (`kept`), and a sandbox that is not being deleted bound to a
/// volume whose record is gone.
pub fn not_settled(volumes: &[Volume], records: &[Sandbox], kept: &[VolumeId]) -> Vec<String> {
    let mut problems = Vec::new();
    for v in volumes.iter().filter(|v| v.phase == VolumePhase::Deleting) {
        problems.push(format!("volume {} is still Deleting after the quiet phase", v.name));
    }
    for id in kept.iter().filter(|id| !volumes.iter().any(|v| v.id == **id)) {
        problems.push(format!("the host keeps the files of volume {id}, whose record is gone"));
    }
    for s in records.iter().filter(|s| s.intent != Intent::Deleted) {
        for (id, mount) in mounts(&s.spec) {
            if !volumes.iter().any(|v| v.id == id) {
                problems.push(format!("{} mounts volume {} ({id}), whose record is gone", s.name, mount.volume));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use berth_core::spec::Mount;
    use berth_core::volume::label;
    use berth_core::{Phase, Timestamp};

    use super::*;
    use crate::invariants::sandbox;

    fn volume(name: &str, phase: VolumePhase) -> Volume {
        let at = Timestamp::default();
        Volume {
            name: name.into(),
            id: VolumeId::new(format!("vol-{name}")),
            phase,
            resource_version: 1,
            created_at: at,
            updated_at: at,
        }
    }

    fn mounting(name: &str, intent: Intent, volume: &Volume) -> Sandbox {
        let mut s = sandbox(name, intent, Phase::Ready, 1);
        let spec = std::sync::Arc::make_mut(&mut s.spec);
        spec.volumes.push(Mount { volume: volume.name.clone(), path: "/data".into(), read_only: false });
        spec.labels.insert(label(&volume.name), volume.id.to_string());
        s
    }

    #[test]
    fn a_removal_under_a_live_run_fires_and_one_after_it_does_not() {
        let data = volume("data", VolumePhase::Deleting);
        let records = [mounting("a", Intent::Deleted, &data), mounting("b", Intent::Deleted, &data)];
        let alive_a = |id: &SandboxId| id.as_str() == "id-a";
        assert_eq!(
            removed_under_run(&data.id, &records, alive_a).as_deref(),
            Some("volume vol-data's files were removed while a still ran with it mounted")
        );
        assert_eq!(removed_under_run(&data.id, &records, |_| false), None);
        assert_eq!(removed_under_run(&VolumeId::new("vol-other"), &records, alive_a), None);
    }

    #[test]
    fn an_unfinished_delete_a_leak_or_a_user_left_without_its_volume_fires() {
        let data = volume("data", VolumePhase::Ready);
        let deleting = volume("old", VolumePhase::Deleting);
        let records = [
            mounting("a", Intent::Running, &data),
            mounting("gone", Intent::Deleted, &volume("x", VolumePhase::Ready)),
        ];
        assert!(not_settled(std::slice::from_ref(&data), &records, std::slice::from_ref(&data.id)).is_empty());
        assert_eq!(
            not_settled(&[deleting], &records, &[VolumeId::new("vol-leak")]),
            [
                "volume old is still Deleting after the quiet phase",
                "the host keeps the files of volume vol-leak, whose record is gone",
                "a mounts volume data (vol-data), whose record is gone",
            ]
        );
    }
}
