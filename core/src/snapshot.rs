//! Snapshots and forks (DESIGN 12.2, 12.3).
//!
//! A snapshot is asked for (Creating, with the copy as an effect), confirmed by the runtime's
//! answer (Ready, or Error), and removed in two steps like a sandbox (Deleting, then the
//! record goes once the runtime confirms that nothing of it is left). Sandboxes made from it
//! carry [`SNAPSHOT_LABEL`] and a [`Seed`]; the snapshot cannot be deleted while one of them
//! still needs its files (S2), and every create from it writes the snapshot too, so that a
//! delete and a create racing on one snapshot always conflict.
//!
//! A fork is a snapshot that names the sandboxes to be made from it: they are all written in
//! the one transaction that confirms the copy, or none are (S4). The fork's snapshot goes once
//! no fork needs it ([`spent_fork`]).

use std::collections::BTreeMap;

use crate::branch::{self, Branch};
use crate::decision::{Decision, Effect, Outcome, Write};
use crate::error::{Error, Kind};
use crate::id::{SandboxId, SnapshotId};
use crate::lifetime::{self, Renewal};
use crate::phase::PhaseKind;
use crate::record::{Content, Fork, Intent, Sandbox, Seed, Snapshot, SnapshotPhase, SnapshotSource};
use crate::request::{Reads, Request};
use crate::spec::SandboxSpec;
use crate::time::Timestamp;
use crate::validate::{self, Limits};

/// The label every sandbox made from a snapshot carries: the snapshot's name.
pub const SNAPSHOT_LABEL: &str = "berth.snapshot";
/// The label every fork carries: the name of the sandbox it was forked from.
pub const FORK_LABEL: &str = "berth.fork-of";
/// The most sandboxes one fork makes.
pub const MAX_FORKS: usize = 100;

/// Whether `sandbox` still needs snapshot `id`'s files: it was made from it, none of its runs
/// has started (its driver copies the files before the first), and it is not being deleted.
pub fn needs(sandbox: &Sandbox, id: &SnapshotId) -> bool {
    sandbox.seed.as_ref().is_some_and(|s| s.id == *id && !s.seeded) && sandbox.intent != Intent::Deleted
}

/// Marks a seeded sandbox as such once one of its runs has started. Part of every merge.
pub(crate) fn seeded(record: &mut Sandbox) {
    if let Some(seed) = &mut record.seed
        && !seed.seeded
        && !matches!(record.run, crate::record::Run::Pending)
    {
        branch::hit(Branch::SnapshotSeeded);
        seed.seeded = true;
    }
}

/// The effect that finishes a snapshot's unconfirmed step, if it has one (DESIGN 3.6).
pub fn unfinished(snapshot: &Snapshot) -> Option<Effect> {
    match snapshot.phase {
        SnapshotPhase::Creating => Some(Effect::Snapshot {
            snapshot: snapshot.id.clone(),
            name: snapshot.name.clone(),
            sandbox: snapshot.source.id.clone(),
        }),
        SnapshotPhase::Deleting => {
            Some(Effect::RemoveSnapshot { snapshot: snapshot.id.clone(), name: snapshot.name.clone() })
        }
        SnapshotPhase::Ready | SnapshotPhase::Error(_) => None,
    }
}

/// [`unfinished`], for a snapshot whose last write is at least `min_age` old (a sweep's
/// re-drive, which leaves an effect still under way alone).
pub fn due(snapshot: &Snapshot, now: Timestamp, min_age: core::time::Duration) -> Option<Effect> {
    if snapshot.updated_at.plus(min_age) > now {
        return None;
    }
    unfinished(snapshot)
}

/// Whether a fork's snapshot has done its work and is to go: its copy failed, or it is Ready
/// and none of `users` (the sandboxes carrying its label) needs it any more.
pub fn spent_fork(snapshot: &Snapshot, users: &[Sandbox]) -> bool {
    snapshot.fork.is_some()
        && match snapshot.phase {
            SnapshotPhase::Error(_) => true,
            SnapshotPhase::Ready => !users.iter().any(|s| needs(s, &snapshot.id)),
            SnapshotPhase::Creating | SnapshotPhase::Deleting => false,
        }
}

/// Whether a snapshot is still to be effected for `snapshot`, as stored now.
pub fn still_wanted(record: Option<&Snapshot>, effect: &Effect) -> bool {
    match (record, effect) {
        (Some(s), Effect::Snapshot { snapshot, .. }) => s.id == *snapshot && s.phase == SnapshotPhase::Creating,
        (Some(s), Effect::RemoveSnapshot { snapshot, .. }) => s.id != *snapshot || s.phase == SnapshotPhase::Deleting,
        // A removal confirmed already needs no second; nor does a copy of nothing wanted.
        (None, _) => false,
        (Some(_), _) => true,
    }
}

