//! The gateway's side of the simulated kernel: an [`Os`] for the real process driver. Reading
//! the process table and signalling act at once, as system calls do; a spawn crosses to the
//! runtime's host and comes back a moment later; what the signalled processes do next (their
//! handlers: the supervisor stopping its command, recording the exit, then exiting) happens
//! there, whatever becomes of the gateway meanwhile.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use berth_core::SandboxId;
use berth_core::limits::ResourceLimits;
use berth_drivers::DriverError;
use berth_drivers::process::os::{Child, Os, ProcessStat, Signal, SpawnSpec};
use berth_drivers::snapshot::Copying;
use tokio::sync::{mpsc, oneshot};

use crate::kernel::{self, KernelCall};
use crate::runtime::EndCause;
use crate::trace::Kind;
use crate::world::{World, lock};

/// Reaps the supervisor it stands for when dropped (see [`kernel::reap`]).
struct Reaper {
    world: Arc<World>,
    pid: i32,
    kernel_start: u64,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        kernel::reap(&self.world, self.pid, self.kernel_start);
    }
}

pub struct SimOs {
    world: Arc<World>,
    kernel: mpsc::UnboundedSender<KernelCall>,
    /// The gateway this is the host of.
    gateway: usize,
    /// Where its driver keeps its sandboxes: the processes of its runs name it (`BERTH_MOUNTS`),
    /// and it finds only those.
    root: PathBuf,
}

impl SimOs {
    pub fn new(world: Arc<World>, kernel: mpsc::UnboundedSender<KernelCall>, gateway: usize, root: PathBuf) -> Self {
        Self { world, kernel, gateway, root }
    }
}

#[async_trait]
impl Os for SimOs {
    fn now(&self) -> i64 {
        self.world.runtime_time().unix_nanos()
    }

    // A thread would make a run's order depend on the host's scheduler.
    fn copying(&self) -> Copying {
        Copying::Inline
    }

    async fn spawn(&self, spec: SpawnSpec) -> Result<Child, DriverError> {
        let (reply, answer) = oneshot::channel();
        let gone = || DriverError::Unavailable("the simulated host is gone".to_string());
        self.kernel.send(KernelCall::Spawn { gateway: self.gateway, spec, reply }).map_err(|_| gone())?;
        let spawned = answer.await.map_err(|_| gone())??;
        let mut exit = spawned.exit;
        // The driver's wait is what reaps the supervisor; a gateway that drops it (it died)
        // leaves the supervisor to init.
        let reaper = Reaper { world: Arc::clone(&self.world), pid: spawned.pid, kernel_start: spawned.kernel_start };
        let exit = Box::pin(async move {
            let _reaper = reaper;
            loop {
                if let Some(code) = *exit.borrow_and_update() {
                    return Some(code);
                }
                if exit.changed().await.is_err() {
                    return None;
                }
            }
        });
        Ok(Child { pid: spawned.pid, kernel_start: spawned.kernel_start, exit })
    }

    fn stat(&self, pid: i32) -> Option<ProcessStat> {
        let runtime = lock(&self.world.runtime);
        runtime.task(pid).map(|t| ProcessStat { live: t.running(), kernel_start: t.kernel_start })
    }

    fn kill(&self, pid: i32, signal: Signal) {
        let (reached, later) = kernel::kill(&self.world, pid, signal, EndCause::Stopped);
        if let Some((sandbox, generation)) = reached {
            let name = lock(&self.world.runtime).name(&sandbox);
            self.world.event(
                "runtime",
                Kind::Signalled,
                format!("{name} generation {generation}: kill -{signal:?} {pid}"),
            );
            kernel::check_signal_wanted(&self.world, self.gateway, &sandbox, generation, &format!("{signal:?}"));
        }
        for later in later {
            let _ = self.kernel.send(KernelCall::Later(later));
        }
    }

    fn find_supervisor(&self, sandbox: &SandboxId, generation: u64) -> Option<(i32, u64)> {
        kernel::find_supervisor(&self.world, &self.root, sandbox, generation)
    }

    fn find_group(&self, sandbox: &SandboxId, generation: u64) -> Option<i32> {
        kernel::find_group(&self.world, &self.root, sandbox, generation)
    }

    /// The simulated runs' execs are no processes of this kernel: nothing to kill.
    fn kill_execs(&self, _sandbox: &SandboxId) {}

    /// The simulated kernel has no cgroups, and the simulated workloads ask for no limits: the
    /// real ones are tested against the host's (drivers' conformance tests).
    fn cpus(&self) -> u64 {
        crate::world::HOST_CPUS
    }

    fn unenforceable(&self, _limits: &ResourceLimits) -> Option<(&'static str, String)> {
        None
    }

    fn limit(&self, _sandbox: &SandboxId, _limits: &ResourceLimits) -> Result<Vec<PathBuf>, DriverError> {
        Ok(Vec::new())
    }

    async fn unlimit(&self, _sandbox: &SandboxId) -> Result<(), DriverError> {
        Ok(())
    }

    /// The simulated kernel's freezer holds the run whose supervisor leads the sandbox's live
    /// group, as a cgroup would.
    async fn freeze(&self, sandbox: &SandboxId, frozen: bool) -> Result<(), DriverError> {
        kernel::freeze(&self.world, sandbox, frozen)
            .map_err(|why| DriverError::Failed(format!("cannot freeze the run: {why}")))
    }

    fn frozen(&self, sandbox: &SandboxId) -> bool {
        kernel::frozen(&self.world, sandbox)
    }

    fn no_freezer(&self) -> Option<String> {
        None
    }
}
