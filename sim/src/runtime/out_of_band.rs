//! What happens to runs behind Berth's back, at the seed's rates while faults are on:
//! containers removed, killed or restarted, process groups killed and sandbox folders removed,
//! workloads exiting by themselves (crash-looping commands among them), commands that cannot be
//! started, and supervisors of ended runs reconnecting with their old tokens.

use std::sync::Arc;
use std::time::Duration;

use berth_core::{Hold, SandboxId};
use berth_drivers::process::os::Signal;
use tokio::sync::watch;

use super::{Container, EndCause, RunSignal, Runtime, Spawn};
use crate::scenario::DriverKind;
use crate::trace::Kind;
use crate::world::lock;

/// The command of a crash-looping sandbox: while faults are on it fails soon after every start.
pub const CRASH: &str = "crash";

/// Whether a run whose arguments end in the user's command crash-loops.
pub(crate) fn crash_loops(args: &[String]) -> bool {
    args.last().is_some_and(|a| a == CRASH)
}

impl Runtime {
    /// Why a run's command could not be started, as berth-supervisor words it, traced.
    pub(crate) fn cannot_start(&self, id: &SandboxId, generation: u64) -> String {
        self.world.event("runtime", Kind::Unstartable, format!("{} generation {generation}", self.name(id)));
        "cannot run \"work\": No such file or directory (os error 2)".to_string()
    }

    /// How long a crash-looping command runs before it fails.
    pub(crate) fn crash_after_start(&self) -> Duration {
        self.between_millis(200, 1_500)
    }

    /// The runtime-side faults: stream disconnects, removals, kills, restarts, workload exits
    /// and stale supervisors, at this run's rates, while faults are on.
    pub(super) async fn inject_faults(self: Arc<Self>) {
        const EVERY: Duration = Duration::from_millis(100);
        let per_tick = |per_minute: f64| per_minute * EVERY.as_secs_f64() / 60.0;
        loop {
            tokio::time::sleep(EVERY).await;
            if !self.world.faults_on() {
                continue;
            }
            let f = self.world.scenario.faults.clone();
            if self.fault(per_tick(f.watch_disconnects)) {
                self.world.event("runtime", Kind::WatchStreamsDropped, "");
                lock(&self.world.runtime).subscribers.clear();
            }
            let processes = self.world.scenario.driver == DriverKind::Process;
            if self.fault(per_tick(f.removals)) {
                if processes {
                    self.remove_folder();
                } else if let Some(id) = self.pick(|_| true) {
                    let this = Arc::clone(&self);
                    tokio::spawn(async move { this.remove(&id, EndCause::Removed).await });
                }
            }
            if self.fault(per_tick(f.kills)) {
                if processes {
                    // `kill -9 -PGID`: the run's whole group.
                    if let Some((_, pid, _)) = self.pick_process() {
                        self.signal(-pid, Signal::Kill, EndCause::Killed);
                    }
                } else if let Some(id) = self.pick(|c| c.alive_generation().is_some()) {
                    self.end_run(&id, None, 137, EndCause::Killed);
                }
            }
            // A process has no restart outside its driver: only containers do.
            if self.fault(per_tick(f.restarts))
                && !processes
                && let Some(id) = self.pick(|c| !c.runs.is_empty())
            {
                let this = Arc::clone(&self);
                tokio::spawn(async move { this.restart(&id).await });
            }
            if self.fault(per_tick(f.workload_exits)) {
                let picked = if processes {
                    self.pick_process().map(|(id, pid, start)| (id, Some((pid, start))))
                } else {
                    self.pick(|c| c.alive_generation().is_some()).map(|id| (id, None))
                };
                if let Some((id, process)) = picked {
                    self.workload_exit(&id, process, false).await;
                }
            }
            if self.fault(per_tick(f.stale_supervisors)) {
                self.ghost();
            }
            if self.fault(per_tick(f.paused_runs_lost)) {
                self.lose_a_paused_run(processes);
            }
        }
    }

