//! One test per rule of DESIGN 3.5, each run over every observation path and phase it covers.

use berth_core::{
    Code, Effect, Error, ExitFence, ExitMarker, Failure, FailureReason, Hold, Intent, MainProcess, Observation, Phase,
    PhaseKind, Run, RuntimeSource, RuntimeState, Sandbox, SandboxId, StartReply, Timestamp, Write, merge,
};

use crate::world::{SOURCES, spec};

const NOW: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);

fn t(n: i64) -> Timestamp {
    Timestamp::from_unix_nanos(n)
}

fn exit(started: i64, finished: i64, code: i32) -> ExitMarker {
    ExitMarker { started_at: t(started), finished_at: t(finished), exit_code: code, out_of_memory: false }
}

/// The replaced run ran 50..100; this is generation 2.
fn fence() -> ExitMarker {
    exit(50, 100, 143)
}

fn sandbox(phase: Phase, intent: Intent, run: Run) -> Sandbox {
    Sandbox {
        intent,
        phase,
        resource_version: 10,
        generation: 2,
        exit_fence: ExitFence { marker: Some(fence()), settled: true },
        run,
        last_exit: Some(fence()),
        ..Sandbox::new(SandboxId::new("sb-1"), "box", spec(), t(0))
    }
}

fn error(reason: FailureReason) -> Phase {
    Phase::Error(Failure { reason, exit_code: None, message: String::new() })
}

/// Every phase (but Deleting), as the API leaves it, with this generation's run started at 200.
fn phases() -> Vec<Sandbox> {
    let started = Run::Started { at: Some(t(200)) };
    let with_last_exit = |mut s: Sandbox| {
        if let Run::Ended(m) = s.run {
            s.last_exit = Some(m);
        }
        s
    };
    [
        sandbox(Phase::Provisioning, Intent::Running, Run::Pending),
        sandbox(Phase::Starting, Intent::Running, Run::Pending),
        sandbox(Phase::Starting, Intent::Running, started),
        sandbox(Phase::Ready, Intent::Running, started),
        sandbox(Phase::Paused, Intent::Paused, started),
        sandbox(Phase::Stopping, Intent::Stopped, started),
        sandbox(Phase::Stopped, Intent::Stopped, Run::Ended(exit(200, 300, 143))),
        sandbox(error(FailureReason::ContainerExited), Intent::Running, Run::Ended(exit(200, 300, 1))),
    ]
    .into_iter()
    .map(with_last_exit)
    .collect()
}

/// Whether a report of its command's end ends `sandbox`'s run: one meant to run (or paused),
/// starting or up.
fn live(sandbox: &Sandbox) -> bool {
    matches!(sandbox.intent, Intent::Running | Intent::Paused)
        && matches!(
            sandbox.phase.kind(),
            PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Paused
        )
}

fn runtime(source: RuntimeSource, state: RuntimeState) -> Observation {
    Observation::Runtime { source, state, as_of_version: None }
}

/// Every kind of observation, for the rules that say "everything".
fn everything() -> Vec<Observation> {
    let mut all: Vec<Observation> = SOURCES
        .iter()
        .flat_map(|s| {
            [
                runtime(*s, RuntimeState::Running { started_at: t(400), held: None }),
                runtime(*s, RuntimeState::Running { started_at: t(200), held: Some(Hold::Freezer) }),
                runtime(*s, RuntimeState::Running { started_at: t(200), held: None }),
                runtime(*s, RuntimeState::Exited(exit(400, 500, 9))),
                runtime(*s, RuntimeState::Exited(fence())),
                runtime(*s, RuntimeState::Created),
                runtime(*s, RuntimeState::Absent { at: None }),
            ]
        })
        .collect();
    all.extend([
        Observation::Started { generation: 2, reply: StartReply::Running { started_at: t(400) } },
        Observation::Started { generation: 2, reply: StartReply::Exited(exit(400, 500, 9)) },
        Observation::Started { generation: 2, reply: StartReply::Failed { message: "no".into() } },
        Observation::Stopped { generation: 2, state: RuntimeState::Exited(exit(400, 500, 9)) },
        Observation::SupervisorConnected { generation: 2, main: MainProcess::Running },
        Observation::SupervisorConnected { generation: 2, main: MainProcess::Exited { code: 4, out_of_memory: false } },
        Observation::SupervisorConnected { generation: 2, main: MainProcess::Unstartable("not found".into()) },
        Observation::MainProcessExited { generation: 2, exit_code: 4, out_of_memory: false },
        Observation::MainProcessExited { generation: 1, exit_code: 4, out_of_memory: false },
    ]);
    all
}

