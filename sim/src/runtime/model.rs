//! What the simulated runtime holds: each container and its runs, each run with the generation
//! its token carried and how it ended, the processes and the process table of the simulated
//! kernel, and every removal, refusal and exit: the ground truth the checkers compare the
//! records with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_core::{Hold, SandboxId, Timestamp};
use berth_drivers::container::{ContainerSpec, EngineError, EngineEvent, Inspection, Status};
use berth_drivers::handoff::flag;
use tokio::sync::{mpsc, watch};

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCause {
    Stopped,
    Deleted,
    Killed,
    Removed,
    /// Restarted outside Berth (`docker restart`): a new run of the same container followed.
    Restarted,
    WorkloadExit,
    /// The kernel killed the workload for memory; its supervisor saw it and exited.
    OutOfMemory,
    /// Its supervisor was rejected, or found no token, and exited.
    SupervisorExit,
    /// Its command could not be started: its supervisor reported that and exited.
    Unstartable,
    /// It was checkpointed, and its container was started anew or removed: the checkpoint,
    /// never restored, went with it.
    CheckpointDropped,
}

impl EndCause {
    /// The status a supervisor that exits by itself for this cause exits with (berth-supervisor's).
    pub fn supervisor_status(self) -> i32 {
        if self == EndCause::Unstartable { 127 } else { 1 }
    }
}

/// What a run's supervisor is told about its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunSignal {
    Running,
    /// The workload exited with this code (killed for memory, with `out_of_memory`); the run
    /// ends right after.
    MainExited {
        code: i32,
        out_of_memory: bool,
    },
    /// Written to a checkpoint: every process of the run ended, its connections with them,
    /// until a restore (`Running` again) or the end.
    Checkpointed,
    Ended,
}

pub struct Run {
    /// The generation of the token its supervisor read (0: it found none).
    pub generation: u64,
    pub started_at: Timestamp,
    pub finished: Option<(Timestamp, i32, EndCause)>,
    pub token: String,
    /// Started outside Berth (an out-of-band restart), not by a driver's start.
    pub out_of_band: bool,
    /// Held by the freezer (paused).
    pub frozen: bool,
    /// When it was written to a checkpoint, if it is in one: its processes are gone, and the
    /// runtime shows it exited, but it has not ended.
    pub checkpointed: Option<Timestamp>,
    /// When it was last restored from a checkpoint: the runtime shows that as its start.
    pub restored_at: Option<Timestamp>,
    pub(crate) signal: watch::Sender<RunSignal>,
}

impl Run {
    /// A run started by a driver's start.
    pub fn new(generation: u64, started_at: Timestamp, token: String, signal: watch::Sender<RunSignal>) -> Self {
        Self {
            generation,
            started_at,
            finished: None,
            token,
            out_of_band: false,
            frozen: false,
            checkpointed: None,
            restored_at: None,
            signal,
        }
    }

    /// Whether its processes run (frozen or not).
    pub fn live(&self) -> bool {
        self.finished.is_none() && self.checkpointed.is_none()
    }

    /// How a pause holds it, if one does (it has not ended).
    pub fn held(&self) -> Option<Hold> {
        match (self.finished, self.checkpointed, self.frozen) {
            (Some(_), _, _) => None,
            (None, Some(_), _) => Some(Hold::Checkpoint),
            (None, None, true) => Some(Hold::Freezer),
            (None, None, false) => None,
        }
    }
}

pub struct Container {
    pub runs: Vec<Run>,
    pub(crate) spec: ContainerSpec,
}

impl Container {
    pub(crate) fn alive(&mut self) -> Option<&mut Run> {
        self.runs.last_mut().filter(|r| r.live())
    }

    pub fn alive_generation(&self) -> Option<u64> {
        self.runs.last().filter(|r| r.live()).map(|r| r.generation)
    }

    /// The last run, if it is in a checkpoint.
    pub(crate) fn checkpointed(&mut self) -> Option<&mut Run> {
        self.runs.last_mut().filter(|r| r.held() == Some(Hold::Checkpoint))
    }

