//! An in-memory store. Writes are applied under one lock, so a transaction is atomic; the
//! simulator shares one across gateway crashes, which keeps every acknowledged write.
//! No operation blocks, sleeps or spawns: it is safe on any runtime, simulated or not.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::exec::{Exec, ExecId};
use berth_core::template::Template;
use berth_core::{Conflict, Key, NodeId, Provider, Sandbox, SandboxId, Snapshot, Timestamp, Volume, Write};

use super::{
    CHANGES_KEPT, Changes, CommitError, Lease, Listing, Logged, Node, NodeOffer, NodeRemoval, Page, PageRequest, Store,
    StoreError, selects,
};
use crate::clock::{Clock, SystemClock};

#[derive(Default)]
struct Tables {
    sandboxes: BTreeMap<SandboxId, Sandbox>,
    /// name → id, for uniqueness and by-name reads.
    names: BTreeMap<String, SandboxId>,
    providers: BTreeMap<String, Provider>,
    templates: BTreeMap<String, Template>,
    snapshots: BTreeMap<String, Snapshot>,
    volumes: BTreeMap<String, Volume>,
    execs: BTreeMap<(SandboxId, ExecId), Exec>,
    lease: Lease,
    lease_expires: Timestamp,
    /// Each node with when its lease expires (`live` is worked out when read).
    nodes: BTreeMap<NodeId, (Node, Timestamp)>,
    /// The last epoch of each deleted node: one that registers again goes on from there.
    removed_epochs: BTreeMap<NodeId, u64>,
    /// The change log's newest entries; positions count from 1.
    log: VecDeque<Logged>,
    head: u64,
}

pub struct MemoryStore {
    tables: Mutex<Tables>,
    /// The store's own clock, for the lease: the simulator's shared time.
    clock: Arc<dyn Clock>,
    identity: String,
    /// How many change log entries are kept.
    keep: u64,
}

