//! Container drivers. Docker and Podman run a sandbox the same way; only their APIs differ, so
//! the driver contract is implemented once, here, over an [`Engine`] per runtime.
//!
//! A sandbox is one container, `berth-<id>`, labelled as Berth's, on no network, its workspace
//! a named volume that survives stop and start. Its entrypoint is the host's static
//! `berth-supervisor`, mounted read-only, with the user's command as its child, so any image
//! works. Per sandbox, a host directory mounted read-only at `/run/berth/state` holds what
//! changes with each generation and is written before every start: the run's token and its
//! environment (the spec's and the attached providers'), and the driver's own record of which
//! generation it started last. The gateway's supervisor socket reaches the container through a
//! mounted directory, so it survives the gateway replacing the socket.
//!
//! Gateways sharing a store on one host share this state directory and the runtime; a file lock
//! per sandbox (see `sandbox_lock`) keeps two of them from acting on one sandbox at once.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::record::Content;
use berth_core::start_gate::{self, Gate, StartRecord};
use berth_core::{Hold, RuntimeState, SandboxId, SandboxSpec, SnapshotId, StartReply, Timestamp, VolumeId};
use berth_handoff::began;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

#[cfg(feature = "fault-points")]
use crate::cut_short;
use crate::sandbox_lock::SandboxLocks;
use crate::snapshot::Snapshots;
use crate::state_file;
use crate::tombstone::{self, Tombstones};
use crate::{CrashPoint, Driver, DriverError, Launch, ListPage, WatchEvent, WatchStream, crashed, io, removed};

pub mod docker;
mod engine;
pub mod image;
mod layout;
mod names;
pub mod podman;
#[cfg(test)]
mod tests;

pub use engine::{
    Bind, Checkpoint, ContainerSpec, Engine, EngineError, EngineEvent, EventStream, Inspection, NamedMount, Start,
    Status, parse_time,
};
pub use names::{
    LABEL_NAME, LABEL_OWNER, LABEL_SANDBOX, LABEL_STORE, SEED_REPOSITORY, SNAPSHOT_REPOSITORY, container_name,
    of_store, sandbox_of_container, seed_image, snapshot_image, user_volume_name, user_volume_of, volume_name,
};

/// How long a stop may take beyond its grace period before the driver gives up waiting.
const STOP_SLACK: Duration = Duration::from_secs(10);
/// How long an older generation's run may take to stop when a newer one replaces it.
const REPLACE_GRACE: Duration = Duration::from_secs(10);
/// The capability every sandbox goes without: making device nodes.
pub(crate) const NO_DEVICE_NODES: &str = "MKNOD";
/// How long a start waits for a run it did not begin to say which generation it began as
/// (`--began-file`, in the logs' host directory).
const BEGAN_WAIT: Duration = Duration::from_secs(2);

/// Where the container driver finds what it mounts into every sandbox.
#[derive(Clone, Debug)]
pub struct ContainerConfig {
    /// Per-sandbox host state: `<data dir>/<runtime>/<sandbox id>/`.
    pub root: PathBuf,
    /// A statically linked `berth-supervisor`.
    pub supervisor: PathBuf,
    /// The directory holding the gateways' supervisor sockets: the supervisor connects to any
    /// of them.
    pub socket_dir: PathBuf,
}

/// The start gate's record (berth-core's [`start_gate`]), beside the sandbox's state. It is
/// written before the runtime is asked to start the container, with the container's start time
/// as it was then: a gateway that dies before confirming leaves a run whose start time is later,
/// which the next start of that generation adopts instead of stopping it and starting another
/// (defect 2 of issue 13).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Started {
    #[serde(flatten)]
    gate: StartRecord,
    /// The container's last start before this generation's was asked for.
    previous: Option<Timestamp>,
    /// The generation's run, checkpointed by this driver.
    #[serde(default)]
    checkpoint: Option<Checkpoint>,
}

impl Started {
    fn new(gate: StartRecord, previous: Option<Timestamp>) -> Self {
        Self { gate, previous, checkpoint: None }
    }
}

