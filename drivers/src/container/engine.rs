//! The engine: the one part of the container driver that differs between Docker and Podman, and
//! what it says of containers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::limits::ResourceLimits;
use berth_core::{ExitMarker, Hold, RuntimeState, SandboxId, Timestamp};
use futures_util::Stream;
use serde::{Deserialize, Serialize};

use super::{LABEL_OWNER, LABEL_STORE};
use crate::DriverError;
use crate::snapshot::Copying;

/// A bind mount from the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// A runtime volume mounted into a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedMount {
    pub name: String,
    pub target: String,
    pub read_only: bool,
}

/// Everything an engine needs to create a sandbox's container.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub entrypoint: Vec<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub binds: Vec<Bind>,
    /// The named volumes it mounts: its workspace first, then the user volumes it names.
    pub volumes: Vec<NamedMount>,
    pub workdir: String,
    pub stop_grace: Duration,
    /// Enforced by the runtime's cgroups.
    pub limits: ResourceLimits,
}

impl ContainerSpec {
    /// The labels of a volume it mounts: its workspace's are the container's, a user volume's
    /// only say whose store it is in, as it outlives every sandbox that mounts it.
    pub fn volume_labels(&self, volume: &NamedMount) -> BTreeMap<String, String> {
        let workspace = self.volumes.first() == Some(volume);
        self.labels
            .iter()
            .filter(|(key, _)| workspace || [LABEL_OWNER, LABEL_STORE].contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    /// Running, with every process held by the freezer.
    Paused,
    Exited,
    /// Being removed, or a state Berth does not use (restarting).
    Other,
}

/// What an engine's start did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    Began,
    /// The container was running already (Docker's and Podman's 304): its run is not this
    /// start's.
    WasRunning,
}

/// What an engine shows of one container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inspection {
    pub status: Status,
    /// The last run's start and finish (an engine keeps the previous finish while running).
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub exit_code: i32,
    /// The runtime's `OOMKilled`: the kernel killed something of the last run for memory.
    pub out_of_memory: bool,
    /// Podman's `Checkpointed`: the last run was written to a checkpoint and its processes
    /// ended (the container shows exited).
    pub checkpointed: bool,
    /// Podman's `Restored`: the run was restored from a checkpoint (its start time is the
    /// restore's).
    pub restored: bool,
}

/// The driver's record of a run it checkpointed (DESIGN 12.1), kept beside its start record:
/// the runtime shows a checkpointed run as exited, and its restore as a new start, so only this
/// says that the run is the one that started at `run_started_at`, held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The start of the run checkpointed, as the runtime first reported it.
    pub run_started_at: Timestamp,
    /// A stop ended the checkpointed run: it is not restored, and shows as the exit it is.
    pub ended: bool,
}

impl Inspection {
    /// What the runtime shows, given the driver's record of a run it checkpointed.
    pub fn state(&self, checkpoint: Option<Checkpoint>) -> RuntimeState {
        // A restored run is the checkpointed one, under its first start time: taken for a new
        // start, it would look restarted out of band (a resume that loses its run).
        let started_at = match checkpoint {
            Some(c) if self.restored && !berth_core::bug!(RestoreForgetsStart) => Some(c.run_started_at),
            _ => self.started_at,
        };
        match (self.status, started_at) {
            (Status::Running | Status::Paused | Status::Other, Some(started_at)) => {
                let held = (self.status == Status::Paused).then_some(Hold::Freezer);
                RuntimeState::Running { started_at, held }
            }
            // One checkpointed by somebody else (`podman container checkpoint`) ended as far as
            // Berth knows: only a restore outside Berth could bring that run back.
            (Status::Exited, Some(started_at)) => match checkpoint {
                Some(c) if self.checkpointed && !c.ended => {
                    RuntimeState::Running { started_at: c.run_started_at, held: Some(Hold::Checkpoint) }
                }
                Some(c) if self.checkpointed => self.exit(c.run_started_at),
                _ => self.exit(started_at),
            },
            _ => RuntimeState::Created,
        }
    }

    fn exit(&self, started_at: Timestamp) -> RuntimeState {
        RuntimeState::Exited(ExitMarker {
            started_at,
            finished_at: self.finished_at.filter(|f| *f > started_at).unwrap_or(Timestamp(started_at.0 + 1)),
            exit_code: self.exit_code,
            out_of_memory: self.out_of_memory,
        })
    }

    /// Whether a run is alive, frozen or not.
    pub(super) fn running(&self) -> bool {
        matches!(self.status, Status::Running | Status::Paused)
    }
}

