//! I1 (DESIGN 4): no stale exit moves a sandbox out of Starting or Ready. Checked at each commit:
//! an Error that leaves Starting or Ready within one generation must have its cause in the
//! runtime's ground truth, or a report of an older run moved it.

use berth_core::{Failure, FailureReason, Phase, PhaseKind, Sandbox};

use crate::runtime::RuntimeModel;
use crate::world::micros_of;

/// The failure a write records that I1 must justify: an Error out of Starting, Ready or Paused,
/// still at the generation it left.
pub fn failure_to_justify<'a>(before: &Sandbox, after: &'a Sandbox) -> Option<&'a Failure> {
    let Phase::Error(failure) = &after.phase else { return None };
    let out_of_a_run = matches!(before.phase.kind(), PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused);
    (out_of_a_run && before.generation == after.generation).then_some(failure)
}

/// What the runtime host shows of the sandbox when the failure is committed.
pub struct Ground<'a> {
    pub runtime: &'a RuntimeModel,
    /// Whether the host has its compute resource (its container, or its folder).
    pub compute_exists: bool,
    /// Whether the lease of the node it was placed on lapsed since the placement, as the store
    /// holds it (a fence's cause).
    pub node_lapsed: bool,
    /// Its generations as committed: `(t, generation)`.
    pub generations: &'a [(u64, u64)],
}

