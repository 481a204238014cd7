//! One test per row of DESIGN 3.2, table-driven over phases.

use berth_core::{
    Code, Command, Effect, Error, ExitFence, ExitMarker, Failure, FailureReason, Hold, Intent, Outcome, Phase,
    PhaseKind, Provider, Reads, Request, Run, Sandbox, SandboxId, Secret, Timestamp, Write, decide,
};

use crate::world::{World, spec};

const NOW: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);

fn marker(finished: i64) -> ExitMarker {
    ExitMarker {
        started_at: Timestamp::from_unix_nanos(finished - 5),
        finished_at: Timestamp::from_unix_nanos(finished),
        exit_code: 143,
        out_of_memory: false,
    }
}

fn error_phase() -> Phase {
    Phase::Error(Failure { reason: FailureReason::ContainerExited, exit_code: Some(1), message: "x".into() })
}

const ALL: [PhaseKind; 8] = PhaseKind::ALL;

/// A record in `kind`, with the intent that phase has when reached through the API.
fn record(kind: PhaseKind) -> Sandbox {
    let (phase, intent, run) = match kind {
        PhaseKind::Provisioning => (Phase::Provisioning, Intent::Running, Run::Pending),
        PhaseKind::Starting => (Phase::Starting, Intent::Running, Run::Pending),
        PhaseKind::Ready => (Phase::Ready, Intent::Running, Run::Started { at: None }),
        PhaseKind::Paused => (Phase::Paused, Intent::Paused, Run::Started { at: None }),
        PhaseKind::Stopping => (Phase::Stopping, Intent::Stopped, Run::Started { at: None }),
        PhaseKind::Stopped => (Phase::Stopped, Intent::Stopped, Run::Ended(marker(500))),
        PhaseKind::Deleting => (Phase::Deleting, Intent::Deleted, Run::Pending),
        PhaseKind::Error => (error_phase(), Intent::Running, Run::Ended(marker(500))),
    };
    Sandbox {
        providers: std::sync::Arc::new(["p1".to_string()].into()),
        intent,
        phase,
        resource_version: 7,
        generation: 3,
        exit_fence: ExitFence { marker: Some(marker(100)), settled: true },
        run,
        last_exit: Some(marker(500)),
        updated_at: Timestamp::from_unix_millis(2),
        ..Sandbox::new(SandboxId::new("sb-1"), "box", spec(), Timestamp::from_unix_millis(1))
    }
}

fn provider(name: &str, key: &str) -> Provider {
    Provider {
        endpoints: Default::default(),
        name: name.into(),
        kind: "test".into(),
        credentials: [(key.to_string(), Secret::new("v"))].into(),
        resource_version: 4,
        created_at: Timestamp::from_unix_millis(1),
        updated_at: Timestamp::from_unix_millis(1),
    }
}

fn reads(sandbox: Option<Sandbox>) -> Reads {
    Reads {
        sandbox,
        providers: [("p1".to_string(), provider("p1", "P1_KEY")), ("p2".to_string(), provider("p2", "P2_KEY"))].into(),
        users: vec![],
        nodes: crate::world::nodes([]),
        ..Reads::default()
    }
}

fn on(kind: PhaseKind, command: Command) -> Result<berth_core::Decision, Error> {
    decide(&Request::new(command, None), &reads(Some(record(kind))), NOW)
}

fn written(decision: &berth_core::Decision) -> &Sandbox {
    match &decision.writes[0] {
        Write::UpdateSandbox { record, expected } => {
            assert_eq!(*expected, 7);
            assert_eq!(record.resource_version, 8);
            assert_eq!(record.updated_at, NOW);
            record
        }
        other => panic!("expected one sandbox update, got {other:?}"),
    }
}

fn stop() -> Command {
    Command::StopSandbox { name: "box".into() }
}
fn start() -> Command {
    Command::StartSandbox { name: "box".into() }
}
fn delete() -> Command {
    Command::DeleteSandbox { name: "box".into() }
}