/// A container event, already narrowed to Berth's sandboxes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineEvent {
    pub sandbox: SandboxId,
    /// The container is gone.
    pub removed: bool,
    /// The runtime's time of the event.
    pub at: Timestamp,
}

pub type EventStream = Pin<Box<dyn Stream<Item = Result<EngineEvent, EngineError>> + Send>>;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("not found: {0}")]
    NotFound(String),
    /// The runtime answered and refused (a missing image, a conflict, a bad spec).
    #[error("refused: {0}")]
    Refused(String),
    /// The runtime could not be reached, or failed on its side.
    #[error("unreachable: {0}")]
    Unreachable(String),
}

impl From<EngineError> for DriverError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Unreachable(m) => DriverError::Unavailable(m),
            EngineError::NotFound(m) | EngineError::Refused(m) => DriverError::Failed(m),
        }
    }
}

/// One runtime's API, as the container driver uses it.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// The gateway instance whose containers this engine sees.
    fn owner(&self) -> &str;
    /// The store whose containers this engine sees and labels, when it is bound to one.
    fn store(&self) -> Option<&str>;
    /// How many CPUs the runtime's host has (read when it connected): the most a CPU limit can
    /// give.
    fn cpus(&self) -> u64;
    /// Where the driver copies a workspace for a snapshot or a seed.
    fn copying(&self) -> Copying {
        Copying::Blocking
    }
    async fn create(&self, spec: &ContainerSpec) -> Result<(), EngineError>;
    async fn start(&self, container: &str) -> Result<Start, EngineError>;
    /// SIGTERM, then SIGKILL after `grace`.
    async fn stop(&self, container: &str, grace: Duration) -> Result<(), EngineError>;
    /// Freezes every process of a running container (the cgroup freezer).
    async fn pause(&self, container: &str) -> Result<(), EngineError>;
    /// Thaws a paused container.
    async fn unpause(&self, container: &str) -> Result<(), EngineError>;
    /// Whether this runtime can checkpoint a run to disk here (DESIGN 12.1): why not, if not.
    fn checkpoints(&self) -> Result<(), String>;
    /// Writes a running container's run to a checkpoint, ending its processes.
    async fn checkpoint(&self, container: &str) -> Result<(), EngineError>;
    /// Restores a checkpointed container's run.
    async fn restore(&self, container: &str) -> Result<(), EngineError>;
    /// Removes the container, forcibly; absence is success.
    async fn remove(&self, container: &str) -> Result<(), EngineError>;
    /// Creates a labelled volume; an existing one is success.
    async fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<(), EngineError>;
    /// Removes a volume; absence is success.
    async fn remove_volume(&self, name: &str) -> Result<(), EngineError>;
    /// Where a volume's content is on this host; `None` if there is no such volume.
    async fn volume_path(&self, name: &str) -> Result<Option<PathBuf>, EngineError>;
    async fn inspect(&self, container: &str) -> Result<Option<Inspection>, EngineError>;
    /// Every container of this owner, by sandbox id.
    async fn list(&self) -> Result<Vec<SandboxId>, EngineError>;
    /// Every volume of this owner.
    async fn list_volumes(&self) -> Result<Vec<String>, EngineError>;
    /// Container events of this owner's sandboxes, from now on.
    async fn events(&self) -> Result<EventStream, EngineError>;
    /// Imports a root filesystem tarball as an image.
    async fn import_image(&self, reference: &str, rootfs: Vec<u8>) -> Result<(), EngineError>;
    /// Commits the container's filesystem as image `reference`, without pausing it (the
    /// caller froze it, or it is not running).
    async fn commit(&self, container: &str, reference: &str) -> Result<(), EngineError>;
    /// Gives image `source` the further name `target`.
    async fn tag_image(&self, source: &str, target: &str) -> Result<(), EngineError>;
    /// Removes the name `reference` (the image with it once no other name or container holds
    /// it); absence is success. Never by force: a container using it keeps running.
    async fn remove_image(&self, reference: &str) -> Result<(), EngineError>;
    /// The tags of `repository`'s images.
    async fn image_tags(&self, repository: &str) -> Result<Vec<String>, EngineError>;
}

/// A runtime timestamp from RFC 3339 (as both APIs print them); the zero time means "never".
pub fn parse_time(text: &str) -> Option<Timestamp> {
    let t = humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()?;
    let nanos = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(Timestamp::from_unix_nanos(i64::try_from(nanos).ok()?)).filter(|t| t.0 > 0)
}