fn existing<'a>(request: &Request, reads: &'a Reads, name: &str) -> Result<&'a Snapshot, Error> {
    let snapshot =
        reads.snapshot.as_ref().ok_or_else(|| Error::NotFound { kind: Kind::Snapshot, name: name.to_string() })?;
    request.check_version(snapshot.resource_version)?;
    Ok(snapshot)
}

/// A sandbox whose files can be copied as they are: Ready (frozen for the copy), Paused or
/// Stopped. Anything between two of those has no one consistent point to copy.
fn copyable(sandbox: &Sandbox, action: &'static str) -> Result<(), Error> {
    let settled = matches!(sandbox.phase.kind(), PhaseKind::Ready | PhaseKind::Paused | PhaseKind::Stopped);
    if !settled || sandbox.intent == Intent::Deleted {
        branch::hit(Branch::SnapshotSourceUnsettled);
        return Err(Error::WrongPhase { sandbox: sandbox.name.to_string(), action, phase: sandbox.phase.kind() });
    }
    Ok(())
}

fn within_quota(snapshots: &[Snapshot], limits: &Limits) -> Result<(), Error> {
    if snapshots.len() as u64 >= u64::from(limits.max_snapshots) {
        branch::hit(Branch::SnapshotQuota);
        return Err(Error::Quota {
            what: "snapshots",
            limit: u64::from(limits.max_snapshots),
            flag: "--max-snapshots",
        });
    }
    let bytes: u64 = snapshots.iter().filter_map(|s| s.content.as_ref()).map(|c| c.size_bytes).sum();
    if bytes >= limits.max_snapshot_bytes {
        branch::hit(Branch::SnapshotQuota);
        return Err(Error::Quota {
            what: "bytes of snapshots",
            limit: limits.max_snapshot_bytes,
            flag: "--max-snapshot-bytes",
        });
    }
    Ok(())
}

/// A new snapshot record of `sandbox`, being taken.
fn taking(sandbox: &Sandbox, id: &SnapshotId, name: &str, fork: Option<Fork>, now: Timestamp) -> Decision {
    let mut spec = SandboxSpec::clone(&sandbox.spec);
    // Berth's own labels say what the source is (a pool member, a fork): not what is made from it.
    spec.labels.retain(|k, _| !k.starts_with(validate::RESERVED_LABEL_PREFIX));
    // A snapshot copies the workspace, not volumes: what is made from it mounts none.
    spec.volumes.clear();
    let record = Snapshot {
        name: name.to_string(),
        id: id.clone(),
        source: SnapshotSource {
            id: sandbox.id.clone(),
            name: sandbox.name.to_string(),
            generation: sandbox.generation,
        },
        spec,
        phase: SnapshotPhase::Creating,
        content: None,
        fork,
        resource_version: 1,
        created_at: now,
        updated_at: now,
    };
    Decision {
        writes: vec![
            Write::CreateSnapshot(record.clone()),
            // Decided on this version of the source: a stop or delete committed meanwhile
            // makes the decision again.
            Write::CheckSandbox { id: sandbox.id.clone(), expected: sandbox.resource_version },
        ],
        effects: vec![unfinished(&record).expect("a new snapshot is being taken")],
        outcome: Outcome::Snapshot(record.into()),
    }
}

pub(crate) fn create(
    request: &Request,
    reads: &Reads,
    id: &SnapshotId,
    name: &str,
    now: Timestamp,
) -> Result<Decision, Error> {
    request.check_create_version()?;
    let source = request.plan().sandbox.map(|s| s.name).unwrap_or_default();
    let sandbox =
        reads.sandbox.as_ref().ok_or_else(|| Error::NotFound { kind: Kind::Sandbox, name: source.to_string() })?;
    if reads.snapshot.is_some() {
        return Err(Error::AlreadyExists { kind: Kind::Snapshot, name: name.to_string() });
    }
    copyable(sandbox, "snapshot")?;
    within_quota(&reads.snapshots, &reads.limits)?;
    branch::hit(Branch::SnapshotCreate);
    Ok(taking(sandbox, id, name, None, now))
}