#[test]
fn create_row() {
    let create = |name: &str, providers: &[&str]| Command::CreateSandbox {
        id: SandboxId::new("sb-new"),
        name: name.into(),
        spec: spec(),
        providers: providers.iter().map(|p| p.to_string()).collect(),
        deadline: None,
    };
    let d = decide(&Request::new(create("fresh", &["p1"]), None), &reads(None), NOW).unwrap();
    let Write::CreateSandbox(created) = &d.writes[0] else { panic!("{:?}", d.writes) };
    assert_eq!(
        (created.phase.kind(), created.intent, created.generation, created.resource_version),
        (PhaseKind::Provisioning, Intent::Running, 1, 1)
    );
    assert_eq!((created.created_at, created.updated_at), (NOW, NOW));
    // The attach is recorded in the provider's version, in the same transaction.
    assert!(
        matches!(&d.writes[1], Write::UpdateProvider { record, expected: 4 } if record.name == "p1" && record.resource_version == 5)
    );
    assert_eq!(d.effects, vec![Effect::Start { sandbox: SandboxId::new("sb-new"), generation: 1 }]);

    let taken = decide(&Request::new(create("box", &[]), None), &reads(Some(record(PhaseKind::Ready))), NOW);
    assert_eq!(taken.unwrap_err().code(), Code::AlreadyExists);
    let unknown = decide(&Request::new(create("fresh", &["nope"]), None), &reads(None), NOW).unwrap_err();
    assert_eq!(unknown.code(), Code::FailedPrecondition);
    assert!(unknown.to_string().contains("nope"), "{unknown}");
    let bad = decide(&Request::new(create("Bad_Name", &[]), None), &reads(None), NOW).unwrap_err();
    assert!(matches!(bad, Error::Invalid { ref field, .. } if field == "name"), "{bad}");
    let versioned = decide(&Request::new(create("fresh", &[]), Some(3)), &reads(None), NOW).unwrap_err();
    assert!(matches!(versioned, Error::Invalid { ref field, .. } if field == "expected_resource_version"));

    // Credentials become environment variables: two sources may not name the same one.
    let mut r = reads(None);
    r.providers.insert("p3".into(), provider("p3", "P1_KEY"));
    let clash = decide(&Request::new(create("fresh", &["p1", "p3"]), None), &r, NOW).unwrap_err();
    assert_eq!(clash.code(), Code::FailedPrecondition);
    assert!(clash.to_string().contains("P1_KEY"), "{clash}");
}

#[test]
fn stop_row() {
    for kind in ALL {
        let result = on(kind, stop());
        match kind {
            PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused | PhaseKind::Error => {
                let d = result.unwrap();
                let next = written(&d);
                assert_eq!((next.phase.kind(), next.intent), (PhaseKind::Stopping, Intent::Stopped), "{kind}");
                assert_eq!(next.generation, 3, "stop keeps the generation");
                assert_eq!(d.effects, vec![Effect::Stop { sandbox: SandboxId::new("sb-1"), generation: 3 }]);
            }
            PhaseKind::Stopping | PhaseKind::Stopped => {
                let d = result.unwrap();
                assert!(d.writes.is_empty() && d.effects.is_empty(), "{kind}: a no-op success");
                assert!(matches!(d.outcome, Outcome::Sandbox(ref s) if s.phase.kind() == kind));
            }
            PhaseKind::Deleting => assert_eq!(result.unwrap_err().code(), Code::FailedPrecondition),
        }
    }
}

/// DESIGN 9.3: a completed sandbox (its command exited 0) is Stopped with intent Running; a
/// stop writes the intent, so nothing starts it again by itself, and a start runs it again.
#[test]
fn a_completed_sandbox_takes_a_stop_as_intent_and_a_start_as_a_new_generation() {
    let mut completed = record(PhaseKind::Stopped);
    completed.intent = Intent::Running;
    assert!(completed.completed());
    let d = decide(&Request::new(stop(), None), &reads(Some(completed.clone())), NOW).unwrap();
    let next = written(&d);
    assert_eq!((next.phase.kind(), next.intent), (PhaseKind::Stopped, Intent::Stopped));
    assert!(d.effects.is_empty(), "nothing runs: nothing to stop");
    let again = decide(&Request::new(stop(), None), &reads(Some(next.clone())), NOW).unwrap();
    assert!(again.writes.is_empty(), "then a stop is a no-op");
    let d = decide(&Request::new(start(), None), &reads(Some(completed)), NOW).unwrap();
    assert_eq!((written(&d).phase.kind(), written(&d).generation), (PhaseKind::Starting, 4));
}

