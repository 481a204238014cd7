//! The simulated runtime host's kernel, under the real process driver: a process table as
//! Linux keeps one. Each process has a parent, a process group and a session; a pid is handed
//! out again as soon as nothing uses it as a process's, group's or session's id (the smallest
//! free one, as a busy host hands them out soon after they free). A run is a tree: its
//! supervisor leads a new group in its gateway's session (the driver's `setpgid`), its command
//! runs as the supervisor's child in that group, and the command starts helpers of its own,
//! some slow to heed SIGTERM or deaf to it, some that daemonize (fork twice, so init adopts
//! them) without leaving the group. A signal to a pid reaches that process alone, a signal to a
//! group every member; a parent that exits leaves its children to init, which reaps them, and
//! a supervisor that exits is a zombie until its gateway reaps it (at once, or as it dies).
//! Spawns cross from the gateway to this host and answer a moment later, so a gateway can die
//! between a spawn and the driver's record of it; what a process does after a signal (its
//! handler) happens on this host too, whatever becomes of the gateway that sent it. The
//! gateway's side is [`crate::os::SimOs`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_core::SandboxId;
use berth_core::identity::verify_token;
use berth_drivers::DriverError;
use berth_drivers::handoff::exit::Exit;
use berth_drivers::handoff::{began, flag, var};
use berth_drivers::process::os::{Signal, SpawnSpec};
use berth_gateway::store::Store;
use futures_util::FutureExt;
use tokio::sync::{oneshot, watch};

use crate::invariants::{Invariant, d1_one_run, n1_one_run_across_nodes};
use crate::runtime::{EndCause, Run, RunSignal, Runtime, RuntimeModel, Spawn};
use crate::trace::Kind;
use crate::world::{World, lock};

/// The lowest pid the simulated host hands out.
const FIRST_PID: i32 = 100;
/// init: it adopts orphans and reaps them as they exit.
const INIT: i32 = 1;
/// How long berth-supervisor gives its command after SIGTERM before it kills it.
const SUPERVISOR_STOP_GRACE: Duration = Duration::from_secs(5);

/// The pid of gateway `index`'s own process (no process of the table): the parent of the
/// supervisors it spawns, and the session they stay in.
fn gateway_pid(index: usize) -> i32 {
    2 + index as i32
}

/// A run as its supervisor's process: what the driver spawned.
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
    /// The `BERTH_MOUNTS` of its environment, which every process of its tree inherits: which
    /// process driver's run it is.
    mounts: Option<String>,
    /// Why its supervisor is stopping its command, once it is: told to terminate, or rejected.
    stopping: Option<EndCause>,
}

impl Process {
    pub fn live(&self) -> bool {
        self.run.live()
    }

    /// Whether it is a run of the process driver keeping its sandboxes in `root`, as that
    /// driver's host tells by its environment.
    fn belongs(&self, root: &Path, sandbox: &SandboxId) -> bool {
        berth_drivers::process::os::belongs(root, sandbox, self.mounts.as_deref().map(str::as_bytes))
    }

