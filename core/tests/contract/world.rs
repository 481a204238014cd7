//! A small deterministic world for driving berth-core in tests: a CAS store, a runtime with a
//! clock of its own that keeps every run it made, and an executor doing what the gateway does
//! (read, decide, write conditionally, re-read and re-decide after a conflict, then queue
//! effects). Everything is synchronous and explicit, so a test pins one interleaving.

use std::collections::{BTreeMap, VecDeque};

use berth_core::cas::{Retry, RetryPolicy};
use berth_core::exec::{Exec, ExecId};
use berth_core::placement::{Capacity, Node};
use berth_core::start_gate::{self, Gate, StartRecord};
use berth_core::{
    Command, Conflict, Decision, Effect, Error, ExitMarker, Hold, Key, Kind, MainProcess, NodeId, Observation, Outcome,
    Provider, Reads, Request, RuntimeSource, RuntimeState, Sandbox, SandboxId, SandboxSpec, Snapshot, StartReply,
    Timestamp, Volume, Write, decide, merge,
};

/// The one node these tests place on: live, in epoch 1, with room for a thousand sandboxes,
/// holding what `sandboxes` reserve.
pub fn nodes<'s>(sandboxes: impl IntoIterator<Item = &'s Sandbox>) -> Vec<Node> {
    let id = NodeId::new("n1");
    let placed = berth_core::placement::loads(sandboxes).remove(&id).unwrap_or_default();
    vec![Node {
        id,
        epoch: 1,
        live: true,
        draining: false,
        labels: BTreeMap::new(),
        capacity: Capacity { cpu_millis: 0, memory_bytes: 0, sandboxes: 1000 },
        placed,
    }]
}

/// Every path a runtime report can come by.
pub const SOURCES: [RuntimeSource; 5] = [
    RuntimeSource::WatchEvent,
    RuntimeSource::InitialSync,
    RuntimeSource::PollGet,
    RuntimeSource::PollList,
    RuntimeSource::RecoveryLookup,
];

/// One run the runtime made, with the generation whose identity it carried (ground truth the
/// core never sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRecord {
    pub generation: u64,
    pub started_at: Timestamp,
    pub finished: Option<(Timestamp, i32)>,
    /// How a pause holds it, if one does.
    pub held: Option<Hold>,
}

impl RunRecord {
    pub fn marker(&self) -> Option<ExitMarker> {
        self.finished.map(|(finished_at, exit_code)| ExitMarker {
            started_at: self.started_at,
            finished_at,
            exit_code,
            out_of_memory: false,
        })
    }

