//! The multi-gateway mode: several gateways on one store, only the reconcile lease's holder
//! reconciling. Two pinned interleavings (the holder's store connection hangs; the holder
//! crashes), then random seeds with three gateways.

use std::time::Duration;

use berth_sim::faults::Scripted;
use berth_sim::gateway::LEASE_TTL;
use berth_sim::run::{Outcome, run};
use berth_sim::scenario::{Faults, Scenario};
use berth_sim::trace::Kind;
use berth_sim::world::Event;

/// Two gateways and a workload, with no random faults: only `script`.
fn scripted(script: Vec<(Duration, Scripted)>) -> Outcome {
    let mut scenario = Scenario::with_phases(1, Duration::from_secs(30), Duration::from_secs(20)).with_gateways(2);
    scenario.faults = Faults::default();
    scenario.script = script;
    let outcome = run(scenario, None);
    assert!(outcome.passed(), "{:?}", outcome.violations);
    outcome
}

fn times(trace: &[Event], actor: &str, kind: Kind) -> Vec<u64> {
    trace.iter().filter(|e| e.actor == actor && e.kind == kind).map(|e| e.t).collect()
}

const SECOND: u64 = 1_000_000;

/// The holder's lease renewal hangs in flight for over two time-to-lives while its other store
/// calls go through (one pooled connection hung). It must stop reconciling when its lease runs
/// out on its own clock, without the store's answer, so that the gateway taking over is alone
/// (L1, checked at every poll and watch of the runtime). It once kept reconciling until the
/// hung renewal came back.
#[test]
fn a_holder_whose_lease_renewal_hangs_stops_reconciling_before_another_takes_over() {
    let stall = Scripted::Stall { gateway: 0, stall: Duration::from_secs(12), lease_only: true };
    let outcome = scripted(vec![(Duration::from_secs(3), stall)]);
    let polls = times(&outcome.trace, "gateway0", Kind::Poll);
    assert!(polls.iter().any(|&t| t < 3 * SECOND), "gateway0 was not reconciling before the stall");
    let takeover = times(&outcome.trace, "gateway1", Kind::Lease { term: 2 });
    let takeover = *takeover.first().expect("gateway1 never took the lease over");
    assert!((3 * SECOND..15 * SECOND).contains(&takeover), "the take-over at {takeover} us is not inside the stall");
    assert!(polls.iter().all(|&t| t < takeover), "gateway0 polled the runtime after gateway1 took the lease");
    assert!(
        times(&outcome.trace, "gateway1", Kind::Poll).iter().any(|&t| t > takeover),
        "gateway1 took the lease but never reconciled"
    );
}

/// The holder shuts down while its lease renewal hangs: it stops reconciling at once, without
/// waiting for the store's answer nor for its lease to run out.
#[test]
fn a_holder_shutting_down_while_its_renewal_hangs_stops_reconciling_at_once() {
    let stall = Scripted::Stall { gateway: 0, stall: Duration::from_secs(20), lease_only: true };
    let shutdown = Duration::from_secs(4);
    let outcome = scripted(vec![(Duration::from_secs(3), stall), (shutdown, Scripted::Shutdown { gateway: 0 })]);
    let polls = times(&outcome.trace, "gateway0", Kind::Poll);
    assert!(polls.iter().any(|&t| t < 3 * SECOND), "gateway0 was not reconciling before the stall");
    let shutdown = shutdown.as_micros() as u64;
    let late: Vec<&u64> = polls.iter().filter(|&&t| t > shutdown).collect();
    assert!(late.is_empty(), "gateway0 polled the runtime after it began shutting down: {late:?}");
    assert!(
        !times(&outcome.trace, "gateway1", Kind::Lease { term: 2 }).is_empty(),
        "gateway1 never took the lease over"
    );
}

/// The holder crashes and stays down: another gateway takes the lease within a time-to-live
/// (plus the third of one between its attempts), and every sandbox still converges.
#[test]
fn the_holder_crashed_is_replaced_within_its_time_to_live() {
    let crash = Duration::from_secs(5);
    let outcome = scripted(vec![(crash, Scripted::Crash { gateway: 0, down: Duration::from_secs(40) })]);
    let takeover = times(&outcome.trace, "gateway1", Kind::Lease { term: 2 });
    let takeover = *takeover.first().expect("gateway1 never took the lease over");
    let crashed = crash.as_micros() as u64;
    let bound = (LEASE_TTL + LEASE_TTL / 3).as_micros() as u64;
    assert!(takeover > crashed && takeover - crashed <= bound, "take-over {takeover} us after a crash at {crashed} us");
}

#[test]
fn sixteen_short_seeds_with_three_gateways_hold_every_invariant() {
    let failures: Vec<String> = (200..216)
        .map(|seed| {
            run(Scenario::with_phases(seed, Duration::from_secs(30), Duration::from_secs(20)).with_gateways(3), None)
        })
        .filter(|outcome| !outcome.passed())
        .map(|outcome| format!("seed {}: {:?}", outcome.seed, outcome.violations))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
