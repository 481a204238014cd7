//! Seeds that long explorations caught, replayed with the standard scenario: each failed before
//! the fix named beside it, and a change that brings its defect back fails here.

use berth_sim::run::run;
use berth_sim::scenario::Scenario;

/// `(seed, what it caught)`, one gateway.
const FOUND: [(u64, &str); 8] = [
    // A start begun by a gateway that died, the run then removed out of band with its folder:
    // the re-driven start spawned the generation again (process driver; the fix reports it Gone).
    (220, "D1: sb0 generation 1 was spawned a second time"),
    (304, "D1: sb5 generation 3 was spawned a second time"),
    (357, "D1: sb3 generation 1 was spawned a second time"),
    (426, "D1: sb3 generation 2 was spawned a second time"),
    (1518, "D1: sb2 generation 2 was spawned a second time"),
    // The container driver installed a generation's token before recording its start: a start
    // that failed in between, then an out-of-band restart, ran the generation unrecorded, and
    // the re-driven start stopped it as an older one's (the fix installs after the record).
    (252, "D1: sb6 was stopped at generation 2 while its intent is Running (Ready)"),
    (1212, "D1: sb3 was stopped at generation 4 while its intent is Running (Ready)"),
    // A start still under way in the engine when its stop was acknowledged: the run came up
    // after, and no report could say whose it was, so it was never stopped (berth-core now
    // stops any run alive after every exit seen while the intent is Stopped).
    (1750, "I8: sb6 is Stopped at generation 2 but the runtime runs Some(2)"),
];

/// `(seed, what it caught)`, three gateways.
const FOUND_WITH_THREE_GATEWAYS: [(u64, &str); 1] = [
    // The folder removed under a run whose start a gateway could not confirm (the state file's
    // write failed): the sandbox went to Error with the run alive, and the next Start spawned
    // generation 2 beside it (the fix settles an older unconfirmed start before spawning).
    (1026, "D1: r2c0n1 generation 2 was spawned while its generation 1 still runs (pid 104)"),
];

/// `(seed, gateways, what it caught)`, with the exec workload.
const FOUND_WITH_EXECS: [(u64, usize, &str); 6] = [
    // A container restarted out of band (the same generation, a new supervisor) was handed its
    // open execs again and ran them a second time (the fix: the supervisor keeps the ids its
    // generation started where a restart finds them, and reports such an exec lost).
    (4, 1, "E1: exec x26 of sb-12d696474f3e86fd7b059420e539406b was launched 2 times"),
    // A gateway cut off from what a supervisor sent, still sending to it (execs handed out every
    // two seconds), kept the session alive while no exec report arrived: the exec stayed
    // Admitted (the fix: only answers to its heartbeats count as the gateway's word).
    (62, 3, "E3: exec x44 of sb-25960aa85b2b467068480b3c3884491c is still Admitted after the quiet phase"),
    // An admission handed its exec to the run's session just as that connection broke; the
    // supervisor reconnected and nothing handed the exec over again, with one gateway (the fix:
    // every session hands its run its open execs every two seconds, not only with several).
    (559, 1, "E3: exec x25 of sb-1b96d00e33f3d95bdfb4c46048cbe6c1 is still Admitted after the quiet phase"),
    (657, 1, "E3: exec x28 of sb-750879cee97b7466bc1f8589aa72bbce is still Admitted after the quiet phase"),
    // A `docker restart` out of band, still starting as a Start of the next generation installed
    // its identity: the engine's start found the container running (a 304) with the older
    // generation's token read, the driver took that run for the new generation's, and the new
    // generation was blamed for its end (the fix: a run the driver did not begin is kept only if
    // its supervisor's began file names the new generation; else it is stopped and the
    // container started again).
    (
        3226,
        1,
        "I1: sb0 went Starting -> Error (ContainerExited) at generation 3, but its run of that generation never started",
    ),
    // The first cut of that fix judged such a run by its start time against the install's, and
    // stopped the run of an earlier attempt of the same start whose reply was lost.
    (628, 1, "D1: sb5 was stopped at generation 1 while its intent is Running (Ready)"),
];

/// `(seed, what it caught)`, one gateway, with the exec, lifetime and egress workloads.
const FOUND_WITH_EVERYTHING: [(u64, &str); 3] = [
    // The same race met by a re-driven start: a restart out of band, already under way as the
    // first attempt of a Start installed the new generation's token, became running with the
    // older one; the re-driven start took the run that started since it began for the new
    // generation's and reported that run's exit as the new generation's (the fix: such a run
    // is the generation's only if its began file names it, else the container is started anew).
    (
        37,
        "I1: sb6 went Starting -> Error (ContainerExited) at generation 3, but its run of that generation never started",
    ),
    // A gateway died right after spawning a crash-looping run's supervisor; the command failed,
    // leaving a child in the run's group, and the supervisor went after recording the exit. The
    // driver adopted the run from its records with no pid, so no stop reached the child (the
    // fix: the run's group is found by the identity its members carry, and recorded).
    (
        20,
        "D1: sb3 generation 14's command's child (orphaned, adopted by init) pid 120 still runs 1s after a stop of \
         generation 15 was acknowledged",
    ),
    (
        154,
        "D1: sb5 generation 1's command's child (orphaned, adopted by init) pid 138 still runs 1s after its delete was acknowledged",
    ),
];

#[test]
fn seeds_the_explorations_caught_hold_every_invariant() {
    let one = FOUND.iter().map(|(seed, caught)| (Scenario::standard(*seed), caught));
    let three =
        FOUND_WITH_THREE_GATEWAYS.iter().map(|(seed, caught)| (Scenario::standard(*seed).with_gateways(3), caught));
    let execs = FOUND_WITH_EXECS
        .iter()
        .map(|(seed, gateways, caught)| (Scenario::standard(*seed).with_gateways(*gateways).with_execs(true), caught));
    let everything = FOUND_WITH_EVERYTHING.iter().map(|(seed, caught)| {
        (Scenario::standard(*seed).with_execs(true).with_lifetimes(true).with_egress(true), caught)
    });
    let failures: Vec<String> = one
        .chain(three)
        .chain(execs)
        .chain(everything)
        .map(|(scenario, caught)| (run(scenario, None), caught))
        .filter(|(outcome, _)| !outcome.passed())
        .map(|(outcome, caught)| format!("seed {} (once: {caught}): {:?}", outcome.seed, outcome.violations))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
