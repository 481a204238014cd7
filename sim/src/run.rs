//! One seeded run: the hosts, the fault schedule, the phases, and the verdict.

use std::cell::RefCell;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant, UNIX_EPOCH};

use berth_core::branch::{self, Branch};
use berth_core::bugs::{self, Bug};
use tokio::sync::mpsc;

use crate::checker;
use crate::client::client;
use crate::faults::Injector;
use crate::gateway::{RuntimeLinks, gateway};
use crate::invariants::{Invariant, i2_exits_reported, i5_versions, i10_no_panic_or_internal};
use crate::net::gateway_host;
use crate::runtime::Runtime;
use crate::scenario::Scenario;
use crate::supervisor::supervisors;
use crate::world::{EPOCH_SECS, Event, Violation, World, lock, micros, set_loop_now};

/// Simulated time per step: how finely the network's deliveries and the hosts' turns are
/// interleaved (within its turn a host's timers fire at their exact times). Every step ticks
/// every host, so a step's fixed cost is most of a run's; at 4 ms a seed runs 1.6 times as fast
/// as at 2 ms, and `berth-sim bugs` catches each known bug within as many seeds as it did.
pub const TICK: Duration = Duration::from_millis(4);

pub struct Outcome {
    pub seed: u64,
    pub bug: Option<Bug>,
    pub violations: Vec<Violation>,
    pub trace: Vec<Event>,
    pub simulated: Duration,
    pub wall: Duration,
    /// How often each branch of core's decisions ran, in [`Branch::ALL`]'s order.
    pub branches: [u64; Branch::ALL.len()],
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The trace as JSON lines.
    pub fn trace_lines(&self) -> String {
        self.trace.iter().map(|e| serde_json::to_string(e).expect("events serialize") + "\n").collect()
    }
}

thread_local! {
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Records a panic on this thread (a simulation's tasks are all on its thread), so a panic
/// that a task boundary would swallow still fails the run (I10).
fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANIC.with(|p| p.borrow_mut().get_or_insert_with(|| info.to_string()).clone());
            previous(info);
        }));
    });
    PANIC.with(|p| *p.borrow_mut() = None);
}

/// Host names, in the order the timeline draws them.
pub fn client_host(i: usize) -> String {
    format!("client{i}")
}

/// Runs one seed (with `bug` switched on, if any) through `scenario`.
pub fn run(scenario: Scenario, bug: Option<Bug>) -> Outcome {
    let started = Instant::now();
    watch_panics();
    set_loop_now(Duration::ZERO);
    bugs::set(bug);
    // Counts are per thread, and this thread runs only this seed until it returns: start them
    // afresh (a seed that panicked out of `run` may have left some).
    branch::take();
    let seed = scenario.seed;
    let world = World::new(scenario.clone());
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(scenario.total() + Duration::from_secs(30))
        .tick_duration(TICK)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(10))
        .build();

    let (calls_tx, calls_rx) = mpsc::unbounded_channel();
    let (kernel_tx, kernel_rx) = mpsc::unbounded_channel();
    let (spawn_tx, spawn_rx) = mpsc::unbounded_channel();
    let runtime = Runtime::new(world.clone(), spawn_tx);
    // The runtime model, the supervisors and the checker share a host. Of the three, only the
    // supervisors talk over the simulated network (to the gateways), so the host is theirs as
    // the network sees it: a partition of "supervisors" cuts their sessions. The gateways reach
    // the runtime over channels and the checker reads the store and the world, so a host apiece
    // would only cost every step a host more to tick, and every pair of hosts a link more for
    // turmoil to walk. The host never crashes, and the run ends once the checker has judged it.
    // It is ticked first: the gateways' calls reach the runtime outside the simulated network,
    // so a call made in one step is served in the next, never at a time before it was made.
    let host = RuntimeHost { runtime, calls: calls_rx, kernel: kernel_rx, spawns: spawn_rx };
    sim.client("supervisors", host.run(world.clone(), calls_tx.clone()));
    let links = RuntimeLinks { calls: calls_tx, kernel: kernel_tx };
    for g in 0..scenario.gateways {
        let (w, links) = (world.clone(), links.clone());
        sim.host(gateway_host(g), move || gateway(w.clone(), links.clone(), g));
    }
    for i in 0..scenario.clients {
        sim.client(client_host(i), client(world.clone(), i));
    }
    if scenario.execs {
        sim.client("exec-client", crate::execs::exec_client(world.clone()));
    }

    let mut faults = Injector::new(&world);
    let mut quiet = false;
    loop {
        let step = sim.step();
        let elapsed = sim.elapsed();
        set_loop_now(elapsed);
        let finished = match step {
            Ok(finished) => finished,
            Err(e) => {
                world.violate(Invariant::I10, i10_no_panic_or_internal::host_failed(&e));
                true
            }
        };
        if let Some(message) = PANIC.with(|p| p.borrow_mut().take()) {
            world.violate(Invariant::I10, i10_no_panic_or_internal::panicked(&message));
        }
        if finished || !world.violations().is_empty() {
            break;
        }
        if !quiet && elapsed >= scenario.fault_phase {
            quiet = true;
            world.stop_faults();
            faults.heal(&mut sim, &world, None);
        } else if !quiet {
            faults.heal(&mut sim, &world, Some(elapsed));
            faults.inject(&mut sim, &world, elapsed);
        }
    }
    if world.violations().is_empty() {
        let ops = lock(&world.history).clone();
        let commits = lock(&world.commits).clone();
        for problem in i5_versions::not_linearizable(&ops, &commits) {
            world.violate(Invariant::I5, problem);
        }
    }
    bugs::set(None);
    Outcome {
        seed,
        bug,
        violations: world.violations(),
        trace: world.trace(),
        simulated: sim.elapsed(),
        wall: started.elapsed(),
        branches: branch::take(),
    }
}

