//! Where the store-side invariants of DESIGN 4 are checked, and when: commit-time checks see
//! every write the gateway makes (through [`TracingStore`]) with the runtime's ground truth; the
//! rest run continuously or once the quiet phase has ended. What each decides is in
//! [`crate::invariants`].

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::exec::{Exec, ExecId};
use berth_core::template::Template;
use berth_core::{Hold, Intent, NodeId, Phase, Provider, Sandbox, SandboxId, Write};
use berth_drivers::container::user_volume_of;
use berth_gateway::store::{
    Changes, CommitError, Lease, Listing, Node, NodeOffer, NodeRemoval, Page, PageRequest, Store, StoreError,
};
use futures_util::FutureExt;

use crate::invariants::l1_one_holder::{RECONCILE_LEASE, node_lease};
use crate::invariants::{
    Fact, Invariant, i1_stale_exit, i2_exits_reported, i7_delete_completes, i8_liveness, n2_placed_live,
    s2_volumes_kept, s3_pause,
};
use crate::runtime::RuntimeModel;
use crate::scenario::DriverKind;
use crate::trace::Kind;
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
            self.world.event(self.actor.clone(), Kind::StoreReplyLate, format!("by {delay:?}"));
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

    /// `open_execs`: for an idle expiry, the sandbox's execs open as it commits.
    fn record(&self, before: Option<&Sandbox>, after: Option<&Sandbox>, open_execs: usize) {
        let world = &self.world;
        let Some(id) = after.or(before).map(|s| s.id.clone()) else { return };
        let name = after.or(before).map(|s| s.name.to_string()).unwrap_or_default();
        let t = world.stamp();
        lock(&world.commits).push(Commit { t, sandbox: name.clone(), after: after.map(seen) });
        if let Some(a) = after
            && before.is_none_or(|b| b.generation != a.generation)
        {
            lock(&world.generations).entry(id.clone()).or_default().push((t, a.generation));
        }
        let placed = after.and_then(|a| a.placement.as_ref()).map(|p| p.node.to_string());
        lock(&world.placements).insert(id.clone(), placed);
        if let Some(a) =
            after.filter(|a| world.scenario.nodes > 1 && before.map(|b| &b.placement) != Some(&a.placement))
        {
            let at = a
                .placement
                .as_ref()
                .map_or_else(|| "nowhere".to_string(), |p| format!("{} (epoch {})", p.node, p.epoch));
            world.event(self.actor.clone(), Kind::Placed, format!("{name} on {at} (generation {})", a.generation));
        }
        let old = before.map(|b| b.phase.clone());
        let new = after.map(|a| a.phase.clone());
        if old.as_ref().map(Phase::kind) != new.as_ref().map(Phase::kind) {
            let describe = |p: &Option<Phase>| p.as_ref().map_or_else(|| "gone".to_string(), |p| p.to_string());
            let generation = after.or(before).map_or(0, |s| s.generation);
            world.event(
                self.actor.clone(),
                Kind::Phase { to: new.as_ref().map(Phase::kind) },
                format!("{name}: {} -> {} (generation {generation})", describe(&old), describe(&new)),
            );
        }
        if let (Some(b), Some(a)) = (before, after) {
            if a.expired_at.is_some() && b.expired_at.is_none() {
                world.event(
                    self.actor.clone(),
                    Kind::Expired,
                    format!("{name}: deadline {:?}", b.deadline.map(|d| d.unix_millis())),
                );
            }
            if a.idle_expired_at.is_some() && b.idle_expired_at.is_none() {
                world.event(
                    self.actor.clone(),
                    Kind::ExpiredIdle,
                    format!("{name}: active at {:?}", b.active_at.map(|d| d.unix_millis())),
                );
            }
            if a.restarts.count > b.restarts.count {
                world.event(
                    self.actor.clone(),
                    Kind::PolicyRestart,
                    format!("{name}: restart {} as generation {}", a.restarts.count, a.generation),
                );
            }
            self.check_failure(b, a);
        }
        world.fact(&Fact::Sandbox { t, now: world.store.now(), before, after, open_execs });
    }

    /// A commit, with every sandbox write recorded and checked. The in-memory store never
    /// yields, so nothing interleaves between these reads and the commit.
    async fn commit_traced(&self, writes: &[Write]) -> Result<(), CommitError> {
        let mut befores = Vec::new();
        let mut execs = Vec::new();
        let mut snapshots = Vec::new();
        for write in writes {
            if let berth_core::Key::Snapshot(name) = write.key() {
                snapshots.push((write, self.world.store.snapshot(&name).await?));
            }
            // An exec write is judged with the exec it replaces and its sandbox as they stand.
            if let Write::CreateExec(e) | Write::UpdateExec { record: e, .. } = write {
                let before = self.world.store.exec(&e.sandbox, &e.id).await?;
                let sandbox = self.world.store.sandbox(&e.sandbox).await?;
                execs.push((e, before, sandbox));
            }
            // A check writes nothing: an exec admitted against the sandbox changes no state of it.
            if let (berth_core::Key::Sandbox(id), false) = (write.key(), matches!(write, Write::CheckSandbox { .. })) {
                let before = self.world.store.sandbox(&id).await?;
                let idle_expiry = match (write, &before) {
                    (Write::UpdateSandbox { record, .. }, Some(b)) => {
                        record.idle_expired_at.is_some() && b.idle_expired_at.is_none()
                    }
                    _ => false,
                };
                let open = if idle_expiry { self.world.store.open_execs(Some(&id)).await?.len() } else { 0 };
                befores.push((write.clone(), before, open));
            }
        }
        self.world.store.commit(writes).await?;
        for write in writes {
            if let Write::CreateTemplate(t) | Write::UpdateTemplate { record: t, .. } = write {
                self.world.fact(&Fact::Template(t));
            }
        }
        for (write, before) in snapshots {
            let after = match write {
                Write::CreateSnapshot(s) | Write::UpdateSnapshot { record: s, .. } => Some(s),
                _ => None,
            };
            let id = after.or(before.as_ref()).map(|s| s.id.clone());
            let made: Vec<&Sandbox> = writes
                .iter()
                .filter_map(|w| match w {
                    Write::CreateSandbox(s) if s.seed.as_ref().map(|seed| &seed.id) == id.as_ref() => Some(s),
                    _ => None,
                })
                .collect();
            self.world.fact(&Fact::Snapshot { before: before.as_ref(), after, made: &made });
        }
        // Execs first: an exec's end and its sandbox's idle expiry in one commit are judged
        // with the end counted.
        for (after, before, sandbox) in execs {
            self.world.fact(&Fact::Exec { before: before.as_ref(), after, sandbox: sandbox.as_ref() });
        }
        for (write, before, open) in befores {
            let after = match &write {
                Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => Some(s),
                _ => None,
            };
            self.record(before.as_ref(), after, open);
        }
        Ok(())
    }

    /// I1, on a write from `before` to `after`.
    fn check_failure(&self, before: &Sandbox, after: &Sandbox) {
        let Some(failure) = i1_stale_exit::failure_to_justify(before, after) else { return };
        let generations = self.world.generations_of(&after.id);
        let runtime = lock(&self.world.runtime);
        let compute_exists = compute_exists(&self.world, &runtime, &after.id);
        let node_lapsed = before.placement.as_ref().is_some_and(|at| {
            let nodes = self.world.store.nodes().now_or_never().and_then(Result::ok).unwrap_or_default();
            // Lapsed now, or since the placement (granted again in a later epoch).
            nodes.iter().any(|n| n.id == at.node && (!n.live || n.lease.term > at.epoch))
        });
        let ground =
            i1_stale_exit::Ground { runtime: &runtime, compute_exists, node_lapsed, generations: &generations };
        if let Some(problem) = i1_stale_exit::unjustified(before, after, failure, &ground) {
            self.world.violate(Invariant::I1, problem);
        }
    }
}