fn after(before: &Sandbox, observation: &Observation) -> Sandbox {
    let d = merge(Some(before), &before.id, observation, NOW).unwrap();
    match d.writes.as_slice() {
        [] => before.clone(),
        [Write::UpdateSandbox { record, expected }] => {
            assert_eq!(*expected, before.resource_version);
            record.clone()
        }
        other => panic!("unexpected writes {other:?}"),
    }
}

#[test]
fn rule_1_deleting_waits_only_for_absence() {
    let deleting = sandbox(Phase::Deleting, Intent::Deleted, Run::Started { at: Some(t(200)) });
    for observation in everything() {
        if matches!(observation, Observation::SupervisorConnected { .. }) {
            continue; // a valid identity is still accepted; it changes nothing either
        }
        let d = merge(Some(&deleting), &deleting.id, &observation, NOW).unwrap();
        assert!(d.writes.is_empty(), "{observation:?} wrote {:?}", d.writes);
        let absent = matches!(observation, Observation::Runtime { state: RuntimeState::Absent { .. }, .. });
        let redrive = vec![Effect::Delete { sandbox: deleting.id.clone() }];
        assert_eq!(d.effects, if absent { redrive } else { vec![] }, "{observation:?}");
    }
    let done = merge(Some(&deleting), &deleting.id, &Observation::Deleted, NOW).unwrap();
    assert_eq!(done.writes, vec![Write::RemoveSandbox { id: deleting.id.clone(), expected: 10 }]);
}

#[test]
fn rule_2_an_exit_not_after_the_fence_is_ignored_in_every_phase_and_on_every_path() {
    let stale = [fence(), exit(10, 40, 0), exit(50, 99, 1), exit(100, 100, 3)];
    for before in phases() {
        for source in SOURCES {
            for marker in stale {
                let obs = runtime(source, RuntimeState::Exited(marker));
                let next = after(&before, &obs);
                assert_eq!(next, before, "{} via {source:?}: {marker:?} changed the record", before.phase);
            }
        }
        // The driver's stop reply and a delayed duplicate are no different.
        let next = after(&before, &Observation::Stopped { generation: 1, state: RuntimeState::Exited(fence()) });
        assert_eq!(next.phase, before.phase);
    }
}

#[test]
fn rule_3_a_fresh_exit_follows_the_intent() {
    for before in phases() {
        for source in SOURCES {
            let fresh = exit(200, 700, 3);
            let next = after(&before, &runtime(source, RuntimeState::Exited(fresh)));
            let expected = match (before.intent, before.phase.kind()) {
                (Intent::Stopped, _) => PhaseKind::Stopped,
                (Intent::Running | Intent::Paused, _) => PhaseKind::Error,
                (Intent::Deleted, _) => unreachable!(),
            };
            assert_eq!(next.phase.kind(), expected, "{} via {source:?}", before.phase);
            assert_eq!(next.run, Run::Ended(fresh));
            assert_eq!(next.last_exit, Some(fresh), "Stopped and Error carry the marker of the run that ended");
            if before.phase.kind() != PhaseKind::Error && expected == PhaseKind::Error {
                assert_eq!(
                    next.phase,
                    Phase::Error(Failure {
                        reason: FailureReason::ContainerExited,
                        exit_code: Some(3),
                        message: "the sandbox exited with code 3".into()
                    })
                );
            }
        }
    }
}

#[test]
fn rule_4_the_current_generations_supervisor_makes_a_starting_sandbox_ready() {
    for before in phases() {
        let next = after(&before, &Observation::SupervisorConnected { generation: 2, main: MainProcess::Running });
        let expected = match before.phase.kind() {
            PhaseKind::Provisioning | PhaseKind::Starting => PhaseKind::Ready,
            other => other,
        };
        assert_eq!(next.phase.kind(), expected, "{}", before.phase);
        for old in [1, 3] {
            let err = merge(
                Some(&before),
                &before.id,
                &Observation::SupervisorConnected { generation: old, main: MainProcess::Running },
                NOW,
            )
            .unwrap_err();
            assert_eq!(err, Error::StaleIdentity { sandbox: "box".into(), presented: old, current: 2 });
            assert_eq!(err.code(), Code::PermissionDenied);
        }
    }
}