    /// Whether a driver keeping its sandboxes in `root` started it.
    pub fn under(&self, root: &Path) -> bool {
        self.mounts.as_deref().is_some_and(|m| Path::new(m).starts_with(root))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Supervisor,
    /// The sandbox's command, the supervisor's child.
    Command,
    /// Something the command started.
    Helper,
}

/// A process of the table: running, or a zombie until its parent reaps it.
pub struct Task {
    pub pid: i32,
    pub kernel_start: u64,
    /// Its parent: init once the one that forked it exited.
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub sandbox: SandboxId,
    /// The generation of the run whose tree it belongs to.
    pub generation: u64,
    /// That run's supervisor's kernel start: which run of the generation it is.
    pub run: u64,
    pub role: Role,
    /// How long after SIGTERM it exits; never, if `None` (it ignores the signal). A
    /// supervisor's handling is berth-supervisor's own.
    on_term: Option<Duration>,
    /// Its exit code, once it exited and until its parent reaps it.
    zombie: Option<i32>,
}

impl Task {
    pub fn running(&self) -> bool {
        self.zombie.is_none()
    }
}

/// A process as the driver knows it after spawning it.
pub struct Spawned {
    pub pid: i32,
    pub kernel_start: u64,
    pub exit: watch::Receiver<Option<i32>>,
}

/// What a process does after a signal or its child's exit: its handler, carried out on the
/// runtime's host.
pub enum Later {
    /// `(pid, kernel start)` got SIGTERM.
    Term(i32, u64),
    /// The supervisor `(pid, kernel start)` saw its command exit with `code` (`cause`, unless it
    /// was stopping it).
    CommandExited { supervisor: (i32, u64), code: i32, cause: EndCause },
}

pub enum KernelCall {
    Spawn {
        gateway: usize,
        spec: SpawnSpec,
        reply: oneshot::Sender<Result<Spawned, DriverError>>,
    },
    /// What the processes a gateway signalled do next.
    Later(Later),
}

impl RuntimeModel {
    /// The process the table holds at `pid` (running or a zombie).
    pub fn task(&self, pid: i32) -> Option<&Task> {
        self.tasks.get(&pid)
    }

    fn running(&self, pid: i32, kernel_start: u64) -> Option<&Task> {
        self.tasks.get(&pid).filter(|t| t.running() && t.kernel_start == kernel_start)
    }

    /// Every running process of the table.
    pub fn running_tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values().filter(|t| t.running())
    }

    /// Linux's rule: a pid is not handed out while it names a process, a group or a session.
    fn free_pid(&self) -> i32 {
        let used: BTreeSet<i32> = self.tasks.values().flat_map(|t| [t.pid, t.pgid, t.sid]).collect();
        (FIRST_PID..).find(|pid| !used.contains(pid)).expect("pids to spare")
    }

    /// Forks `parent` (running): the child is in its group and session, of its run.
    fn fork(&mut self, parent: (i32, u64), role: Role, on_term: Option<Duration>) -> Option<(i32, u64)> {
        let parent = self.running(parent.0, parent.1)?;
        let (ppid, pgid, sid, sandbox, generation, run) =
            (parent.pid, parent.pgid, parent.sid, parent.sandbox.clone(), parent.generation, parent.run);
        let pid = self.free_pid();
        let kernel_start = self.next_kernel_start();
        let task = Task { pid, kernel_start, ppid, pgid, sid, sandbox, generation, run, role, on_term, zombie: None };
        self.tasks.insert(pid, task);
        Some((pid, kernel_start))
    }

    /// The running process `(pid, kernel start)` exits with `code`: its children go to init,
    /// and it is reaped at once unless its parent is a gateway (a supervisor: a zombie until
    /// its gateway reaps it). Its role and parent, if it was running.
    fn exit(&mut self, pid: i32, kernel_start: u64, code: i32) -> Option<(Role, i32)> {
        let task = self.tasks.get_mut(&pid).filter(|t| t.running() && t.kernel_start == kernel_start)?;
        let (role, ppid) = (task.role, task.ppid);
        if ppid < FIRST_PID && ppid != INIT {
            task.zombie = Some(code);
        } else {
            self.tasks.remove(&pid);
        }
        let children: Vec<i32> = self.tasks.values().filter(|t| t.ppid == pid).map(|t| t.pid).collect();
        for child in children {
            match self.tasks.get_mut(&child) {
                Some(t) if t.running() => t.ppid = INIT,
                _ => {
                    self.tasks.remove(&child);
                }
            }
        }
        Some((role, ppid))
    }

    /// A gateway lets go of its supervisor `(pid, kernel start)`: it reaps it if it exited,
    /// and otherwise init adopts it (the gateway died).
    fn reap(&mut self, pid: i32, kernel_start: u64) {
        let Some(task) = self.tasks.get_mut(&pid).filter(|t| t.kernel_start == kernel_start) else { return };
        if task.running() {
            task.ppid = INIT;
        } else {
            self.tasks.remove(&pid);
        }
    }

