//! The process driver, Berth's embedded default runtime.
//!
//! Each sandbox is a process group led by `berth-supervisor`, started in the sandbox's own
//! workspace directory under the driver's root. Everything the driver knows lives in files
//! beside the workspace, so a gateway that restarts adopts the runs it finds instead of
//! restarting them:
//!
//! ```text
//! <root>/<sandbox id>/workspace/      the command's working directory, kept across stop and start
//! <root>/<sandbox id>/run/state.json  the newest run: generation, pid, its kernel start time, start time
//! <root>/<sandbox id>/run/exit.json   how that run ended (written by the supervisor, else by the driver; berth-handoff)
//! <root>/<sandbox id>/run/began       the generation whose supervisor began (its first act; berth-handoff)
//! <root>/<sandbox id>/run/output.log  the supervisor's own output
//! <root>/<sandbox id>/logs/           the command's output, per generation (berth-logs)
//! <root>/<sandbox id>/mounts/         links to the volumes its run mounts, at their paths ($BERTH_MOUNTS)
//! <root>/.started/<sandbox id>         the start gate's record: the newest generation begun
//! <root>/.locks/<sandbox id>           locked while the driver acts on the sandbox
//! <root>/.snapshots/<snapshot id>/     what is kept of a snapshot ([`crate::snapshot`])
//! <root>/.volumes/<volume id>/        a volume's files (DESIGN 13.2)
//! ```
//!
//! The start gate (berth-core's [`start_gate`]) is recorded before the supervisor is spawned.
//! A gateway that dies between the spawn and `state.json` leaves a run the files do not name;
//! the next look at the sandbox finds it by the identity every supervisor carries in its
//! environment (`BERTH_SANDBOX_ID`, `BERTH_GENERATION`) and adopts it, so it is neither started
//! twice nor left running after a stop (defect 1 of issue 13). A run whose supervisor is gone by
//! that look is known by `run/began`, which its supervisor writes before it does anything else,
//! or by its exit record: a supervisor that never wrote either never ran the command nor spoke
//! to a gateway, so starting the generation again is its first run. What such a run's command
//! started may still live in its group, which is found by the same identity (every member
//! inherits it) and recorded as the run's, so a stop ends it.
//!
//! Several gateways may share the root (gateways sharing a store on one host): a file lock per
//! sandbox serializes them as the in-process lock serializes one gateway's tasks.
//!
//! The newest started generation lives outside the sandbox's folder: removing the folder out of
//! band must not let a start of an older generation, still on its way, run after a newer one did.
//!
//! Everything it asks of the operating system goes through [`os::Os`]: the host's
//! ([`os::HostOs`]) in production, a simulated one in the simulator, which runs this same
//! bookkeeping under gateway crashes between any two of its steps.
//!
//! The runtime clock is the host's wall clock. There is no isolation beyond a process group:
//! the command runs as the gateway's user.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::record::Content;
use berth_core::start_gate::{self, Gate, StartRecord};
use berth_core::{ExitMarker, Hold, RuntimeState, SandboxId, SandboxSpec, SnapshotId, StartReply, Timestamp, VolumeId};
use berth_handoff::exit::Exit;
use berth_handoff::{began, exit, flag};
use tokio::sync::broadcast;

use self::os::{HostOs, Os, Signal, SpawnSpec};
#[cfg(feature = "fault-points")]
use crate::cut_short;
use crate::sandbox_lock::SandboxLocks;
use crate::snapshot::Snapshots;
use crate::state_file::{self, read_json, write_json};
use crate::tombstone::{self, Tombstones};
use crate::{CrashPoint, Driver, DriverError, Launch, ListPage, WatchEvent, WatchStream, crashed, io, removed};

mod cgroup;
pub mod os;
mod state;

use state::{Begun, RunFile, STARTED_DIR};

