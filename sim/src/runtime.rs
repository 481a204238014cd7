//! The simulated runtime, the only fake runtime in Berth. It runs on a turmoil host of its own,
//! so its work outlives gateway crashes, as a real daemon's does. It models what broke
//! production: a multi-step start during which every look still shows the previous run's exit,
//! replies that are lost or late after the effect happened, watch events that arrive late,
//! twice, out of order or never, streams that drop, and containers removed or killed behind
//! Berth's back. It keeps every run it made with the generation it carried: the ground truth the
//! checkers compare the records with.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth_core::start_gate::{self, Gate, StartRecord};
use berth_core::{ExitMarker, Intent, RuntimeState, SandboxId, StartReply, Timestamp};
use berth_drivers::{DriverError, Launch, ListPage, WatchEvent};
use berth_gateway::store::Store;
use tokio::sync::{mpsc, oneshot, watch};

use crate::scenario::Draw;
use crate::world::{World, lock};

/// How long the driver waits for the runtime before it calls the effect ambiguous.
pub const DRIVER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCause {
    Stopped,
    Deleted,
    /// A newer generation's start replaced it.
    Replaced,
    Killed,
    Removed,
    WorkloadExit,
    /// Its supervisor was rejected and exited.
    SupervisorExit,
}

/// What a run's supervisor is told about its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunSignal {
    Running,
    /// The workload exited with this code; the run ends right after.
    MainExited(i32),
    Ended,
}

pub struct Run {
    pub generation: u64,
    pub started_at: Timestamp,
    pub finished: Option<(Timestamp, i32, EndCause)>,
    pub token: String,
    signal: watch::Sender<RunSignal>,
}

impl Run {
    pub fn marker(&self) -> Option<ExitMarker> {
        self.finished.map(|(finished_at, exit_code, _)| ExitMarker {
            started_at: self.started_at,
            finished_at,
            exit_code,
        })
    }
}

#[derive(Default)]
pub struct Container {
    pub runs: Vec<Run>,
}

impl Container {
    fn alive(&mut self) -> Option<&mut Run> {
        self.runs.last_mut().filter(|r| r.finished.is_none())
    }

    pub fn state(&self) -> RuntimeState {
        match self.runs.last() {
            None => RuntimeState::Created,
            Some(run) => match run.marker() {
                Some(marker) => RuntimeState::Exited(marker),
                None => RuntimeState::Running { started_at: run.started_at },
            },
        }
    }
}

type Subscriber = mpsc::UnboundedSender<Result<WatchEvent, DriverError>>;

/// A run's supervisor to start.
pub struct Spawn {
    pub sandbox: SandboxId,
    pub generation: u64,
    pub token: String,
    pub signal: watch::Receiver<RunSignal>,
    /// A stale supervisor of an ended run, reconnecting with its old token.
    pub ghost: bool,
}

#[derive(Default)]
pub struct RuntimeModel {
    pub containers: BTreeMap<SandboxId, Container>,
    /// The newest generation started per sandbox: the driver starts none older.
    newest: BTreeMap<SandboxId, u64>,
    /// When each sandbox's container was removed (runtime clock).
    pub removals: BTreeMap<SandboxId, Vec<Timestamp>>,
    /// The runs of removed containers: ground truth outlives the container.
    pub removed_runs: BTreeMap<SandboxId, Vec<Run>>,
    /// Generations whose start the runtime refused.
    pub refused: BTreeMap<SandboxId, Vec<u64>>,
    /// Main-process exits the runtime's supervisors were told of: `(sandbox, generation)`.
    pub main_exits: Vec<(SandboxId, u64)>,
    subscribers: Vec<Subscriber>,
    locks: BTreeMap<SandboxId, Arc<tokio::sync::Mutex<()>>>,
    last_time: i64,
    /// Sandbox names, for the trace.
    names: BTreeMap<SandboxId, String>,
}

impl RuntimeModel {
    pub fn tick(&mut self, now: i64) -> Timestamp {
        self.last_time = (self.last_time + 1).max(now);
        Timestamp::from_unix_nanos(self.last_time)
    }

    pub fn state(&self, id: &SandboxId) -> RuntimeState {
        self.containers.get(id).map_or(RuntimeState::Absent { at: None }, Container::state)
    }

    /// The sandbox's name if the runtime has been told it, for the trace.
    pub fn name(&self, id: &SandboxId) -> String {
        self.names.get(id).cloned().unwrap_or_else(|| id.to_string())
    }

    /// Every run the sandbox ever had, its removed containers' included.
    pub fn runs(&self, id: &SandboxId) -> impl Iterator<Item = &Run> {
        let current = self.containers.get(id).map(|c| c.runs.iter()).into_iter().flatten();
        current.chain(self.removed_runs.get(id).into_iter().flatten())
    }
}