#[async_trait]
impl Store for TracingStore {
    fn identity(&self) -> &str {
        self.world.store.identity()
    }
    fn kind(&self) -> &'static str {
        self.world.store.kind()
    }
    /// The store's clock as this gateway reads it: off by its skew.
    fn now(&self) -> berth_core::Timestamp {
        let now = self.world.store.now();
        let skew = self.world.scenario.skew_of(self.gateway);
        berth_core::Timestamp::from_unix_nanos(now.unix_nanos().saturating_add(skew.saturating_mul(1_000_000)))
    }
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        self.call(self.world.store.sandbox(id)).await
    }
    async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError> {
        self.call(self.world.store.sandbox_by_name(name)).await
    }
    async fn list_sandboxes_at(
        &self,
        page: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Listing, StoreError> {
        self.call(self.world.store.list_sandboxes_at(page, selector)).await
    }
    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError> {
        self.call(self.world.store.changes(after, limit)).await
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
    async fn template(&self, name: &str) -> Result<Option<Template>, StoreError> {
        self.call(self.world.store.template(name)).await
    }
    async fn list_templates(&self, page: &PageRequest) -> Result<Page<Template>, StoreError> {
        self.call(self.world.store.list_templates(page)).await
    }
    async fn snapshot(&self, name: &str) -> Result<Option<berth_core::Snapshot>, StoreError> {
        self.call(self.world.store.snapshot(name)).await
    }
    async fn list_snapshots(&self, page: &PageRequest) -> Result<Page<berth_core::Snapshot>, StoreError> {
        self.call(self.world.store.list_snapshots(page)).await
    }
    async fn volume(&self, name: &str) -> Result<Option<berth_core::Volume>, StoreError> {
        self.call(self.world.store.volume(name)).await
    }
    async fn list_volumes(&self, page: &PageRequest) -> Result<Page<berth_core::Volume>, StoreError> {
        self.call(self.world.store.list_volumes(page)).await
    }
    async fn exec(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, StoreError> {
        self.call(self.world.store.exec(sandbox, id)).await
    }
    async fn list_execs(&self, sandbox: &SandboxId, page: &PageRequest) -> Result<Page<Exec>, StoreError> {
        self.call(self.world.store.list_execs(sandbox, page)).await
    }
    async fn open_execs(&self, sandbox: Option<&SandboxId>) -> Result<Vec<Exec>, StoreError> {
        self.call(self.world.store.open_execs(sandbox)).await
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
            self.world.lease_granted(RECONCILE_LEASE, holder, lease.term);
        }
        self.reply_late().await;
        self.stall(true).await;
        lease
    }
    async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        self.latency(true).await;
        let released = self.world.store.release_lease(holder).await;
        if released.is_ok() && self.world.lease_holder(RECONCILE_LEASE).as_deref() == Some(holder) {
            self.world.lease_released(RECONCILE_LEASE, holder);
        }
        self.stall(true).await;
        released
    }
    async fn acquire_node_lease(
        &self,
        node: &NodeId,
        holder: &str,
        offer: &NodeOffer,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        self.latency(true).await;
        let lease = self.world.store.acquire_node_lease(node, holder, offer, ttl).await;
        if let Ok(lease) = &lease
            && lease.held_by(holder)
        {
            self.world.lease_granted(&node_lease(node.as_str()), holder, lease.term);
        }
        self.reply_late().await;
        self.stall(true).await;
        lease
    }
    async fn release_node_lease(&self, node: &NodeId, holder: &str) -> Result<(), StoreError> {
        self.latency(true).await;
        let released = self.world.store.release_node_lease(node, holder).await;
        let lease = node_lease(node.as_str());
        if released.is_ok() && self.world.lease_holder(&lease).as_deref() == Some(holder) {
            self.world.lease_released(&lease, holder);
        }
        self.stall(true).await;
        released
    }
    async fn node(&self, id: &NodeId) -> Result<Option<Node>, StoreError> {
        self.call(self.world.store.node(id)).await
    }
    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        self.call(self.world.store.nodes()).await
    }
    async fn node_loads(&self) -> Result<BTreeMap<NodeId, berth_core::placement::Capacity>, StoreError> {
        self.call(self.world.store.node_loads()).await
    }
    async fn drain_node(&self, id: &NodeId, draining: bool) -> Result<bool, StoreError> {
        self.call(self.world.store.drain_node(id, draining)).await
    }
    async fn delete_node(&self, id: &NodeId) -> Result<NodeRemoval, StoreError> {
        self.call(self.world.store.delete_node(id)).await
    }
}