    /// The command of the supervisor `pid`, while it runs.
    fn command_of(&self, pid: i32) -> Option<(i32, u64)> {
        let command = self.tasks.values().find(|t| t.ppid == pid && t.role == Role::Command && t.running());
        command.map(|t| (t.pid, t.kernel_start))
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

    /// Whether task `t` belongs to a run the driver keeping its sandboxes in `root` started.
    pub fn run_under(&self, t: &Task, root: &Path) -> bool {
        let runs = self.processes.get(&t.sandbox).into_iter().flatten();
        runs.filter(|p| p.kernel_start == t.run).any(|p| p.under(root))
    }

    /// Every live run's supervisor: `(sandbox, pid, kernel start)`.
    pub fn live_processes(&self) -> Vec<(SandboxId, i32, u64)> {
        let all = self.processes.iter().flat_map(|(id, ps)| ps.iter().map(move |p| (id, p)));
        all.filter(|(_, p)| p.live()).map(|(id, p)| (id.clone(), p.pid, p.kernel_start)).collect()
    }
}

/// Sends `signal` as kill(2) does: to the process `pid` if positive, to every process of the
/// group `-pid` if negative. SIGKILL ends them at once (a supervisor's run with `cause`, and no
/// exit recorded); what they do after SIGTERM, and what a supervisor does when its command
/// dies, is returned for the runtime's host to carry out. The `(sandbox, generation)` of the
/// supervisor it reached, if any: a run it stops (what is left of an ended one is no run).
pub fn kill(world: &World, pid: i32, signal: Signal, cause: EndCause) -> (Option<(SandboxId, u64)>, Vec<Later>) {
    let targets: Vec<(i32, u64, SandboxId, u64, Role)> = {
        let m = lock(&world.runtime);
        let hit = |t: &&Task| if pid > 0 { t.pid == pid } else { t.pgid == -pid };
        let target = |t: &Task| (t.pid, t.kernel_start, t.sandbox.clone(), t.generation, t.role);
        m.running_tasks().filter(hit).map(target).collect()
    };
    let supervisor = targets.iter().find(|t| t.4 == Role::Supervisor);
    let reached = supervisor.map(|(_, _, sandbox, generation, _)| (sandbox.clone(), *generation));
    let mut later = Vec::new();
    for (pid, kernel_start, sandbox, _, _) in targets {
        match signal {
            Signal::Term => later.push(Later::Term(pid, kernel_start)),
            Signal::Kill => later.extend(exit_task(world, &sandbox, pid, kernel_start, 137, cause, false)),
        }
    }
    (reached, later)
}

/// The running process `(pid, kernel start)` of `sandbox`'s tree exits with `code`. A
/// supervisor's run ends with `cause`, its exit recorded first unless it was killed outright
/// (`recorded` false); a command's exit is its supervisor's to handle.
fn exit_task(
    world: &World,
    sandbox: &SandboxId,
    pid: i32,
    kernel_start: u64,
    code: i32,
    cause: EndCause,
    recorded: bool,
) -> Option<Later> {
    let now = world.runtime_time();
    let (role, ppid, ended) = {
        let mut m = lock(&world.runtime);
        let (role, ppid) = m.exit(pid, kernel_start, code)?;
        let ended = m.live_process_mut(sandbox, pid, kernel_start).map(|process| {
            process.run.finished = Some((now, code, cause));
            process.run.signal.send_replace(RunSignal::Ended);
            process.exit.send_replace(Some(code));
            (process.run.generation, process.exit_file.clone().filter(|_| recorded))
        });
        let supervisor = m.task(ppid).map(|t| (t.pid, t.kernel_start));
        (role, supervisor, ended)
    };
    if let Some((generation, exit_file)) = ended {
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
        world.event(
            "runtime",
            Kind::Exited,
            format!("{name} generation {generation} pid {pid} code {code} ({cause:?})"),
        );
    }
    match (role, ppid) {
        (Role::Command, Some(supervisor)) => Some(Later::CommandExited { supervisor, code, cause }),
        _ => None,
    }
}

/// The host of the node keeping its sandboxes in `root` is lost: every process of its runs'
/// trees dies at once, as a machine that loses its power takes them (nothing recorded, no
/// handler run: their supervisors die with their commands).
pub fn lose_node(world: &World, root: &Path) {
    // Every process of the node's runs' trees, orphans init adopted included.
    let tasks: Vec<i32> = {
        let m = lock(&world.runtime);
        m.running_tasks().filter(|t| m.run_under(t, root)).map(|t| t.pid).collect()
    };
    for pid in tasks {
        let _ = kill(world, pid, Signal::Kill, EndCause::Killed);
    }
}

/// Writes the exit as berth-supervisor does: atomically, and not at all where its run's folder
/// is gone.
fn record_exit(path: &Path, exit: Exit) {
    let _ = berth_drivers::handoff::write(path, &exit.to_bytes());
}

/// A gateway lets go of the supervisor it spawned (see [`RuntimeModel::reap`]).
pub fn reap(world: &World, pid: i32, kernel_start: u64) {
    lock(&world.runtime).reap(pid, kernel_start);
}

/// D1 as gateway `gateway`'s signal (`what`) lands on a group of `generation`: against the
/// record. The in-memory store answers without yielding. With several nodes, a node removing a
/// run the store places on another, or stopping every run as its lease lapsed, stops what that
/// record wants run elsewhere, or may yet: DESIGN 14 asks it to.
pub fn check_signal_wanted(world: &World, gateway: usize, sandbox: &SandboxId, generation: u64, what: &str) {
    let Some(Ok(Some(record))) = world.store.sandbox(sandbox).now_or_never() else { return };
    if world.scenario.nodes > 1 {
        let node = world.scenario.node_of(gateway);
        let elsewhere = record.placement.as_ref().is_some_and(|at| at.node.as_str() != node);
        let fencing = lock(&world.fencing).contains_key(&crate::net::gateway_host(gateway));
        if elsewhere || fencing {
            return;
        }
    }
    if let Some(problem) = d1_one_run::unwanted_stop(&record, Some(generation), &format!("sent {what}")) {
        world.violate(Invariant::D1, problem);
    }
}

/// D1 over trees: each acknowledged stop or delete at least `bound` old, against what of its
/// sandbox's runs still runs.
pub fn check_trees_gone(world: &World, bound: Duration) {
    let due = crate::world::now().saturating_sub(bound);
    let problems: Vec<String> = {
        let mut m = lock(&world.runtime);
        let (checked, waiting) = std::mem::take(&mut m.acknowledged).into_iter().partition(|a| a.at <= due);
        m.acknowledged = waiting;
        checked
            .iter()
            .filter_map(|stop| {
                // A run spawned after the stop (a late start of a stopped generation) is not one
                // the stop stopped.
                let tree = m
                    .running_tasks()
                    .filter(|t| t.sandbox == stop.sandbox && t.run <= stop.spawned)
                    .filter(|t| stop.root.as_deref().is_none_or(|root| m.run_under(t, root)));
                let left = tree.map(|t| (t.pid, t.generation, t.role, t.ppid == INIT));
                d1_one_run::outlived_stop(&m.name(&stop.sandbox), stop.generation, bound, left)
            })
            .collect()
    };
    for problem in problems {
        world.violate(Invariant::D1, problem);
    }
}

/// D1 over trees: a driver acknowledged a stop of `sandbox`'s runs up to `generation`, or its
/// delete (`None`); checked once [`check_trees_gone`]'s bound has passed.
pub fn acknowledge(world: &World, sandbox: &SandboxId, generation: Option<u64>, root: Option<&Path>) {
    let at = crate::world::now();
    let mut m = lock(&world.runtime);
    let spawned = m.kernel_starts;
    let root = root.map(Path::to_path_buf);
    m.acknowledged.push(Acknowledged { at, sandbox: sandbox.clone(), generation, spawned, root });
}

/// A stop (of runs up to `generation`) or a delete (`None`) a driver acknowledged at `at`.
pub struct Acknowledged {
    pub at: Duration,
    pub sandbox: SandboxId,
    pub generation: Option<u64>,
    /// The last kernel start handed out by then: the runs it may have stopped started no later.
    spawned: u64,
    /// Where the driver that acknowledged it keeps its sandboxes, when other nodes' drivers share
    /// the kernel: it stopped only its own runs.
    root: Option<PathBuf>,
}

impl Runtime {
    /// Serves the process driver's calls forever; each runs as a task of its own.
    pub async fn serve_kernel(self: Arc<Self>, mut calls: tokio::sync::mpsc::UnboundedReceiver<KernelCall>) {
        while let Some(call) = calls.recv().await {
            match call {
                KernelCall::Spawn { gateway, spec, reply } => {
                    let this = Arc::clone(&self);
                    tokio::spawn(async move {
                        let spawned = this.spawn_process(gateway, spec);
                        if spawned.is_ok() {
                            this.crash_after(gateway, "a spawn".to_string());
                        }
                        // fork and exec take a moment to come back.
                        tokio::time::sleep(this.between_millis(1, 6)).await;
                        let _ = reply.send(spawned);
                    });
                }
                KernelCall::Later(later) => self.carry_out(later),
            }
        }
    }

