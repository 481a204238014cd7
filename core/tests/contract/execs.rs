//! Exec admission, fencing and end states (DESIGN 8.1, E1-E3): exact writes for given inputs.

use berth_core::exec::{self, Exec, ExecEnd, ExecId, ExecSpec, ExecState, Report};
use berth_core::{
    Code, Command, Decision, Error, ExitMarker, Failure, FailureReason, Intent, Outcome, Phase, Request, Run, Sandbox,
    Timestamp, Write,
};

use crate::world::{Store, World};

const NOW: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);
const LATER: Timestamp = Timestamp::from_unix_millis(1_800_000_001_000);

fn id(s: &str) -> ExecId {
    ExecId::parse("exec_id", s).unwrap()
}

fn spec() -> ExecSpec {
    ExecSpec { argv: vec!["echo".into(), "hi".into()], ..Default::default() }
}

fn ready() -> Sandbox {
    let mut world = World::default();
    let Ok(Outcome::Sandbox(mut sandbox)) = world.create("box", &[]) else { panic!("created") };
    sandbox.phase = Phase::Ready;
    sandbox.run = Run::Started { at: None };
    sandbox.resource_version = 4;
    *sandbox
}

fn admitted(sandbox: &Sandbox) -> Exec {
    changed(exec::admit(&sandbox.name, &id("e1"), &spec(), Some(sandbox), None, NOW).unwrap()).1
}

/// A rule's decision that writes: its writes, and the exec it leaves. An exec rule moves no
/// sandbox through a runtime, so it never has effects.
fn changed(decision: Decision) -> (Vec<Write>, Exec) {
    assert!(!decision.writes.is_empty(), "{decision:?} writes nothing");
    assert!(decision.effects.is_empty());
    let Outcome::Exec(exec) = decision.outcome else { panic!("an exec rule answered {:?}", decision.outcome) };
    (decision.writes, *exec)
}

/// Asserts a rule's decision changes nothing and answers `exec` as it is.
#[track_caller]
fn unchanged(decision: Decision, exec: &Exec) {
    assert_eq!(decision, Decision { writes: vec![], effects: vec![], outcome: Outcome::Exec(Box::new(exec.clone())) });
}

fn field_of(err: Error) -> String {
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    match err {
        Error::Invalid { field, .. } => field,
        other => panic!("not a validation error: {other}"),
    }
}

#[test]
fn an_exec_is_admitted_for_the_ready_generation_conditional_on_the_sandbox_version_read() {
    let sandbox = ready();
    let (writes, exec) = changed(exec::admit("box", &id("e1"), &spec(), Some(&sandbox), None, NOW).unwrap());
    let expected = Exec {
        sandbox: sandbox.id.clone(),
        id: id("e1"),
        spec: spec(),
        generation: sandbox.generation,
        state: ExecState::Admitted,
        cancel_requested: false,
        output_bytes: None,
        resource_version: 1,
        admitted_at: NOW,
        updated_at: NOW,
    };
    assert_eq!(exec, expected);
    assert_eq!(
        writes,
        vec![Write::CheckSandbox { id: sandbox.id.clone(), expected: 4 }, Write::CreateExec(expected.clone())]
    );
}

#[test]
fn a_retry_with_the_same_id_returns_the_exec_as_it_is_and_writes_nothing_whatever_the_phase() {
    let sandbox = ready();
    let mut exec = admitted(&sandbox);
    exec.state = ExecState::Ended { end: ExecEnd::Exited(3), message: String::new() };
    let mut stopped = sandbox.clone();
    stopped.phase = Phase::Stopped;
    for now in [&sandbox, &stopped] {
        unchanged(exec::admit("box", &id("e1"), &spec(), Some(now), Some(&exec), LATER).unwrap(), &exec);
    }
}

