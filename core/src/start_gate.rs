//! The start gate: the one rule every driver keeps about starting runs (DESIGN 2, 11 D1).
//!
//! berth-core tells runs apart by generation and start time, so a driver must never start a run
//! that would pass for another's: no generation older than one it has started (a late,
//! superseded effect), and no generation twice (a re-driven start, a second gateway). To keep
//! that across a crash, a driver records the generation it is about to start **before** it asks
//! the runtime, outside the compute resource (which may be removed out of band), and confirms it
//! once it knows the outcome. A crash between the two leaves the record unconfirmed: the next
//! start of that generation must find out whether the run began before it starts one, so a run
//! the crashed driver never recorded is adopted instead of doubled (defects 1 and 2 of
//! issue 13).
//!
//! The record goes with the sandbox's delete: ids are never reused, and a start that lands after
//! a delete makes a resource without a record, which the merge's orphan rule removes.

use serde::{Deserialize, Serialize};

use crate::branch::{self, Branch};
use crate::report::{RuntimeState, StartReply};

/// What a driver keeps of the newest generation it began to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRecord {
    pub generation: u64,
    /// False from just before the driver asks the runtime to start the run until it has seen
    /// the outcome.
    pub confirmed: bool,
}

impl StartRecord {
    /// Written before the runtime is asked.
    pub fn intent(generation: u64) -> Self {
        Self { generation, confirmed: false }
    }

    /// Written once the run is known to have started.
    pub fn confirmed(generation: u64) -> Self {
        Self { generation, confirmed: true }
    }
}

/// What a driver does with a start of some generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Nothing of this generation or a newer one was begun: record [`StartRecord::intent`],
    /// start the run, then record [`StartRecord::confirmed`].
    Start,
    /// A newer generation was begun: refuse ([`superseded`]).
    Superseded { newest: u64 },
    /// This generation's run was started: report what the runtime shows of it ([`report`]),
    /// never start another.
    Report,
    /// This generation's start was begun but its outcome never recorded: look for its run.
    /// Found, adopt it (confirm, then [`report`]); not found, it never began: start it.
    Resume,
}

/// The gate for a start of `generation`, given the driver's record.
pub fn gate(record: Option<StartRecord>, generation: u64) -> Gate {
    let gate = match record {
        Some(r) if r.generation > generation => Gate::Superseded { newest: r.generation },
        Some(r) if r.generation == generation && r.confirmed => Gate::Report,
        Some(r) if r.generation == generation => Gate::Resume,
        _ => Gate::Start,
    };
    branch::hit(match gate {
        Gate::Superseded { .. } => Branch::GateSuperseded,
        Gate::Report => Branch::GateReport,
        Gate::Resume => Branch::GateResume,
        Gate::Start => Branch::GateStart,
    });
    gate
}

/// Whether a stop decided for `generation` finds a newer generation begun since: that run is not
/// the stop's to end (D1). A stop waits for the driver's lock, and another gateway's start of the
/// next generation may take the lock first; the stop's re-check of the record came before it.
pub fn stop_superseded(record: Option<StartRecord>, generation: u64) -> bool {
    if crate::bugs::skips_recheck() {
        return false;
    }
    let superseded = record.is_some_and(|r| r.generation > generation);
    if superseded {
        branch::hit(Branch::StopSupersededByNewer);
    }
    superseded
}

/// The reply to a start of a generation newer ones superseded.
pub fn superseded(generation: u64, newest: u64) -> StartReply {
    StartReply::Failed { message: format!("generation {generation} is superseded by {newest}") }
}

/// The reply to a start of a generation whose run was started: what the runtime shows of that
/// run (`None` when the runtime has no run of it: its compute resource was removed since).
pub fn report(run: Option<RuntimeState>) -> StartReply {
    match run {
        Some(RuntimeState::Running { started_at, .. }) => {
            branch::hit(Branch::ReportRunning);
            StartReply::Running { started_at }
        }
        Some(RuntimeState::Exited(marker)) => {
            branch::hit(Branch::ReportExited);
            StartReply::Exited(marker)
        }
        Some(RuntimeState::Created | RuntimeState::Absent { .. }) | None => {
            branch::hit(Branch::ReportGone);
            StartReply::Gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ExitMarker;
    use crate::time::Timestamp;

    #[test]
    fn the_gate_starts_each_generation_once_and_never_an_older_one() {
        assert_eq!(gate(None, 1), Gate::Start);
        assert_eq!(gate(Some(StartRecord::confirmed(1)), 2), Gate::Start);
        assert_eq!(gate(Some(StartRecord::intent(1)), 2), Gate::Start, "an older unconfirmed start is superseded");
        assert_eq!(gate(Some(StartRecord::confirmed(2)), 2), Gate::Report);
        assert_eq!(gate(Some(StartRecord::intent(2)), 2), Gate::Resume);
        assert_eq!(gate(Some(StartRecord::confirmed(3)), 2), Gate::Superseded { newest: 3 });
        assert_eq!(gate(Some(StartRecord::intent(3)), 2), Gate::Superseded { newest: 3 });
    }

    #[test]
    fn a_stop_never_ends_a_generation_begun_after_it_was_decided() {
        assert!(!stop_superseded(None, 2));
        assert!(!stop_superseded(Some(StartRecord::confirmed(2)), 2));
        assert!(!stop_superseded(Some(StartRecord::intent(1)), 2));
        assert!(stop_superseded(Some(StartRecord::intent(3)), 2));
        assert!(stop_superseded(Some(StartRecord::confirmed(3)), 2));
    }

    #[test]
    fn a_started_generation_reports_its_run_or_that_it_is_gone() {
        let t = Timestamp::from_unix_nanos;
        let marker = ExitMarker { started_at: t(1), finished_at: t(2), exit_code: 3, out_of_memory: false };
        assert_eq!(
            report(Some(RuntimeState::Running { started_at: t(1), held: None })),
            StartReply::Running { started_at: t(1) }
        );
        assert_eq!(report(Some(RuntimeState::Exited(marker))), StartReply::Exited(marker));
        assert_eq!(report(Some(RuntimeState::Absent { at: None })), StartReply::Gone);
        assert_eq!(report(Some(RuntimeState::Created)), StartReply::Gone);
        assert_eq!(report(None), StartReply::Gone);
        assert_eq!(superseded(1, 2), StartReply::Failed { message: "generation 1 is superseded by 2".into() });
    }
}
