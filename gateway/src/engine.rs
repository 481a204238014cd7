//! The engine executes what berth-core decides.
//!
//! Commands and observations run the same loop: read, decide (or merge), commit the decision's
//! conditional writes, and on a conflict re-read and re-decide after the jittered wait core
//! chose (DESIGN 3.3). Once a decision commits, its driver effects run from a per-sandbox queue
//! ([`effects`]).
//!
//! The features built on this loop (execs, files, logs, activity, and [`crate::egress`]) are
//! services holding the engine: an API handler holds the services it serves, so what it can do
//! to the gateway is what they offer, not everything the engine can.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::cas::{Retry, RetryPolicy};
use berth_core::decision::Subject;
use berth_core::fencing::Standing;
use berth_core::identity::IdentityKey;
use berth_core::plan::Lock;
use berth_core::snapshot::SNAPSHOT_LABEL;
use berth_core::template::POOL_LABEL;
use berth_core::{Decision, Kind, NodeId, Observation, Outcome, Reads, Request, Sandbox, SandboxId, decide, merge};
use berth_drivers::Driver;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use tokio::sync::broadcast;

use crate::error::ApiError;
use crate::record_locks::RecordLocks;
use crate::sessions::Sessions;
use crate::store::{PageRequest, Store};
use shutdown::Shutdown;
use transact::{Run, Transaction};

pub mod activity;
mod effects;
pub mod execs;
pub mod files;
pub mod logs;
pub mod shutdown;
mod transact;

#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub retry: RetryPolicy,
    /// How long a stop waits for a graceful exit before it forces one.
    pub stop_grace: Duration,
    /// Waits between the attempts of an effect the runtime did not answer; after the last one
    /// the reconcile sweep takes over.
    pub effect_retries: Vec<Duration>,
    /// What an upload or a download may hold.
    pub files: berth_drivers::files::Limits,
    /// The longest TTL a sandbox may have, the largest pool a template may keep.
    pub limits: berth_core::validate::Limits,
    /// The gateway's name (`--name`), as its info reads show it.
    pub name: String,
    /// Where the egress proxy opens the connections sandboxes are allowed.
    pub egress: Arc<dyn crate::egress::Upstream>,
    /// Where the preview proxy serves, if it does (`--proxy-listen`).
    pub preview: Option<crate::ports::Preview>,
    /// The gateways sharing the data directory, through which a run whose session is not
    /// here is reached.
    pub peers: Option<crate::ports::Peers>,
    /// How long a command that makes a run waits for a live node while none is (DESIGN 14):
    /// a little over the node lease's TTL, the time a gateway sharing the data directory takes
    /// to take a lapsed lease over, or this gateway to be granted its first. A node lapsed this
    /// long is fenced ([`crate::fencing`]).
    pub node_wait: Duration,
    /// Where it serves E2B's API, if it does (`--e2b-listen`), as a URL.
    pub e2b_url: Option<String>,
    /// The node whose runtime this gateway's driver is (DESIGN 14): it carries out the effects
    /// of the sandboxes placed there, and only those.
    pub node: NodeId,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            stop_grace: Duration::from_secs(10),
            effect_retries: vec![Duration::from_millis(200), Duration::from_secs(1), Duration::from_secs(5)],
            files: berth_drivers::files::Limits::default(),
            limits: berth_core::validate::Limits::default(),
            name: crate::data_dir::DEFAULT_NAME.to_string(),
            egress: Arc::new(crate::egress::HostUpstream::default()),
            preview: None,
            peers: None,
            node_wait: Duration::from_secs(20),
            e2b_url: None,
            node: NodeId::new("local"),
        }
    }
}

/// How often a command waiting for a live node reads the nodes again.
const NODE_POLL: Duration = Duration::from_millis(250);

/// A committed change to a sandbox, for watchers.
#[derive(Clone, Debug)]
pub struct Change {
    pub id: SandboxId,
    /// The record after the change; `None` once it is removed.
    pub sandbox: Option<Sandbox>,
}

