//! The records Berth keeps: sandboxes and providers (DESIGN 3.1).
//!
//! A record is plain data. Every rule that changes one lives in [`crate::command`] (API commands)
//! or [`crate::observation`] (everything the runtime and supervisors report).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::lifetime::Lifetime;
use crate::limits::ResourceLimits;
use crate::restart::{RestartPolicy, Restarts};

/// A point in time, in nanoseconds since the Unix epoch.
///
/// Two clocks use this type and are never compared with each other: the gateway's wall clock
/// (`created_at`, `updated_at`, supplied as an input) and the runtime's own clock (run start and
/// finish times, which fence stale exits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub const fn from_unix_nanos(nanos: i64) -> Self {
        Self(nanos)
    }
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }
    pub const fn unix_nanos(self) -> i64 {
        self.0
    }
    pub const fn unix_millis(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }
    /// `self + d`, saturating.
    pub fn plus(self, d: core::time::Duration) -> Self {
        Self(self.0.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
    }
}

/// A sandbox's id: assigned by the gateway at create, never reused. Shared, not copied: every
/// write, effect and reply about a sandbox carries its id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxId(std::sync::Arc<str>);

impl SandboxId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into().into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the user asked to run. Immutable after create.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// Records written before lifetimes and restart policies existed read back with none.
    #[serde(default)]
    pub lifetime: Lifetime,
    #[serde(default)]
    pub restart: RestartPolicy,
    #[serde(default)]
    pub limits: ResourceLimits,
    /// Where its runs may connect (DESIGN 10); empty: nowhere.
    #[serde(default)]
    pub egress: crate::egress::Policy,
}

/// What the sandbox should be doing. Changed only by API commands, never by observations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Intent {
    Running,
    Stopped,
    Deleted,
}

/// Where the sandbox is in its lifecycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Created; the compute resource is being made and its first run started.
    Provisioning,
    /// A new generation's run is being started.
    Starting,
    /// The current generation's supervisor is connected.
    Ready,
    /// A stop is under way.
    Stopping,
    /// Nothing runs; the workspace is kept. With intent Running, the command completed: it
    /// exited 0 by itself ([`Sandbox::completed`]).
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
    Stopping,
    Stopped,
    Deleting,
    Error,
}

impl PhaseKind {
    /// Every phase, in lifecycle order.
    pub const ALL: [PhaseKind; 7] = [
        PhaseKind::Provisioning,
        PhaseKind::Starting,
        PhaseKind::Ready,
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
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
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
            created_at: now,
            updated_at: now,
        }
    }

    /// Whether the current generation's command completed (exited 0) by itself: the only way
    /// to be Stopped while the intent is still Running (DESIGN 9.3).
    pub fn completed(&self) -> bool {
        self.phase == Phase::Stopped && self.intent == Intent::Running
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
    pub endpoints: crate::egress::Policy,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_convert_to_milliseconds_rounding_down() {
        assert_eq!(Timestamp::from_unix_millis(1_700_000_000_123).unix_millis(), 1_700_000_000_123);
        assert_eq!(Timestamp::from_unix_nanos(1_999_999).unix_millis(), 1);
        // Before 1970, down is further into the past, not towards zero.
        assert_eq!(Timestamp::from_unix_nanos(-1).unix_millis(), -1);
    }

    #[test]
    fn phases_and_secrets_display_as_users_read_them() {
        let failure = Failure { reason: FailureReason::ContainerExited, exit_code: Some(3), message: "x".into() };
        assert_eq!(Phase::Error(failure).to_string(), "Error (ContainerExited)");
        assert_eq!(Phase::Stopping.to_string(), "Stopping");
        assert_eq!(PhaseKind::Ready.to_string(), "Ready");
        assert_eq!(FailureReason::StartFailed.to_string(), "StartFailed");
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "<redacted> Secret(<redacted>)");
    }
}
