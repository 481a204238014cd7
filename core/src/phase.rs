//! Where a sandbox is in its lifecycle, and why a run failed.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where the sandbox is in its lifecycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Created; the compute resource is being made and its first run started.
    Provisioning,
    /// A new generation's run is being started.
    Starting,
    /// The current generation's supervisor is connected.
    Ready,
    /// Every process of the current run is frozen with its memory kept (DESIGN 12.1): no exec
    /// is admitted, the idle clock is held, the deadline still runs. With intent Running, a
    /// resume is under way.
    Paused,
    /// A stop is under way.
    Stopping,
    /// Nothing runs; the workspace is kept. With intent Running, the command completed: it
    /// exited 0 by itself ([`Sandbox::completed`](crate::record::Sandbox::completed)).
    Stopped,
    /// A delete is under way; only the runtime's confirmation that everything is gone matters.
    Deleting,
    /// The current run failed. Start (a new generation), Stop and Delete all leave it.
    Error(Failure),
}

/// A phase without its details, for matching, display and the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PhaseKind {
    Provisioning,
    Starting,
    Ready,
    Paused,
    Stopping,
    Stopped,
    Deleting,
    Error,
}

impl PhaseKind {
    /// Every phase, in lifecycle order.
    pub const ALL: [PhaseKind; 8] = [
        PhaseKind::Provisioning,
        PhaseKind::Starting,
        PhaseKind::Ready,
        PhaseKind::Paused,
        PhaseKind::Stopping,
        PhaseKind::Stopped,
        PhaseKind::Deleting,
        PhaseKind::Error,
    ];
}

impl Phase {
    pub fn kind(&self) -> PhaseKind {
        match self {
            Phase::Provisioning => PhaseKind::Provisioning,
            Phase::Starting => PhaseKind::Starting,
            Phase::Ready => PhaseKind::Ready,
            Phase::Paused => PhaseKind::Paused,
            Phase::Stopping => PhaseKind::Stopping,
            Phase::Stopped => PhaseKind::Stopped,
            Phase::Deleting => PhaseKind::Deleting,
            Phase::Error(_) => PhaseKind::Error,
        }
    }
}

impl fmt::Display for PhaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Error(failure) => write!(f, "Error ({})", failure.reason),
            other => fmt::Display::fmt(&other.kind(), f),
        }
    }
}

/// Why a sandbox is in Error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: FailureReason,
    pub exit_code: Option<i32>,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailureReason {
    /// The runtime reported that the current run exited.
    ContainerExited,
    /// The current generation's supervisor reported that the main process exited.
    MainProcessExited,
    /// The runtime no longer has the sandbox's compute resource.
    ComputeResourceMissing,
    /// The runtime refused to start the current generation's run.
    StartFailed,
    /// The run started, but its command could not be (not found, not executable).
    CommandFailedToStart,
    /// The run was killed for using more memory than its limit allows.
    OutOfMemory,
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_display_as_users_read_them() {
        let failure = Failure { reason: FailureReason::ContainerExited, exit_code: Some(3), message: "x".into() };
        assert_eq!(Phase::Error(failure).to_string(), "Error (ContainerExited)");
        assert_eq!(Phase::Stopping.to_string(), "Stopping");
        assert_eq!(PhaseKind::Ready.to_string(), "Ready");
        assert_eq!(FailureReason::StartFailed.to_string(), "StartFailed");
    }
}

/// How a paused run is held (DESIGN 12.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Hold {
    /// Every process frozen in place by the cgroup freezer, its memory kept in memory: gone
    /// with the host.
    #[default]
    Freezer,
    /// The run's memory written to disk by CRIU and its processes gone: it outlives a reboot,
    /// and a resume restores it.
    Checkpoint,
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hold::Freezer => "in the freezer",
            Hold::Checkpoint => "to a checkpoint",
        })
    }
}
