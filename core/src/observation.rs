//! The one observation merge (DESIGN 3.5).
//!
//! Every report about a sandbox's runtime, whichever path brought it (watch event, initial
//! sync, poll, recovery lookup, driver call result, supervisor), is merged here against the
//! record, and nowhere else. The fence that tells the current generation's run from earlier ones
//! is stored in the record, so every path consults the same one.

use crate::branch::{self, Branch};
use crate::decision::{Decision, Effect, Outcome, Write, next_version};
use crate::error::{Error, Kind};
use crate::id::SandboxId;
use crate::phase::{Failure, FailureReason, Hold, Phase, PhaseKind};
use crate::record::{ExitMarker, Intent, Run, Sandbox};
pub use crate::report::{MainProcess, Observation, RuntimeSource, RuntimeState, StartReply};
use crate::time::Timestamp;

/// Whether a run that started at `started_at` (runtime clock) belongs to the current
/// generation. Once this generation's start time is known it decides; before, the exit fence
/// does: a run belongs only if it started after the replaced run finished (rule 2).
pub fn owns_run(sandbox: &Sandbox, started_at: Timestamp) -> bool {
    match sandbox.run {
        Run::Started { at: Some(at) } => started_at >= at,
        Run::Ended(marker) => started_at >= marker.started_at,
        Run::Pending | Run::Started { at: None } => {
            sandbox.exit_fence.settled && sandbox.exit_fence.marker.is_none_or(|f| started_at > f.finished_at)
        }
    }
}

/// Merges `observation` about sandbox `id` into `current` (the record as just read; `None` if
/// there is none) at gateway time `now`.
///
/// The only error is a supervisor's rejection (stale identity, or no such sandbox). A decision
/// without writes means nothing changes (its outcome is then [`Outcome::Unchanged`], the record
/// is not copied); its effects are still to be run (re-drives).
pub fn merge(
    current: Option<&Sandbox>,
    id: &SandboxId,
    observation: &Observation,
    now: Timestamp,
) -> Result<Decision, Error> {
    if let Observation::SupervisorConnected { generation, .. } = observation {
        authenticate(current, id, *generation)?;
    }
    let Some(sandbox) = current else {
        return orphan(id, observation);
    };
    let mut merge = Merge { before: sandbox, writes: Vec::new(), effects: Vec::new(), remove: false };
    if sandbox.is(PhaseKind::Deleting) {
        merge.deleting(observation);
    } else {
        merge.apply(observation);
    }
    Ok(merge.finish(now))
}

/// Rule 4 and DESIGN 3.4, the one authentication decision: a run's identity (a valid token of
/// sandbox `id`, generation `presented`) is accepted only while the sandbox exists (`current`
/// is its record) and `presented` is its current generation. A supervisor's hello and every
/// heartbeat of its session ask it.
pub fn authenticate(current: Option<&Sandbox>, id: &SandboxId, presented: u64) -> Result<(), Error> {
    match current {
        None => {
            branch::hit(Branch::AuthNoSandbox);
            Err(Error::NotFound { kind: Kind::Sandbox, name: id.to_string() })
        }
        Some(sandbox) if presented != sandbox.generation => {
            branch::hit(Branch::AuthStaleGeneration);
            Err(Error::StaleIdentity { sandbox: sandbox.name.to_string(), presented, current: sandbox.generation })
        }
        Some(_) => {
            branch::hit(Branch::AuthAccepted);
            Ok(())
        }
    }
}

/// A report about a sandbox with no record. Records are written before any effect, so a
/// compute resource without one is left over from a delete: remove it.
fn orphan(id: &SandboxId, observation: &Observation) -> Result<Decision, Error> {
    let exists = match observation {
        Observation::Runtime { state, .. } | Observation::Stopped { state, .. } => {
            !matches!(state, RuntimeState::Absent { .. })
        }
        Observation::Started { .. } => true,
        // Refused by `authenticate` before.
        Observation::SupervisorConnected { .. } => false,
        Observation::Deleted
        | Observation::MainProcessExited { .. }
        | Observation::NodeFenced { .. }
        | Observation::Held { .. } => false,
    };
    branch::hit(if exists { Branch::OrphanDelete } else { Branch::OrphanNothing });
    let effects = if exists { vec![Effect::Delete { sandbox: id.clone() }] } else { vec![] };
    Ok(Decision::unchanged(Outcome::Removed, effects))
}