/// The problem with `after`'s `failure`, unless the ground truth has its cause.
pub fn unjustified(before: &Sandbox, after: &Sandbox, failure: &Failure, ground: &Ground) -> Option<String> {
    let runtime = ground.runtime;
    let generation = after.generation;
    let run = runtime.latest_run(&after.id, generation);
    let justified = match failure.reason {
        // A run of the generation ended: the one Berth started, when it was restarted out of band.
        FailureReason::ContainerExited => {
            runtime.runs(&after.id).any(|r| r.generation == generation && r.finished.is_some())
        }
        FailureReason::MainProcessExited => runtime.main_exits.contains(&(after.id.clone(), generation)),
        FailureReason::ComputeResourceMissing => {
            let started = run.map(|r| r.started_at);
            let removed_since = runtime
                .removals
                .get(&after.id)
                .is_some_and(|times| times.iter().any(|t| started.is_none_or(|s| *t > s)));
            !ground.compute_exists || removed_since || ground.node_lapsed
        }
        // Since this generation was committed, the runtime refused a create or start, or the
        // container was removed (the driver found it gone as it started).
        FailureReason::StartFailed => {
            let committed = ground.generations.iter().find(|(_, g)| *g == generation).map(|(t, _)| *t);
            let since = committed.unwrap_or(u64::MAX);
            let refused = runtime.refusals.get(&after.id).into_iter().flatten().copied();
            let removed = runtime.removals.get(&after.id).into_iter().flatten().map(|t| micros_of(*t));
            // A sandbox whose snapshot's copy was gone before its files were copied fails as
            // it should: whether the copy went too soon is S2's to judge.
            refused.chain(removed).any(|t| t >= since) || super::s2_snapshots_kept::unseedable(&failure.message)
        }
        FailureReason::OutOfMemory => runtime.oom_kills.contains(&(after.id.clone(), generation)),
        FailureReason::CommandFailedToStart => runtime.unstartable.contains(&(after.id.clone(), generation)),
    };
    (!justified).then(|| {
        format!(
            "{} went {} -> Error ({}) at generation {generation}, but its run of that generation {}",
            after.name,
            before.phase.kind(),
            failure.reason,
            match run {
                None => "never started".to_string(),
                Some(r) if r.finished.is_none() => "is still running".to_string(),
                Some(_) => "ended otherwise".to_string(),
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use berth_core::{Intent, Timestamp};
    use tokio::sync::watch;

    use super::*;
    use crate::invariants::sandbox;
    use crate::runtime::{EndCause, Run, RunSignal};

    fn error(reason: FailureReason) -> Phase {
        Phase::Error(Failure { reason, exit_code: Some(1), message: String::new() })
    }

    fn run(generation: u64, finished: bool) -> Run {
        let mut run = Run::new(generation, Timestamp(10), "token".into(), watch::channel(RunSignal::Running).0);
        run.finished = finished.then_some((Timestamp(20), 1, EndCause::WorkloadExit));
        run
    }

    /// A runtime that had these runs of the sandbox. A removed container's runs are the ones a
    /// test can hold: `runs` sees them like any other.
    fn runtime(runs: Vec<Run>) -> RuntimeModel {
        let mut runtime = RuntimeModel::default();
        runtime.removed_runs.insert(sandbox("sb1", Intent::Running, Phase::Ready, 2).id, runs);
        runtime
    }

    /// Ready at generation 2 (committed at 5 us), then Error for `reason`.
    fn verdict(reason: FailureReason, runtime: &RuntimeModel, compute_exists: bool) -> Option<String> {
        judged(reason, runtime, compute_exists, false)
    }

    fn judged(
        reason: FailureReason,
        runtime: &RuntimeModel,
        compute_exists: bool,
        node_lapsed: bool,
    ) -> Option<String> {
        let before = sandbox("sb1", Intent::Running, Phase::Ready, 2);
        let after = sandbox("sb1", Intent::Running, error(reason), 2);
        let failure = failure_to_justify(&before, &after).expect("an Error out of Ready");
        let ground = Ground { runtime, compute_exists, node_lapsed, generations: &[(1, 1), (5, 2)] };
        unjustified(&before, &after, failure, &ground)
    }

    #[test]
    fn an_exit_no_run_of_the_generation_made_is_stale() {
        let running = runtime(vec![run(1, true), run(2, false)]);
        assert_eq!(
            verdict(FailureReason::ContainerExited, &running, true).as_deref(),
            Some(
                "sb1 went Ready -> Error (ContainerExited) at generation 2, but its run of that generation is still running"
            )
        );
        let never = runtime(vec![run(1, true)]);
        assert_eq!(
            verdict(FailureReason::ContainerExited, &never, true).as_deref(),
            Some(
                "sb1 went Ready -> Error (ContainerExited) at generation 2, but its run of that generation never started"
            )
        );
        assert_eq!(verdict(FailureReason::ContainerExited, &runtime(vec![run(1, true), run(2, true)]), true), None);
    }

    #[test]
    fn a_missing_resource_must_be_missing() {
        let ended = runtime(vec![run(2, true)]);
        assert_eq!(
            verdict(FailureReason::ComputeResourceMissing, &ended, true).as_deref(),
            Some(
                "sb1 went Ready -> Error (ComputeResourceMissing) at generation 2, but its run of that generation ended otherwise"
            )
        );
        assert_eq!(verdict(FailureReason::ComputeResourceMissing, &ended, false), None);
        // A fence: the run of a node whose lease lapsed is lost, whatever the node's host shows.
        assert_eq!(judged(FailureReason::ComputeResourceMissing, &ended, true, true), None);
    }

    #[test]
    fn a_command_that_could_not_start_must_have_been_unstartable() {
        let mut started = runtime(vec![run(2, true)]);
        assert!(verdict(FailureReason::CommandFailedToStart, &started, true).is_some());
        started.unstartable.insert((sandbox("sb1", Intent::Running, Phase::Ready, 2).id, 1));
        assert!(verdict(FailureReason::CommandFailedToStart, &started, true).is_some(), "another generation's");
        started.unstartable.insert((sandbox("sb1", Intent::Running, Phase::Ready, 2).id, 2));
        assert_eq!(verdict(FailureReason::CommandFailedToStart, &started, true), None);
    }

    #[test]
    fn a_failed_start_needs_a_refusal_since_its_generation() {
        let mut refused = runtime(vec![]);
        refused.refusals.insert(sandbox("sb1", Intent::Running, Phase::Ready, 2).id, vec![3]);
        assert_eq!(
            verdict(FailureReason::StartFailed, &refused, true).as_deref(),
            Some("sb1 went Ready -> Error (StartFailed) at generation 2, but its run of that generation never started"),
            "a refusal before generation 2 was committed is an older start's"
        );
        refused.refusals.values_mut().for_each(|times| times.push(5));
        assert_eq!(verdict(FailureReason::StartFailed, &refused, true), None);
    }

    #[test]
    fn out_of_memory_needs_the_kernels_kill_of_that_generations_workload() {
        let mut killed = runtime(vec![run(1, true), run(2, true)]);
        let id = sandbox("sb1", Intent::Running, Phase::Ready, 2).id;
        killed.oom_kills.push((id.clone(), 1));
        assert_eq!(
            verdict(FailureReason::OutOfMemory, &killed, true).as_deref(),
            Some(
                "sb1 went Ready -> Error (OutOfMemory) at generation 2, but its run of that generation ended otherwise"
            ),
            "generation 1's kill says nothing of generation 2"
        );
        killed.oom_kills.push((id, 2));
        assert_eq!(verdict(FailureReason::OutOfMemory, &killed, true), None);
    }

    #[test]
    fn only_errors_out_of_a_run_of_the_same_generation_are_judged() {
        let failed = sandbox("sb1", Intent::Running, error(FailureReason::StartFailed), 2);
        assert!(failure_to_justify(&sandbox("sb1", Intent::Running, Phase::Stopping, 2), &failed).is_none());
        assert!(failure_to_justify(&sandbox("sb1", Intent::Running, Phase::Ready, 1), &failed).is_none());
        assert!(failure_to_justify(&sandbox("sb1", Intent::Running, Phase::Starting, 2), &failed).is_some());
    }
}
