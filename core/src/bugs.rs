//! Known-bug switches. Each puts one motivating race back, so the simulator can show that it
//! catches it. Only with the `bugs` feature, which only the simulator enables, can one be
//! turned on, for its own thread (a simulation runs a seed on one thread); without it [`on`]
//! is a constant `false`, so every hook is a branch the optimizer removes, yet every build
//! still type-checks the bent path.

#[cfg(feature = "bugs")]
use std::cell::Cell;

use crate::decision::{Conflict, Decision, Effect, Key, Outcome, Write};
use crate::phase::PhaseKind;
use crate::record::{ExitFence, Intent, Run, Sandbox};
use crate::report::{Observation, RuntimeSource, StartReply};
use crate::request::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bug {
    /// R3: polled snapshots (get and list) skip the exit fence.
    PollBypassesFence,
    /// The event-path R3: watch events skip the exit fence, so a delayed exit event of the
    /// previous run applied after a restart counts.
    EventBypassesFence,
    /// R2: a delete that meets a conflicting write fails instead of re-deciding.
    DeleteWithoutRetry,
    /// R1: the identity rotation is not part of the Starting write: the start effect launches
    /// the next generation, and a later write (the driver's reply) persists it.
    RotationOutsideStart,
    /// A stale effect runs without its re-checks: the gateway's against the record before a
    /// queued effect runs, and the driver's against the generation it began last before a stop
    /// ([`crate::start_gate::stop_superseded`]). A stop decided before a start then lands on the
    /// new generation's run (D1, issue 13). Either re-check alone prevents that: with only the
    /// first bent, the simulator rightly sees no harm.
    EffectWithoutRecheck,
    /// Defects 1 and 2 of issue 13: the drivers record a generation only after the runtime
    /// started it (the container driver) or the supervisor was spawned (the process driver), so
    /// a gateway that dies in between leaves a run no record knows, and the re-driven start runs
    /// the generation again.
    RecordAfterStart,
    /// Defect 3 of issue 13: a Start settles the new generation's exit fence on the last
    /// recorded exit, so the exit of a run restarted out of band after it (stopped to make room,
    /// or its stale supervisor rejected) passes for the new generation's.
    FenceFromRecordedExit,
    /// The reconcile sweep stops before its last page of the runtime's listing, so the
    /// sandboxes listed there look absent.
    SweepSkipsLastPage,
    /// A holder counts its lease tenure from the store's answer rather than from its request:
    /// an answer the store held back after granting makes the holder reconcile past the
    /// grant's time-to-live (L1).
    TenureFromAnswer,
    /// E1: a run's supervisor forgets, when it is restarted out of band, which execs its
    /// generation started, and the gateway hands it those still open: it runs them again.
    ExecRetryRunsTwice,
    /// E2: the gateway hands an exec to its sandbox's current session whatever generation that
    /// session's run is, so an exec admitted for one run runs in the next.
    ExecNotFenced,
    /// T1: an expiry takes the deadline its timer was set for as still the record's, so a
    /// renew that committed after the timer was set does not save the sandbox.
    ExpiryIgnoresRenew,
    /// P1: a claim whose write conflicts is written again over whatever won, instead of being
    /// decided again: two claims racing for one pool member both get it.
    ClaimWithoutCas,
    /// T1 (idle): an idle expiry counts only the record's last activity, not the execs still
    /// open, so a sandbox is stopped under an exec that runs longer than its idle timeout.
    IdleIgnoresExecs,
    /// G1: an attach opens the provider's endpoints to the running generation at once, not at
    /// its next start: the run gets more than the policy committed with its generation.
    EgressFromAttach,
    /// D1 over trees: the process driver signals its run's supervisor alone where it should
    /// signal the run's process group. The supervisor passes SIGTERM on to its command and
    /// exits after it, but what the command started is never told, and lives on after an
    /// acknowledged stop (init adopts it).
    SignalsSupervisorOnly,
    /// D1 over trees: the process driver ends a run's supervisor (or sees it end) but does not
    /// make sure the rest of its group goes with it, so a child deaf to SIGTERM, or one left
    /// running when the command ended by itself, outlives the acknowledged stop.
    ChildLeftBehind,
    /// P1: a claim takes a pool member that is still starting (any member wanted running that
    /// is not on its way out), not only a Ready one.
    ClaimUnready,
    /// X1: an exec is admitted to a sandbox still Starting as well as to a Ready one, before
    /// any run of the generation it is admitted for is known to be there to run it.
    ExecWhileStarting,
    /// R1: a restart policy's maximum is not looked at, so a run that keeps failing is
    /// restarted past it.
    RestartPastMaximum,
    /// S3: an exec is admitted to a sandbox whose pause is committed but not yet seen to
    /// freeze its run (still Ready), so it is handed to a run frozen under it.
    ExecWhilePausing,
    /// S3: a run that ends while paused leaves its pause in place, so the sandbox waits, Paused
    /// in intent, on a run that is gone: its restart policy never applies (after a host reboot,
    /// the paused sandbox that vanishes).
    PauseOutlivesRun,
    /// S3: a pause is taken as done once it was asked for: any report of the live run confirms
    /// it, frozen or not, so a pause the runtime never carried out (a failed call, a gateway
    /// that died first) is Paused in the record over a run that goes on.
    PauseConfirmedBlind,
    /// S2: a snapshot's delete does not ask whether a sandbox made from it still needs its
    /// files, so a sandbox created from it just before finds, at its first start, no copy to
    /// start from.
    SnapshotDeletedUnderSeed,
    /// S4: a fork's copy is confirmed with only some of its sandboxes made, the rest never.
    ForkHalfMade,
    /// S3: the container driver takes a run restored from its checkpoint for the new start the
    /// runtime shows (Podman's restore starts the container anew), so a resume from a
    /// checkpoint loses the run it restored: restarted out of band, as far as Berth can tell.
    RestoreForgetsStart,
    /// S2: a volume's removal does not wait for the sandboxes being deleted that mount it, so a
    /// delete of a sandbox followed at once by its volume's removes the files under the run
    /// still being stopped (the providers' race, in a new place).
    VolumeRemovedUnderRun,
    /// U1: a port's access token of an earlier generation is taken for the current one, so a
    /// URL handed out before a stop and start reaches the next run (the stale preview URL
    /// Cloudflare had to retrofit a fix for).
    PortTokenOutlivesRun,
    /// N1: a node acts on a stale epoch: when its lease lapses it keeps its runs, and goes on
    /// making runs, so once the store fences it and places a sandbox anew, two nodes run it.
    LapsedNodeRunsOn,
    /// N2: placement takes a node whose lease has lapsed for a live one, so sandboxes are
    /// placed on a node that is gone.
    PlacesOnLapsed,
    /// T1 under clock skew: an expiry is committed on the deciding gateway's reading of the
    /// store's clock alone, so a gateway whose clock runs ahead expires a sandbox before its
    /// deadline.
    ExpiresOnOwnClock,
}