/// The exit code reported for a run whose supervisor was killed before it could record one.
pub const KILLED_EXIT_CODE: i32 = 137;
/// How often the driver looks for runs that ended, to report them on its watch stream.
const MONITOR_INTERVAL: Duration = Duration::from_millis(200);
/// How long an older generation's run may take to stop when a newer one replaces it.
const REPLACE_GRACE: Duration = Duration::from_secs(5);
/// Under the driver's root: the volumes' files, one directory each.
const VOLUMES_DIR: &str = ".volumes";
/// Under a sandbox's directory: the links its run finds its volumes by.
pub(super) const MOUNTS_DIR: &str = "mounts";
/// How long a stop waits for what is left of a run's group to take its SIGKILL.
const LEFTOVERS_DIE_WITHIN: Duration = Duration::from_secs(5);
/// Why a process is never checkpointed: CRIU could write one, but a run restored outside a
/// container comes back with the host's pids and files as they are then, not as they were.
const NO_CHECKPOINTS: &str = "a run outside a container cannot be restored as it was (checkpoints need \
    rootful Podman with a working CRIU)";
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// Where sandboxes live: `<data dir>/sandboxes`.
    pub root: PathBuf,
    /// The `berth-supervisor` binary.
    pub supervisor: PathBuf,
    /// Where supervisors reach the gateway: `unix:/path/to/socket` or `http://host:port`.
    pub gateway: String,
}

pub struct ProcessDriver<O: Os = HostOs> {
    inner: Arc<Inner<O>>,
}

struct Inner<O> {
    os: O,
    config: ProcessConfig,
    locks: SandboxLocks,
    tombstones: Tombstones,
    snapshots: Snapshots,
    events: broadcast::Sender<(SandboxId, RuntimeState)>,
    monitor: Once,
}

impl ProcessDriver {
    /// The driver on this machine.
    pub fn new(config: ProcessConfig) -> Result<Self, DriverError> {
        Self::over(HostOs::at(&config.root), config)
    }
}

impl<O: Os> ProcessDriver<O> {
    /// The driver over `os`.
    pub fn over(os: O, config: ProcessConfig) -> Result<Self, DriverError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.root)
            .map_err(|e| io(&format!("creating {}", config.root.display()), e))?;
        let (events, _) = broadcast::channel(1024);
        let locks = SandboxLocks::new(config.root.clone());
        let tombstones = Tombstones::new(&config.root);
        let snapshots = Snapshots::under(&config.root, os.copying());
        let inner = Inner { os, config, locks, tombstones, snapshots, events, monitor: Once::new() };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The workspace directory of a sandbox (for tests and operators).
    pub fn workspace(&self, sandbox: &SandboxId) -> PathBuf {
        self.inner.dir(sandbox).join("workspace")
    }
}

