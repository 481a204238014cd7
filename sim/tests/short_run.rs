//! The simulator's short run: a handful of seeds of the standard fault mix, each checked against
//! every invariant. `ci/mutants` runs it against berth-core's mutants its own tests miss.

use std::time::Duration;

use berth_core::bugs::Bug;
use berth_sim::run::run;
use berth_sim::scenario::Scenario;

#[test]
fn sixteen_short_seeds_hold_every_invariant() {
    let failures: Vec<String> = (100..116)
        .map(|seed| run(Scenario::with_phases(seed, Duration::from_secs(30), Duration::from_secs(20)), None))
        .filter(|outcome| !outcome.passed())
        .map(|outcome| format!("seed {}: {:?}", outcome.seed, outcome.violations))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The simulator must see each known bug when its switch puts it back: a simulator that stopped
/// catching them would pass every other test. Each is pinned at the first seed `berth-sim bugs`
/// found it at (searching from 0, with as many gateways as the bug needs), so this stays quick
/// in a debug build; `ci/test` runs that search itself in release. A change that moves a catch
/// to another seed fails here: run `berth-sim bugs` and pin the seed it prints.
#[test]
fn every_known_bug_switch_is_caught_at_its_pinned_seed() {
    for bug in Bug::ALL {
        let (seed, invariant) = match bug {
            Bug::PollBypassesFence => (0, "I1"),
            Bug::EventBypassesFence => (1, "I1"),
            Bug::DeleteWithoutRetry => (14, "I3"),
            Bug::RotationOutsideStart => (0, "I1"),
            Bug::EffectWithoutRecheck => (0, "D1"),
            Bug::RecordAfterStart => (0, "D1"),
            Bug::FenceFromRecordedExit => (21, "I1"),
            Bug::SweepSkipsLastPage => (0, "I1"),
            Bug::TenureFromAnswer => (93, "L1"),
        };
        let outcome = run(Scenario::standard(seed).with_gateways(bug.gateways()), Some(bug));
        let caught: Vec<&str> = outcome.violations.iter().map(|v| v.invariant).collect();
        assert_eq!(caught.first(), Some(&invariant), "{} at seed {seed}: {:?}", bug.name(), outcome.violations);
    }
}
