//! The gateway's driver in the simulator: the real container driver over
//! [`crate::engine::SimEngine`] or the real process driver over [`crate::os::SimOs`], with each
//! call put in the trace, and L1's gateway side checked where reconcile reaches the runtime.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::{Hold, RuntimeState, SandboxId, SandboxSpec, StartReply};
use berth_drivers::{Driver, DriverError, Fence, Launch, ListPage, WatchStream};

use crate::invariants::{Invariant, s2_volumes_kept};
use crate::trace::Kind;
use crate::world::{World, lock};

pub struct SimDriver {
    world: Arc<World>,
    /// The gateway whose driver this is.
    gateway: String,
    /// Where its node keeps its sandboxes, when the node is its alone (several nodes share the
    /// simulated kernel): what its acknowledged stops are judged against.
    root: Option<PathBuf>,
    driver: Box<dyn Driver>,
}

impl SimDriver {
    pub fn new(world: Arc<World>, gateway: String, root: Option<PathBuf>, driver: Box<dyn Driver>) -> Arc<Self> {
        Arc::new(Self { world, gateway, root, driver })
    }

    fn trace(&self, what: String) {
        self.world.event(self.gateway.clone(), Kind::Driver, what);
    }

    /// The reconcile loop's look at the runtime: L1's gateway side is checked at each.
    fn reconciles(&self, kind: Kind, what: &str) {
        self.world.reconciling(&self.gateway, what);
        self.world.event(self.gateway.clone(), kind, what);
    }

    /// The driver's answer, in the trace beside its call.
    fn replied<T: std::fmt::Debug>(&self, what: String, reply: Result<T, DriverError>) -> Result<T, DriverError> {
        self.world.event(self.gateway.clone(), Kind::DriverReply, format!("{what}: {reply:?}"));
        reply
    }

    fn name(&self, id: &SandboxId) -> String {
        lock(&self.world.runtime).name(id)
    }
}

#[async_trait]
impl Driver for SimDriver {
    fn name(&self) -> &'static str {
        self.driver.name()
    }

    fn admit(&self, spec: &SandboxSpec) -> Result<(), berth_core::Error> {
        self.driver.admit(spec)
    }

    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        let what = format!("start {} generation {}", launch.name, launch.generation);
        self.trace(what.clone());
        let reply = self.driver.start(launch).await;
        self.replied(what, reply)
    }

    async fn stop(&self, sandbox: &SandboxId, generation: u64, grace: Duration) -> Result<RuntimeState, DriverError> {
        let what = format!("stop {} generation {generation}", self.name(sandbox));
        self.trace(what.clone());
        let reply = self.driver.stop(sandbox, generation, grace).await;
        if reply.is_ok() {
            crate::kernel::acknowledge(&self.world, sandbox, Some(generation), self.root.as_deref());
        }
        self.replied(what, reply)
    }

    /// The node's side of fencing: what the record may still want run is stopped (D1 does not
    /// judge these signals), and the runtime's listing for it is no reconcile (L1).
    async fn stop_every_run(
        &self,
        grace: Duration,
        lapsed: &Fence,
    ) -> Result<Vec<(SandboxId, DriverError)>, DriverError> {
        self.trace("stop every run".to_string());
        *lock(&self.world.fencing).entry(self.gateway.clone()).or_default() += 1;
        let reply = self.driver.stop_every_run(grace, lapsed).await;
        let mut fencing = lock(&self.world.fencing);
        if let Some(sweeps) = fencing.get_mut(&self.gateway) {
            *sweeps -= 1;
            if *sweeps == 0 {
                fencing.remove(&self.gateway);
            }
        }
        drop(fencing);
        self.replied("stop every run".to_string(), reply)
    }

    async fn delete(&self, sandbox: &SandboxId, grace: Duration) -> Result<(), DriverError> {
        let what = format!("delete {}", self.name(sandbox));
        self.trace(what.clone());
        let reply = self.driver.delete(sandbox, grace).await;
        if reply.is_ok() {
            crate::kernel::acknowledge(&self.world, sandbox, None, self.root.as_deref());
        }
        self.replied(what, reply)
    }

    fn admit_pause(&self, hold: Hold) -> Result<(), berth_core::Error> {
        self.driver.admit_pause(hold)
    }

    async fn pause(&self, sandbox: &SandboxId, hold: Hold) -> Result<RuntimeState, DriverError> {
        let verb = if hold == Hold::Checkpoint { "checkpoint" } else { "pause" };
        let what = format!("{verb} {}", self.name(sandbox));
        self.trace(what.clone());
        let reply = self.driver.pause(sandbox, hold).await;
        self.replied(what, reply)
    }

    async fn resume(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        let what = format!("resume {}", self.name(sandbox));
        self.trace(what.clone());
        let reply = self.driver.resume(sandbox).await;
        self.replied(what, reply)
    }

    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        let what = format!("get {}", self.name(sandbox));
        self.trace(what.clone());
        let reply = self.driver.get(sandbox).await;
        self.replied(what, reply)
    }

    async fn snapshot(
        &self,
        sandbox: &SandboxId,
        snapshot: &berth_core::SnapshotId,
    ) -> Result<berth_core::record::Content, DriverError> {
        let what = format!("snapshot {} as {snapshot}", self.name(sandbox));
        self.trace(what.clone());
        let reply = self.driver.snapshot(sandbox, snapshot).await;
        self.replied(what, reply)
    }

    async fn remove_snapshot(&self, snapshot: &berth_core::SnapshotId) -> Result<(), DriverError> {
        let what = format!("remove snapshot {snapshot}");
        self.trace(what.clone());
        let reply = self.driver.remove_snapshot(snapshot).await;
        self.replied(what, reply)
    }

    async fn snapshots(&self) -> Result<Vec<berth_core::SnapshotId>, DriverError> {
        self.driver.snapshots().await
    }

    async fn remove_volume(&self, volume: &berth_core::VolumeId) -> Result<(), DriverError> {
        let what = format!("remove volume {volume}");
        self.trace(what.clone());
        let records = crate::checker::all_records(&self.world).await;
        let under_run = {
            let runtime = lock(&self.world.runtime);
            s2_volumes_kept::removed_under_run(volume, &records, |id| runtime.alive_generation(id).is_some())
        };
        if let Some(problem) = under_run {
            self.world.violate(Invariant::S2, problem);
        }
        let reply = self.driver.remove_volume(volume).await;
        self.replied(what, reply)
    }

    async fn volumes(&self) -> Result<Vec<berth_core::VolumeId>, DriverError> {
        self.driver.volumes().await
    }

    async fn volume_bytes(&self, volume: &berth_core::VolumeId) -> Result<u64, DriverError> {
        self.driver.volume_bytes(volume).await
    }

    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError> {
        self.reconciles(Kind::Poll, "list");
        self.driver.list(after, limit).await
    }

    async fn workspace(&self, sandbox: &SandboxId) -> Result<std::path::PathBuf, DriverError> {
        self.driver.workspace(sandbox).await
    }

    async fn logs(
        &self,
        sandbox: &SandboxId,
        log: &berth_drivers::logs::Log,
        from: u64,
        max: usize,
        over: bool,
    ) -> Result<berth_drivers::logs::Read, DriverError> {
        self.driver.logs(sandbox, log, from, max, over).await
    }

    async fn watch(&self) -> Result<WatchStream, DriverError> {
        self.reconciles(Kind::Driver, "watch");
        self.driver.watch().await
    }
}