#[test]
fn rule_5_a_main_process_exit_of_the_current_generation_is_an_error() {
    for before in phases() {
        let next =
            after(&before, &Observation::MainProcessExited { generation: 2, exit_code: 7, out_of_memory: false });
        if live(&before) {
            assert_eq!(
                next.phase,
                Phase::Error(Failure {
                    reason: FailureReason::MainProcessExited,
                    exit_code: Some(7),
                    message: "the main process exited with code 7".into()
                }),
                "{}",
                before.phase
            );
        } else {
            assert_eq!(next, before, "{}", before.phase);
        }
        assert_eq!(
            after(&before, &Observation::MainProcessExited { generation: 1, exit_code: 7, out_of_memory: false }),
            before
        );
    }
}

/// DESIGN 9.3: exit code 0 is a completion, whichever path reports it: Stopped, the intent
/// still Running (so a Start runs the command again), and never Ready again in that generation.
#[test]
fn a_main_process_exit_0_completes_the_generation_on_every_path() {
    for before in phases() {
        let reports = [
            Observation::MainProcessExited { generation: 2, exit_code: 0, out_of_memory: false },
            Observation::SupervisorConnected {
                generation: 2,
                main: MainProcess::Exited { code: 0, out_of_memory: false },
            },
        ];
        let mut all: Vec<Observation> = reports.into();
        all.extend(SOURCES.iter().map(|s| runtime(*s, RuntimeState::Exited(exit(200, 700, 0)))));
        for observation in all {
            let next = after(&before, &observation);
            let ends = before.intent == Intent::Running
                && matches!(before.phase.kind(), PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready);
            if ends {
                assert_eq!(next.phase, Phase::Stopped, "{} after {observation:?}", before.phase);
                assert_eq!(next.intent, Intent::Running, "an observation never changes the intent");
                assert!(next.completed());
                let again =
                    after(&next, &Observation::SupervisorConnected { generation: 2, main: MainProcess::Running });
                assert_eq!(again.phase, Phase::Stopped, "rule 7: no Ready again within the generation");
            } else if before.intent == Intent::Stopped {
                assert!(!next.completed(), "a stop is not a completion");
            }
        }
    }
}

/// DESIGN 9.3 and defect 8 of issue 13: a supervisor whose command ended before its session
/// opened, or never started, never makes the sandbox Ready, and says why.
#[test]
fn a_hello_after_the_command_ended_or_failed_to_start_never_makes_the_sandbox_ready() {
    for before in phases() {
        let starting = live(&before);
        let exited = after(
            &before,
            &Observation::SupervisorConnected {
                generation: 2,
                main: MainProcess::Exited { code: 3, out_of_memory: false },
            },
        );
        let cause = "cannot run \"nope\": No such file or directory (os error 2)".to_string();
        let unstartable =
            after(&before, &Observation::SupervisorConnected { generation: 2, main: MainProcess::Unstartable(cause) });
        if starting {
            assert_eq!(
                exited.phase,
                Phase::Error(Failure {
                    reason: FailureReason::MainProcessExited,
                    exit_code: Some(3),
                    message: "the main process exited with code 3".into()
                })
            );
            assert_eq!(
                unstartable.phase,
                Phase::Error(Failure {
                    reason: FailureReason::CommandFailedToStart,
                    exit_code: None,
                    message:
                        "the command could not be started: cannot run \"nope\": No such file or directory (os error 2)"
                            .into()
                })
            );
            assert_ne!(unstartable.run, Run::Pending, "the run did start; only its command did not");
        } else {
            assert_eq!(exited.phase, before.phase);
            assert_eq!(unstartable.phase, before.phase);
        }
        // Only the current generation is heard, whatever its hello says.
        for main in [MainProcess::Exited { code: 3, out_of_memory: false }, MainProcess::Unstartable("x".into())] {
            let err = merge(Some(&before), &before.id, &Observation::SupervisorConnected { generation: 1, main }, NOW)
                .unwrap_err();
            assert_eq!(err.code(), Code::PermissionDenied);
        }
    }
}

#[test]
fn rule_6_absence_is_compute_resource_missing_on_every_path() {
    for before in phases() {
        let pending = before.run == Run::Pending;
        for source in SOURCES {
            let next = after(&before, &runtime(source, RuntimeState::Absent { at: None }));
            if pending {
                // Its start will create the resource: nothing to report yet.
                assert_eq!(next, before, "{} via {source:?}", before.phase);
            } else {
                assert_eq!(next.phase, error_missing(), "{} via {source:?}", before.phase);
            }
        }
        if !pending && before.phase.kind() == PhaseKind::Stopping {
            let next =
                after(&before, &Observation::Stopped { generation: 2, state: RuntimeState::Absent { at: None } });
            assert_eq!(next.phase, error_missing());
        }
    }
}

