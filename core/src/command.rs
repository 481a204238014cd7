//! API commands (DESIGN 3.2): each is decided against what the executor read, as one
//! conditional transaction plus driver effects.
//!
//! Expected versions: a command carrying `expected_version` is checked against the record read,
//! and a mismatch gives ABORTED with both versions before anything is written. The executor
//! re-reads and re-decides after a conflicting write ([`crate::cas`]), so a client-supplied
//! version that went stale in between fails the same way, while a server-owned command re-decides
//! on the fresh record.

use std::collections::BTreeSet;

use crate::branch::{self, Branch};
use crate::decision::{Decision, Effect, Outcome, Write, touch_provider, update_sandbox};
use crate::error::{Error, Kind};
use crate::id::SandboxId;
use crate::lifetime::{self, OnExpiry, Renewal};
use crate::phase::{Hold, Phase, PhaseKind};
use crate::record::{ExitFence, Intent, Provider, Run, Sandbox, Seed};
use crate::request::{Command, Reads, Request};
use crate::restart::{self, Restarts};
use crate::spec::SandboxSpec;
use crate::time::Timestamp;
use crate::{placement, provider, snapshot, template, validate, volume};

/// Decides `request` against `reads` at gateway time `now`.
pub fn decide(request: &Request, reads: &Reads, now: Timestamp) -> Result<Decision, Error> {
    request.plan().validate_names()?;
    match &request.command {
        Command::CreateSandbox { id, name, spec, providers, deadline } => {
            create_sandbox(request, reads, Created { id, name, spec, providers, deadline: *deadline, seed: None }, now)
        }
        Command::CreateFromSnapshot { id, name, snapshot, labels, providers, deadline } => {
            let (spec, seed, touch) = snapshot::seeding(reads, snapshot, labels, now)?;
            let created = Created { id, name, spec: &spec, providers, deadline: *deadline, seed: Some(seed) };
            let mut decision = create_sandbox(request, reads, created, now)?;
            decision.writes.push(touch);
            Ok(decision)
        }
        Command::CreateSnapshot { id, name, .. } => snapshot::create(request, reads, id, name, now),
        Command::DeleteSnapshot { name } => snapshot::delete(request, reads, name, now),
        Command::SnapshotTaken { id, result, .. } => snapshot::taken(reads, id, result, now),
        Command::SnapshotRemoved { id, .. } => Ok(snapshot::removed(reads, id)),
        Command::CreateVolume { id, name } => volume::create(request, reads, id, name, now),
        Command::DeleteVolume { name } => volume::delete(request, reads, name, now),
        Command::VolumeRemoved { name, id } => Ok(volume::removed(reads, name, id)),
        Command::ForkSandbox { snapshot, snapshot_name, forks, labels, .. } => {
            let forking = snapshot::Forking { snapshot, snapshot_name, forks, labels };
            snapshot::fork(request, reads, forking, now)
        }
        Command::StopSandbox { .. } => {
            let sandbox = existing(request, reads)?;
            stop(sandbox, now)
        }
        Command::StartSandbox { .. } => {
            let sandbox = existing(request, reads)?;
            start(sandbox, reads, now)
        }
        Command::RenewSandbox { renewal, .. } => {
            let sandbox = existing(request, reads)?;
            renew(sandbox, *renewal, &reads.limits, now)
        }
        Command::ExpireSandbox { deadline, .. } => match &reads.sandbox {
            Some(sandbox) => expire(sandbox, *deadline, now),
            None => Ok(gone()),
        },
        Command::ExpireIdle { since, .. } => match &reads.sandbox {
            Some(sandbox) => expire_idle(sandbox, *since, reads.open_execs, now),
            None => Ok(gone()),
        },
        Command::TouchSandbox { id, .. } => match &reads.sandbox {
            Some(sandbox) if sandbox.id == *id => Ok(touch(sandbox, now)),
            _ => Ok(gone()),
        },
        Command::RestartSandbox { .. } => match &reads.sandbox {
            Some(sandbox) => restart(sandbox, reads, now),
            None => Ok(gone()),
        },
        Command::DeleteSandbox { .. } => {
            let sandbox = existing(request, reads)?;
            delete(sandbox, now)
        }
        Command::PauseSandbox { hold, .. } => {
            let sandbox = existing(request, reads)?;
            pause(sandbox, *hold, now)
        }
        Command::ResumeSandbox { .. } => {
            let sandbox = existing(request, reads)?;
            resume(sandbox, now)
        }
        Command::AttachProvider { provider, .. } => {
            let sandbox = existing(request, reads)?;
            attach(sandbox, provider, reads, now)
        }
        Command::DetachProvider { provider, .. } => {
            let sandbox = existing(request, reads)?;
            detach(sandbox, provider, now)
        }
        Command::CreateProvider { name, kind, credentials, endpoints } => {
            provider::create(request, reads, name, kind, credentials, endpoints, now)
        }
        Command::DeleteProvider { name } => provider::delete(request, reads, name),
        Command::CreateTemplate { name, spec, min_ready } => {
            request.check_create_version()?;
            template::create(reads, name, spec, *min_ready, now)
        }
        Command::SetPool { template, min_ready } => template::set_pool(request, reads, template, *min_ready, now),
        Command::DeleteTemplate { name } => template::delete(request, reads, name),
        Command::FillPool { id, name, .. } => template::fill(reads, id, name, now),
        Command::ClaimSandbox { template, labels, providers } => {
            if request.expected_version.is_some() {
                return Err(Error::invalid(
                    "expected_resource_version",
                    "a claim takes whichever member is Ready: it names no version",
                ));
            }
            template::claim(reads, template, labels, providers, now)
        }
    }
}