#[test]
fn the_same_id_with_another_command_is_already_exists() {
    let sandbox = ready();
    let exec = admitted(&sandbox);
    let mut other = spec();
    other.argv.push("there".into());
    let err = exec::admit("box", &id("e1"), &other, Some(&sandbox), Some(&exec), NOW).unwrap_err();
    assert_eq!((err.code(), err.to_string().as_str()), (Code::AlreadyExists, "exec 'e1' already exists"));
    let mut tty = spec();
    tty.tty = true;
    let err = exec::admit("box", &id("e1"), &tty, Some(&sandbox), Some(&exec), NOW).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
}

#[test]
fn only_a_ready_sandbox_admits_a_new_exec_and_the_refusal_names_the_phase() {
    let failed =
        Phase::Error(Failure { reason: FailureReason::ContainerExited, exit_code: Some(1), message: "x".into() });
    for phase in [Phase::Provisioning, Phase::Starting, Phase::Stopping, Phase::Stopped, Phase::Deleting, failed] {
        let mut sandbox = ready();
        sandbox.phase = phase.clone();
        let err = exec::admit("box", &id("e1"), &spec(), Some(&sandbox), None, NOW).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{phase}");
        assert_eq!(err.to_string(), format!("cannot exec in sandbox 'box' while it is {}", phase.kind()));
    }
    let err = exec::admit("nope", &id("e1"), &spec(), None, None, NOW).unwrap_err();
    assert_eq!((err.code(), err.to_string().as_str()), (Code::NotFound, "sandbox 'nope' not found"));
}

#[test]
fn bad_input_names_its_field() {
    let sandbox = ready();
    type Mutation = Box<dyn Fn(&mut ExecSpec)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|s| s.argv.clear()), "argv"),
        (Box::new(|s| s.argv[0].clear()), "argv"),
        (Box::new(|s| s.argv[1] = "a\0b".into()), "argv[1]"),
        (Box::new(|s| s.argv = vec!["x".into(); exec::MAX_EXEC_ARGS + 1]), "argv"),
        (Box::new(|s| s.argv[1] = "x".repeat(16 * 1024 + 1)), "argv[1]"),
        (Box::new(|s| _ = s.env.insert("1BAD".into(), "v".into())), "env"),
        (Box::new(|s| _ = s.env.insert("BERTH_X".into(), "v".into())), "env"),
        (Box::new(|s| _ = s.env.insert("OK".into(), "x".repeat(32 * 1024 + 1))), "env[OK]"),
        (Box::new(|s| s.cwd = "relative/dir".into()), "cwd"),
        (Box::new(|s| s.timeout_ms = Some(0)), "timeout"),
        (Box::new(|s| s.timeout_ms = Some(exec::MAX_EXEC_TIMEOUT_MS + 1)), "timeout"),
        (Box::new(|s| s.env = (0..9).map(|i| (format!("V{i}"), "x".repeat(32 * 1024))).collect()), "argv"),
    ];
    for (mutate, field) in cases {
        let mut s = spec();
        mutate(&mut s);
        assert_eq!(field_of(exec::admit("box", &id("e1"), &s, Some(&sandbox), None, NOW).unwrap_err()), field);
    }
    let mut longest = spec();
    longest.timeout_ms = Some(exec::MAX_EXEC_TIMEOUT_MS);
    exec::admit("box", &id("e1"), &longest, Some(&sandbox), None, NOW).unwrap();
    for bad in ["", "-a", "a b", "a/b", &"x".repeat(129)] {
        assert_eq!(field_of(ExecId::parse("exec_id", bad).unwrap_err()), "exec_id", "{bad:?}");
    }
    ExecId::parse("exec_id", &"x".repeat(128)).unwrap();
    assert_eq!(field_of(exec::admit("Box", &id("e1"), &spec(), None, None, NOW).unwrap_err()), "sandbox");
}

#[test]
fn a_command_never_shows_in_debug_output() {
    let mut s = spec();
    s.argv.push("--password=hunter2".into());
    s.env.insert("TOKEN".into(), "hunter3".into());
    let shown = format!("{s:?}");
    assert!(!shown.contains("hunter2") && !shown.contains("hunter3") && shown.contains("TOKEN"), "{shown}");
}