impl Bug {
    pub const ALL: [Bug; 31] = [
        Bug::PollBypassesFence,
        Bug::EventBypassesFence,
        Bug::DeleteWithoutRetry,
        Bug::RotationOutsideStart,
        Bug::EffectWithoutRecheck,
        Bug::RecordAfterStart,
        Bug::FenceFromRecordedExit,
        Bug::SweepSkipsLastPage,
        Bug::TenureFromAnswer,
        Bug::ExecRetryRunsTwice,
        Bug::ExecNotFenced,
        Bug::ExpiryIgnoresRenew,
        Bug::ClaimWithoutCas,
        Bug::IdleIgnoresExecs,
        Bug::EgressFromAttach,
        Bug::SignalsSupervisorOnly,
        Bug::ChildLeftBehind,
        Bug::ClaimUnready,
        Bug::ExecWhileStarting,
        Bug::RestartPastMaximum,
        Bug::ExecWhilePausing,
        Bug::PauseOutlivesRun,
        Bug::PauseConfirmedBlind,
        Bug::SnapshotDeletedUnderSeed,
        Bug::ForkHalfMade,
        Bug::RestoreForgetsStart,
        Bug::VolumeRemovedUnderRun,
        Bug::PortTokenOutlivesRun,
        Bug::LapsedNodeRunsOn,
        Bug::PlacesOnLapsed,
        Bug::ExpiresOnOwnClock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::PollBypassesFence => "poll-bypasses-fence",
            Bug::EventBypassesFence => "event-bypasses-fence",
            Bug::DeleteWithoutRetry => "delete-without-retry",
            Bug::RotationOutsideStart => "rotation-outside-start",
            Bug::EffectWithoutRecheck => "effect-without-recheck",
            Bug::RecordAfterStart => "record-after-start",
            Bug::FenceFromRecordedExit => "fence-from-recorded-exit",
            Bug::SweepSkipsLastPage => "sweep-skips-last-page",
            Bug::TenureFromAnswer => "tenure-from-answer",
            Bug::ExecRetryRunsTwice => "exec-retry-runs-twice",
            Bug::ExecNotFenced => "exec-not-fenced",
            Bug::ExpiryIgnoresRenew => "expiry-ignores-renew",
            Bug::ClaimWithoutCas => "claim-without-cas",
            Bug::IdleIgnoresExecs => "idle-ignores-execs",
            Bug::EgressFromAttach => "egress-from-attach",
            Bug::SignalsSupervisorOnly => "signals-supervisor-only",
            Bug::ChildLeftBehind => "child-left-behind",
            Bug::ClaimUnready => "claim-unready",
            Bug::ExecWhileStarting => "exec-while-starting",
            Bug::RestartPastMaximum => "restart-past-maximum",
            Bug::ExecWhilePausing => "exec-while-pausing",
            Bug::PauseOutlivesRun => "pause-outlives-run",
            Bug::PauseConfirmedBlind => "pause-confirmed-blind",
            Bug::SnapshotDeletedUnderSeed => "snapshot-deleted-under-seed",
            Bug::ForkHalfMade => "fork-half-made",
            Bug::RestoreForgetsStart => "restore-forgets-start",
            Bug::VolumeRemovedUnderRun => "volume-removed-under-run",
            Bug::PortTokenOutlivesRun => "port-token-outlives-run",
            Bug::LapsedNodeRunsOn => "lapsed-node-runs-on",
            Bug::PlacesOnLapsed => "places-on-lapsed",
            Bug::ExpiresOnOwnClock => "expires-on-own-clock",
        }
    }

    /// The gateways a run needs for the race to come up. R2's conflicting write must come from
    /// another gateway (writers inside one gateway take turns on a record); an effect without
    /// its re-check harms a run mostly when another gateway's start overtook it (with one
    /// gateway seed 45 is the first standard seed to show it, with three seed 0).
    pub fn gateways(self) -> usize {
        match self {
            Bug::DeleteWithoutRetry => 2,
            // A renew through another gateway reaches the lease holder's timers only at its
            // next scan: that is when a timer set for the old deadline fires.
            // Claims through one gateway take turns on their template; racing ones come
            // through others.
            Bug::EffectWithoutRecheck | Bug::TenureFromAnswer | Bug::ExpiryIgnoresRenew | Bug::ClaimWithoutCas => 3,
            // A gateway per node.
            Bug::LapsedNodeRunsOn | Bug::PlacesOnLapsed => 3,
            // Gateways whose clocks disagree, any of which may hold the timers.
            Bug::ExpiresOnOwnClock => 3,
            Bug::PollBypassesFence
            | Bug::EventBypassesFence
            | Bug::RotationOutsideStart
            | Bug::RecordAfterStart
            | Bug::FenceFromRecordedExit
            | Bug::SweepSkipsLastPage
            | Bug::ExecRetryRunsTwice
            | Bug::ExecNotFenced
            | Bug::IdleIgnoresExecs
            | Bug::EgressFromAttach
            | Bug::SignalsSupervisorOnly
            | Bug::ChildLeftBehind
            | Bug::ClaimUnready
            | Bug::ExecWhileStarting
            | Bug::RestartPastMaximum
            | Bug::ExecWhilePausing
            | Bug::PauseOutlivesRun
            | Bug::PauseConfirmedBlind
            | Bug::SnapshotDeletedUnderSeed
            | Bug::ForkHalfMade
            | Bug::RestoreForgetsStart
            | Bug::VolumeRemovedUnderRun
            | Bug::PortTokenOutlivesRun => 1,
        }
    }

    /// Whether the race needs the lifetime workload.
    pub fn lifetimes(self) -> bool {
        matches!(
            self,
            Bug::ExpiryIgnoresRenew
                | Bug::ClaimWithoutCas
                | Bug::IdleIgnoresExecs
                | Bug::ClaimUnready
                | Bug::RestartPastMaximum
                | Bug::ExpiresOnOwnClock
        )
    }

    /// How far off the gateways' readings of the store's clock must be for the race: several
    /// poll intervals, as a host whose clock stepped after its gateway measured the database's.
    pub fn clock_skew(self) -> core::time::Duration {
        match self {
            Bug::ExpiresOnOwnClock => core::time::Duration::from_secs(5),
            _ => core::time::Duration::ZERO,
        }
    }

    /// Whether the race needs the egress workload.
    pub fn egress(self) -> bool {
        self == Bug::EgressFromAttach
    }

    /// Whether the race needs the exec workload.
    pub fn execs(self) -> bool {
        matches!(
            self,
            Bug::ExecRetryRunsTwice
                | Bug::ExecNotFenced
                | Bug::IdleIgnoresExecs
                | Bug::ExecWhileStarting
                | Bug::ExecWhilePausing
        )
    }

    /// Whether the race needs the snapshot workload.
    pub fn snapshots(self) -> bool {
        matches!(self, Bug::SnapshotDeletedUnderSeed | Bug::ForkHalfMade)
    }

    /// Whether the race needs the volume workload.
    pub fn volumes(self) -> bool {
        self == Bug::VolumeRemovedUnderRun
    }

    /// Whether the race needs the port workload.
    pub fn ports(self) -> bool {
        self == Bug::PortTokenOutlivesRun
    }

    /// The nodes the race needs: several, for a sandbox to be placed anew on another.
    pub fn nodes(self) -> usize {
        match self {
            Bug::LapsedNodeRunsOn | Bug::PlacesOnLapsed => 3,
            _ => 1,
        }
    }

    /// Whether the race needs the state workload (pause and resume).
    pub fn state(self) -> bool {
        matches!(
            self,
            Bug::ExecWhilePausing | Bug::PauseOutlivesRun | Bug::PauseConfirmedBlind | Bug::RestoreForgetsStart
        )
    }
}

