//! A state-machine property test: random commands (with and without expected versions),
//! runtime reports from every path (fresh, stale, late, duplicated), supervisors of current and
//! old generations, lost driver replies and concurrent writers. I1, I3, I4, I5 and I6 are checked
//! after every step; a quiet phase at the end must converge every sandbox to its intent (I2, I7,
//! I8).
//!
//! The reference model is deliberately simple: for each sandbox name the set of intents
//! (or absence) the commands so far allow. Observations never change intent but for a run that
//! ends under a pause (Paused goes back to Running), so the system's actual intent must always
//! be in that set.

use std::collections::BTreeMap;

use berth_core::{
    Code, Command, Error, Hold, Intent, MainProcess, Observation, Outcome, PhaseKind, RuntimeSource, RuntimeState,
    SandboxId, recovery,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

use crate::world::{SOURCES, Store, World};

const NAMES: [&str; 3] = ["a", "b", "c"];
const PROVIDERS: [&str; 2] = ["p", "q"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// Server-owned: no version.
    None,
    /// The version the client just read.
    Current,
    /// A version that is no longer current.
    Stale,
}

#[derive(Clone, Debug)]
enum Step {
    Create {
        sandbox: usize,
        provider: Option<usize>,
    },
    Stop {
        sandbox: usize,
        version: Version,
    },
    Start {
        sandbox: usize,
        version: Version,
    },
    Delete {
        sandbox: usize,
        version: Version,
    },
    Pause {
        sandbox: usize,
        version: Version,
    },
    Resume {
        sandbox: usize,
        version: Version,
    },
    Attach {
        sandbox: usize,
        provider: usize,
        version: Version,
    },
    Detach {
        sandbox: usize,
        provider: usize,
        version: Version,
    },
    CreateProvider {
        provider: usize,
    },
    DeleteProvider {
        provider: usize,
        version: Version,
    },
    /// Run one queued effect (any of them: effects are reordered); the reply may be lost or
    /// delivered twice.
    RunEffect {
        index: usize,
        lose_reply: bool,
        duplicate: bool,
    },
    /// The runtime's current state, through one path.
    Observe {
        sandbox: usize,
        source: usize,
    },
    /// An earlier snapshot, delivered late.
    Replay {
        sandbox: usize,
        age: usize,
        source: usize,
    },
    ExitWorkload {
        sandbox: usize,
        code: i32,
    },
    RemoveOutOfBand {
        sandbox: usize,
    },
    /// The supervisor of the live run (age 0) or of an older run connects.
    Supervisor {
        sandbox: usize,
        age: usize,
    },
    MainExit {
        sandbox: usize,
        age: usize,
        code: i32,
        ends_run: bool,
    },
    /// Another writer bumps the sandbox between the next operation's read and write.
    Interfere {
        sandbox: usize,
    },
    /// A reconcile sweep queues the re-drives of every unconfirmed transition.
    Redrive,
}

// The reference model: possible intents per name, as bit sets.
const ABSENT: u8 = 1;
const RUNNING: u8 = 2;
const STOPPED: u8 = 4;
const DELETED: u8 = 8;
const PAUSED: u8 = 16;
const LIVE: u8 = RUNNING | STOPPED | PAUSED;
const PRESENT: u8 = 2;

#[derive(Clone, Debug)]
struct Possible {
    sandboxes: [u8; NAMES.len()],
    providers: [u8; PROVIDERS.len()],
}

fn intent_bit(intent: Option<Intent>) -> u8 {
    match intent {
        None => ABSENT,
        Some(Intent::Running) => RUNNING,
        Some(Intent::Stopped) => STOPPED,
        Some(Intent::Deleted) => DELETED,
        Some(Intent::Paused) => PAUSED,
    }
}

/// A command that writes `target` on a live sandbox; a versioned one may be aborted instead.
fn after_command(old: u8, target: u8, version: Version, from: u8) -> u8 {
    if version == Version::Stale {
        return old;
    }
    let moved = if old & from != 0 { target } else { 0 };
    // Commands that may be refused (phase, version) leave the old intent possible too.
    let kept = if version == Version::Current || target != STOPPED && target != DELETED { old } else { old & !from };
    moved | kept | (old & (ABSENT | DELETED) & !from)
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = Possible;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Possible> {
        Just(Possible { sandboxes: [ABSENT; NAMES.len()], providers: [ABSENT; PROVIDERS.len()] }).boxed()
    }

    fn transitions(_: &Possible) -> BoxedStrategy<Step> {
        let s = 0..NAMES.len();
        let p = 0..PROVIDERS.len();
        let version = prop_oneof![3 => Just(Version::None), 1 => Just(Version::Current), 1 => Just(Version::Stale)];
        prop_oneof![
            3 => (s.clone(), proptest::option::of(p.clone())).prop_map(|(sandbox, provider)| Step::Create { sandbox, provider }),
            3 => (s.clone(), version.clone()).prop_map(|(sandbox, version)| Step::Stop { sandbox, version }),
            3 => (s.clone(), version.clone()).prop_map(|(sandbox, version)| Step::Start { sandbox, version }),
            1 => (s.clone(), version.clone()).prop_map(|(sandbox, version)| Step::Delete { sandbox, version }),
            2 => (s.clone(), version.clone()).prop_map(|(sandbox, version)| Step::Pause { sandbox, version }),
            2 => (s.clone(), version.clone()).prop_map(|(sandbox, version)| Step::Resume { sandbox, version }),
            1 => (s.clone(), p.clone(), version.clone()).prop_map(|(sandbox, provider, version)| Step::Attach { sandbox, provider, version }),
            1 => (s.clone(), p.clone(), version.clone()).prop_map(|(sandbox, provider, version)| Step::Detach { sandbox, provider, version }),
            1 => p.clone().prop_map(|provider| Step::CreateProvider { provider }),
            1 => (p, version).prop_map(|(provider, version)| Step::DeleteProvider { provider, version }),
            8 => (0..8usize, proptest::bool::weighted(0.2), proptest::bool::weighted(0.1))
                .prop_map(|(index, lose_reply, duplicate)| Step::RunEffect { index, lose_reply, duplicate }),
            4 => (s.clone(), 0..SOURCES.len()).prop_map(|(sandbox, source)| Step::Observe { sandbox, source }),
            4 => (s.clone(), 1..12usize, 0..SOURCES.len()).prop_map(|(sandbox, age, source)| Step::Replay { sandbox, age, source }),
            2 => (s.clone(), 0..4i32).prop_map(|(sandbox, code)| Step::ExitWorkload { sandbox, code }),
            1 => s.clone().prop_map(|sandbox| Step::RemoveOutOfBand { sandbox }),
            4 => (s.clone(), prop_oneof![3 => Just(0usize), 1 => 1..3usize]).prop_map(|(sandbox, age)| Step::Supervisor { sandbox, age }),
            1 => (s.clone(), 0..3usize, 0..4i32, any::<bool>())
                .prop_map(|(sandbox, age, code, ends_run)| Step::MainExit { sandbox, age, code, ends_run }),
            2 => s.prop_map(|sandbox| Step::Interfere { sandbox }),
            1 => Just(Step::Redrive),
        ]
        .boxed()
    }

    fn apply(mut state: Possible, step: &Step) -> Possible {
        match *step {
            Step::Create { sandbox, .. } => {
                let old = state.sandboxes[sandbox];
                state.sandboxes[sandbox] = old | if old & ABSENT != 0 { RUNNING } else { 0 };
            }
            Step::Stop { sandbox, version } => {
                let old = state.sandboxes[sandbox];
                state.sandboxes[sandbox] = after_command(old, STOPPED, version, LIVE);
            }
            Step::Start { sandbox, version } => {
                let old = state.sandboxes[sandbox];
                state.sandboxes[sandbox] = after_command(old, RUNNING, version, LIVE);
            }
            Step::Delete { sandbox, version } => {
                let old = state.sandboxes[sandbox];
                state.sandboxes[sandbox] = after_command(old, DELETED, version, LIVE);
            }
            Step::Pause { sandbox, version } => {
                let old = state.sandboxes[sandbox];
                state.sandboxes[sandbox] = after_command(old, PAUSED, version, RUNNING | PAUSED);
            }
            Step::Resume { sandbox, version } => {
                let old = state.sandboxes[sandbox];
                state.sandboxes[sandbox] = after_command(old, RUNNING, version, PAUSED);
            }
            Step::CreateProvider { provider } => state.providers[provider] |= PRESENT,
            Step::DeleteProvider { provider, .. } => state.providers[provider] |= ABSENT,
            _ => {}
        }
        // A paused run may end at any moment, and its pause with it (to Stopped for an
        // expiry's pause; the model's sandboxes have no deadline, but it is allowed all the same).
        for s in &mut state.sandboxes {
            if *s & PAUSED != 0 {
                *s |= RUNNING | STOPPED;
            }
        }
        // A deleted sandbox may be gone at any moment after.
        for s in &mut state.sandboxes {
            if *s & DELETED != 0 {
                *s |= ABSENT;
            }
        }
        state
    }
}

/// One snapshot of a sandbox's runtime, as some path saw it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    state: RuntimeState,
    version: Option<u64>,
    runtime_time: berth_core::Timestamp,
}

