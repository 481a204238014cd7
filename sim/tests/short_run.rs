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

/// The short run must see each motivating race when its known-bug switch puts it back: a
/// simulator that stopped catching them would pass every other test. The search stops at the
/// first catch; most bugs fall at seed 0, R2's delete race needs the rarest interleaving and a
/// second gateway (writers inside one gateway take turns).
#[test]
fn every_known_bug_switch_is_caught_within_a_hundred_seeds() {
    for bug in Bug::ALL {
        let caught =
            (0..100).find(|&seed| !run(Scenario::standard(seed).with_gateways(bug.gateways()), Some(bug)).passed());
        assert!(caught.is_some(), "{} was not caught in 100 seeds", bug.name());
    }
}
