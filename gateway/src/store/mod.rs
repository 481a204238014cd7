//! The store: conditional writes of sandbox and provider records (DESIGN 3.3).
//!
//! Every write is conditional: create-if-absent, write-if-version, delete-if-version, and a
//! transaction of several, all applied or none. A failed condition is reported as a
//! [`Conflict`] naming the record and its current version (or its absence), never silently
//! overwritten. Implementations: [`sqlite::SqliteStore`] (the embedded default),
//! [`postgres::PostgresStore`] (shared by several gateways) and [`memory::MemoryStore`] (the
//! simulator's, and tests').

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::exec::{Exec, ExecId};
use berth_core::placement::Capacity;
use berth_core::template::Template;
use berth_core::{Conflict, Key, NodeId, Provider, Sandbox, SandboxId, Snapshot, Timestamp, Volume, Write};
use serde::{Deserialize, Serialize};

mod codec;
pub mod memory;
pub mod postgres;
pub mod sqlite;

/// The conflict of a commit that gives one name to two of its sandboxes: the first to claim it
/// holds it, as a unique index keeps the first row that takes a name. A commit's conditions are
/// checked on the state before it, so they cannot see this; no attempt of the commit can pass.
pub(crate) fn one_name_twice(writes: &[Write]) -> Option<Conflict> {
    let mut claims: Vec<&Sandbox> = Vec::new();
    writes.iter().find_map(|write| {
        let (Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. }) = write else { return None };
        // A sandbox written again in the commit gives up the name it claimed before.
        claims.retain(|claim| claim.id != s.id);
        if let Some(holder) = claims.iter().find(|claim| claim.name == s.name) {
            let key = Key::Sandbox(holder.id.clone());
            return Some(Conflict { key, expected: None, current: Some(holder.resource_version) });
        }
        claims.push(s);
        None
    })
}

/// Where a page starts and how long it is. Pages are ordered by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageRequest {
    /// Start after this name (the previous page's `next`).
    pub after: Option<String>,
    pub limit: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// The name to continue after; `None` on the last page.
    pub next: Option<String>,
}

/// A page of sandboxes and where the store's change log stood when it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub page: Page<Sandbox>,
    /// The change log's position at the page's snapshot: every change the page shows is at or
    /// before it, every change it does not show is after it, so a fleet watch from here misses
    /// nothing and repeats nothing of this page.
    pub cursor: u64,
}

/// One entry of the change log: a sandbox write, in commit order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Its position: every entry committed after it has a greater one.
    pub seq: u64,
    /// The record written, or for a removal the record as it was when removed.
    pub sandbox: Sandbox,
    pub removed: bool,
}

/// A stretch of the change log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Entries after the position asked for, in order.
    pub entries: Vec<Logged>,
    /// Entries up to here are gone (the log keeps only the newest): a position before it has
    /// missed some.
    pub trimmed_through: u64,
    /// The newest position the log holds.
    pub head: u64,
}

/// How many entries a change log keeps at least: a watcher disconnected for longer than it
/// takes the fleet to make this many changes must list again.
pub const CHANGES_KEPT: u64 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or refused the operation for a reason that may pass.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A record could not be decoded: a bug or a damaged database.
    #[error("store holds an unreadable record: {0}")]
    Corrupt(String),
}

/// A [`Write::NotBefore`]'s condition against the store's clock as it reads `now`: the conflict
/// says the time the write expected and the clock's reading.
pub(crate) fn clock_reached(write: &Write, now: Timestamp) -> Option<Conflict> {
    let Write::NotBefore(at) = write else { return None };
    let current = Some(berth_core::decision::clock_millis(now));
    (now < *at).then(|| Conflict { key: Key::Clock, expected: write.expected(), current })
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("conflict on {:?}: expected {:?}, current {:?}", .0.key, .0.expected, .0.current)]
    Conflict(Conflict),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The reconcile lease as the store holds it (several gateways on one store: only its holder
/// runs recovery and the reconcile loops).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it; `None` once released, or before anyone took it.
    pub holder: Option<String>,
    /// +1 at every change of holder: tells one tenure from the next.
    pub term: u64,
}

impl Lease {
    pub fn held_by(&self, holder: &str) -> bool {
        self.holder.as_deref() == Some(holder)
    }
}

/// What a node registers with its lease (DESIGN 14): where gateways reach it, its labels (what
/// node selectors match) and its capacity. The SQL stores keep it as JSON beside the lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOffer {
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: Capacity,
    /// Whether, should this renewal be its last, the node stops every run it holds once the
    /// lease lapses (it saw other nodes live as it renewed: [`berth_core::fencing::stops_on_lapse`]).
    /// Only such a node is fenced: the store places elsewhere only what the node has let go.
    #[serde(default)]
    pub stops_when_lapsed: bool,
    /// Where the node serves E2B's API (`--e2b-listen`), if it does: E2B's in-sandbox calls
    /// about its sandboxes are carried there from the gateway a client speaks to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2b_address: Option<String>,
}

