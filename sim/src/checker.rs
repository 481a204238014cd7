//! The invariant checkers of DESIGN 4. Commit-time checks see every write the gateway makes
//! (through [`TracingStore`]) and compare it with the runtime's ground truth; the rest run
//! continuously or once the quiet phase has ended.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::{FailureReason, Intent, Phase, PhaseKind, Provider, Run as RunState, Sandbox, SandboxId, Write};
use berth_gateway::store::{CommitError, Lease, Page, PageRequest, Store, StoreError};

use berth_drivers::container::volume_name;

use crate::runtime::RuntimeModel;
use crate::scenario::DriverKind;
use crate::world::{Commit, Seen, World, lock};

pub fn seen(s: &Sandbox) -> Seen {
    Seen { version: s.resource_version, generation: s.generation, intent: s.intent, phase: s.phase.kind() }
}

/// The shared in-memory store, with every commit traced and checked, and each operation
/// taking a random time as a database's would: the gaps between a read and its write are where
/// writers race.
pub struct TracingStore {
    world: Arc<World>,
    /// The gateway whose store connection this is.
    gateway: usize,
    actor: String,
}

impl TracingStore {
    pub fn new(world: Arc<World>, gateway: usize) -> Self {
        Self { world, gateway, actor: crate::net::gateway_host(gateway) }
    }

    /// A call's way to the store: a random latency, then held while the connection stalls.
    async fn latency(&self, lease_call: bool) {
        let max = self.world.scenario.store_latency.as_millis() as u64;
        let wait = lock(&self.world.store_draw).millis(0, max);
        tokio::time::sleep(wait).await;
        self.stall(lease_call).await;
    }

    /// One call to the store, there and back.
    async fn call<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.latency(false).await;
        let reply = call.await;
        self.reply_late().await;
        self.stall(false).await;
        reply
    }

    /// A reply held back after the store did what was asked (a slow network, a busy database
    /// thread): whoever counts time from the reply rather than the request is late by as much.
    async fn reply_late(&self) {
        let p = self.world.scenario.faults.late_store_replies;
        if !self.world.faults_on() || p == 0.0 {
            return;
        }
        let delay = {
            let mut draw = lock(&self.world.store_draw);
            draw.chance(p).then(|| draw.millis(1, crate::gateway::LEASE_TTL.as_millis() as u64 / 2))
        };
        if let Some(delay) = delay {
            self.world.event(self.actor.clone(), "store reply late", format!("by {delay:?}"));
            tokio::time::sleep(delay).await;
        }
    }

    /// A reply's way back: held while the connection stalls.
    async fn stall(&self, lease_call: bool) {
        let until = self.world.stalled(self.gateway).until(lease_call);
        if until > crate::world::now() {
            tokio::time::sleep(until - crate::world::now()).await;
        }
    }

    fn record(&self, before: Option<&Sandbox>, after: Option<&Sandbox>) {
        let world = &self.world;
        let Some(id) = after.or(before).map(|s| s.id.clone()) else { return };
        let name = after.or(before).map(|s| s.name.clone()).unwrap_or_default();
        let t = world.stamp();
        lock(&world.commits).push(Commit { t, sandbox: name.clone(), after: after.map(seen) });
        if let Some(a) = after
            && before.is_none_or(|b| b.generation != a.generation)
        {
            lock(&world.generations).entry(id.clone()).or_default().push((t, a.generation));
        }
        // I5: every write adds one to the version.
        match (before, after) {
            (None, Some(a)) if a.resource_version != 1 => {
                world.violate("I5", format!("{name} was created at version {}", a.resource_version));
            }
            (Some(b), Some(a)) if a.resource_version != b.resource_version + 1 => {
                world.violate(
                    "I5",
                    format!("{name} went from version {} to {}", b.resource_version, a.resource_version),
                );
            }
            _ => {}
        }
        let old = before.map(|b| b.phase.clone());
        let new = after.map(|a| a.phase.clone());
        if old.as_ref().map(Phase::kind) != new.as_ref().map(Phase::kind) {
            let describe = |p: &Option<Phase>| p.as_ref().map_or_else(|| "gone".to_string(), |p| p.to_string());
            let generation = after.or(before).map_or(0, |s| s.generation);
            world.event(
                self.actor.clone(),
                "phase",
                format!("{name}: {} -> {} (generation {generation})", describe(&old), describe(&new)),
            );
        }
        if let (Some(b), Some(a)) = (before, after) {
            self.check_failure(b, a);
        }
    }

    /// A commit, with every sandbox write recorded and checked. The in-memory store never
    /// yields, so nothing interleaves between these reads and the commit.
    async fn commit_traced(&self, writes: &[Write]) -> Result<(), CommitError> {
        let mut befores = Vec::new();
        for write in writes {
            if let berth_core::Key::Sandbox(id) = write.key() {
                befores.push((write.clone(), self.world.store.sandbox(&id).await?));
            }
        }
        self.world.store.commit(writes).await?;
        for (write, before) in befores {
            let after = match &write {
                Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => Some(s),
                _ => None,
            };
            self.record(before.as_ref(), after);
        }
        Ok(())
    }

    /// I1: an Error that leaves Starting or Ready must have a cause in the ground truth.
    fn check_failure(&self, before: &Sandbox, after: &Sandbox) {
        let Phase::Error(failure) = &after.phase else { return };
        if !matches!(before.phase.kind(), PhaseKind::Starting | PhaseKind::Ready)
            || before.generation != after.generation
        {
            return;
        }
        let runtime = lock(&self.world.runtime);
        let generation = after.generation;
        let run = runtime.latest_run(&after.id, generation);
        let justified = match failure.reason {
            // A run of the generation ended: the one Berth started, when it was restarted out
            // of band.
            FailureReason::ContainerExited => {
                runtime.runs(&after.id).any(|r| r.generation == generation && r.finished.is_some())
            }
            FailureReason::MainProcessExited => runtime.main_exits.contains(&(after.id.clone(), generation)),
            FailureReason::ComputeResourceMissing => {
                let started = run.map(|r| r.started_at);
                let removed_since = runtime
                    .removals
                    .get(&after.id)
                    .is_some_and(|times| times.iter().any(|t| started.is_none_or(|s| *t > s)));
                !compute_exists(&self.world, &runtime, &after.id) || removed_since
            }
            // Since this generation was committed, the runtime refused a create or start, or
            // the container was removed (the driver found it gone as it started).
            FailureReason::StartFailed => {
                let since = committed_at(&self.world, &after.id, generation).unwrap_or(u64::MAX);
                let refused = runtime.refusals.get(&after.id).into_iter().flatten().copied();
                let removed = runtime.removals.get(&after.id).into_iter().flatten().map(|t| micros_of(*t));
                refused.chain(removed).any(|t| t >= since)
            }
            // Every simulated command starts.
            FailureReason::CommandFailedToStart => false,
        };
        if !justified {
            self.world.violate(
                "I1",
                format!(
                    "{} went {} -> Error ({}) at generation {generation}, but its run of that generation {}",
                    after.name,
                    before.phase.kind(),
                    failure.reason,
                    match run {
                        None => "never started".to_string(),
                        Some(r) if r.finished.is_none() => "is still running".to_string(),
                        Some(_) => "ended otherwise".to_string(),
                    }
                ),
            );
        }
    }
}

