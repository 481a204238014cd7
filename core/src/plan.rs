//! What each command reads, holds and is called: one exhaustive match, so that a new command
//! cannot compile with a read plan it did not spell out.
//!
//! The executor reads what the plan names, holds the plan's locks (its writers take turns on a
//! record, [`Plan::locks`]) while it reads, decides and commits, and names the command by
//! [`Plan::name`] in its logs and metrics. [`crate::decide`] checks the names the plan
//! carries before it decides.

use std::collections::BTreeSet;

use crate::error::{Error, Kind};
use crate::record::{Sandbox, Snapshot};
use crate::request::{Command, Request};
use crate::spec::Mount;
use crate::validate;

/// A name a command carries, with the request field it came from (what a malformed one's
/// INVALID_ARGUMENT names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named<'a> {
    pub field: &'static str,
    pub name: &'a str,
}

/// The providers a command reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderReads<'a> {
    None,
    /// These, and it writes each (an attach bumps its provider's version).
    Each(&'a BTreeSet<String>),
    /// This one, which it writes.
    One(Named<'a>),
    /// The sandbox's attached providers and this one; it writes only this one.
    AttachedAnd(Named<'a>),
}

/// The volumes a command reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeReads<'a> {
    None,
    /// Those its spec mounts, each of which it writes (a mount bumps its volume's version).
    Mounted(&'a [Mount]),
    /// This one, which it writes.
    One(Named<'a>),
}

/// A record a writer holds while it reads, decides and commits. Sandboxes go by name: a command
/// knows the name before it reads anything.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lock {
    Sandbox(String),
    Provider(String),
    Template(String),
    Snapshot(String),
    Volume(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan<'a> {
    /// What logs and metrics call the command.
    pub name: &'static str,
    /// The sandbox it reads (by name) and writes.
    pub sandbox: Option<Named<'a>>,
    /// A sandbox it makes under a name of the executor's choosing: held, not read.
    pub creates: Option<Named<'a>>,
    /// The template it reads and writes.
    pub template: Option<Named<'a>>,
    pub providers: ProviderReads<'a>,
    /// A name it carries that is checked but neither read nor held.
    pub checks: Option<Named<'a>>,
    /// The provider whose users (the sandboxes referencing it) it reads.
    pub users_of: Option<&'a str>,
    /// Whether it reads the template's pool members.
    pub members: bool,
    /// Whether it counts the sandbox's open execs.
    pub open_execs: bool,
    /// The snapshot it reads (by name) and writes.
    pub snapshot: Option<Named<'a>>,
    /// Whether it reads every snapshot (the store's quota).
    pub all_snapshots: bool,
    /// Whether it reads the sandboxes made from the snapshot.
    pub snapshot_users: bool,
    /// Whether it reads which names of the snapshot's fork are taken.
    pub fork_names: bool,
    pub volumes: VolumeReads<'a>,
    /// Whether it reads the sandboxes that mount the volume it names.
    pub volume_users: bool,
    /// Whether it may make a run, and so reads the nodes to place it on (DESIGN 14).
    pub places: bool,
    /// The kind of record a client-supplied version refers to.
    pub subject: Kind,
}

fn named<'a>(field: &'static str, name: &'a str) -> Option<Named<'a>> {
    Some(Named { field, name })
}

impl Command {
    pub fn plan(&self) -> Plan<'_> {
        let base = Plan {
            name: "",
            sandbox: None,
            creates: None,
            template: None,
            providers: ProviderReads::None,
            checks: None,
            users_of: None,
            members: false,
            open_execs: false,
            snapshot: None,
            all_snapshots: false,
            snapshot_users: false,
            fork_names: false,
            volumes: VolumeReads::None,
            volume_users: false,
            places: false,
            subject: Kind::Sandbox,
        };
        // No catch-all arm: each command spells out its whole plan.
        match self {
            Command::CreateSandbox { name, providers, spec, .. } => Plan {
                name: "CreateSandbox",
                sandbox: named("name", name),
                places: true,
                providers: ProviderReads::Each(providers),
                volumes: VolumeReads::Mounted(&spec.volumes),
                ..base
            },
            Command::StopSandbox { name } => Plan { name: "StopSandbox", sandbox: named("name", name), ..base },
            Command::StartSandbox { name } => {
                Plan { name: "StartSandbox", sandbox: named("name", name), places: true, ..base }
            }
            Command::DeleteSandbox { name } => Plan { name: "DeleteSandbox", sandbox: named("name", name), ..base },
            Command::PauseSandbox { name, .. } => Plan { name: "PauseSandbox", sandbox: named("name", name), ..base },
            Command::ResumeSandbox { name } => Plan { name: "ResumeSandbox", sandbox: named("name", name), ..base },
            Command::RenewSandbox { name, .. } => Plan { name: "RenewSandbox", sandbox: named("name", name), ..base },
            Command::ExpireSandbox { name, .. } => Plan { name: "ExpireSandbox", sandbox: named("name", name), ..base },
            Command::ExpireIdle { name, .. } => {
                Plan { name: "ExpireIdle", sandbox: named("name", name), open_execs: true, ..base }
            }
            Command::TouchSandbox { name, .. } => Plan { name: "TouchSandbox", sandbox: named("name", name), ..base },
            Command::RestartSandbox { name } => {
                Plan { name: "RestartSandbox", sandbox: named("name", name), places: true, ..base }
            }
            Command::AttachProvider { sandbox, provider } => Plan {
                name: "AttachProvider",
                sandbox: named("sandbox", sandbox),
                providers: ProviderReads::AttachedAnd(Named { field: "provider", name: provider }),
                ..base
            },
            Command::DetachProvider { sandbox, provider } => Plan {
                name: "DetachProvider",
                sandbox: named("sandbox", sandbox),
                // Read and held by nobody: a provider deleted already can still be detached.
                checks: named("provider", provider),
                ..base
            },
            Command::CreateProvider { name, .. } => Plan {
                name: "CreateProvider",
                providers: ProviderReads::One(Named { field: "name", name }),
                subject: Kind::Provider,
                ..base
            },
            Command::DeleteProvider { name } => Plan {
                name: "DeleteProvider",
                providers: ProviderReads::One(Named { field: "name", name }),
                users_of: Some(name),
                subject: Kind::Provider,
                ..base
            },
            Command::CreateTemplate { name, .. } => {
                Plan { name: "CreateTemplate", template: named("name", name), subject: Kind::Template, ..base }
            }
            Command::SetPool { template, .. } => {
                Plan { name: "SetPool", template: named("template", template), subject: Kind::Template, ..base }
            }
            Command::DeleteTemplate { name } => {
                Plan { name: "DeleteTemplate", template: named("name", name), subject: Kind::Template, ..base }
            }
            Command::FillPool { template, name, .. } => Plan {
                name: "FillPool",
                creates: named("name", name),
                template: named("template", template),
                members: true,
                places: true,
                ..base
            },
            Command::ClaimSandbox { template, providers, .. } => Plan {
                name: "ClaimSandbox",
                template: named("template", template),
                providers: ProviderReads::Each(providers),
                members: true,
                ..base
            },
            Command::CreateSnapshot { name, sandbox, .. } => Plan {
                name: "CreateSnapshot",
                sandbox: named("sandbox", sandbox),
                snapshot: named("name", name),
                all_snapshots: true,
                subject: Kind::Snapshot,
                ..base
            },
            Command::DeleteSnapshot { name } => Plan {
                name: "DeleteSnapshot",
                snapshot: named("name", name),
                snapshot_users: true,
                subject: Kind::Snapshot,
                ..base
            },
            Command::SnapshotTaken { name, .. } => Plan {
                name: "SnapshotTaken",
                snapshot: named("name", name),
                fork_names: true,
                // A fork's sandboxes are made when its snapshot is taken.
                places: true,
                subject: Kind::Snapshot,
                ..base
            },
            Command::SnapshotRemoved { name, .. } => {
                Plan { name: "SnapshotRemoved", snapshot: named("name", name), subject: Kind::Snapshot, ..base }
            }
            Command::CreateFromSnapshot { name, snapshot, providers, .. } => Plan {
                name: "CreateFromSnapshot",
                sandbox: named("name", name),
                places: true,
                snapshot: named("snapshot", snapshot),
                providers: ProviderReads::Each(providers),
                ..base
            },
            Command::ForkSandbox { name, snapshot_name, .. } => Plan {
                name: "ForkSandbox",
                sandbox: named("name", name),
                snapshot: named("snapshot", snapshot_name),
                all_snapshots: true,
                fork_names: true,
                ..base
            },
            Command::CreateVolume { name, .. } => Plan {
                name: "CreateVolume",
                volumes: VolumeReads::One(Named { field: "name", name }),
                subject: Kind::Volume,
                ..base
            },
            Command::DeleteVolume { name } => Plan {
                name: "DeleteVolume",
                volumes: VolumeReads::One(Named { field: "name", name }),
                volume_users: true,
                subject: Kind::Volume,
                ..base
            },
            Command::VolumeRemoved { name, .. } => Plan {
                name: "VolumeRemoved",
                volumes: VolumeReads::One(Named { field: "name", name }),
                volume_users: true,
                subject: Kind::Volume,
                ..base
            },
        }
    }
}

impl<'a> Plan<'a> {
    /// The providers to read, once the sandbox has been read.
    pub fn providers_to_read(&self, sandbox: Option<&Sandbox>) -> BTreeSet<String> {
        match self.providers {
            ProviderReads::None => BTreeSet::new(),
            ProviderReads::Each(names) => names.clone(),
            ProviderReads::One(p) => [p.name.to_string()].into(),
            ProviderReads::AttachedAnd(p) => {
                let mut names = sandbox.map(|s| BTreeSet::clone(&s.providers)).unwrap_or_default();
                names.insert(p.name.to_string());
                names
            }
        }
    }

    /// The volumes to read: the names its spec mounts, or the one it names.
    pub fn volumes_to_read(&self) -> BTreeSet<&'a str> {
        match self.volumes {
            VolumeReads::None => BTreeSet::new(),
            VolumeReads::Mounted(mounts) => mounts.iter().map(|m| m.volume.as_str()).collect(),
            VolumeReads::One(v) => [v.name].into(),
        }
    }

    /// The records its writer holds: the sandbox it names or makes, its template, and the
    /// providers and volumes whose versions it bumps or whose record it makes or removes.
    pub fn locks(&self) -> BTreeSet<Lock> {
        let mut locks = BTreeSet::new();
        locks.extend(self.sandbox.iter().chain(&self.creates).map(|s| Lock::Sandbox(s.name.to_string())));
        // Claims and fills of one template take turns here; those of other gateways conflict.
        locks.extend(self.template.map(|t| Lock::Template(t.name.to_string())));
        locks.extend(self.snapshot.map(|s| Lock::Snapshot(s.name.to_string())));
        locks.extend(self.volumes_to_read().into_iter().map(|v| Lock::Volume(v.to_string())));
        match self.providers {
            ProviderReads::None => {}
            ProviderReads::Each(names) => locks.extend(names.iter().cloned().map(Lock::Provider)),
            ProviderReads::One(p) | ProviderReads::AttachedAnd(p) => {
                locks.insert(Lock::Provider(p.name.to_string()));
            }
        }
        locks
    }

    /// The record a client-supplied version refers to: `(kind, name)`.
    pub fn subject(&self) -> (Kind, &'a str) {
        let name = match self.subject {
            Kind::Provider => match self.providers {
                ProviderReads::One(p) => Some(p.name),
                _ => None,
            },
            Kind::Template => self.template.map(|t| t.name),
            Kind::Snapshot => self.snapshot.map(|s| s.name),
            Kind::Volume => match self.volumes {
                VolumeReads::One(v) => Some(v.name),
                _ => None,
            },
            _ => self.sandbox.map(|s| s.name),
        };
        (self.subject, name.unwrap_or_default())
    }

    /// Names are DNS labels everywhere: a malformed one is INVALID_ARGUMENT, never NOT_FOUND.
    pub(crate) fn validate_names(&self) -> Result<(), Error> {
        for s in self.sandbox.iter().chain(&self.creates).chain(&self.snapshot) {
            validate::dns_label(s.field, s.name)?;
        }
        if let Some(t) = self.template {
            validate::template_name(t.field, t.name)?;
        }
        let provider = match self.providers {
            ProviderReads::One(p) | ProviderReads::AttachedAnd(p) => Some(p),
            ProviderReads::None | ProviderReads::Each(_) => None,
        };
        let volume = match self.volumes {
            VolumeReads::One(v) => Some(v),
            VolumeReads::None | VolumeReads::Mounted(_) => None,
        };
        for p in provider.iter().chain(&self.checks) {
            validate::dns_label(p.field, p.name)?;
        }
        if let Some(v) = volume {
            validate::volume_name(v.field, v.name)?;
        }
        Ok(())
    }
}

impl Request {
    pub fn plan(&self) -> Plan<'_> {
        self.command.plan()
    }

    /// The names of the sandboxes a fork is to make ([`Plan::fork_names`]), from the command
    /// or, once its snapshot is taken, from the snapshot as read: the executor reads which of
    /// them are taken.
    pub fn fork_names<'r>(&'r self, snapshot: Option<&'r Snapshot>) -> Vec<&'r str> {
        let forks = match &self.command {
            Command::ForkSandbox { forks, .. } => forks,
            Command::SnapshotTaken { .. } => match snapshot.and_then(|s| s.fork.as_ref()) {
                Some(fork) => &fork.sandboxes,
                None => return Vec::new(),
            },
            _ => return Vec::new(),
        };
        forks.iter().map(|(_, name)| name.as_str()).collect()
    }

    /// The client's version against the current one of the record the plan names: a stale one
    /// is ABORTED with both versions.
    pub(crate) fn check_version(&self, current: u64) -> Result<(), Error> {
        match self.expected_version {
            Some(expected) if expected != current => {
                let (kind, name) = self.plan().subject();
                Err(Error::StaleVersion { kind, name: name.to_string(), expected, current: Some(current) })
            }
            _ => Ok(()),
        }
    }

    /// Creates take no version but "must not exist", which 0 also says.
    pub(crate) fn check_create_version(&self) -> Result<(), Error> {
        match self.expected_version {
            None | Some(0) => Ok(()),
            Some(_) => Err(Error::invalid("expected_resource_version", "must be empty or 0 when creating")),
        }
    }
}