struct System {
    world: World,
    ids: BTreeMap<String, SandboxId>,
    history: BTreeMap<SandboxId, Vec<Seen>>,
    highest_version: BTreeMap<SandboxId, u64>,
}

impl System {
    fn id(&self, sandbox: usize) -> Option<SandboxId> {
        self.ids.get(NAMES[sandbox]).cloned()
    }

    fn version_for(&self, name: &str, provider: bool, version: Version) -> Option<u64> {
        let current = if provider {
            self.world.store.providers.get(name).map(|p| p.resource_version)
        } else {
            self.world.store.by_name(name).map(|s| s.resource_version)
        };
        match version {
            Version::None => None,
            Version::Current => Some(current.unwrap_or(1)),
            Version::Stale => Some(current.map_or(3, |v| v - 1)),
        }
    }

    /// Runs a command and checks I3 and I4 on its result.
    fn command(&mut self, command: Command, subject: &str, provider: bool, version: Version) {
        let expected = self.version_for(subject, provider, version);
        let mut after_interference = self.world.store.clone();
        for name in &self.world.interference {
            after_interference.bump(name);
        }
        let before = self.world.store.clone();
        let result = self.world.request(command.clone(), expected);
        match (&result, version) {
            (Err(e @ (Error::StaleVersion { .. } | Error::Contention { .. })), Version::None) => {
                panic!("I3: a server-owned {command:?} failed on a conflict: {e}")
            }
            (Ok(_), Version::Stale) => panic!("I4: {command:?} with a stale version succeeded"),
            _ => {}
        }
        if let Err(e) = &result
            && e.code() == Code::Aborted
        {
            let untouched =
                same_store(&self.world.store, &before) || same_store(&self.world.store, &after_interference);
            assert!(untouched, "I4: an ABORTED {command:?} wrote something");
        }
        if version == Version::Stale {
            let exists =
                if provider { before.providers.contains_key(subject) } else { before.by_name(subject).is_some() };
            if exists {
                assert_eq!(result.as_ref().err().map(Error::code), Some(Code::Aborted), "I4: {command:?}");
            }
        }
        if let (Ok(Outcome::Sandbox(s)), Command::CreateSandbox { .. }) = (&result, &command) {
            self.ids.insert(s.name.to_string(), s.id.clone());
        }
    }

