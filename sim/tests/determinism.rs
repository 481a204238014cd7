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

/// Seeds whose trace once depended on an unbiased `tokio::select!` in the simulated supervisors:
/// tokio picks such a select's first branch from a generator seeded by the OS (turmoil seeds it
/// only under `--cfg tokio_unstable`), and whether a session or its signal was polled first
/// changed what reached the network (an accepted stale supervisor's first heartbeat; how a
/// session's frames were written), which moved every later message's latency. Each such branch
/// is a coin flip, so each seed runs three times: about half the pairs of runs diverged.
#[test]
fn seeds_that_once_diverged_give_one_trace_run_after_run() {
    let short = |seed| Scenario::with_phases(seed, Duration::from_secs(20), Duration::from_secs(15));
    // Seed 17's one accepted stale supervisor once answered at 38.3 s of its standard fault
    // phase. Its quiet phase leaves the healing client 12 s: gateway crashes and late store
    // replies near the end of its faults can keep a run's exit unseen for 10 s.
    let scenarios = [
        short(15),
        short(25),
        short(42),
        short(64),
        Scenario::with_phases(17, Duration::from_secs(40), Duration::from_secs(20)),
    ];
    for scenario in scenarios {
        let seed = scenario.seed;
        let traces: Vec<String> = (0..3)
            .map(|_| {
                let outcome = run(scenario.clone(), None);
                assert!(outcome.passed(), "seed {seed}: {:?}", outcome.violations);
                outcome.trace_lines()
            })
            .collect();
        for other in &traces[1..] {
            if *other != traces[0] {
                let line = traces[0].lines().zip(other.lines()).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "seed {seed} diverged at line {line}:\n{}\n{}",
                    traces[0].lines().nth(line).unwrap_or_default(),
                    other.lines().nth(line).unwrap_or_default()
                );
            }
        }
    }
}

/// The workloads that run more of the gateway's code in the world (the preview proxy's HTTP
/// through hyper, a run's server, copies, volumes) keep a seed's trace one as well.
#[test]
fn the_newer_workloads_give_one_trace_run_after_run() {
    let scenario = || {
        Scenario::with_phases(3, Duration::from_secs(20), Duration::from_secs(15))
            .with_ports(true)
            .with_volumes(true)
            .with_snapshots(true)
            .with_state(true)
    };
    let first = run(scenario(), None);
    assert!(first.passed(), "{:?}", first.violations);
    let (first, second) = (first.trace_lines(), run(scenario(), None).trace_lines());
    assert!(first.contains("GET sb"), "the port workload ran");
    if first != second {
        let line = first.lines().zip(second.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "diverged at line {line}:\n{}\n{}",
            first.lines().nth(line).unwrap_or_default(),
            second.lines().nth(line).unwrap_or_default()
        );
    }
}

#[test]
fn different_seeds_give_different_traces() {
    assert_ne!(trace(5, 1), trace(6, 1));
    assert_ne!(trace(5, 1), trace(5, 3));
}