#[async_trait]
impl Store for TracingStore {
    fn identity(&self) -> &str {
        self.world.store.identity()
    }
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        self.call(self.world.store.sandbox(id)).await
    }
    async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError> {
        self.call(self.world.store.sandbox_by_name(name)).await
    }
    async fn list_sandboxes(
        &self,
        page: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Page<Sandbox>, StoreError> {
        self.call(self.world.store.list_sandboxes(page, selector)).await
    }
    async fn sandboxes_using(&self, provider: &str) -> Result<Vec<Sandbox>, StoreError> {
        self.call(self.world.store.sandboxes_using(provider)).await
    }
    async fn provider(&self, name: &str) -> Result<Option<Provider>, StoreError> {
        self.call(self.world.store.provider(name)).await
    }
    async fn list_providers(&self, page: &PageRequest) -> Result<Page<Provider>, StoreError> {
        self.call(self.world.store.list_providers(page)).await
    }
    async fn commit(&self, writes: &[Write]) -> Result<(), CommitError> {
        self.call(self.commit_traced(writes)).await
    }
    async fn acquire_lease(&self, holder: &str, ttl: std::time::Duration) -> Result<Lease, StoreError> {
        self.latency(true).await;
        let lease = self.world.store.acquire_lease(holder, ttl).await;
        if let Ok(lease) = &lease
            && lease.held_by(holder)
        {
            self.world.lease_granted(holder, lease.term);
        }
        self.reply_late().await;
        self.stall(true).await;
        lease
    }
    async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        self.latency(true).await;
        let released = self.world.store.release_lease(holder).await;
        if released.is_ok() && self.world.lease_holder().as_deref() == Some(holder) {
            self.world.lease_released();
        }
        self.stall(true).await;
        released
    }
}

/// Whether the runtime host has the sandbox's compute resource: its container, or (under the
/// process driver) its folder.
fn compute_exists(world: &World, runtime: &RuntimeModel, id: &SandboxId) -> bool {
    match world.scenario.driver {
        DriverKind::Container => runtime.containers.contains_key(id),
        DriverKind::Process => world.state_dir.join(id.as_str()).is_dir(),
    }
}

/// What the runtime host holds of each sandbox: containers, live processes, and the drivers'
/// folders (a driver's own, named with a leading dot, aside).
fn held(world: &World, runtime: &RuntimeModel) -> BTreeMap<SandboxId, &'static str> {
    let mut held = BTreeMap::new();
    let folders = std::fs::read_dir(&world.state_dir).into_iter().flatten().filter_map(|e| e.ok());
    for name in folders.filter_map(|e| e.file_name().into_string().ok()).filter(|n| !n.starts_with('.')) {
        held.insert(SandboxId::new(name), "a folder");
    }
    for (id, _, _) in runtime.live_processes() {
        held.insert(id, "a live process");
    }
    for id in runtime.containers.keys() {
        held.insert(id.clone(), "a container");
    }
    held
}