#[test]
fn start_row() {
    for kind in ALL {
        let result = on(kind, start());
        match kind {
            PhaseKind::Stopped | PhaseKind::Error => {
                let d = result.unwrap();
                let next = written(&d);
                assert_eq!((next.phase.kind(), next.intent), (PhaseKind::Starting, Intent::Running), "{kind}");
                // The generation bump and the exit fence are in the one decided write.
                assert_eq!(next.generation, 4);
                // A run restarted out of band may start after the recorded exit, even after a
                // stop: the fence never settles the new generation by itself.
                assert_eq!(next.exit_fence, ExitFence { marker: Some(marker(500)), settled: false }, "{kind}");
                assert_eq!(next.run, Run::Pending);
                assert_eq!(d.writes.len(), 1);
                assert_eq!(d.effects, vec![Effect::Start { sandbox: SandboxId::new("sb-1"), generation: 4 }]);
            }
            PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Provisioning => {
                let d = result.unwrap();
                assert!(d.writes.is_empty() && d.effects.is_empty(), "{kind}: a no-op success");
            }
            PhaseKind::Deleting | PhaseKind::Stopping | PhaseKind::Paused => {
                let err = result.unwrap_err();
                assert_eq!(err.code(), Code::FailedPrecondition, "{kind}");
                assert!(err.to_string().contains(&kind.to_string()), "{err}");
            }
        }
    }
}

fn pause() -> Command {
    pause_as(Hold::Freezer)
}
fn pause_as(hold: Hold) -> Command {
    Command::PauseSandbox { name: "box".into(), hold }
}
fn resume() -> Command {
    Command::ResumeSandbox { name: "box".into() }
}

/// DESIGN 12.1: only a live run is paused; the generation never moves; a repeat re-drives.
#[test]
fn pause_row() {
    let pause_effect = Effect::Pause { sandbox: SandboxId::new("sb-1"), generation: 3, hold: Hold::Freezer };
    for kind in ALL {
        let result = on(kind, pause());
        match kind {
            PhaseKind::Ready => {
                let d = result.unwrap();
                let next = written(&d);
                // The phase moves only when the run is seen frozen.
                assert_eq!((next.phase.kind(), next.intent, next.generation), (PhaseKind::Ready, Intent::Paused, 3));
                assert_eq!(d.effects, vec![pause_effect.clone()]);
            }
            PhaseKind::Paused => {
                let d = result.unwrap();
                assert!(d.writes.is_empty(), "already paused: nothing written");
                assert_eq!(d.effects, vec![pause_effect.clone()], "but the runtime is asked again");
            }
            _ => {
                let err = result.unwrap_err();
                assert_eq!(err.code(), Code::FailedPrecondition, "{kind}");
                assert!(
                    err.to_string().contains("cannot pause") && err.to_string().contains(&kind.to_string()),
                    "{err}"
                );
            }
        }
    }
    // A resume under way is turned back.
    let mut resuming = record(PhaseKind::Paused);
    resuming.intent = Intent::Running;
    let d = decide(&Request::new(pause(), None), &reads(Some(resuming)), NOW).unwrap();
    assert_eq!(written(&d).intent, Intent::Paused);
    assert_eq!(d.effects, vec![pause_effect]);
}