fn error_missing() -> Phase {
    Phase::Error(Failure {
        reason: FailureReason::ComputeResourceMissing,
        exit_code: None,
        message: "the runtime no longer has this sandbox's compute resource".into(),
    })
}

#[test]
fn rule_6_absence_older_than_what_the_record_knows_is_ignored() {
    let ready = sandbox(Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) });
    // A removal event from before this generation's run started.
    let old_event = runtime(RuntimeSource::WatchEvent, RuntimeState::Absent { at: Some(t(150)) });
    assert_eq!(after(&ready, &old_event), ready);
    let new_event = runtime(RuntimeSource::WatchEvent, RuntimeState::Absent { at: Some(t(250)) });
    assert_eq!(after(&ready, &new_event).phase, error_missing());
    // A poll that began before the record's last write.
    let stale_poll = Observation::Runtime {
        source: RuntimeSource::PollList,
        state: RuntimeState::Absent { at: None },
        as_of_version: Some(9),
    };
    assert_eq!(after(&ready, &stale_poll), ready);
    let poll = Observation::Runtime {
        source: RuntimeSource::PollList,
        state: RuntimeState::Absent { at: None },
        as_of_version: Some(10),
    };
    assert_eq!(after(&ready, &poll).phase, error_missing());
}

#[test]
fn rule_7_observations_never_change_intent_nor_bring_error_or_stopped_back_to_ready() {
    let mut all = phases();
    all.push(sandbox(Phase::Deleting, Intent::Deleted, Run::Pending));
    for before in all {
        for observation in everything() {
            let Ok(d) = merge(Some(&before), &before.id, &observation, NOW) else { continue };
            let Some(Write::UpdateSandbox { record: next, .. }) = d.writes.first() else { continue };
            // The one exception: a run that ends under a pause takes the pause with it.
            let pause_ended = before.intent == Intent::Paused
                && matches!(next.intent, Intent::Running | Intent::Stopped)
                && matches!(next.phase.kind(), PhaseKind::Error | PhaseKind::Stopped);
            if !pause_ended {
                assert_eq!(next.intent, before.intent, "{} + {observation:?}", before.phase);
            }
            assert_eq!(next.generation, before.generation, "observations never rotate identities");
            if matches!(before.phase.kind(), PhaseKind::Error | PhaseKind::Stopped) {
                assert_ne!(next.phase.kind(), PhaseKind::Ready, "{} + {observation:?}", before.phase);
            }
        }
    }
}

#[test]
fn before_the_run_is_known_to_start_only_a_failed_start_gives_error() {
    let mut starting = sandbox(Phase::Starting, Intent::Running, Run::Pending);
    starting.exit_fence.settled = false; // a run of the failed generation may still be alive
    for observation in everything() {
        let next = after(&starting, &observation);
        let failed = matches!(observation, Observation::Started { reply: StartReply::Failed { .. }, .. });
        let attributed = matches!(
            observation,
            Observation::Started { .. }
                | Observation::SupervisorConnected { .. }
                | Observation::MainProcessExited { generation: 2, .. }
        );
        if failed {
            assert!(matches!(next.phase, Phase::Error(Failure { reason: FailureReason::StartFailed, .. })));
        } else if !attributed {
            assert_eq!(next.phase, Phase::Starting, "{observation:?}");
        }
    }
}

#[test]
fn the_driver_start_reply_fixes_which_run_is_current() {
    let mut starting = sandbox(Phase::Starting, Intent::Running, Run::Pending);
    starting.exit_fence.settled = false;
    let started =
        after(&starting, &Observation::Started { generation: 2, reply: StartReply::Running { started_at: t(400) } });
    assert_eq!(started.run, Run::Started { at: Some(t(400)) });
    // The replaced run (started 300, after the fence) ends late: stale now.
    let late = runtime(RuntimeSource::WatchEvent, RuntimeState::Exited(exit(300, 390, 143)));
    assert_eq!(after(&started, &late).phase, Phase::Starting);
    // This generation's own exit is still reported.
    let genuine = runtime(RuntimeSource::PollGet, RuntimeState::Exited(exit(400, 450, 3)));
    assert_eq!(after(&started, &genuine).phase.kind(), PhaseKind::Error);
    // A reply of an older generation's start changes nothing.
    let old = Observation::Started { generation: 1, reply: StartReply::Failed { message: "x".into() } };
    assert_eq!(after(&starting, &old), starting);
}

