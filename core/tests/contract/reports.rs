//! The three motivating reports (DESIGN section 1), each as a deterministic event sequence.

use berth_core::identity::{IdentityKey, RuntimeIdentity, derive_token, verify_token};
use berth_core::{
    Code, Command, Effect, Error, ExitMarker, Failure, FailureReason, MainProcess, Observation, Outcome, Phase,
    PhaseKind, Request, Run, RuntimeSource, RuntimeState, StartReply, Timestamp, recovery,
};

use crate::world::{SOURCES, World};

/// A sandbox brought to Ready through the runtime and its supervisor.
fn ready(w: &mut World, name: &str, providers: &[&str]) {
    w.create(name, providers).unwrap();
    w.run_all_effects();
    let id = w.id(name);
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(w.sandbox(name).phase, Phase::Ready);
}

fn runtime(source: RuntimeSource, state: RuntimeState) -> Observation {
    Observation::Runtime { source, state, as_of_version: None }
}

/// R3: a polled snapshot still showing the previous run's exit lands inside a multi-step start.
#[test]
fn r3_a_snapshot_of_the_previous_exit_during_start_keeps_starting() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");

    // Stop: the runtime's exit with finish time F.
    w.stop("box").unwrap();
    w.run_all_effects();
    let stopped = w.sandbox("box");
    assert_eq!(stopped.phase, Phase::Stopped);
    let Run::Ended(f) = stopped.run else { panic!("{:?}", stopped.run) };

    // Start: generation 2 is committed with the fence F; the runtime has not started it yet.
    w.start("box").unwrap();
    assert_eq!(w.sandbox("box").exit_fence.marker, Some(f));
    let pending = w.effects.pop_front().unwrap();

    // Reconcile polls (and every other path) land inside the start and still show exit F.
    for source in SOURCES {
        w.observe(&id, runtime(source, RuntimeState::Exited(f))).unwrap();
        assert_eq!(w.sandbox("box").phase, Phase::Starting, "{source:?}");
    }
    w.poll(&id, RuntimeState::Exited(f)).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Starting);

    // The start completes; the supervisor of generation 2 connects: Ready, wait-for-ready succeeds.
    let (_, reply) = w.perform(&pending);
    w.observe(&id, reply).unwrap();
    // The previous exit, polled once more after the start: still stale.
    w.poll(&id, RuntimeState::Exited(f)).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Starting);
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Ready);

    // A new exit F' > F of the restarted workload is reported.
    let f2 = w.exit_workload(&id, 3).unwrap();
    assert!(f2.finished_at > f.finished_at);
    w.poll(&id, RuntimeState::Exited(f2)).unwrap();
    assert_eq!(
        w.sandbox("box").phase,
        Phase::Error(Failure {
            reason: FailureReason::ContainerExited,
            exit_code: Some(3),
            message: "the sandbox exited with code 3".into()
        })
    );
}

/// R3, event path: the previous run's exit event is delivered after the restart.
#[test]
fn r3_a_delayed_exit_event_applied_after_the_restart_is_stale() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");
    w.stop("box").unwrap();
    // The stop's exit event is held back; the driver's stop reply completes the stop.
    w.run_all_effects();
    let Run::Ended(f) = w.sandbox("box").run else { panic!() };
    w.start("box").unwrap();
    w.run_all_effects();
    w.connect_live_supervisor(&id).unwrap().unwrap();
    w.observe(&id, runtime(RuntimeSource::WatchEvent, RuntimeState::Exited(f))).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Ready);
}