/// What runs on the runtime's host: the runtime model serving the gateways' calls, the runs'
/// supervisors it spawns, and the checker.
struct RuntimeHost {
    runtime: Arc<Runtime>,
    calls: mpsc::UnboundedReceiver<crate::runtime::Request>,
    kernel: mpsc::UnboundedReceiver<crate::kernel::KernelCall>,
    spawns: mpsc::UnboundedReceiver<crate::runtime::Spawn>,
}

impl RuntimeHost {
    /// Serves until the checker has judged the run; a runtime or supervisors that fail fail it.
    async fn run(
        self,
        world: Arc<World>,
        supervisor_calls: mpsc::UnboundedSender<crate::runtime::Request>,
    ) -> turmoil::Result {
        let Self { runtime, calls, kernel, spawns } = self;
        // The runtime and the supervisors serve for as long as the run lasts: each ends the host
        // only by failing.
        let served = async {
            runtime.serve(calls, kernel).await?;
            std::future::pending().await
        };
        let supervised = async {
            supervisors(world.clone(), spawns, supervisor_calls).await?;
            std::future::pending().await
        };
        tokio::select! {
            biased;
            checked = check_continuously(world.clone()) => checked,
            failed = served => failed,
            failed = supervised => failed,
        }
    }
}

/// How long after a driver acknowledged a stop or delete anything of the stopped runs' process
/// trees may still run (D1): SIGKILL takes effect at once, so this is slack for the checker's
/// rounds, not time a driver is given.
const D1_TREE_BOUND: Duration = Duration::from_secs(1);

/// The checker: I2 and D1's process trees all along, then I7 and I8 once the quiet phase has ended.
async fn check_continuously(world: Arc<World>) -> turmoil::Result {
    let scenario = world.scenario.clone();
    // An exit must be in the record within a few polls, however slow this seed's timings. With
    // several nodes, a run lost with its node is in the record once the store fences the node:
    // its lease lapsed and the fence's wait, on top.
    let fence = if scenario.nodes > 1 { crate::gateway::LEASE_TTL * 3 } else { Duration::ZERO };
    let bound = i2_exits_reported::Bound {
        micros: micros(scenario.poll_interval * 3 + scenario.redrive_after + Duration::from_secs(10) + fence),
        quiet_from: micros(scenario.fault_phase),
    };
    while crate::world::now() < scenario.total() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        checker::check_exits_reported(&world, &bound).await;
        crate::kernel::check_trees_gone(&world, D1_TREE_BOUND);
    }
    checker::check_converged(&world).await;
    if scenario.execs {
        crate::execs::check_ended(&world).await;
    }
    Ok(())
}