#[test]
fn a_run_alive_while_the_intent_is_stopped_is_stopped_again() {
    let stopped = sandbox(Phase::Stopped, Intent::Stopped, Run::Ended(exit(200, 300, 143)));
    // A snapshot of the run that was stopped: stale.
    let d = merge(
        Some(&stopped),
        &stopped.id,
        &runtime(RuntimeSource::PollList, RuntimeState::Running { started_at: t(200), held: None }),
        NOW,
    )
    .unwrap();
    assert!(d.writes.is_empty() && d.effects.is_empty());
    // A run started outside Berth after the stop.
    let d = merge(
        Some(&stopped),
        &stopped.id,
        &runtime(RuntimeSource::PollList, RuntimeState::Running { started_at: t(350), held: None }),
        NOW,
    )
    .unwrap();
    assert!(matches!(&d.writes[0], Write::UpdateSandbox { record, .. } if record.phase == Phase::Stopping));
    assert_eq!(d.effects, vec![Effect::Stop { sandbox: stopped.id.clone(), generation: 2 }]);
}

/// Found by the 10,000-seed exploration (seed 1750): generation 2's start (its fence unsettled,
/// as every Start's is) was still under way in the engine when its stop was acknowledged; the
/// run came up after, and was never stopped, since no report could say whose run it was.
#[test]
fn a_run_that_came_up_after_its_stop_was_acknowledged_is_stopped_whoever_it_belongs_to() {
    let mut stopped = sandbox(Phase::Stopped, Intent::Stopped, Run::Pending);
    stopped.exit_fence.settled = false;
    let running =
        |started| runtime(RuntimeSource::PollList, RuntimeState::Running { started_at: t(started), held: None });
    // A snapshot of the run the fence's exit ended: stale.
    let d = merge(Some(&stopped), &stopped.id, &running(50), NOW).unwrap();
    assert!(d.writes.is_empty() && d.effects.is_empty(), "{d:?}");
    // The start landing after the stop.
    let d = merge(Some(&stopped), &stopped.id, &running(350), NOW).unwrap();
    assert!(matches!(&d.writes[0], Write::UpdateSandbox { record, .. } if record.phase == Phase::Stopping), "{d:?}");
    assert_eq!(d.effects, vec![Effect::Stop { sandbox: stopped.id.clone(), generation: 2 }]);
    // Once that run's exit is seen, a late snapshot of it changes nothing.
    stopped.last_exit = Some(exit(350, 400, 143));
    let d = merge(Some(&stopped), &stopped.id, &running(350), NOW).unwrap();
    assert!(d.writes.is_empty() && d.effects.is_empty(), "{d:?}");
    // With intent Running nothing is stopped, and no run is taken for the generation's by its
    // start time alone.
    let mut wanted = sandbox(Phase::Starting, Intent::Running, Run::Pending);
    wanted.exit_fence.settled = false;
    let d = merge(Some(&wanted), &wanted.id, &running(350), NOW).unwrap();
    assert!(d.writes.is_empty() && d.effects.is_empty(), "{d:?}");
}

