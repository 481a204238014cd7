//! What every simulated host shares: the scenario, the trace, the store that survives gateway
//! crashes, the runtime's ground truth, the client histories and the violations found. The
//! simulation runs on one thread, so a `Mutex` here is never contended; it only satisfies the
//! `Send` bounds of the real gateway code.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use berth_core::{Intent, PhaseKind, SandboxId, Timestamp};
use berth_gateway::store::memory::MemoryStore;
use serde::Serialize;

use crate::runtime::RuntimeModel;
use crate::scenario::Scenario;

/// The Unix time the simulation starts at (pinned: the default is the wall clock).
pub const EPOCH_SECS: u64 = 1_700_000_000;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Simulated time since the start.
pub fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// One line of the trace.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Simulated microseconds since the start.
    pub t: u64,
    pub actor: String,
    pub kind: String,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    pub t: u64,
    pub invariant: &'static str,
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

pub struct World {
    pub scenario: Scenario,
    pub store: Arc<MemoryStore>,
    pub runtime: Mutex<RuntimeModel>,
    trace: Mutex<Vec<Event>>,
    pub history: Mutex<Vec<Op>>,
    pub commits: Mutex<Vec<Commit>>,
    /// Generations committed per sandbox id over time: `(t, generation)`, for I6.
    pub generations: Mutex<BTreeMap<SandboxId, Vec<(u64, u64)>>>,
    violations: Mutex<Vec<Violation>>,
    faults: AtomicBool,
    pub boots: AtomicU64,
    /// The store's latencies, drawn from the seed.
    pub store_draw: Mutex<crate::scenario::Draw>,
    /// The reconcile lease's terms, in the order gateways took them.
    pub lease_terms: Mutex<Vec<u64>>,
}

impl World {
    pub fn new(scenario: Scenario) -> Arc<Self> {
        Arc::new(Self {
            store: Arc::new(MemoryStore::with_clock(Arc::new(crate::gateway::SimClock))),
            runtime: Mutex::new(RuntimeModel::default()),
            trace: Mutex::default(),
            history: Mutex::default(),
            commits: Mutex::default(),
            generations: Mutex::default(),
            violations: Mutex::default(),
            faults: AtomicBool::new(true),
            boots: AtomicU64::new(0),
            store_draw: Mutex::new(crate::scenario::Draw::new(scenario.seed, 4)),
            lease_terms: Mutex::default(),
            scenario,
        })
    }

    pub fn micros() -> u64 {
        u64::try_from(now().as_micros()).unwrap_or(u64::MAX)
    }

    pub fn event(&self, actor: impl Into<String>, kind: impl Into<String>, detail: impl Into<String>) {
        lock(&self.trace).push(Event {
            t: Self::micros(),
            actor: actor.into(),
            kind: kind.into(),
            detail: detail.into(),
        });
    }

    pub fn violate(&self, invariant: &'static str, message: impl Into<String>) {
        let message = message.into();
        self.event("checker", "violation", format!("{invariant}: {message}"));
        lock(&self.violations).push(Violation { t: Self::micros(), invariant, message });
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
        self.event("sim", "quiet", "faults stop; liveness is checked from here");
    }

    /// The runtime's clock: Unix nanoseconds, strictly increasing.
    pub fn runtime_time(&self) -> Timestamp {
        let since_epoch = Duration::from_secs(EPOCH_SECS) + now();
        lock(&self.runtime).tick(i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX))
    }
}