pub enum Call {
    Start(Box<Launch>),
    Stop(SandboxId),
    Delete(SandboxId),
    Get(SandboxId),
    List(Option<SandboxId>, usize),
    Watch,
    /// A supervisor exited (it was rejected): its run ends.
    SupervisorExited(SandboxId, u64),
}

pub enum Answer {
    Start(StartReply),
    State(RuntimeState),
    Deleted,
    List(ListPage),
    Watch(mpsc::UnboundedReceiver<Result<WatchEvent, DriverError>>),
}

pub struct Request {
    pub call: Call,
    pub reply: oneshot::Sender<Answer>,
}

/// The runtime's wiring: calls in, supervisors out.
pub struct Runtime {
    world: Arc<World>,
    draw: std::sync::Mutex<Draw>,
    supervisors: mpsc::UnboundedSender<Spawn>,
}

impl Runtime {
    pub fn new(world: Arc<World>, supervisors: mpsc::UnboundedSender<Spawn>) -> Arc<Self> {
        let draw = Draw::new(world.scenario.seed, 2);
        Arc::new(Self { world, draw: std::sync::Mutex::new(draw), supervisors })
    }

    fn draw<T>(&self, f: impl FnOnce(&mut Draw) -> T) -> T {
        f(&mut lock(&self.draw))
    }

    fn fault(&self, p: f64) -> bool {
        self.world.faults_on() && p > 0.0 && self.draw(|d| d.chance(p))
    }

    fn between(&self, (low, high): (Duration, Duration)) -> Duration {
        self.draw(|d| d.millis(low.as_millis() as u64, high.as_millis().max(low.as_millis()) as u64))
    }

    /// Serves calls forever; each runs as a task of its own.
    pub async fn serve(self: Arc<Self>, mut calls: mpsc::UnboundedReceiver<Request>) -> turmoil::Result {
        tokio::spawn(Arc::clone(&self).inject_faults());
        while let Some(request) = calls.recv().await {
            tokio::spawn(Arc::clone(&self).handle(request));
        }
        Ok(())
    }

    async fn handle(self: Arc<Self>, request: Request) {
        let answer = match request.call {
            Call::Start(launch) => Answer::Start(self.start(*launch).await),
            Call::Stop(id) => Answer::State(self.stop(&id).await),
            Call::Delete(id) => {
                self.delete(&id).await;
                Answer::Deleted
            }
            Call::Get(id) => Answer::State(lock(&self.world.runtime).state(&id)),
            Call::List(after, limit) => Answer::List(self.list(after.as_ref(), limit)),
            Call::Watch => Answer::Watch(self.subscribe()),
            Call::SupervisorExited(id, generation) => {
                self.end_run(&id, Some(generation), 1, EndCause::SupervisorExit);
                return;
            }
        };
        self.reply(request.reply, answer);
    }