/// The sandbox a command is about, with the client's version checked first: a stale version is
/// ABORTED whatever the phase (I4).
/// A server-owned command's decision when its record is gone: nothing to do.
fn gone() -> Decision {
    branch::hit(Branch::CommandRecordGone);
    Decision::gone()
}

fn existing<'a>(request: &Request, reads: &'a Reads) -> Result<&'a Sandbox, Error> {
    let name = request.plan().sandbox.map(|s| s.name).unwrap_or_default();
    let sandbox =
        reads.sandbox.as_ref().ok_or_else(|| Error::NotFound { kind: Kind::Sandbox, name: name.to_string() })?;
    request.check_version(sandbox.resource_version)?;
    Ok(sandbox)
}

fn wrong_phase(sandbox: &Sandbox, action: &'static str) -> Error {
    Error::WrongPhase { sandbox: sandbox.name.to_string(), action, phase: sandbox.phase.kind() }
}

fn commit(before: &Sandbox, next: Sandbox, extra: Vec<Write>, effects: Vec<Effect>, now: Timestamp) -> Decision {
    let (write, next) = update_sandbox(before, next, now);
    let mut writes = vec![write];
    writes.extend(extra);
    Decision { writes, effects, outcome: Outcome::Sandbox(next.into()) }
}

/// What a create names.
struct Created<'a> {
    id: &'a SandboxId,
    name: &'a str,
    spec: &'a SandboxSpec,
    providers: &'a BTreeSet<String>,
    deadline: Option<Timestamp>,
    seed: Option<Seed>,
}

fn create_sandbox(request: &Request, reads: &Reads, created: Created<'_>, now: Timestamp) -> Result<Decision, Error> {
    let Created { id, name, spec, providers, deadline, seed } = created;
    validate::spec(spec)?;
    validate::provider_names("providers", providers)?;
    lifetime::validate(&spec.lifetime, &reads.limits)?;
    restart::validate(&spec.restart)?;
    let renewal = deadline.map_or(Renewal::SpecTtl, Renewal::Deadline);
    let deadline = lifetime::deadline(renewal, &spec.lifetime, now, &reads.limits, "deadline_unix_ms")?;
    request.check_create_version()?;
    if reads.sandbox.is_some() {
        return Err(Error::AlreadyExists { kind: Kind::Sandbox, name: name.to_string() });
    }
    let attached = provider::resolve(providers, reads, "providers")?;
    provider::check_credentials(spec, &attached)?;
    let providers = std::sync::Arc::new(providers.clone());
    let mut spec = spec.clone();
    if let Some(seed) = &seed {
        snapshot::label(&mut spec, seed);
    }
    let mounted = volume::mounting(&mut spec, reads, now)?;
    let placement =
        placement::place(&reads.nodes, &spec.limits, &spec.node_selector, id).map_err(|why| why.error(name))?;
    let record = Sandbox {
        placement: Some(placement),
        egress_providers: providers.clone(),
        providers,
        deadline,
        active_at: lifetime::clock_from(&spec.lifetime, now),
        seed,
        ..Sandbox::new(id.clone(), name, spec, now)
    };
    let mut writes = vec![Write::CreateSandbox(record.clone())];
    writes.extend(attached.iter().map(|p| touch_provider(p, now)));
    writes.extend(mounted);
    Ok(Decision {
        writes,
        effects: vec![Effect::Start { sandbox: id.clone(), generation: 1 }],
        outcome: Outcome::Sandbox(record.into()),
    })
}