struct Inner {
    store: Arc<dyn Store>,
    driver: Arc<dyn Driver>,
    key: IdentityKey,
    settings: EngineSettings,
    rng: Mutex<ChaCha8Rng>,
    /// Sandboxes and snapshots with effects queued or running; a worker task drains each.
    queues: Mutex<BTreeMap<Subject, effects::Queue>>,
    /// One writer per record in this gateway: conflicts come only from other gateways.
    writers: RecordLocks,
    changes: broadcast::Sender<Change>,
    shutdown: Shutdown,
    /// The supervisor sessions held here: where execs go.
    sessions: Sessions,
    /// Told of every exec write made here.
    exec_changes: tokio::sync::watch::Sender<()>,
    /// Rung when a pool here wants refilling now (a claim took a member, or found none).
    refill: tokio::sync::Notify,
    /// This gateway's standing in its node's lease.
    standing: Mutex<Standing>,
    metrics: crate::metrics::Metrics,
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Engine {
    /// `seed` drives every random choice the engine makes (ids, retry jitter).
    pub fn new(
        store: Arc<dyn Store>,
        driver: Arc<dyn Driver>,
        key: IdentityKey,
        settings: EngineSettings,
        seed: u64,
    ) -> Self {
        let (changes, _) = broadcast::channel(4096);
        Self {
            inner: Arc::new(Inner {
                store,
                driver,
                key,
                settings,
                rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
                queues: Mutex::default(),
                writers: RecordLocks::default(),
                changes,
                shutdown: Shutdown::default(),
                sessions: Sessions::default(),
                exec_changes: tokio::sync::watch::channel(()).0,
                refill: tokio::sync::Notify::new(),
                standing: Mutex::new(Standing::Sibling),
                metrics: crate::metrics::Metrics::default(),
            }),
        }
    }

    /// The nodes as placement sees them (DESIGN 14). While none is live it re-reads for up to
    /// [`EngineSettings::node_wait`]: a create must not fail in the moment between a gateway's
    /// lease lapsing and the next one taking its node over, nor before this gateway's first grant.
    async fn placement_nodes(&self) -> Result<Vec<berth_core::placement::Node>, ApiError> {
        let polls = self.inner.settings.node_wait.as_millis() / NODE_POLL.as_millis();
        let mut waited = 0;
        loop {
            let nodes = self.nodes_as_placed().await?;
            if nodes.iter().any(|n| n.live) || waited >= polls {
                return Ok(nodes);
            }
            waited += 1;
            tokio::time::sleep(NODE_POLL).await;
        }
    }

    /// Every registered node with what the sandboxes placed on it reserve.
    async fn nodes_as_placed(&self) -> Result<Vec<berth_core::placement::Node>, crate::store::StoreError> {
        let nodes = self.inner.store.nodes().await?;
        let mut loads = self.inner.store.node_loads().await?;
        Ok(nodes
            .into_iter()
            .map(|n| {
                let placed = loads.remove(&n.id).unwrap_or_default();
                n.for_placement(placed)
            })
            .collect())
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.inner.driver
    }

    /// Now, on the store's clock: every decision is taken at this time (DESIGN 9.1).
    pub fn now(&self) -> berth_core::Timestamp {
        self.inner.store.now()
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.metrics
    }

    /// The metrics' text, with the store's sandboxes by phase and its open execs counted now.
    pub async fn scrape(&self) -> Result<String, ApiError> {
        let mut phases = BTreeMap::new();
        let mut page = PageRequest { after: None, limit: 1000 };
        loop {
            let batch = self.inner.store.list_sandboxes(&page, &BTreeMap::new()).await?;
            for s in &batch.items {
                *phases.entry(s.phase.kind()).or_insert(0) += 1;
            }
            match batch.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
        let open = self.inner.store.open_execs(None).await?.len();
        let volumes = self.inner.store.all_volumes().await?;
        let mut bytes = 0;
        for volume in volumes.iter().filter(|v| v.phase == berth_core::VolumePhase::Ready) {
            // A volume the runtime cannot measure now counts none; the next scrape asks again.
            match self.inner.driver.volume_bytes(&volume.id).await {
                Ok(n) => bytes += n,
                Err(e) => tracing::warn!(volume = %volume.id, error = %e, "measuring a volume for the metrics"),
            }
        }
        let nodes = self.nodes_as_placed().await?;
        Ok(self.inner.metrics.render(&phases, open, &volumes, bytes, &nodes))
    }

    /// The epoch of the node lease this gateway holds, if it holds it.
    pub fn node_epoch(&self) -> Option<u64> {
        match *lock(&self.inner.standing) {
            Standing::Held(epoch) => Some(epoch),
            Standing::Sibling | Standing::Lapsed => None,
        }
    }

    /// This gateway's standing in its node's lease, from now on.
    pub fn set_standing(&self, standing: Standing) {
        *lock(&self.inner.standing) = standing;
        self.inner.metrics.node_lease(self.node_epoch());
    }

    /// Whether this gateway may make a run of `sandbox` now (DESIGN 14, N1).
    pub fn may_run(&self, sandbox: &Sandbox) -> bool {
        berth_core::fencing::may_run(*lock(&self.inner.standing), sandbox.placement.as_ref())
    }

    /// Whether this gateway's node runs `sandbox` (DESIGN 14): its driver carries out the
    /// sandbox's effects and its runtime's reports of the sandbox are merged.
    pub fn runs_here(&self, sandbox: &Sandbox) -> bool {
        berth_core::placement::runs_on(sandbox, &self.inner.settings.node)
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.inner.settings
    }

    /// The supervisor sessions held here: where execs and connections into runs go.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    pub fn key(&self) -> &IdentityKey {
        &self.inner.key
    }

    pub fn random(&self) -> u64 {
        lock(&self.inner.rng).next_u64()
    }

    /// The sandbox named `name`, or NotFound.
    async fn sandbox_named(&self, name: &str) -> Result<Sandbox, ApiError> {
        let not_found = || berth_core::Error::NotFound { kind: Kind::Sandbox, name: name.to_string() };
        Ok(self.inner.store.sandbox_by_name(name).await?.ok_or_else(not_found)?)
    }

    /// A fresh sandbox id: 128 random bits, never reused.
    pub fn new_sandbox_id(&self) -> SandboxId {
        SandboxId::new(format!("sb-{:016x}{:016x}", self.random(), self.random()))
    }

    /// Every committed change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }

    /// Runs an API command: decide, commit (re-deciding after conflicts), then run its effects.
    pub async fn execute(&self, request: &Request) -> Result<Outcome, ApiError> {
        Ok(self.decide(request).await?.outcome)
    }

    /// [`Engine::execute`], with what the decision wrote.
    pub(crate) async fn decide(&self, request: &Request) -> Result<Decision, ApiError> {
        admit(self.inner.driver.as_ref(), &request.command)?;
        let plan = request.plan();
        let run =
            Run { locks: plan.locks(), retry: Retry::for_request(self.inner.settings.retry, request), read: None };
        self.transact(&CommandTransaction(request), run).await
    }

    /// Merges one observation about sandbox `id`. `read` is the record if the caller has just
    /// read it (a sweep does): it is used as it is (a stale one then costs one conflict), and
    /// read again after a conflict.
    pub async fn observe(
        &self,
        id: &SandboxId,
        observation: &Observation,
        read: Option<Sandbox>,
    ) -> Result<Decision, ApiError> {
        match read {
            Some(record) => self.observe_under_lock(id, observation, Some(record), false).await,
            None => {
                let before = self.inner.store.sandbox(id).await?;
                self.observe_under_lock(id, observation, before, true).await
            }
        }
    }

    /// [`Engine::observe`], given the record as read before the sandbox's writer lock is taken:
    /// the record's name is its lock. If `reread`, the record is read again under the lock.
    async fn observe_under_lock(
        &self,
        id: &SandboxId,
        observation: &Observation,
        before: Option<Sandbox>,
        reread: bool,
    ) -> Result<Decision, ApiError> {
        let locks = before.iter().map(|s| Lock::Sandbox(s.name.to_string())).collect();
        let retry = Retry::new(self.inner.settings.retry, Kind::Sandbox, id.as_str());
        let read = if reread { None } else { Some(before) };
        self.transact(&ObservationTransaction { id, observation }, Run { locks, retry, read }).await
    }

    /// Asks this gateway's pool loop, if it holds the lease, to refill now.
    pub fn want_refill(&self) {
        self.inner.refill.notify_one();
    }

    /// Resolves when a refill is wanted.
    pub async fn refill_wanted(&self) {
        self.inner.refill.notified().await;
    }

    /// What every long-lived stream ends at.
    pub fn shutdown(&self) -> &Shutdown {
        &self.inner.shutdown
    }
}

/// DESIGN 10: a spec whose limits this gateway's driver cannot enforce is refused before
/// anything is written (limits out of bounds first, as the core refuses them).
fn admit(driver: &dyn Driver, command: &berth_core::Command) -> Result<(), berth_core::Error> {
    match command {
        berth_core::Command::CreateSandbox { spec, .. } | berth_core::Command::CreateTemplate { spec, .. } => {
            berth_core::limits::validate(&spec.limits)?;
            driver.admit(spec)
        }
        berth_core::Command::PauseSandbox { hold, .. } => driver.admit_pause(*hold),
        _ => Ok(()),
    }
}

/// An API command, decided by [`berth_core::decide`] on what its plan reads.
struct CommandTransaction<'a>(&'a Request);