/// DESIGN 12.1: a checkpoint is a pause like the freezer's, kept in the record so that every
/// re-drive asks for it again; a pause that asks for the other hold of a paused sandbox is
/// refused, naming both, and writes nothing.
#[test]
fn a_pause_keeps_to_its_hold() {
    let checkpoint = Effect::Pause { sandbox: SandboxId::new("sb-1"), generation: 3, hold: Hold::Checkpoint };
    let d = on(PhaseKind::Ready, pause_as(Hold::Checkpoint)).unwrap();
    let next = written(&d);
    assert_eq!((next.phase.kind(), next.intent, next.hold), (PhaseKind::Ready, Intent::Paused, Hold::Checkpoint));
    assert_eq!(d.effects, vec![checkpoint.clone()]);
    let mut checkpointed = record(PhaseKind::Paused);
    checkpointed.hold = Hold::Checkpoint;
    let again = decide(&Request::new(pause_as(Hold::Checkpoint), None), &reads(Some(checkpointed.clone())), NOW);
    let again = again.unwrap();
    assert!(again.writes.is_empty());
    assert_eq!(again.effects, vec![checkpoint]);
    let err = decide(&Request::new(pause(), None), &reads(Some(checkpointed)), NOW).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        err.to_string(),
        "sandbox 'box' is paused to a checkpoint already: resume it before pausing it in the freezer"
    );
    let err = on(PhaseKind::Paused, pause_as(Hold::Checkpoint)).unwrap_err();
    assert!(err.to_string().contains("is paused in the freezer already"), "{err}");
    // A resume lets go of either; the next pause holds as it asks.
    let mut resumed = record(PhaseKind::Ready);
    resumed.hold = Hold::Checkpoint;
    let d = decide(&Request::new(pause(), None), &reads(Some(resumed)), NOW).unwrap();
    assert_eq!(written(&d).hold, Hold::Freezer);
}

#[test]
fn resume_row() {
    let resume_effect = Effect::Resume { sandbox: SandboxId::new("sb-1"), generation: 3 };
    for kind in ALL {
        let result = on(kind, resume());
        match kind {
            PhaseKind::Paused => {
                let d = result.unwrap();
                let next = written(&d);
                assert_eq!((next.phase.kind(), next.intent, next.generation), (PhaseKind::Paused, Intent::Running, 3));
                assert_eq!(d.effects, vec![resume_effect.clone()]);
            }
            PhaseKind::Ready => {
                let d = result.unwrap();
                assert!(d.writes.is_empty() && d.effects.is_empty(), "not paused: a no-op success");
            }
            _ => {
                let err = result.unwrap_err();
                assert_eq!(err.code(), Code::FailedPrecondition, "{kind}");
                assert!(err.to_string().contains("cannot resume"), "{err}");
            }
        }
    }
    // A pause not yet seen to land is resumed all the same.
    let mut pausing = record(PhaseKind::Ready);
    pausing.intent = Intent::Paused;
    let d = decide(&Request::new(resume(), None), &reads(Some(pausing.clone())), NOW).unwrap();
    assert_eq!(written(&d).intent, Intent::Running);
    assert_eq!(d.effects, vec![resume_effect.clone()]);
    // Past its deadline a sandbox is renewed before it is resumed, as before it is started.
    let mut late = record(PhaseKind::Paused);
    late.deadline = Some(NOW);
    let err = decide(&Request::new(resume(), None), &reads(Some(late)), NOW).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("renew it before resuming it"), "{err}");
    // A resume repeated while the first is under way re-drives the runtime.
    let mut resuming = record(PhaseKind::Paused);
    resuming.intent = Intent::Running;
    let d = decide(&Request::new(resume(), None), &reads(Some(resuming)), NOW).unwrap();
    assert!(d.writes.is_empty());
    assert_eq!(d.effects, vec![resume_effect]);
}

#[test]
fn start_settles_the_fence_only_after_a_run_seen_to_end() {
    let main_exit =
        Phase::Error(Failure { reason: FailureReason::MainProcessExited, exit_code: Some(2), message: "m".into() });
    // The failed run may be alive; a start of the old generation may still be in flight.
    for (phase, run) in
        [(main_exit, Run::Started { at: None }), (Phase::Stopped, Run::Pending), (error_phase(), Run::Pending)]
    {
        let mut sandbox = record(PhaseKind::Error);
        sandbox.phase = phase;
        sandbox.run = run;
        let d = decide(&Request::new(start(), None), &reads(Some(sandbox)), NOW).unwrap();
        assert_eq!(written(&d).exit_fence, ExitFence { marker: Some(marker(500)), settled: false }, "{run:?}");
    }
}

