//! The simulated runtime host's kernel, under the real process driver: a process table whose
//! pids are reused (the smallest free one, as a busy host hands them out soon after they free),
//! each process's start time, the identity in its environment, process groups that end on
//! SIGTERM once their supervisor recorded the exit, or at once on SIGKILL with no record, and
//! exit files written where and as berth-supervisor writes them. Spawns cross from the gateway
//! to this host and answer a moment later, so a gateway can die between a spawn and the
//! driver's record of it. The gateway's side is [`crate::os::SimOs`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_core::SandboxId;
use berth_core::identity::verify_token;
use berth_drivers::DriverError;
use berth_drivers::handoff::exit::Exit;
use berth_drivers::handoff::{began, flag, var};
use berth_drivers::process::os::SpawnSpec;
use berth_gateway::store::Store;
use futures_util::FutureExt;
use tokio::sync::{oneshot, watch};

use crate::invariants::{Invariant, d1_one_run};
use crate::runtime::{EndCause, Run, RunSignal, Runtime, RuntimeModel, Spawn};
use crate::world::{World, lock};

/// The lowest pid the simulated host hands out.
const FIRST_PID: i32 = 100;

/// One process group: a run's supervisor and its workload.
pub struct Process {
    pub pid: i32,
    pub kernel_start: u64,
    /// The generation its environment names (`BERTH_GENERATION`): what the driver's search by
    /// identity matches.
    named: u64,
    pub run: Run,
    /// Where its supervisor records the exit (`--exit-file`).
    exit_file: Option<PathBuf>,
    /// Its exit code once it ended, for the driver that spawned it.
    exit: watch::Sender<Option<i32>>,
}

impl Process {
    pub fn live(&self) -> bool {
        self.run.live()
    }
}

/// A process as the driver knows it after spawning it.
pub struct Spawned {
    pub pid: i32,
    pub kernel_start: u64,
    pub exit: watch::Receiver<Option<i32>>,
}

pub enum KernelCall {
    Spawn {
        gateway: usize,
        spec: SpawnSpec,
        reply: oneshot::Sender<Result<Spawned, DriverError>>,
    },
    /// SIGTERM to a group: its supervisor stops the workload, records the exit, and exits.
    Terminate {
        sandbox: SandboxId,
        pid: i32,
        kernel_start: u64,
    },
}

impl RuntimeModel {
    /// The live process holding `pid`.
    pub fn process(&self, pid: i32) -> Option<(&SandboxId, &Process)> {
        self.processes.iter().find_map(|(id, ps)| ps.iter().find(|p| p.live() && p.pid == pid).map(|p| (id, p)))
    }

    fn free_pid(&self) -> i32 {
        let mut pid = FIRST_PID;
        while self.process(pid).is_some() {
            pid += 1;
        }
        pid
    }

    pub(crate) fn live_process_mut(
        &mut self,
        sandbox: &SandboxId,
        pid: i32,
        kernel_start: u64,
    ) -> Option<&mut Process> {
        let processes = self.processes.get_mut(sandbox)?;
        processes.iter_mut().find(|p| p.live() && p.pid == pid && p.kernel_start == kernel_start)
    }

    /// Every live process: `(sandbox, pid, kernel start)`.
    pub fn live_processes(&self) -> Vec<(SandboxId, i32, u64)> {
        let all = self.processes.iter().flat_map(|(id, ps)| ps.iter().map(move |p| (id, p)));
        all.filter(|(_, p)| p.live()).map(|(id, p)| (id.clone(), p.pid, p.kernel_start)).collect()
    }
}

/// Ends a live process with `code`; its supervisor records the exit first unless it was killed
/// outright (`recorded` false). Whether it was still live.
pub fn end_process(
    world: &World,
    sandbox: &SandboxId,
    pid: i32,
    kernel_start: u64,
    code: i32,
    cause: EndCause,
    recorded: bool,
) -> bool {
    let now = world.runtime_time();
    let (generation, exit_file) = {
        let mut m = lock(&world.runtime);
        let Some(process) = m.live_process_mut(sandbox, pid, kernel_start) else { return false };
        process.run.finished = Some((now, code, cause));
        process.run.signal.send_replace(RunSignal::Ended);
        process.exit.send_replace(Some(code));
        (process.run.generation, process.exit_file.clone().filter(|_| recorded))
    };
    if let Some(path) = exit_file {
        record_exit(
            &path,
            Exit {
                exit_code: code,
                finished_at: now.unix_nanos(),
                generation: None,
                out_of_memory: cause == EndCause::OutOfMemory,
            },
        );
    }
    let name = lock(&world.runtime).name(sandbox);
    world.event("runtime", "exited", format!("{name} generation {generation} pid {pid} code {code} ({cause:?})"));
    true
}

/// Writes the exit as berth-supervisor does: atomically, and not at all where its run's folder
/// is gone.
fn record_exit(path: &Path, exit: Exit) {
    let _ = berth_drivers::handoff::write(path, &exit.to_bytes());
}

/// D1 as a signal (`what`) lands on a group of `generation`: against the record. The in-memory
/// store answers without yielding.
pub fn check_signal_wanted(world: &World, sandbox: &SandboxId, generation: u64, what: &str) {
    let Some(Ok(Some(record))) = world.store.sandbox(sandbox).now_or_never() else { return };
    if let Some(problem) = d1_one_run::unwanted_stop(&record, Some(generation), &format!("sent {what}")) {
        world.violate(Invariant::D1, problem);
    }
}

