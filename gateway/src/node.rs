//! This gateway as a node (DESIGN 14): the host it runs sandboxes on, registered in the store
//! with what it offers, under a lease that one process holds at a time. Gateways sharing a
//! data directory share its runtime, so they are one node: one of them holds the lease, and
//! another takes it over, in a new epoch, once the holder's lapses or is given up. The holder
//! reconciles the node's runtime; when its lease lapses unrenewed while other nodes are live,
//! it stops every run it holds, before the store can fence the node ([`crate::fencing`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::NodeId;
use berth_core::fencing::Standing;
use berth_core::placement::Capacity;
use tokio::sync::watch;

use tracing::{info, warn};

use crate::engine::Engine;
use crate::lease::{self, Asking, Tenant, Tenure};
use crate::reconcile::{self, ReconcileSettings};
use crate::store::{NodeOffer, StoreError};

#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub id: NodeId,
    /// This gateway's name: unique among the processes sharing the store.
    pub holder: String,
    pub offer: NodeOffer,
    /// How long the lease lasts unrenewed: how soon the node is fenced once its holder is gone.
    pub ttl: Duration,
    /// Where the node notes whether its last renewal was made in company (other nodes live),
    /// so that a gateway restarted while the store is out of reach knows whether the store may
    /// fence the node. None: the node is taken for alone.
    pub company: Option<PathBuf>,
}

/// The node's lease keeper: while it holds the lease it reconciles the node's runtime, and
/// what it holds shows in the metrics.
struct Agent {
    engine: Engine,
    settings: NodeSettings,
    reconcile: ReconcileSettings,
    tenure: Option<Tenure>,
    /// Whether another node was live at this node's last renewal: only then can the store place
    /// this node's sandboxes elsewhere, so only then does a lapse stop its runs.
    others_live: Arc<AtomicBool>,
}

#[async_trait]
impl Tenant for Agent {
    fn lease(&self) -> String {
        format!("node {}'s lease", self.settings.id)
    }
    fn ask(&self) -> Asking {
        let (store, settings, others) = (self.engine.store().clone(), self.settings.clone(), self.others_live.clone());
        Box::pin(async move {
            let NodeSettings { id, holder, offer, ttl, .. } = &settings;
            // Whether the node stops its runs should this renewal be its last is written with
            // it, so that the store fences only a node that does. Nodes not read: it does.
            let company = match store.nodes().await {
                Ok(nodes) => nodes.iter().any(|n| n.live && n.id != *id),
                Err(_) => true,
            };
            let offer = NodeOffer { stops_when_lapsed: company, ..offer.clone() };
            let lease = store.acquire_node_lease(id, holder, &offer, *ttl).await?;
            if others.swap(company, Ordering::Relaxed) != company
                && let Some(path) = &settings.company
                && let Err(e) = std::fs::write(path, if company { "1" } else { "0" })
            {
                warn!(path = %path.display(), error = %e, "cannot note whether the node renewed in company");
            }
            Ok(lease)
        })
    }
    async fn release(&self) -> Result<(), StoreError> {
        self.engine.store().release_node_lease(&self.settings.id, &self.settings.holder).await
    }
    fn begin(&mut self, epoch: u64) {
        info!(node = %self.settings.id, epoch, "recovery and the node's reconcile loops start");
        let (engine, settings) = (&self.engine, &self.reconcile);
        let recovery = {
            let (engine, page_size) = (engine.clone(), settings.page_size);
            tokio::spawn(async move {
                match reconcile::recover(&engine, page_size).await {
                    Ok(redriven) => info!(redriven, "recovery re-drove the unfinished transitions"),
                    Err(e) => warn!(error = %e, "recovery could not read the records; the poll sweep re-drives them"),
                }
            })
        };
        let watch = tokio::spawn(reconcile::watch_loop(engine.clone(), settings.clone()));
        let poll = tokio::spawn(reconcile::poll_loop(engine.clone(), settings.clone()));
        let follow = tokio::spawn(reconcile::follow_loop(engine.clone()));
        self.tenure = Some(Tenure::new(epoch, vec![recovery, watch, poll, follow]));
        self.engine.set_standing(Standing::Held(epoch));
    }
    fn end(&mut self, lapsed: bool) {
        if let Some(tenure) = self.tenure.take() {
            info!(node = %self.settings.id, "the node's reconcile loops stop here");
            tenure.end();
        }
        if berth_core::fencing::stops_on_lapse(lapsed, self.others_live.load(Ordering::Relaxed)) {
            warn!(node = %self.settings.id, "the node's lease lapsed unrenewed while other nodes are live: stopping every run it holds before the store fences it, and making none until it holds the lease again");
            self.engine.set_standing(Standing::Lapsed);
            tokio::spawn(stop_every_run(self.engine.clone()));
        } else {
            self.engine.set_standing(Standing::Sibling);
        }
    }
}

