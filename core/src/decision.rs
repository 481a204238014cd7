//! What berth-core decides: one conditional transaction to commit, then driver effects to run.
//!
//! The executor (the gateway, the simulator, a test) commits `writes` atomically with every
//! condition checked, and only then runs `effects`: a decision is durable before its effects, so
//! an effect can always be re-driven from the committed record.

use crate::id::{ExecId, SandboxId, SnapshotId, VolumeId};
use crate::phase::{Hold, PhaseKind};
use crate::record::{Exec, Provider, Sandbox, Snapshot, Template, Volume};
use crate::time::Timestamp;

/// One conditional write. A transaction is a list of them, all applied or none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Create-if-absent: fails if the id or the name is taken.
    CreateSandbox(Sandbox),
    /// Write-if-version: `record.resource_version` is `expected + 1`.
    UpdateSandbox {
        record: Sandbox,
        expected: u64,
    },
    /// Delete-if-version.
    RemoveSandbox {
        id: SandboxId,
        expected: u64,
    },
    CreateProvider(Provider),
    UpdateProvider {
        record: Provider,
        expected: u64,
    },
    RemoveProvider {
        name: String,
        expected: u64,
    },
    /// A condition only: the sandbox is at `expected`, and nothing of it is written. What an
    /// exec is admitted against, so that an exec admission and a stop never both commit against
    /// one Ready record, yet admitting one never changes the sandbox's version under its clients
    /// (unless the sandbox has an idle timeout, whose clock the admission restarts: DESIGN 9.1).
    CheckSandbox {
        id: SandboxId,
        expected: u64,
    },
    CreateTemplate(Template),
    UpdateTemplate {
        record: Template,
        expected: u64,
    },
    RemoveTemplate {
        name: String,
        expected: u64,
    },
    CreateSnapshot(Snapshot),
    UpdateSnapshot {
        record: Snapshot,
        expected: u64,
    },
    RemoveSnapshot {
        name: String,
        expected: u64,
    },
    CreateVolume(Volume),
    UpdateVolume {
        record: Volume,
        expected: u64,
    },
    RemoveVolume {
        name: String,
        expected: u64,
    },
    /// Create-if-absent. An exec is removed with its sandbox.
    CreateExec(Exec),
    UpdateExec {
        record: Exec,
        expected: u64,
    },
    /// A condition only: the store's clock has reached this time. What a decision that time
    /// alone justifies carries (an expiry at its deadline): a gateway whose clock runs ahead of
    /// the store's, which decides on its own reading of it, cannot commit it early.
    NotBefore(Timestamp),
}

impl Write {
    /// Which record this write is conditional on.
    pub fn key(&self) -> Key {
        match self {
            Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => Key::Sandbox(s.id.clone()),
            Write::RemoveSandbox { id, .. } | Write::CheckSandbox { id, .. } => Key::Sandbox(id.clone()),
            Write::CreateProvider(p) | Write::UpdateProvider { record: p, .. } => Key::Provider(p.name.clone()),
            Write::RemoveProvider { name, .. } => Key::Provider(name.clone()),
            Write::CreateExec(e) | Write::UpdateExec { record: e, .. } => Key::Exec(e.sandbox.clone(), e.id.clone()),
            Write::CreateTemplate(t) | Write::UpdateTemplate { record: t, .. } => Key::Template(t.name.clone()),
            Write::RemoveTemplate { name, .. } => Key::Template(name.clone()),
            Write::CreateSnapshot(s) | Write::UpdateSnapshot { record: s, .. } => Key::Snapshot(s.name.clone()),
            Write::RemoveSnapshot { name, .. } => Key::Snapshot(name.clone()),
            Write::CreateVolume(v) | Write::UpdateVolume { record: v, .. } => Key::Volume(v.name.clone()),
            Write::RemoveVolume { name, .. } => Key::Volume(name.clone()),
            Write::NotBefore(_) => Key::Clock,
        }
    }