/// A known-bug hook: whether switch `$bug` is on. One line beside the rule it bends.
#[macro_export]
macro_rules! bug {
    ($bug:ident) => {
        $crate::bugs::on($crate::bugs::Bug::$bug)
    };
}

#[cfg(feature = "bugs")]
thread_local! {
    static ON: Cell<Option<Bug>> = const { Cell::new(None) };
}

/// Turns `bug` on (or every bug off) for this thread.
#[cfg(feature = "bugs")]
pub fn set(bug: Option<Bug>) {
    ON.with(|on| on.set(bug));
}

/// Whether the simulator turned `bug` on for this thread.
#[cfg(feature = "bugs")]
pub fn on(bug: Bug) -> bool {
    ON.with(|on| on.get() == Some(bug))
}

/// Never: a production build cannot turn a switch on.
#[cfg(not(feature = "bugs"))]
#[inline(always)]
pub const fn on(_: Bug) -> bool {
    false
}

// Where each switch bends berth-core. The rules themselves never mention a bug: each of these
// is called from one line next to the rule it bends.

/// R3 and its event-path twin: a runtime report of `source` is taken without the exit fence.
pub(crate) fn bypasses_fence(source: RuntimeSource) -> bool {
    match source {
        RuntimeSource::PollGet | RuntimeSource::PollList => on(Bug::PollBypassesFence),
        RuntimeSource::WatchEvent => on(Bug::EventBypassesFence),
        RuntimeSource::InitialSync
        | RuntimeSource::RecoveryLookup
        | RuntimeSource::PauseReply
        | RuntimeSource::ResumeReply => false,
    }
}