    /// What the engine shows, as Docker does: the last run's start, and the last finish (the
    /// previous run's while one runs). A checkpoint shows as Podman shows it: exited at the
    /// checkpoint, and its restore as the run's start.
    pub fn inspection(&self) -> Inspection {
        let last = self.runs.last();
        let finished = last.and_then(|r| r.finished);
        let checkpointed = last.and_then(|r| r.checkpointed.filter(|_| finished.is_none()));
        let finishes = self.runs.iter().rev().map(|r| r.finished.map(|(at, _, _)| at).or(r.checkpointed));
        Inspection {
            status: match (last, finished) {
                (None, _) => Status::Created,
                (Some(_), None) if checkpointed.is_some() => Status::Exited,
                (Some(run), None) if run.frozen => Status::Paused,
                (Some(_), None) => Status::Running,
                (Some(_), Some(_)) => Status::Exited,
            },
            started_at: last.map(|r| r.restored_at.unwrap_or(r.started_at)),
            finished_at: finishes.flatten().next(),
            exit_code: finished.map_or(0, |(_, code, _)| code),
            // Docker's `OOMKilled`.
            out_of_memory: finished.is_some_and(|(_, _, cause)| cause == EndCause::OutOfMemory),
            checkpointed: checkpointed.is_some(),
            restored: last.is_some_and(|r| r.restored_at.is_some()),
        }
    }

    /// Where the file the supervisor's flag `name` names is on the host, through the container's
    /// binds.
    pub(crate) fn host_file(&self, name: &str) -> Option<PathBuf> {
        let args = &self.spec.command;
        let flag = flag::arg(name);
        let inside = args.iter().position(|a| *a == flag).and_then(|i| args.get(i + 1))?;
        self.spec.binds.iter().find_map(|bind| {
            let rest = Path::new(inside).strip_prefix(&bind.target).ok()?;
            Some(bind.source.join(rest))
        })
    }
}

pub(crate) type Subscriber = mpsc::UnboundedSender<Result<EngineEvent, EngineError>>;

/// A run's supervisor to start.
pub struct Spawn {
    pub sandbox: SandboxId,
    pub generation: u64,
    pub token: String,
    pub signal: watch::Receiver<RunSignal>,
    /// A stale supervisor of an ended run, reconnecting with its old token.
    pub ghost: bool,
    /// Why the run's command could not be started, if it could not.
    pub failed_to_start: Option<String>,
    /// The gateway whose driver spawned it, when its node is that gateway's alone: the
    /// supervisor's socket is its node's, so it reaches no other gateway.
    pub home: Option<usize>,
}

#[derive(Default)]
pub struct RuntimeModel {
    pub containers: BTreeMap<SandboxId, Container>,
    pub volumes: BTreeSet<String>,
    /// Image names (`repository:tag`) and the image each names.
    pub images: BTreeMap<String, u64>,
    /// Images committed so far: the next one's number.
    pub committed: u64,
    /// When each sandbox's container was removed (runtime clock).
    pub removals: BTreeMap<SandboxId, Vec<Timestamp>>,
    /// The runs of removed containers: ground truth outlives the container.
    pub removed_runs: BTreeMap<SandboxId, Vec<Run>>,
    /// When the runtime refused a create or start of each sandbox's container (simulated
    /// microseconds).
    pub refusals: BTreeMap<SandboxId, Vec<u64>>,
    /// Main-process exits the runtime's supervisors were told of: `(sandbox, generation)`.
    pub main_exits: Vec<(SandboxId, u64)>,
    /// The runs whose command could not be started: `(sandbox, generation)`.
    pub unstartable: BTreeSet<(SandboxId, u64)>,
    /// The runs whose workload the kernel killed for memory, by generation.
    pub oom_kills: Vec<(SandboxId, u64)>,
    /// Under the process driver: every run each sandbox's supervisors led.
    pub processes: BTreeMap<SandboxId, Vec<crate::kernel::Process>>,
    /// Under the process driver: the host's process table, by pid.
    pub tasks: BTreeMap<i32, crate::kernel::Task>,
    /// Stops and deletes the drivers acknowledged, until D1 has checked what they left.
    pub acknowledged: Vec<crate::kernel::Acknowledged>,
    pub(crate) kernel_starts: u64,
    pub(crate) subscribers: Vec<Subscriber>,
    pub(crate) locks: BTreeMap<SandboxId, Arc<tokio::sync::Mutex<()>>>,
    pub(crate) last_time: i64,
    /// Sandbox names, for the trace.
    pub(crate) names: BTreeMap<SandboxId, String>,
}