#[test]
fn a_leftover_resource_without_a_record_is_removed() {
    let id = SandboxId::new("sb-gone");
    let d = merge(
        None,
        &id,
        &runtime(RuntimeSource::PollList, RuntimeState::Running { started_at: t(1), held: None }),
        NOW,
    )
    .unwrap();
    assert_eq!(d.effects, vec![Effect::Delete { sandbox: id.clone() }]);
    assert!(d.writes.is_empty());
    let d = merge(None, &id, &runtime(RuntimeSource::PollList, RuntimeState::Absent { at: None }), NOW).unwrap();
    assert!(d.effects.is_empty());
    let err = merge(None, &id, &Observation::SupervisorConnected { generation: 1, main: MainProcess::Running }, NOW)
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[test]
fn every_observation_path_is_named_apart_in_logs_and_traces() {
    let mut names: Vec<&str> = everything().iter().map(Observation::source_name).collect();
    names.push(Observation::Deleted.source_name());
    names.dedup();
    assert_eq!(
        names,
        [
            "watch event",
            "initial sync",
            "poll get",
            "poll list",
            "recovery lookup",
            "driver start reply",
            "driver stop reply",
            "supervisor connect",
            "supervisor exit report",
            "driver delete reply"
        ]
    );
}

#[test]
fn a_failed_start_reply_is_an_error_only_for_a_wanted_start_not_yet_begun() {
    let failed = Observation::Started { generation: 2, reply: StartReply::Failed { message: "no".into() } };
    let starting = sandbox(Phase::Starting, Intent::Running, Run::Pending);
    assert!(matches!(
        after(&starting, &failed).phase,
        Phase::Error(Failure { reason: FailureReason::StartFailed, .. })
    ));
    // Stopped while starting: the stop goes on; a start that failed lost nothing.
    let stopping = sandbox(Phase::Stopping, Intent::Stopped, Run::Pending);
    assert_eq!(after(&stopping, &failed).phase, Phase::Stopping);
    // The run began (another attempt of this start got through): the failure is stale.
    let begun = sandbox(Phase::Starting, Intent::Running, Run::Started { at: Some(t(400)) });
    assert_eq!(after(&begun, &failed).phase, Phase::Starting);
    // Any phase past Starting has a run of its own to judge by.
    for phase in [Phase::Ready, Phase::Stopped] {
        let settled = sandbox(phase.clone(), Intent::Running, Run::Pending);
        assert_eq!(after(&settled, &failed).phase, phase);
    }
}

#[test]
fn a_start_reply_that_the_generations_run_is_gone_is_a_loss_not_a_failed_start() {
    let gone = Observation::Started { generation: 2, reply: StartReply::Gone };
    for run in [Run::Pending, Run::Started { at: Some(t(400)) }] {
        let next = after(&sandbox(Phase::Starting, Intent::Running, run), &gone);
        assert!(
            matches!(&next.phase, Phase::Error(f) if f.reason == FailureReason::ComputeResourceMissing),
            "{run:?}: {next:?}"
        );
        assert_ne!(next.run, Run::Pending, "it ran");
    }
    // Of an older generation: ignored, like every other reply of one.
    let old = Observation::Started { generation: 1, reply: StartReply::Gone };
    assert_eq!(after(&sandbox(Phase::Starting, Intent::Running, Run::Pending), &old).phase, Phase::Starting);
}

#[test]
fn rules_4_and_5_mark_a_pending_run_begun_and_keep_a_known_start_time() {
    let connected = Observation::SupervisorConnected { generation: 2, main: MainProcess::Running };
    let exited = Observation::MainProcessExited { generation: 2, exit_code: 7, out_of_memory: false };
    for observation in [&connected, &exited] {
        let pending = sandbox(Phase::Starting, Intent::Running, Run::Pending);
        assert_eq!(after(&pending, observation).run, Run::Started { at: None }, "{observation:?}");
        let timed = sandbox(Phase::Starting, Intent::Running, Run::Started { at: Some(t(400)) });
        assert_eq!(after(&timed, observation).run, Run::Started { at: Some(t(400)) }, "{observation:?}");
    }
}

/// DESIGN 10: a run the kernel killed for memory ends in Error OutOfMemory with the limit it
/// ran into, on every path that reports its end: the supervisor's report, its hello, and the
/// runtime's exit (Docker's and Podman's `OOMKilled`). A completion stays a completion.
#[test]
fn a_run_killed_for_memory_is_out_of_memory_on_every_path() {
    let limited = |mut s: Sandbox| {
        std::sync::Arc::make_mut(&mut s.spec).limits.memory_bytes = Some(64 << 20);
        s
    };
    let oom = Failure {
        reason: FailureReason::OutOfMemory,
        exit_code: Some(137),
        message: format!("the sandbox was killed for using more than its memory limit of {} bytes", 64u64 << 20),
    };
    let killed = ExitMarker { out_of_memory: true, ..exit(200, 700, 137) };
    for before in phases().into_iter().map(limited) {
        let mut reports = vec![
            Observation::MainProcessExited { generation: 2, exit_code: 137, out_of_memory: true },
            Observation::SupervisorConnected {
                generation: 2,
                main: MainProcess::Exited { code: 137, out_of_memory: true },
            },
        ];
        reports.extend(SOURCES.iter().map(|s| runtime(*s, RuntimeState::Exited(killed))));
        let ends = live(&before);
        for observation in reports {
            let next = after(&before, &observation);
            if ends {
                assert_eq!(next.phase, Phase::Error(oom.clone()), "{} after {observation:?}", before.phase);
            } else {
                assert_ne!(next.phase, Phase::Error(oom.clone()), "{} after {observation:?}", before.phase);
            }
        }
        let completed = after(
            &before,
            &runtime(
                RuntimeSource::WatchEvent,
                RuntimeState::Exited(ExitMarker { out_of_memory: true, ..exit(200, 700, 0) }),
            ),
        );
        if ends {
            assert_eq!(completed.phase, Phase::Stopped, "{}: exit 0 completed, whatever was killed", before.phase);
        }
    }
    // Without a limit, the memory it ran out of was the host's.
    let ready = sandbox(Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) });
    let next = after(&ready, &Observation::MainProcessExited { generation: 2, exit_code: 137, out_of_memory: true });
    let Phase::Error(failure) = next.phase else { panic!("{:?}", next.phase) };
    assert_eq!(failure.message, "the sandbox was killed for using more than the memory the host had for it");
}