#[test]
fn reports_move_an_exec_forward_only_from_its_own_generation() {
    let sandbox = ready();
    let exec = admitted(&sandbox);
    let g = exec.generation;
    let (writes, running) = changed(exec::report(&exec, Some(&sandbox), g, &Report::Started, LATER));
    assert_eq!(running.state, ExecState::Running);
    assert_eq!((running.resource_version, running.updated_at), (2, LATER));
    assert_eq!(writes, [Write::UpdateExec { record: running.clone(), expected: 1 }]);
    // Another generation's session is never this exec's run (E2).
    for other in [g - 1, g + 1] {
        unchanged(exec::report(&exec, Some(&sandbox), other, &Report::Started, LATER), &exec);
        let end =
            Report::Ended { end: ExecEnd::Exited(0), message: String::new(), output_bytes: 0, out_of_memory: false };
        unchanged(exec::report(&running, Some(&sandbox), other, &end, LATER), &running);
    }
    // A repeated start changes nothing.
    unchanged(exec::report(&running, Some(&sandbox), g, &Report::Started, LATER), &running);
    let end = Report::Ended { end: ExecEnd::Exited(7), message: String::new(), output_bytes: 12, out_of_memory: false };
    let (_, ended) = changed(exec::report(&running, Some(&sandbox), g, &end, LATER));
    assert_eq!(ended.state, ExecState::Ended { end: ExecEnd::Exited(7), message: String::new() });
    assert_eq!(ended.output_bytes, Some(12));
    // Killed for memory: the sandbox's limit named, as a main process's failure names it.
    let oom =
        Report::Ended { end: ExecEnd::Signalled(9), message: String::new(), output_bytes: 3, out_of_memory: true };
    let mut limited = sandbox.clone();
    let mut spec = (*limited.spec).clone();
    spec.limits.memory_bytes = Some(64 << 20);
    limited.spec = std::sync::Arc::new(spec);
    let (_, killed) = changed(exec::report(&running, Some(&limited), g, &oom, LATER));
    let message = "killed for memory: the sandbox used more than its memory limit of 67108864 bytes".to_string();
    assert_eq!(killed.state, ExecState::Ended { end: ExecEnd::Signalled(9), message });
    let (_, killed) = changed(exec::report(&running, None, g, &oom, LATER));
    assert_eq!(killed.state, ExecState::Ended { end: ExecEnd::Signalled(9), message: "killed for memory".into() });
    // Terminal states are final: a later report, cancel or settle changes nothing.
    let late =
        Report::Ended { end: ExecEnd::Cancelled, message: String::new(), output_bytes: 99, out_of_memory: false };
    unchanged(exec::report(&ended, Some(&sandbox), g, &late, LATER), &ended);
    unchanged(exec::cancel(&ended, LATER), &ended);
    unchanged(exec::settle(&ended, None, LATER), &ended);
    // An exec can end without a start report (it ended before the report went out).
    changed(exec::report(&exec, Some(&sandbox), g, &end, LATER));
    // A run of its generation that restarted out of band reports it lost, never ran again.
    let lost = Report::Lost { message: "its run restarted".into() };
    let (_, gone) = changed(exec::report(&running, Some(&sandbox), g, &lost, LATER));
    assert_eq!(gone.state, ExecState::Lost { message: "its run restarted".into() });
    // Lost is final.
    unchanged(exec::report(&gone, Some(&sandbox), g, &end, LATER), &gone);
}

#[test]
fn a_cancel_is_committed_once_and_never_touches_an_ended_exec() {
    let sandbox = ready();
    let exec = admitted(&sandbox);
    let (writes, cancelled) = changed(exec::cancel(&exec, LATER));
    assert!(cancelled.cancel_requested);
    assert_eq!(cancelled.state, ExecState::Admitted, "the run ends it, and says how");
    assert_eq!(writes, [Write::UpdateExec { record: cancelled.clone(), expected: 1 }]);
    unchanged(exec::cancel(&cancelled, LATER), &cancelled);
}

