//! The records Berth keeps: sandboxes and providers (DESIGN 3.1), templates (9.4) and execs
//! (8.1).
//!
//! A record is plain data. Every rule that changes one is a function over it in the module of
//! its concept: [`crate::command`] (API commands), [`crate::observation`] (everything the
//! runtime and supervisors report), [`crate::template`], [`crate::exec`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::allowlist::Policy;
use crate::id::{ExecId, NodeId, SandboxId, SnapshotId, VolumeId};
use crate::phase::{Failure, Hold, Phase, PhaseKind};
use crate::spec::{ExecSpec, SandboxSpec};
use crate::time::Timestamp;

/// What the sandbox should be doing. Changed only by API commands, never by observations, with
/// one exception: a run that ends while paused takes its pause with it (there is nothing left to
/// keep frozen), so Paused goes back to Running and the end counts as any run's does, restart
/// policy included (DESIGN 12.1); or, for a pause an expiry made, to Stopped, as the expiry
/// would have stopped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Intent {
    Running,
    /// Running, with every process frozen and its memory kept (DESIGN 12.1).
    Paused,
    Stopped,
    Deleted,
}

/// How one run ended, in the runtime's own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExitMarker {
    pub started_at: Timestamp,
    pub finished_at: Timestamp,
    pub exit_code: i32,
    /// The runtime says the kernel killed something of the run for memory (Docker's and
    /// Podman's `OOMKilled`, the supervisor's record). Markers from before limits have none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub out_of_memory: bool,
}

/// What has been observed of the current generation's run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Run {
    /// No run of this generation is known to have started.
    #[default]
    Pending,
    /// A run of this generation started; its runtime start time once a runtime report gave it
    /// (a supervisor connecting proves the run started, but not when).
    Started { at: Option<Timestamp> },
    /// The run of this generation ended.
    Ended(ExitMarker),
}

/// The fence against the runs that came before the current generation (DESIGN 3.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitFence {
    /// The newest exit known when this generation was decided: the run it replaced.
    pub marker: Option<ExitMarker>,
    /// False when, at that moment, a run might still have been alive (a Start out of Error
    /// before the failed run was seen to end). Until the driver reports this generation's start
    /// time, no runtime report can then be attributed to this generation.
    pub settled: bool,
}

/// What the record says of the restarts the policy made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    /// Restarts since the last create or user start.
    pub count: u32,
    /// When the next restart is due, if one is scheduled.
    pub next_at: Option<Timestamp>,
}

/// Where a sandbox's next run goes: the node, and the epoch of that node's lease, which the
/// node checks on every effect it is sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    pub epoch: u64,
}

/// A sandbox record (DESIGN 3.1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    pub id: SandboxId,
    pub name: std::sync::Arc<str>,
    /// Shared, not copied: decisions copy the record they change, and the spec (the largest
    /// part) is the one part no decision about a run changes.
    pub spec: std::sync::Arc<SandboxSpec>,
    /// Shared like the spec: only an attach or a detach changes them.
    pub providers: std::sync::Arc<BTreeSet<String>>,
    /// The attached providers whose endpoints the current run may reach: those attached when
    /// its generation was committed, less those detached since ([`crate::egress`]).
    #[serde(default)]
    pub egress_providers: std::sync::Arc<BTreeSet<String>>,
    pub intent: Intent,
    /// How the pause holds the run while the intent is Paused; the last pause's otherwise.
    #[serde(default)]
    pub hold: Hold,
    pub phase: Phase,
    pub resource_version: u64,
    /// The runtime identity generation: 1 at create, +1 by every Start.
    pub generation: u64,
    pub exit_fence: ExitFence,
    pub run: Run,
    /// The newest exit the runtime reported for this sandbox, whichever run it ended.
    pub last_exit: Option<ExitMarker>,
    /// When its lifetime ends, on the store's clock (DESIGN 9.1).
    #[serde(default)]
    pub deadline: Option<Timestamp>,
    /// When an expiry of the deadline was committed; cleared by a renew or a start.
    #[serde(default)]
    pub expired_at: Option<Timestamp>,
    /// The last activity the idle timeout counts from (DESIGN 9.1), on the store's clock; kept
    /// only for a sandbox with an idle timeout, from its create, start or claim on.
    #[serde(default)]
    pub active_at: Option<Timestamp>,
    /// When an idle expiry was committed; cleared by a start.
    #[serde(default)]
    pub idle_expired_at: Option<Timestamp>,
    #[serde(default)]
    pub restarts: Restarts,
    /// The template it was made from, for a pool member (kept once claimed).
    #[serde(default)]
    pub template: Option<String>,
    /// The snapshot it was made from (DESIGN 12.2), and whether its workspace has the
    /// snapshot's files yet.
    #[serde(default)]
    pub seed: Option<Seed>,
    /// The node its current generation runs on, under which epoch of that node's lease (DESIGN
    /// 14): committed with the generation, so the write that makes a run also says where.
    #[serde(default)]
    pub placement: Option<Placement>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Where a sandbox made from a snapshot takes its files from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seed {
    pub snapshot: String,
    pub id: SnapshotId,
    /// A run of the sandbox has started: its driver copied the snapshot's files before it (its
    /// first start does), so the sandbox needs the snapshot no more. Until then the snapshot
    /// cannot be deleted (S2).
    pub seeded: bool,
}