    /// Signals as kill(2) from this host (see [`kill`]), and carries out what follows.
    pub(crate) fn signal(self: &Arc<Self>, pid: i32, signal: Signal, cause: EndCause) {
        for later in kill(&self.world, pid, signal, cause).1 {
            self.carry_out(later);
        }
    }

    /// Ends `(pid, kernel start)` of `sandbox` with `code`, and carries out what follows.
    fn end(self: &Arc<Self>, sandbox: &SandboxId, (pid, kernel_start): (i32, u64), code: i32, cause: EndCause) {
        if let Some(later) = exit_task(&self.world, sandbox, pid, kernel_start, code, cause, true) {
            self.carry_out(later);
        }
    }

    /// Runs `then` after `delay`, if `(pid, kernel start)` still runs by then.
    fn after(
        self: &Arc<Self>,
        delay: Duration,
        task: (i32, u64),
        then: impl FnOnce(&Arc<Self>, SandboxId) + Send + 'static,
    ) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let sandbox = lock(&this.world.runtime).running(task.0, task.1).map(|t| t.sandbox.clone());
            if let Some(sandbox) = sandbox {
                then(&this, sandbox);
            }
        });
    }

    pub(crate) fn carry_out(self: &Arc<Self>, later: Later) {
        match later {
            Later::Term(pid, kernel_start) => {
                let Some((sandbox, role, on_term)) = lock(&self.world.runtime)
                    .running(pid, kernel_start)
                    .map(|t| (t.sandbox.clone(), t.role, t.on_term))
                else {
                    return;
                };
                match (role, on_term) {
                    // berth-supervisor passes it on to its command, in case only it was signalled.
                    (Role::Supervisor, _) => self.stop_command(&sandbox, (pid, kernel_start), EndCause::Stopped),
                    (_, Some(delay)) => {
                        self.after(delay, (pid, kernel_start), move |this, sandbox| {
                            this.end(&sandbox, (pid, kernel_start), 143, EndCause::Stopped);
                        });
                    }
                    (_, None) => {}
                }
            }
            Later::CommandExited { supervisor, code, cause } => self.command_exited(supervisor, code, cause),
        }
    }

    /// berth-supervisor stopping its command (told to terminate, or rejected: `cause`): SIGTERM
    /// to the command alone, SIGKILL after its grace, then it records the exit and exits. With
    /// no command left, it exits at once.
    pub(crate) fn stop_command(self: &Arc<Self>, sandbox: &SandboxId, supervisor: (i32, u64), cause: EndCause) {
        let command = {
            let mut m = lock(&self.world.runtime);
            let Some(process) = m.live_process_mut(sandbox, supervisor.0, supervisor.1) else { return };
            if process.stopping.is_some() {
                return;
            }
            process.stopping = Some(cause);
            m.command_of(supervisor.0)
        };
        let Some(command) = command else {
            let code = if cause == EndCause::Unstartable { cause.supervisor_status() } else { 143 };
            return self.end(sandbox, supervisor, code, cause);
        };
        self.signal(command.0, Signal::Term, cause);
        self.after(SUPERVISOR_STOP_GRACE, command, move |this, _| this.signal(command.0, Signal::Kill, cause));
    }

    /// The supervisor's command exited: a supervisor stopping it records the exit and exits;
    /// otherwise it reports the exit, and exits a moment later.
    fn command_exited(self: &Arc<Self>, supervisor: (i32, u64), code: i32, cause: EndCause) {
        let (sandbox, stopping) = {
            let mut m = lock(&self.world.runtime);
            let Some(sandbox) = m.running(supervisor.0, supervisor.1).map(|t| t.sandbox.clone()) else { return };
            let Some(process) = m.live_process_mut(&sandbox, supervisor.0, supervisor.1) else { return };
            (sandbox, process.stopping)
        };
        if let Some(cause) = stopping {
            return self.end(&sandbox, supervisor, code, cause);
        }
        if self.main_exited(&sandbox, Some(supervisor), code, cause).is_some() {
            let linger = self.draw(|d| d.millis(20, 500));
            self.after(linger, supervisor, move |this, sandbox| this.end(&sandbox, supervisor, code, cause));
        }
    }

    /// Starts a supervisor leading a new group, and its command. Like berth-supervisor, it
    /// takes its identity from its environment's token, and exits at once (code 2, nothing
    /// recorded) without a valid one.
    fn spawn_process(self: &Arc<Self>, gateway: usize, spec: SpawnSpec) -> Result<Spawned, DriverError> {
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
            // Several nodes share this kernel: D1 judges a node's own runs, N1 those across nodes.
            let world = &self.world;
            let here = world.root_of(gateway);
            let (mine, theirs): (Vec<&Process>, Vec<&Process>) = m
                .processes
                .get(&sandbox)
                .into_iter()
                .flatten()
                .partition(|p| world.scenario.nodes == 1 || p.under(&here));
            let mut problems: Vec<(Invariant, String)> =
                d1_one_run::spawned_twice(&name, mine.iter().map(|p| (p.pid, &p.run)), generation)
                    .into_iter()
                    .map(|problem| (Invariant::D1, problem))
                    .collect();
            if world.scenario.nodes > 1 {
                let node_of = |p: &Process| {
                    let g = (0..world.scenario.nodes).find(|&g| p.under(&world.root_of(g)));
                    g.map_or_else(|| "another node".to_string(), |g| world.scenario.node_of(g))
                };
                let elsewhere = theirs.iter().map(|p| (node_of(p), p.pid, &p.run));
                let placed = lock(&world.placements).get(&sandbox).cloned().flatten();
                let node = world.scenario.node_of(gateway);
                let crossed = n1_one_run_across_nodes::spawned(&name, &node, generation, elsewhere, placed.as_deref());
                problems.extend(crossed.into_iter().map(|problem| (Invariant::N1, problem)));
            }
            let run = Run::new(generation.unwrap_or(0), started_at, token.clone().unwrap_or_default(), signal);
            let exit_file = exit_file.map(PathBuf::from);
            let mounts = spec.env.get(berth_drivers::env::MOUNTS_VAR).cloned();
            let process = Process { pid, kernel_start, named, run, exit_file, exit, stopping: None, mounts };
            m.processes.entry(sandbox.clone()).or_default().push(process);
            // `setpgid(0, 0)`: a group of its own, in its gateway's session.
            let (ppid, sid) = (gateway_pid(gateway), gateway_pid(gateway));
            let (role, on_term, zombie) = (Role::Supervisor, None, None);
            let generation = generation.unwrap_or(0);
            let sandbox = sandbox.clone();
            let run = kernel_start;
            let task =
                Task { pid, kernel_start, ppid, pgid: pid, sid, sandbox, generation, run, role, on_term, zombie };
            m.tasks.insert(pid, task);
            (pid, kernel_start, problems)
        };
        let name = self.name(&sandbox);
        self.world.event("runtime", Kind::Spawned, format!("{name} generation {} pid {pid}", generation.unwrap_or(0)));
        for (invariant, problem) in problems {
            self.world.violate(invariant, problem);
        }
        let (Some(generation), Some(token)) = (generation, token) else {
            exit_task(&self.world, &sandbox, pid, kernel_start, 2, EndCause::SupervisorExit, false);
            return Ok(Spawned { pid, kernel_start, exit: exit_rx });
        };
        let failed_to_start = if self.fault(self.world.scenario.faults.unstartable_commands) {
            // berth-supervisor records the exit before it says hello, and runs nothing.
            lock(&self.world.runtime).unstartable.insert((sandbox.clone(), generation));
            let failed_to_start = self.cannot_start(&sandbox, generation);
            if let Some(path) = exit_file {
                let code = EndCause::Unstartable.supervisor_status();
                let finished_at = self.world.runtime_time().unix_nanos();
                let exit = Exit { exit_code: code, finished_at, generation: None, out_of_memory: false };
                record_exit(Path::new(path), exit);
            }
            Some(failed_to_start)
        } else {
            self.start_command((pid, kernel_start));
            if crate::runtime::crash_loops(&spec.args) {
                let supervisor = (pid, kernel_start);
                self.after(self.crash_after_start(), supervisor, move |this, sandbox| {
                    let this = Arc::clone(this);
                    tokio::spawn(async move {
                        if this.world.faults_on() {
                            this.workload_exit(&sandbox, Some(supervisor), true).await;
                        }
                    });
                });
            }
            None
        };
        // A node's supervisor reaches its own gateway alone.
        let home = (self.world.scenario.nodes > 1).then_some(gateway);
        self.supervise(Spawn { sandbox, generation, token, signal: watcher, ghost: false, failed_to_start, home });
        Ok(Spawned { pid, kernel_start, exit: exit_rx })
    }

    /// The supervisor's command, and what the command will start: a few helpers, forked in its
    /// first seconds, some that end by themselves.
    fn start_command(self: &Arc<Self>, supervisor: (i32, u64)) {
        // Most commands end soon after SIGTERM; one in ten takes seconds, past the stop's grace.
        let on_term = match self.draw(|d| d.below(10)) {
            0 => self.between_millis(1_000, 8_000),
            _ => self.between(self.world.scenario.stop_duration),
        };
        let Some(command) = lock(&self.world.runtime).fork(supervisor, Role::Command, Some(on_term)) else { return };
        for _ in 0..self.draw(|d| d.below(4)) {
            let at = self.between_millis(0, 3_000);
            self.after(at, command, move |this, _| this.start_helper(command));
        }
    }

    /// The command forks a helper: one in four daemonizes (its first fork exits at once, and
    /// init adopts the second), all stay in the run's group. Most end soon after SIGTERM, some
    /// take seconds, some ignore it; some end by themselves a while later.
    fn start_helper(self: &Arc<Self>, command: (i32, u64)) {
        let on_term = match self.draw(|d| d.below(10)) {
            0..5 => Some(self.between_millis(10, 300)),
            5..8 => Some(self.between_millis(2_000, 30_000)),
            _ => None,
        };
        let daemon = self.draw(|d| d.chance(0.25));
        let lifetime = self.draw(|d| d.chance(0.4)).then(|| self.between_millis(500, 20_000));
        let helper = {
            let mut m = lock(&self.world.runtime);
            let Some(first) = m.fork(command, Role::Helper, on_term) else { return };
            if daemon {
                let second = m.fork(first, Role::Helper, on_term);
                m.exit(first.0, first.1, 0);
                second
            } else {
                Some(first)
            }
        };
        if let (Some(helper), Some(lifetime)) = (helper, lifetime) {
            self.after(lifetime, helper, move |this, sandbox| this.end(&sandbox, helper, 0, EndCause::WorkloadExit));
        }
    }

    /// A live supervisor of the sandbox (of `generation`, if given).
    pub(crate) fn live_process(&self, sandbox: &SandboxId, generation: Option<u64>) -> Option<(i32, u64)> {
        let m = lock(&self.world.runtime);
        let processes = m.processes.get(sandbox)?;
        let mut live = processes.iter().filter(|p| p.live() && generation.is_none_or(|g| g == p.run.generation));
        live.next().map(|p| (p.pid, p.kernel_start))
    }

    /// The command of the live supervisor `(pid, kernel start)` exits by itself with `code`.
    pub(crate) fn command_exits(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        supervisor: (i32, u64),
        code: i32,
        cause: EndCause,
    ) {
        let command = lock(&self.world.runtime).command_of(supervisor.0);
        if let Some(command) = command {
            self.end(sandbox, command, code, cause);
        }
    }
}