/// The supervisor reported the end without the kernel's word on why (it could not read its
/// memory cgroup): the runtime's later report of the same run, killed for memory, says why.
/// Any other failure, and another run's report, stay as they are.
#[test]
fn the_runtimes_out_of_memory_refines_a_bare_main_process_exit_of_the_same_run() {
    let ready = sandbox(Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) });
    let bare = after(&ready, &Observation::MainProcessExited { generation: 2, exit_code: 137, out_of_memory: false });
    let Phase::Error(failure) = &bare.phase else { panic!("{:?}", bare.phase) };
    assert_eq!(failure.reason, FailureReason::MainProcessExited);
    let killed = ExitMarker { out_of_memory: true, ..exit(200, 700, 137) };
    for source in SOURCES {
        let next = after(&bare, &runtime(source, RuntimeState::Exited(killed)));
        let Phase::Error(failure) = &next.phase else { panic!("{:?}", next.phase) };
        assert_eq!(failure.reason, FailureReason::OutOfMemory, "{source:?}");
        assert_eq!(failure.exit_code, Some(137));
        // The failure's kind did not change: no restart is scheduled twice.
        assert_eq!(next.restarts, bare.restarts);
        // The replaced run's exit, fenced off, refines nothing.
        let stale = ExitMarker { out_of_memory: true, ..fence() };
        assert_eq!(after(&bare, &runtime(source, RuntimeState::Exited(stale))).phase, bare.phase, "{source:?}");
    }
    let lost =
        sandbox(error(FailureReason::ComputeResourceMissing), Intent::Running, Run::Started { at: Some(t(200)) });
    let next = after(&lost, &runtime(RuntimeSource::PollGet, RuntimeState::Exited(killed)));
    assert_eq!(next.phase, lost.phase, "only a bare main process exit is refined");
}

/// DESIGN 12.1: a pause or a resume is confirmed only by seeing the run held as asked or let
/// go, and a run that is not as its intent says is asked again, whatever path brought the
/// report.
#[test]
fn the_hold_follows_the_intent_on_every_path() {
    let started = Run::Started { at: Some(t(200)) };
    let pause = |hold| Effect::Pause { sandbox: SandboxId::new("sb-1"), generation: 2, hold };
    let resume = Effect::Resume { sandbox: SandboxId::new("sb-1"), generation: 2 };
    let (freezer, checkpoint) = (Some(Hold::Freezer), Some(Hold::Checkpoint));
    let cases = [
        // (phase, intent and its hold, held) -> (phase after, effects)
        (Phase::Ready, Intent::Paused, Hold::Freezer, freezer, PhaseKind::Paused, vec![]),
        (Phase::Ready, Intent::Paused, Hold::Freezer, None, PhaseKind::Ready, vec![pause(Hold::Freezer)]),
        // Thawed behind Berth's back: it runs (no exec is admitted all the same) and is paused again.
        (Phase::Paused, Intent::Paused, Hold::Freezer, None, PhaseKind::Ready, vec![pause(Hold::Freezer)]),
        (Phase::Paused, Intent::Paused, Hold::Freezer, freezer, PhaseKind::Paused, vec![]),
        (Phase::Paused, Intent::Running, Hold::Freezer, None, PhaseKind::Ready, vec![]),
        (Phase::Paused, Intent::Running, Hold::Freezer, freezer, PhaseKind::Paused, vec![resume.clone()]),
        // Frozen behind Berth's back (`docker pause`): not Ready while nothing in it can answer.
        (Phase::Ready, Intent::Running, Hold::Freezer, freezer, PhaseKind::Paused, vec![resume.clone()]),
        (Phase::Ready, Intent::Running, Hold::Freezer, None, PhaseKind::Ready, vec![]),
        // A checkpoint is confirmed by a checkpoint alone: a run frozen instead (`docker pause`
        // behind Berth's back, a pause re-driven as the wrong one) does not survive a reboot.
        (Phase::Ready, Intent::Paused, Hold::Checkpoint, checkpoint, PhaseKind::Paused, vec![]),
        (Phase::Ready, Intent::Paused, Hold::Checkpoint, freezer, PhaseKind::Ready, vec![pause(Hold::Checkpoint)]),
        (Phase::Paused, Intent::Paused, Hold::Checkpoint, freezer, PhaseKind::Ready, vec![pause(Hold::Checkpoint)]),
        (Phase::Paused, Intent::Paused, Hold::Freezer, checkpoint, PhaseKind::Ready, vec![pause(Hold::Freezer)]),
        (Phase::Paused, Intent::Running, Hold::Checkpoint, None, PhaseKind::Ready, vec![]),
        (Phase::Paused, Intent::Running, Hold::Checkpoint, checkpoint, PhaseKind::Paused, vec![resume.clone()]),
        (Phase::Ready, Intent::Running, Hold::Checkpoint, checkpoint, PhaseKind::Paused, vec![resume]),
    ];
    for (phase, intent, hold, held, expected, effects) in cases {
        let before = Sandbox { hold, ..sandbox(phase.clone(), intent, started) };
        let seen = RuntimeState::Running { started_at: t(200), held };
        for source in SOURCES.iter().copied().chain([RuntimeSource::PauseReply, RuntimeSource::ResumeReply]) {
            let d = merge(Some(&before), &before.id, &runtime(source, seen), NOW).unwrap();
            let next = after(&before, &runtime(source, seen));
            assert_eq!(next.phase.kind(), expected, "{phase} {intent:?} {hold:?} held={held:?} via {source:?}");
            assert_eq!(
                (next.intent, next.hold, next.generation),
                (intent, hold, before.generation),
                "nothing restarts"
            );
            assert_eq!(d.effects, effects, "{phase} {intent:?} {hold:?} held={held:?}");
        }
    }
}