    /// Replies, unless this reply is to be lost or late (the effect happened either way).
    fn reply(self: &Arc<Self>, tx: oneshot::Sender<Answer>, answer: Answer) {
        if matches!(answer, Answer::Watch(_)) {
            let _ = tx.send(answer);
        } else if self.fault(self.world.scenario.faults.lost_replies) {
            self.world.event("runtime", "reply lost", "");
        } else if self.fault(self.world.scenario.faults.slow_replies) {
            self.world.event("runtime", "reply late", "");
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

    async fn start(self: &Arc<Self>, launch: Launch) -> StartReply {
        let id = launch.sandbox.clone();
        let generation = launch.generation;
        let serialize = self.sandbox_lock(&id);
        let _guard = serialize.lock().await;
        {
            let mut m = lock(&self.world.runtime);
            m.names.insert(id.clone(), launch.name.clone());
            // This runtime's start is one step, so its record is never left unconfirmed.
            let record = m.newest.get(&id).map(|g| StartRecord::confirmed(*g));
            match start_gate::gate(record, generation) {
                Gate::Superseded { newest } => {
                    m.refused.entry(id.clone()).or_default().push(generation);
                    return start_gate::superseded(generation, newest);
                }
                // At most one run per generation, even once its container was removed out of band.
                Gate::Report => {
                    let run = m.containers.get(&id).and_then(|c| c.runs.iter().find(|r| r.generation == generation));
                    return start_gate::report(run.map(|r| match r.marker() {
                        Some(marker) => RuntimeState::Exited(marker),
                        None => RuntimeState::Running { started_at: r.started_at },
                    }));
                }
                Gate::Resume | Gate::Start => {}
            }
        }
        // The multi-step start: until its last step, every look shows what was there before.
        self.world.event("runtime", "start begins", format!("{} generation {generation}", launch.name));
        tokio::time::sleep(self.between(self.world.scenario.start_duration)).await;
        let now = self.world.runtime_time();
        let started_at = self.world.runtime_time();
        let (signal, watcher) = watch::channel(RunSignal::Running);
        {
            let mut m = lock(&self.world.runtime);
            let container = m.containers.entry(id.clone()).or_default();
            if let Some(old) = container.alive() {
                old.finished = Some((now, 143, EndCause::Replaced));
                old.signal.send_replace(RunSignal::Ended);
            }
            container.runs.push(Run {
                generation,
                started_at,
                finished: None,
                token: launch.token.expose().to_string(),
                signal,
            });
            m.newest.insert(id.clone(), generation);
        }
        let state = lock(&self.world.runtime).state(&id);
        self.world.event("runtime", "running", format!("{} generation {generation}", launch.name));
        self.emit(&id, state);
        let _ = self.supervisors.send(Spawn {
            sandbox: id,
            generation,
            token: launch.token.expose().to_string(),
            signal: watcher,
            ghost: false,
        });
        match state {
            RuntimeState::Running { started_at } => StartReply::Running { started_at },
            _ => StartReply::Failed { message: "the run vanished".to_string() },
        }
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
        let name = lock(&self.world.runtime).name(id);
        self.world.event("runtime", "exited", format!("{name} generation {ended} code {code} ({cause:?})"));
        let state = lock(&self.world.runtime).state(id);
        self.emit(id, state);
        true
    }

    async fn stop(&self, id: &SandboxId) -> RuntimeState {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        let alive = lock(&self.world.runtime).containers.get_mut(id).and_then(Container::alive).is_some();
        if alive {
            tokio::time::sleep(self.between(self.world.scenario.stop_duration)).await;
            self.check_stop_wanted(id).await;
            self.end_run(id, None, 143, EndCause::Stopped);
        }
        lock(&self.world.runtime).state(id)
    }

    /// D1, the harm Berth could do to itself: every stop is decided with intent Stopped, so a
    /// stop that lands on the current generation's run while the intent is Running (a stale
    /// effect that skipped its re-check, or whose re-check a newer start overtook) kills a run
    /// the user wants.
    async fn check_stop_wanted(&self, id: &SandboxId) {
        let Ok(Some(record)) = self.world.store.sandbox(id).await else { return };
        let live = lock(&self.world.runtime).containers.get_mut(id).and_then(Container::alive).map(|r| r.generation);
        if record.intent == Intent::Running && live == Some(record.generation) {
            self.world.violate(
                "D1",
                format!(
                    "{} was stopped at generation {} while its intent is Running ({})",
                    record.name, record.generation, record.phase
                ),
            );
        }
    }

    async fn delete(&self, id: &SandboxId) {
        let serialize = self.sandbox_lock(id);
        let _guard = serialize.lock().await;
        self.remove(id, EndCause::Deleted);
    }

    fn remove(&self, id: &SandboxId, cause: EndCause) {
        self.end_run(id, None, 137, cause);
        let at = self.world.runtime_time();
        let existed = {
            let mut m = lock(&self.world.runtime);
            let removed = m.containers.remove(id);
            let existed = removed.is_some();
            if let Some(container) = removed {
                m.removals.entry(id.clone()).or_default().push(at);
                m.removed_runs.entry(id.clone()).or_default().extend(container.runs);
            }
            existed
        };
        if existed {
            let name = lock(&self.world.runtime).name(id);
            self.world.event("runtime", "removed", format!("{name} ({cause:?})"));
            self.emit(id, RuntimeState::Absent { at: Some(at) });
        }
    }

    fn list(&self, after: Option<&SandboxId>, limit: usize) -> ListPage {
        let m = lock(&self.world.runtime);
        let mut items: Vec<(SandboxId, RuntimeState)> = m
            .containers
            .iter()
            .filter(|(id, _)| after.is_none_or(|a| *id > a))
            .take(limit + 1)
            .map(|(id, c)| (id.clone(), c.state()))
            .collect();
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().map(|(id, _)| id.clone())
        });
        ListPage { items, next: next.flatten() }
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<Result<WatchEvent, DriverError>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut m = lock(&self.world.runtime);
        for (id, c) in &m.containers {
            let _ = tx.send(Ok(WatchEvent::Sync { sandbox: id.clone(), state: c.state() }));
        }
        let _ = tx.send(Ok(WatchEvent::Synced));
        m.subscribers.push(tx);
        rx
    }