impl RuntimeModel {
    /// A new image of `sandbox`'s container, named `reference` (a name already given moves).
    pub fn commit(&mut self, sandbox: &SandboxId, reference: String) -> Result<(), EngineError> {
        if !self.containers.contains_key(sandbox) {
            return Err(EngineError::NotFound(format!("No such container: {sandbox}")));
        }
        self.committed += 1;
        self.images.insert(reference, self.committed);
        Ok(())
    }

    pub fn tag(&mut self, source: &str, target: String) -> Result<(), EngineError> {
        let image =
            *self.images.get(source).ok_or_else(|| EngineError::NotFound(format!("No such image: {source}")))?;
        self.images.insert(target, image);
        Ok(())
    }

    /// The tags of `repository`'s image names.
    pub fn tags(&self, repository: &str) -> Vec<String> {
        self.images.keys().filter_map(|r| r.strip_prefix(repository)?.strip_prefix(':')).map(str::to_string).collect()
    }

    pub fn tick(&mut self, now: i64) -> Timestamp {
        self.last_time = (self.last_time + 1).max(now);
        Timestamp::from_unix_nanos(self.last_time)
    }

    /// The next process's start time in the kernel.
    pub fn next_kernel_start(&mut self) -> u64 {
        self.kernel_starts += 1;
        self.kernel_starts
    }

    /// The sandbox's name if the runtime has been told it, for the trace.
    pub fn name(&self, id: &SandboxId) -> String {
        self.names.get(id).cloned().unwrap_or_else(|| id.to_string())
    }

    pub fn name_sandbox(&mut self, id: &SandboxId, name: &str) {
        self.names.insert(id.clone(), name.to_string());
    }

    /// Every sandbox the runtime was ever told of.
    pub fn sandboxes(&self) -> impl Iterator<Item = &SandboxId> {
        self.names.keys()
    }

    /// Every run the sandbox ever had, its removed containers' included.
    pub fn runs(&self, id: &SandboxId) -> impl Iterator<Item = &Run> {
        let current = self.containers.get(id).map(|c| c.runs.iter()).into_iter().flatten();
        let processes = self.processes.get(id).into_iter().flatten().map(|p| &p.run);
        current.chain(self.removed_runs.get(id).into_iter().flatten()).chain(processes)
    }

    /// The generation of what runs for the sandbox: its container's live run, or its live
    /// process group (the newest, if D1 was broken and there are several).
    pub fn alive_generation(&self, id: &SandboxId) -> Option<u64> {
        let container = self.containers.get(id).and_then(Container::alive_generation);
        let process = || self.processes.get(id)?.iter().rev().find(|p| p.live()).map(|p| p.run.generation);
        container.or_else(process)
    }

    /// How the sandbox's run (of `generation`, if given) is held, if a pause holds one: it
    /// makes no progress, its execs included, and its command cannot exit by itself.
    pub fn held(&self, id: &SandboxId, generation: Option<u64>) -> Option<Hold> {
        self.runs(id).filter(|r| generation.is_none_or(|g| g == r.generation)).find_map(Run::held)
    }

    /// The latest run of `generation`: after an out-of-band restart, the restart's.
    pub fn latest_run(&self, id: &SandboxId, generation: u64) -> Option<&Run> {
        self.runs(id).filter(|r| r.generation == generation).max_by_key(|r| r.started_at)
    }
}