fn stop(sandbox: &Sandbox, now: Timestamp) -> Result<Decision, Error> {
    Ok(match stopping(sandbox)? {
        Some((next, effects)) => commit(sandbox, next, vec![], effects, now),
        None => Decision::sandbox_as_is(sandbox),
    })
}

/// What a stop changes, if anything: `None` when the sandbox is already stopped or stopping.
fn stopping(sandbox: &Sandbox) -> Result<Option<(Sandbox, Vec<Effect>)>, Error> {
    let mut next = sandbox.clone();
    next.restarts.next_at = None;
    if sandbox.completed() {
        branch::hit(Branch::StopCompleted);
        // Nothing runs, but the intent is still Running: a stop says it should stay stopped.
        next.intent = Intent::Stopped;
        return Ok(Some((next, vec![])));
    }
    match sandbox.phase.kind() {
        PhaseKind::Stopping | PhaseKind::Stopped => {
            branch::hit(Branch::StopAlreadyStopped);
            Ok(None)
        }
        PhaseKind::Deleting => {
            branch::hit(Branch::StopDeleting);
            Err(wrong_phase(sandbox, "stop"))
        }
        PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused | PhaseKind::Error => {
            branch::hit(Branch::StopRun);
            next.phase = Phase::Stopping;
            next.intent = Intent::Stopped;
            let effect = Effect::Stop { sandbox: sandbox.id.clone(), generation: sandbox.generation };
            Ok(Some((next, vec![effect])))
        }
    }
}

fn start(sandbox: &Sandbox, reads: &Reads, now: Timestamp) -> Result<Decision, Error> {
    // A pause under way is as good as done: a start refuses it as it refuses Paused (a resume
    // thaws it).
    if sandbox.intent == Intent::Paused {
        branch::hit(Branch::StartWhileStopping);
        return Err(Error::WrongPhase { sandbox: sandbox.name.to_string(), action: "start", phase: PhaseKind::Paused });
    }
    match sandbox.phase.kind() {
        PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready => {
            branch::hit(Branch::StartAlreadyRunning);
            Ok(Decision::sandbox_as_is(sandbox))
        }
        // A stop that has not finished has no exit marker to fence the new generation with; a
        // paused run is alive (a resume thaws it).
        PhaseKind::Paused | PhaseKind::Stopping | PhaseKind::Deleting => {
            branch::hit(Branch::StartWhileStopping);
            Err(wrong_phase(sandbox, "start"))
        }
        PhaseKind::Stopped | PhaseKind::Error => {
            // A start renews a TTL; an absolute deadline that has passed must be renewed first.
            let deadline = match lifetime::deadline(
                Renewal::SpecTtl,
                &sandbox.spec.lifetime,
                now,
                &reads.limits,
                "spec.lifetime.ttl_ms",
            )? {
                Some(renewed) => Some(renewed),
                None if sandbox.deadline.is_some_and(|d| d <= now) => {
                    branch::hit(Branch::StartPastDeadline);
                    return Err(Error::Expired { sandbox: sandbox.name.to_string(), action: "starting" });
                }
                None => sandbox.deadline,
            };
            let (mut next, effect) = new_generation(sandbox, &reads.nodes)?;
            branch::hit(Branch::StartNewGeneration);
            next.deadline = deadline;
            next.expired_at = None;
            next.active_at = lifetime::clock_from(&sandbox.spec.lifetime, now);
            next.idle_expired_at = None;
            next.restarts = Restarts::default();
            Ok(commit(sandbox, next, vec![], vec![effect], now))
        }
    }
}

/// The scheduled restart of a policy (DESIGN 9.2), if it is still due: a new generation,
/// written as a Start writes one.
fn restart(sandbox: &Sandbox, reads: &Reads, now: Timestamp) -> Result<Decision, Error> {
    if !restart::due(sandbox, now) {
        branch::hit(Branch::RestartNotDue);
        return Ok(Decision::sandbox_as_is(sandbox));
    }
    let (mut next, effect) = new_generation(sandbox, &reads.nodes)?;
    branch::hit(Branch::RestartNewGeneration);
    let at = sandbox.restarts.next_at.unwrap_or(now);
    next.restarts = Restarts { count: sandbox.restarts.count.saturating_add(1), next_at: None };
    Ok(commit(sandbox, next, vec![not_before(at)], vec![effect], now))
}

