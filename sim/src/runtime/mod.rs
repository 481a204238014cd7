//! The simulated runtime, the only fake runtime in Berth: a container engine (create, start,
//! stop, inspect, list, events, remove, volumes), or a host's kernel for the process driver
//! ([`crate::kernel`]), on a turmoil host of its own, so its work outlives gateway crashes as a
//! real daemon's or a host's processes do. Gateways drive it through the real drivers (their
//! bookkeeping, start gates and locks): the container driver over [`crate::engine::SimEngine`],
//! the process driver over [`crate::os::SimOs`], so a gateway dying between any two steps of a
//! driver operation is one of the runs explored.
//!
//! It is as unkind as the engine contract allows: a multi-step start during which every look
//! still shows the previous run, calls that fail before their effect, replies lost or late after
//! it, events late, twice, out of order or never, streams that drop, volumes that linger a moment
//! after their removal, and containers removed, killed or restarted behind Berth's back. Like a
//! real container, a run's supervisor reads its token from the file the driver installed, as it
//! is when the run starts. Every run is kept with the generation its token carried: the ground
//! truth the checkers compare the records with.

use std::sync::Arc;
use std::time::Duration;

use berth_core::SandboxId;
use berth_core::identity::{IdentityKey, verify_token};
use berth_drivers::container::{
    ContainerSpec, EngineError, EngineEvent, Inspection, LABEL_NAME, Start, Status, container_name,
    sandbox_of_container,
};
use berth_drivers::handoff::{began, flag, token};
use berth_gateway::store::Store;
use tokio::sync::{mpsc, oneshot, watch};

use crate::invariants::{Invariant, d1_one_run};
use crate::scenario::{Draw, Stream};
use crate::trace::Kind;
use crate::world::{World, lock};

mod model;
mod out_of_band;

pub use model::*;
pub use out_of_band::CRASH;
pub(crate) use out_of_band::crash_loops;

/// How long the engine's client waits for the runtime before it calls the call unanswered.
pub const DRIVER_TIMEOUT: Duration = Duration::from_secs(5);

/// A call of the engine API.
pub enum Call {
    Create(Box<ContainerSpec>),
    Start(SandboxId),
    Stop(SandboxId),
    /// Freeze (`true`) or thaw the container's run.
    Freeze(SandboxId, bool),
    /// Write the container's run to a checkpoint (`true`), or restore it from one.
    Checkpoint(SandboxId, bool),
    Remove(SandboxId),
    Inspect(SandboxId),
    List,
    CreateVolume(String),
    RemoveVolume(String),
    ListVolumes,
    /// Where the volume's files are on the runtime's host.
    VolumePath(String),
    /// Commit the container's filesystem as image `reference`.
    Commit(SandboxId, String),
    /// Give image `source` the further name `target`.
    Tag(String, String),
    RemoveImage(String),
    /// The tags of a repository's images.
    ImageTags(String),
    Events,
    /// The supervisor of `(sandbox, generation)` exits by itself, for `cause` (it was rejected,
    /// or its command could not be started): its run ends.
    SupervisorExited(SandboxId, u64, EndCause),
}

impl Call {
    /// What the trace calls it.
    pub fn describe(&self, runtime: &RuntimeModel) -> String {
        match self {
            Call::Create(spec) => format!("create {}", spec.labels.get(LABEL_NAME).map_or("?", String::as_str)),
            Call::Start(id) => format!("start {}", runtime.name(id)),
            Call::Stop(id) => format!("stop {}", runtime.name(id)),
            Call::Freeze(id, true) => format!("pause {}", runtime.name(id)),
            Call::Freeze(id, false) => format!("unpause {}", runtime.name(id)),
            Call::Checkpoint(id, true) => format!("checkpoint {}", runtime.name(id)),
            Call::Checkpoint(id, false) => format!("restore {}", runtime.name(id)),
            Call::Remove(id) => format!("remove {}", runtime.name(id)),
            Call::Inspect(id) => format!("inspect {}", runtime.name(id)),
            Call::List => "list".into(),
            Call::CreateVolume(_) => "create volume".into(),
            Call::RemoveVolume(_) => "remove volume".into(),
            Call::ListVolumes => "list volumes".into(),
            Call::VolumePath(_) => "volume path".into(),
            Call::Commit(id, reference) => format!("commit {} as {reference}", runtime.name(id)),
            Call::Tag(source, target) => format!("tag {source} as {target}"),
            Call::RemoveImage(reference) => format!("remove image {reference}"),
            Call::ImageTags(repository) => format!("list images of {repository}"),
            Call::Events => "events".into(),
            Call::SupervisorExited(id, generation, _) => {
                format!("supervisor of {} {generation} exits", runtime.name(id))
            }
        }
    }
}