impl Transaction for CommandTransaction<'_> {
    type Read = Reads;

    fn what(&self) -> &'static str {
        self.0.plan().name
    }

    async fn read(&self, engine: &Engine) -> Result<Reads, ApiError> {
        let store = &engine.inner.store;
        let plan = self.0.plan();
        let sandbox = match plan.sandbox {
            Some(s) => store.sandbox_by_name(s.name).await?,
            None => None,
        };
        let mut providers = BTreeMap::new();
        for name in plan.providers_to_read(sandbox.as_ref()) {
            if let Some(p) = store.provider(&name).await? {
                providers.insert(name, p);
            }
        }
        let users = match plan.users_of {
            Some(p) => store.sandboxes_using(p).await?,
            None => Vec::new(),
        };
        let template = match plan.template {
            Some(t) => store.template(t.name).await?,
            None => None,
        };
        let members = match (plan.members, &template) {
            (true, Some(t)) => store.all_sandboxes(&BTreeMap::from([(POOL_LABEL.to_string(), t.name.clone())])).await?,
            _ => Vec::new(),
        };
        let open_execs = match (plan.open_execs, &sandbox) {
            (true, Some(s)) => store.open_execs(Some(&s.id)).await?.len(),
            _ => 0,
        };
        let snapshot = match plan.snapshot {
            Some(s) => store.snapshot(s.name).await?,
            None => None,
        };
        let snapshots = if plan.all_snapshots { store.all_snapshots().await? } else { Vec::new() };
        let snapshot_users = match (plan.snapshot_users, &snapshot) {
            (true, Some(s)) => {
                store.all_sandboxes(&BTreeMap::from([(SNAPSHOT_LABEL.to_string(), s.name.clone())])).await?
            }
            _ => Vec::new(),
        };
        let mut names_taken = std::collections::BTreeSet::new();
        for name in self.0.fork_names(snapshot.as_ref()) {
            if store.sandbox_by_name(name).await?.is_some() {
                names_taken.insert(name.to_string());
            }
        }
        let mut volumes = BTreeMap::new();
        for name in plan.volumes_to_read() {
            if let Some(v) = store.volume(name).await? {
                volumes.insert(name.to_string(), v);
            }
        }
        let volume_users = match (plan.volume_users, volumes.values().next()) {
            (true, Some(v)) => store.sandboxes_mounting(v).await?,
            _ => Vec::new(),
        };
        let nodes = if plan.places { engine.placement_nodes().await? } else { Vec::new() };
        let limits = engine.inner.settings.limits;
        Ok(Reads {
            sandbox,
            providers,
            users,
            limits,
            template,
            members,
            open_execs,
            snapshot,
            snapshots,
            snapshot_users,
            names_taken,
            volumes,
            volume_users,
            nodes,
        })
    }

    fn decide(&self, reads: &Reads, now: berth_core::Timestamp) -> Result<Decision, berth_core::Error> {
        decide(self.0, reads, now)
    }

    fn before<'r>(&self, reads: &'r Reads) -> Option<&'r Sandbox> {
        reads.sandbox.as_ref()
    }

    fn over_conflict(&self, decision: &Decision, conflict: &berth_core::Conflict) -> Option<Decision> {
        berth_core::bugs::claim_over(&self.0.command, decision, conflict)
    }
}

