//! Recovery (DESIGN 3.6): which effect finishes a transition the runtime has not confirmed.
//! The effect always carries the committed generation, so a re-drive installs the same identity
//! the decision did.

use core::time::Duration;

use crate::branch::{self, Branch};
use crate::decision::Effect;
use crate::phase::PhaseKind;
use crate::record::{Intent, Run, Sandbox};
use crate::time::Timestamp;

/// The effect that finishes `sandbox`'s unconfirmed transition, if it has one.
pub fn unfinished(sandbox: &Sandbox) -> Option<Effect> {
    let id = sandbox.id.clone();
    let generation = sandbox.generation;
    if let Some(effect) = crate::bugs::unfinished_start(sandbox) {
        return Some(effect);
    }
    match (sandbox.intent, sandbox.phase.kind(), sandbox.run) {
        (_, PhaseKind::Deleting, _) => {
            branch::hit(Branch::RedriveDelete);
            Some(Effect::Delete { sandbox: id })
        }
        (_, PhaseKind::Stopping, _) => {
            branch::hit(Branch::RedriveStop);
            Some(Effect::Stop { sandbox: id, generation })
        }
        (Intent::Running, PhaseKind::Provisioning | PhaseKind::Starting, Run::Pending) => {
            branch::hit(Branch::RedriveStart);
            Some(Effect::Start { sandbox: id, generation })
        }
        // Started, but with an unsettled fence only the driver's reply tells which run is this
        // generation's: ask again until it has answered.
        // Paused or not: a report of the run can be taken for this generation's (a pause
        // confirmed by it) only once the run is known.
        (
            Intent::Running | Intent::Paused,
            PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused,
            Run::Started { at: None },
        ) if !sandbox.exit_fence.settled => {
            branch::hit(Branch::RedriveStartUnsettled);
            Some(Effect::Start { sandbox: id, generation })
        }
        // A pause or a resume is confirmed only by a report that sees the run frozen or thawed.
        (Intent::Paused, PhaseKind::Ready, _) => {
            branch::hit(Branch::RedrivePause);
            Some(Effect::Pause { sandbox: id, generation, hold: sandbox.hold })
        }
        (Intent::Running, PhaseKind::Paused, _) => {
            branch::hit(Branch::RedriveResume);
            Some(Effect::Resume { sandbox: id, generation })
        }
        _ => {
            branch::hit(Branch::NothingToRedrive);
            None
        }
    }
}

/// On a reconcile sweep: [`unfinished`], for transitions whose last write is at least
/// `min_age` old, so a sweep does not pile onto an effect that is still running. At gateway
/// start-up pass `Duration::ZERO`: nothing is running yet.
pub fn due(sandbox: &Sandbox, now: Timestamp, min_age: Duration) -> Option<Effect> {
    if sandbox.updated_at.plus(min_age) > now {
        return None;
    }
    unfinished(sandbox)
}