    /// The version the record must have for the write to apply; `None` means it must not exist.
    pub fn expected(&self) -> Option<u64> {
        match self {
            Write::CreateSandbox(_)
            | Write::CreateProvider(_)
            | Write::CreateExec(_)
            | Write::CreateTemplate(_)
            | Write::CreateSnapshot(_)
            | Write::CreateVolume(_) => None,
            Write::UpdateSandbox { expected, .. }
            | Write::RemoveSandbox { expected, .. }
            | Write::UpdateProvider { expected, .. }
            | Write::RemoveProvider { expected, .. }
            | Write::CheckSandbox { expected, .. }
            | Write::UpdateExec { expected, .. }
            | Write::UpdateTemplate { expected, .. }
            | Write::RemoveTemplate { expected, .. }
            | Write::UpdateSnapshot { expected, .. }
            | Write::RemoveSnapshot { expected, .. }
            | Write::UpdateVolume { expected, .. }
            | Write::RemoveVolume { expected, .. } => Some(*expected),
            // The time, in the store's milliseconds, that its clock must have reached.
            Write::NotBefore(at) => Some(clock_millis(*at)),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Sandbox(SandboxId),
    Provider(String),
    Exec(SandboxId, ExecId),
    Template(String),
    Snapshot(String),
    Volume(String),
    /// The store's clock ([`Write::NotBefore`]): a conflict on it has the time the write
    /// expected and the store's clock as it read it, in unix milliseconds.
    Clock,
}

/// A time as a [`Key::Clock`] conflict says it.
pub fn clock_millis(at: Timestamp) -> u64 {
    u64::try_from(at.unix_millis()).unwrap_or(0)
}

/// What a store reports when a condition of a transaction does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub key: Key,
    /// What the write expected (`None`: that the record does not exist).
    pub expected: Option<u64>,
    /// What the store holds (`None`: no such record).
    pub current: Option<u64>,
}

/// A call to the runtime, run after the decision's writes commit. Every effect is idempotent,
/// so recovery may repeat it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Effect {
    /// Make sure the sandbox's compute resource exists (creating it from the spec if it does
    /// not) and that `generation` has run, installing that generation's identity before its
    /// process starts. A driver starts at most one run per generation, and none for a
    /// generation older than one it has started (a late, superseded effect).
    Start { sandbox: SandboxId, generation: u64 },
    /// Stop whatever runs; reply only once it has fully exited, with the final state.
    Stop { sandbox: SandboxId, generation: u64 },
    /// Hold every process of `generation`'s run as `hold` says, keeping its memory (DESIGN
    /// 12.1); reply with the state it left the run in. A run already so held is success.
    Pause { sandbox: SandboxId, generation: u64, hold: Hold },
    /// Thaw or restore `generation`'s run; a run not held is success.
    Resume { sandbox: SandboxId, generation: u64 },
    /// Remove the compute resource and everything made for it; absence is success.
    Delete { sandbox: SandboxId },
    /// Copy `sandbox`'s files as snapshot `snapshot` (DESIGN 12.2), freezing a live run for the
    /// moment of the copy; reply with what was kept. A copy once made is answered again, never
    /// made anew.
    Snapshot { snapshot: SnapshotId, name: String, sandbox: SandboxId },
    /// Remove everything the runtime keeps of snapshot `snapshot`; absence is success.
    RemoveSnapshot { snapshot: SnapshotId, name: String },
    /// Remove everything the runtime keeps of volume `volume` (DESIGN 13.2); absence is
    /// success. Asked for only once no sandbox record mounting it is left.
    RemoveVolume { volume: VolumeId, name: String },
}

/// What an effect acts on: the effects of one subject run one after another, in order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    Sandbox(SandboxId),
    /// A snapshot's taking and its removal never overlap: a removal cannot run under a copy
    /// still being written. The driver orders a copy with its sandbox's own effects.
    Snapshot(SnapshotId),
    Volume(VolumeId),
}

impl Effect {
    pub fn subject(&self) -> Subject {
        match self {
            Effect::Start { sandbox, .. }
            | Effect::Stop { sandbox, .. }
            | Effect::Pause { sandbox, .. }
            | Effect::Resume { sandbox, .. }
            | Effect::Delete { sandbox } => Subject::Sandbox(sandbox.clone()),
            Effect::Snapshot { snapshot, .. } | Effect::RemoveSnapshot { snapshot, .. } => {
                Subject::Snapshot(snapshot.clone())
            }
            Effect::RemoveVolume { volume, .. } => Subject::Volume(volume.clone()),
        }
    }