/// R1: the start's driver call is retried after a lost reply and reuses the committed generation.
#[test]
fn r1_a_retried_start_reuses_the_committed_generation() {
    let key = IdentityKey::from_bytes([9; 32]);
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");
    w.stop("box").unwrap();
    w.run_all_effects();

    let started = w.start("box").unwrap();
    let Outcome::Sandbox(s) = started else { panic!() };
    assert_eq!(s.generation, 2);
    // The identity rotation is part of the Starting write itself.
    assert_eq!((s.phase.kind(), s.generation, s.exit_fence.marker.is_some()), (PhaseKind::Starting, 2, true));

    // The driver starts the run but its reply is lost (a timeout): nothing is merged.
    let effect = w.effects.pop_front().unwrap();
    assert_eq!(effect, Effect::Start { sandbox: id.clone(), generation: 2 });
    let _lost = w.perform(&effect);

    // Recovery (a sweep, or a restarted gateway) re-drives it with the same generation.
    let redrive = recovery::unfinished(&w.sandbox("box")).unwrap();
    assert_eq!(redrive, effect);
    let (_, reply) = w.perform(&redrive);
    assert!(matches!(reply, Observation::Started { generation: 2, reply: StartReply::Running { .. } }));
    w.observe(&id, reply).unwrap();
    assert_eq!(w.containers[&id].runs.iter().filter(|r| r.generation == 2).count(), 1, "one run per generation");

    // Only generation 2's token authenticates; generation 1's is stale.
    let token = |generation| derive_token(&key, &RuntimeIdentity { sandbox: id.clone(), generation });
    for (generation, accepted) in [(1, false), (2, true)] {
        let identity = verify_token(&key, token(generation).expose()).unwrap();
        let result = w.observe(
            &id,
            Observation::SupervisorConnected { generation: identity.generation, main: MainProcess::Running },
        );
        assert_eq!(result.is_ok(), accepted, "generation {generation}");
        if let Err(e) = result {
            assert_eq!(e.code(), Code::PermissionDenied);
        }
    }
    assert_eq!(w.sandbox("box").phase, Phase::Ready);
    assert_eq!(w.sandbox("box").generation, 2);
}

/// R1: two starts racing from Stopped never produce two valid generations.
#[test]
fn r1_two_racing_starts_commit_one_generation() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    w.stop("box").unwrap();
    w.run_all_effects();

    // Client B's start commits between client A's read and write.
    let b = Request::new(Command::StartSandbox { name: "box".into() }, None);
    let stopped = w.sandbox("box");
    let a_decision = berth_core::decide(&b, &w.store.reads(&b), w.now).unwrap();
    let b_decision = w.store.execute_once(&b, w.now).unwrap();
    assert_eq!(b_decision.effects, vec![Effect::Start { sandbox: stopped.id.clone(), generation: 2 }]);
    // A's write conflicts; re-decided on the fresh record, its start is a no-op.
    assert!(w.store.commit(&a_decision.writes).is_err());
    let a_again = w.start("box").unwrap();
    assert!(matches!(a_again, Outcome::Sandbox(ref s) if s.generation == 2));
    assert!(w.effects.is_empty(), "the no-op start has no effect");
    assert_eq!(w.sandbox("box").generation, 2);
    assert_eq!(w.sandbox("box").resource_version, stopped.resource_version + 1);
}

/// R1: server-owned operations survive concurrent writers bumping the version.
#[test]
fn r1_server_owned_attach_and_start_retry_through_conflicts() {
    let mut w = World::default();
    w.create_provider("p1", "P1_TOKEN").unwrap();
    ready(&mut w, "box", &[]);
    w.stop("box").unwrap();
    w.run_all_effects();
    for _ in 0..5 {
        w.interference.push("box".into());
    }
    // Every one of the bumps lands before the next write; each attempt re-decides.
    let attach = w.request(Command::AttachProvider { sandbox: "box".into(), provider: "p1".into() }, None).unwrap();
    assert!(matches!(attach, Outcome::Sandbox(ref s) if s.providers.contains("p1")));
    w.interference.push("box".into());
    let start = w.start("box").unwrap();
    assert!(matches!(start, Outcome::Sandbox(ref s) if s.phase == Phase::Starting && s.generation == 2));
    // A client-supplied version loses instead.
    let version = w.sandbox("box").resource_version;
    w.interference.push("box".into());
    let err = w.request(Command::DetachProvider { sandbox: "box".into(), provider: "p1".into() }, Some(version));
    assert_eq!(err.unwrap_err().code(), Code::Aborted);
    assert!(w.sandbox("box").providers.contains("p1"));
}