/// An observation of sandbox `id`, merged by [`berth_core::merge`] into the record as stored.
struct ObservationTransaction<'a> {
    id: &'a SandboxId,
    observation: &'a Observation,
}

impl Transaction for ObservationTransaction<'_> {
    type Read = Option<Sandbox>;

    fn what(&self) -> &'static str {
        self.observation.source_name()
    }

    async fn read(&self, engine: &Engine) -> Result<Option<Sandbox>, ApiError> {
        Ok(engine.inner.store.sandbox(self.id).await?)
    }

    fn decide(&self, current: &Option<Sandbox>, now: berth_core::Timestamp) -> Result<Decision, berth_core::Error> {
        merge(current.as_ref(), self.id, self.observation, now)
    }

    fn before<'r>(&self, current: &'r Option<Sandbox>) -> Option<&'r Sandbox> {
        current.as_ref()
    }
}

#[cfg(test)]
pub(crate) mod tests {

    use async_trait::async_trait;
    use berth_core::exec::{Exec, ExecId};
    use berth_core::{Command, Phase, Provider, RuntimeState, SandboxSpec, StartReply, Timestamp, Write};
    use berth_drivers::{DriverError, Launch, ListPage, WatchStream};

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{CommitError, Lease, Page, PageRequest, StoreError};