struct Merge<'a> {
    before: &'a Sandbox,
    /// The decision's writes: none while nothing changes (most reports, a steady poll or a
    /// stale snapshot, change nothing); once something is to change, the record's update, the
    /// record copied once straight into it and merged in place there.
    writes: Vec<Write>,
    effects: Vec<Effect>,
    /// The record ends: the runtime confirmed a delete.
    remove: bool,
}

impl Merge<'_> {
    /// The record as merged so far.
    fn next(&self) -> &Sandbox {
        match self.writes.first() {
            Some(Write::UpdateSandbox { record, .. }) => record,
            _ => self.before,
        }
    }

    fn edit(&mut self) -> &mut Sandbox {
        if self.writes.is_empty() {
            let expected = self.before.resource_version;
            self.writes = vec![Write::UpdateSandbox { record: self.before.clone(), expected }];
        }
        match &mut self.writes[0] {
            Write::UpdateSandbox { record, .. } => record,
            // `edit` alone writes here, and only the record's update.
            _ => unreachable!("a merge writes only its record's update"),
        }
    }

    /// Rule 1: a Deleting sandbox waits only for the runtime to confirm that everything is gone.
    fn deleting(&mut self, observation: &Observation) {
        match observation {
            Observation::Deleted => {
                branch::hit(Branch::DeletingConfirmed);
                self.remove = true;
            }
            // The node removes what it still holds when it comes back, as it does any run the
            // store no longer places on it.
            Observation::NodeFenced { node, epoch } if self.placed_on(node, *epoch) => {
                branch::hit(Branch::DeletingFenced);
                self.remove = true;
            }
            // The resource is gone but only the driver's delete also removes what was made for
            // it (volumes, secrets): re-drive it, and let its reply end the record.
            Observation::Runtime { state: RuntimeState::Absent { .. }, .. }
            | Observation::Stopped { state: RuntimeState::Absent { .. }, .. } => {
                branch::hit(Branch::DeletingAbsentRedrive);
                self.effects.push(Effect::Delete { sandbox: self.before.id.clone() });
            }
            _ => branch::hit(Branch::DeletingIgnored),
        }
    }

    fn apply(&mut self, observation: &Observation) {
        let generation = self.before.generation;
        if let Some(reply) = crate::bugs::rotate_late(self.edit(), observation) {
            self.start_reply(reply);
            return;
        }
        match observation {
            Observation::Runtime { source, state, as_of_version } => {
                // No report skips the fence, unless a known-bug switch of the simulator says so.
                let bypass = crate::bugs::bypasses_fence(*source);
                self.runtime(*state, *as_of_version, bypass);
            }
            Observation::Started { generation: g, reply } if *g == generation => self.start_reply(reply),
            Observation::Stopped { generation: g, state }
                if *g == generation && self.next().is(PhaseKind::Stopping) =>
            {
                self.stop_reply(*state);
            }
            // A stop reply of an older generation, merged late (its gateway was held up), says
            // nothing of this one's run: its absence carries no time to fence with (found by
            // the simulator with three gateways and a stalled store connection).
            Observation::Stopped { generation: g, .. } if *g != generation => {
                branch::hit(Branch::StoppedOlderGeneration)
            }
            // A stop reply that finds the sandbox past Stopping is one more runtime report.
            Observation::Stopped { state, .. } => {
                branch::hit(Branch::StoppedPastStopping);
                self.runtime(*state, None, false);
            }
            Observation::SupervisorConnected { main: MainProcess::Running, .. } => self.supervisor_connected(),
            Observation::SupervisorConnected { main: MainProcess::Exited { code, out_of_memory }, .. } => {
                self.main_process_exited(*code, *out_of_memory);
            }
            Observation::SupervisorConnected { main: MainProcess::Unstartable(cause), .. } => {
                self.main_process_unstartable(cause);
            }
            Observation::MainProcessExited { generation: g, exit_code, out_of_memory } if *g == generation => {
                self.main_process_exited(*exit_code, *out_of_memory);
            }
            // Replies and reports of older generations: ignored (rule 5).
            Observation::Started { .. } | Observation::MainProcessExited { .. } | Observation::Deleted => {
                branch::hit(Branch::OlderGenerationIgnored);
            }
            Observation::NodeFenced { node, epoch } => self.fenced(node, *epoch),
            Observation::Held { node, epoch } => self.held(node, *epoch),
        }
    }

    /// DESIGN 14: a node that finds a sandbox's run in its runtime adopts what is its own and
    /// nothing else: a sandbox placed nowhere (recorded before placement was, on the one host
    /// there was), or one placed on it under an earlier epoch of its own, which the store did
    /// not fence in between (a fence fails or ends the run, and places the next elsewhere).
    fn held(&mut self, node: &crate::id::NodeId, epoch: u64) {
        match crate::fencing::adopted(self.before.placement.as_ref(), node, epoch) {
            Some(placement) => {
                branch::hit(Branch::HeldAdopted);
                self.edit().placement = Some(placement);
            }
            None => branch::hit(Branch::HeldNothingToAdopt),
        }
    }

    /// Whether the sandbox's run is placed on `node` under `epoch` or an earlier one.
    fn placed_on(&self, node: &crate::id::NodeId, epoch: u64) -> bool {
        self.before.placement.as_ref().is_some_and(|at| at.node == *node && at.epoch <= epoch)
    }

    /// DESIGN 14: the run on a fenced node is lost to the store. A stop of it is done (the node
    /// stops it, if it ever comes back, before it acts); a run meant to go on fails as a missing
    /// resource would, and its restart policy may place a new generation elsewhere.
    fn fenced(&mut self, node: &crate::id::NodeId, epoch: u64) {
        if !self.placed_on(node, epoch) {
            branch::hit(Branch::FenceElsewhere);
            return;
        }
        if !crate::fencing::touches(self.next()) {
            branch::hit(Branch::FencedNothingRuns);
            return;
        }
        if self.next().is(PhaseKind::Stopping) {
            branch::hit(Branch::FencedStop);
            self.edit().phase = Phase::Stopped;
        } else {
            branch::hit(Branch::FencedRunLost);
            let lost = format!("node {node}'s lease lapsed (epoch {epoch}): the run placed there is lost");
            // A run that had failed there already keeps what it failed of in the message.
            let message = match &self.next().phase {
                Phase::Error(failed) => format!("{lost} (it had failed: {}: {})", failed.reason, failed.message),
                _ => lost,
            };
            self.edit().fail(Failure { reason: FailureReason::ComputeResourceMissing, exit_code: None, message });
        }
    }

    fn runtime(&mut self, state: RuntimeState, as_of_version: Option<u64>, attributed: bool) {
        match state {
            RuntimeState::Absent { at } => self.absent(at, as_of_version),
            RuntimeState::Created => branch::hit(Branch::RuntimeCreated),
            RuntimeState::Running { started_at, held } => self.running(started_at, Some(held), attributed),
            RuntimeState::Exited(marker) => self.exited(marker, attributed),
        }
    }

    fn owns(&self, started_at: Timestamp) -> bool {
        owns_run(self.next(), started_at)
    }

    /// Rules 2 and 3.
    fn exited(&mut self, marker: ExitMarker, attributed: bool) {
        if self.next().last_exit.is_none_or(|last| marker.finished_at > last.finished_at) {
            self.edit().last_exit = Some(marker);
        }
        if !attributed && !self.owns(marker.started_at) {
            branch::hit(Branch::ExitStale);
            return; // Rule 2: a stale exit, whatever path brought it.
        }
        if let Run::Ended(known) = self.next().run
            && marker.finished_at <= known.finished_at
        {
            branch::hit(Branch::ExitAlreadyKnown);
            return;
        }
        self.edit().run = Run::Ended(marker);
        self.edit().end_pause();
        match (self.next().intent, self.next().phase.kind()) {
            // Ready or Paused with intent Stopped: an expiry's pause ended with its run.
            (Intent::Stopped, PhaseKind::Stopping | PhaseKind::Stopped | PhaseKind::Ready | PhaseKind::Paused) => {
                branch::hit(Branch::ExitStopped);
                self.edit().phase = Phase::Stopped;
            }
            // DESIGN 9.3: the supervisor ends with its command's code, so 0 is a completion.
            (Intent::Running, PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused)
                if marker.exit_code == 0 =>
            {
                branch::hit(Branch::ExitCompleted);
                self.edit().phase = Phase::Stopped;
            }
            (Intent::Running, PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused) => {
                let failure = match marker.out_of_memory {
                    true => {
                        branch::hit(Branch::ExitFailedOutOfMemory);
                        self.out_of_memory(marker.exit_code)
                    }
                    false => {
                        branch::hit(Branch::ExitFailed);
                        Failure {
                            reason: FailureReason::ContainerExited,
                            exit_code: Some(marker.exit_code),
                            message: format!("the sandbox exited with code {}", marker.exit_code),
                        }
                    }
                };
                self.edit().fail(failure);
            }
            // The supervisor's report came first, without the kernel's word on why (a
            // supervisor that could not read its memory cgroup): the runtime's is better.
            (Intent::Running, PhaseKind::Error)
                if marker.out_of_memory
                    && matches!(&self.next().phase, Phase::Error(f) if f.reason == FailureReason::MainProcessExited) =>
            {
                branch::hit(Branch::ExitRefinesOutOfMemory);
                let failure = self.out_of_memory(marker.exit_code);
                self.edit().phase = Phase::Error(failure);
            }
            _ => branch::hit(Branch::ExitNoChange),
        }
    }

    /// DESIGN 10: a run killed for memory says so, with the limit it ran into.
    fn out_of_memory(&self, exit_code: i32) -> Failure {
        Failure {
            reason: FailureReason::OutOfMemory,
            exit_code: Some(exit_code),
            message: format!("the sandbox was killed for using more than {}", self.next().spec.limits.memory_bound()),
        }
    }

    /// `held`: how a pause holds the run, when the report says (a start reply does not: it
    /// speaks of the start alone).
    fn running(&mut self, started_at: Timestamp, held: Option<Option<Hold>>, attributed: bool) {
        if !attributed && !self.owns(started_at) {
            // Whose run this is may be unknown (until this generation's run is known, an
            // unsettled fence attributes none by its start time alone), but one that started
            // after every exit seen is alive: with intent Stopped it is stopped again, whoever's
            // it is (DESIGN 3.6). A start that landed after its stop was acknowledged ends so.
            if matches!(self.next().run, Run::Pending | Run::Started { at: None })
                && self.next().last_exit.is_none_or(|last| started_at > last.finished_at)
            {
                branch::hit(Branch::RunningUnownedStopped);
                self.stop_if_unwanted();
            } else {
                branch::hit(Branch::RunningUnownedIgnored);
            }
            return;
        }
        // Whether it is this generation's live run, whose hold the intent speaks for.
        let current = match self.next().run {
            Run::Pending | Run::Started { at: None } => {
                branch::hit(Branch::RunningFirstSeen);
                self.edit().run = Run::Started { at: Some(started_at) };
                true
            }
            Run::Started { at: Some(at) } if started_at > at => {
                branch::hit(Branch::RunningRestartedOutOfBand);
                self.restarted_out_of_band();
                false
            }
            Run::Started { at: Some(_) } => {
                branch::hit(Branch::RunningKnown);
                true
            }
            // A snapshot of the run that has since been seen to end.
            Run::Ended(marker) if started_at <= marker.finished_at => {
                branch::hit(Branch::RunningSnapshotOfEnded);
                return;
            }
            // A later run, started outside Berth.
            Run::Ended(_) => {
                branch::hit(Branch::RunningAfterEnd);
                false
            }
        };
        if let (true, Some(held)) = (current, held) {
            self.hold(held);
        }
        self.stop_if_unwanted();
    }

    /// DESIGN 12.1, level-based like a stop: a live run of this generation is held or not,
    /// and the intent (with its hold) says how it should be. A pause or resume is confirmed
    /// only by seeing the run so; one the runtime has not carried out (a failed call, a gateway
    /// that died before making it, a `docker pause` or `unpause` behind Berth's back, a run
    /// frozen where a checkpoint was asked for) is asked again.
    fn hold(&mut self, held: Option<Hold>) {
        let wanted = (self.next().intent == Intent::Paused).then_some(self.next().hold);
        let held = if crate::bug!(PauseConfirmedBlind) && wanted.is_some() { wanted } else { held };
        let paused = self.next().is(PhaseKind::Paused);
        match (wanted, held) {
            (Some(wanted), Some(held)) if wanted == held => {
                if !paused && self.next().is(PhaseKind::Ready) {
                    branch::hit(Branch::PauseConfirmed);
                    self.edit().phase = Phase::Paused;
                } else {
                    branch::hit(Branch::HoldAsMeant);
                }
            }
            (Some(wanted), _) => {
                branch::hit(Branch::PauseAgain);
                if paused {
                    // Let go of behind Berth's back, or held the other way: not paused as
                    // asked, though no exec is admitted.
                    self.edit().phase = Phase::Ready;
                }
                let (sandbox, generation) = (self.next().id.clone(), self.next().generation);
                self.effects.push(Effect::Pause { sandbox, generation, hold: wanted });
            }
            (None, None) if paused => {
                branch::hit(Branch::ResumeConfirmed);
                self.edit().phase = Phase::Ready;
            }
            (None, Some(_)) => {
                branch::hit(Branch::ResumeAgain);
                // Frozen behind Berth's back: nothing in it can answer an exec.
                if self.next().is(PhaseKind::Ready) {
                    self.edit().phase = Phase::Paused;
                }
                self.effects
                    .push(Effect::Resume { sandbox: self.next().id.clone(), generation: self.next().generation });
            }
            _ => branch::hit(Branch::HoldAsMeant),
        }
    }

    /// A later run than the one this generation started: the runtime restarted the sandbox
    /// behind Berth's back (`docker restart`, `podman restart`), so this generation's run ended
    /// even if no exit was seen. With intent Running that is a failure of the run: Berth never
    /// started the new one (rule 7: only a new generation is Ready again). With intent Stopped,
    /// the level-based stop below ends it.
    fn restarted_out_of_band(&mut self) {
        if matches!(self.next().intent, Intent::Running | Intent::Paused)
            && matches!(
                self.next().phase.kind(),
                PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused
            )
        {
            self.edit().fail(Failure {
                reason: FailureReason::ContainerExited,
                exit_code: None,
                message: "the sandbox was restarted outside Berth; start it to run a new generation".to_string(),
            });
        }
    }

    /// DESIGN 3.6: intent Stopped but a run is alive: stop it again (level-based).
    fn stop_if_unwanted(&mut self) {
        if self.next().intent != Intent::Stopped {
            return;
        }
        branch::hit(Branch::StopAgain);
        if matches!(self.next().phase.kind(), PhaseKind::Stopped | PhaseKind::Error) {
            branch::hit(Branch::StopAgainReopens);
            self.edit().phase = Phase::Stopping;
        }
        self.effects.push(Effect::Stop { sandbox: self.next().id.clone(), generation: self.next().generation });
    }

    /// Rule 6, with the two fences absence can have: the runtime's time of a removal event,
    /// and the record version a poll started from.
    fn absent(&mut self, at: Option<Timestamp>, as_of_version: Option<u64>) {
        if at.is_some_and(|at| !self.owns(at)) || as_of_version.is_some_and(|v| v != self.before.resource_version) {
            branch::hit(Branch::AbsentFenced);
            return;
        }
        // Until this generation's run is known to have started, its start may not have created
        // the resource yet (and will, if it was removed).
        if self.next().run == Run::Pending {
            branch::hit(Branch::AbsentBeforeStart);
            return;
        }
        self.missing();
    }

    fn missing(&mut self) {
        if let Phase::Error(failure) = &self.next().phase
            && failure.reason == FailureReason::ComputeResourceMissing
        {
            branch::hit(Branch::MissingAlreadyKnown);
            return;
        }
        branch::hit(Branch::MissingFails);
        self.edit().fail(Failure {
            reason: FailureReason::ComputeResourceMissing,
            exit_code: None,
            message: "the runtime no longer has this sandbox's compute resource".to_string(),
        });
    }

    fn start_reply(&mut self, reply: &StartReply) {
        match reply {
            StartReply::Running { started_at } => self.running(*started_at, None, true),
            StartReply::Exited(marker) => self.exited(*marker, true),
            // It ran, so this is a loss (rule 6), not a start that failed.
            StartReply::Gone => {
                branch::hit(Branch::StartReplyGone);
                if self.next().run == Run::Pending {
                    self.edit().run = Run::Started { at: None };
                }
                self.missing();
            }
            StartReply::Failed { message } => {
                // The one thing that moves a sandbox whose run has not begun to Error.
                if self.next().run == Run::Pending
                    && self.next().intent == Intent::Running
                    && matches!(self.next().phase.kind(), PhaseKind::Provisioning | PhaseKind::Starting)
                {
                    branch::hit(Branch::StartReplyFailed);
                    self.edit().fail(Failure {
                        reason: FailureReason::StartFailed,
                        exit_code: None,
                        message: message.clone(),
                    });
                } else {
                    branch::hit(Branch::StartReplyFailedIgnored);
                }
            }
        }
    }

    /// The driver says nothing runs any more: the stop is complete.
    fn stop_reply(&mut self, state: RuntimeState) {
        match state {
            // Nothing of this generation ever ran: nothing was lost, and the next start creates it.
            RuntimeState::Absent { .. } if self.next().run == Run::Pending => {
                branch::hit(Branch::StopReplyNeverRan);
                self.edit().phase = Phase::Stopped;
            }
            RuntimeState::Absent { .. } => {
                branch::hit(Branch::StopReplyLost);
                self.missing();
            }
            RuntimeState::Created => {
                branch::hit(Branch::StopReplyCreated);
                self.edit().phase = Phase::Stopped;
            }
            RuntimeState::Exited(marker) => {
                branch::hit(Branch::StopReplyExited);
                self.exited(marker, false);
                self.edit().phase = Phase::Stopped;
            }
            // A driver must not reply before the run has exited; ask again.
            RuntimeState::Running { started_at, held } => {
                branch::hit(Branch::StopReplyRunning);
                self.running(started_at, Some(held), false);
            }
        }
    }

    /// Rule 4 (the generation was checked before).
    fn supervisor_connected(&mut self) {
        // A paused run's supervisor reconnects after the thaw (its session went silent while
        // frozen): it changes nothing.
        if self.next().intent == Intent::Paused {
            branch::hit(Branch::SupervisorOfPaused);
            return;
        }
        if self.next().intent != Intent::Running {
            branch::hit(Branch::SupervisorUnwanted);
            return;
        }
        if self.next().run == Run::Pending {
            self.edit().run = Run::Started { at: None };
        }
        // Rule 7: only a run still starting becomes Ready; Error and Stopped need a new generation.
        if matches!(self.next().phase.kind(), PhaseKind::Provisioning | PhaseKind::Starting) {
            branch::hit(Branch::SupervisorReady);
            self.edit().phase = Phase::Ready;
        } else {
            branch::hit(Branch::SupervisorPastStart);
        }
    }

    /// Whether a report of the main process's end can still end this generation's run.
    fn main_process_may_end(&mut self) -> bool {
        if !matches!(self.next().intent, Intent::Running | Intent::Paused)
            || !matches!(
                self.next().phase.kind(),
                PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused
            )
        {
            branch::hit(Branch::MainEndIgnored);
            return false;
        }
        self.edit().end_pause();
        if self.next().run == Run::Pending {
            self.edit().run = Run::Started { at: None };
        }
        true
    }

    /// Rule 5, and DESIGN 9.3: a command that exits 0 has completed (Stopped, its intent
    /// unchanged, so a Start runs it again); any other code is a failure.
    fn main_process_exited(&mut self, exit_code: i32, out_of_memory: bool) {
        if !self.main_process_may_end() {
            return;
        }
        if exit_code == 0 {
            branch::hit(Branch::MainCompleted);
            self.edit().phase = Phase::Stopped;
            return;
        }
        branch::hit(if out_of_memory { Branch::MainFailedOutOfMemory } else { Branch::MainFailed });
        let failure = match out_of_memory {
            true => self.out_of_memory(exit_code),
            false => Failure {
                reason: FailureReason::MainProcessExited,
                exit_code: Some(exit_code),
                message: format!("the main process exited with code {exit_code}"),
            },
        };
        self.edit().fail(failure);
    }

    /// DESIGN 9.3: the command could not be started; the run never was Ready.
    fn main_process_unstartable(&mut self, cause: &str) {
        if !self.main_process_may_end() {
            return;
        }
        branch::hit(Branch::MainUnstartable);
        self.edit().fail(Failure {
            reason: FailureReason::CommandFailedToStart,
            exit_code: None,
            message: format!("the command could not be started: {cause}"),
        });
    }

    fn finish(self, now: Timestamp) -> Decision {
        let Merge { before, mut writes, mut effects, remove } = self;
        effects.dedup();
        if remove {
            return Decision {
                writes: vec![Write::RemoveSandbox { id: before.id.clone(), expected: before.resource_version }],
                effects,
                outcome: Outcome::Removed,
            };
        }
        match writes.first_mut() {
            Some(Write::UpdateSandbox { record, .. }) if *record != *before => {
                crate::snapshot::seeded(record);
                crate::lifetime::unheld(before, record, now);
                crate::restart::schedule(before, record, now);
                next_version(before, record, now);
            }
            _ => return Decision::unchanged(Outcome::Unchanged, effects),
        }
        Decision { writes, effects, outcome: Outcome::Written }
    }
}
