//! berth-core fed arbitrary sequences of commands and observations from every source (any
//! generation, any runtime time, any order): never a panic, and after each step the
//! invariants DESIGN 4 states at the core level hold.

use arbitrary::Arbitrary;
use berth_core::{
    Command, Decision, ExitMarker, Hold, Intent, MainProcess, Observation, Outcome, PhaseKind, Reads, Request, Run,
    RuntimeSource, RuntimeState, Sandbox, SandboxId, SandboxSpec, StartReply, Timestamp, Write, decide, merge,
};

#[derive(Arbitrary, Debug)]
enum Source {
    Watch,
    Sync,
    PollGet,
    PollList,
    Recovery,
}

#[derive(Arbitrary, Debug)]
enum State {
    Absent,
    Created,
    /// Started at, frozen.
    Running(u16, bool),
    Exited(u16, u16, i8, bool),
}

#[derive(Arbitrary, Debug)]
enum Step {
    Create,
    Stop(bool),
    Start(bool),
    Delete(bool),
    Pause(bool),
    Resume(bool),
    Runtime(Source, State, bool),
    StartReply(u8, State),
    StartFailed(u8),
    StopReply(u8, State),
    Deleted,
    Connect(u8),
    MainExit(u8, i8, bool),
}

fn t(n: u16) -> Timestamp {
    Timestamp::from_unix_nanos(i64::from(n))
}

fn state(s: &State) -> RuntimeState {
    match *s {
        State::Absent => RuntimeState::Absent { at: None },
        State::Created => RuntimeState::Created,
        State::Running(at, frozen) => {
            RuntimeState::Running { started_at: t(at), held: frozen.then_some(Hold::Freezer) }
        }
        State::Exited(started, length, code, out_of_memory) => RuntimeState::Exited(ExitMarker {
            started_at: t(started),
            finished_at: Timestamp::from_unix_nanos(i64::from(started) + i64::from(length) + 1),
            exit_code: i32::from(code),
            out_of_memory,
        }),
    }
}

/// Applies a decision to the one-record store, checking it is a proper conditional write.
fn apply(record: &mut Option<Sandbox>, decision: &Decision) {
    for write in &decision.writes {
        match write {
            Write::CreateSandbox(s) => {
                assert!(record.is_none());
                assert_eq!(s.resource_version, 1);
                *record = Some(s.clone());
            }
            Write::UpdateSandbox { record: next, expected } => {
                let current = record.as_ref().expect("an update of an existing record");
                assert_eq!(current.resource_version, *expected, "a write conditional on another version");
                assert_eq!(next.resource_version, expected + 1);
                *record = Some(next.clone());
            }
            Write::RemoveSandbox { expected, .. } => {
                assert_eq!(record.as_ref().map(|s| s.resource_version), Some(*expected));
                *record = None;
            }
            _ => {}
        }
    }
}

/// The target's entry, for libFuzzer and the corpus replay alike.
pub fn fuzz(data: &[u8]) {
    crate::run(data, check);
}