/// A node as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: NodeId,
    pub offer: NodeOffer,
    /// `node drain`: it keeps what runs on it and is given nothing new.
    pub draining: bool,
    /// Its lease: the process of the node that holds it (`None` once released) and, as the
    /// term, the node's epoch, which every effect sent to it carries.
    pub lease: Lease,
    /// Whether the lease is held now by the store's clock. A node whose lease lapsed is fenced
    /// ([`berth_core::fencing`]) until it is granted again, in a new epoch.
    pub live: bool,
}

impl Node {
    /// The node as core's placement reads it, with what the sandboxes placed on it reserve.
    pub fn for_placement(self, placed: Capacity) -> berth_core::placement::Node {
        berth_core::placement::Node {
            id: self.id,
            epoch: self.lease.term,
            live: self.live,
            draining: self.draining,
            labels: self.offer.labels,
            capacity: self.offer.capacity,
            placed,
        }
    }
}

/// What a sandbox reserves on its node, as the SQL stores keep it beside the record: a row
/// for each sandbox that counts ([`berth_core::placement::reserves`]), summed by node.
pub(crate) struct Reservation {
    pub node: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
}

impl Reservation {
    pub(crate) fn of(s: &Sandbox) -> Result<Option<Self>, StoreError> {
        let Some(placement) = s.placement.as_ref().filter(|_| berth_core::placement::reserves(s)) else {
            return Ok(None);
        };
        let reserved = Capacity::of(&s.spec.limits);
        let column = |v: u64| {
            i64::try_from(v)
                .map_err(|_| StoreError::Unavailable(format!("sandbox {}: a limit of {v} is too large", s.id)))
        };
        Ok(Some(Self {
            node: placement.node.to_string(),
            cpu_millis: column(reserved.cpu_millis)?,
            memory_bytes: column(reserved.memory_bytes)?,
        }))
    }
}