pub enum Answer {
    Done,
    Started(Start),
    Inspection(Option<Inspection>),
    Sandboxes(Vec<SandboxId>),
    Volumes(Vec<String>),
    Path(Option<std::path::PathBuf>),
    Events(mpsc::UnboundedReceiver<Result<EngineEvent, EngineError>>),
    Failed(EngineError),
}

impl From<Result<(), EngineError>> for Answer {
    fn from(result: Result<(), EngineError>) -> Self {
        result.map_or_else(Answer::Failed, |()| Answer::Done)
    }
}

pub struct Request {
    /// The gateway whose driver called.
    pub gateway: usize,
    pub call: Call,
    pub reply: oneshot::Sender<Answer>,
}

/// The runtime's wiring: calls in, supervisors out.
pub struct Runtime {
    pub(crate) world: Arc<World>,
    draw: std::sync::Mutex<Draw>,
    supervisors: mpsc::UnboundedSender<Spawn>,
    key: IdentityKey,
}

impl Runtime {
    pub fn new(world: Arc<World>, supervisors: mpsc::UnboundedSender<Spawn>) -> Arc<Self> {
        let draw = Draw::new(world.scenario.seed, Stream::Runtime);
        let key = IdentityKey::from_bytes(crate::gateway::IDENTITY_KEY);
        Arc::new(Self { world, draw: std::sync::Mutex::new(draw), supervisors, key })
    }

    pub(crate) fn draw<T>(&self, f: impl FnOnce(&mut Draw) -> T) -> T {
        f(&mut lock(&self.draw))
    }

    pub(crate) fn fault(&self, p: f64) -> bool {
        self.world.faults_on() && p > 0.0 && self.draw(|d| d.chance(p))
    }

    pub(crate) fn between(&self, (low, high): (Duration, Duration)) -> Duration {
        self.draw(|d| d.millis(low.as_millis() as u64, high.as_millis().max(low.as_millis()) as u64))
    }

    pub(crate) fn between_millis(&self, low: u64, high: u64) -> Duration {
        self.draw(|d| d.millis(low, high))
    }

    pub(crate) fn name(&self, id: &SandboxId) -> String {
        lock(&self.world.runtime).name(id)
    }

    pub(crate) fn key(&self) -> &IdentityKey {
        &self.key
    }

    /// Sometimes crashes the calling gateway right after its call took effect.
    pub(crate) fn crash_after(&self, gateway: usize, effect: String) {
        if self.fault(self.world.scenario.faults.crashes_after_effects) {
            self.world.request_crash(gateway, effect);
        }
    }

    /// Starts a run's supervisor session.
    pub(crate) fn supervise(&self, spawn: Spawn) {
        let _ = self.supervisors.send(spawn);
    }

    /// Serves calls forever, the engine's and the kernel's; each runs as a task of its own.
    pub async fn serve(
        self: Arc<Self>,
        mut calls: mpsc::UnboundedReceiver<Request>,
        kernel: mpsc::UnboundedReceiver<crate::kernel::KernelCall>,
    ) -> turmoil::Result {
        tokio::spawn(Arc::clone(&self).inject_faults());
        tokio::spawn(Arc::clone(&self).serve_kernel(kernel));
        while let Some(request) = calls.recv().await {
            tokio::spawn(Arc::clone(&self).handle(request));
        }
        Ok(())
    }