fn check(steps: Vec<Step>) {
    let id = SandboxId::new("sb-1");
    let mut record: Option<Sandbox> = None;
    let spec = SandboxSpec { image: "i".into(), command: vec!["c".into()], ..Default::default() };
    for (i, step) in steps.iter().enumerate() {
        let now = Timestamp::from_unix_millis(i as i64);
        let before = record.clone();
        let command = |c: Command, versioned: bool| {
            let version = versioned.then(|| before.as_ref().map_or(0, |s| s.resource_version.saturating_sub(1)));
            Request::new(c, version)
        };
        let generation = |g: u8| before.as_ref().map_or(1, |s| s.generation).saturating_sub(u64::from(g % 3));
        let result = match step {
            Step::Create => {
                let c = Command::CreateSandbox {
                    id: id.clone(),
                    name: "box".into(),
                    spec: spec.clone(),
                    providers: Default::default(),
                    deadline: None,
                };
                decide(&Request::new(c, None), &Reads { sandbox: before.clone(), ..Reads::default() }, now)
            }
            Step::Stop(v) | Step::Start(v) | Step::Delete(v) | Step::Pause(v) | Step::Resume(v) => {
                let name = "box".to_string();
                let c = match step {
                    Step::Stop(_) => Command::StopSandbox { name },
                    Step::Start(_) => Command::StartSandbox { name },
                    Step::Pause(_) => Command::PauseSandbox { name, hold: Hold::Freezer },
                    Step::Resume(_) => Command::ResumeSandbox { name },
                    _ => Command::DeleteSandbox { name },
                };
                let request = command(c, *v);
                let result = decide(&request, &Reads { sandbox: before.clone(), ..Reads::default() }, now);
                if *v && before.is_some() {
                    // I4: a stale client-supplied version is refused, and writes nothing.
                    assert_eq!(result.as_ref().err().map(|e| e.code()), Some(berth_core::Code::Aborted));
                }
                result
            }
            Step::Runtime(source, s, fenced) => {
                let source = match source {
                    Source::Watch => RuntimeSource::WatchEvent,
                    Source::Sync => RuntimeSource::InitialSync,
                    Source::PollGet => RuntimeSource::PollGet,
                    Source::PollList => RuntimeSource::PollList,
                    Source::Recovery => RuntimeSource::RecoveryLookup,
                };
                let as_of_version = fenced.then(|| before.as_ref().map_or(0, |s| s.resource_version));
                merge(before.as_ref(), &id, &Observation::Runtime { source, state: state(s), as_of_version }, now)
            }
            Step::StartReply(g, s) => {
                let reply = match state(s) {
                    RuntimeState::Running { started_at, .. } => StartReply::Running { started_at },
                    RuntimeState::Exited(m) => StartReply::Exited(m),
                    RuntimeState::Absent { .. } => StartReply::Gone,
                    RuntimeState::Created => StartReply::Failed { message: "no".into() },
                };
                merge(before.as_ref(), &id, &Observation::Started { generation: generation(*g), reply }, now)
            }
            Step::StartFailed(g) => {
                let reply = StartReply::Failed { message: "refused".into() };
                merge(before.as_ref(), &id, &Observation::Started { generation: generation(*g), reply }, now)
            }
            Step::StopReply(g, s) => {
                merge(before.as_ref(), &id, &Observation::Stopped { generation: generation(*g), state: state(s) }, now)
            }
            Step::Deleted => merge(before.as_ref(), &id, &Observation::Deleted, now),
            Step::Connect(g) => merge(
                before.as_ref(),
                &id,
                &Observation::SupervisorConnected { generation: generation(*g), main: MainProcess::Running },
                now,
            ),
            Step::MainExit(g, code, out_of_memory) => merge(
                before.as_ref(),
                &id,
                &Observation::MainProcessExited {
                    generation: generation(*g),
                    exit_code: i32::from(*code),
                    out_of_memory: *out_of_memory,
                },
                now,
            ),
        };
        let Ok(decision) = result else { continue };
        apply(&mut record, &decision);
        if let Some(s) = decision.sandbox()
            && !decision.writes.is_empty()
        {
            assert_eq!(Some(s), record.as_ref(), "the outcome is the record written");
        }
        if decision.outcome == Outcome::Unchanged {
            assert!(decision.writes.is_empty(), "an unchanged outcome writes nothing");
        }
        if decision.outcome == Outcome::Written {
            assert_eq!(decision.writes.len(), 1, "a written outcome is its one write's record");
        }
        let (Some(b), Some(a)) = (&before, &record) else { continue };
        let is_command = matches!(
            step,
            Step::Create | Step::Stop(_) | Step::Start(_) | Step::Delete(_) | Step::Pause(_) | Step::Resume(_)
        );
        if !is_command {
            // Observations never change intent or rotate identities (DESIGN 3.5 rule 7), but for
            // a run that ends under a pause: the pause ends with it (DESIGN 12.1).
            let pause_ended = b.intent == Intent::Paused
                && matches!(a.intent, Intent::Running | Intent::Stopped)
                && matches!(a.phase.kind(), PhaseKind::Error | PhaseKind::Stopped);
            if !pause_ended {
                assert_eq!(a.intent, b.intent);
            }
            assert_eq!(a.generation, b.generation);
            // Within one generation, Error and Stopped never go back to Ready.
            if matches!(b.phase.kind(), PhaseKind::Error | PhaseKind::Stopped) {
                assert_ne!(a.phase.kind(), PhaseKind::Ready);
            }
            // I1: a report about a run that started before a settled fence changes no phase.
            if let Step::Runtime(_, State::Exited(started, ..) | State::Running(started, _), _) = step
                && b.run == Run::Pending
                && b.exit_fence.settled
                && b.exit_fence.marker.is_some_and(|f| t(*started) <= f.finished_at)
            {
                assert_eq!(a.phase.kind(), b.phase.kind());
            }
        } else if a.generation != b.generation {
            // Only a Start rotates the identity, by one, with Starting, in one write.
            assert!(matches!(step, Step::Start(_)));
            assert_eq!(a.generation, b.generation + 1);
            assert_eq!((a.phase.kind(), a.intent), (PhaseKind::Starting, Intent::Running));
        }
        if a.phase.kind() == PhaseKind::Ready && b.phase.kind() != PhaseKind::Ready {
            // Only the current supervisor makes a sandbox Ready, or a paused one's run seen
            // thawed (its supervisor made it Ready before the pause).
            let thawed =
                b.phase.kind() == PhaseKind::Paused && matches!(step, Step::Runtime(_, State::Running(_, false), _));
            assert!(matches!(step, Step::Connect(_)) || thawed, "only the current supervisor makes a sandbox Ready");
        }
        // Pause and resume never rotate the identity.
        if matches!(step, Step::Pause(_) | Step::Resume(_)) {
            assert_eq!(a.generation, b.generation);
        }
    }
}