/// DESIGN 9.1: the lease holder's expiry of `deadline`, if the record still has it and it has
/// passed; as the spec says, a stop or a delete.
fn expire(sandbox: &Sandbox, deadline: Timestamp, now: Timestamp) -> Result<Decision, Error> {
    if !lifetime::due(sandbox, deadline, now) {
        branch::hit(Branch::ExpireNotDue);
        return Ok(Decision::sandbox_as_is(sandbox));
    }
    let (mut next, effects) = expiring(sandbox, sandbox.spec.lifetime.on_expiry)?;
    next.expired_at = Some(now);
    Ok(commit(sandbox, next, vec![not_before(deadline)], effects, now))
}

/// DESIGN 9.1: the lease holder's idle expiry counting from `since`, if the sandbox has been
/// idle that long since and no exec is open; as the spec says, a stop or a delete.
fn expire_idle(sandbox: &Sandbox, since: Timestamp, open_execs: usize, now: Timestamp) -> Result<Decision, Error> {
    if !lifetime::idle_due(sandbox, since, open_execs, now) {
        branch::hit(Branch::ExpireIdleNotDue);
        return Ok(Decision::sandbox_as_is(sandbox));
    }
    let (mut next, effects) = expiring(sandbox, sandbox.spec.lifetime.idle_action())?;
    next.idle_expired_at = Some(now);
    let idle = sandbox.spec.lifetime.idle_timeout.map_or(since, |timeout| since.plus(timeout));
    Ok(commit(sandbox, next, vec![not_before(idle)], effects, now))
}

/// A rule that time alone justifies (an expiry, a policy's restart after its backoff) holds
/// only once the store's clock, not only the deciding gateway's, reached that time.
fn not_before(at: Timestamp) -> Write {
    match crate::bug!(ExpiresOnOwnClock) {
        true => Write::NotBefore(Timestamp::from_unix_millis(0)),
        false => Write::NotBefore(at),
    }
}

/// What either expiry does: a stop, a delete or a pause as the spec says, with no restart
/// after it.
fn expiring(sandbox: &Sandbox, action: OnExpiry) -> Result<(Sandbox, Vec<Effect>), Error> {
    let (mut next, effects) = match action {
        OnExpiry::Stop => {
            branch::hit(Branch::ExpireStops);
            stopping(sandbox)?.unwrap_or_else(|| (sandbox.clone(), vec![]))
        }
        OnExpiry::Delete => {
            branch::hit(Branch::ExpireDeletes);
            deleting(sandbox)
        }
        // Only a Ready run can be frozen: one still starting (or failed) is stopped instead,
        // so the deadline ends what runs whichever it is. The freezer, not a checkpoint: that
        // is the user's to ask for, where CRIU works.
        OnExpiry::Pause => match pausing(sandbox, Hold::Freezer) {
            Some(paused) => {
                branch::hit(Branch::ExpirePauses);
                paused
            }
            None if sandbox.intent == Intent::Paused => {
                branch::hit(Branch::ExpirePausedAlready);
                (sandbox.clone(), vec![])
            }
            None => {
                branch::hit(Branch::ExpirePauseStops);
                stopping(sandbox)?.unwrap_or_else(|| (sandbox.clone(), vec![]))
            }
        },
    };
    next.restarts.next_at = None;
    Ok((next, effects))
}

/// Activity that restarts the idle clock (DESIGN 9.1), written if the clock runs.
fn touch(sandbox: &Sandbox, now: Timestamp) -> Decision {
    match lifetime::touch(sandbox, now) {
        Some(next) => {
            branch::hit(Branch::TouchRestartsClock);
            commit(sandbox, next, vec![], vec![], now)
        }
        None => {
            branch::hit(Branch::TouchNothing);
            Decision::sandbox_as_is(sandbox)
        }
    }
}

fn renew(sandbox: &Sandbox, renewal: Renewal, limits: &validate::Limits, now: Timestamp) -> Result<Decision, Error> {
    if sandbox.is(PhaseKind::Deleting) {
        branch::hit(Branch::RenewDeleting);
        return Err(wrong_phase(sandbox, "renew"));
    }
    let field = match renewal {
        Renewal::SpecTtl => "spec.lifetime.ttl_ms",
        Renewal::Ttl(_) => "ttl_ms",
        Renewal::Deadline(_) => "deadline_unix_ms",
    };
    let Some(deadline) = lifetime::deadline(renewal, &sandbox.spec.lifetime, now, limits, field)? else {
        branch::hit(Branch::RenewWithoutTtl);
        return Err(Error::invalid(
            "ttl_ms",
            format!("sandbox '{}' has no TTL in its spec: give a ttl_ms or a deadline_unix_ms", sandbox.name),
        ));
    };
    branch::hit(Branch::Renew);
    let mut next = sandbox.clone();
    next.deadline = Some(deadline);
    next.expired_at = None;
    Ok(commit(sandbox, next, vec![], vec![], now))
}