    async fn handle(self: Arc<Self>, request: Request) {
        if let Call::SupervisorExited(id, generation, cause) = &request.call {
            // A rejected berth-supervisor stops its workload, records the exit and exits; one
            // whose command never started has recorded it already.
            if !self.end_run(id, Some(*generation), cause.supervisor_status(), *cause)
                && let Some(supervisor) = self.live_process(id, Some(*generation))
            {
                self.stop_command(id, supervisor, *cause);
            }
            return;
        }
        // Fails before its effect: the runtime answered an error and did nothing.
        if self.fault(self.world.scenario.faults.failed_calls) {
            let what = request.call.describe(&lock(&self.world.runtime));
            self.world.event("runtime", Kind::CallFailed, what);
            let _ = request.reply.send(Answer::Failed(EngineError::Unreachable("the runtime failed the call".into())));
            return;
        }
        let gateway = request.gateway;
        let effect = match &request.call {
            Call::Create(_)
            | Call::Start(_)
            | Call::Stop(_)
            | Call::Freeze(..)
            | Call::Checkpoint(..)
            | Call::Remove(_)
            | Call::Commit(..)
            | Call::Tag(..)
            | Call::RemoveImage(_) => Some(request.call.describe(&lock(&self.world.runtime))),
            _ => None,
        };
        let answer = match request.call {
            Call::Create(spec) => self.create(*spec).into(),
            Call::Start(id) => self.start(&id).await.map_or_else(Answer::Failed, Answer::Started),
            Call::Stop(id) => self.stop(&id).await.into(),
            Call::Freeze(id, frozen) => self.freeze(&id, frozen).await.into(),
            Call::Checkpoint(id, true) => self.checkpoint(&id).await.into(),
            Call::Checkpoint(id, false) => self.restore(&id).await.into(),
            Call::Remove(id) => {
                self.remove(&id, EndCause::Deleted).await;
                Answer::Done
            }
            Call::Inspect(id) => {
                Answer::Inspection(lock(&self.world.runtime).containers.get(&id).map(Container::inspection))
            }
            Call::List => Answer::Sandboxes(lock(&self.world.runtime).containers.keys().cloned().collect()),
            Call::CreateVolume(name) => {
                let dir = self.volume_dir(&name);
                lock(&self.world.runtime).volumes.insert(name);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| EngineError::Unreachable(format!("creating {}: {e}", dir.display())))
                    .into()
            }
            Call::VolumePath(name) => {
                let kept = lock(&self.world.runtime).volumes.contains(&name);
                Answer::Path(kept.then(|| self.volume_dir(&name)))
            }
            Call::Commit(id, reference) => lock(&self.world.runtime).commit(&id, reference).into(),
            Call::Tag(source, target) => lock(&self.world.runtime).tag(&source, target).into(),
            Call::RemoveImage(reference) => {
                lock(&self.world.runtime).images.remove(&reference);
                Answer::Done
            }
            Call::ImageTags(repository) => Answer::Volumes(lock(&self.world.runtime).tags(&repository)),
            Call::RemoveVolume(name) => {
                self.remove_volume(name);
                Answer::Done
            }
            Call::ListVolumes => Answer::Volumes(lock(&self.world.runtime).volumes.iter().cloned().collect()),
            Call::Events => Answer::Events(self.subscribe()),
            Call::SupervisorExited(..) => return,
        };
        if let Some(effect) = effect {
            self.crash_after(gateway, effect);
        }
        self.reply(request.reply, answer);
    }

    /// Replies, unless this reply is to be lost or late (the effect happened either way).
    fn reply(self: &Arc<Self>, tx: oneshot::Sender<Answer>, answer: Answer) {
        if matches!(answer, Answer::Events(_)) {
            let _ = tx.send(answer);
        } else if self.fault(self.world.scenario.faults.lost_replies) {
            self.world.event("runtime", Kind::ReplyLost, "");
        } else if self.fault(self.world.scenario.faults.slow_replies) {
            self.world.event("runtime", Kind::ReplyLate, "");
            tokio::spawn(async move {
                tokio::time::sleep(DRIVER_TIMEOUT + Duration::from_secs(1)).await;
                let _ = tx.send(answer);
            });
        } else {
            let _ = tx.send(answer);
        }
    }

    fn sandbox_lock(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.world.runtime).locks.entry(id.clone()).or_default().clone()
    }

    pub(crate) fn refused(&self, id: &SandboxId, error: EngineError) -> Result<(), EngineError> {
        lock(&self.world.runtime).refusals.entry(id.clone()).or_default().push(World::micros());
        self.world.event("runtime", Kind::Refused, format!("{}: {error}", self.name(id)));
        Err(error)
    }

    fn create(&self, spec: ContainerSpec) -> Result<(), EngineError> {
        let Some(id) = sandbox_of_container(&spec.name) else {
            return Err(EngineError::Refused(format!("{} is not a sandbox's container", spec.name)));
        };
        {
            let mut m = lock(&self.world.runtime);
            if m.containers.contains_key(&id) {
                drop(m);
                let conflict = format!("Conflict. The container name \"/{}\" is already in use", spec.name);
                return self.refused(&id, EngineError::Refused(conflict));
            }
            if let Some(name) = spec.labels.get(LABEL_NAME) {
                m.name_sandbox(&id, name);
            }
            m.containers.insert(id.clone(), Container { runs: Vec::new(), spec });
        }
        self.world.event("runtime", Kind::Created, self.name(&id));
        self.emit(&id, false);
        Ok(())
    }

    async fn start(self: &Arc<Self>, id: &SandboxId) -> Result<Start, EngineError> {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        self.start_run(id, false).await
    }

    /// The multi-step start (the caller holds the container's lock): until its last step,
    /// every look shows what was there before. An engine asked to start a running container
    /// does nothing (Docker's 304).
    async fn start_run(self: &Arc<Self>, id: &SandboxId, out_of_band: bool) -> Result<Start, EngineError> {
        // Read apart from the match: a guard in the scrutinee would be held through its arms, and
        // `refused` takes the same lock.
        let status = lock(&self.world.runtime).containers.get(id).map(|c| c.inspection().status);
        match status {
            None => {
                let refused =
                    self.refused(id, EngineError::NotFound(format!("No such container: {}", container_name(id))));
                return refused.map(|()| Start::Began);
            }
            Some(Status::Running) => return Ok(Start::WasRunning),
            Some(_) => {}
        }
        self.world.event("runtime", Kind::StartBegins, self.name(id));
        tokio::time::sleep(self.between(self.world.scenario.start_duration)).await;
        let files = lock(&self.world.runtime)
            .containers
            .get(id)
            .map(|c| (c.host_file(flag::TOKEN_FILE), c.host_file(flag::BEGAN_FILE)));
        let (token_file, began_file) = files.unzip();
        let Some(token_file) = token_file else {
            return self
                .refused(id, EngineError::NotFound(format!("{} was removed as it started", container_name(id))))
                .map(|()| Start::Began);
        };
        // The supervisor reads its token as it starts.
        let token = token_file.and_then(|f| std::fs::read_to_string(f).ok()).map(|t| token::parse(&t).to_string());
        let generation = token.as_deref().and_then(|t| verify_token(&self.key, t).ok()).map(|i| i.generation);
        // Then records the generation it began as, as berth-supervisor's `--began-file` does.
        if let (Some(path), Some(generation)) = (began_file.flatten(), generation) {
            let _ = std::fs::write(path, began::to_bytes(generation));
        }
        let started_at = self.world.runtime_time();
        let (signal, watcher) = watch::channel(RunSignal::Running);
        let name = self.name(id);
        let unstartable = generation.is_some() && self.fault(self.world.scenario.faults.unstartable_commands);
        let (twice, crashes) = {
            let mut m = lock(&self.world.runtime);
            if let (true, Some(generation)) = (unstartable, generation) {
                m.unstartable.insert((id.clone(), generation));
            }
            let container = m.containers.get_mut(id).expect("looked up under the container's lock");
            drop_checkpoint(container);
            let twice = d1_one_run::started_twice(&name, &container.runs, generation, out_of_band);
            let crashes = crash_loops(&container.spec.command) && !unstartable;
            let generation = generation.unwrap_or(0);
            let token = token.clone().unwrap_or_default();
            container.runs.push(Run { out_of_band, ..Run::new(generation, started_at, token, signal) });
            (twice, crashes)
        };
        let how = if out_of_band { " (out of band)" } else { "" };
        self.world.event("runtime", Kind::Running, format!("{name} generation {}{how}", generation.unwrap_or(0)));
        if let Some(problem) = twice {
            self.world.violate(Invariant::D1, problem);
        }
        self.emit(id, false);
        match (generation, token) {
            (Some(generation), Some(token)) => {
                let failed_to_start = unstartable.then(|| self.cannot_start(id, generation));
                let _ = self.supervisors.send(Spawn {
                    sandbox: id.clone(),
                    generation,
                    token,
                    signal: watcher,
                    ghost: false,
                    failed_to_start,
                    home: None,
                });
                if crashes {
                    let (this, id, after) = (Arc::clone(self), id.clone(), self.crash_after_start());
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let alive = lock(&this.world.runtime).containers.get(&id).and_then(Container::alive_generation);
                        if alive == Some(generation) && this.world.faults_on() {
                            this.workload_exit(&id, None, true).await;
                        }
                    });
                }
            }
            // berth-supervisor exits at once without a valid token.
            _ => {
                self.end_run(id, None, 2, EndCause::SupervisorExit);
            }
        }
        Ok(Start::Began)
    }

    /// Ends the live run (of `generation`, if given) and reports it.
    fn end_run(&self, id: &SandboxId, generation: Option<u64>, code: i32, cause: EndCause) -> bool {
        let now = self.world.runtime_time();
        let ended = {
            let mut m = lock(&self.world.runtime);
            let Some(run) = m.containers.get_mut(id).and_then(Container::alive) else { return false };
            if generation.is_some_and(|g| g != run.generation) {
                return false;
            }
            run.finished = Some((now, code, cause));
            run.signal.send_replace(RunSignal::Ended);
            run.generation
        };
        self.world.event(
            "runtime",
            Kind::Exited,
            format!("{} generation {ended} code {code} ({cause:?})", self.name(id)),
        );
        self.emit(id, false);
        true
    }

    async fn stop(&self, id: &SandboxId) -> Result<(), EngineError> {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        let alive = match lock(&self.world.runtime).containers.get_mut(id) {
            None => return Err(EngineError::NotFound(format!("No such container: {}", container_name(id)))),
            Some(c) => c.alive().is_some(),
        };
        if alive {
            tokio::time::sleep(self.between(self.world.scenario.stop_duration)).await;
            self.check_stop_wanted(id).await;
            self.end_run(id, None, 143, EndCause::Stopped);
        }
        Ok(())
    }

    /// Docker's pause and unpause: only a live run can be frozen or thawed, and one already so
    /// is refused, as Docker refuses it (409).
    async fn freeze(&self, id: &SandboxId, frozen: bool) -> Result<(), EngineError> {
        let kind = if frozen { Kind::Paused } else { Kind::Resumed };
        self.hold_run(id, kind, |container, name, _| {
            let run = container.alive().ok_or_else(|| format!("Container {name} is not running"))?;
            if run.frozen == frozen {
                let state = if frozen { "already paused" } else { "not paused" };
                return Err(format!("Container {name} is {state}"));
            }
            run.frozen = frozen;
            Ok(())
        })
        .await
    }

    /// Podman's checkpoint (CRIU): a live run, not frozen, is written to disk and its processes
    /// end; the container shows exited. Its supervisor's connection goes with them.
    async fn checkpoint(&self, id: &SandboxId) -> Result<(), EngineError> {
        self.hold_run(id, Kind::Checkpointed, |container, name, at| {
            let run =
                container.alive().filter(|r| !r.frozen).ok_or_else(|| format!("container {name} is not running"))?;
            run.checkpointed = Some(at);
            run.signal.send_replace(RunSignal::Checkpointed);
            Ok(())
        })
        .await?;
        self.emit(id, false);
        Ok(())
    }

    /// Podman's restore: the checkpointed run comes back where it was, its start shown as now.
    async fn restore(&self, id: &SandboxId) -> Result<(), EngineError> {
        self.hold_run(id, Kind::Restored, |container, name, at| {
            let run = container.checkpointed().ok_or_else(|| format!("container {name} is not checkpointed"))?;
            run.checkpointed = None;
            run.restored_at = Some(at);
            run.signal.send_replace(RunSignal::Running);
            Ok(())
        })
        .await?;
        self.emit(id, false);
        Ok(())
    }

    /// Changes how the container's run is held (a pause, a checkpoint, or their undoing), under
    /// the container's lock: `change` makes the change at the runtime's time `at`, or says why
    /// the runtime refuses it; `kind` is what the trace calls it.
    async fn hold_run(
        &self,
        id: &SandboxId,
        kind: Kind,
        change: impl FnOnce(&mut Container, &str, berth_core::Timestamp) -> Result<(), String>,
    ) -> Result<(), EngineError> {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        let name = container_name(id);
        let at = self.world.runtime_time();
        {
            let mut m = lock(&self.world.runtime);
            let container =
                m.containers.get_mut(id).ok_or_else(|| EngineError::NotFound(format!("No such container: {name}")))?;
            change(container, &name, at).map_err(EngineError::Refused)?;
        }
        self.world.event("runtime", kind, self.name(id));
        Ok(())
    }

    /// D1 as a stop lands: against the record, and the run it stops.
    async fn check_stop_wanted(&self, id: &SandboxId) {
        let Ok(Some(record)) = self.world.store.sandbox(id).await else { return };
        let live = lock(&self.world.runtime).containers.get_mut(id).and_then(Container::alive).map(|r| r.generation);
        if let Some(problem) = d1_one_run::unwanted_stop(&record, live, "stopped") {
            self.world.violate(Invariant::D1, problem);
        }
    }

    /// Removes the container, forcibly (Berth's delete, or `docker rm -f` behind its back).
    async fn remove(&self, id: &SandboxId, cause: EndCause) {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        self.end_run(id, None, 137, cause);
        let at = self.world.runtime_time();
        let existed = {
            let mut m = lock(&self.world.runtime);
            let removed = m.containers.remove(id);
            let existed = removed.is_some();
            if let Some(mut container) = removed {
                drop_checkpoint(&mut container);
                m.removals.entry(id.clone()).or_default().push(at);
                m.removed_runs.entry(id.clone()).or_default().extend(container.runs);
            }
            existed
        };
        if existed {
            self.world.event("runtime", Kind::Removed, format!("{} ({cause:?})", self.name(id)));
            self.emit(id, true);
        }
    }

    /// Removes a volume; one still held a moment by the container's teardown stays listed
    /// until it is let go (the driver must look again before it calls its delete done).
    /// Where a volume's files are: beside the drivers' state, on the one simulated host.
    fn volume_dir(&self, name: &str) -> std::path::PathBuf {
        self.world.state_dir.join(".volumes").join(name)
    }

    fn remove_volume(self: &Arc<Self>, name: String) {
        let _ = std::fs::remove_dir_all(self.volume_dir(&name));
        if self.fault(self.world.scenario.faults.lingering_volumes) {
            let linger = self.draw(|d| d.millis(10, 500));
            self.world.event("runtime", Kind::VolumeLingers, format!("for {linger:?}"));
            let this = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(linger).await;
                lock(&this.world.runtime).volumes.remove(&name);
            });
        } else {
            lock(&self.world.runtime).volumes.remove(&name);
        }
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<Result<EngineEvent, EngineError>> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.world.runtime).subscribers.push(tx);
        rx
    }

    /// Sends an event to every watcher, each copy subject to this run's event faults.
    fn emit(&self, id: &SandboxId, removed: bool) {
        let at = self.world.runtime_time();
        let subscribers: Vec<Subscriber> = {
            let mut m = lock(&self.world.runtime);
            m.subscribers.retain(|s| !s.is_closed());
            m.subscribers.clone()
        };
        let faults = &self.world.scenario.faults;
        for subscriber in subscribers {
            if self.fault(faults.dropped_events) {
                self.world.event("runtime", Kind::EventDropped, self.name(id));
                continue;
            }
            let copies = if self.fault(faults.duplicate_events) { 2 } else { 1 };
            for _ in 0..copies {
                let event = Ok(EngineEvent { sandbox: id.clone(), removed, at });
                if self.fault(faults.late_events) {
                    let delay = self.draw(|d| d.millis(1, self.world.scenario.event_delay.as_millis() as u64));
                    let what = if removed { "removal" } else { "change" };
                    self.world.event("runtime", Kind::EventLate, format!("{} {what} by {delay:?}", self.name(id)));
                    let subscriber = subscriber.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = subscriber.send(event);
                    });
                } else {
                    let _ = subscriber.send(event);
                }
            }
        }
    }
}

/// A checkpoint a new start or a removal of its container leaves behind ends its run: never
/// restored, it never will be.
fn drop_checkpoint(container: &mut Container) {
    if let Some(run) = container.checkpointed() {
        let at = run.checkpointed.take().unwrap_or(run.started_at);
        run.finished = Some((at, 0, EndCause::CheckpointDropped));
        run.signal.send_replace(RunSignal::Ended);
    }
}