impl Sandbox {
    /// A new sandbox's first record: generation 1, about to be provisioned, nothing run yet,
    /// attached to nothing. Every other record is this one changed by the rules (or, in a test,
    /// by struct update syntax over it), so a field added here reaches them all.
    pub fn new(id: SandboxId, name: &str, spec: SandboxSpec, now: Timestamp) -> Self {
        Self {
            id,
            name: name.into(),
            spec: spec.into(),
            providers: Default::default(),
            egress_providers: Default::default(),
            intent: Intent::Running,
            hold: Hold::Freezer,
            phase: Phase::Provisioning,
            resource_version: 1,
            generation: 1,
            exit_fence: ExitFence { marker: None, settled: true },
            run: Run::Pending,
            last_exit: None,
            deadline: None,
            expired_at: None,
            active_at: None,
            idle_expired_at: None,
            restarts: Restarts::default(),
            template: None,
            seed: None,
            placement: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// Whether the current generation's command completed (exited 0) by itself: the only way
    /// to be Stopped while the intent is still Running (DESIGN 9.3).
    pub fn completed(&self) -> bool {
        self.phase == Phase::Stopped && self.intent == Intent::Running
    }

    pub(crate) fn is(&self, kind: PhaseKind) -> bool {
        self.phase.kind() == kind
    }

    /// The run failed; a pause ends with it (see [`Intent`]).
    pub(crate) fn fail(&mut self, failure: Failure) {
        self.end_pause();
        self.phase = Phase::Error(failure);
    }

    /// The run ended: a pause of it has nothing left to hold. A user's pause ends as the run
    /// would have, meant to run (its restart policy applies); an expiry's (its deadline or idle
    /// timeout passed, with `pause` for what it does) ends as the stop it stood in for, so that
    /// nothing runs past the deadline (see [`Intent`]).
    pub(crate) fn end_pause(&mut self) {
        if self.intent == Intent::Paused && !crate::bug!(PauseOutlivesRun) {
            crate::branch::hit(crate::branch::Branch::PauseEndsWithRun);
            let expired = self.expired_at.is_some() || self.idle_expired_at.is_some();
            self.intent = if expired { Intent::Stopped } else { Intent::Running };
        }
    }
}

/// A provider: named credentials that attached sandboxes receive in their environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provider {
    pub name: String,
    pub kind: String,
    pub credentials: BTreeMap<String, Secret>,
    /// Where its credentials are for: attaching it lets a sandbox's runs reach these.
    #[serde(default)]
    pub endpoints: Policy,
    /// +1 on every write, including every attach to a sandbox: an attach and a provider delete
    /// racing on one provider always conflict, so no sandbox ends up attached to a deleted one.
    pub resource_version: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// A secret value. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The value itself, for handing to a runtime. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A template (DESIGN 9.4): a named spec, and the size of its warm pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    pub name: String,
    pub spec: SandboxSpec,
    /// Ready members the pool keeps.
    pub min_ready: u32,
    /// Members made so far; every fill adds one.
    pub made: u64,
    pub resource_version: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// A snapshot (DESIGN 12.2): a sandbox's files at one moment, which new sandboxes start from.
/// Once Ready it never changes (S1) until its delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub name: String,
    pub id: SnapshotId,
    pub source: SnapshotSource,
    /// What a sandbox made from it runs: its source's spec when it was asked for.
    pub spec: SandboxSpec,
    pub phase: SnapshotPhase,
    /// What the runtime keeps of it, once taken.
    pub content: Option<Content>,
    /// The fork it was taken for, if a fork asked for it (DESIGN 12.3).
    pub fork: Option<Fork>,
    pub resource_version: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// The sandbox a snapshot was taken of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSource {
    pub id: SandboxId,
    pub name: String,
    /// The generation whose run (or whose stopped workspace) was copied.
    pub generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotPhase {
    /// Asked for; the runtime has not confirmed the copy.
    Creating,
    Ready,
    /// The copy could not be made; nothing of it is kept.
    Error(String),
    /// A delete was committed; the runtime has not confirmed the removal.
    Deleting,
}

impl SnapshotPhase {
    /// The phase's name, as metrics and the wire say it.
    pub fn name(&self) -> &'static str {
        match self {
            SnapshotPhase::Creating => "Creating",
            SnapshotPhase::Ready => "Ready",
            SnapshotPhase::Error(_) => "Error",
            SnapshotPhase::Deleting => "Deleting",
        }
    }
}

/// What a taken snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Content {
    /// The workspace copy's size in bytes (plus the image's on a container runtime).
    pub size_bytes: u64,
    /// SHA-256 of the workspace copy, hex: every sandbox made from the snapshot starts with
    /// exactly the files it sums (S1).
    pub sha256: String,
    /// The image the runtime committed of the source's filesystem; none on the process driver.
    pub image: Option<String>,
}