    /// The in-memory store, giving other tasks a turn before every call, as a real store's
    /// round trip does: writers that do not take turns on a record then interleave.
    struct Yielding(MemoryStore);

    #[async_trait]
    impl Store for Yielding {
        fn identity(&self) -> &str {
            self.0.identity()
        }
        fn kind(&self) -> &'static str {
            self.0.kind()
        }
        fn now(&self) -> Timestamp {
            self.0.now()
        }
        async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
            tokio::task::yield_now().await;
            self.0.sandbox(id).await
        }
        async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError> {
            tokio::task::yield_now().await;
            self.0.sandbox_by_name(name).await
        }
        async fn list_sandboxes_at(
            &self,
            page: &PageRequest,
            selector: &BTreeMap<String, String>,
        ) -> Result<crate::store::Listing, StoreError> {
            self.0.list_sandboxes_at(page, selector).await
        }
        async fn changes(&self, after: u64, limit: usize) -> Result<crate::store::Changes, StoreError> {
            self.0.changes(after, limit).await
        }
        async fn sandboxes_using(&self, provider: &str) -> Result<Vec<Sandbox>, StoreError> {
            tokio::task::yield_now().await;
            self.0.sandboxes_using(provider).await
        }
        async fn provider(&self, name: &str) -> Result<Option<Provider>, StoreError> {
            tokio::task::yield_now().await;
            self.0.provider(name).await
        }
        async fn list_providers(&self, page: &PageRequest) -> Result<Page<Provider>, StoreError> {
            self.0.list_providers(page).await
        }
        async fn template(&self, name: &str) -> Result<Option<berth_core::template::Template>, StoreError> {
            self.0.template(name).await
        }
        async fn list_templates(&self, page: &PageRequest) -> Result<Page<berth_core::template::Template>, StoreError> {
            self.0.list_templates(page).await
        }
        async fn snapshot(&self, name: &str) -> Result<Option<berth_core::Snapshot>, StoreError> {
            self.0.snapshot(name).await
        }
        async fn list_snapshots(&self, page: &PageRequest) -> Result<Page<berth_core::Snapshot>, StoreError> {
            self.0.list_snapshots(page).await
        }
        async fn volume(&self, name: &str) -> Result<Option<berth_core::Volume>, StoreError> {
            tokio::task::yield_now().await;
            self.0.volume(name).await
        }
        async fn list_volumes(&self, page: &PageRequest) -> Result<Page<berth_core::Volume>, StoreError> {
            self.0.list_volumes(page).await
        }
        async fn exec(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, StoreError> {
            tokio::task::yield_now().await;
            self.0.exec(sandbox, id).await
        }
        async fn list_execs(&self, sandbox: &SandboxId, page: &PageRequest) -> Result<Page<Exec>, StoreError> {
            self.0.list_execs(sandbox, page).await
        }
        async fn open_execs(&self, sandbox: Option<&SandboxId>) -> Result<Vec<Exec>, StoreError> {
            self.0.open_execs(sandbox).await
        }
        async fn commit(&self, writes: &[Write]) -> Result<(), CommitError> {
            tokio::task::yield_now().await;
            self.0.commit(writes).await
        }
        async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease, StoreError> {
            self.0.acquire_lease(holder, ttl).await
        }
        async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
            self.0.release_lease(holder).await
        }
        async fn acquire_node_lease(
            &self,
            node: &berth_core::NodeId,
            holder: &str,
            offer: &crate::store::NodeOffer,
            ttl: Duration,
        ) -> Result<Lease, StoreError> {
            self.0.acquire_node_lease(node, holder, offer, ttl).await
        }
        async fn release_node_lease(&self, node: &berth_core::NodeId, holder: &str) -> Result<(), StoreError> {
            self.0.release_node_lease(node, holder).await
        }
        async fn node(&self, id: &berth_core::NodeId) -> Result<Option<crate::store::Node>, StoreError> {
            self.0.node(id).await
        }
        async fn nodes(&self) -> Result<Vec<crate::store::Node>, StoreError> {
            self.0.nodes().await
        }
        async fn node_loads(
            &self,
        ) -> Result<BTreeMap<berth_core::NodeId, berth_core::placement::Capacity>, StoreError> {
            self.0.node_loads().await
        }
        async fn drain_node(&self, id: &berth_core::NodeId, draining: bool) -> Result<bool, StoreError> {
            self.0.drain_node(id, draining).await
        }
        async fn delete_node(&self, id: &berth_core::NodeId) -> Result<crate::store::NodeRemoval, StoreError> {
            self.0.delete_node(id).await
        }
    }

    /// These tests make no effect that reaches a runtime.
    pub(crate) struct NoRuntime;

    #[async_trait]
    impl Driver for NoRuntime {
        fn name(&self) -> &'static str {
            "none"
        }
        fn admit(&self, _: &berth_core::SandboxSpec) -> Result<(), berth_core::Error> {
            Ok(())
        }
        async fn start(&self, _: Launch) -> Result<StartReply, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn stop(&self, _: &SandboxId, _: u64, _: Duration) -> Result<RuntimeState, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn delete(&self, _: &SandboxId, _: Duration) -> Result<(), DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        fn admit_pause(&self, _: berth_core::Hold) -> Result<(), berth_core::Error> {
            Ok(())
        }
        async fn pause(&self, _: &SandboxId, _: berth_core::Hold) -> Result<RuntimeState, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn resume(&self, _: &SandboxId) -> Result<RuntimeState, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn get(&self, _: &SandboxId) -> Result<RuntimeState, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn snapshot(
            &self,
            _: &SandboxId,
            _: &berth_core::SnapshotId,
        ) -> Result<berth_core::record::Content, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn remove_snapshot(&self, _: &berth_core::SnapshotId) -> Result<(), DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn snapshots(&self) -> Result<Vec<berth_core::SnapshotId>, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn volume_bytes(&self, _: &berth_core::VolumeId) -> Result<u64, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn remove_volume(&self, _: &berth_core::VolumeId) -> Result<(), DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn volumes(&self) -> Result<Vec<berth_core::VolumeId>, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn list(&self, _: Option<&SandboxId>, _: usize) -> Result<ListPage, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
        async fn workspace(&self, _: &SandboxId) -> Result<std::path::PathBuf, DriverError> {
            Err(DriverError::Failed("this driver keeps no workspace".into()))
        }

        async fn logs(
            &self,
            _: &SandboxId,
            _: &berth_drivers::logs::Log,
            from: u64,
            _: usize,
            _: bool,
        ) -> Result<berth_drivers::logs::Read, DriverError> {
            Ok(berth_drivers::logs::Read::End { offset: from, exit_code: None })
        }

        async fn watch(&self) -> Result<WatchStream, DriverError> {
            Err(DriverError::Unavailable("no runtime".into()))
        }
    }

    /// A sandbox named `name` at version 1 whose run is up.
    pub(crate) fn ready_sandbox(name: &str) -> Sandbox {
        let spec = SandboxSpec { command: vec!["sleep".into()], ..SandboxSpec::default() };
        Sandbox {
            phase: Phase::Ready,
            run: berth_core::Run::Started { at: Some(Timestamp(1)) },
            ..Sandbox::new(SandboxId::new(format!("sb-{name}")), name, spec, Timestamp(1))
        }
    }

    /// Defect 4 of issue 13: sixteen clients attaching and detaching providers on one sandbox
    /// made server-owned commands fail with "under contention". With no conflict tolerated at
    /// all, every one of them must still succeed: writers inside a gateway take turns.
    #[tokio::test]
    async fn server_owned_writers_on_one_record_never_conflict_inside_a_gateway() {
        let store = Arc::new(Yielding(MemoryStore::new()));
        let hot = ready_sandbox("hot");
        let mut writes = vec![Write::CreateSandbox(hot.clone())];
        for p in ["p0", "p1"] {
            writes.push(Write::CreateProvider(Provider {
                endpoints: Default::default(),
                name: p.into(),
                kind: "test".into(),
                credentials: BTreeMap::new(),
                resource_version: 1,
                created_at: Timestamp(1),
                updated_at: Timestamp(1),
            }));
        }
        store.commit(&writes).await.unwrap();
        let settings = EngineSettings {
            retry: RetryPolicy { max_conflicts: 0, ..RetryPolicy::default() },
            ..EngineSettings::default()
        };
        let engine = Engine::new(store, Arc::new(NoRuntime), IdentityKey::from_bytes([7; 32]), settings, 1);
        let mut writers = Vec::new();
        for w in 0..16 {
            let engine = engine.clone();
            writers.push(tokio::spawn(async move {
                let provider = format!("p{}", w % 2);
                for i in 0..20 {
                    let (sandbox, provider) = ("hot".to_string(), provider.clone());
                    let command = if i % 2 == 0 {
                        Command::AttachProvider { sandbox, provider }
                    } else {
                        Command::DetachProvider { sandbox, provider }
                    };
                    engine.execute(&Request::new(command, None)).await.map_err(|e| format!("writer {w}: {e}"))?;
                }
                Ok::<(), String>(())
            }));
        }
        // Observations of the same record race the commands.
        let observer = {
            let engine = engine.clone();
            let id = hot.id.clone();
            tokio::spawn(async move {
                for at in 2..40 {
                    let seen = Observation::Runtime {
                        source: berth_core::RuntimeSource::PollGet,
                        // An earlier run's exit: stale, but newer than the last one seen, so
                        // each is a write.
                        state: RuntimeState::Exited(berth_core::ExitMarker {
                            started_at: Timestamp(0),
                            finished_at: Timestamp(at),
                            exit_code: 0,
                            out_of_memory: false,
                        }),
                        as_of_version: None,
                    };
                    engine.observe(&id, &seen, None).await.map_err(|e| format!("observer: {e}"))?;
                }
                Ok::<(), String>(())
            })
        };
        for writer in writers {
            writer.await.unwrap().unwrap();
        }
        observer.await.unwrap().unwrap();
        let after = engine.store().sandbox(&hot.id).await.unwrap().unwrap();
        assert_eq!(after.last_exit.map(|e| e.finished_at), Some(Timestamp(39)), "every observation merged");
    }
}
