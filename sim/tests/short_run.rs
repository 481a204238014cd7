//! The simulator's short run: a handful of seeds of the standard fault mix, each checked against
//! every invariant. `ci/mutants` runs it against berth-core's mutants its own tests miss.

use std::time::Duration;

use berth_core::bugs::Bug;
use berth_sim::invariants::Invariant;
use berth_sim::run::run;
use berth_sim::scenario::{DriverKind, Scenario};
use berth_sim::trace::Kind;

/// Runs each scenario: every one must hold every invariant.
fn every_one_holds(scenarios: impl IntoIterator<Item = Scenario>) {
    let failures: Vec<String> = scenarios
        .into_iter()
        .map(|scenario| run(scenario, None))
        .filter(|outcome| !outcome.passed())
        .map(|outcome| format!("seed {}: {:?}", outcome.seed, outcome.violations))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sixteen_short_seeds_hold_every_invariant() {
    every_one_holds(
        (100..116).map(|seed| Scenario::with_phases(seed, Duration::from_secs(30), Duration::from_secs(20))),
    );
}

/// Many hosts (DESIGN 14): three nodes, each a gateway with its own process driver on the one
/// simulated kernel, through node losses (some for good), store stalls that fence a node, crashes
/// and partitions, held to every invariant with N1 and N2. `ci/sim-nodes` explores 1,000 seeds.
#[test]
fn four_seeds_with_three_nodes_hold_every_invariant() {
    every_one_holds((0..4).map(|seed| Scenario::standard(seed).with_nodes(3)));
}

/// Gateways whose readings of the store's clock are off by up to 5 s either way (a host's clock
/// stepped since its gateway measured the database's): deadlines, idle timeouts (with no exec:
/// an exec's activity is stamped by the gateway that recorded it) and restart backoffs still
/// hold on the store's clock (T1, R1), since each such decision commits only once the store's
/// clock agrees (`Write::NotBefore`), and every other invariant holds.
#[test]
fn three_gateways_whose_clocks_disagree_hold_every_invariant() {
    let skewed = |seed| Scenario::standard(seed).with_gateways(3).with_lifetimes(true);
    every_one_holds((0..4).map(|seed| skewed(seed).with_clock_skew(Duration::from_secs(5))));
}

/// N1's race found with skewed clocks, pinned: a sandbox failed on node-1 (its main process
/// exited, its supervisor not yet gone), node-1's lease calls stall until its lease lapses, and
/// a start at that moment placed the next generation on node-0 while node-1 still ran the last
/// one. Now the next generation waits for node-1 to come back or be fenced
/// (`fencing::may_linger`).
#[test]
fn a_failed_sandbox_on_a_lapsed_node_is_not_started_elsewhere_before_the_node_is_fenced() {
    let scenario = Scenario::standard(1066).with_nodes(3).with_lifetimes(true);
    every_one_holds([scenario.with_clock_skew(Duration::from_secs(5))]);
}

/// G1 is not judged on nothing: with the egress workload a seed's runs both reach their
/// providers' endpoints and are refused them, as attaches, detaches and starts interleave, and
/// the destinations on each rule's edges come up on both sides.
#[test]
fn egress_requests_are_opened_and_refused_and_each_is_judged() {
    let outcome = run(Scenario::standard(1).with_egress(true), None);
    assert!(outcome.passed(), "{:?}", outcome.violations);
    let details = |kind: Kind| outcome.trace.iter().filter(|e| e.kind == kind).map(|e| e.detail.clone()).collect();
    let (opened, refused): (Vec<String>, Vec<String>) = (details(Kind::Egress), details(Kind::EgressRefused));
    assert!(opened.len() >= 30, "{} connections", opened.len());
    assert!(refused.len() >= 30, "{} refusals", refused.len());
    let some = |events: &[String], what: &str| events.iter().any(|e| e.contains(what));
    // A name below the suffix, a name resolving into the block, an address at the block's edge.
    for allowed in [" reached api.p", " reached in-p", " reached 10."] {
        assert!(some(&opened, allowed), "no connection{allowed}: {opened:?}");
    }
    // The suffix's text without its dot, a name into loopback, a trailing dot.
    for refusal in [": xp", ": lo.p", ".test."] {
        assert!(some(&refused, refusal), "no refusal of {refusal}: {refused:?}");
    }
}

/// The simulator must see each known bug when its switch puts it back: a simulator that stopped
/// catching them would pass every other test. Each is pinned at the first seed `berth-sim bugs`
/// found it at (searching from 0, with as many gateways as the bug needs), so this stays quick
/// in a debug build; `ci/sim` and `ci/bench` run that search itself, optimized. A change that moves a catch
/// to another seed fails here: run `berth-sim bugs` and pin the seed it prints.
#[test]
fn every_known_bug_switch_is_caught_at_its_pinned_seed() {
    for bug in Bug::ALL {
        let (seed, invariant) = match bug {
            Bug::PollBypassesFence => (3, Invariant::I1),
            Bug::EventBypassesFence => (1, Invariant::I1),
            Bug::DeleteWithoutRetry => (29, Invariant::I3),
            Bug::RotationOutsideStart => (0, Invariant::C1),
            Bug::EffectWithoutRecheck => (1, Invariant::D1),
            Bug::RecordAfterStart => (0, Invariant::D1),
            Bug::FenceFromRecordedExit => (23, Invariant::I1),
            Bug::SweepSkipsLastPage => (0, Invariant::I1),
            Bug::TenureFromAnswer => (116, Invariant::L1),
            Bug::ExecRetryRunsTwice => (4, Invariant::E1),
            // Caught first as the second launch of the exec it let into the next run.
            Bug::ExecNotFenced => (1, Invariant::E1),
            Bug::ExpiryIgnoresRenew => (5, Invariant::T1),
            // The claim written over the winner: one member claimed twice (P1).
            Bug::ClaimWithoutCas => (1, Invariant::P1),
            Bug::IdleIgnoresExecs => (5, Invariant::T1),
            Bug::EgressFromAttach => (0, Invariant::G1),
            Bug::SignalsSupervisorOnly => (1, Invariant::D1),
            Bug::ChildLeftBehind => (1, Invariant::D1),
            Bug::ClaimUnready => (0, Invariant::P1),
            Bug::ExecWhileStarting => (0, Invariant::X1),
            Bug::RestartPastMaximum => (1, Invariant::R1),
            Bug::ExecWhilePausing => (3, Invariant::S3),
            // The run ends under the pause, and the record stays Paused.
            Bug::PauseOutlivesRun => (4, Invariant::I2),
            // A pause the runtime never carried out needs a failed call or a crash at the
            // right moment.
            Bug::PauseConfirmedBlind => (4, Invariant::S3),
            // A create from a snapshot, its delete right after, before the copy's first start.
            Bug::SnapshotDeletedUnderSeed => (10, Invariant::S2),
            Bug::ForkHalfMade => (0, Invariant::S4),
            // The restored run, taken for a restart out of band, fails as if it had ended.
            Bug::RestoreForgetsStart => (3, Invariant::I1),
            // A sandbox's delete, then its volume's at once: the files go under the run.
            Bug::VolumeRemovedUnderRun => (1, Invariant::S2),
            // A URL asked for, a stop and a start, then the old URL: the new run answers it.
            Bug::PortTokenOutlivesRun => (1, Invariant::U1),
            // A node cut off from the store keeps its runs; fenced, its sandbox starts on another.
            Bug::LapsedNodeRunsOn => (23, Invariant::N1),
            // Sandboxes placed on a node gone for good fail there instead of running elsewhere.
            Bug::PlacesOnLapsed => (0, Invariant::I8),
            // A holder whose clock runs ahead expires an idle sandbox before its timeout.
            Bug::ExpiresOnOwnClock => (1, Invariant::T1),
        };
        caught_at(bug, seed, invariant);
    }
}

/// Recording a start only after it took effect is defect 2 under the container driver and
/// defect 1 under the process driver: a gateway dead right after a spawn leaves a
/// supervisor no file names, and the re-driven start spawns the generation again.
#[test]
fn recording_a_start_after_the_spawn_is_caught_under_the_process_driver() {
    assert_eq!(Scenario::standard(1).driver, DriverKind::Process);
    let outcome = caught_at(Bug::RecordAfterStart, 1, Invariant::D1);
    assert!(outcome.violations[0].message.contains("a second run of"), "{:?}", outcome.violations);
}

fn caught_at(bug: Bug, seed: u64, invariant: Invariant) -> berth_sim::run::Outcome {
    let scenario = Scenario::standard(seed)
        .with_gateways(bug.gateways())
        .with_nodes(bug.nodes())
        .with_execs(bug.execs())
        .with_lifetimes(bug.lifetimes())
        .with_egress(bug.egress())
        .with_state(bug.state())
        .with_snapshots(bug.snapshots())
        .with_volumes(bug.volumes())
        .with_ports(bug.ports())
        .with_clock_skew(bug.clock_skew());
    let outcome = run(scenario, Some(bug));
    let caught: Vec<Invariant> = outcome.violations.iter().map(|v| v.invariant).collect();
    assert_eq!(caught.first(), Some(&invariant), "{} at seed {seed}: {:?}", bug.name(), outcome.violations);
    outcome
}