impl Runtime {
    /// Serves the process driver's calls forever; each runs as a task of its own.
    pub async fn serve_kernel(self: Arc<Self>, mut calls: tokio::sync::mpsc::UnboundedReceiver<KernelCall>) {
        while let Some(call) = calls.recv().await {
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                match call {
                    KernelCall::Spawn { gateway, spec, reply } => {
                        let spawned = this.spawn_process(spec);
                        if spawned.is_ok() {
                            this.crash_after(gateway, "a spawn".to_string());
                        }
                        // fork and exec take a moment to come back.
                        tokio::time::sleep(this.between_millis(1, 6)).await;
                        let _ = reply.send(spawned);
                    }
                    KernelCall::Terminate { sandbox, pid, kernel_start } => {
                        tokio::time::sleep(this.between(this.world.scenario.stop_duration)).await;
                        end_process(&this.world, &sandbox, pid, kernel_start, 143, EndCause::Stopped, true);
                    }
                }
            });
        }
    }

    /// Starts a supervisor's process group. Like berth-supervisor, it takes its identity from
    /// its environment's token, and exits at once (code 2, nothing recorded) without a valid one.
    fn spawn_process(&self, spec: SpawnSpec) -> Result<Spawned, DriverError> {
        let Some(sandbox) = spec.env.get(var::SANDBOX_ID).map(|id| SandboxId::new(id.clone())) else {
            return Err(DriverError::Failed("the simulated host runs only supervisors".to_string()));
        };
        // fork fails before its effect (EAGAIN): the runtime refused the start.
        if self.fault(self.world.scenario.faults.failed_calls) {
            let error =
                DriverError::Failed(format!("cannot run {}: Resource temporarily unavailable", spec.program.display()));
            let _ = self.refused(&sandbox, berth_drivers::container::EngineError::Refused(error.to_string()));
            return Err(error);
        }
        let named = spec.env.get(var::GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
        let token = spec.env.get(var::RUNTIME_TOKEN).cloned();
        let generation = token.as_deref().and_then(|t| verify_token(self.key(), t).ok()).map(|i| i.generation);
        let arg = |name: &str| spec.args.iter().position(|a| a == name).and_then(|i| spec.args.get(i + 1));
        let exit_file = arg(&flag::arg(flag::EXIT_FILE));
        // berth-supervisor's first act: here one step with the spawn.
        if let Some(path) = arg(&flag::arg(flag::BEGAN_FILE)) {
            let _ = std::fs::write(path, began::to_bytes(named));
        }
        let started_at = self.world.runtime_time();
        let (signal, watcher) = watch::channel(RunSignal::Running);
        let (exit, exit_rx) = watch::channel(None);
        let (pid, kernel_start, problems) = {
            let mut m = lock(&self.world.runtime);
            let pid = m.free_pid();
            let kernel_start = m.next_kernel_start();
            if let Some(name) = spec.env.get(var::SANDBOX_NAME) {
                m.name_sandbox(&sandbox, name);
            }
            let name = m.name(&sandbox);
            let earlier = m.processes.get(&sandbox).into_iter().flatten().map(|p| (p.pid, &p.run));
            let problems = d1_one_run::spawned_twice(&name, earlier, generation);
            let run = Run::new(generation.unwrap_or(0), started_at, token.clone().unwrap_or_default(), signal);
            let exit_file = exit_file.map(PathBuf::from);
            let process = Process { pid, kernel_start, named, run, exit_file, exit };
            m.processes.entry(sandbox.clone()).or_default().push(process);
            (pid, kernel_start, problems)
        };
        let name = self.name(&sandbox);
        self.world.event("runtime", "spawned", format!("{name} generation {} pid {pid}", generation.unwrap_or(0)));
        for problem in problems {
            self.world.violate(Invariant::D1, problem);
        }
        match (generation, token) {
            (Some(generation), Some(token)) => {
                self.supervise(Spawn { sandbox, generation, token, signal: watcher, ghost: false });
            }
            _ => {
                end_process(&self.world, &sandbox, pid, kernel_start, 2, EndCause::SupervisorExit, false);
            }
        }
        Ok(Spawned { pid, kernel_start, exit: exit_rx })
    }

    /// A live process of the sandbox (of `generation`, if given).
    pub(crate) fn live_process(&self, sandbox: &SandboxId, generation: Option<u64>) -> Option<(i32, u64)> {
        let m = lock(&self.world.runtime);
        let processes = m.processes.get(sandbox)?;
        let mut live = processes.iter().filter(|p| p.live() && generation.is_none_or(|g| g == p.run.generation));
        live.next().map(|p| (p.pid, p.kernel_start))
    }
}

/// The live leader of a group whose environment names `(sandbox, generation)`.
pub fn find_supervisor(world: &World, sandbox: &SandboxId, generation: u64) -> Option<(i32, u64)> {
    let m = lock(&world.runtime);
    let processes = m.processes.get(sandbox)?;
    let found = processes.iter().filter(|p| p.live() && p.named == generation).min_by_key(|p| p.pid);
    found.map(|p| (p.pid, p.kernel_start))
}