#[test]
fn delete_row() {
    for kind in ALL {
        let d = on(kind, delete()).unwrap();
        let effect = Effect::Delete { sandbox: SandboxId::new("sb-1") };
        assert_eq!(d.effects, vec![effect], "{kind}");
        if kind == PhaseKind::Deleting {
            assert!(d.writes.is_empty(), "a repeated delete re-drives the driver without writing");
        } else {
            let next = written(&d);
            assert_eq!((next.phase.kind(), next.intent), (PhaseKind::Deleting, Intent::Deleted));
        }
    }
}

#[test]
fn attach_detach_row() {
    let attach = || Command::AttachProvider { sandbox: "box".into(), provider: "p2".into() };
    let detach = || Command::DetachProvider { sandbox: "box".into(), provider: "p1".into() };
    for kind in ALL {
        for (command, attached) in [(attach(), true), (detach(), false)] {
            let result = on(kind, command);
            if kind == PhaseKind::Deleting {
                assert_eq!(result.unwrap_err().code(), Code::FailedPrecondition);
                continue;
            }
            let d = result.unwrap();
            let next = written(&d);
            assert_eq!(next.providers.contains(if attached { "p2" } else { "p1" }), attached);
            assert_eq!(next.phase, record(kind).phase, "applies at the next (re)start: no phase change");
            assert!(d.effects.is_empty());
            // Only an attach touches the provider, in the same transaction.
            assert_eq!(d.writes.len(), if attached { 2 } else { 1 });
        }
    }
    // Idempotent both ways.
    let again = decide(
        &Request::new(Command::AttachProvider { sandbox: "box".into(), provider: "p1".into() }, None),
        &reads(Some(record(PhaseKind::Ready))),
        NOW,
    )
    .unwrap();
    assert!(again.writes.is_empty());
    let absent =
        on(PhaseKind::Ready, Command::DetachProvider { sandbox: "box".into(), provider: "p2".into() }).unwrap();
    assert!(absent.writes.is_empty());
    let unknown = on(PhaseKind::Ready, Command::AttachProvider { sandbox: "box".into(), provider: "zz".into() });
    assert_eq!(unknown.unwrap_err().code(), Code::FailedPrecondition);
    let mut full = record(PhaseKind::Ready);
    full.providers = std::sync::Arc::new((0..32).map(|i| format!("q{i}")).collect());
    let over = decide(&Request::new(attach(), None), &reads(Some(full)), NOW).unwrap_err();
    assert!(matches!(over, Error::Invalid { ref field, .. } if field == "provider"), "{over}");
}

#[test]
fn delete_provider_row() {
    let request = Request::new(Command::DeleteProvider { name: "p1".into() }, None);
    let blocked_by = |kinds: &[PhaseKind]| {
        let users = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let mut s = record(*k);
                s.name = format!("box{i}").into();
                s
            })
            .collect();
        decide(&request, &Reads { users, ..reads(None) }, NOW)
    };
    for kind in ALL {
        let result = blocked_by(&[kind]);
        if kind == PhaseKind::Deleting {
            let d = result.unwrap();
            assert_eq!(d.writes, vec![Write::RemoveProvider { name: "p1".into(), expected: 4 }]);
        } else {
            let err = result.unwrap_err();
            assert_eq!(err.code(), Code::FailedPrecondition, "{kind}");
            assert_eq!(err, Error::ProviderAttached { provider: "p1".into(), sandboxes: vec!["box0".into()] });
        }
    }
    // Deleting references are released even beside others: only the live ones are named.
    let err = blocked_by(&[PhaseKind::Deleting, PhaseKind::Ready]).unwrap_err();
    assert_eq!(err, Error::ProviderAttached { provider: "p1".into(), sandboxes: vec!["box1".into()] });
    let missing = decide(&Request::new(Command::DeleteProvider { name: "zz".into() }, None), &reads(None), NOW);
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
}