/// I6: whether `generation` was a sandbox's committed generation at some moment in `[from, to]`.
pub fn generation_current_between(world: &World, sandbox: &SandboxId, generation: u64, from: u64, to: u64) -> bool {
    let generations = lock(&world.generations);
    let Some(history) = generations.get(sandbox) else { return false };
    // The generation in force at `from`, and every one committed until `to`.
    let at_start = history.iter().rev().find(|(t, _)| *t <= from).map(|(_, g)| *g);
    at_start == Some(generation) || history.iter().any(|(t, g)| *t >= from && *t <= to && *g == generation)
}

/// When `generation` of a sandbox was committed (simulated microseconds).
fn committed_at(world: &World, sandbox: &SandboxId, generation: u64) -> Option<u64> {
    lock(&world.generations).get(sandbox)?.iter().find(|(_, g)| *g == generation).map(|(t, _)| *t)
}

/// I6: whether a generation newer than `generation` was committed by `to`.
pub fn superseded_by(world: &World, sandbox: &SandboxId, generation: u64, to: u64) -> bool {
    lock(&world.generations).get(sandbox).is_some_and(|h| h.iter().any(|(t, g)| *t <= to && *g > generation))
}

/// I2: every genuine exit of the current run is reported within `bound` (counted from the end of
/// the fault phase for exits that happened during it).
pub async fn check_exits_reported(world: &World, bound_micros: u64, quiet_from: u64) {
    let records = all_records(world).await;
    let now = World::micros();
    let runtime = lock(&world.runtime);
    for s in records {
        // Error and a completion (Stopped with intent Running) are how an exit is reported.
        if s.intent != Intent::Running
            || matches!(s.phase.kind(), PhaseKind::Error | PhaseKind::Stopped | PhaseKind::Deleting)
        {
            continue;
        }
        // After an out-of-band restart Berth never saw, the restart's run stands for the
        // generation: its exits are the ones to report.
        let Some(run) = runtime.latest_run(&s.id, s.generation) else { continue };
        let Some((finished, code, cause)) = run.finished else { continue };
        let since = micros_of(finished).max(quiet_from);
        if now > since + bound_micros {
            world.violate(
                "I2",
                format!(
                    "{}'s run of generation {} exited (code {code}, {cause:?}) but the record is still {}",
                    s.name, s.generation, s.phase
                ),
            );
        }
    }
}

/// Simulated microseconds of a runtime timestamp.
fn micros_of(t: berth_core::Timestamp) -> u64 {
    let epoch = i64::try_from(std::time::Duration::from_secs(crate::world::EPOCH_SECS).as_nanos()).unwrap_or(0);
    u64::try_from((t.unix_nanos() - epoch) / 1_000).unwrap_or(0)
}

pub async fn all_records(world: &World) -> Vec<Sandbox> {
    let mut out = Vec::new();
    let mut page = PageRequest { after: None, limit: 100 };
    while let Ok(batch) = world.store.list_sandboxes(&page, &BTreeMap::new()).await {
        out.extend(batch.items);
        match batch.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    out
}

/// I7 and I8, once the quiet phase is over: every sandbox at its intent, nothing in a
/// transitional phase, nothing deleted still around, nothing left in the runtime without a
/// record, and each record agreeing with what runs.
pub async fn check_converged(world: &World) {
    let records = all_records(world).await;
    let runtime = lock(&world.runtime);
    for s in &records {
        let expected = match s.intent {
            Intent::Running => PhaseKind::Ready,
            Intent::Stopped => PhaseKind::Stopped,
            Intent::Deleted => {
                world.violate("I7", format!("{} is still {} after the quiet phase", s.name, s.phase));
                continue;
            }
        };
        if s.phase.kind() != expected {
            world.violate(
                "I8",
                format!("{} has intent {:?} but is {} after the quiet phase", s.name, s.intent, s.phase),
            );
            continue;
        }
        let alive = runtime.alive_generation(&s.id);
        let consistent = match expected {
            PhaseKind::Ready => alive == Some(s.generation),
            _ => alive.is_none(),
        };
        if !consistent {
            world.violate(
                "I8",
                format!("{} is {} at generation {} but the runtime runs {alive:?}", s.name, s.phase, s.generation),
            );
        }
        if let (PhaseKind::Ready, RunState::Pending) = (s.phase.kind(), s.run) {
            world.violate("I8", format!("{} is Ready with no run known to have started", s.name));
        }
    }
    for (id, what) in held(world, &runtime) {
        if !records.iter().any(|s| s.id == id) {
            world.violate("I7", format!("the runtime still has {what} of {id}, whose record is gone"));
        }
    }
    for volume in &runtime.volumes {
        if !records.iter().any(|s| volume_name(&s.id) == *volume) {
            let owner = runtime.sandboxes().find(|id| volume_name(id) == *volume).map(|id| runtime.name(id));
            world.violate(
                "I7",
                format!("the runtime still has the volume {volume} ({owner:?}), whose sandbox's record is gone"),
            );
        }
    }
}