/// What a node's delete found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeRemoval {
    Removed,
    NotFound,
    /// Its lease is held: a live node registers again at its next renewal, so it stays.
    Live(Lease),
    /// Sandboxes that are not stopped are placed on it (this many): they would be left on a
    /// node nobody may name, so it stays until they are stopped, deleted or moved.
    Holding(u64),
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The store's identity: made once, at random, in the store itself (every connection to one
    /// database, and every gateway using it, sees the same), and different for every other
    /// store. It binds a data directory and the runtime's resources to the records they belong
    /// to, so that a gateway on another store never mistakes them for its own orphans.
    fn identity(&self) -> &str;
    /// What kind of store this is, for reads of the gateway's info: "sqlite", "postgres" or
    /// "memory".
    fn kind(&self) -> &'static str;
    /// Now, on the store's clock: the one clock every gateway sharing the store agrees on, by
    /// which deadlines, restart backoffs and record times are kept (DESIGN 9.1). Read without a
    /// round trip: a networked store keeps its offset from the local clock.
    fn now(&self) -> Timestamp;
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError>;
    async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError>;
    /// Sandboxes ordered by name whose labels hold every pair of `selector`, and the change
    /// log's position at the same snapshot.
    async fn list_sandboxes_at(
        &self,
        page: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Listing, StoreError>;
    /// [`Store::list_sandboxes_at`] without the position.
    async fn list_sandboxes(
        &self,
        page: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Page<Sandbox>, StoreError> {
        Ok(self.list_sandboxes_at(page, selector).await?.page)
    }
    /// Up to `limit` entries of the change log after position `after`. Every sandbox write is
    /// logged in the transaction that makes it, so the log is exactly the writes committed, in
    /// the order they committed.
    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError>;
    /// Every sandbox that references `provider`, in any phase.
    async fn sandboxes_using(&self, provider: &str) -> Result<Vec<Sandbox>, StoreError>;
    async fn provider(&self, name: &str) -> Result<Option<Provider>, StoreError>;
    async fn list_providers(&self, page: &PageRequest) -> Result<Page<Provider>, StoreError>;
    async fn template(&self, name: &str) -> Result<Option<Template>, StoreError>;
    async fn list_templates(&self, page: &PageRequest) -> Result<Page<Template>, StoreError>;
    async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, StoreError>;
    async fn list_snapshots(&self, page: &PageRequest) -> Result<Page<Snapshot>, StoreError>;
    /// Every snapshot, page by page.
    async fn all_snapshots(&self) -> Result<Vec<Snapshot>, StoreError> {
        every(|page| async move { self.list_snapshots(&page).await }).await
    }
    async fn volume(&self, name: &str) -> Result<Option<Volume>, StoreError>;
    async fn list_volumes(&self, page: &PageRequest) -> Result<Page<Volume>, StoreError>;
    /// Every volume, page by page.
    async fn all_volumes(&self) -> Result<Vec<Volume>, StoreError> {
        every(|page| async move { self.list_volumes(&page).await }).await
    }
    /// Every sandbox bound to volume `volume` ([`berth_core::volume::label`]), in any phase.
    async fn sandboxes_mounting(&self, volume: &Volume) -> Result<Vec<Sandbox>, StoreError> {
        let selector = BTreeMap::from([(berth_core::volume::label(&volume.name), volume.id.to_string())]);
        self.all_sandboxes(&selector).await
    }
    /// Every sandbox whose labels hold every pair of `selector`, page by page.
    async fn all_sandboxes(&self, selector: &BTreeMap<String, String>) -> Result<Vec<Sandbox>, StoreError> {
        every(|page| async move { self.list_sandboxes(&page, selector).await }).await
    }
    async fn exec(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, StoreError>;
    /// A sandbox's execs, ordered by id.
    async fn list_execs(&self, sandbox: &SandboxId, page: &PageRequest) -> Result<Page<Exec>, StoreError>;
    /// Every exec not yet in a terminal state, of one sandbox or of all, ordered by sandbox and
    /// id: what a new session must run and what the sweep must end.
    async fn open_execs(&self, sandbox: Option<&SandboxId>) -> Result<Vec<Exec>, StoreError>;
    /// Applies `writes` atomically if every condition holds; otherwise applies none and reports
    /// the first condition that failed. A `CreateSandbox` also fails if its name is taken.
    async fn commit(&self, writes: &[Write]) -> Result<(), CommitError>;
    /// Takes the reconcile lease for `holder` until `ttl` from now on the store's own clock (so
    /// gateways' clocks never need to agree), if it is free, lapsed or already `holder`'s (a
    /// renewal). Returns the lease as it stands afterwards, whoever holds it.
    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease, StoreError>;
    /// Gives the lease up if `holder` holds it, so another gateway takes it without waiting for
    /// it to lapse.
    async fn release_lease(&self, holder: &str) -> Result<(), StoreError>;
    /// Takes or renews node `node`'s lease for `holder` (one process of that node) until `ttl`
    /// from now on the store's clock (DESIGN 14). Held by `holder` and not lapsed: renewed in
    /// its epoch. Released or lapsed: granted in the next epoch, to `holder` too, since the
    /// gateways may have fenced the node's runs in between (a first registration is epoch 1).
    /// Held by another process: left as it is. Whenever `holder` holds it afterwards, the
    /// node's offer is `offer`. Returns the lease as it stands afterwards.
    async fn acquire_node_lease(
        &self,
        node: &NodeId,
        holder: &str,
        offer: &NodeOffer,
        ttl: Duration,
    ) -> Result<Lease, StoreError>;
    /// Gives node `node`'s lease up if `holder` holds it: its runs are fenced at once rather
    /// than when the lease would have lapsed.
    async fn release_node_lease(&self, node: &NodeId, holder: &str) -> Result<(), StoreError>;
    async fn node(&self, id: &NodeId) -> Result<Option<Node>, StoreError>;
    /// Every node registered, in id order.
    async fn nodes(&self) -> Result<Vec<Node>, StoreError>;
    /// What the sandboxes placed on each node reserve there ([`berth_core::placement::loads`]).
    async fn node_loads(&self) -> Result<BTreeMap<NodeId, Capacity>, StoreError>;
    /// Marks node `id` draining (`node drain`) or not (`node undrain`); false when no such node
    /// is registered.
    async fn drain_node(&self, id: &NodeId, draining: bool) -> Result<bool, StoreError>;
    /// Removes node `id`'s row, unless its lease is held now by the store's clock; decided and
    /// done in one step, so a renewal racing it either keeps the node or finds it gone and
    /// registers it anew.
    async fn delete_node(&self, id: &NodeId) -> Result<NodeRemoval, StoreError>;
}

/// Every item of a listing, page by page.
async fn every<T, Listed>(mut list: impl FnMut(PageRequest) -> Listed) -> Result<Vec<T>, StoreError>
where
    Listed: std::future::Future<Output = Result<Page<T>, StoreError>>,
{
    let mut all = Vec::new();
    let mut page = PageRequest { after: None, limit: 500 };
    loop {
        let batch = list(page.clone()).await?;
        all.extend(batch.items);
        match batch.next {
            Some(next) => page.after = Some(next),
            None => return Ok(all),
        }
    }
}

/// A new store identity: 128 random bits, in hex.
fn new_identity() -> Result<String, StoreError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Unavailable(format!("no randomness from the OS: {e}")))?;
    Ok(hex::encode(bytes))
}

/// Whether `sandbox` matches a label selector.
pub fn selects(selector: &BTreeMap<String, String>, sandbox: &Sandbox) -> bool {
    selector.iter().all(|(k, v)| sandbox.spec.labels.get(k) == Some(v))
}