/// The sandboxes a fork makes once its snapshot is taken, all in one write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fork {
    pub sandboxes: Vec<(SandboxId, String)>,
    /// Added to each fork's labels.
    pub labels: BTreeMap<String, String>,
}

/// A volume (DESIGN 13.2): files with a lifecycle of their own, mounted into sandboxes, kept
/// across their deletes. The runtime makes its content when a run first mounts it; its delete
/// is two steps, like a snapshot's (Deleting, then the record goes once the runtime confirms
/// that nothing of it is left).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub name: String,
    pub id: VolumeId,
    pub phase: VolumePhase,
    pub resource_version: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumePhase {
    Ready,
    /// A delete was committed; the runtime has not confirmed the removal (it waits until no
    /// sandbox record mounting it is left).
    Deleting,
}

impl VolumePhase {
    /// The phase's name, as metrics and the wire say it.
    pub fn name(self) -> &'static str {
        match self {
            VolumePhase::Ready => "Ready",
            VolumePhase::Deleting => "Deleting",
        }
    }
}

/// How an exec ended, as its run reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExecEnd {
    /// It exited by itself with this code.
    Exited(i32),
    /// A signal it did not handle killed it (one the client sent, or the runtime's).
    Signalled(i32),
    /// Its timeout killed it.
    TimedOut,
    /// A cancel killed it, or it was cancelled before it ran.
    Cancelled,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExecState {
    /// Committed; its run has not said it started.
    Admitted,
    /// Its run started it.
    Running,
    /// Final, from here on.
    Ended { end: ExecEnd, message: String },
    /// Its run ended (died, or was replaced) before the exec's own end was known: final.
    Lost { message: String },
}

impl ExecState {
    pub fn is_terminal(&self) -> bool {
        matches!(self, ExecState::Ended { .. } | ExecState::Lost { .. })
    }

    /// The state's name, as metrics and the wire's enum say it.
    pub fn name(&self) -> &'static str {
        match self {
            ExecState::Admitted => "Admitted",
            ExecState::Running => "Running",
            ExecState::Ended { end: ExecEnd::Exited(_), .. } => "Exited",
            ExecState::Ended { end: ExecEnd::Signalled(_), .. } => "Signalled",
            ExecState::Ended { end: ExecEnd::TimedOut, .. } => "TimedOut",
            ExecState::Ended { end: ExecEnd::Cancelled, .. } => "Cancelled",
            ExecState::Lost { .. } => "Lost",
        }
    }
}

/// An exec record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exec {
    pub sandbox: SandboxId,
    pub id: ExecId,
    pub spec: ExecSpec,
    /// The generation it was admitted for: only that generation's run ever runs it (E2).
    pub generation: u64,
    pub state: ExecState,
    /// A cancel was asked: the run kills it, or never starts it.
    pub cancel_requested: bool,
    /// How many bytes of output it wrote in all, once it ended and its run said so.
    pub output_bytes: Option<u64>,
    /// +1 on every write.
    pub resource_version: u64,
    pub admitted_at: Timestamp,
    pub updated_at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_display() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "<redacted> Secret(<redacted>)");
    }
}