    /// A paused run's host rebooted: every process of the run is gone (the container's run
    /// killed, or the run's group), as is the freezer that held it. A checkpoint, on disk,
    /// outlives the reboot.
    fn lose_a_paused_run(self: &Arc<Self>, processes: bool) {
        let frozen: Vec<SandboxId> = {
            let m = lock(&self.world.runtime);
            m.sandboxes().filter(|id| m.held(id, None) == Some(Hold::Freezer)).cloned().collect()
        };
        let Some(id) = self.pick_of(frozen) else { return };
        self.world.event("runtime", Kind::PausedRunLost, self.name(&id));
        if !processes {
            self.end_run(&id, None, 137, EndCause::Killed);
            return;
        }
        let live = lock(&self.world.runtime).live_processes();
        if let Some((_, pid, _)) = live.into_iter().find(|(sandbox, _, _)| *sandbox == id) {
            self.signal(-pid, Signal::Kill, EndCause::Killed);
        }
    }

    fn pick(&self, filter: impl Fn(&Container) -> bool) -> Option<SandboxId> {
        let ids: Vec<SandboxId> =
            lock(&self.world.runtime).containers.iter().filter(|(_, c)| filter(c)).map(|(id, _)| id.clone()).collect();
        self.pick_of(ids)
    }

    fn pick_of<T: Clone>(&self, items: Vec<T>) -> Option<T> {
        (!items.is_empty()).then(|| items[self.draw(|d| d.below(items.len() as u64)) as usize].clone())
    }

    /// A live process group: `(sandbox, pid, kernel start)`.
    fn pick_process(&self) -> Option<(SandboxId, i32, u64)> {
        let live = lock(&self.world.runtime).live_processes();
        self.pick_of(live)
    }