    /// Whether carrying it out makes a run go (a start, a resume): what a node whose lease is
    /// in doubt must not do ([`crate::fencing::may_run`]). Stopping, pausing or removing one
    /// never adds a run.
    pub fn makes_a_run(&self) -> bool {
        matches!(self, Effect::Start { .. } | Effect::Resume { .. })
    }
}

/// What the caller gets back.
// The records are boxed so that the outcome most decisions carry (a merge's `Written` or
// `Unchanged`) does not make every `Result<Decision, _>` the size of a record, moved and copied
// on each return: one allocation for a command's reply is cheaper than that on every merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Sandbox(Box<Sandbox>),
    Provider(Box<Provider>),
    Template(Box<Template>),
    Snapshot(Box<Snapshot>),
    Volume(Box<Volume>),
    /// The exec as an exec rule leaves it ([`crate::exec`]).
    Exec(Box<Exec>),
    /// The record is gone (or, for an observation, there was none).
    Removed,
    /// The record as read is still current: what a merge that changes nothing answers, so that
    /// the reports most merges are (a steady poll, a stale snapshot) copy nothing.
    Unchanged,
    /// The sandbox as the decision's write records it: what a merge that changes the record
    /// answers, so that the record is not copied a second time ([`Decision::sandbox`] reads it).
    Written,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub writes: Vec<Write>,
    pub effects: Vec<Effect>,
    pub outcome: Outcome,
}

impl Decision {
    pub(crate) fn unchanged(outcome: Outcome, effects: Vec<Effect>) -> Self {
        Self { writes: Vec::new(), effects, outcome }
    }

    /// The answer of a command that finds nothing to do: the sandbox as it is.
    pub(crate) fn sandbox_as_is(sandbox: &Sandbox) -> Self {
        Self::unchanged(Outcome::Sandbox(Box::new(sandbox.clone())), Vec::new())
    }

    /// The answer of a template command that finds nothing to do: the template as it is.
    pub(crate) fn template_as_is(template: &Template) -> Self {
        Self::unchanged(Outcome::Template(Box::new(template.clone())), Vec::new())
    }

    /// The answer of a command whose record is gone: nothing to do, reported as removed.
    pub fn gone() -> Self {
        Self::unchanged(Outcome::Removed, Vec::new())
    }

    /// The sandbox this decision leaves: its outcome's, or the one its write records.
    pub fn sandbox(&self) -> Option<&Sandbox> {
        match &self.outcome {
            Outcome::Sandbox(s) => Some(s),
            Outcome::Written => self.writes.iter().find_map(|w| match w {
                Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => Some(s),
                _ => None,
            }),
            _ => None,
        }
    }

    /// The exec an exec rule's decision leaves.
    pub fn exec(&self) -> Option<&Exec> {
        match &self.outcome {
            Outcome::Exec(e) => Some(e),
            _ => None,
        }
    }

    /// The phase change this decision makes to `before`, for logging: `(old, new)`, with `None`
    /// for a record that does not exist on that side.
    pub fn phase_change(&self, before: Option<&Sandbox>) -> Option<(Option<PhaseKind>, Option<PhaseKind>)> {
        let old = before.map(|s| s.phase.kind());
        let new = match (&self.outcome, self.sandbox()) {
            (_, Some(s)) => Some(s.phase.kind()),
            (Outcome::Removed, _) => None,
            _ => return None,
        };
        (old != new && !self.writes.is_empty()).then_some((old, new))
    }
}

/// The next version of `before`: `resource_version` + 1 and `updated_at` = `now`.
pub(crate) fn update_sandbox(before: &Sandbox, mut next: Sandbox, now: Timestamp) -> (Write, Sandbox) {
    next_version(before, &mut next, now);
    (Write::UpdateSandbox { record: next.clone(), expected: before.resource_version }, next)
}

/// Makes `next` the version after `before`, written at `now`.
pub(crate) fn next_version(before: &Sandbox, next: &mut Sandbox, now: Timestamp) {
    next.resource_version = before.resource_version + 1;
    next.updated_at = now;
}

/// Records the attachment of `provider` in its version, so that a racing provider delete conflicts.
pub(crate) fn touch_provider(provider: &Provider, now: Timestamp) -> Write {
    let mut next = provider.clone();
    next.resource_version += 1;
    next.updated_at = now;
    Write::UpdateProvider { record: next, expected: provider.resource_version }
}