/// Whether the runtime host has the sandbox's compute resource: its container, or (under the
/// process driver) its folder.
fn compute_exists(world: &World, runtime: &RuntimeModel, id: &SandboxId) -> bool {
    match world.scenario.driver {
        DriverKind::Container => runtime.containers.contains_key(id),
        DriverKind::Process => world.roots().iter().any(|root| root.join(id.as_str()).is_dir()),
    }
}

/// What the runtime host holds of each sandbox: containers, live processes, and the drivers'
/// folders (a driver's own, named with a leading dot, aside).
fn held(world: &World, runtime: &RuntimeModel) -> BTreeMap<SandboxId, &'static str> {
    let mut held = BTreeMap::new();
    for root in world.roots() {
        let folders = std::fs::read_dir(root).into_iter().flatten().filter_map(|e| e.ok());
        for name in folders.filter_map(|e| e.file_name().into_string().ok()).filter(|n| !n.starts_with('.')) {
            held.insert(SandboxId::new(name), "a folder");
        }
    }
    for task in runtime.running_tasks() {
        held.insert(task.sandbox.clone(), "a live process");
    }
    for id in runtime.containers.keys() {
        held.insert(id.clone(), "a container");
    }
    held
}

/// I2: every genuine exit of the current run is reported within `bound`.
pub async fn check_exits_reported(world: &World, bound: &i2_exits_reported::Bound) {
    let records = all_records(world).await;
    let now = World::micros();
    let runtime = lock(&world.runtime);
    for s in records {
        if let Some(problem) = i2_exits_reported::unreported(&s, &runtime, now, bound) {
            world.violate(Invariant::I2, problem);
        }
    }
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

/// I7 and I8, once the quiet phase is over: each record, then what the runtime host holds.
/// How soon after its deadline a sandbox is expired once faults stop: the holder's next scan,
/// a lease taken over from a holder that died, the stop itself, and a holder whose clock runs
/// behind the store's seeing the deadline that much later.
fn expiry_bound(scenario: &crate::scenario::Scenario) -> std::time::Duration {
    scenario.poll_interval * 2 + crate::gateway::LEASE_TTL * 2 + std::time::Duration::from_secs(5) + scenario.clock_skew
}

/// The volumes whose files the simulated host keeps: the process driver's directories, or the
/// simulated runtime's volumes of Berth's user volumes.
fn kept_volumes(world: &World) -> Vec<berth_core::VolumeId> {
    match world.scenario.driver {
        DriverKind::Process => std::fs::read_dir(world.state_dir.join(".volumes"))
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .map(berth_core::VolumeId::new)
                    .collect()
            })
            .unwrap_or_default(),
        DriverKind::Container => lock(&world.runtime).volumes.iter().filter_map(|name| user_volume_of(name)).collect(),
    }
}