/// R2: a delete whose first write conflicts reaches Deleting, and the provider can go at once.
#[test]
fn r2_delete_survives_a_conflict_and_releases_its_provider() {
    let mut w = World::default();
    w.create_provider("p1", "P1_TOKEN").unwrap();
    ready(&mut w, "box", &["p1"]);
    w.interference.push("box".into());
    let deleted = w.delete("box").unwrap();
    assert!(matches!(deleted, Outcome::Sandbox(ref s) if s.phase == Phase::Deleting));

    // The sandbox is still Deleting (its runtime delete has not run): the provider goes anyway.
    let gone = w.request(Command::DeleteProvider { name: "p1".into() }, None).unwrap();
    assert_eq!(gone, Outcome::Removed);
    assert!(w.store.providers.is_empty());

    // The gateway "crashes" before running the delete; recovery finishes it.
    w.effects.clear();
    let redrive = recovery::unfinished(&w.sandbox("box")).unwrap();
    let (id, reply) = w.perform(&redrive);
    w.observe(&id, reply).unwrap();
    assert!(w.store.sandboxes.is_empty());
    assert!(w.containers.is_empty(), "no runtime container left behind");
    // A repeated delete of a gone sandbox is NOT_FOUND, not an error of another kind.
    assert_eq!(w.delete("box").unwrap_err().code(), Code::NotFound);
}

/// R2: an attach and a provider delete racing: no sandbox ends up attached to a deleted provider.
#[test]
fn r2_attach_racing_provider_delete_never_leaves_a_dangling_reference() {
    for attach_first in [true, false] {
        let mut w = World::default();
        w.create_provider("p1", "P1_TOKEN").unwrap();
        ready(&mut w, "box", &[]);
        let attach = Request::new(Command::AttachProvider { sandbox: "box".into(), provider: "p1".into() }, None);
        let remove = Request::new(Command::DeleteProvider { name: "p1".into() }, None);
        let (first, second) = if attach_first { (&attach, &remove) } else { (&remove, &attach) };
        // Both read before either writes.
        let second_decision = berth_core::decide(second, &w.store.reads(second), w.now).unwrap();
        w.store.execute_once(first, w.now).unwrap();
        assert!(w.store.commit(&second_decision.writes).is_err(), "the second transaction must conflict");
        // Re-decided, the second is refused for the right reason.
        let again = berth_core::decide(second, &w.store.reads(second), w.now).unwrap_err();
        assert_eq!(again.code(), Code::FailedPrecondition);
        let attached = w.sandbox("box").providers.contains("p1");
        assert_eq!(attached, w.store.providers.contains_key("p1"), "attached iff the provider exists");
    }
}

/// R2, the other half: Deleting is never stuck, whatever the runtime does meanwhile.
#[test]
fn r2_deleting_completes_even_when_the_resource_vanished_first() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");
    w.delete("box").unwrap();
    w.effects.clear();
    w.containers.remove(&id); // removed out of band before the gateway's delete ran
    let d = w.poll(&id, RuntimeState::Absent { at: None }).unwrap();
    assert_eq!(d.effects, vec![Effect::Delete { sandbox: id.clone() }], "absence re-drives the delete");
    w.run_all_effects();
    assert!(w.store.sandboxes.is_empty());
    // And a late exit report of the deleted sandbox's supervisor is harmless.
    let late =
        w.observe(&id, Observation::MainProcessExited { generation: 1, exit_code: 0, out_of_memory: false }).unwrap();
    assert!(late.writes.is_empty() && late.effects.is_empty());
}

#[test]
fn a_start_out_of_error_while_the_failed_run_is_alive_waits_for_the_driver() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");
    // The supervisor reports its main process exited; the container has not stopped yet.
    w.observe(&id, Observation::MainProcessExited { generation: 1, exit_code: 2, out_of_memory: false }).unwrap();
    assert_eq!(w.sandbox("box").phase.kind(), PhaseKind::Error);
    let old = *w.containers[&id].alive().unwrap();
    w.start("box").unwrap();
    assert!(!w.sandbox("box").exit_fence.settled);
    // A poll inside the start sees the old run still running, then exiting: neither is this
    // generation's.
    w.poll(&id, RuntimeState::Running { started_at: old.started_at, held: None }).unwrap();
    let old_exit = ExitMarker {
        started_at: old.started_at,
        finished_at: Timestamp::from_unix_nanos(i64::MAX / 2),
        exit_code: 2,
        out_of_memory: false,
    };
    w.poll(&id, RuntimeState::Exited(old_exit)).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Starting);
    assert_eq!(w.sandbox("box").run, Run::Pending);
    w.run_all_effects();
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Ready);
    let err: Result<_, Error> =
        w.observe(&id, Observation::SupervisorConnected { generation: 1, main: MainProcess::Running });
    assert_eq!(err.unwrap_err().code(), Code::PermissionDenied);
}