    fn observe_state(&mut self, id: &SandboxId, seen: Seen, source: RuntimeSource) {
        let polled = matches!(source, RuntimeSource::PollGet | RuntimeSource::PollList | RuntimeSource::RecoveryLookup);
        let state = match seen.state {
            RuntimeState::Absent { .. } if !polled => RuntimeState::Absent { at: Some(seen.runtime_time) },
            other => other,
        };
        let as_of_version = if polled { seen.version } else { None };
        let before = self.world.store.sandboxes.get(id).cloned();
        self.world.observe(id, Observation::Runtime { source, state, as_of_version }).unwrap();
        let (Some(before), Some(after)) = (before, self.world.store.sandboxes.get(id)) else { return };
        // I1: a report about a run of an earlier generation never moves a sandbox out of
        // Starting or Ready, and an exit of one changes no phase at all (rule 2).
        if let Some(run_generation) = self.generation_of(id, state)
            && run_generation < before.generation
            && (matches!(before.phase.kind(), PhaseKind::Starting | PhaseKind::Ready)
                || matches!(state, RuntimeState::Exited(_)))
        {
            assert_eq!(
                after.phase.kind(),
                before.phase.kind(),
                "I1: a report of generation {run_generation}'s run moved generation {} ({state:?})",
                before.generation
            );
        }
    }