pub async fn check_converged(world: &World) {
    let records = all_records(world).await;
    let page = PageRequest { after: None, limit: 1000 };
    let templates = world.store.list_templates(&page).await.map(|p| p.items).unwrap_or_default();
    let providers = world.store.list_providers(&page).await.map(|p| p.items).unwrap_or_default();
    world.fact(&Fact::Converged {
        records: &records,
        templates: &templates,
        providers: &providers,
        now: world.store.now(),
        expiry_bound: expiry_bound(&world.scenario),
    });
    let snapshots = world.store.all_snapshots().await.unwrap_or_default();
    let copies = crate::snapshots::copies(world);
    let seeded = crate::snapshots::seeded(world, &records);
    let images = crate::snapshots::images(&lock(&world.runtime));
    world.fact(&Fact::Kept {
        snapshots: &snapshots,
        records: &records,
        copies: &copies,
        seeded: &seeded,
        images: &images,
    });
    let volumes = world.store.all_volumes().await.unwrap_or_default();
    for problem in s2_volumes_kept::not_settled(&volumes, &records, &kept_volumes(world)) {
        world.violate(Invariant::S2, problem);
    }
    if world.scenario.nodes > 1 {
        let nodes = world.store.nodes().await.unwrap_or_default();
        let live = nodes.into_iter().filter(|n| n.live).map(|n| n.id).collect();
        for problem in n2_placed_live::stranded(&records, &live) {
            world.violate(Invariant::N2, problem);
        }
    }
    let runtime = lock(&world.runtime);
    for s in &records {
        if let Some(problem) = i7_delete_completes::deleted_still_there(s) {
            world.violate(Invariant::I7, problem);
        }
        // A run in a checkpoint has no process, but it is the paused sandbox's run, kept on disk.
        let checkpointed =
            s.intent == Intent::Paused && runtime.held(&s.id, Some(s.generation)) == Some(Hold::Checkpoint);
        let alive = if checkpointed { Some(s.generation) } else { runtime.alive_generation(&s.id) };
        for problem in i8_liveness::not_converged(s, alive) {
            world.violate(Invariant::I8, problem);
        }
        if let Some(problem) = s3_pause::hold_not_as_recorded(s, runtime.held(&s.id, Some(s.generation))) {
            world.violate(Invariant::S3, problem);
        }
    }
    for problem in i7_delete_completes::left_behind(&records, &held(world, &runtime), &runtime) {
        world.violate(Invariant::I7, problem);
    }
}