/// How long after its holder is gone a node's lease is held again, by a gateway sharing the
/// data directory or by the holder restarted: the lease lapses within `ttl`, and the next ask
/// comes within a third of it (every gateway asks that often); twice `ttl` leaves room for a
/// slow store. A command that makes a run waits this long for a live node.
pub fn takeover_within(ttl: Duration) -> Duration {
    ttl * 2
}

/// Registers the node and keeps its lease whenever this gateway can, reconciling its runtime
/// while it does, until `shutdown` turns true; then gives it up.
pub async fn keep(
    engine: Engine,
    settings: NodeSettings,
    reconcile: ReconcileSettings,
    shutdown: watch::Receiver<bool>,
) {
    let (holder, ttl) = (settings.holder.clone(), settings.ttl);
    let company = settings.company.as_deref().and_then(|path| std::fs::read(path).ok()).is_some_and(|c| c == b"1");
    if company {
        tokio::spawn(fence_unless_held(engine.clone(), ttl));
    }
    let others_live = Arc::new(AtomicBool::new(company));
    let agent = Agent { engine, settings, reconcile, tenure: None, others_live };
    lease::keep(agent, &holder, ttl, shutdown).await;
}

/// The node's side of fencing for a gateway that starts: the node's last renewal (by this
/// gateway before it restarted, or by a sibling) was made in company, so unless this gateway
/// holds the lease as soon as a renewal it made at its start could be relied on, the store may
/// be fencing the node, and the runs its runtime kept through the restart are stopped.
async fn fence_unless_held(engine: Engine, ttl: Duration) {
    tokio::time::sleep(berth_core::lease::relied_until(Duration::ZERO, Duration::ZERO, ttl)).await;
    if engine.node_epoch().is_none() {
        warn!(node = %engine.settings().node, "the node's lease is not held since this gateway started, and its last renewal was in company: stopping every run it holds before the store fences it");
        engine.set_standing(Standing::Lapsed);
        stop_every_run(engine).await;
    }
}

/// The node's side of fencing (DESIGN 14): its lease lapsed, so the store may fence it and place
/// its sandboxes elsewhere; it stops every run its runtime holds (whatever their generation),
/// keeping their workspaces, for as long as it does not hold the lease again. When it is
/// granted its lease again its sweep merges what it finds, and stops what the store placed
/// elsewhere meanwhile.
async fn stop_every_run(engine: Engine) {
    let lapsed = {
        let engine = engine.clone();
        berth_drivers::Fence::new(move || engine.node_epoch().is_none())
    };
    match engine.driver().stop_every_run(engine.settings().stop_grace, &lapsed).await {
        Ok(failed) => {
            for (id, e) in failed {
                warn!(sandbox = %id, error = %e, "cannot stop a run of a lapsed node");
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot list the runtime to stop its runs; the next sweep removes what is placed elsewhere")
        }
    }
}

/// The node a data directory is when no `--node` names it: its instance name, made a DNS label
/// (as node ids are) where it is not one: lowercased, anything but letters, digits and '-'
/// made '-', at most 63 characters, a letter or digit at each end.
pub fn default_id(instance: &str) -> NodeId {
    let mapped: String = instance
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(63)
        .collect();
    let trimmed = mapped.trim_matches('-');
    NodeId::new(if trimmed.is_empty() { "node" } else { trimmed })
}

/// What this host offers: its CPUs (a thousand millicores each), its memory (`MemTotal` in
/// `/proc/meminfo`; 0, not counted, where that cannot be read) and room for `sandboxes`.
pub fn host_capacity(sandboxes: u64) -> Capacity {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
    let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| mem_total(&info)).unwrap_or(0);
    Capacity { cpu_millis: cpus * 1000, memory_bytes: memory, sandboxes }
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_name_makes_a_node_id_that_is_a_dns_label() {
        for (instance, id) in [
            ("3f9a0c1d2e4b5a67", "3f9a0c1d2e4b5a67"),
            ("t-store_labels-docker", "t-store-labels-docker"),
            ("_Berth.Test_", "berth-test"),
            ("__", "node"),
        ] {
            assert_eq!(default_id(instance).as_str(), id);
            assert!(berth_core::validate::dns_label("node", default_id(instance).as_str()).is_ok());
        }
        assert_eq!(default_id(&"x".repeat(80)).as_str().len(), 63);
    }

    #[test]
    fn the_hosts_memory_is_read_from_meminfo() {
        let meminfo = "MemTotal:       24575996 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_575_996 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);
        let here = host_capacity(7);
        assert_eq!(here.sandboxes, 7);
        assert!(here.cpu_millis >= 1000 && here.memory_bytes > 0, "{here:?}");
    }
}