/// Found by the property test: a start of generation 1 still in flight when generation 2 was
/// decided must not pass for generation 2's run, nor its exit for generation 2's exit.
#[test]
fn a_start_of_the_previous_generation_still_in_flight_cannot_pass_for_the_new_one() {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    let slow_create = w.effects.pop_front().unwrap();
    w.stop("box").unwrap();
    w.run_all_effects(); // the stop overtakes the slow create: nothing ran yet
    assert_eq!(w.sandbox("box").phase, Phase::Stopped);
    w.start("box").unwrap();
    assert!(!w.sandbox("box").exit_fence.settled, "generation 1 never ran: its start may still land");
    let id = w.id("box");
    // The slow create lands now and its run exits at once.
    let (_, reply) = w.perform(&slow_create);
    w.observe(&id, reply).unwrap();
    let old = w.exit_workload(&id, 3).unwrap();
    w.poll(&id, RuntimeState::Exited(old)).unwrap();
    w.poll(&id, RuntimeState::Running { started_at: old.started_at, held: None }).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Starting);
    w.run_all_effects();
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Ready);
    assert_eq!(w.containers[&id].alive().unwrap().generation, 2);
}

/// Found by the property test: the previous generation's start, still in flight, lands after
/// the new generation's run was removed out of band. Runs are told apart by start time, so the
/// driver must never start that older generation (it keeps its record of the newest generation
/// outside the compute resource): the sandbox sees the loss, and a new Start brings it back.
#[test]
fn a_start_of_the_previous_generation_landing_after_an_out_of_band_removal_is_refused() {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    let slow_create = w.effects.pop_front().unwrap();
    w.stop("box").unwrap();
    w.run_all_effects();
    w.start("box").unwrap();
    w.run_all_effects();
    let id = w.id("box");
    let Run::Started { at: Some(started) } = w.sandbox("box").run else { panic!("{:?}", w.sandbox("box").run) };
    w.containers.remove(&id); // out of band, before anything saw generation 2's run

    let (_, reply) = w.perform(&slow_create);
    let Observation::Started { generation: 1, reply: StartReply::Failed { message } } = &reply else {
        panic!("generation 1 must not run after generation 2 did: {reply:?}")
    };
    assert_eq!(message, "generation 1 is superseded by 2");
    assert!(!w.containers.contains_key(&id), "a refused start makes nothing");
    w.observe(&id, reply).unwrap();
    assert_eq!(w.sandbox("box").run, Run::Started { at: Some(started) });

    w.poll(&id, w.snapshot(&id)).unwrap();
    let lost = w.sandbox("box");
    assert_eq!(lost.phase.kind(), PhaseKind::Error, "{lost:?}");
    assert_eq!(lost.generation, 2);
    // Generation 2 had its run: re-driving it makes no second one.
    let (_, again) = w.perform(&Effect::Start { sandbox: id.clone(), generation: 2 });
    assert!(matches!(again, Observation::Started { reply: StartReply::Gone, .. }), "{again:?}");
    w.start("box").unwrap();
    w.run_all_effects();
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Ready);
    assert_eq!(w.containers[&id].alive().unwrap().generation, 3);
}

/// Found by the property test: a stop that finds nothing created yet is a stop, not a loss.
#[test]
fn absence_before_the_generation_ever_ran_is_not_an_error() {
    let mut w = World::default();
    w.create("box", &[]).unwrap();
    w.effects.clear(); // the create is still in flight
    w.stop("box").unwrap();
    let id = w.id("box");
    w.observe(
        &id,
        runtime(RuntimeSource::WatchEvent, RuntimeState::Absent { at: Some(Timestamp::from_unix_nanos(5)) }),
    )
    .unwrap();
    w.poll(&id, RuntimeState::Absent { at: None }).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Stopping);
    w.run_all_effects();
    assert_eq!(w.sandbox("box").phase, Phase::Stopped);
}