/// Whether a queued `effect` is still wanted by the record as it is now (`None`: no record).
/// An executor checks this just before running an effect: a decision made since (a stop after
/// a start, a newer generation, a completed transition) supersedes it. A resource without a
/// record is always to be deleted.
pub fn still_wanted(record: Option<&Sandbox>, effect: &Effect) -> bool {
    if crate::bugs::skips_recheck() {
        return true;
    }
    let wanted = match record {
        None => matches!(effect, Effect::Delete { .. }),
        Some(sandbox) => unfinished(sandbox).as_ref() == Some(effect),
    };
    branch::hit(match (record, wanted) {
        (None, true) => Branch::EffectOrphanDelete,
        (None, false) => Branch::EffectNoRecordDropped,
        (Some(_), false) => Branch::EffectSuperseded,
        (Some(_), true) => Branch::EffectWanted,
    });
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SandboxId;
    use crate::phase::Hold;
    use crate::phase::Phase;
    use crate::spec::SandboxSpec;

    fn sandbox(phase: Phase, intent: Intent, run: Run) -> Sandbox {
        Sandbox {
            intent,
            phase,
            resource_version: 3,
            generation: 2,
            run,
            updated_at: Timestamp::from_unix_nanos(1_000),
            ..Sandbox::new(SandboxId::new("sb"), "box", SandboxSpec::default(), Timestamp::default())
        }
    }

    #[test]
    fn only_the_current_transitions_effect_is_wanted() {
        let id = SandboxId::new("sb");
        let start = |generation| Effect::Start { sandbox: id.clone(), generation };
        let stop = Effect::Stop { sandbox: id.clone(), generation: 2 };
        let delete = Effect::Delete { sandbox: id.clone() };
        let starting = sandbox(Phase::Starting, Intent::Running, Run::Pending);
        assert!(still_wanted(Some(&starting), &start(2)));
        assert!(!still_wanted(Some(&starting), &start(1)), "a superseded generation");
        assert!(!still_wanted(Some(&starting), &stop));
        let started = sandbox(Phase::Starting, Intent::Running, Run::Started { at: None });
        assert!(!still_wanted(Some(&started), &start(2)), "already confirmed");
        let stopping = sandbox(Phase::Stopping, Intent::Stopped, Run::Pending);
        assert!(still_wanted(Some(&stopping), &stop));
        assert!(!still_wanted(Some(&stopping), &start(2)), "a stop came after the start");
        let deleting = sandbox(Phase::Deleting, Intent::Deleted, Run::Pending);
        assert!(still_wanted(Some(&deleting), &delete));
        assert!(still_wanted(None, &delete), "leftovers of a removed record");
        assert!(!still_wanted(None, &start(2)));
    }

    #[test]
    fn sweeps_wait_for_an_effect_in_flight() {
        let starting = sandbox(Phase::Starting, Intent::Running, Run::Pending);
        let soon = Timestamp::from_unix_nanos(1_500);
        let later = Timestamp::from_unix_nanos(3_000);
        assert_eq!(due(&starting, soon, Duration::from_nanos(1_000)), None);
        assert_eq!(due(&starting, later, Duration::from_nanos(1_000)), unfinished(&starting));
        // Exactly `min_age` old is old enough.
        let exactly = Timestamp::from_unix_nanos(2_000);
        assert_eq!(due(&starting, exactly, Duration::from_nanos(1_000)), unfinished(&starting));
        assert!(unfinished(&starting).is_some());
        let ready = sandbox(Phase::Ready, Intent::Running, Run::Started { at: None });
        assert_eq!(unfinished(&ready), None, "settled and started: nothing to finish");
    }

    #[test]
    fn a_pause_or_resume_is_asked_again_until_a_report_confirms_it() {
        let id = SandboxId::new("sb");
        let known = Run::Started { at: Some(Timestamp::from_unix_nanos(500)) };
        let pausing = sandbox(Phase::Ready, Intent::Paused, known);
        assert_eq!(
            unfinished(&pausing),
            Some(Effect::Pause { sandbox: id.clone(), generation: 2, hold: Hold::Freezer })
        );
        // A checkpoint is asked again as a checkpoint, never as the freezer's pause.
        let checkpointing = Sandbox { hold: Hold::Checkpoint, ..pausing.clone() };
        assert_eq!(
            unfinished(&checkpointing),
            Some(Effect::Pause { sandbox: id.clone(), generation: 2, hold: Hold::Checkpoint })
        );
        let resuming = sandbox(Phase::Paused, Intent::Running, known);
        assert_eq!(unfinished(&resuming), Some(Effect::Resume { sandbox: id.clone(), generation: 2 }));
        assert_eq!(unfinished(&sandbox(Phase::Paused, Intent::Paused, known)), None, "paused: nothing to finish");
        // A run not yet known for this generation's is asked for first: only then can a report
        // of it confirm the pause.
        let mut unknown = sandbox(Phase::Ready, Intent::Paused, Run::Started { at: None });
        unknown.exit_fence.settled = false;
        assert_eq!(unfinished(&unknown), Some(Effect::Start { sandbox: id, generation: 2 }));
    }

    #[test]
    fn a_start_with_an_unsettled_fence_is_asked_again_until_the_driver_answers() {
        for phase in [Phase::Starting, Phase::Ready] {
            let mut started = sandbox(phase, Intent::Running, Run::Started { at: None });
            started.exit_fence.settled = false;
            assert_eq!(unfinished(&started), Some(Effect::Start { sandbox: SandboxId::new("sb"), generation: 2 }));
            // Once the reply told the start time, the run is known: nothing left to ask.
            started.run = Run::Started { at: Some(Timestamp::from_unix_nanos(500)) };
            assert_eq!(unfinished(&started), None);
        }
    }
}
