//! D1 (DESIGN 11): a driver never runs two processes or containers for one generation, and a
//! stop that was acknowledged stops what runs. Checked by the runtime host as each run starts
//! (against the sandbox's earlier runs), as each stop or signal lands (against the record), and
//! a bound after each stop or delete a driver acknowledged (against the host's process table:
//! nothing of a stopped run's tree, orphans init adopted included, may run by then).

use std::time::Duration;

use berth_core::{Intent, Sandbox};

use crate::kernel::Role;
use crate::runtime::Run;

/// The problem with starting a run of `generation` in a container that already had `runs`, if
/// a driver (not an out-of-band restart) started that generation in it before.
pub fn started_twice(name: &str, runs: &[Run], generation: Option<u64>, out_of_band: bool) -> Option<String> {
    let twice = !out_of_band && runs.iter().any(|r| !r.out_of_band && Some(r.generation) == generation);
    twice.then(|| {
        format!("{name} generation {} was started a second time in the same container", generation.unwrap_or(0))
    })
}

/// The problems with spawning a process group of `generation` for a sandbox whose earlier groups
/// were `earlier` (`(pid, run)`): one for each still live, and one for each of the same generation.
pub fn spawned_twice<'a>(
    name: &str,
    earlier: impl IntoIterator<Item = (i32, &'a Run)>,
    generation: Option<u64>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (pid, run) in earlier {
        if run.live() {
            let which = if generation == Some(run.generation) { "a second run of " } else { "" };
            problems.push(format!(
                "{which}{name} generation {} was spawned while its generation {} still runs (pid {pid})",
                generation.unwrap_or(0),
                run.generation,
            ));
        } else if generation.is_some_and(|g| g == run.generation) {
            problems.push(format!("{name} generation {} was spawned a second time", run.generation));
        }
    }
    problems
}

/// The harm Berth could do to itself: the problem with a stop (`how`: "stopped", "sent Term")
/// landing on a run of generation `hit`, if that is the current generation's run while the
/// record's intent is Running. Every stop is decided with intent Stopped or Deleted, or to replace
/// an older generation's run; one that lands like this (a stale effect that skipped its re-check,
/// a pid taken for another's) kills a run the user wants.
pub fn unwanted_stop(record: &Sandbox, hit: Option<u64>, how: &str) -> Option<String> {
    (record.intent == Intent::Running && hit == Some(record.generation)).then(|| {
        format!(
            "{} was {how} at generation {} while its intent is Running ({})",
            record.name, record.generation, record.phase
        )
    })
}

/// The problem with what of a sandbox's process tree still runs (`left`: pid, its run's
/// generation, what it is, whether init adopted it) `bound` after a driver acknowledged a stop
/// of its runs up to `generation` (a delete: `None`), if any of those runs' processes does.
pub fn outlived_stop(
    name: &str,
    generation: Option<u64>,
    bound: Duration,
    left: impl IntoIterator<Item = (i32, u64, Role, bool)>,
) -> Option<String> {
    let mut left = left.into_iter().filter(|(_, g, _, _)| generation.is_none_or(|stopped| *g <= stopped));
    let (pid, of, role, orphan) = left.next()?;
    let what = match (role, orphan) {
        (Role::Supervisor, _) => "supervisor",
        (Role::Command, false) => "command",
        (Role::Command, true) => "command (orphaned, adopted by init)",
        (Role::Helper, false) => "command's child",
        (Role::Helper, true) => "command's child (orphaned, adopted by init)",
    };
    let stop = match generation {
        Some(generation) => format!("a stop of generation {generation}"),
        None => "its delete".to_string(),
    };
    Some(format!("{name} generation {of}'s {what} pid {pid} still runs {bound:?} after {stop} was acknowledged"))
}

#[cfg(test)]
mod tests {
    use berth_core::{Phase, Timestamp};
    use tokio::sync::watch;

    use super::*;
    use crate::invariants::sandbox;
    use crate::runtime::{EndCause, RunSignal};

    fn run(generation: u64, live: bool) -> Run {
        let mut run = Run::new(generation, Timestamp(1), "token".into(), watch::channel(RunSignal::Running).0);
        run.finished = (!live).then_some((Timestamp(2), 143, EndCause::Stopped));
        run
    }

    #[test]
    fn a_generation_started_twice_in_its_container_fires() {
        let runs = [run(1, false), run(2, false)];
        assert_eq!(
            started_twice("sb1", &runs, Some(2), false).as_deref(),
            Some("sb1 generation 2 was started a second time in the same container")
        );
        assert_eq!(started_twice("sb1", &runs, Some(3), false), None);
        assert_eq!(started_twice("sb1", &runs, Some(2), true), None, "an out-of-band restart reruns it");
        let mut restarted = run(3, false);
        restarted.out_of_band = true;
        assert_eq!(started_twice("sb1", &[restarted], Some(3), false), None, "the earlier run was the restart");
    }

    #[test]
    fn a_spawn_beside_a_live_group_or_of_a_spawned_generation_fires() {
        let (ended, live) = (run(1, false), run(2, true));
        assert_eq!(spawned_twice("sb1", [(100, &ended)], Some(2)), Vec::<String>::new());
        assert_eq!(
            spawned_twice("sb1", [(100, &ended), (101, &live)], Some(2)),
            ["a second run of sb1 generation 2 was spawned while its generation 2 still runs (pid 101)"]
        );
        assert_eq!(
            spawned_twice("sb1", [(100, &ended), (101, &live)], Some(3)),
            ["sb1 generation 3 was spawned while its generation 2 still runs (pid 101)"]
        );
        assert_eq!(spawned_twice("sb1", [(100, &ended)], Some(1)), ["sb1 generation 1 was spawned a second time"]);
    }

    #[test]
    fn a_process_of_a_stopped_run_left_running_fires() {
        let bound = Duration::from_secs(1);
        assert_eq!(
            outlived_stop("sb1", Some(2), bound, [(140, 3, Role::Command, false), (120, 2, Role::Helper, true)])
                .as_deref(),
            Some(
                "sb1 generation 2's command's child (orphaned, adopted by init) pid 120 still runs 1s after a stop of \
                 generation 2 was acknowledged"
            )
        );
        assert_eq!(outlived_stop("sb1", Some(2), bound, [(140, 3, Role::Supervisor, false)]), None, "a newer run");
        assert_eq!(
            outlived_stop("sb1", None, bound, [(140, 3, Role::Supervisor, false)]).as_deref(),
            Some("sb1 generation 3's supervisor pid 140 still runs 1s after its delete was acknowledged")
        );
        assert_eq!(outlived_stop("sb1", None, bound, []), None);
    }

    #[test]
    fn a_stop_of_the_wanted_run_fires() {
        let ready = sandbox("sb1", Intent::Running, Phase::Ready, 2);
        assert_eq!(
            unwanted_stop(&ready, Some(2), "stopped").as_deref(),
            Some("sb1 was stopped at generation 2 while its intent is Running (Ready)")
        );
        assert_eq!(
            unwanted_stop(&ready, Some(2), "sent Term").as_deref(),
            Some("sb1 was sent Term at generation 2 while its intent is Running (Ready)")
        );
        assert_eq!(unwanted_stop(&ready, Some(1), "stopped"), None, "an older generation's run");
        assert_eq!(unwanted_stop(&ready, None, "stopped"), None, "nothing ran");
        let stopping = sandbox("sb1", Intent::Stopped, Phase::Stopping, 2);
        assert_eq!(unwanted_stop(&stopping, Some(2), "stopped"), None);
    }
}