/// Defect 3 of issue 13: after `docker restart` (the run Berth started ends, another starts at
/// once outside Berth) the sandbox is in Error, and every Start after that went Starting ->
/// Error 143 again: the new generation's fence came from the recorded exit, and the driver's
/// stop of the out-of-band run, to make room, looked like the new generation's exit. The same
/// with the restart's exit never seen (`podman restart` went unnoticed).
#[test]
fn a_start_after_an_out_of_band_restart_reaches_ready() {
    for exit_seen in [true, false] {
        let mut w = World::default();
        ready(&mut w, "box", &[]);
        let id = w.id("box");
        let first = w.containers[&id].alive().unwrap().started_at;
        let t = |n: i64| Timestamp::from_unix_nanos(first.unix_nanos() + n);
        if exit_seen {
            let restarted = ExitMarker { started_at: first, finished_at: t(10), exit_code: 143, out_of_memory: false };
            w.poll(&id, RuntimeState::Exited(restarted)).unwrap();
        }
        w.poll(&id, RuntimeState::Running { started_at: t(20), held: None }).unwrap();
        let failed = w.sandbox("box");
        assert_eq!(failed.phase.kind(), PhaseKind::Error, "exit seen: {exit_seen}");
        w.start("box").unwrap();
        // The driver stops the out-of-band run to make room; a poll sees its exit before the
        // start's reply does.
        let alien = ExitMarker { started_at: t(20), finished_at: t(30), exit_code: 143, out_of_memory: false };
        w.poll(&id, RuntimeState::Exited(alien)).unwrap();
        assert_eq!(w.sandbox("box").phase, Phase::Starting, "exit seen: {exit_seen}");
        let reply = StartReply::Running { started_at: t(40) };
        w.observe(&id, Observation::Started { generation: 2, reply }).unwrap();
        w.poll(&id, RuntimeState::Exited(alien)).unwrap();
        w.observe(&id, Observation::SupervisorConnected { generation: 2, main: MainProcess::Running }).unwrap();
        assert_eq!(w.sandbox("box").phase, Phase::Ready, "exit seen: {exit_seen}");
    }
}

/// Found by the simulator once it restarted containers out of band: a restart lands just after
/// a stop was seen to end the run, so the sandbox is Stopped, but a run with the old
/// generation's token starts after the recorded exit. A Start then must not take that run, or
/// its exit when its stale supervisor is rejected, for the new generation's: only what carries
/// the generation (the driver's start reply, the new supervisor) tells the runs apart.
#[test]
fn a_run_restarted_out_of_band_after_a_stop_is_not_the_next_generations() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");
    w.stop("box").unwrap();
    w.run_all_effects();
    assert_eq!(w.sandbox("box").phase.kind(), PhaseKind::Stopped);
    let stopped = w.sandbox("box").last_exit.unwrap().finished_at;
    let t = |n: i64| Timestamp::from_unix_nanos(stopped.unix_nanos() + n);
    w.start("box").unwrap();
    w.poll(&id, RuntimeState::Running { started_at: t(10), held: None }).unwrap();
    assert_eq!(w.sandbox("box").run, Run::Pending, "a run nothing ties to generation 2 was taken for its");
    let rejected = ExitMarker { started_at: t(10), finished_at: t(20), exit_code: 1, out_of_memory: false };
    w.poll(&id, RuntimeState::Exited(rejected)).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Starting);
    let reply = StartReply::Running { started_at: t(30) };
    w.observe(&id, Observation::Started { generation: 2, reply }).unwrap();
    w.observe(&id, Observation::SupervisorConnected { generation: 2, main: MainProcess::Running }).unwrap();
    assert_eq!(w.sandbox("box").phase, Phase::Ready);
}

/// Found by the simulator with three gateways: a gateway whose store connection hung merged its
/// stop reply of generation 1 ("nothing there") fifteen seconds late, into a record that had
/// since been started again at generation 2, and took it for that run's container gone.
#[test]
fn a_late_stop_reply_of_an_older_generation_says_nothing_of_the_current_run() {
    let mut w = World::default();
    ready(&mut w, "box", &[]);
    let id = w.id("box");
    w.stop("box").unwrap();
    w.run_all_effects();
    w.start("box").unwrap();
    w.run_all_effects();
    assert!(w.connect_live_supervisor(&id).is_some(), "generation 2 runs");
    let before = w.sandbox("box");
    assert_eq!((before.phase.kind(), before.generation), (PhaseKind::Ready, 2));
    let late = Observation::Stopped { generation: 1, state: RuntimeState::Absent { at: None } };
    let decision = w.observe(&id, late).unwrap();
    assert!(decision.writes.is_empty(), "{:?}", decision.writes);
    assert_eq!(w.sandbox("box"), before);
}
