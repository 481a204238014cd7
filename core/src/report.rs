//! What runs report of a sandbox: the runtime, the driver's replies to effects and the
//! supervisors. Plain data, merged into the record by [`crate::observation`] alone.

use crate::id::NodeId;
use crate::phase::Hold;
use crate::record::ExitMarker;
use crate::time::Timestamp;

/// Which path brought a runtime report. Only logs and traces tell them apart: the rules are the
/// same for every path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeSource {
    WatchEvent,
    InitialSync,
    PollGet,
    PollList,
    RecoveryLookup,
    /// The driver's reply to a pause or a resume: the state it left the run in.
    PauseReply,
    ResumeReply,
}

/// What the runtime shows of a sandbox's compute resource, in the runtime's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeState {
    /// No such resource. `at` is the runtime's time of the removal when an event gave it.
    Absent { at: Option<Timestamp> },
    /// Exists, has never run.
    Created,
    /// A run is alive, or `held`: every process of it frozen by the freezer, or written to a
    /// checkpoint (paused). A checkpointed run is this run still, however the runtime shows it
    /// (Podman shows it exited, and its restore as a new start): its driver says which run.
    Running { started_at: Timestamp, held: Option<Hold> },
    /// Not running; the last run ended like this.
    Exited(ExitMarker),
}

/// The driver's reply to an [`Effect::Start`](crate::decision::Effect::Start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartReply {
    /// The generation's run is running (now or already).
    Running { started_at: Timestamp },
    /// The generation's run already ran and ended.
    Exited(ExitMarker),
    /// The runtime refused to start it (not a timeout or an unreachable runtime: those are
    /// ambiguous and produce no observation; recovery re-drives the start).
    Failed { message: String },
    /// The generation's run was started once and its compute resource is gone since (removed
    /// out of band): a driver never starts a generation twice.
    Gone,
}

/// What a supervisor says of its sandbox's main process when it connects. Only a running one
/// makes the run Ready: a command that ended at once, or never started, must not look Ready
/// even for a moment (DESIGN 9.3), or a client waiting for Ready takes a failure for a success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MainProcess {
    Running,
    /// It already exited with this code; `out_of_memory` when the kernel killed it for memory.
    Exited {
        code: i32,
        out_of_memory: bool,
    },
    /// It could not be started (not found, not executable): the cause, for the user.
    Unstartable(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    Runtime {
        source: RuntimeSource,
        state: RuntimeState,
        /// The record's version read before the runtime was asked, when one was (polls).
        /// Only absence needs it: it carries no runtime time to fence with.
        as_of_version: Option<u64>,
    },
    /// The driver's reply to [`Effect::Start`](crate::decision::Effect::Start) of `generation`.
    Started { generation: u64, reply: StartReply },
    /// The driver's reply to [`Effect::Stop`](crate::decision::Effect::Stop): the final state once nothing runs.
    Stopped { generation: u64, state: RuntimeState },
    /// The driver's reply to [`Effect::Delete`](crate::decision::Effect::Delete): everything is gone.
    Deleted,
    /// A supervisor authenticated with a valid token of `generation`, saying how its main
    /// process is.
    SupervisorConnected { generation: u64, main: MainProcess },
    /// A supervisor of `generation` reported its main process's exit: with `out_of_memory`,
    /// killed by the kernel for using more memory than the run's limit.
    MainProcessExited { generation: u64, exit_code: i32, out_of_memory: bool },
    /// The store fenced `node` (DESIGN 14): its lease, last granted in `epoch`, lapsed and no
    /// process of it took it again. A run placed there under that epoch or an earlier one is
    /// lost to the store, whatever the node still does with it.
    NodeFenced { node: NodeId, epoch: u64 },
    /// `node`, holding its lease in `epoch`, finds the sandbox's run in its runtime: it adopts a
    /// sandbox placed nowhere (recorded before placement was) or placed on it under an earlier
    /// epoch of its own ([`crate::fencing::on_return`]'s `Adopt`).
    Held { node: NodeId, epoch: u64 },
}

impl Observation {
    /// The path that brought it, for logs.
    pub fn source_name(&self) -> &'static str {
        match self {
            Observation::Runtime { source, .. } => match source {
                RuntimeSource::WatchEvent => "watch event",
                RuntimeSource::InitialSync => "initial sync",
                RuntimeSource::PollGet => "poll get",
                RuntimeSource::PollList => "poll list",
                RuntimeSource::RecoveryLookup => "recovery lookup",
                RuntimeSource::PauseReply => "driver pause reply",
                RuntimeSource::ResumeReply => "driver resume reply",
            },
            Observation::Started { .. } => "driver start reply",
            Observation::Stopped { .. } => "driver stop reply",
            Observation::Deleted => "driver delete reply",
            Observation::SupervisorConnected { .. } => "supervisor connect",
            Observation::MainProcessExited { .. } => "supervisor exit report",
            Observation::NodeFenced { .. } => "node fence",
            Observation::Held { .. } => "node adopt",
        }
    }
}
