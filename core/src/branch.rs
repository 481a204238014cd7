//! Which branches of core's decisions ran: the simulator's measure of its own reach (issue 38).
//!
//! Each rule that picks an outcome marks the branch it took with [`hit`]. Only with the
//! `branches` feature, which only the simulator enables, is anything counted, per thread (a
//! simulation runs a seed on one thread, so a seed's counts are its own); without it [`hit`]
//! is empty and inlined away, and core stays free of state.

#[cfg(feature = "branches")]
use std::cell::RefCell;

/// Declares the branches, [`Branch::ALL`] and their names from one list, so no branch can be
/// left out of `ALL` (its `name` match is exhaustive, and `ALL` is built from the same list).
macro_rules! branches {
    ($($(#[$doc:meta])* $branch:ident => $name:literal,)*) => {
        /// A named branch of one of core's decisions.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Branch {
            $($(#[$doc])* $branch,)*
        }

        impl Branch {
            pub const ALL: [Branch; [$(Branch::$branch),*].len()] = [$(Branch::$branch),*];

            /// `module: what happened`, for a coverage report.
            pub fn name(self) -> &'static str {
                match self {
                    $(Branch::$branch => $name,)*
                }
            }
        }
    };
}

branches! {
    // command: a client's or a timer's command against the record read.
    /// A server-owned command (an expiry, a touch, a restart) whose record is gone.
    CommandRecordGone => "command: the record is gone",
    /// A stop of a completed run (Stopped, intent still Running): only the intent changes.
    StopCompleted => "command: stop of a completed run",
    StopAlreadyStopped => "command: stop of a sandbox already stopping or stopped",
    StopDeleting => "command: stop while deleting",
    StopRun => "command: stop of a live or failed run",
    StartAlreadyRunning => "command: start of a sandbox already starting or ready",
    StartWhileStopping => "command: start while stopping, deleting or paused",
    StartPastDeadline => "command: start past an absolute deadline",
    StartNewGeneration => "command: start of a new generation",
    RestartNotDue => "command: policy restart no longer due",
    RestartNewGeneration => "command: policy restart of a new generation",
    ExpireNotDue => "command: expiry no longer due",
    ExpireIdleNotDue => "command: idle expiry no longer due",
    ExpireStops => "command: an expiry stops",
    ExpireDeletes => "command: an expiry deletes",
    ExpirePauses => "command: an expiry pauses",
    ExpirePausedAlready => "command: an expiry that pauses finds the sandbox paused",
    ExpirePauseStops => "command: an expiry that pauses stops a run not Ready",
    Pause => "command: pause of a Ready run",
    PauseRepeated => "command: pause of a sandbox already pausing or paused",
    PauseOtherHold => "command: pause of a sandbox paused the other way",
    PauseNotReady => "command: pause of a sandbox that is not Ready",
    Resume => "command: resume of a paused run",
    ResumeRepeated => "command: resume of a sandbox already resuming",
    ResumeNotPaused => "command: resume of a sandbox that is not paused",
    ResumeNotLive => "command: resume of a sandbox with no live run",
    ResumePastDeadline => "command: resume past the deadline",
    TouchRestartsClock => "command: activity restarts the idle clock",
    TouchNothing => "command: activity with no idle clock to restart",
    RenewDeleting => "command: renew while deleting",
    RenewWithoutTtl => "command: renew with no TTL to renew",
    Renew => "command: renew",
    DeleteRepeated => "command: delete of a sandbox already deleting",
    Delete => "command: delete",
    AttachDeleting => "command: attach while deleting",
    AttachAlready => "command: attach of a provider already attached",
    Attach => "command: attach",
    DetachDeleting => "command: detach while deleting",
    DetachNotAttached => "command: detach of a provider not attached",
    Detach => "command: detach",

    // observation: the one merge of runtime and supervisor reports.
    AuthNoSandbox => "observation: identity of a sandbox that is gone",
    AuthStaleGeneration => "observation: identity of an older generation",
    AuthAccepted => "observation: identity accepted",
    OrphanDelete => "observation: a resource without a record is deleted",
    OrphanNothing => "observation: a report without a record changes nothing",
    DeletingConfirmed => "observation: a delete confirmed ends the record",
    DeletingAbsentRedrive => "observation: absent while deleting re-drives the delete",
    DeletingIgnored => "observation: other report while deleting is ignored",
    /// A sandbox being deleted whose node was fenced: its run went with the node.
    DeletingFenced => "observation: a deleting sandbox's node is fenced",
    /// A fence of a node the sandbox is not placed on (or placed on again since, in a newer epoch).
    FenceElsewhere => "observation: a fence of another node or epoch is ignored",
    /// A stop of a run on a fenced node: nothing of it runs again for the store.
    FencedStop => "observation: a stopping sandbox's node is fenced",
    /// A run on a fenced node is lost: the sandbox fails, its restart policy decides.
    FencedRunLost => "observation: a running sandbox's node is fenced",
    /// A node holding a run adopts its sandbox: placed nowhere, or under its earlier epoch.
    HeldAdopted => "observation: a node adopts a sandbox whose run it holds",
    /// A node's report of a run placed on it in its epoch already, or elsewhere: nothing to adopt.
    HeldNothingToAdopt => "observation: a held run that is placed as it is",
    /// A fence of a sandbox that has no run: nothing to lose.
    FencedNothingRuns => "observation: a fenced node's sandbox that runs nothing",
    StoppedOlderGeneration => "observation: stop reply of an older generation",
    StoppedPastStopping => "observation: stop reply past Stopping is a runtime report",
    OlderGenerationIgnored => "observation: start reply or exit report of an older generation",
    RuntimeCreated => "observation: a created, never run, resource",
    ExitStale => "observation: a stale exit (rule 2)",
    ExitAlreadyKnown => "observation: an exit already recorded",
    ExitStopped => "observation: exit of a run meant to stop",
    ExitCompleted => "observation: exit 0 from the runtime completes the run",
    ExitFailed => "observation: a failing exit from the runtime",
    ExitFailedOutOfMemory => "observation: an exit from the runtime killed for memory",
    ExitRefinesOutOfMemory => "observation: the runtime's OOM refines the supervisor's report",
    ExitNoChange => "observation: an exit of a run already ended or failed",
    RunningUnownedStopped => "observation: an unattributed live run stopped again",
    RunningUnownedIgnored => "observation: an unattributed run ignored",
    RunningFirstSeen => "observation: this generation's run seen running",
    RunningRestartedOutOfBand => "observation: a later run, restarted out of band",
    RunningKnown => "observation: this generation's known run",
    RunningSnapshotOfEnded => "observation: a snapshot of a run since seen to end",
    RunningAfterEnd => "observation: a run started after this generation's ended",
    PauseEndsWithRun => "observation: a run ends while paused, and its pause with it",
    PauseConfirmed => "observation: the run is seen held as asked: Paused",
    PauseAgain => "observation: a run meant paused is not held as asked: pause it again",
    ResumeConfirmed => "observation: the run is seen thawed: Ready",
    ResumeAgain => "observation: a run meant running is held: resume it again",
    HoldAsMeant => "observation: the run is held or not as meant",
    SupervisorOfPaused => "observation: supervisor of a paused run",
    StopAgain => "observation: a live run with intent Stopped is stopped again",
    StopAgainReopens => "observation: stopped again from Stopped or Error",
    AbsentFenced => "observation: absence older than the record",
    AbsentBeforeStart => "observation: absence before this generation's run began",
    MissingAlreadyKnown => "observation: a resource already known to be missing",
    MissingFails => "observation: the resource is missing",
    StartReplyGone => "observation: start reply: gone",
    StartReplyFailed => "observation: start reply: failed, the run not begun",
    StartReplyFailedIgnored => "observation: start reply: failed, after the run began",
    StopReplyNeverRan => "observation: stop reply: absent, never ran",
    StopReplyLost => "observation: stop reply: absent after it ran",
    StopReplyCreated => "observation: stop reply: created, never ran",
    StopReplyExited => "observation: stop reply: exited",
    StopReplyRunning => "observation: stop reply: still running",
    SupervisorUnwanted => "observation: supervisor of a sandbox not meant to run",
    SupervisorReady => "observation: supervisor makes the run Ready",
    SupervisorPastStart => "observation: supervisor of a run past starting",
    MainEndIgnored => "observation: main process end that cannot end the run",
    MainCompleted => "observation: main process exited 0",
    MainFailed => "observation: main process failed",
    MainFailedOutOfMemory => "observation: main process killed for memory",
    MainUnstartable => "observation: main process could not start",

    // recovery: which unconfirmed transition to re-drive, and whether a queued effect stands.
    RedriveDelete => "recovery: re-drive a delete",
    RedriveStop => "recovery: re-drive a stop",
    RedriveStart => "recovery: re-drive a start",
    RedrivePause => "recovery: re-drive a pause",
    RedriveResume => "recovery: re-drive a resume",
    RedriveStartUnsettled => "recovery: re-drive a start whose run is unattributed",
    NothingToRedrive => "recovery: nothing to re-drive",
    EffectOrphanDelete => "recovery: a delete for a record that is gone stands",
    EffectNoRecordDropped => "recovery: an effect for a record that is gone is dropped",
    EffectSuperseded => "recovery: a queued effect superseded",
    EffectWanted => "recovery: a queued effect still wanted",

    // snapshot: snapshots and forks.
    SnapshotCreate => "snapshot: a snapshot is asked for",
    ForkCreate => "snapshot: a fork is asked for",
    SnapshotSourceUnsettled => "snapshot: the source is between phases",
    SnapshotQuota => "snapshot: the store's quota is reached",
    SnapshotDelete => "snapshot: delete",
    SnapshotDeleteAgain => "snapshot: delete of a snapshot being deleted",
    SnapshotInUse => "snapshot: delete refused while a sandbox needs its files",
    SnapshotGone => "snapshot: an answer for a snapshot that is gone",
    SnapshotTakenLate => "snapshot: an answer for a snapshot no longer being taken",
    SnapshotFailed => "snapshot: the copy failed",
    SnapshotReady => "snapshot: the copy is confirmed",
    ForkNameTaken => "snapshot: a fork's name was taken meanwhile",
    ForkMade => "snapshot: a fork's sandboxes are made",
    SnapshotRemoved => "snapshot: the removal is confirmed",
    SnapshotNotReady => "snapshot: a create from a snapshot not Ready",
    SnapshotSeeds => "snapshot: a create from a snapshot",
    SnapshotSeeded => "snapshot: a sandbox made from a snapshot has its files",

    // volume: volumes, their mounts and their two-step delete.
    VolumeCreate => "volume: create",
    VolumeMount => "volume: a create mounts volumes",
    VolumeMountDeleting => "volume: a create mounts a volume being deleted",
    VolumeDelete => "volume: delete",
    VolumeDeleteAgain => "volume: delete of a volume being deleted",
    VolumeInUse => "volume: delete refused while a sandbox mounts it",
    VolumeRemoved => "volume: the removal is confirmed",

    // start_gate: the rule every driver keeps about starting runs.
    GateStart => "start_gate: start",
    GateResume => "start_gate: resume an unconfirmed start",
    GateReport => "start_gate: report a confirmed start",
    GateSuperseded => "start_gate: a newer generation began",
    StopSupersededByNewer => "start_gate: a stop finds a newer generation begun",
    ReportRunning => "start_gate: started generation found running",
    ReportExited => "start_gate: started generation found exited",
    ReportGone => "start_gate: started generation found gone",

    // exec: admission, reports and end.
    AdmitRetry => "exec: admit retry of the same exec",
    AdmitIdConflict => "exec: admit of an id used by another exec",
    AdmitNotReady => "exec: admit while not Ready",
    AdmitPaused => "exec: admit while paused or pausing",
    Admit => "exec: admit",
    ReportIgnored => "exec: report of another generation or after the end",
    ReportStarted => "exec: report started",
    ReportStartedAgain => "exec: report started of a running exec",
    ReportEnded => "exec: report ended",
    ReportLost => "exec: report lost",
    CancelNothing => "exec: cancel of an ended or cancelled exec",
    Cancel => "exec: cancel",
    SettleEnded => "exec: settle of an ended exec",
    SettleLive => "exec: settle leaves an exec to its live run",
    SettleDeleted => "exec: settle after the sandbox was deleted",
    SettleStopped => "exec: settle after a stop",
    SettleDeleting => "exec: settle while deleting",
    SettleReplaced => "exec: settle after a new generation",
    SettleRunEnded => "exec: settle after the run ended",
}

#[cfg(feature = "branches")]
thread_local! {
    static HITS: RefCell<[u64; Branch::ALL.len()]> = const { RefCell::new([0; Branch::ALL.len()]) };
}

/// Marks that `branch` ran.
#[inline(always)]
pub fn hit(branch: Branch) {
    #[cfg(feature = "branches")]
    HITS.with_borrow_mut(|hits| hits[branch as usize] += 1);
    #[cfg(not(feature = "branches"))]
    let _ = branch;
}

/// This thread's counts since the last call, in [`Branch::ALL`]'s order; starts them again.
#[cfg(feature = "branches")]
pub fn take() -> [u64; Branch::ALL.len()] {
    HITS.with_borrow_mut(|hits| std::mem::replace(hits, [0; Branch::ALL.len()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_branch_has_its_place_in_all_and_a_name_of_its_own() {
        for (i, branch) in Branch::ALL.into_iter().enumerate() {
            assert_eq!(branch as usize, i, "{branch:?}");
        }
        let names: std::collections::BTreeSet<_> = Branch::ALL.map(Branch::name).into();
        assert_eq!(names.len(), Branch::ALL.len());
    }

    #[cfg(feature = "branches")]
    #[test]
    fn hits_are_counted_per_branch_until_taken() {
        take();
        hit(Branch::Admit);
        hit(Branch::Admit);
        hit(Branch::GateStart);
        let hits = take();
        assert_eq!(hits[Branch::Admit as usize], 2);
        assert_eq!(hits[Branch::GateStart as usize], 1);
        assert_eq!(hits.iter().sum::<u64>(), 3);
        assert_eq!(take().iter().sum::<u64>(), 0);
    }
}