#[test]
fn an_exec_whose_run_is_over_is_ended_and_one_whose_run_lives_is_left_to_it() {
    let sandbox = ready();
    let exec = admitted(&sandbox);
    // Ready, same generation: the run serves it.
    unchanged(exec::settle(&exec, Some(&sandbox), LATER), &exec);
    let cancelled = |message: &str| ExecState::Ended { end: ExecEnd::Cancelled, message: message.into() };
    let mut stopping = sandbox.clone();
    (stopping.phase, stopping.intent) = (Phase::Stopping, Intent::Stopped);
    let mut deleting = sandbox.clone();
    (deleting.phase, deleting.intent) = (Phase::Deleting, Intent::Deleted);
    let mut failed = sandbox.clone();
    let marker =
        ExitMarker { started_at: Timestamp(1), finished_at: Timestamp(2), exit_code: 137, out_of_memory: false };
    failed.phase =
        Phase::Error(Failure { reason: FailureReason::ContainerExited, exit_code: Some(137), message: String::new() });
    failed.run = Run::Ended(marker);
    let mut restarted = sandbox.clone();
    restarted.generation += 1;
    let cases = [
        (None, cancelled("the sandbox was deleted")),
        (Some(&stopping), cancelled("the sandbox was stopped")),
        (Some(&deleting), cancelled("the sandbox is being deleted")),
        (
            Some(&failed),
            ExecState::Lost { message: "the sandbox's run ended (the sandbox is Error (ContainerExited))".into() },
        ),
        (
            Some(&restarted),
            ExecState::Lost {
                message: format!("generation {} was replaced by generation {}", exec.generation, restarted.generation),
            },
        ),
    ];
    for (sandbox, state) in cases {
        let (writes, ended) = changed(exec::settle(&exec, sandbox, LATER));
        assert_eq!(ended.state, state);
        assert_eq!(writes, [Write::UpdateExec { record: ended.clone(), expected: 1 }]);
        assert!(ended.state.is_terminal());
    }
}

#[test]
fn a_stop_committed_between_an_admissions_read_and_its_write_wins_and_the_exec_is_refused() {
    let sandbox = ready();
    let mut store = Store::default();
    store.sandboxes.insert(sandbox.id.clone(), sandbox.clone());
    let admission = exec::admit("box", &id("e1"), &spec(), Some(&sandbox), None, NOW).unwrap();
    store.execute_once(&Request::new(Command::StopSandbox { name: "box".into() }, None), NOW).unwrap();
    let conflict = store.commit(&admission.writes).unwrap_err();
    assert_eq!((conflict.expected, conflict.current), (Some(4), Some(5)));
    assert!(store.execs.is_empty(), "nothing of the admission was written");
    // Decided again on the fresh read, as the executor does after a conflict.
    let fresh = store.by_name("box").cloned();
    let err = exec::admit("box", &id("e1"), &spec(), fresh.as_ref(), None, NOW).unwrap_err();
    assert_eq!(err.to_string(), "cannot exec in sandbox 'box' while it is Stopping");
    // Admitting changes nothing of the sandbox: clients' expected versions stay good.
    let mut ready = sandbox.clone();
    ready.resource_version = 5;
    store.sandboxes.insert(ready.id.clone(), ready.clone());
    store.commit(&exec::admit("box", &id("e1"), &spec(), Some(&ready), None, NOW).unwrap().writes).unwrap();
    assert_eq!(store.by_name("box").unwrap().resource_version, 5);
    store.commit(&[Write::RemoveSandbox { id: ready.id.clone(), expected: 5 }]).unwrap();
    assert!(store.execs.is_empty(), "an exec is removed with its sandbox");
}