    /// `rm -rf` of a sandbox's folder behind the process driver's back, its processes killed
    /// first (they hold it open).
    fn remove_folder(self: &Arc<Self>) {
        // Each node's driver keeps its own folders; with one node, its root is the host's.
        let mut folders: Vec<(std::path::PathBuf, SandboxId)> = Vec::new();
        for root in self.world.roots() {
            let Ok(entries) = std::fs::read_dir(&root) else { continue };
            let ids =
                entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|name| !name.starts_with('.'));
            folders.extend(ids.map(|id| (root.clone(), SandboxId::new(id))));
        }
        folders.sort();
        let Some((root, id)) = self.pick_of(folders) else { return };
        let several = self.world.scenario.nodes > 1;
        let tree: Vec<i32> = {
            let m = lock(&self.world.runtime);
            let ours = |t: &&crate::kernel::Task| t.sandbox == id && (!several || m.run_under(t, &root));
            m.running_tasks().filter(ours).map(|t| t.pid).collect()
        };
        // All of them dead before any supervisor could see its command go.
        let mut later = Vec::new();
        for pid in tree {
            later.extend(crate::kernel::kill(&self.world, pid, Signal::Kill, EndCause::Removed).1);
        }
        for later in later {
            self.carry_out(later);
        }
        let _ = std::fs::remove_dir_all(root.join(id.as_str()));
        let at = self.world.runtime_time();
        lock(&self.world.runtime).removals.entry(id.clone()).or_default().push(at);
        self.world.event("runtime", Kind::Removed, format!("{}'s folder (out of band)", self.name(&id)));
    }

    /// `docker restart` behind Berth's back: the run ends, and a new one starts with whatever
    /// token the state directory holds now.
    async fn restart(self: Arc<Self>, id: &SandboxId) {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        self.world.event("runtime", Kind::RestartOutOfBand, self.name(id));
        self.end_run(id, None, 143, EndCause::Restarted);
        let _ = self.start_run(id, true).await;
    }

    /// The workload exits by itself (the container's, or the command of the supervisor `(pid,
    /// kernel start)`): its supervisor reports it, then the run ends. A crash (`fails`) is never
    /// a completion.
    pub(crate) async fn workload_exit(self: &Arc<Self>, id: &SandboxId, process: Option<(i32, u64)>, fails: bool) {
        // A held command cannot end by itself (a kill still ends a frozen one).
        if lock(&self.world.runtime).held(id, None).is_some() {
            return;
        }
        // 0 is a completion (DESIGN 9.3); the others failures, one in ten the kernel's kill for
        // memory (DESIGN 10), as the supervisor reports it: 137, out of memory.
        let code = self.draw(|d| if fails { 1 + d.below(9) } else { d.below(10) } as i32);
        let (code, cause) = if code == 9 { (137, EndCause::OutOfMemory) } else { (code, EndCause::WorkloadExit) };
        if let Some(supervisor) = process {
            return self.command_exits(id, supervisor, code, cause);
        }
        let Some(generation) = self.main_exited(id, None, code, cause) else { return };
        let this = Arc::clone(self);
        let id = id.clone();
        let linger = self.draw(|d| d.millis(20, 500));
        tokio::spawn(async move {
            tokio::time::sleep(linger).await;
            this.end_run(&id, Some(generation), code, cause);
        });
    }

    /// Tells the live run (the container's, or that of the supervisor `(pid, kernel start)`)
    /// that its workload exited with `code`, as its supervisor sees it: the run's generation.
    pub(crate) fn main_exited(
        &self,
        id: &SandboxId,
        process: Option<(i32, u64)>,
        code: i32,
        cause: EndCause,
    ) -> Option<u64> {
        let out_of_memory = cause == EndCause::OutOfMemory;
        // berth-supervisor learns of a kill for memory from its cgroup's counter; one in three
        // containers' supervisors cannot read it (no cgroup of their own to read), and report a
        // plain 137, which the engine's own verdict (Docker's `OOMKilled`) refines.
        let reported = out_of_memory && (process.is_some() || self.draw(|d| d.below(3) != 0));
        let generation = {
            let mut m = lock(&self.world.runtime);
            let run = match process {
                None => m.containers.get_mut(id).and_then(Container::alive),
                Some((pid, start)) => m.live_process_mut(id, pid, start).map(|p| &mut p.run),
            };
            let run = run?;
            run.signal.send_replace(RunSignal::MainExited { code, out_of_memory: reported });
            let generation = run.generation;
            m.main_exits.push((id.clone(), generation));
            if out_of_memory {
                m.oom_kills.push((id.clone(), generation));
            }
            generation
        };
        self.world.event(
            "runtime",
            Kind::WorkloadExits,
            format!("{} generation {generation} code {code}", self.name(id)),
        );
        Some(generation)
    }

    /// A supervisor of an ended run reconnects with its old token.
    fn ghost(&self) {
        let ended: Vec<(SandboxId, u64, String)> = {
            let m = lock(&self.world.runtime);
            let containers = m.containers.iter().flat_map(|(id, c)| c.runs.iter().map(move |r| (id, r)));
            let processes = m.processes.iter().flat_map(|(id, ps)| ps.iter().map(move |p| (id, &p.run)));
            containers
                .chain(processes)
                .filter(|(_, r)| r.finished.is_some() && !r.token.is_empty())
                .map(|(id, r)| (id.clone(), r.generation, r.token.clone()))
                .collect()
        };
        if ended.is_empty() {
            return;
        }
        let (sandbox, generation, token) = ended[self.draw(|d| d.below(ended.len() as u64)) as usize].clone();
        self.world.event("runtime", Kind::StaleSupervisor, format!("{} generation {generation}", self.name(&sandbox)));
        let (_, signal) = watch::channel(RunSignal::Ended);
        let _ = self.supervisors.send(Spawn {
            sandbox,
            generation,
            token,
            signal,
            ghost: true,
            failed_to_start: None,
            home: None,
        });
    }
}