#[test]
fn every_mutating_command_checks_a_client_version_first() {
    let commands = [
        stop(),
        start(),
        delete(),
        Command::AttachProvider { sandbox: "box".into(), provider: "p2".into() },
        Command::DetachProvider { sandbox: "box".into(), provider: "p1".into() },
    ];
    for kind in ALL {
        for command in &commands {
            let stale = decide(&Request::new(command.clone(), Some(6)), &reads(Some(record(kind))), NOW).unwrap_err();
            assert_eq!(
                stale,
                Error::StaleVersion {
                    kind: berth_core::Kind::Sandbox,
                    name: "box".into(),
                    expected: 6,
                    current: Some(7)
                },
                "{kind} {command:?}: ABORTED even where the command would be a no-op or refused"
            );
            assert_eq!(stale.code(), Code::Aborted);
            assert!(stale.to_string().contains('6') && stale.to_string().contains('7'));
            // The current version is accepted.
            let fresh = decide(&Request::new(command.clone(), Some(7)), &reads(Some(record(kind))), NOW);
            assert_ne!(fresh.err().map(|e| e.code()), Some(Code::Aborted));
        }
    }
    let provider_delete = Request::new(Command::DeleteProvider { name: "p1".into() }, Some(3));
    let stale = decide(&provider_delete, &reads(None), NOW).unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    assert_eq!(
        stale,
        Error::StaleVersion { kind: berth_core::Kind::Provider, name: "p1".into(), expected: 3, current: Some(4) },
        "the provider's version is checked, and the error names the provider"
    );
}

#[test]
fn a_client_version_that_goes_stale_during_the_write_is_aborted_and_writes_nothing() {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    let version = w.sandbox("box").resource_version;
    w.interference.push("box".into());
    let before = w.store.clone().sandboxes;
    let err = w.request(Command::StopSandbox { name: "box".into() }, Some(version)).unwrap_err();
    assert_eq!(
        err,
        Error::StaleVersion {
            kind: berth_core::Kind::Sandbox,
            name: "box".into(),
            expected: version,
            current: Some(version + 1)
        }
    );
    let after = &w.store.sandboxes;
    assert_eq!(after.len(), before.len());
    assert_eq!(w.sandbox("box").phase, Phase::Provisioning, "nothing of the stop was written");
    assert_eq!(w.sandbox("box").resource_version, version + 1, "only the other writer's write landed");
}

#[test]
fn a_server_owned_command_re_decides_after_a_conflict() {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    w.interference.push("box".into());
    let out = w.stop("box").unwrap();
    assert!(matches!(out, Outcome::Sandbox(s) if s.phase == Phase::Stopping && s.resource_version == 3));
}

#[test]
fn phase_change_names_only_phases_a_decision_writes() {
    let before = record(PhaseKind::Ready);
    let stopping = on(PhaseKind::Ready, stop()).unwrap();
    assert_eq!(stopping.phase_change(Some(&before)), Some((Some(PhaseKind::Ready), Some(PhaseKind::Stopping))));
    // A no-op writes nothing, so changes nothing, even measured against another phase.
    let noop = on(PhaseKind::Stopped, stop()).unwrap();
    assert!(noop.writes.is_empty());
    assert_eq!(noop.phase_change(Some(&before)), None);
    // A write that keeps the phase is no phase change.
    let attach =
        on(PhaseKind::Ready, Command::AttachProvider { sandbox: "box".into(), provider: "p2".into() }).unwrap();
    assert!(!attach.writes.is_empty());
    assert_eq!(attach.phase_change(Some(&before)), None);
    let created = decide(
        &Request::new(
            Command::CreateSandbox {
                id: SandboxId::new("sb-new"),
                name: "new".into(),
                spec: spec(),
                providers: Default::default(),
                deadline: None,
            },
            None,
        ),
        &reads(None),
        NOW,
    )
    .unwrap();
    assert_eq!(created.phase_change(None), Some((None, Some(PhaseKind::Provisioning))));
    let provider = decide(
        &Request::new(Command::DeleteProvider { name: "p9".into() }, None),
        &Reads { providers: [("p9".to_string(), provider("p9", "K"))].into(), ..reads(None) },
        NOW,
    )
    .unwrap();
    assert_eq!(provider.phase_change(None), None, "provider decisions change no phase");
}