/// The record of the next generation, placed on a node, and the effect that starts it: what a
/// Start and a policy's restart both write.
fn new_generation(sandbox: &Sandbox, nodes: &[placement::Node]) -> Result<(Sandbox, Effect), Error> {
    let placement = placement::place_again(sandbox, nodes).map_err(|why| why.error(&sandbox.name))?;
    // The fence never settles the new generation by itself: a run alive, or started
    // later, need not be the new generation's. A start of the old generation may still
    // be in flight somewhere, and the runtime may restart the container out of band
    // (`docker restart`) at any time, even after a run was seen to end by a stop: that
    // run starts after the recorded exit, and its exit (when the driver stops it to make
    // room, or its stale supervisor is rejected) must not count as the new generation's
    // (defect 3 of issue 13). Unsettled, only what carries the generation tells the runs
    // apart: the driver's start reply, or the new generation's supervisor.
    let settled = crate::bug!(FenceFromRecordedExit);
    let mut next = sandbox.clone();
    next.generation += 1;
    // The new run's egress is what is attached as its generation is committed (DESIGN 10).
    next.egress_providers = sandbox.providers.clone();
    next.exit_fence = ExitFence { marker: sandbox.last_exit, settled };
    next.run = Run::Pending;
    next.phase = Phase::Starting;
    next.intent = Intent::Running;
    next.placement = Some(placement);
    let effect = Effect::Start { sandbox: sandbox.id.clone(), generation: next.generation };
    crate::bugs::leave_rotation_out(sandbox, &mut next);
    Ok((next, effect))
}

/// DESIGN 12.1: a pause of a Ready run. A repeated one re-drives the runtime, like a delete;
/// one that asks for the other hold is refused: the run would have to be let go of first, and
/// that is a resume's to do.
fn pause(sandbox: &Sandbox, hold: Hold, now: Timestamp) -> Result<Decision, Error> {
    if let Some((next, effects)) = pausing(sandbox, hold) {
        branch::hit(Branch::Pause);
        return Ok(commit(sandbox, next, vec![], effects, now));
    }
    match (sandbox.intent, sandbox.phase.kind()) {
        (Intent::Paused, _) if sandbox.hold != hold => {
            branch::hit(Branch::PauseOtherHold);
            Err(Error::OtherHold { sandbox: sandbox.name.to_string(), held: sandbox.hold, asked: hold })
        }
        (Intent::Paused, _) => {
            branch::hit(Branch::PauseRepeated);
            let effect = Effect::Pause { sandbox: sandbox.id.clone(), generation: sandbox.generation, hold };
            Ok(Decision::unchanged(Outcome::Sandbox(Box::new(sandbox.clone())), vec![effect]))
        }
        _ => {
            branch::hit(Branch::PauseNotReady);
            Err(wrong_phase(sandbox, "pause"))
        }
    }
}

/// What a pause changes: the intent and its hold, and the effect that holds the run. Only a
/// live run, Ready (or being resumed), can be held; `None` for any other.
fn pausing(sandbox: &Sandbox, hold: Hold) -> Option<(Sandbox, Vec<Effect>)> {
    let live = matches!(sandbox.phase.kind(), PhaseKind::Ready | PhaseKind::Paused);
    if sandbox.intent != Intent::Running || !live {
        return None;
    }
    let mut next = sandbox.clone();
    next.intent = Intent::Paused;
    next.hold = hold;
    Some((next, vec![Effect::Pause { sandbox: sandbox.id.clone(), generation: sandbox.generation, hold }]))
}

