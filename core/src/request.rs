//! What the rules are asked to decide: a command (DESIGN 3.2), the version its client expects,
//! and what the executor read for it.

use std::collections::{BTreeMap, BTreeSet};

use core::time::Duration;

use crate::allowlist::Policy;
use crate::id::{SandboxId, SnapshotId, VolumeId};
use crate::phase::Hold;
use crate::placement::Node;
use crate::record::{Content, Provider, Sandbox, Secret, Snapshot, Template, Volume};
use crate::spec::SandboxSpec;
use crate::time::Timestamp;
use crate::validate::Limits;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `deadline`: an absolute deadline; without one, the spec's TTL (if any) sets it.
    CreateSandbox {
        id: SandboxId,
        name: String,
        spec: SandboxSpec,
        providers: BTreeSet<String>,
        deadline: Option<Timestamp>,
    },
    StopSandbox {
        name: String,
    },
    StartSandbox {
        name: String,
    },
    DeleteSandbox {
        name: String,
    },
    /// DESIGN 12.1: freeze a Ready sandbox's run, or checkpoint it to disk.
    PauseSandbox {
        name: String,
        hold: Hold,
    },
    /// DESIGN 12.1: thaw a paused sandbox's run.
    ResumeSandbox {
        name: String,
    },
    /// Sets a new deadline (DESIGN 9.1).
    RenewSandbox {
        name: String,
        renewal: Renewal,
    },
    /// Server-owned, by the reconcile lease holder: `deadline` has passed. A no-op unless the
    /// record still has that deadline.
    ExpireSandbox {
        name: String,
        deadline: Timestamp,
    },
    /// Server-owned, by the reconcile lease holder: the idle timeout counted from `since` has
    /// passed. A no-op unless the record's last activity is still `since` and no exec is open.
    ExpireIdle {
        name: String,
        since: Timestamp,
    },
    /// Server-owned: activity on the sandbox `id` named `name` (an attach or logs-follow
    /// stream), which restarts its idle clock.
    TouchSandbox {
        name: String,
        id: SandboxId,
    },
    /// Server-owned, by the reconcile lease holder: the restart the policy scheduled is due.
    RestartSandbox {
        name: String,
    },
    AttachProvider {
        sandbox: String,
        provider: String,
    },
    DetachProvider {
        sandbox: String,
        provider: String,
    },
    CreateProvider {
        name: String,
        kind: String,
        credentials: BTreeMap<String, Secret>,
        /// Where the credentials are for (DESIGN 10).
        endpoints: Policy,
    },
    DeleteProvider {
        name: String,
    },
    /// DESIGN 9.4: a named spec and the size of its warm pool.
    CreateTemplate {
        name: String,
        spec: SandboxSpec,
        min_ready: u32,
    },
    SetPool {
        template: String,
        min_ready: u32,
    },
    DeleteTemplate {
        name: String,
    },
    /// Server-owned, by the reconcile lease holder: one new member if the pool is short.
    FillPool {
        template: String,
        id: SandboxId,
        name: String,
    },
    /// One Ready member of the template's pool, with these labels and providers added.
    ClaimSandbox {
        template: String,
        labels: BTreeMap<String, String>,
        providers: BTreeSet<String>,
    },
    /// DESIGN 12.2: a snapshot `name` of sandbox `sandbox`.
    CreateSnapshot {
        id: SnapshotId,
        name: String,
        sandbox: String,
    },
    DeleteSnapshot {
        name: String,
    },
    /// Server-owned: the runtime's answer to snapshot `id`'s copy: what it kept, or why none.
    SnapshotTaken {
        name: String,
        id: SnapshotId,
        result: Result<Content, String>,
    },
    /// Server-owned: the runtime removed everything of snapshot `id`.
    SnapshotRemoved {
        name: String,
        id: SnapshotId,
    },
    /// DESIGN 12.2: a new sandbox with the snapshot's spec, image and files; `labels` are added
    /// to the spec's.
    CreateFromSnapshot {
        id: SandboxId,
        name: String,
        snapshot: String,
        labels: BTreeMap<String, String>,
        providers: BTreeSet<String>,
        deadline: Option<Timestamp>,
    },
    /// DESIGN 12.3: `forks` (ids and names) made from one snapshot of sandbox `name`, taken as
    /// `snapshot`; `labels` are added to each.
    ForkSandbox {
        name: String,
        snapshot: SnapshotId,
        snapshot_name: String,
        forks: Vec<(SandboxId, String)>,
        labels: BTreeMap<String, String>,
    },
    /// DESIGN 13.2: a volume `name`.
    CreateVolume {
        id: VolumeId,
        name: String,
    },
    DeleteVolume {
        name: String,
    },
    /// Server-owned: the runtime removed everything of volume `id`.
    VolumeRemoved {
        name: String,
        id: VolumeId,
    },
}

/// A command and the version the client expects its record to have, if it said one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub expected_version: Option<u64>,
}

/// What the executor read before deciding (read again before every retry).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// The sandbox the plan names ([`crate::plan::Plan::sandbox`]).
    pub sandbox: Option<Sandbox>,
    /// The providers the plan reads ([`crate::plan::Plan::providers_to_read`]) that exist.
    pub providers: BTreeMap<String, Provider>,
    /// For a provider delete: every sandbox that references it.
    pub users: Vec<Sandbox>,
    /// The gateway's bounds (configuration, not a read, but an input all the same).
    pub limits: Limits,
    /// The template the plan names.
    pub template: Option<Template>,
    /// For a fill or a claim: the template's pool members not yet claimed.
    pub members: Vec<Sandbox>,
    /// For an idle expiry: how many of the sandbox's execs are not yet ended.
    pub open_execs: usize,
    /// The snapshot the plan names.
    pub snapshot: Option<Snapshot>,
    /// Every snapshot, for the store's quota.
    pub snapshots: Vec<Snapshot>,
    /// For a snapshot delete: the sandboxes made from it (by its label), in any phase.
    pub snapshot_users: Vec<Sandbox>,
    /// For a fork's snapshot: which of the names its sandboxes are to have are taken.
    pub names_taken: BTreeSet<String>,
    /// The volumes the plan reads ([`crate::plan::Plan::volumes`]) that exist.
    pub volumes: BTreeMap<String, Volume>,
    /// For a volume's delete and removal: the sandboxes that mount it, in any phase.
    pub volume_users: Vec<Sandbox>,
    /// For a command that may make a run: every node, as placement sees it (DESIGN 14).
    pub nodes: Vec<Node>,
}

impl Request {
    pub fn new(command: Command, expected_version: Option<u64>) -> Self {
        Self { command, expected_version }
    }
}

/// How a renew sets the deadline: to a time, or to `now` plus a TTL (the spec's if none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Renewal {
    #[default]
    SpecTtl,
    Ttl(Duration),
    Deadline(Timestamp),
}
