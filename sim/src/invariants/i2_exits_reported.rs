//! I2 (DESIGN 4): every genuine exit of the current run is reported within a bounded time.
//! Checked all along: a record still showing a run whose latest run of its generation ended
//! longer ago than the bound (counted from the quiet phase for exits during faults).

use berth_core::{Intent, PhaseKind, Sandbox};

use crate::runtime::RuntimeModel;
use crate::world::micros_of;

/// How long an exit may stay unreported, in simulated microseconds.
pub struct Bound {
    pub micros: u64,
    /// When the fault phase ends: exits before it are counted from here.
    pub quiet_from: u64,
}

/// The problem with `s` at `now`, if its run's exit is overdue in the record.
pub fn unreported(s: &Sandbox, runtime: &RuntimeModel, now: u64, bound: &Bound) -> Option<String> {
    // Error and a completion (Stopped with intent Running) are how an exit is reported.
    // A paused run's end is reported like any other's: the pause ends with it.
    if !matches!(s.intent, Intent::Running | Intent::Paused)
        || matches!(s.phase.kind(), PhaseKind::Error | PhaseKind::Stopped | PhaseKind::Deleting)
    {
        return None;
    }
    // After an out-of-band restart Berth never saw, the restart's run stands for the
    // generation: its exits are the ones to report.
    let (finished, code, cause) = runtime.latest_run(&s.id, s.generation)?.finished?;
    let since = micros_of(finished).max(bound.quiet_from);
    (now > since + bound.micros).then(|| {
        format!(
            "{}'s run of generation {} exited (code {code}, {cause:?}) but the record is still {}",
            s.name, s.generation, s.phase
        )
    })
}

#[cfg(test)]
mod tests {
    use berth_core::{Phase, Timestamp};
    use tokio::sync::watch;

    use super::*;
    use crate::invariants::sandbox;
    use crate::runtime::{EndCause, Run, RunSignal};
    use crate::world::EPOCH_SECS;

    /// A runtime whose sandbox's run of generation 3 exited 1 s into the simulation.
    fn exited() -> RuntimeModel {
        let second = 1_000_000_000;
        let epoch = i64::try_from(EPOCH_SECS).unwrap() * second;
        let mut run = Run::new(3, Timestamp(epoch), "token".into(), watch::channel(RunSignal::Running).0);
        run.finished = Some((Timestamp(epoch + second), 7, EndCause::WorkloadExit));
        let mut runtime = RuntimeModel::default();
        runtime.removed_runs.insert(sandbox("sb2", Intent::Running, Phase::Ready, 3).id, vec![run]);
        runtime
    }

    #[test]
    fn an_exit_still_unreported_after_the_bound_fires() {
        let ready = sandbox("sb2", Intent::Running, Phase::Ready, 3);
        let bound = Bound { micros: 500_000, quiet_from: 0 };
        assert_eq!(unreported(&ready, &exited(), 1_400_000, &bound), None, "within the bound");
        assert_eq!(
            unreported(&ready, &exited(), 1_600_000, &bound).as_deref(),
            Some("sb2's run of generation 3 exited (code 7, WorkloadExit) but the record is still Ready")
        );
        let during_faults = Bound { micros: 500_000, quiet_from: 2_000_000 };
        assert_eq!(unreported(&ready, &exited(), 2_400_000, &during_faults), None, "counted from the quiet phase");
    }

    #[test]
    fn a_reported_exit_or_another_generation_is_quiet() {
        let bound = Bound { micros: 0, quiet_from: 0 };
        let late = 10_000_000;
        assert_eq!(unreported(&sandbox("sb2", Intent::Running, Phase::Stopped, 3), &exited(), late, &bound), None);
        assert_eq!(unreported(&sandbox("sb2", Intent::Stopped, Phase::Ready, 3), &exited(), late, &bound), None);
        assert_eq!(unreported(&sandbox("sb2", Intent::Running, Phase::Ready, 4), &exited(), late, &bound), None);
    }
}