/// The driver's record in a sandbox's state directory `dir`.
fn started_in(dir: &Path) -> Result<Option<Started>, DriverError> {
    let Some(file) = state_file::read_json(&dir.join("driver.json"))? else { return Ok(None) };
    Ok(Some(match file {
        DriverFile::Started(started) => started,
        DriverFile::Legacy { generation } => Started::new(StartRecord::confirmed(generation), None),
    }))
}

/// What the runtime's `inspection` of the sandbox whose state directory is `dir` shows, read
/// with the driver's record of a run it checkpointed.
fn seen_in(dir: &Path, inspection: &Inspection) -> Result<RuntimeState, DriverError> {
    Ok(inspection.state(started_in(dir)?.and_then(|s| s.checkpoint)))
}

/// `driver.json` as it may be: from before the start gate, a confirmed generation.
#[derive(Deserialize)]
#[serde(untagged)]
enum DriverFile {
    Started(Started),
    Legacy { generation: u64 },
}

pub struct ContainerDriver<E> {
    engine: Arc<E>,
    config: ContainerConfig,
    locks: SandboxLocks,
    tombstones: Tombstones,
    snapshots: Snapshots,
    /// Held while an image is given a name: a runtime may lose one of two names given one image
    /// at once (Podman's tag reads the image's names and writes them back).
    naming: tokio::sync::Mutex<()>,
}

/// A start that cannot give its sandbox its snapshot's files or image fails as one the runtime
/// refused does; one the runtime did not answer is tried again.
fn unseeded(e: DriverError) -> Result<StartReply, DriverError> {
    match e {
        DriverError::Failed(message) => Ok(StartReply::Failed { message }),
        e => Err(e),
    }
}

/// Whether an executable is statically linked (has no ELF interpreter): a container's
/// userland may have no C library to run anything else.
pub fn is_static(path: &Path) -> std::io::Result<bool> {
    let bytes = std::fs::read(path)?;
    let field = |at: usize, len: usize| -> Option<u64> {
        let b = bytes.get(at..at + len)?;
        Some(b.iter().rev().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))
    };
    let elf64 = bytes.get(0..5) == Some(b"\x7fELF\x02");
    let (Some(phoff), Some(phentsize), Some(phnum)) = (field(32, 8), field(54, 2), field(56, 2)) else {
        return Ok(false);
    };
    if !elf64 {
        return Ok(false);
    }
    const PT_INTERP: u64 = 3;
    Ok((0..phnum).all(|i| field((phoff + i * phentsize) as usize, 4) != Some(PT_INTERP)))
}

impl<E: Engine> ContainerDriver<E> {
    /// The driver of `engine`, once it made sure `config.supervisor` can run in any image.
    pub fn new(engine: E, config: ContainerConfig) -> Result<Self, DriverError> {
        match is_static(&config.supervisor) {
            Ok(true) => {}
            Ok(false) => {
                return Err(DriverError::Failed(format!(
                    "{} is not a statically linked berth-supervisor; containers need one (see the README)",
                    config.supervisor.display()
                )));
            }
            Err(e) => return Err(io(&format!("reading {}", config.supervisor.display()), e)),
        }
        Self::over(engine, config)
    }