/// The group of a running process whose environment names `(sandbox, generation)` (every
/// process of a run's tree inherits its supervisor's, so it names what its supervisor's did),
/// unless the group's leader runs.
pub fn find_group(world: &World, root: &Path, sandbox: &SandboxId, generation: u64) -> Option<i32> {
    let m = lock(&world.runtime);
    let named = |t: &Task| {
        let processes = m.processes.get(sandbox).into_iter().flatten();
        processes.filter(|p| p.kernel_start == t.run).any(|p| p.named == generation && p.belongs(root, sandbox))
    };
    let leader_runs = |pgid: i32| m.tasks.get(&pgid).is_some_and(Task::running);
    let mut members: Vec<&Task> = m.tasks.values().filter(|t| t.running() && t.sandbox == *sandbox).collect();
    members.sort_by_key(|t| t.pid);
    members.into_iter().find(|t| named(t) && !leader_runs(t.pgid)).map(|t| t.pgid)
}

/// The live leader of a group whose environment names `(sandbox, generation)`.
pub fn find_supervisor(world: &World, root: &Path, sandbox: &SandboxId, generation: u64) -> Option<(i32, u64)> {
    let m = lock(&world.runtime);
    let processes = m.processes.get(sandbox)?;
    let ours = |p: &&Process| p.live() && p.named == generation && p.belongs(root, sandbox);
    let found = processes.iter().filter(ours).min_by_key(|p| p.pid);
    found.map(|p| (p.pid, p.kernel_start))
}

/// The freezer of the sandbox's cgroup: holds (`frozen`) or releases its live run. A sandbox
/// with no live run has no cgroup with anything to hold.
pub fn freeze(world: &World, sandbox: &SandboxId, frozen: bool) -> Result<(), String> {
    {
        let mut m = lock(&world.runtime);
        let live = m.processes.get_mut(sandbox).into_iter().flatten().find(|p| p.live());
        let Some(process) = live else { return Err("no run of it is alive".to_string()) };
        process.run.frozen = frozen;
    }
    let name = lock(&world.runtime).name(sandbox);
    world.event("runtime", if frozen { Kind::Paused } else { Kind::Resumed }, name);
    Ok(())
}

/// Whether the sandbox's live run is held by the freezer.
pub fn frozen(world: &World, sandbox: &SandboxId) -> bool {
    let m = lock(&world.runtime);
    m.processes.get(sandbox).into_iter().flatten().any(|p| p.live() && p.run.frozen)
}