    /// Sends an event to every watcher, each copy subject to this run's event faults.
    fn emit(&self, id: &SandboxId, state: RuntimeState) {
        let subscribers: Vec<Subscriber> = {
            let mut m = lock(&self.world.runtime);
            m.subscribers.retain(|s| !s.is_closed());
            m.subscribers.clone()
        };
        let faults = &self.world.scenario.faults;
        for subscriber in subscribers {
            if self.fault(faults.dropped_events) {
                self.world.event("runtime", "event dropped", lock(&self.world.runtime).name(id));
                continue;
            }
            let copies = if self.fault(faults.duplicate_events) { 2 } else { 1 };
            for _ in 0..copies {
                let event = Ok(WatchEvent::Changed { sandbox: id.clone(), state });
                if self.fault(faults.late_events) {
                    let delay = self.draw(|d| d.millis(1, self.world.scenario.event_delay.as_millis() as u64));
                    let name = lock(&self.world.runtime).name(id);
                    self.world.event("runtime", "event late", format!("{name} {state:?} by {delay:?}"));
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

    /// The runtime-side faults: stream disconnects, removals, kills, workload exits and stale
    /// supervisors, at this run's rates, while faults are on.
    async fn inject_faults(self: Arc<Self>) {
        const EVERY: Duration = Duration::from_millis(100);
        let per_tick = |per_minute: f64| per_minute * EVERY.as_secs_f64() / 60.0;
        loop {
            tokio::time::sleep(EVERY).await;
            if !self.world.faults_on() {
                continue;
            }
            let f = self.world.scenario.faults.clone();
            if self.fault(per_tick(f.watch_disconnects)) {
                self.world.event("runtime", "watch streams dropped", "");
                lock(&self.world.runtime).subscribers.clear();
            }
            if self.fault(per_tick(f.removals))
                && let Some(id) = self.pick(|_| true)
            {
                self.remove(&id, EndCause::Removed);
            }
            if self.fault(per_tick(f.kills))
                && let Some(id) = self.pick(|c| c.runs.last().is_some_and(|r| r.finished.is_none()))
            {
                self.end_run(&id, None, 137, EndCause::Killed);
            }
            if self.fault(per_tick(f.workload_exits))
                && let Some(id) = self.pick(|c| c.runs.last().is_some_and(|r| r.finished.is_none()))
            {
                self.workload_exit(&id).await;
            }
            if self.fault(per_tick(f.stale_supervisors)) {
                self.ghost();
            }
        }
    }

    fn pick(&self, filter: impl Fn(&Container) -> bool) -> Option<SandboxId> {
        let ids: Vec<SandboxId> =
            lock(&self.world.runtime).containers.iter().filter(|(_, c)| filter(c)).map(|(id, _)| id.clone()).collect();
        (!ids.is_empty()).then(|| ids[self.draw(|d| d.below(ids.len() as u64)) as usize].clone())
    }

    /// The workload exits by itself: its supervisor reports it, then the run ends.
    async fn workload_exit(self: &Arc<Self>, id: &SandboxId) {
        // 0 is a completion (DESIGN 9.3); the others failures.
        let code = self.draw(|d| d.below(10) as i32);
        let generation = {
            let mut m = lock(&self.world.runtime);
            let Some(run) = m.containers.get_mut(id).and_then(Container::alive) else { return };
            run.signal.send_replace(RunSignal::MainExited(code));
            let generation = run.generation;
            m.main_exits.push((id.clone(), generation));
            generation
        };
        let name = lock(&self.world.runtime).name(id);
        self.world.event("runtime", "workload exits", format!("{name} generation {generation} code {code}"));
        let this = Arc::clone(self);
        let id = id.clone();
        let linger = self.draw(|d| d.millis(20, 500));
        tokio::spawn(async move {
            tokio::time::sleep(linger).await;
            this.end_run(&id, Some(generation), code, EndCause::WorkloadExit);
        });
    }

    /// A supervisor of an ended run reconnects with its old token.
    fn ghost(&self) {
        let ended: Vec<(SandboxId, u64, String)> = {
            let m = lock(&self.world.runtime);
            m.containers
                .iter()
                .flat_map(|(id, c)| {
                    c.runs.iter().filter(|r| r.finished.is_some()).map(|r| (id.clone(), r.generation, r.token.clone()))
                })
                .collect()
        };
        if ended.is_empty() {
            return;
        }
        let (sandbox, generation, token) = ended[self.draw(|d| d.below(ended.len() as u64)) as usize].clone();
        let name = lock(&self.world.runtime).name(&sandbox);
        self.world.event("runtime", "stale supervisor", format!("{name} generation {generation}"));
        let (_, signal) = watch::channel(RunSignal::Ended);
        let _ = self.supervisors.send(Spawn { sandbox, generation, token, signal, ghost: true });
    }
}
