//! What every simulated host shares: the scenario, the trace, the store that survives gateway
//! crashes, the runtime's ground truth, the client histories and the violations found. The
//! simulation runs on one thread, so a `Mutex` here is never contended; it only satisfies the
//! `Send` bounds of the real gateway code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use berth_core::{Intent, PhaseKind, SandboxId, Timestamp};
use berth_gateway::store::memory::MemoryStore;
use serde::Serialize;

use crate::invariants::{Checker, Fact, Found, Invariant};
use crate::runtime::RuntimeModel;
use crate::scenario::Scenario;
use crate::trace::Kind;

/// The Unix time the simulation starts at (pinned: the default is the wall clock).
pub const EPOCH_SECS: u64 = 1_700_000_000;

/// The CPUs of the simulated runtime host, whichever driver runs on it.
pub const HOST_CPUS: u64 = 8;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

thread_local! {
    /// The simulation's time as its driver loop last saw it, for what happens outside any host.
    static LOOP_NOW: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Simulated time since the start: the current host's clock, or the driver loop's between steps.
pub fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_else(|| LOOP_NOW.get())
}

/// Sets the driver loop's time (after each step).
pub fn set_loop_now(elapsed: Duration) {
    LOOP_NOW.set(elapsed);
}

/// One line of the trace.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Simulated microseconds since the start.
    pub t: u64,
    pub actor: String,
    pub kind: Kind,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    pub t: u64,
    pub invariant: Invariant,
    pub message: String,
}

/// What a client saw of a sandbox in a reply.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Seen {
    pub version: u64,
    pub generation: u64,
    pub intent: Intent,
    pub phase: PhaseKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Outcome {
    Ok(Option<Seen>),
    Failed {
        code: String,
        message: String,
    },
    /// No answer in time: it may or may not have happened.
    Unknown,
}

/// One client operation on one sandbox, for the linearizability check.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    pub client: usize,
    pub sandbox: String,
    pub kind: &'static str,
    pub expected_version: Option<u64>,
    pub called: u64,
    pub returned: u64,
    pub outcome: Outcome,
}

/// One committed write of a sandbox record, as the store applied it.
#[derive(Clone, Debug, Serialize)]
pub struct Commit {
    pub t: u64,
    pub sandbox: String,
    /// The record after the write; `None` when it was removed.
    pub after: Option<Seen>,
}

/// Until when a gateway's store calls are held: all of them, and the lease's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stall {
    pub all: Duration,
    pub lease: Duration,
}

impl Stall {
    pub fn until(&self, lease_call: bool) -> Duration {
        if lease_call { self.all.max(self.lease) } else { self.all }
    }
}

pub struct World {
    pub scenario: Scenario,
    pub store: Arc<MemoryStore>,
    pub runtime: Mutex<RuntimeModel>,
    /// The runtime host's directory for the container driver's state (tokens, environments, its
    /// start records and locks): a real directory, so the driver's own file handling runs as it
    /// does in production. Its path differs between runs and never reaches the trace.
    pub state_dir: PathBuf,
    trace: Mutex<Vec<Event>>,
    pub history: Mutex<Vec<Op>>,
    pub commits: Mutex<Vec<Commit>>,
    /// Generations committed per sandbox id over time: `(t, generation)`, for I1 and I6.
    pub generations: Mutex<BTreeMap<SandboxId, Vec<(u64, u64)>>>,
    /// The node each sandbox's last committed record places it on, for N1.
    pub placements: Mutex<BTreeMap<SandboxId, Option<String>>>,
    /// The gateways stopping every run their node holds, as its lease lapsed, each with how many
    /// such sweeps it has under way (one lapse's may still run when the next begins).
    pub fencing: Mutex<BTreeMap<String, usize>>,
    violations: Mutex<Vec<Violation>>,
    faults: AtomicBool,
    pub boots: AtomicU64,
    /// The store's latencies, drawn from the seed.
    pub store_draw: Mutex<crate::scenario::Draw>,
    /// The reconcile lease's last holder and term as the store granted them (`None`: released
    /// or never held), for the faults aimed at the holder.
    /// Each lease's last holder as the store granted it (`None` once released), and its term.
    leases: Mutex<BTreeMap<String, (Option<String>, u64)>>,
    last_stamp: Mutex<u64>,
    /// Per gateway: until when its store connection is stalled (simulated time), for every
    /// call and for the lease's calls only.
    stalls: Mutex<Vec<Stall>>,
    /// Per gateway (its current boot): what tells its lease loop to shut down.
    pub shutdowns: Mutex<BTreeMap<usize, tokio::sync::watch::Sender<bool>>>,
    /// Gateways to crash at the next step, as the runtime's host asked.
    crash_requests: Mutex<Vec<usize>>,
    /// What the runs' started-logs hold.
    pub started_execs: Mutex<crate::execs::StartedLogs>,
    /// The checkers fed every [`Fact`], each with the evidence it keeps.
    checkers: Mutex<Vec<Box<dyn Checker>>>,
}

