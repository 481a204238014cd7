//! Volumes (DESIGN 13.2): named files with a lifecycle of their own, mounted into sandboxes.
//!
//! A create that mounts a volume binds the sandbox to the volume's id with a label
//! ([`label`]), which is how a volume's users are found, and writes the volume too, so that a
//! delete and a create racing on one volume always conflict. A volume is not deleted while a
//! sandbox that is not being deleted mounts it (S2); one being deleted never blocks the delete
//! (the providers' rule, R2): the volume goes to Deleting at once, and the runtime is asked to
//! remove it once no sandbox record mounting it is left (a sandbox's record goes only once the
//! runtime removed its run), so nothing is removed under a run.

use crate::branch::{self, Branch};
use crate::decision::{Decision, Effect, Outcome, Write};
use crate::error::{Error, Kind};
use crate::id::VolumeId;
use crate::record::{Intent, Sandbox, Volume, VolumePhase};
use crate::request::{Reads, Request};
use crate::spec::{Mount, SandboxSpec};
use crate::time::Timestamp;

/// What every label binding a sandbox to a volume starts with.
pub const LABEL_PREFIX: &str = "berth.volume.";

/// The label that binds a sandbox to volume `name`: its value is the volume's id.
pub fn label(name: &str) -> String {
    format!("{LABEL_PREFIX}{name}")
}

/// The volumes the runs of a sandbox with `spec` mount, each with the id its create bound it to.
pub fn mounts(spec: &SandboxSpec) -> Vec<(VolumeId, &Mount)> {
    spec.volumes
        .iter()
        .filter_map(|m| spec.labels.get(&label(&m.volume)).map(|id| (VolumeId::new(id.as_str()), m)))
        .collect()
}

/// Whether `sandbox` keeps volume `id` from being deleted: it mounts it and is not being
/// deleted itself.
fn blocks(sandbox: &Sandbox, id: &VolumeId) -> bool {
    sandbox.intent != Intent::Deleted && mounts(&sandbox.spec).iter().any(|(bound, _)| bound == id)
}

/// The removal a Deleting volume is owed, once none of `users` (the sandbox records bound to
/// it, in any phase) is left.
pub fn unfinished(volume: &Volume, users: &[Sandbox]) -> Option<Effect> {
    let idle = crate::bug!(VolumeRemovedUnderRun)
        || !users.iter().any(|s| mounts(&s.spec).iter().any(|(bound, _)| *bound == volume.id));
    (volume.phase == VolumePhase::Deleting && idle)
        .then(|| Effect::RemoveVolume { volume: volume.id.clone(), name: volume.name.clone() })
}

/// [`unfinished`], for a volume whose last write is at least `min_age` old (a sweep's
/// re-drive, which leaves a removal still under way alone).
pub fn due(volume: &Volume, users: &[Sandbox], now: Timestamp, min_age: core::time::Duration) -> Option<Effect> {
    if volume.updated_at.plus(min_age) > now {
        return None;
    }
    unfinished(volume, users)
}

/// Whether a removal is still to be effected for `volume`, as stored now.
pub fn still_wanted(record: Option<&Volume>, effect: &Effect) -> bool {
    match (record, effect) {
        (Some(v), Effect::RemoveVolume { volume, .. }) => v.id != *volume || v.phase == VolumePhase::Deleting,
        // A removal confirmed already needs no second.
        (None, _) => false,
        (Some(_), _) => true,
    }
}

pub(crate) fn create(
    request: &Request,
    reads: &Reads,
    id: &VolumeId,
    name: &str,
    now: Timestamp,
) -> Result<Decision, Error> {
    request.check_create_version()?;
    if reads.volumes.contains_key(name) {
        return Err(Error::AlreadyExists { kind: Kind::Volume, name: name.to_string() });
    }
    branch::hit(Branch::VolumeCreate);
    let record = Volume {
        name: name.to_string(),
        id: id.clone(),
        phase: VolumePhase::Ready,
        resource_version: 1,
        created_at: now,
        updated_at: now,
    };
    Ok(Decision {
        writes: vec![Write::CreateVolume(record.clone())],
        effects: vec![],
        outcome: Outcome::Volume(record.into()),
    })
}