    /// The driver of `engine` with no look at the supervisor it mounts: for a runtime that runs
    /// no executable, the simulator's.
    pub fn over(engine: E, config: ContainerConfig) -> Result<Self, DriverError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.root)
            .map_err(|e| io(&format!("creating {}", config.root.display()), e))?;
        let locks = SandboxLocks::new(config.root.clone());
        let tombstones = Tombstones::new(&config.root);
        let snapshots = Snapshots::under(&config.root, engine.copying());
        let naming = tokio::sync::Mutex::new(());
        Ok(Self { engine: Arc::new(engine), config, locks, tombstones, snapshots, naming })
    }

    pub fn engine(&self) -> &E {
        &self.engine
    }

    fn started(&self, sandbox: &SandboxId) -> Result<Option<Started>, DriverError> {
        started_in(&self.dir(sandbox))
    }

    fn seen(&self, sandbox: &SandboxId, inspection: &Inspection) -> Result<RuntimeState, DriverError> {
        seen_in(&self.dir(sandbox), inspection)
    }

    fn seen_all(
        &self,
        sandbox: &SandboxId,
        inspection: Option<&Inspection>,
    ) -> Result<Option<RuntimeState>, DriverError> {
        inspection.map(|i| self.seen(sandbox, i)).transpose()
    }

    fn record_started(&self, sandbox: &SandboxId, started: Started) -> Result<(), DriverError> {
        state_file::write_json(&self.dir(sandbox).join("driver.json"), &started)
    }

    /// Stops the container and waits until it has fully exited; its final state.
    async fn stop_locked(
        &self,
        sandbox: &SandboxId,
        grace: Duration,
        crash: Option<CrashPoint>,
    ) -> Result<RuntimeState, DriverError> {
        let name = container_name(sandbox);
        let Some(inspection) = self.engine.inspect(&name).await? else {
            return Ok(RuntimeState::Absent { at: None });
        };
        // A checkpointed run has no process left to signal: the stop ends it where it is, and
        // it is never restored.
        let checkpoint = self.started(sandbox)?.and_then(|r| r.checkpoint);
        if let Some(run) = checkpoint
            && matches!(inspection.state(checkpoint), RuntimeState::Running { held: Some(Hold::Checkpoint), .. })
        {
            self.keep_checkpoint(sandbox, Checkpoint { ended: true, ..run })?;
            return self.seen(sandbox, &inspection);
        }
        if inspection.running() {
            // A frozen run cannot take its SIGTERM: it is thawed first, so a stop of a paused
            // sandbox is as graceful as any other.
            if inspection.status == Status::Paused {
                self.engine.unpause(&name).await?;
            }
            match self.engine.stop(&name, grace).await {
                Ok(()) | Err(EngineError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            if crash == Some(CrashPoint::AfterStopAsked) {
                return Err(crashed(CrashPoint::AfterStopAsked));
            }
            let deadline = tokio::time::Instant::now() + grace + STOP_SLACK;
            loop {
                match self.engine.inspect(&name).await? {
                    None => return Ok(RuntimeState::Absent { at: None }),
                    Some(i) if !i.running() => return self.seen(sandbox, &i),
                    Some(_) if tokio::time::Instant::now() > deadline => {
                        return Err(DriverError::Unavailable(format!("{name} is still running after its stop")));
                    }
                    Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        self.seen(sandbox, &inspection)
    }

    /// A stop decided for `generation`: a newer generation begun since is left running, and
    /// what runs is shown; otherwise the container is stopped (the caller holds the lock).
    async fn stop_superseded_or(
        &self,
        sandbox: &SandboxId,
        generation: u64,
        grace: Duration,
        crash: Option<CrashPoint>,
    ) -> Result<RuntimeState, DriverError> {
        if start_gate::stop_superseded(self.started(sandbox)?.map(|r| r.gate), generation) {
            return self.state(sandbox).await;
        }
        self.stop_locked(sandbox, grace, crash).await
    }

    /// Removes the container, its workspace volume, the driver's state and the lock, after a
    /// tombstone that keeps any late start from making them again (the caller holds the lock).
    async fn delete_locked(
        &self,
        sandbox: &SandboxId,
        grace: Duration,
        crash: Option<CrashPoint>,
    ) -> Result<(), DriverError> {
        self.tombstones.mark(sandbox)?;
        if crash == Some(CrashPoint::AfterTombstone) {
            return Err(crashed(CrashPoint::AfterTombstone));
        }
        // The forced removal below ends whatever this graceful stop did not (a run still going
        // past its grace), and reports the runtime's own failures.
        if let Err(e) = self.stop_locked(sandbox, grace, None).await {
            tracing::debug!(sandbox = %sandbox, error = %e, "the stop before a delete did not finish; removing by force");
        }
        self.engine.remove(&container_name(sandbox)).await?;
        // Under the naming lock: a runtime that writes an image's names back whole could give
        // this name back as another sandbox's name of the same image is added.
        let _naming = self.naming.lock().await;
        self.engine.remove_image(&seed_image(sandbox)).await?;
        if crash == Some(CrashPoint::AfterRuntimeRemove) {
            return Err(crashed(CrashPoint::AfterRuntimeRemove));
        }
        self.remove_volume_named(&volume_name(sandbox)).await?;
        removed(std::fs::remove_dir_all(self.dir(sandbox)), "removing the sandbox's state")?;
        self.locks.remove(sandbox)
    }

    /// Removes runtime volume `volume`; absence is success.
    async fn remove_volume_named(&self, volume: &str) -> Result<(), DriverError> {
        self.engine.remove_volume(volume).await?;
        // A runtime may still hold the volume for a moment after the container went: report
        // that as unfinished, so the removal is retried instead of leaving the files behind.
        // Asked of this volume alone: Podman's listing fails while another volume is being
        // removed.
        if self.engine.volume_path(volume).await?.is_some() {
            return Err(DriverError::Unavailable(format!("{volume} is still present after its removal")));
        }
        Ok(())
    }

    /// Starts `launch`'s generation as the start gate says (the caller holds the lock).
    async fn start_locked(&self, launch: &Launch, crash: Option<CrashPoint>) -> Result<StartReply, DriverError> {
        let id = &launch.sandbox;
        if self.tombstones.holds(id)? {
            // The lock file this start made goes again, as the delete left it.
            self.locks.remove(id)?;
            return Ok(tombstone::deleted());
        }
        let generation = launch.generation;
        let name = container_name(id);
        let current = self.engine.inspect(&name).await?;
        let record = self.started(id)?;
        match start_gate::gate(record.map(|r| r.gate), generation) {
            Gate::Superseded { newest } => return Ok(start_gate::superseded(generation, newest)),
            Gate::Report => return Ok(start_gate::report(self.seen_all(id, current.as_ref())?)),
            Gate::Resume => {
                let previous = record.and_then(|r| r.previous);
                if current.is_none() {
                    // The start was recorded as begun once the container existed, so it was
                    // removed since, out of band, with its run if one began: the generation is
                    // never run again (its compute resource is missing).
                    self.record_started(id, Started::new(StartRecord::confirmed(generation), previous))?;
                    return Ok(start_gate::report(None));
                }
                // The container started since the start was begun: that run is this generation's
                // if its supervisor began as this generation's. An out-of-band restart already
                // under way as the start began read the older token, and its end is not this
                // generation's (seed 37 with `--execs --lifetimes --egress`): it is started anew.
                if let Some(started_at) = current.and_then(|i| i.started_at)
                    && previous.is_none_or(|p| started_at > p)
                    && self.began_as(id, generation).await
                {
                    self.record_started(id, Started::new(StartRecord::confirmed(generation), previous))?;
                    return Ok(start_gate::report(self.seen_all(id, current.as_ref())?));
                }
            }
            Gate::Start => {}
        }
        if current.is_some_and(|i| i.running()) {
            self.stop_locked(id, REPLACE_GRACE, None).await?;
        }
        self.make_dir(id)?;
        let spec = self.spec(launch);
        for volume in &spec.volumes {
            self.engine.create_volume(&volume.name, &spec.volume_labels(volume)).await?;
        }
        if let Err(e) = self.seed(launch).await {
            return unseeded(e);
        }
        let created = match current {
            Some(_) => Ok(()),
            None => {
                if let Err(e) = self.seed_image(launch).await {
                    return unseeded(e);
                }
                self.engine.create(&spec).await
            }
        };
        let mut previous = current.and_then(|i| i.started_at);
        let begin = |previous| {
            if berth_core::bug!(RecordAfterStart) {
                return Ok(());
            }
            self.record_started(id, Started::new(StartRecord::intent(generation), previous))
        };
        let started = match created {
            Ok(()) => {
                launch.fence.check()?;
                begin(previous)?;
                // Only now can a run of this generation happen, even one a `docker start` made
                // out of band: its identity goes in after the record says its start began, so a
                // gateway that dies in between leaves a run the next one adopts, never one it
                // takes for an older generation's and stops.
                self.install(launch)?;
                if crash == Some(CrashPoint::BeforeRuntimeStart) {
                    return Err(crashed(CrashPoint::BeforeRuntimeStart));
                }
                match self.start_anew(id, generation).await {
                    // Removed since it was inspected: make it again.
                    Err(EngineError::NotFound(_)) => {
                        if let Err(e) = self.seed_image(launch).await {
                            return unseeded(e);
                        }
                        match self.engine.create(&spec).await {
                            Ok(()) => {
                                previous = None;
                                begin(previous)?;
                                self.start_anew(id, generation).await
                            }
                            Err(e) => Err(e),
                        }
                    }
                    other => other,
                }
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(()) => {}
            Err(EngineError::Refused(message) | EngineError::NotFound(message)) => {
                return Ok(StartReply::Failed { message });
            }
            Err(e) => return Err(e.into()),
        }
        if crash == Some(CrashPoint::AfterRuntimeStart) {
            return Err(crashed(CrashPoint::AfterRuntimeStart));
        }
        let Some(inspection) = self.engine.inspect(&name).await? else {
            return Ok(StartReply::Failed { message: format!("{name} vanished as it started") });
        };
        let Some(started_at) = inspection.started_at else {
            return Err(DriverError::Unavailable(format!("{name} started but reports no start time")));
        };
        self.record_started(id, Started::new(StartRecord::confirmed(generation), previous))?;
        Ok(match inspection.state(None) {
            RuntimeState::Exited(marker) => StartReply::Exited(marker),
            _ => StartReply::Running { started_at },
        })
    }

    /// Starts the container so that what runs is `generation`'s run. One already running was
    /// begun by somebody else (a `docker start` or `docker restart` out of band racing this
    /// start, or an earlier attempt of this start whose reply was lost): it is this generation's
    /// only if its supervisor read this generation's token, which its began file says. One that
    /// read an older token, taken for this generation's, would have this generation blamed for
    /// its end (seed 3226 with `--execs`): it is stopped, and the container started again.
    async fn start_anew(&self, sandbox: &SandboxId, generation: u64) -> Result<(), EngineError> {
        let name = container_name(sandbox);
        for _ in 0..3 {
            if self.engine.start(&name).await? == Start::Began {
                return Ok(());
            }
            if self.began_as(sandbox, generation).await {
                return Ok(());
            }
            self.stop_locked(sandbox, REPLACE_GRACE, None).await.map_err(|e| match e {
                DriverError::Unavailable(m) => EngineError::Unreachable(m),
                DriverError::Failed(m) => EngineError::Refused(m),
            })?;
        }
        Err(EngineError::Unreachable(format!("{name} kept being started outside Berth as it was started")))
    }

    /// Whether the running container's supervisor says it began as `generation`'s, within
    /// [`BEGAN_WAIT`] (it writes that as it starts, just after it read its token). The file is
    /// not cleared before a start: a run of an earlier attempt of this start may have written it
    /// already. The sandbox's own command could write it too, but a lie there harms only that
    /// sandbox (its run, kept under the wrong generation, is rejected and ends).
    async fn began_as(&self, sandbox: &SandboxId, generation: u64) -> bool {
        let path = self.logs_dir(sandbox).join(began::FILE);
        let deadline = tokio::time::Instant::now() + BEGAN_WAIT;
        loop {
            // The sandbox can write there: never through a link, a number at most.
            let began = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
                .open(&path)
                .ok()
                .and_then(|file| {
                    let mut bytes = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::Read::take(file, began::MAX_BYTES), &mut bytes).ok()?;
                    began::parse(&bytes)
                });
            if began == Some(generation) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Holds the container's run as `wanted` says (frozen, checkpointed, or let go of: `None`)
    /// if it is not so already, and shows the state it left the run in (the caller holds the
    /// lock). A run held the other way is let go of first: a frozen run cannot be written to a
    /// checkpoint, nor a checkpoint frozen.
    async fn hold_locked(&self, sandbox: &SandboxId, wanted: Option<Hold>) -> Result<RuntimeState, DriverError> {
        let name = container_name(sandbox);
        let Some(inspection) = self.engine.inspect(&name).await? else {
            return Ok(RuntimeState::Absent { at: None });
        };
        let shown = self.seen(sandbox, &inspection)?;
        let RuntimeState::Running { started_at, held } = shown else { return Ok(shown) };
        if held == wanted {
            return Ok(shown);
        }
        match held {
            Some(Hold::Freezer) => self.engine.unpause(&name).await?,
            Some(Hold::Checkpoint) => self.engine.restore(&name).await?,
            None => {}
        }
        match wanted {
            Some(Hold::Freezer) => self.engine.pause(&name).await?,
            Some(Hold::Checkpoint) => {
                // Recorded before the runtime is asked: a gateway that dies in between leaves an
                // exited container that only this record shows to be this run, checkpointed.
                let run = Checkpoint { run_started_at: started_at, ended: false };
                self.keep_checkpoint(sandbox, run)?;
                self.engine.checkpoint(&name).await?;
            }
            None => {}
        }
        self.state(sandbox).await
    }

    /// Writes the driver's record of the run it checkpoints.
    fn keep_checkpoint(&self, sandbox: &SandboxId, checkpoint: Checkpoint) -> Result<(), DriverError> {
        let Some(record) = self.started(sandbox)? else {
            return Err(DriverError::Failed(format!("{sandbox} has no record of its start to keep a checkpoint in")));
        };
        self.record_started(sandbox, Started { checkpoint: Some(checkpoint), ..record })
    }

    async fn state(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        Ok(match self.engine.inspect(&container_name(sandbox)).await? {
            Some(i) => self.seen(sandbox, &i)?,
            None => RuntimeState::Absent { at: None },
        })
    }

    /// Commits the container's filesystem and copies its workspace as snapshot `snapshot`, a
    /// running container paused for both (the caller holds the lock).
    async fn snapshot_locked(&self, sandbox: &SandboxId, snapshot: &SnapshotId) -> Result<Content, DriverError> {
        let image = snapshot_image(snapshot);
        if let Some(kept) = self.snapshots.existing(snapshot)? {
            return Ok(Content { size_bytes: kept.size_bytes, sha256: kept.sha256, image: Some(image) });
        }
        let name = container_name(sandbox);
        let no_files =
            || DriverError::Failed("the sandbox has no container (it has not started, or it is gone)".into());
        let workspace = self.engine.volume_path(&volume_name(sandbox)).await?.ok_or_else(no_files)?;
        let inspection = self.engine.inspect(&name).await?.ok_or_else(no_files)?;
        self.snapshots.begin(snapshot)?;
        let naming = self.naming.lock().await;
        // A commit re-driven replaces the one made before, which nothing else names.
        self.engine.remove_image(&image).await?;
        let thaw = inspection.status == Status::Running;
        if thaw {
            self.engine.pause(&name).await?;
        }
        let kept = match self.engine.commit(&name, &image).await {
            Ok(()) => self.snapshots.keep(snapshot, &workspace).await,
            Err(e) => Err(e.into()),
        };
        drop(naming);
        // Thawed whatever the copy did; a thaw that fails leaves a paused container the record
        // says is Ready, which the merge's freezer rule thaws again.
        if thaw {
            self.engine.unpause(&name).await?;
        }
        match kept {
            Ok(kept) => Ok(Content { size_bytes: kept.size_bytes, sha256: kept.sha256, image: Some(image) }),
            // A copy that cannot be made keeps nothing: the snapshot is Error with nothing of it left.
            Err(DriverError::Failed(message)) => {
                self.remove_snapshot(snapshot).await?;
                Err(DriverError::Failed(message))
            }
            Err(e) => Err(e),
        }
    }

    /// Gives a sandbox made from a snapshot the snapshot's files, once (the caller holds the
    /// lock).
    async fn seed(&self, launch: &Launch) -> Result<(), DriverError> {
        let Some(seed) = launch.seed.as_ref().filter(|s| !s.seeded) else { return Ok(()) };
        let dir = self.dir(&launch.sandbox);
        if Snapshots::seeded(&dir) {
            return Ok(());
        }
        self.seed_image(launch).await?;
        let workspace = self.engine.volume_path(&volume_name(&launch.sandbox)).await?.ok_or_else(|| {
            DriverError::Unavailable(format!("the workspace volume of {} has no path yet", launch.sandbox))
        })?;
        self.snapshots.seed(&seed.id, &workspace, &dir).await
    }

    /// Makes sure a sandbox made from a snapshot has its own name for the snapshot's image,
    /// which its container is made from (the caller holds the lock).
    async fn seed_image(&self, launch: &Launch) -> Result<(), DriverError> {
        let Some(seed) = &launch.seed else { return Ok(()) };
        let _naming = self.naming.lock().await;
        let own = launch.sandbox.to_string();
        if self.engine.image_tags(SEED_REPOSITORY).await?.contains(&own) {
            return Ok(());
        }
        match self.engine.tag_image(&snapshot_image(&seed.id), &seed_image(&launch.sandbox)).await {
            Err(EngineError::NotFound(_)) => {
                return Err(DriverError::Failed(format!(
                    "the image of snapshot {}, which this sandbox was made from, is gone",
                    seed.snapshot
                )));
            }
            other => other?,
        }
        // A name given by another gateway's driver at the same moment may have taken its place.
        if !self.engine.image_tags(SEED_REPOSITORY).await?.contains(&own) {
            return Err(DriverError::Unavailable(format!("the runtime lost the name {}", seed_image(&launch.sandbox))));
        }
        Ok(())
    }
}

#[async_trait]
impl<E: Engine> Driver for ContainerDriver<E> {
    fn name(&self) -> &'static str {
        self.engine.name()
    }

    /// The runtime enforces every limit; only a CPU share the host does not have is refused.
    fn admit(&self, spec: &SandboxSpec) -> Result<(), berth_core::Error> {
        berth_core::limits::fit_host(&spec.limits, self.engine.cpus(), self.engine.name())
    }

    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        let _guard = self.locks.lock(&launch.sandbox, true).await?;
        self.start_locked(&launch, None).await
    }

    #[cfg(feature = "fault-points")]
    async fn start_then_crash(&self, launch: Launch, at: CrashPoint) -> Result<(), DriverError> {
        let _guard = self.locks.lock(&launch.sandbox, true).await?;
        cut_short(self.start_locked(&launch, Some(at)).await, at)
    }

    async fn stop(&self, sandbox: &SandboxId, generation: u64, grace: Duration) -> Result<RuntimeState, DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        self.stop_superseded_or(sandbox, generation, grace, None).await
    }

    #[cfg(feature = "fault-points")]
    async fn stop_then_crash(
        &self,
        sandbox: &SandboxId,
        generation: u64,
        grace: Duration,
        at: CrashPoint,
    ) -> Result<(), DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        cut_short(self.stop_superseded_or(sandbox, generation, grace, Some(at)).await, at)
    }

    async fn delete(&self, sandbox: &SandboxId, grace: Duration) -> Result<(), DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        self.delete_locked(sandbox, grace, None).await
    }

    #[cfg(feature = "fault-points")]
    async fn delete_then_crash(&self, sandbox: &SandboxId, grace: Duration, at: CrashPoint) -> Result<(), DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        cut_short(self.delete_locked(sandbox, grace, Some(at)).await, at)
    }

    /// The freezer is the runtime's everywhere; a checkpoint needs a runtime that can make one
    /// here (Podman's CRIU, as its probe at connect found it).
    fn admit_pause(&self, hold: Hold) -> Result<(), berth_core::Error> {
        match hold {
            Hold::Freezer => Ok(()),
            Hold::Checkpoint => self.engine.checkpoints().map_err(|reason| berth_core::Error::Unsupported {
                action: "checkpoint",
                driver: self.engine.name(),
                reason,
            }),
        }
    }

    async fn pause(&self, sandbox: &SandboxId, hold: Hold) -> Result<RuntimeState, DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        self.hold_locked(sandbox, Some(hold)).await
    }

    async fn resume(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        self.hold_locked(sandbox, None).await
    }

    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        self.state(sandbox).await
    }

    async fn snapshot(&self, sandbox: &SandboxId, snapshot: &SnapshotId) -> Result<Content, DriverError> {
        let _guard = self.locks.lock(sandbox, false).await?;
        self.snapshot_locked(sandbox, snapshot).await
    }

    async fn remove_snapshot(&self, snapshot: &SnapshotId) -> Result<(), DriverError> {
        let _naming = self.naming.lock().await;
        self.engine.remove_image(&snapshot_image(snapshot)).await?;
        self.snapshots.remove(snapshot)
    }

    async fn snapshots(&self) -> Result<Vec<SnapshotId>, DriverError> {
        // A snapshot's image is committed after its directory is made and removed before it.
        self.snapshots.list()
    }

    async fn remove_volume(&self, volume: &VolumeId) -> Result<(), DriverError> {
        self.remove_volume_named(&user_volume_name(volume)).await
    }

    async fn volume_bytes(&self, volume: &VolumeId) -> Result<u64, DriverError> {
        match self.engine.volume_path(&user_volume_name(volume)).await? {
            Some(path) => crate::tree_bytes(path).await,
            None => Ok(0),
        }
    }

    async fn volumes(&self) -> Result<Vec<VolumeId>, DriverError> {
        let mut volumes: Vec<VolumeId> =
            self.engine.list_volumes().await?.iter().filter_map(|name| user_volume_of(name)).collect();
        volumes.sort();
        Ok(volumes)
    }

    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError> {
        ListPage::of(self, self.engine.list().await?, after, limit).await
    }

    async fn workspace(&self, sandbox: &SandboxId) -> Result<PathBuf, DriverError> {
        self.engine
            .volume_path(&volume_name(sandbox))
            .await?
            .ok_or_else(|| DriverError::Failed("the sandbox has no workspace yet: it has not started".into()))
    }

    async fn logs(
        &self,
        sandbox: &SandboxId,
        log: &berth_logs::Log,
        from: u64,
        max: usize,
        over: bool,
    ) -> Result<berth_logs::Read, DriverError> {
        crate::read_logs(&self.logs_dir(sandbox), log, from, max, over)
    }

    async fn watch(&self) -> Result<WatchStream, DriverError> {
        // Subscribe before the sync, so nothing that changes in between is missed.
        let events = self.engine.events().await?;
        let mut sync = Vec::new();
        let mut ids = self.engine.list().await?;
        ids.sort();
        ids.dedup();
        for id in ids {
            sync.push(Ok(WatchEvent::Sync { state: self.state(&id).await?, sandbox: id }));
        }
        sync.push(Ok(WatchEvent::Synced));
        let engine = Arc::clone(&self.engine);
        let root = self.config.root.clone();
        let live = events.then(move |event| {
            let engine = Arc::clone(&engine);
            let root = root.clone();
            async move {
                let event = event.map_err(DriverError::from)?;
                let dir = root.join(event.sandbox.as_str());
                let state = if event.removed {
                    RuntimeState::Absent { at: Some(event.at) }
                } else {
                    match engine.inspect(&container_name(&event.sandbox)).await? {
                        Some(i) => seen_in(&dir, &i)?,
                        None => RuntimeState::Absent { at: Some(event.at) },
                    }
                };
                Ok(WatchEvent::Changed { sandbox: event.sandbox, state })
            }
        });
        Ok(Box::pin(futures_util::stream::iter(sync).chain(live)))
    }
}