/// DESIGN 12.1: a paused run that is gone (a host reboot) ends as a lost run, never Paused with
/// nothing behind it; its pause ends with it, so its restart policy applies.
#[test]
fn a_paused_run_that_is_gone_ends_as_a_lost_run() {
    let paused = sandbox(Phase::Paused, Intent::Paused, Run::Started { at: Some(t(200)) });
    let next = after(&paused, &runtime(RuntimeSource::PollGet, RuntimeState::Absent { at: None }));
    assert_eq!((next.phase, next.intent), (error_missing(), Intent::Running));
    let next = after(&paused, &runtime(RuntimeSource::PollGet, RuntimeState::Exited(exit(200, 900, 137))));
    assert_eq!((next.phase.kind(), next.intent), (PhaseKind::Error, Intent::Running));
    // A supervisor reconnecting after the thaw changes nothing.
    let hello = Observation::SupervisorConnected { generation: 2, main: MainProcess::Running };
    assert!(merge(Some(&paused), &paused.id, &hello, NOW).unwrap().writes.is_empty());
}

/// DESIGN 12.1 and 9.1: a pause an expiry made (its deadline passed, `on_expiry: pause`) ends
/// with its run as the stop it stood in for: nothing is meant to run past the deadline, and no
/// restart policy brings it back.
#[test]
fn an_expirys_pause_ends_with_its_run_as_a_stop() {
    let mut paused = sandbox(Phase::Paused, Intent::Paused, Run::Started { at: Some(t(200)) });
    paused.expired_at = Some(t(150));
    let next = after(&paused, &runtime(RuntimeSource::PollGet, RuntimeState::Exited(exit(200, 900, 137))));
    assert_eq!((next.phase.kind(), next.intent), (PhaseKind::Stopped, Intent::Stopped));
    let next = after(&paused, &runtime(RuntimeSource::PollGet, RuntimeState::Absent { at: None }));
    assert_eq!((next.phase, next.intent), (error_missing(), Intent::Stopped));
    assert_eq!(next.restarts.next_at, None, "no restart past the deadline");
}

/// The idle clock is held while paused: a pause that ends with its run counts it again from
/// then, so the paused time is never taken for idleness.
#[test]
fn a_pause_that_ends_with_its_run_counts_the_idle_clock_from_then() {
    let mut paused = sandbox(Phase::Paused, Intent::Paused, Run::Started { at: Some(t(200)) });
    paused.spec = std::sync::Arc::new(berth_core::SandboxSpec {
        lifetime: berth_core::lifetime::Lifetime {
            idle_timeout: Some(core::time::Duration::from_secs(30)),
            ..Default::default()
        },
        ..(*paused.spec).clone()
    });
    paused.active_at = Some(t(100));
    let next = after(&paused, &runtime(RuntimeSource::PollGet, RuntimeState::Exited(exit(200, 900, 1))));
    assert_eq!((next.intent, next.active_at), (Intent::Running, Some(NOW)));
}