impl World {
    pub fn new(scenario: Scenario) -> Arc<Self> {
        Arc::new(Self {
            store: Arc::new(MemoryStore::with_clock(Arc::new(crate::gateway::SimClock))),
            runtime: Mutex::new(RuntimeModel::default()),
            state_dir: state_dir(),
            trace: Mutex::default(),
            history: Mutex::default(),
            commits: Mutex::default(),
            generations: Mutex::default(),
            placements: Mutex::default(),
            fencing: Mutex::default(),
            violations: Mutex::default(),
            faults: AtomicBool::new(true),
            boots: AtomicU64::new(0),
            store_draw: Mutex::new(crate::scenario::Draw::new(scenario.seed, crate::scenario::Stream::Store)),
            leases: Mutex::default(),
            last_stamp: Mutex::default(),
            stalls: Mutex::new(vec![Stall::default(); scenario.gateways]),
            shutdowns: Mutex::default(),
            crash_requests: Mutex::default(),
            started_execs: Mutex::default(),
            checkers: Mutex::new(crate::invariants::checkers()),
            scenario,
        })
    }

    pub fn micros() -> u64 {
        micros(now())
    }

    /// The time of a store write, in the order the writes happened. Each host's clock runs
    /// through a whole tick in its turn, so two gateways' clocks can disagree within a tick;
    /// this never goes back, so writes from several gateways keep their true order.
    pub fn stamp(&self) -> u64 {
        let mut last = lock(&self.last_stamp);
        *last = (*last).max(Self::micros());
        *last
    }

    pub fn event(&self, actor: impl Into<String>, kind: Kind, detail: impl Into<String>) {
        lock(&self.trace).push(Event { t: Self::micros(), actor: actor.into(), kind, detail: detail.into() });
    }

    pub fn violate(&self, invariant: Invariant, message: impl Into<String>) {
        let message = message.into();
        self.event("checker", Kind::Violation, format!("{invariant}: {message}"));
        lock(&self.violations).push(Violation { t: Self::micros(), invariant, message });
    }

    /// Feeds `fact` to every checker, and reports what they found.
    pub fn fact(&self, fact: &Fact<'_>) {
        let mut found = Found::new();
        for checker in lock(&self.checkers).iter_mut() {
            checker.on(fact, &mut found);
        }
        for (invariant, problem) in found {
            self.violate(invariant, problem);
        }
    }

    pub fn violations(&self) -> Vec<Violation> {
        lock(&self.violations).clone()
    }

    pub fn trace(&self) -> Vec<Event> {
        lock(&self.trace).clone()
    }

    pub fn faults_on(&self) -> bool {
        self.faults.load(Ordering::Relaxed)
    }

    pub fn stop_faults(&self) {
        self.faults.store(false, Ordering::Relaxed);
        lock(&self.stalls).fill(Stall::default());
        self.event("sim", Kind::Quiet, "faults stop; liveness is checked from here");
    }