    pub fn state(&self) -> RuntimeState {
        match self.marker() {
            Some(m) => RuntimeState::Exited(m),
            None => RuntimeState::Running { started_at: self.started_at, held: self.held },
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Container {
    pub runs: Vec<RunRecord>,
}

impl Container {
    pub fn alive(&self) -> Option<&RunRecord> {
        self.runs.last().filter(|r| r.finished.is_none())
    }

    pub fn state(&self) -> RuntimeState {
        self.runs.last().map_or(RuntimeState::Created, RunRecord::state)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Store {
    pub sandboxes: BTreeMap<SandboxId, Sandbox>,
    pub providers: BTreeMap<String, Provider>,
    pub execs: BTreeMap<(SandboxId, ExecId), Exec>,
    pub templates: BTreeMap<String, berth_core::template::Template>,
    pub snapshots: BTreeMap<String, Snapshot>,
    pub volumes: BTreeMap<String, Volume>,
}

impl Store {
    /// A store holding one sandbox named "box" (id "sb-1"), created at `now` from `spec` (and
    /// an absolute `deadline`).
    pub fn with_box(spec: SandboxSpec, deadline: Option<Timestamp>, now: Timestamp) -> Self {
        let mut store = Store::default();
        let command = create_box(spec, deadline);
        store.execute_once(&Request::new(command, None), now).unwrap();
        store
    }

    /// Moves "box" to Ready at `now`, as its supervisor connecting does.
    pub fn box_ready(&mut self, now: Timestamp) {
        let before = self.by_name("box").cloned().unwrap();
        let connected = berth_core::Observation::SupervisorConnected {
            generation: before.generation,
            main: berth_core::MainProcess::Running,
        };
        let d = merge(Some(&before), &before.id, &connected, now).unwrap();
        self.commit(&d.writes).unwrap();
        assert_eq!(self.by_name("box").unwrap().phase, berth_core::Phase::Ready);
    }
    pub fn by_name(&self, name: &str) -> Option<&Sandbox> {
        self.sandboxes.values().find(|s| &*s.name == name)
    }

    fn version(&self, key: &Key) -> Option<u64> {
        match key {
            Key::Sandbox(id) => self.sandboxes.get(id).map(|s| s.resource_version),
            Key::Provider(name) => self.providers.get(name).map(|p| p.resource_version),
            Key::Exec(sandbox, id) => self.execs.get(&(sandbox.clone(), id.clone())).map(|e| e.resource_version),
            Key::Template(name) => self.templates.get(name).map(|t| t.resource_version),
            Key::Snapshot(name) => self.snapshots.get(name).map(|s| s.resource_version),
            Key::Volume(name) => self.volumes.get(name).map(|v| v.resource_version),
            Key::Clock => None,
        }
    }

    /// All conditions first, then all writes: atomic.
    pub fn commit(&mut self, writes: &[Write]) -> Result<(), Conflict> {
        for w in writes {
            // This store has no clock of its own: its time is the deciding one, which
            // `execute_once` holds every such condition to.
            if let Write::NotBefore(_) = w {
                continue;
            }
            let key = w.key();
            let current = self.version(&key);
            let name_taken = matches!(w, Write::CreateSandbox(s) if self.by_name(&s.name).is_some());
            if current != w.expected() || name_taken {
                return Err(Conflict { key, expected: w.expected(), current });
            }
        }
        for w in writes {
            match w.clone() {
                Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => {
                    let previous = self.sandboxes.get(&s.id).map_or(0, |p| p.resource_version);
                    assert_eq!(s.resource_version, previous + 1, "I5: every write adds one to the version");
                    self.sandboxes.insert(s.id.clone(), s);
                }
                Write::RemoveSandbox { id, .. } => {
                    self.sandboxes.remove(&id);
                    self.execs.retain(|(sandbox, _), _| *sandbox != id);
                }
                Write::CheckSandbox { .. } | Write::NotBefore(_) => {}
                Write::CreateExec(e) | Write::UpdateExec { record: e, .. } => {
                    self.execs.insert((e.sandbox.clone(), e.id.clone()), e);
                }
                Write::CreateProvider(p) | Write::UpdateProvider { record: p, .. } => {
                    self.providers.insert(p.name.clone(), p);
                }
                Write::RemoveProvider { name, .. } => {
                    self.providers.remove(&name);
                }
                Write::CreateTemplate(t) | Write::UpdateTemplate { record: t, .. } => {
                    self.templates.insert(t.name.clone(), t);
                }
                Write::RemoveTemplate { name, .. } => {
                    self.templates.remove(&name);
                }
                Write::CreateSnapshot(s) | Write::UpdateSnapshot { record: s, .. } => {
                    self.snapshots.insert(s.name.clone(), s);
                }
                Write::RemoveSnapshot { name, .. } => {
                    self.snapshots.remove(&name);
                }
                Write::CreateVolume(v) | Write::UpdateVolume { record: v, .. } => {
                    self.volumes.insert(v.name.clone(), v);
                }
                Write::RemoveVolume { name, .. } => {
                    self.volumes.remove(&name);
                }
            }
        }
        Ok(())
    }

    /// What the executor reads for `request`.
    pub fn reads(&self, request: &Request) -> Reads {
        let plan = request.plan();
        let sandbox = plan.sandbox.and_then(|s| self.by_name(s.name)).cloned();
        let providers = plan
            .providers_to_read(sandbox.as_ref())
            .into_iter()
            .filter_map(|n| self.providers.get(&n).map(|p| (n, p.clone())))
            .collect();
        let users = plan
            .users_of
            .map(|p| self.sandboxes.values().filter(|s| s.providers.contains(p)).cloned().collect())
            .unwrap_or_default();
        let template = plan.template.and_then(|t| self.templates.get(t.name)).cloned();
        let members = match (plan.members, &template) {
            (true, Some(t)) => {
                self.sandboxes.values().filter(|s| berth_core::template::is_member(s, &t.name)).cloned().collect()
            }
            _ => Vec::new(),
        };
        let open_execs = match (plan.open_execs, &sandbox) {
            (true, Some(s)) => self.execs.values().filter(|e| e.sandbox == s.id && !e.state.is_terminal()).count(),
            _ => 0,
        };
        let snapshot = plan.snapshot.and_then(|s| self.snapshots.get(s.name)).cloned();
        let snapshots = if plan.all_snapshots { self.snapshots.values().cloned().collect() } else { Vec::new() };
        let snapshot_users = match (plan.snapshot_users, &snapshot) {
            (true, Some(snap)) => self
                .sandboxes
                .values()
                .filter(|s| s.spec.labels.get(berth_core::snapshot::SNAPSHOT_LABEL) == Some(&snap.name))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        let volumes: BTreeMap<String, Volume> = plan
            .volumes_to_read()
            .into_iter()
            .filter_map(|n| self.volumes.get(n).map(|v| (n.to_string(), v.clone())))
            .collect();
        let volume_users = match (plan.volume_users, volumes.values().next()) {
            (true, Some(v)) => self
                .sandboxes
                .values()
                .filter(|s| s.spec.labels.get(&berth_core::volume::label(&v.name)) == Some(&v.id.to_string()))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        let names_taken = request
            .fork_names(snapshot.as_ref())
            .into_iter()
            .filter(|n| self.by_name(n).is_some())
            .map(str::to_string)
            .collect();
        Reads {
            sandbox,
            providers,
            users,
            template,
            members,
            open_execs,
            snapshot,
            snapshots,
            snapshot_users,
            names_taken,
            volumes,
            volume_users,
            nodes: if plan.places { nodes(self.sandboxes.values()) } else { Vec::new() },
            ..Reads::default()
        }
    }

    /// One read-decide-write of `request` by another client, landing in between.
    pub fn execute_once(&mut self, request: &Request, now: Timestamp) -> Result<Decision, Error> {
        let decision = decide(request, &self.reads(request), now)?;
        for w in &decision.writes {
            if let Write::NotBefore(at) = w {
                assert!(*at <= now, "a decision at {now:?} waits for the store's clock to reach {at:?}");
            }
        }
        self.commit(&decision.writes).expect("nothing else runs in between");
        Ok(decision)
    }

    /// A write by someone else that bumps the sandbox's version: an unrelated label-style change.
    pub fn bump(&mut self, name: &str) {
        if let Some(s) = self.by_name(name).cloned() {
            let mut next = s.clone();
            next.resource_version += 1;
            self.commit(&[Write::UpdateSandbox { record: next, expected: s.resource_version }]).unwrap();
        }
    }
}

pub struct World {
    pub store: Store,
    pub containers: BTreeMap<SandboxId, Container>,
    /// The driver's record of the newest generation it started per sandbox. Drivers keep it
    /// outside the compute resource, so an out-of-band removal does not erase it and a start of
    /// an older generation still in flight is refused even then.
    pub newest_started: BTreeMap<SandboxId, u64>,
    /// The runtime's clock; each runtime action advances it.
    pub runtime_clock: i64,
    /// The gateway's clock.
    pub now: Timestamp,
    /// Effects decided and not yet run, in order.
    pub effects: VecDeque<Effect>,
    /// Sandboxes another writer bumps between the next operation's first read and its write.
    pub interference: Vec<String>,
    pub next_id: u64,
    pub seed: u64,
    /// The snapshots the runtime keeps a copy of.
    pub kept: std::collections::BTreeSet<berth_core::SnapshotId>,
    /// The volumes the runtime keeps: made by the first run that mounts each.
    pub volumes_kept: std::collections::BTreeSet<berth_core::VolumeId>,
}

impl Default for World {
    fn default() -> Self {
        Self {
            store: Store::default(),
            containers: BTreeMap::new(),
            newest_started: BTreeMap::new(),
            runtime_clock: 1_000,
            now: Timestamp::from_unix_millis(1_700_000_000_000),
            effects: VecDeque::new(),
            interference: Vec::new(),
            next_id: 1,
            seed: 0x5eed,
            kept: Default::default(),
            volumes_kept: Default::default(),
        }
    }
}

/// The create of sandbox "box" (id "sb-1") from `spec` (and an absolute `deadline`).
pub fn create_box(spec: SandboxSpec, deadline: Option<Timestamp>) -> Command {
    Command::CreateSandbox {
        id: SandboxId::new("sb-1"),
        name: "box".into(),
        spec,
        providers: Default::default(),
        deadline,
    }
}

pub fn spec() -> SandboxSpec {
    SandboxSpec { image: "busybox".into(), command: vec!["sleep".into(), "infinity".into()], ..Default::default() }
}

impl World {
    pub fn tick(&mut self) -> Timestamp {
        self.runtime_clock += 10;
        self.now = self.now.plus(core::time::Duration::from_millis(1));
        Timestamp::from_unix_nanos(self.runtime_clock)
    }

    fn random(&mut self) -> u64 {
        // splitmix64: the test's own deterministic randomness for retry jitter.
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn sandbox(&self, name: &str) -> Sandbox {
        self.store.by_name(name).cloned().unwrap_or_else(|| panic!("no sandbox {name}"))
    }

    pub fn id(&self, name: &str) -> SandboxId {
        self.sandbox(name).id
    }

    fn interfere(&mut self) {
        for name in std::mem::take(&mut self.interference) {
            self.store.bump(&name);
        }
    }

    /// Runs `decide_once` under the CAS rule until its writes commit; queues the effects.
    fn cas_loop(
        &mut self,
        mut retry: Retry,
        mut decide_once: impl FnMut(&World) -> Result<Decision, Error>,
    ) -> Result<Decision, Error> {
        loop {
            let decision = decide_once(self)?;
            self.interfere();
            match self.store.commit(&decision.writes) {
                Ok(()) => {
                    self.effects.extend(decision.effects.iter().cloned());
                    return Ok(decision);
                }
                Err(conflict) => {
                    let random = self.random();
                    retry.after_conflict(&conflict, random)?;
                }
            }
        }
    }

    pub fn request(&mut self, command: Command, expected_version: Option<u64>) -> Result<Outcome, Error> {
        let request = Request::new(command, expected_version);
        self.now = self.now.plus(core::time::Duration::from_millis(1));
        let now = self.now;
        // The retry state the gateway gives an API command.
        let retry = Retry::for_request(RetryPolicy::default(), &request);
        self.cas_loop(retry, |w| decide(&request, &w.store.reads(&request), now)).map(|d| d.outcome)
    }

    pub fn create(&mut self, name: &str, providers: &[&str]) -> Result<Outcome, Error> {
        let id = SandboxId::new(format!("sb-{}", self.next_id));
        self.next_id += 1;
        self.request(
            Command::CreateSandbox {
                id,
                name: name.into(),
                spec: spec(),
                providers: providers.iter().map(|p| p.to_string()).collect(),
                deadline: None,
            },
            None,
        )
    }

    pub fn create_provider(&mut self, name: &str, key: &str) -> Result<Outcome, Error> {
        self.request(
            Command::CreateProvider {
                endpoints: Default::default(),
                name: name.into(),
                kind: "test".into(),
                credentials: [(key.to_string(), berth_core::Secret::new("s3cret"))].into(),
            },
            None,
        )
    }

    pub fn stop(&mut self, name: &str) -> Result<Outcome, Error> {
        self.request(Command::StopSandbox { name: name.into() }, None)
    }

    pub fn start(&mut self, name: &str) -> Result<Outcome, Error> {
        self.request(Command::StartSandbox { name: name.into() }, None)
    }

    pub fn delete(&mut self, name: &str) -> Result<Outcome, Error> {
        self.request(Command::DeleteSandbox { name: name.into() }, None)
    }

    /// Merges one observation under the CAS rule.
    pub fn observe(&mut self, id: &SandboxId, observation: Observation) -> Result<Decision, Error> {
        self.now = self.now.plus(core::time::Duration::from_millis(1));
        let now = self.now;
        self.cas_loop(Retry::new(RetryPolicy::default(), Kind::Sandbox, id.as_str()), |w| {
            merge(w.store.sandboxes.get(id), id, &observation, now)
        })
    }

    pub fn snapshot(&self, id: &SandboxId) -> RuntimeState {
        self.containers.get(id).map_or(RuntimeState::Absent { at: None }, Container::state)
    }

    /// A poll of the runtime, as the reconcile loop makes one (version read first).
    pub fn poll(&mut self, id: &SandboxId, state: RuntimeState) -> Result<Decision, Error> {
        let as_of_version = self.store.sandboxes.get(id).map(|s| s.resource_version);
        self.observe(id, Observation::Runtime { source: RuntimeSource::PollGet, state, as_of_version })
    }

    /// Runs one effect against the runtime; returns the driver's reply as an observation.
    pub fn perform(&mut self, effect: &Effect) -> (SandboxId, Observation) {
        match effect {
            Effect::Start { sandbox, generation } => {
                let now = self.tick();
                let record = self.newest_started.get(sandbox).map(|g| StartRecord::confirmed(*g));
                let this_run =
                    self.containers.get(sandbox).and_then(|c| c.runs.iter().find(|r| r.generation == *generation));
                let reply = match start_gate::gate(record, *generation) {
                    Gate::Superseded { newest } => start_gate::superseded(*generation, newest),
                    // At most one run per generation, even once it was removed.
                    Gate::Report => start_gate::report(this_run.map(RunRecord::state)),
                    Gate::Resume | Gate::Start => {
                        let c = self.containers.entry(sandbox.clone()).or_default();
                        if let Some(alive) = c.runs.last_mut().filter(|r| r.finished.is_none()) {
                            alive.finished = Some((now, 143));
                        }
                        let started_at = Timestamp::from_unix_nanos(now.unix_nanos() + 5);
                        c.runs.push(RunRecord { generation: *generation, started_at, finished: None, held: None });
                        if let Some(record) = self.store.sandboxes.get(sandbox) {
                            self.volumes_kept
                                .extend(berth_core::volume::mounts(&record.spec).into_iter().map(|(id, _)| id));
                        }
                        self.newest_started.insert(sandbox.clone(), *generation);
                        StartReply::Running { started_at }
                    }
                };
                (sandbox.clone(), Observation::Started { generation: *generation, reply })
            }
            Effect::Stop { sandbox, generation } => {
                let now = self.tick();
                let state = match self.containers.get_mut(sandbox) {
                    None => RuntimeState::Absent { at: None },
                    Some(c) => {
                        if let Some(alive) = c.runs.last_mut().filter(|r| r.finished.is_none()) {
                            alive.finished = Some((now, 143));
                        }
                        c.state()
                    }
                };
                (sandbox.clone(), Observation::Stopped { generation: *generation, state })
            }
            Effect::Pause { sandbox, .. } | Effect::Resume { sandbox, .. } => {
                self.tick();
                let held = match effect {
                    Effect::Pause { hold, .. } => Some(*hold),
                    _ => None,
                };
                let pause = held.is_some();
                let c = self.containers.get_mut(sandbox);
                if let Some(alive) = c.and_then(|c| c.runs.last_mut()).filter(|r| r.finished.is_none()) {
                    alive.held = held;
                }
                let source = if pause { RuntimeSource::PauseReply } else { RuntimeSource::ResumeReply };
                let state = self.snapshot(sandbox);
                (sandbox.clone(), Observation::Runtime { source, state, as_of_version: None })
            }
            Effect::Delete { sandbox } => {
                self.tick();
                self.containers.remove(sandbox);
                self.newest_started.remove(sandbox);
                (sandbox.clone(), Observation::Deleted)
            }
            Effect::Snapshot { .. } | Effect::RemoveSnapshot { .. } | Effect::RemoveVolume { .. } => {
                panic!("a snapshot's or volume's effect is answered by a command: World::perform_snapshot")
            }
        }
    }

    /// Runs a snapshot's or volume's effect against the runtime; returns its answer as the
    /// server-owned command the gateway makes of it. A copy sums the files the source's runs
    /// wrote, so two copies of one unchanged sandbox sum the same.
    pub fn perform_snapshot(&mut self, effect: &Effect) -> Command {
        self.tick();
        match effect {
            Effect::Snapshot { snapshot, name, sandbox } => {
                let result = match self.containers.get(sandbox) {
                    Some(c) => Ok(berth_core::record::Content {
                        size_bytes: 10 * c.runs.len() as u64,
                        sha256: format!("{sandbox}:{}", c.runs.len()),
                        image: None,
                    }),
                    None => Err(format!("sandbox {sandbox} has no files")),
                };
                self.kept.insert(snapshot.clone());
                Command::SnapshotTaken { name: name.clone(), id: snapshot.clone(), result }
            }
            Effect::RemoveSnapshot { snapshot, name } => {
                self.kept.remove(snapshot);
                Command::SnapshotRemoved { name: name.clone(), id: snapshot.clone() }
            }
            Effect::RemoveVolume { volume, name } => {
                // S2: nothing is removed under a container that mounts it.
                let mounted = self
                    .store
                    .sandboxes
                    .values()
                    .filter(|s| self.containers.contains_key(&s.id))
                    .any(|s| berth_core::volume::mounts(&s.spec).iter().any(|(id, _)| id == volume));
                assert!(!mounted, "S2: volume {name} removed under a container that mounts it");
                self.volumes_kept.remove(volume);
                Command::VolumeRemoved { name: name.clone(), id: volume.clone() }
            }
            other => panic!("not a snapshot's effect: {other:?}"),
        }
    }

    /// Runs the oldest queued effect and merges its reply.
    pub fn run_effect(&mut self) -> Option<Result<Decision, Error>> {
        let effect = self.effects.pop_front()?;
        if let berth_core::decision::Subject::Snapshot(_) | berth_core::decision::Subject::Volume(_) = effect.subject()
        {
            let answer = self.perform_snapshot(&effect);
            let request = Request::new(answer, None);
            let retry = Retry::for_request(RetryPolicy::default(), &request);
            return Some(self.cas_loop(retry, |w| decide(&request, &w.store.reads(&request), w.now)));
        }
        let (id, reply) = self.perform(&effect);
        Some(self.observe(&id, reply))
    }

    pub fn run_all_effects(&mut self) {
        let mut budget = 1_000;
        while let Some(result) = self.run_effect() {
            result.expect("merging a driver reply never fails");
            budget -= 1;
            assert!(budget > 0, "effects keep producing effects");
        }
    }

    /// The workload of the live run exits by itself.
    pub fn exit_workload(&mut self, id: &SandboxId, code: i32) -> Option<ExitMarker> {
        let now = self.tick();
        let run = self.containers.get_mut(id)?.runs.last_mut().filter(|r| r.finished.is_none())?;
        run.finished = Some((now, code));
        run.marker()
    }

    /// The supervisor of the live run connects with its generation's token.
    pub fn connect_live_supervisor(&mut self, id: &SandboxId) -> Option<Result<Decision, Error>> {
        let generation = self.containers.get(id)?.alive()?.generation;
        Some(self.observe(id, Observation::SupervisorConnected { generation, main: MainProcess::Running }))
    }
}