pub(crate) fn delete(request: &Request, reads: &Reads, name: &str, now: Timestamp) -> Result<Decision, Error> {
    let volume =
        reads.volumes.get(name).ok_or_else(|| Error::NotFound { kind: Kind::Volume, name: name.to_string() })?;
    request.check_version(volume.resource_version)?;
    if volume.phase == VolumePhase::Deleting {
        branch::hit(Branch::VolumeDeleteAgain);
        return Ok(Decision::unchanged(
            Outcome::Volume(volume.clone().into()),
            unfinished(volume, &reads.volume_users).into_iter().collect(),
        ));
    }
    let blocking: Vec<String> =
        reads.volume_users.iter().filter(|s| blocks(s, &volume.id)).map(|s| s.name.to_string()).collect();
    if !blocking.is_empty() {
        branch::hit(Branch::VolumeInUse);
        return Err(Error::VolumeInUse { volume: name.to_string(), sandboxes: blocking });
    }
    branch::hit(Branch::VolumeDelete);
    let (write, next) = bump(volume, Volume { phase: VolumePhase::Deleting, ..volume.clone() }, now);
    // Decided on these users being there: one whose record goes before this commits (and
    // which found the volume not yet being deleted) makes the decision again, so that the
    // removal is asked for by one of the two.
    let users =
        reads.volume_users.iter().map(|s| Write::CheckSandbox { id: s.id.clone(), expected: s.resource_version });
    Ok(Decision {
        writes: std::iter::once(write).chain(users).collect(),
        effects: unfinished(&next, &reads.volume_users).into_iter().collect(),
        outcome: Outcome::Volume(next.into()),
    })
}

/// The runtime's confirmation that nothing of volume `id` is left.
pub(crate) fn removed(reads: &Reads, name: &str, id: &VolumeId) -> Decision {
    match reads.volumes.get(name).filter(|v| v.id == *id) {
        Some(v) if v.phase == VolumePhase::Deleting => {
            branch::hit(Branch::VolumeRemoved);
            Decision {
                writes: vec![Write::RemoveVolume { name: v.name.clone(), expected: v.resource_version }],
                effects: vec![],
                outcome: Outcome::Removed,
            }
        }
        Some(v) => Decision::unchanged(Outcome::Volume(v.clone().into()), Vec::new()),
        None => Decision::gone(),
    }
}

/// What a create that mounts volumes adds: the labels that bind the new sandbox to them, and
/// the writes of the volumes that make a racing delete conflict. Every volume must be there,
/// and not being deleted.
pub(crate) fn mounting(spec: &mut SandboxSpec, reads: &Reads, now: Timestamp) -> Result<Vec<Write>, Error> {
    let mut writes: Vec<Write> = Vec::new();
    for (i, mount) in spec.volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}].volume");
        let volume = reads
            .volumes
            .get(&mount.volume)
            .ok_or_else(|| Error::UnknownVolume { volume: mount.volume.clone(), field: field.clone() })?;
        if volume.phase == VolumePhase::Deleting {
            branch::hit(Branch::VolumeMountDeleting);
            return Err(Error::VolumeDeleting { volume: mount.volume.clone(), field });
        }
        // One volume mounted at two paths is written once.
        if !writes.iter().any(|w| matches!(w, Write::UpdateVolume { record, .. } if record.id == volume.id)) {
            writes.push(bump(volume, volume.clone(), now).0);
        }
    }
    for write in &writes {
        if let Write::UpdateVolume { record, .. } = write {
            spec.labels.insert(label(&record.name), record.id.to_string());
        }
    }
    if !writes.is_empty() {
        branch::hit(Branch::VolumeMount);
    }
    Ok(writes)
}

fn bump(before: &Volume, mut next: Volume, now: Timestamp) -> (Write, Volume) {
    next.resource_version = before.resource_version + 1;
    next.updated_at = now;
    (Write::UpdateVolume { record: next.clone(), expected: before.resource_version }, next)
}
