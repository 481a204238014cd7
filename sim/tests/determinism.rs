//! I9: the same seed and build give a byte-identical trace; another seed gives another.

use std::time::Duration;

use berth_sim::run::run;
use berth_sim::scenario::{DriverKind, Scenario};

fn trace(seed: u64, gateways: usize) -> String {
    let scenario =
        Scenario::with_phases(seed, Duration::from_secs(20), Duration::from_secs(15)).with_gateways(gateways);
    let outcome = run(scenario, None);
    assert!(outcome.passed(), "seed {seed}: {:?}", outcome.violations);
    outcome.trace_lines()
}

#[test]
fn the_same_seed_gives_the_same_trace_byte_for_byte() {
    let seeds = [(3, 1), (17, 1), (2024, 1), (3, 3), (41, 2)];
    let drivers: Vec<DriverKind> = seeds.iter().map(|(seed, _)| Scenario::standard(*seed).driver).collect();
    assert!(drivers.contains(&DriverKind::Container) && drivers.contains(&DriverKind::Process), "{drivers:?}");
    for (seed, gateways) in seeds {
        let (first, second) = (trace(seed, gateways), trace(seed, gateways));
        assert!(first.lines().count() > 300, "seed {seed} did too little to be a test");
        if first != second {
            let line = first.lines().zip(second.lines()).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "seed {seed} diverged at line {line}:\n{}\n{}",
                first.lines().nth(line).unwrap_or_default(),
                second.lines().nth(line).unwrap_or_default()
            );
        }
    }
}

#[test]
fn different_seeds_give_different_traces() {
    assert_ne!(trace(5, 1), trace(6, 1));
    assert_ne!(trace(5, 1), trace(5, 3));
}