/// DESIGN 12.1: a resume of a paused (or pausing) run, on the generation it paused. Past its
/// deadline a sandbox is renewed first, as for a start; the idle clock counts again from now.
fn resume(sandbox: &Sandbox, now: Timestamp) -> Result<Decision, Error> {
    let effect = Effect::Resume { sandbox: sandbox.id.clone(), generation: sandbox.generation };
    match (sandbox.intent, sandbox.phase.kind()) {
        (Intent::Paused, _) if sandbox.deadline.is_some_and(|d| d <= now) => {
            branch::hit(Branch::ResumePastDeadline);
            Err(Error::Expired { sandbox: sandbox.name.to_string(), action: "resuming" })
        }
        (Intent::Paused, _) => {
            branch::hit(Branch::Resume);
            let mut next = sandbox.clone();
            next.intent = Intent::Running;
            next.active_at = lifetime::clock_from(&sandbox.spec.lifetime, now);
            next.idle_expired_at = None;
            Ok(commit(sandbox, next, vec![], vec![effect], now))
        }
        (Intent::Running, PhaseKind::Paused) => {
            branch::hit(Branch::ResumeRepeated);
            Ok(Decision::unchanged(Outcome::Sandbox(Box::new(sandbox.clone())), vec![effect]))
        }
        (Intent::Running, PhaseKind::Ready) => {
            branch::hit(Branch::ResumeNotPaused);
            Ok(Decision::sandbox_as_is(sandbox))
        }
        _ => {
            branch::hit(Branch::ResumeNotLive);
            Err(wrong_phase(sandbox, "resume"))
        }
    }
}

fn delete(sandbox: &Sandbox, now: Timestamp) -> Result<Decision, Error> {
    if sandbox.is(PhaseKind::Deleting) {
        // Repeating a delete re-drives the runtime: Deleting is never stuck.
        branch::hit(Branch::DeleteRepeated);
        let effect = Effect::Delete { sandbox: sandbox.id.clone() };
        return Ok(Decision::unchanged(Outcome::Sandbox(Box::new(sandbox.clone())), vec![effect]));
    }
    branch::hit(Branch::Delete);
    let (next, effects) = deleting(sandbox);
    Ok(commit(sandbox, next, vec![], effects, now))
}

fn deleting(sandbox: &Sandbox) -> (Sandbox, Vec<Effect>) {
    let mut next = sandbox.clone();
    next.phase = Phase::Deleting;
    next.intent = Intent::Deleted;
    next.restarts.next_at = None;
    (next, vec![Effect::Delete { sandbox: sandbox.id.clone() }])
}

fn attach(sandbox: &Sandbox, provider: &str, reads: &Reads, now: Timestamp) -> Result<Decision, Error> {
    if sandbox.is(PhaseKind::Deleting) {
        branch::hit(Branch::AttachDeleting);
        return Err(wrong_phase(sandbox, "attach a provider to"));
    }
    let target = reads
        .providers
        .get(provider)
        .ok_or_else(|| Error::UnknownProvider { provider: provider.to_string(), field: "provider" })?;
    if sandbox.providers.contains(provider) {
        branch::hit(Branch::AttachAlready);
        return Ok(Decision::sandbox_as_is(sandbox));
    }
    if sandbox.providers.len() >= validate::MAX_PROVIDERS {
        return Err(Error::invalid(
            "provider",
            format!("sandbox '{}' already has the maximum of {} providers", sandbox.name, validate::MAX_PROVIDERS),
        ));
    }
    let mut attached: Vec<&Provider> = sandbox.providers.iter().filter_map(|p| reads.providers.get(p)).collect();
    attached.push(target);
    provider::check_credentials(&sandbox.spec, &attached)?;
    branch::hit(Branch::Attach);
    let mut next = sandbox.clone();
    std::sync::Arc::make_mut(&mut next.providers).insert(provider.to_string());
    crate::bugs::egress_from_attach(&mut next, provider);
    Ok(commit(sandbox, next, vec![touch_provider(target, now)], vec![], now))
}

fn detach(sandbox: &Sandbox, provider: &str, now: Timestamp) -> Result<Decision, Error> {
    if sandbox.is(PhaseKind::Deleting) {
        branch::hit(Branch::DetachDeleting);
        return Err(wrong_phase(sandbox, "detach a provider from"));
    }
    if !sandbox.providers.contains(provider) {
        branch::hit(Branch::DetachNotAttached);
        return Ok(Decision::sandbox_as_is(sandbox));
    }
    branch::hit(Branch::Detach);
    let mut next = sandbox.clone();
    std::sync::Arc::make_mut(&mut next.providers).remove(provider);
    // A detach closes the provider's endpoints to the run at once; an attach opens them at
    // the next start.
    std::sync::Arc::make_mut(&mut next.egress_providers).remove(provider);
    Ok(commit(sandbox, next, vec![], vec![], now))
}