    /// Ground truth: which generation's run a runtime state shows.
    fn generation_of(&self, id: &SandboxId, state: RuntimeState) -> Option<u64> {
        let started_at = match state {
            RuntimeState::Running { started_at, .. } => started_at,
            RuntimeState::Exited(m) => m.started_at,
            _ => return None,
        };
        self.world.containers.get(id)?.runs.iter().find(|r| r.started_at == started_at).map(|r| r.generation)
    }

    fn seen_now(&self, id: &SandboxId) -> Seen {
        Seen {
            state: self.world.snapshot(id),
            version: self.world.store.sandboxes.get(id).map(|s| s.resource_version),
            runtime_time: berth_core::Timestamp::from_unix_nanos(self.world.runtime_clock),
        }
    }

    fn supervisor_generation(&self, id: &SandboxId, age: usize) -> Option<u64> {
        let container = self.world.containers.get(id)?;
        if age == 0 {
            return container.alive().map(|r| r.generation);
        }
        container.runs.len().checked_sub(1 + age).map(|i| container.runs[i].generation)
    }

    fn connect(&mut self, id: &SandboxId, generation: u64) {
        let current = self.world.store.sandboxes.get(id).map(|s| s.generation);
        let result =
            self.world.observe(id, Observation::SupervisorConnected { generation, main: MainProcess::Running });
        // I6: exactly the current generation authenticates.
        assert_eq!(
            result.is_ok(),
            current == Some(generation),
            "I6: generation {generation} vs {current:?}: {result:?}"
        );
    }

    fn check_versions(&mut self) {
        for (id, s) in &self.world.store.sandboxes {
            let highest = self.highest_version.entry(id.clone()).or_insert(0);
            assert!(s.resource_version >= *highest, "I5: {id} went back from {highest} to {}", s.resource_version);
            *highest = s.resource_version;
        }
    }