impl<O: Os> Inner<O> {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_nanos(self.os.now())
    }

    fn alive(&self, run: &RunFile) -> bool {
        self.os.stat(run.pid).is_some_and(|stat| stat.live && stat.kernel_start == run.kernel_start)
    }

    /// Ends what is left of a run's process group. The kernel never hands out a pid that is
    /// still a group's id, so while any member of the run's group lives the pid names that
    /// group; once none does, the pid may be another process's, leading its own group (a
    /// supervisor of another sandbox): a pid held by a process started at another time is never
    /// signalled. A pid of 0 or 1 would name the caller's own group or init: never.
    fn kill_group(&self, run: &RunFile, signal: Signal) {
        let recycled = self.os.stat(run.pid).is_some_and(|stat| stat.kernel_start != run.kernel_start);
        if run.pid > 1 && !recycled {
            if berth_core::bug!(SignalsSupervisorOnly) {
                return self.os.kill(run.pid, signal);
            }
            // The group (kill(2)'s negative pid): the supervisor, its command and whatever that
            // started, orphans of it included; the supervisor alone would leave them.
            self.os.kill(-run.pid, signal);
        }
    }

    /// Ends what a run's supervisor left of its group as it went: it goes once its command did,
    /// which may leave what the command started (a helper deaf to SIGTERM, a daemon init
    /// adopted) running in the group. Once nothing of the group lives, its pid may be another
    /// run's: never signalled while that run's supervisor holds it ([`Self::kill_group`]), and
    /// once that supervisor is gone too, what is left of its group is leftovers as well.
    ///
    /// It returns once nothing of the group is left: a SIGKILL is sent at once but taken when the
    /// kernel next runs the process, which on a busy host is after the stop would have been
    /// acknowledged. A process the kernel holds past [`LEFTOVERS_DIE_WITHIN`] (stuck in an
    /// uninterruptible wait) is left to its SIGKILL.
    async fn kill_leftovers(&self, sandbox: &SandboxId, run: &RunFile) {
        if berth_core::bug!(ChildLeftBehind) {
            return;
        }
        self.kill_group(run, Signal::Kill);
        let deadline = tokio::time::Instant::now() + LEFTOVERS_DIE_WITHIN;
        while self.os.find_group(sandbox, run.generation).is_some() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How `run` ended. A run that died without its supervisor recording the exit gets one
    /// recorded now, once, so every later look reports the same finish time.
    fn ended(&self, sandbox: &SandboxId, run: &RunFile, code_if_unknown: i32) -> Result<ExitMarker, DriverError> {
        let path = self.run_dir(sandbox).join(exit::FILE);
        let exit = match read_json::<Exit>(&path)? {
            Some(exit) => exit,
            None => {
                self.kill_group(run, Signal::Kill);
                self.os.kill_execs(sandbox);
                let finished_at = self.os.now().max(run.started_at + 1);
                let exit = Exit {
                    exit_code: code_if_unknown,
                    finished_at,
                    generation: Some(run.generation),
                    out_of_memory: false,
                };
                state_file::write(&path, &exit.to_bytes())?;
                exit
            }
        };
        Ok(ExitMarker {
            started_at: Timestamp::from_unix_nanos(run.started_at),
            finished_at: Timestamp::from_unix_nanos(exit.finished_at),
            exit_code: exit.exit_code,
            out_of_memory: exit.out_of_memory,
        })
    }

    /// What the runtime shows; the caller holds the sandbox's lock.
    fn observe(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        if !self.dir(sandbox).exists() {
            return Ok(RuntimeState::Absent { at: Some(self.now()) });
        }
        self.settle(sandbox)?;
        let Some(run) = self.run_file(sandbox)? else { return Ok(RuntimeState::Created) };
        if self.alive(&run) {
            let held = self.os.frozen(sandbox).then_some(Hold::Freezer);
            return Ok(RuntimeState::Running { started_at: Timestamp::from_unix_nanos(run.started_at), held });
        }
        Ok(RuntimeState::Exited(self.ended(sandbox, &run, KILLED_EXIT_CODE)?))
    }

    /// Stops the run (if one lives) and waits until its whole group is gone.
    async fn stop_locked(
        &self,
        sandbox: &SandboxId,
        grace: Duration,
        crash: Option<CrashPoint>,
    ) -> Result<RuntimeState, DriverError> {
        self.settle(sandbox)?;
        let run = self.run_file(sandbox)?;
        if let Some(run) = run.filter(|run| self.alive(run)) {
            // A frozen run cannot take its SIGTERM: thawed first, it stops as gracefully as any.
            if self.os.frozen(sandbox) {
                self.os.freeze(sandbox, false).await?;
            }
            self.kill_group(&run, Signal::Term);
            if crash == Some(CrashPoint::AfterStopAsked) {
                return Err(crashed(CrashPoint::AfterStopAsked));
            }
            let deadline = tokio::time::Instant::now() + grace;
            while self.alive(&run) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            while self.alive(&run) {
                self.kill_group(&run, Signal::Kill);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Nothing of the group may outlive the stop, of a run stopped now or one whose
        // supervisor went before.
        if let Some(run) = run {
            self.kill_leftovers(sandbox, &run).await;
        }
        // Nor anything an exec of it started (a supervisor that got to stop them has).
        self.os.kill_execs(sandbox);
        self.observe(sandbox)
    }

    /// Freezes (`pause`) or thaws the live run, and shows the state it left it in (the caller
    /// holds the lock). Nothing alive is nothing to do.
    async fn freeze_locked(&self, sandbox: &SandboxId, pause: bool) -> Result<RuntimeState, DriverError> {
        if let RuntimeState::Running { held, .. } = self.observe(sandbox)?
            && held.is_some() != pause
        {
            self.os.freeze(sandbox, pause).await?;
        }
        self.observe(sandbox)
    }

    /// Copies the workspace as snapshot `snapshot`, the live run frozen for the copy (the
    /// caller holds the lock).
    async fn snapshot_locked(&self, sandbox: &SandboxId, snapshot: &SnapshotId) -> Result<Content, DriverError> {
        if let Some(kept) = self.snapshots.existing(snapshot)? {
            return Ok(Content { size_bytes: kept.size_bytes, sha256: kept.sha256, image: None });
        }
        let workspace = self.dir(sandbox).join("workspace");
        if !workspace.is_dir() {
            return Err(DriverError::Failed("the sandbox has no workspace yet: it has not started".into()));
        }
        let thaw = match self.observe(sandbox)? {
            RuntimeState::Running { held: None, .. } => {
                if let Some(reason) = self.os.no_freezer() {
                    return Err(DriverError::Failed(format!(
                        "a running sandbox is frozen for its copy, and this host cannot freeze it ({reason}): \
                         stop or pause it first"
                    )));
                }
                self.os.freeze(sandbox, true).await?;
                true
            }
            _ => false,
        };
        let kept = self.snapshots.keep(snapshot, &workspace).await;
        // Thawed whatever the copy did; a thaw that fails leaves a frozen run the record says
        // is Ready, which the merge's freezer rule thaws again.
        if thaw {
            self.os.freeze(sandbox, false).await?;
        }
        match kept {
            Ok(kept) => Ok(Content { size_bytes: kept.size_bytes, sha256: kept.sha256, image: None }),
            // A copy that cannot be made keeps nothing: the snapshot is Error with nothing of it left.
            Err(DriverError::Failed(message)) => {
                self.snapshots.remove(snapshot)?;
                Err(DriverError::Failed(message))
            }
            Err(e) => Err(e),
        }
    }

    /// A stop decided for `generation`: a newer generation begun since is left running, and
    /// what runs is shown; otherwise the run is stopped (the caller holds the lock).
    async fn stop_superseded_or(
        &self,
        sandbox: &SandboxId,
        generation: u64,
        grace: Duration,
        crash: Option<CrashPoint>,
    ) -> Result<RuntimeState, DriverError> {
        if start_gate::stop_superseded(self.begun(sandbox)?.map(|b| b.gate), generation) {
            return self.observe(sandbox);
        }
        self.stop_locked(sandbox, grace, crash).await
    }

    /// Ends the run, then removes the sandbox's folder, its start record and its lock, after a
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
        self.stop_locked(sandbox, grace, None).await?;
        self.os.unlimit(sandbox).await?;
        if crash == Some(CrashPoint::AfterRuntimeRemove) {
            return Err(crashed(CrashPoint::AfterRuntimeRemove));
        }
        removed(std::fs::remove_dir_all(self.dir(sandbox)), "removing the sandbox's directory")?;
        removed(std::fs::remove_file(self.started_file(sandbox)), "removing the sandbox's started record")?;
        self.locks.remove(sandbox)
    }

    /// Starts `launch`'s generation as the start gate says (the caller holds the lock).
    async fn start_locked(
        self: &Arc<Self>,
        launch: &Launch,
        crash: Option<CrashPoint>,
    ) -> Result<StartReply, DriverError> {
        let id = &launch.sandbox;
        if self.tombstones.holds(id)? {
            // The lock file this start made goes again, as the delete left it.
            self.locks.remove(id)?;
            return Ok(tombstone::deleted());
        }
        let generation = launch.generation;
        // A root from before the start gate may have a run without a record of it.
        let record = match self.begun(id)? {
            Some(begun) => Some(begun.gate),
            None => self.run_file(id)?.map(|r| StartRecord::confirmed(r.generation)),
        };
        match start_gate::gate(record, generation) {
            Gate::Superseded { newest } => return Ok(start_gate::superseded(generation, newest)),
            Gate::Report => return Ok(start_gate::report(self.run_of(id, generation)?)),
            Gate::Resume if self.settle(id)? => return Ok(start_gate::report(self.run_of(id, generation)?)),
            Gate::Resume => {}
            // An older generation's start that a dead gateway never confirmed may have left a
            // run no file names (its folder even removed under it): found now, it is stopped
            // below like any other before the new generation runs.
            Gate::Start => {
                self.settle(id)?;
            }
        }
        if self.run_file(id)?.is_some() {
            self.stop_locked(id, REPLACE_GRACE, None).await?;
        }
        match self.spawn(launch, crash).await {
            Ok(run) => Ok(StartReply::Running { started_at: Timestamp::from_unix_nanos(run.started_at) }),
            Err(DriverError::Failed(message)) => Ok(StartReply::Failed { message }),
            Err(e) => Err(e),
        }
    }

    /// What the runtime shows of `generation`'s run, if it is the recorded one.
    fn run_of(&self, sandbox: &SandboxId, generation: u64) -> Result<Option<RuntimeState>, DriverError> {
        match self.run_file(sandbox)? {
            Some(run) if run.generation == generation => self.observe(sandbox).map(Some),
            _ => Ok(None),
        }
    }

    async fn spawn(self: &Arc<Self>, launch: &Launch, crash: Option<CrashPoint>) -> Result<RunFile, DriverError> {
        let dir = self.dir(&launch.sandbox);
        let run_dir = self.run_dir(&launch.sandbox);
        let workspace = dir.join("workspace");
        let started = self.config.root.join(STARTED_DIR);
        for d in [&dir, &run_dir, &workspace, &started] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(|e| io(&format!("creating {}", d.display()), e))?;
        }
        if let Some(seed) = launch.seed.as_ref().filter(|s| !s.seeded) {
            self.snapshots.seed(&seed.id, &workspace, &dir).await?;
        }
        let mounts = self.mount(launch, &dir)?;
        let exit_path = run_dir.join(exit::FILE);
        let began_path = run_dir.join(began::FILE);
        for previous in [&exit_path, &began_path] {
            removed(std::fs::remove_file(previous), "clearing the previous run's records")?;
        }
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut args = vec!["--gateway".to_string(), self.config.gateway.clone()];
        args.extend([flag::arg(flag::EXIT_FILE), path(&exit_path), flag::arg(flag::BEGAN_FILE), path(&began_path)]);
        // The execs a generation started, which a restart of its run must not start again.
        args.extend(["--exec-log".to_string(), path(&run_dir)]);
        args.extend(["--logs".to_string(), path(&self.logs_dir(&launch.sandbox))]);
        for cgroup in self.os.limit(&launch.sandbox, &launch.spec.limits)? {
            args.extend(["--cgroup".to_string(), path(&cgroup)]);
        }
        args.push("--".to_string());
        args.extend(launch.spec.command.iter().cloned());
        let spec = SpawnSpec {
            program: self.config.supervisor.clone(),
            args,
            env: crate::env::process_run(launch, &workspace, &mounts).expose(),
            cwd: workspace,
            log: run_dir.join("output.log"),
        };
        let started_at = self.os.now();
        let begun = Begun { gate: StartRecord::intent(launch.generation), started_at };
        let begin = || {
            if berth_core::bug!(RecordAfterStart) {
                return Ok(());
            }
            self.record_begun(&launch.sandbox, begun)
        };
        launch.fence.check()?;
        begin()?;
        if crash == Some(CrashPoint::BeforeRuntimeStart) {
            return Err(crashed(CrashPoint::BeforeRuntimeStart));
        }
        let child = self.os.spawn(spec).await?;
        if crash == Some(CrashPoint::AfterRuntimeStart) {
            return Err(crashed(CrashPoint::AfterRuntimeStart));
        }
        let run =
            RunFile { generation: launch.generation, pid: child.pid, kernel_start: child.kernel_start, started_at };
        write_json(&run_dir.join("state.json"), &run)?;
        self.record_begun(&launch.sandbox, Begun { gate: StartRecord::confirmed(launch.generation), ..begun })?;
        // Reap our own child and record its status if the supervisor could not.
        let inner = Arc::clone(self);
        let sandbox = launch.sandbox.clone();
        tokio::spawn(async move {
            let code = child.exit.await;
            let Ok(_guard) = inner.locks.lock(&sandbox, false).await else { return };
            // The pid alone could be a later run's that was handed the same one.
            if inner.run_file(&sandbox).ok().flatten() == Some(run) {
                let _ = inner.ended(&sandbox, &run, code.unwrap_or(KILLED_EXIT_CODE));
            }
        });
        Ok(run)
    }

    /// Publishes every change of any sandbox's state to watchers.
    async fn monitor(self: Arc<Self>) {
        let mut last: BTreeMap<SandboxId, RuntimeState> = BTreeMap::new();
        loop {
            let ids = self.ids().unwrap_or_default();
            let mut seen = BTreeMap::new();
            for id in ids {
                // A sandbox busy with a start or stop keeps its last state until the next round;
                // that operation's own reply reports it.
                match self.locks.try_lock(&id) {
                    Some(_guard) => {
                        if let Ok(state) = self.observe(&id) {
                            seen.insert(id, state);
                        }
                    }
                    None => {
                        if let Some(state) = last.get(&id) {
                            seen.insert(id, *state);
                        }
                    }
                }
            }
            for (id, state) in &seen {
                let changed = match (last.get(id), state) {
                    (Some(RuntimeState::Absent { .. }), RuntimeState::Absent { .. }) => false,
                    (before, now) => before != Some(now),
                };
                if changed {
                    let _ = self.events.send((id.clone(), *state));
                }
            }
            for id in last.keys().filter(|id| !seen.contains_key(*id)) {
                let _ = self.events.send((id.clone(), RuntimeState::Absent { at: Some(self.now()) }));
            }
            last = seen;
            tokio::time::sleep(MONITOR_INTERVAL).await;
        }
    }

    /// Every sandbox directory, sorted.
    /// Where volume `volume`'s files are (DESIGN 13.2).
    fn volume_dir(&self, volume: &VolumeId) -> PathBuf {
        self.config.root.join(VOLUMES_DIR).join(volume.as_str())
    }

    /// Makes the volumes `launch` mounts visible to its run: a run shares the host's
    /// filesystem, so a volume mounted at `/data` is the link `<sandbox>/mounts/data` to the
    /// volume's directory, and the run finds the links under `BERTH_MOUNTS`. Made anew at every
    /// start. Returns that directory.
    fn mount(&self, launch: &Launch, dir: &Path) -> Result<PathBuf, DriverError> {
        let mounts = dir.join(MOUNTS_DIR);
        removed(std::fs::remove_dir_all(&mounts), "clearing the previous run's mounts")?;
        let create = |d: &Path| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(|e| io(&format!("creating {}", d.display()), e))
        };
        create(&mounts)?;
        for (volume, mount) in berth_core::volume::mounts(&launch.spec) {
            let target = self.volume_dir(&volume);
            create(&target)?;
            // Validated by core: absolute, without empty, '.' or '..' parts.
            let link = mounts.join(mount.path.trim_start_matches('/'));
            if let Some(parent) = link.parent() {
                create(parent)?;
            }
            std::os::unix::fs::symlink(&target, &link)
                .map_err(|e| io(&format!("linking {} to its volume", link.display()), e))?;
        }
        Ok(mounts)
    }

    fn ids(&self) -> Result<Vec<SandboxId>, DriverError> {
        let entries = std::fs::read_dir(&self.config.root).map_err(|e| io("listing sandboxes", e))?;
        let mut ids: Vec<SandboxId> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            // The driver's own folders start with a dot; sandbox ids never do.
            .filter(|name| !name.starts_with('.'))
            .map(SandboxId::new)
            .collect();
        ids.sort();
        Ok(ids)
    }
}