    /// The runtime's clock: Unix nanoseconds, strictly increasing.
    pub fn runtime_time(&self) -> Timestamp {
        let since_epoch = Duration::from_secs(EPOCH_SECS) + now();
        lock(&self.runtime).tick(i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX))
    }

    /// Holds gateway `gateway`'s store calls and replies (only the lease's, with `lease_only`)
    /// until `until` (simulated time).
    pub fn stall(&self, gateway: usize, until: Duration, lease_only: bool) {
        let mut stalls = lock(&self.stalls);
        if lease_only {
            stalls[gateway].lease = until;
        } else {
            stalls[gateway].all = until;
        }
    }

    /// Asks for gateway `gateway` to crash at the next step (it sees no reply sent meanwhile).
    pub fn request_crash(&self, gateway: usize, after: String) {
        self.event("runtime", Kind::GatewayToCrash, format!("{} after {after}", crate::net::gateway_host(gateway)));
        lock(&self.crash_requests).push(gateway);
    }

    pub fn take_crash_requests(&self) -> Vec<usize> {
        std::mem::take(&mut *lock(&self.crash_requests))
    }

    pub fn stalled(&self, gateway: usize) -> Stall {
        lock(&self.stalls)[gateway]
    }

    /// The gateway the store last granted `lease` to, if it has not released it.
    pub fn lease_holder(&self, lease: &str) -> Option<String> {
        lock(&self.leases).get(lease).and_then(|held| held.0.clone())
    }

    /// The store released `holder`'s `lease`.
    pub fn lease_released(&self, lease: &str, holder: &str) {
        let t = self.stamp();
        let term = {
            let mut leases = lock(&self.leases);
            let held = leases.entry(lease.to_string()).or_default();
            held.0 = None;
            held.1
        };
        self.fact(&Fact::Lease { t, lease, holder, term, released: true });
    }

    /// The store granted `lease` (a take-over or a renewal) to `holder` in `term`.
    pub fn lease_granted(&self, lease: &str, holder: &str, term: u64) {
        let t = self.stamp();
        let took_over = {
            let mut leases = lock(&self.leases);
            let held = leases.entry(lease.to_string()).or_default();
            let took_over = (held.0.as_deref(), held.1) != (Some(holder), term);
            *held = (Some(holder.to_string()), term);
            took_over
        };
        if took_over {
            self.event(holder, Kind::Lease { term }, format!("holds {lease}, term {term}"));
        }
        self.fact(&Fact::Lease { t, lease, holder, term, released: false });
    }

    /// A gateway runs reconcile (a watch or a poll of the runtime): `what` it did.
    pub fn reconciling(&self, gateway: &str, what: &str) {
        let index = (0..self.scenario.gateways).find(|&i| crate::net::gateway_host(i) == gateway);
        let node = index.map_or_else(|| crate::gateway::NODE.to_string(), |i| self.scenario.node_of(i));
        self.fact(&Fact::Reconciling { t: Self::micros(), gateway, node: &node, what });
    }

    /// Where gateway `gateway`'s driver keeps its sandboxes: the host's one directory, or its
    /// node's own.
    pub fn root_of(&self, gateway: usize) -> PathBuf {
        if self.scenario.nodes > 1 {
            self.state_dir.join(self.scenario.node_of(gateway))
        } else {
            self.state_dir.clone()
        }
    }

    /// Where the drivers keep their sandboxes: the host's one directory, or each node's.
    pub fn roots(&self) -> Vec<PathBuf> {
        let nodes = if self.scenario.nodes > 1 { self.scenario.gateways } else { 1 };
        (0..nodes).map(|g| self.root_of(g)).collect()
    }

    /// The generations committed of a sandbox, `(t, generation)` in commit order.
    pub fn generations_of(&self, sandbox: &SandboxId) -> Vec<(u64, u64)> {
        lock(&self.generations).get(sandbox).cloned().unwrap_or_default()
    }
}

/// A fresh directory for one run's driver state, in memory where the host has a tmpfs.
fn state_dir() -> PathBuf {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    base.join(format!("berth-sim-{}-{run}", std::process::id()))
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Microseconds of a duration, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Simulated microseconds of a runtime timestamp.
pub fn micros_of(t: Timestamp) -> u64 {
    let epoch = i64::try_from(Duration::from_secs(EPOCH_SECS).as_nanos()).unwrap_or(0);
    u64::try_from((t.unix_nanos() - epoch) / 1_000).unwrap_or(0)
}