    fn apply(&mut self, step: Step) {
        match step {
            Step::Create { sandbox, provider } => {
                let id = SandboxId::new(format!("sb-{}", self.world.next_id));
                self.world.next_id += 1;
                let command = Command::CreateSandbox {
                    id,
                    name: NAMES[sandbox].into(),
                    spec: crate::world::spec(),
                    providers: provider.map(|p| PROVIDERS[p].to_string()).into_iter().collect(),
                    deadline: None,
                };
                self.command(command, NAMES[sandbox], false, Version::None);
            }
            Step::Stop { sandbox, version } => {
                self.command(Command::StopSandbox { name: NAMES[sandbox].into() }, NAMES[sandbox], false, version);
            }
            Step::Start { sandbox, version } => {
                self.command(Command::StartSandbox { name: NAMES[sandbox].into() }, NAMES[sandbox], false, version);
            }
            Step::Delete { sandbox, version } => {
                self.command(Command::DeleteSandbox { name: NAMES[sandbox].into() }, NAMES[sandbox], false, version);
            }
            Step::Pause { sandbox, version } => {
                self.command(
                    Command::PauseSandbox { name: NAMES[sandbox].into(), hold: Hold::Freezer },
                    NAMES[sandbox],
                    false,
                    version,
                );
            }
            Step::Resume { sandbox, version } => {
                self.command(Command::ResumeSandbox { name: NAMES[sandbox].into() }, NAMES[sandbox], false, version);
            }
            Step::Attach { sandbox, provider, version } => {
                let command =
                    Command::AttachProvider { sandbox: NAMES[sandbox].into(), provider: PROVIDERS[provider].into() };
                self.command(command, NAMES[sandbox], false, version);
            }
            Step::Detach { sandbox, provider, version } => {
                let command =
                    Command::DetachProvider { sandbox: NAMES[sandbox].into(), provider: PROVIDERS[provider].into() };
                self.command(command, NAMES[sandbox], false, version);
            }
            Step::CreateProvider { provider } => {
                self.world.create_provider(PROVIDERS[provider], &format!("KEY_{provider}")).ok();
            }
            Step::DeleteProvider { provider, version } => {
                let command = Command::DeleteProvider { name: PROVIDERS[provider].into() };
                self.command(command, PROVIDERS[provider], true, version);
            }
            Step::RunEffect { index, lose_reply, duplicate } => {
                if self.world.effects.is_empty() {
                    return;
                }
                let effect = self.world.effects.remove(index % self.world.effects.len()).unwrap();
                let (id, reply) = self.world.perform(&effect);
                if !lose_reply {
                    self.world.observe(&id, reply.clone()).unwrap();
                    if duplicate {
                        self.world.observe(&id, reply).unwrap();
                    }
                }
            }
            Step::Observe { sandbox, source } => {
                if let Some(id) = self.id(sandbox) {
                    let seen = self.seen_now(&id);
                    self.observe_state(&id, seen, SOURCES[source]);
                }
            }
            Step::Replay { sandbox, age, source } => {
                let Some(id) = self.id(sandbox) else { return };
                let Some(seen) = self.history.get(&id).and_then(|h| h.len().checked_sub(age).map(|i| h[i])) else {
                    return;
                };
                self.observe_state(&id, seen, SOURCES[source]);
            }
            Step::ExitWorkload { sandbox, code } => {
                if let Some(id) = self.id(sandbox) {
                    self.world.exit_workload(&id, code);
                }
            }
            Step::RemoveOutOfBand { sandbox } => {
                if let Some(id) = self.id(sandbox) {
                    self.world.tick();
                    self.world.containers.remove(&id);
                }
            }
            Step::Supervisor { sandbox, age } => {
                let Some(id) = self.id(sandbox) else { return };
                if let Some(generation) = self.supervisor_generation(&id, age) {
                    self.connect(&id, generation);
                }
            }
            Step::MainExit { sandbox, age, code, ends_run } => {
                let Some(id) = self.id(sandbox) else { return };
                let Some(generation) = self.supervisor_generation(&id, age) else { return };
                if ends_run && age == 0 {
                    self.world.exit_workload(&id, code);
                }
                self.world
                    .observe(&id, Observation::MainProcessExited { generation, exit_code: code, out_of_memory: false })
                    .unwrap();
            }
            Step::Interfere { sandbox } => self.world.interference.push(NAMES[sandbox].into()),
            Step::Redrive => {
                let redrives: Vec<_> = self.world.store.sandboxes.values().filter_map(recovery::unfinished).collect();
                self.world.effects.extend(redrives);
            }
        }
        self.check_versions();
        let ids: Vec<SandboxId> = self.ids.values().cloned().collect();
        for id in ids {
            let seen = self.seen_now(&id);
            self.history.entry(id).or_default().push(seen);
        }
    }