#[async_trait]
impl<O: Os> Driver for ProcessDriver<O> {
    fn name(&self) -> &'static str {
        "process"
    }

    fn admit(&self, spec: &SandboxSpec) -> Result<(), berth_core::Error> {
        if !spec.egress.is_none() {
            // Its runs share the host's network: nothing outside them could hold them to a list.
            return Err(berth_core::Error::Unenforceable {
                field: "spec.egress.allow".into(),
                driver: "process",
                reason: "a process shares this host's network, so no egress policy can be enforced on it; use the \
                         docker or podman driver"
                    .into(),
            });
        }
        berth_core::limits::fit_host(&spec.limits, self.inner.os.cpus(), "process")?;
        match self.inner.os.unenforceable(&spec.limits) {
            None => Ok(()),
            Some((field, reason)) => {
                Err(berth_core::Error::Unenforceable { field: field.into(), driver: "process", reason })
            }
        }
    }

    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        let _guard = self.inner.locks.lock(&launch.sandbox, true).await?;
        self.inner.start_locked(&launch, None).await
    }

    #[cfg(feature = "fault-points")]
    async fn start_then_crash(&self, launch: Launch, at: CrashPoint) -> Result<(), DriverError> {
        let _guard = self.inner.locks.lock(&launch.sandbox, true).await?;
        cut_short(self.inner.start_locked(&launch, Some(at)).await, at)
    }

    async fn stop(&self, sandbox: &SandboxId, generation: u64, grace: Duration) -> Result<RuntimeState, DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.stop_superseded_or(sandbox, generation, grace, None).await
    }

    #[cfg(feature = "fault-points")]
    async fn stop_then_crash(
        &self,
        sandbox: &SandboxId,
        generation: u64,
        grace: Duration,
        at: CrashPoint,
    ) -> Result<(), DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        cut_short(self.inner.stop_superseded_or(sandbox, generation, grace, Some(at)).await, at)
    }

    async fn delete(&self, sandbox: &SandboxId, grace: Duration) -> Result<(), DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.delete_locked(sandbox, grace, None).await
    }

    #[cfg(feature = "fault-points")]
    async fn delete_then_crash(&self, sandbox: &SandboxId, grace: Duration, at: CrashPoint) -> Result<(), DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        cut_short(self.inner.delete_locked(sandbox, grace, Some(at)).await, at)
    }

    fn admit_pause(&self, hold: Hold) -> Result<(), berth_core::Error> {
        let refusal = match hold {
            Hold::Freezer => self.inner.os.no_freezer().map(|reason| ("pause", reason)),
            Hold::Checkpoint => Some(("checkpoint", NO_CHECKPOINTS.to_string())),
        };
        match refusal {
            None => Ok(()),
            Some((action, reason)) => Err(berth_core::Error::Unsupported { action, driver: "process", reason }),
        }
    }

    async fn pause(&self, sandbox: &SandboxId, hold: Hold) -> Result<RuntimeState, DriverError> {
        if hold == Hold::Checkpoint {
            return Err(DriverError::Failed(NO_CHECKPOINTS.to_string()));
        }
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.freeze_locked(sandbox, true).await
    }

    async fn resume(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.freeze_locked(sandbox, false).await
    }

    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.observe(sandbox)
    }

    async fn snapshot(&self, sandbox: &SandboxId, snapshot: &SnapshotId) -> Result<Content, DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.snapshot_locked(sandbox, snapshot).await
    }

    async fn remove_snapshot(&self, snapshot: &SnapshotId) -> Result<(), DriverError> {
        self.inner.snapshots.remove(snapshot)
    }

    async fn snapshots(&self) -> Result<Vec<SnapshotId>, DriverError> {
        self.inner.snapshots.list()
    }

    async fn remove_volume(&self, volume: &VolumeId) -> Result<(), DriverError> {
        removed(std::fs::remove_dir_all(self.inner.volume_dir(volume)), "removing the volume's files")
    }

    async fn volume_bytes(&self, volume: &VolumeId) -> Result<u64, DriverError> {
        crate::tree_bytes(self.inner.volume_dir(volume)).await
    }

    async fn volumes(&self) -> Result<Vec<VolumeId>, DriverError> {
        let entries = match std::fs::read_dir(self.inner.config.root.join(VOLUMES_DIR)) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing volumes", e)),
        };
        let mut volumes: Vec<VolumeId> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .map(VolumeId::new)
            .collect();
        volumes.sort();
        Ok(volumes)
    }

    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError> {
        ListPage::of(self, self.inner.ids()?, after, limit).await
    }

    async fn workspace(&self, sandbox: &SandboxId) -> Result<PathBuf, DriverError> {
        let workspace = self.workspace(sandbox);
        if !workspace.is_dir() {
            return Err(DriverError::Failed("the sandbox has no workspace yet: it has not started".into()));
        }
        Ok(workspace)
    }

    async fn logs(
        &self,
        sandbox: &SandboxId,
        log: &berth_logs::Log,
        from: u64,
        max: usize,
        over: bool,
    ) -> Result<berth_logs::Read, DriverError> {
        crate::read_logs(&self.inner.logs_dir(sandbox), log, from, max, over)
    }

    async fn watch(&self) -> Result<WatchStream, DriverError> {
        let inner = Arc::clone(&self.inner);
        self.inner.monitor.call_once(|| {
            tokio::spawn(Arc::clone(&inner).monitor());
        });
        // Subscribe before the sync, so nothing that changes in between is missed.
        let events = inner.events.subscribe();
        let mut sync = Vec::new();
        for id in inner.ids()? {
            let _guard = inner.locks.lock(&id, false).await?;
            let state = inner.observe(&id)?;
            sync.push(Ok(WatchEvent::Sync { sandbox: id, state }));
        }
        sync.push(Ok(WatchEvent::Synced));
        let live = futures_util::stream::unfold(events, |mut events| async move {
            let item = match events.recv().await {
                Ok((sandbox, state)) => Ok(WatchEvent::Changed { sandbox, state }),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Err(DriverError::Unavailable(format!("the watch fell {n} events behind")))
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((item, events))
        });
        Ok(Box::pin(futures_util::StreamExt::chain(futures_util::stream::iter(sync), live)))
    }
}