/// The fork's sandboxes must have distinct, free names, none the source's.
fn check_forks(source: &str, forks: &[(SandboxId, String)], reads: &Reads) -> Result<(), Error> {
    if forks.is_empty() || forks.len() > MAX_FORKS {
        return Err(Error::invalid("count", format!("must be 1 to {MAX_FORKS}, got {}", forks.len())));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (_, name) in forks {
        validate::dns_label("names", name)?;
        if name == source || !seen.insert(name.as_str()) {
            return Err(Error::invalid("names", format!("'{name}' is given twice, or is the source's own")));
        }
    }
    if let Some(taken) = reads.names_taken.iter().next() {
        return Err(Error::AlreadyExists { kind: Kind::Sandbox, name: taken.clone() });
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Error> {
    for (key, value) in labels {
        validate::user_label("labels", key, value)?;
    }
    Ok(())
}

pub(crate) struct Forking<'a> {
    pub snapshot: &'a SnapshotId,
    pub snapshot_name: &'a str,
    pub forks: &'a [(SandboxId, String)],
    pub labels: &'a BTreeMap<String, String>,
}

pub(crate) fn fork(request: &Request, reads: &Reads, forking: Forking<'_>, now: Timestamp) -> Result<Decision, Error> {
    let Forking { snapshot, snapshot_name, forks, labels } = forking;
    check_labels(labels)?;
    let source = request.plan().sandbox.map(|s| s.name).unwrap_or_default();
    check_forks(source, forks, reads)?;
    let sandbox =
        reads.sandbox.as_ref().ok_or_else(|| Error::NotFound { kind: Kind::Sandbox, name: source.to_string() })?;
    request.check_version(sandbox.resource_version)?;
    if reads.snapshot.is_some() {
        return Err(Error::AlreadyExists { kind: Kind::Snapshot, name: snapshot_name.to_string() });
    }
    copyable(sandbox, "fork")?;
    within_quota(&reads.snapshots, &reads.limits)?;
    // Its forks get the source's lifetime: refused now if the gateway's bounds no longer allow it.
    lifetime::deadline(Renewal::SpecTtl, &sandbox.spec.lifetime, now, &reads.limits, "spec.lifetime.ttl_ms")?;
    branch::hit(Branch::ForkCreate);
    let fork = Fork { sandboxes: forks.to_vec(), labels: labels.clone() };
    Ok(taking(sandbox, snapshot, snapshot_name, Some(fork), now))
}

pub(crate) fn delete(request: &Request, reads: &Reads, name: &str, now: Timestamp) -> Result<Decision, Error> {
    let snapshot = existing(request, reads, name)?;
    if snapshot.phase == SnapshotPhase::Deleting {
        branch::hit(Branch::SnapshotDeleteAgain);
        return Ok(as_is(snapshot));
    }
    let users: Vec<String> =
        reads.snapshot_users.iter().filter(|s| needs(s, &snapshot.id)).map(|s| s.name.to_string()).collect();
    if !users.is_empty() && !crate::bug!(SnapshotDeletedUnderSeed) {
        branch::hit(Branch::SnapshotInUse);
        return Err(Error::SnapshotInUse { snapshot: name.to_string(), sandboxes: users });
    }
    branch::hit(Branch::SnapshotDelete);
    let next = Snapshot { phase: SnapshotPhase::Deleting, ..snapshot.clone() };
    Ok(update(snapshot, next, unfinished, now))
}

/// The runtime's answer to a copy: the snapshot Ready (a fork's sandboxes made with it, all of
/// them or, if one cannot be, none and the fork fails), or Error.
pub(crate) fn taken(
    reads: &Reads,
    id: &SnapshotId,
    result: &Result<Content, String>,
    now: Timestamp,
) -> Result<Decision, Error> {
    let Some(snapshot) = reads.snapshot.as_ref().filter(|s| s.id == *id) else {
        branch::hit(Branch::SnapshotGone);
        return Ok(Decision::gone());
    };
    if snapshot.phase != SnapshotPhase::Creating {
        branch::hit(Branch::SnapshotTakenLate);
        return Ok(as_is(snapshot));
    }
    let content = match result {
        Ok(content) => content,
        Err(message) => {
            branch::hit(Branch::SnapshotFailed);
            let next = Snapshot { phase: SnapshotPhase::Error(message.clone()), ..snapshot.clone() };
            return Ok(update(snapshot, next, |_| None, now));
        }
    };
    let ready = Snapshot { phase: SnapshotPhase::Ready, content: Some(content.clone()), ..snapshot.clone() };
    let Some(fork) = &snapshot.fork else {
        branch::hit(Branch::SnapshotReady);
        return Ok(update(snapshot, ready, |_| None, now));
    };
    if let Some(taken) = reads.names_taken.iter().next() {
        branch::hit(Branch::ForkNameTaken);
        let failed = format!("the fork cannot make sandbox '{taken}': the name was taken meanwhile");
        let next = Snapshot { phase: SnapshotPhase::Error(failed), ..ready };
        return Ok(update(snapshot, next, |_| None, now));
    }
    // The bound may have changed since the fork was asked for: what cannot be made fails the
    // fork, and nothing of it is made.
    let deadline =
        match lifetime::deadline(Renewal::SpecTtl, &snapshot.spec.lifetime, now, &reads.limits, "spec.lifetime.ttl_ms")
        {
            Ok(deadline) => deadline,
            Err(e) => {
                branch::hit(Branch::SnapshotFailed);
                let next = Snapshot {
                    phase: SnapshotPhase::Error(format!("the fork cannot make its sandboxes: {e}")),
                    ..ready
                };
                return Ok(update(snapshot, next, |_| None, now));
            }
        };
    let made = if crate::bug!(ForkHalfMade) { fork.sandboxes.len().div_ceil(2) } else { fork.sandboxes.len() };
    let mut records: Vec<Sandbox> = fork
        .sandboxes
        .iter()
        .take(made)
        .map(|(id, name)| {
            let seed = Seed { snapshot: snapshot.name.clone(), id: snapshot.id.clone(), seeded: false };
            let mut spec = snapshot.spec.clone();
            spec.labels.extend(fork.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            spec.labels.insert(FORK_LABEL.to_string(), snapshot.source.name.clone());
            label(&mut spec, &seed);
            Sandbox {
                deadline,
                active_at: lifetime::clock_from(&spec.lifetime, now),
                seed: Some(seed),
                ..Sandbox::new(id.clone(), name, spec, now)
            }
        })
        .collect();
    let placements = match crate::placement::place_each(&reads.nodes, &records) {
        Ok(placements) => placements,
        Err((sandbox, why)) => {
            branch::hit(Branch::SnapshotFailed);
            let failed = why.error(&sandbox.name);
            let next = Snapshot {
                phase: SnapshotPhase::Error(format!("the fork cannot make its sandboxes: {failed}")),
                ..ready
            };
            return Ok(update(snapshot, next, |_| None, now));
        }
    };
    branch::hit(Branch::ForkMade);
    let mut decision = update(snapshot, ready, |_| None, now);
    for (record, placement) in records.iter_mut().zip(placements) {
        record.placement = Some(placement);
        decision.effects.push(Effect::Start { sandbox: record.id.clone(), generation: 1 });
    }
    decision.writes.extend(records.into_iter().map(Write::CreateSandbox));
    Ok(decision)
}

pub(crate) fn removed(reads: &Reads, id: &SnapshotId) -> Decision {
    match reads.snapshot.as_ref().filter(|s| s.id == *id) {
        Some(s) if s.phase == SnapshotPhase::Deleting => {
            branch::hit(Branch::SnapshotRemoved);
            Decision {
                writes: vec![Write::RemoveSnapshot { name: s.name.clone(), expected: s.resource_version }],
                effects: vec![],
                outcome: Outcome::Removed,
            }
        }
        Some(s) => as_is(s),
        None => Decision::gone(),
    }
}

/// What a create from snapshot `name` starts with: the snapshot's spec with `labels` added, the
/// seed that names the snapshot, and the write of the snapshot that makes a racing delete
/// conflict.
pub(crate) fn seeding(
    reads: &Reads,
    name: &str,
    labels: &BTreeMap<String, String>,
    now: Timestamp,
) -> Result<(SandboxSpec, Seed, Write), Error> {
    check_labels(labels)?;
    let snapshot =
        reads.snapshot.as_ref().ok_or_else(|| Error::NotFound { kind: Kind::Snapshot, name: name.to_string() })?;
    if snapshot.phase != SnapshotPhase::Ready {
        branch::hit(Branch::SnapshotNotReady);
        return Err(Error::SnapshotPhase {
            snapshot: name.to_string(),
            action: "create a sandbox from",
            phase: snapshot.phase.name(),
        });
    }
    branch::hit(Branch::SnapshotSeeds);
    let seed = Seed { snapshot: snapshot.name.clone(), id: snapshot.id.clone(), seeded: false };
    let (touch, _) = bump(snapshot, snapshot.clone(), now);
    let mut spec = snapshot.spec.clone();
    spec.labels.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok((spec, seed, touch))
}

/// Labels a new sandbox's spec with the snapshot it is made from, once the spec the user could
/// shape is checked: the label is Berth's own.
pub(crate) fn label(spec: &mut SandboxSpec, seed: &Seed) {
    spec.labels.insert(SNAPSHOT_LABEL.to_string(), seed.snapshot.clone());
}

fn as_is(snapshot: &Snapshot) -> Decision {
    Decision::unchanged(Outcome::Snapshot(Box::new(snapshot.clone())), Vec::new())
}

fn bump(before: &Snapshot, mut next: Snapshot, now: Timestamp) -> (Write, Snapshot) {
    next.resource_version = before.resource_version + 1;
    next.updated_at = now;
    (Write::UpdateSnapshot { record: next.clone(), expected: before.resource_version }, next)
}

/// The write of `next` over `before`, with the effect `effect` asks of the new version.
fn update(before: &Snapshot, next: Snapshot, effect: fn(&Snapshot) -> Option<Effect>, now: Timestamp) -> Decision {
    let (write, next) = bump(before, next, now);
    Decision {
        writes: vec![write],
        effects: effect(&next).into_iter().collect(),
        outcome: Outcome::Snapshot(next.into()),
    }
}