    /// After the faults: confirmations only, plus a client re-issuing each sandbox's intent out
    /// of Error or a completion. Everything must converge (I2, I7, I8).
    fn quiet_phase(&mut self) {
        self.world.interference.clear();
        let desired: BTreeMap<SandboxId, Intent> =
            self.world.store.sandboxes.iter().map(|(id, s)| (id.clone(), s.intent)).collect();
        for round in 0..12 {
            self.world.run_all_effects();
            let redrives: Vec<_> = self.world.store.sandboxes.values().filter_map(recovery::unfinished).collect();
            self.world.effects.extend(redrives);
            self.world.run_all_effects();
            let known: Vec<SandboxId> =
                self.world.store.sandboxes.keys().chain(self.world.containers.keys()).cloned().collect();
            for id in known {
                let seen = self.seen_now(&id);
                self.observe_state(&id, seen, RuntimeSource::PollList);
                if let Some(generation) = self.supervisor_generation(&id, 0) {
                    self.world
                        .observe(&id, Observation::SupervisorConnected { generation, main: MainProcess::Running })
                        .ok();
                }
            }
            self.world.run_all_effects();
            if round == 0 {
                self.check_exits_reported();
            }
            let records: Vec<_> = self.world.store.sandboxes.values().cloned().collect();
            for s in records {
                let name = s.name.clone();
                match (desired.get(&s.id), s.phase.kind()) {
                    // Error, and a completion (exit 0), wait for a user to start again.
                    // (A pause that ended with a completed run is a completion too.)
                    (Some(_), PhaseKind::Error) | (Some(Intent::Running | Intent::Paused), PhaseKind::Stopped)
                        if s.phase.kind() == PhaseKind::Error || s.completed() =>
                    {
                        self.world.start(&name).unwrap();
                    }
                    (Some(Intent::Stopped), PhaseKind::Ready) => {
                        self.world.stop(&name).unwrap();
                    }
                    _ => {}
                }
            }
        }
        for (id, s) in &self.world.store.sandboxes {
            // A pause that outlived its run went back to Running (and was started again).
            let paused_run_ended = desired[id] == Intent::Paused && s.intent == Intent::Running;
            let expected = match desired[id] {
                Intent::Running => PhaseKind::Ready,
                Intent::Paused if paused_run_ended => PhaseKind::Ready,
                Intent::Paused => PhaseKind::Paused,
                Intent::Stopped => PhaseKind::Stopped,
                Intent::Deleted => panic!("I7: {id} is still {} after the quiet phase", s.phase),
            };
            assert_eq!(s.phase.kind(), expected, "I8: {id} with intent {:?}: {s:?}", desired[id]);
        }
        for id in self.world.containers.keys() {
            assert!(self.world.store.sandboxes.contains_key(id), "I7: {id}'s container outlived its record");
        }
    }

    /// I2: once the runtime has been looked at, every ended run of a current generation is an
    /// Error, or a completion (exit 0: Stopped with intent Running).
    fn check_exits_reported(&self) {
        for (id, s) in &self.world.store.sandboxes {
            let ended = self
                .world
                .containers
                .get(id)
                .is_some_and(|c| c.runs.iter().any(|r| r.generation == s.generation && r.finished.is_some()));
            if s.intent == Intent::Running && ended {
                assert!(s.phase.kind() == PhaseKind::Error || s.completed(), "I2: {id}'s run ended unreported: {s:?}");
            }
        }
    }
}

fn same_store(a: &Store, b: &Store) -> bool {
    a.sandboxes == b.sandboxes && a.providers == b.providers
}

impl StateMachineTest for System {
    type SystemUnderTest = Self;
    type Reference = Model;

    fn init_test(_: &Possible) -> Self {
        System {
            world: World::default(),
            ids: BTreeMap::new(),
            history: BTreeMap::new(),
            highest_version: BTreeMap::new(),
        }
    }

    fn apply(mut system: Self, _: &Possible, step: Step) -> Self {
        system.apply(step);
        system
    }

    fn check_invariants(system: &Self, possible: &Possible) {
        for (i, name) in NAMES.iter().enumerate() {
            let actual = intent_bit(system.world.store.by_name(name).map(|s| s.intent));
            assert!(
                possible.sandboxes[i] & actual != 0,
                "sandbox {name}: intent {actual:#b} not in {:#b}",
                possible.sandboxes[i]
            );
        }
        for (i, name) in PROVIDERS.iter().enumerate() {
            let actual = if system.world.store.providers.contains_key(*name) { PRESENT } else { ABSENT };
            assert!(possible.providers[i] & actual != 0, "provider {name}");
        }
        // R2's invariant: no sandbox references a provider that does not exist, unless Deleting.
        for s in system.world.store.sandboxes.values() {
            if s.phase.kind() != PhaseKind::Deleting {
                for p in s.providers.iter() {
                    assert!(
                        system.world.store.providers.contains_key(p),
                        "{} attached to deleted provider {p}",
                        s.name
                    );
                }
            }
        }
    }

    fn teardown(mut system: Self, _: Possible) {
        system.quiet_phase();
    }
}

fn config() -> Config {
    // `PROPTEST_CASES` raises it for the long property job; `ci/test` runs the default.
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1000);
    Config { cases, max_shrink_iters: 20_000, ..Config::default() }
}

prop_state_machine! {
    #![proptest_config(config())]
    #[test]
    fn lifecycle_holds_its_invariants(sequential 1..60 => System);
}