/// G1: an attach widens the running generation's egress too.
pub(crate) fn egress_from_attach(next: &mut Sandbox, provider: &str) {
    if on(Bug::EgressFromAttach) {
        std::sync::Arc::make_mut(&mut next.egress_providers).insert(provider.to_string());
    }
}

/// D1: an effect is taken as still wanted whatever the record says now, and a stop as the
/// driver's to carry out whatever generation it began since.
pub(crate) fn skips_recheck() -> bool {
    on(Bug::EffectWithoutRecheck)
}

/// R2: a delete gives up at its first conflicting write.
pub(crate) fn fails_fast(command: &Command) -> bool {
    on(Bug::DeleteWithoutRetry) && matches!(command, Command::DeleteSandbox { .. })
}

/// R1, at the Start decision: Starting is written without the rotation.
pub(crate) fn leave_rotation_out(before: &Sandbox, next: &mut Sandbox) {
    if on(Bug::RotationOutsideStart) {
        next.generation = before.generation;
        next.exit_fence = before.exit_fence;
    }
}

/// R1, at the driver's start reply: the rotation is persisted only now. Returns the reply to
/// merge when the switch took it.
pub(crate) fn rotate_late<'o>(next: &mut Sandbox, observation: &'o Observation) -> Option<&'o StartReply> {
    match observation {
        Observation::Started { generation, reply }
            if on(Bug::RotationOutsideStart) && *generation == next.generation + 1 && next.is(PhaseKind::Starting) =>
        {
            next.generation = *generation;
            next.exit_fence = ExitFence { marker: next.last_exit, settled: true };
            Some(reply)
        }
        _ => None,
    }
}

/// R1, at recovery: a start re-driven after the rotation was left out launches yet another
/// generation.
pub(crate) fn unfinished_start(sandbox: &Sandbox) -> Option<Effect> {
    let pending = sandbox.intent == Intent::Running && sandbox.is(PhaseKind::Starting) && sandbox.run == Run::Pending;
    (on(Bug::RotationOutsideStart) && pending)
        .then(|| Effect::Start { sandbox: sandbox.id.clone(), generation: sandbox.generation + 1 })
}

/// P1: a claim's write that met a newer version of its member is made again over it, as if
/// written without a condition, rather than decided again.
pub fn claim_over(command: &Command, decision: &Decision, conflict: &Conflict) -> Option<Decision> {
    let (true, Command::ClaimSandbox { .. }, Key::Sandbox(id), Some(current)) =
        (on(Bug::ClaimWithoutCas), command, &conflict.key, conflict.current)
    else {
        return None;
    };
    let mut over = decision.clone();
    for write in &mut over.writes {
        if let Write::UpdateSandbox { record, expected } = write
            && record.id == *id
        {
            *expected = current;
            record.resource_version = current + 1;
            over.outcome = Outcome::Sandbox(Box::new(record.clone()));
        }
    }
    Some(over)
}