/// Memory stores made so far in this process. Nothing outside the process can reach one, so a
/// count tells them apart, and the simulator, which runs this store, draws no randomness.
static MADE: AtomicU64 = AtomicU64::new(0);

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            tables: Mutex::default(),
            clock,
            identity: format!("memory-{}", MADE.fetch_add(1, Ordering::Relaxed)),
            keep: CHANGES_KEPT,
        }
    }

    /// Keeps only the newest `keep` change log entries (tests of a watcher left behind).
    pub fn keeping_changes(mut self, keep: u64) -> Self {
        self.keep = keep.max(1);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic while holding the lock cannot leave a half-applied transaction: writes are
        // applied only after every condition was checked, and applying does not panic.
        self.tables.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Tables {
    fn version(&self, key: &Key) -> Option<u64> {
        match key {
            Key::Sandbox(id) => self.sandboxes.get(id).map(|s| s.resource_version),
            Key::Provider(name) => self.providers.get(name).map(|p| p.resource_version),
            Key::Exec(sandbox, id) => self.execs.get(&(sandbox.clone(), id.clone())).map(|e| e.resource_version),
            Key::Template(name) => self.templates.get(name).map(|t| t.resource_version),
            Key::Snapshot(name) => self.snapshots.get(name).map(|s| s.resource_version),
            Key::Volume(name) => self.volumes.get(name).map(|v| v.resource_version),
            // A condition on the clock, which `check` asks of the clock.
            Key::Clock => None,
        }
    }

    fn check(&self, write: &Write, now: Timestamp) -> Result<(), Conflict> {
        if let Write::NotBefore(_) = write {
            return super::clock_reached(write, now).map_or(Ok(()), Err);
        }
        let key = write.key();
        let current = self.version(&key);
        if current != write.expected() {
            return Err(Conflict { key, expected: write.expected(), current });
        }
        // A name belongs to one sandbox: a create (or a rename, which core never decides)
        // onto a taken name fails, naming its holder.
        let claimed = match write {
            Write::CreateSandbox(s) => Some(s),
            Write::UpdateSandbox { record: s, .. } => Some(s),
            _ => None,
        };
        if let Some(s) = claimed
            && let Some(holder) = self.names.get(&*s.name).filter(|holder| **holder != s.id)
        {
            let key = Key::Sandbox(holder.clone());
            let current = self.version(&key);
            return Err(Conflict { key, expected: None, current });
        }
        Ok(())
    }

    fn log(&mut self, sandbox: Sandbox, removed: bool, keep: u64) {
        self.head += 1;
        self.log.push_back(Logged { seq: self.head, sandbox, removed });
        while self.log.len() as u64 > keep {
            self.log.pop_front();
        }
    }

    fn trimmed_through(&self) -> u64 {
        self.log.front().map_or(self.head, |first| first.seq - 1)
    }

    fn apply(&mut self, write: &Write, keep: u64) {
        match write {
            Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => {
                if let Some(old) = self.sandboxes.insert(s.id.clone(), s.clone()) {
                    self.names.remove(&*old.name);
                }
                self.names.insert(s.name.to_string(), s.id.clone());
                self.log(s.clone(), false, keep);
            }
            Write::RemoveSandbox { id, .. } => {
                if let Some(s) = self.sandboxes.remove(id) {
                    self.names.remove(&*s.name);
                    self.log(s, true, keep);
                }
                self.execs.retain(|(sandbox, _), _| sandbox != id);
            }
            Write::CheckSandbox { .. } | Write::NotBefore(_) => {}
            Write::CreateExec(e) | Write::UpdateExec { record: e, .. } => {
                self.execs.insert((e.sandbox.clone(), e.id.clone()), e.clone());
            }
            Write::CreateProvider(p) | Write::UpdateProvider { record: p, .. } => {
                self.providers.insert(p.name.clone(), p.clone());
            }
            Write::RemoveProvider { name, .. } => {
                self.providers.remove(name);
            }
            Write::CreateTemplate(t) | Write::UpdateTemplate { record: t, .. } => {
                self.templates.insert(t.name.clone(), t.clone());
            }
            Write::RemoveTemplate { name, .. } => {
                self.templates.remove(name);
            }
            Write::CreateSnapshot(s) | Write::UpdateSnapshot { record: s, .. } => {
                self.snapshots.insert(s.name.clone(), s.clone());
            }
            Write::RemoveSnapshot { name, .. } => {
                self.snapshots.remove(name);
            }
            Write::CreateVolume(v) | Write::UpdateVolume { record: v, .. } => {
                self.volumes.insert(v.name.clone(), v.clone());
            }
            Write::RemoveVolume { name, .. } => {
                self.volumes.remove(name);
            }
        }
    }
}

fn page<T: Clone>(items: impl Iterator<Item = (String, T)>, request: &PageRequest) -> Page<T> {
    let limit = request.limit.max(1);
    let mut out: Vec<(String, T)> =
        items.filter(|(name, _)| request.after.as_ref().is_none_or(|a| name > a)).take(limit + 1).collect();
    let next = if out.len() > limit {
        out.truncate(limit);
        out.last().map(|(name, _)| name.clone())
    } else {
        None
    };
    Page { items: out.into_iter().map(|(_, t)| t).collect(), next }
}

#[async_trait]
impl Store for MemoryStore {
    fn identity(&self) -> &str {
        &self.identity
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        Ok(self.lock().sandboxes.get(id).cloned())
    }

    async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError> {
        let t = self.lock();
        Ok(t.names.get(name).and_then(|id| t.sandboxes.get(id)).cloned())
    }

    async fn list_sandboxes_at(
        &self,
        request: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Listing, StoreError> {
        let t = self.lock();
        let matching = t
            .names
            .iter()
            .filter_map(|(name, id)| t.sandboxes.get(id).map(|s| (name.clone(), s)))
            .filter(|(_, s)| selects(selector, s))
            .map(|(name, s)| (name, s.clone()));
        Ok(Listing { page: page(matching, request), cursor: t.head })
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError> {
        let t = self.lock();
        let start = t.log.partition_point(|e| e.seq <= after);
        let entries = t.log.range(start..).take(limit).cloned().collect();
        Ok(Changes { entries, trimmed_through: t.trimmed_through(), head: t.head })
    }

    async fn sandboxes_using(&self, provider: &str) -> Result<Vec<Sandbox>, StoreError> {
        let t = self.lock();
        Ok(t.names
            .values()
            .filter_map(|id| t.sandboxes.get(id))
            .filter(|s| s.providers.contains(provider))
            .cloned()
            .collect())
    }

    async fn provider(&self, name: &str) -> Result<Option<Provider>, StoreError> {
        Ok(self.lock().providers.get(name).cloned())
    }

    async fn list_providers(&self, request: &PageRequest) -> Result<Page<Provider>, StoreError> {
        let t = self.lock();
        Ok(page(t.providers.iter().map(|(n, p)| (n.clone(), p.clone())), request))
    }

    async fn template(&self, name: &str) -> Result<Option<Template>, StoreError> {
        Ok(self.lock().templates.get(name).cloned())
    }

    async fn list_templates(&self, request: &PageRequest) -> Result<Page<Template>, StoreError> {
        let t = self.lock();
        Ok(page(t.templates.iter().map(|(n, t)| (n.clone(), t.clone())), request))
    }

    async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, StoreError> {
        Ok(self.lock().snapshots.get(name).cloned())
    }

    async fn list_snapshots(&self, request: &PageRequest) -> Result<Page<Snapshot>, StoreError> {
        let t = self.lock();
        Ok(page(t.snapshots.iter().map(|(n, s)| (n.clone(), s.clone())), request))
    }

    async fn volume(&self, name: &str) -> Result<Option<Volume>, StoreError> {
        Ok(self.lock().volumes.get(name).cloned())
    }

    async fn list_volumes(&self, request: &PageRequest) -> Result<Page<Volume>, StoreError> {
        let t = self.lock();
        Ok(page(t.volumes.iter().map(|(n, v)| (n.clone(), v.clone())), request))
    }

    async fn exec(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, StoreError> {
        Ok(self.lock().execs.get(&(sandbox.clone(), id.clone())).cloned())
    }

    async fn list_execs(&self, sandbox: &SandboxId, request: &PageRequest) -> Result<Page<Exec>, StoreError> {
        let t = self.lock();
        let of_sandbox = t.execs.iter().filter(|((s, _), _)| s == sandbox);
        Ok(page(of_sandbox.map(|((_, id), e)| (id.to_string(), e.clone())), request))
    }

    async fn open_execs(&self, sandbox: Option<&SandboxId>) -> Result<Vec<Exec>, StoreError> {
        let t = self.lock();
        let open = t.execs.values().filter(|e| !e.state.is_terminal() && sandbox.is_none_or(|s| *s == e.sandbox));
        Ok(open.cloned().collect())
    }

    async fn commit(&self, writes: &[Write]) -> Result<(), CommitError> {
        let now = self.clock.now();
        let mut t = self.lock();
        for write in writes {
            t.check(write, now).map_err(CommitError::Conflict)?;
        }
        if let Some(conflict) = super::one_name_twice(writes) {
            return Err(CommitError::Conflict(conflict));
        }
        for write in writes {
            t.apply(write, self.keep);
        }
        Ok(())
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease, StoreError> {
        let now = self.clock.now();
        let mut t = self.lock();
        let free = t.lease.holder.as_deref().is_none_or(|h| h == holder) || t.lease_expires <= now;
        if free {
            if !t.lease.held_by(holder) {
                t.lease = Lease { holder: Some(holder.to_string()), term: t.lease.term + 1 };
            }
            t.lease_expires = now.plus(ttl);
        }
        Ok(t.lease.clone())
    }

    async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        let mut t = self.lock();
        if t.lease.held_by(holder) {
            t.lease.holder = None;
        }
        Ok(())
    }

    async fn acquire_node_lease(
        &self,
        node: &NodeId,
        holder: &str,
        offer: &NodeOffer,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let now = self.clock.now();
        let mut t = self.lock();
        let last = t.removed_epochs.remove(node).unwrap_or(0);
        let (entry, expires) = t.nodes.entry(node.clone()).or_insert_with(|| {
            let lease = Lease { holder: None, term: last };
            (Node { id: node.clone(), offer: offer.clone(), draining: false, lease, live: false }, now)
        });
        let lapsed = *expires <= now;
        if entry.lease.holder.is_none() || lapsed || entry.lease.held_by(holder) {
            if lapsed || !entry.lease.held_by(holder) {
                entry.lease = Lease { holder: Some(holder.to_string()), term: entry.lease.term + 1 };
            }
            entry.offer = offer.clone();
            *expires = now.plus(ttl);
        }
        Ok(entry.lease.clone())
    }

    async fn release_node_lease(&self, node: &NodeId, holder: &str) -> Result<(), StoreError> {
        let mut t = self.lock();
        if let Some((entry, _)) = t.nodes.get_mut(node).filter(|(entry, _)| entry.lease.held_by(holder)) {
            entry.lease.holder = None;
        }
        Ok(())
    }

    async fn node(&self, id: &NodeId) -> Result<Option<Node>, StoreError> {
        let now = self.clock.now();
        Ok(self.lock().nodes.get(id).map(|(node, expires)| as_of(node, *expires, now)))
    }

    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        let now = self.clock.now();
        Ok(self.lock().nodes.values().map(|(node, expires)| as_of(node, *expires, now)).collect())
    }

    async fn node_loads(&self) -> Result<BTreeMap<NodeId, berth_core::placement::Capacity>, StoreError> {
        Ok(berth_core::placement::loads(self.lock().sandboxes.values()))
    }

    async fn drain_node(&self, id: &NodeId, draining: bool) -> Result<bool, StoreError> {
        let mut t = self.lock();
        let found = t.nodes.get_mut(id).map(|(node, _)| node.draining = draining);
        Ok(found.is_some())
    }

    async fn delete_node(&self, id: &NodeId) -> Result<NodeRemoval, StoreError> {
        let now = self.clock.now();
        let mut t = self.lock();
        let Some((node, expires)) = t.nodes.get(id) else { return Ok(NodeRemoval::NotFound) };
        let node = as_of(node, *expires, now);
        if node.live {
            return Ok(NodeRemoval::Live(node.lease));
        }
        let holding = berth_core::placement::loads(t.sandboxes.values()).get(id).map_or(0, |load| load.sandboxes);
        if holding > 0 {
            return Ok(NodeRemoval::Holding(holding));
        }
        t.removed_epochs.insert(id.clone(), node.lease.term);
        t.nodes.remove(id);
        Ok(NodeRemoval::Removed)
    }
}

/// `node` as read at `now`: live while its lease is held and not expired.
fn as_of(node: &Node, expires: Timestamp, now: Timestamp) -> Node {
    Node { live: node.lease.holder.is_some() && expires > now, ..node.clone() }
}
