//! DESIGN 9.1 and 9.2: deadlines, renews and expiry; restart policies and their backoff; and
//! when each falls due. Exact outcomes for given times.

use core::time::Duration;

use berth_core::lifetime::{Lifetime, OnExpiry, Renewal};
use berth_core::restart::{RestartMode, RestartPolicy, Restarts};
use berth_core::timers::{self, Timer};
use berth_core::{
    Code, Command, Effect, ExitMarker, Failure, FailureReason, Intent, Observation, Outcome, Phase, PhaseKind, Request,
    Run, Sandbox, Timestamp, Write, decide, merge,
};

use crate::world::{Store, create_box, spec};

const T0: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.plus(Duration::from_secs(secs))
}

fn ttl_spec(secs: u64, on_expiry: OnExpiry) -> berth_core::SandboxSpec {
    berth_core::SandboxSpec {
        lifetime: Lifetime { ttl: Some(Duration::from_secs(secs)), idle_timeout: None, on_expiry, on_idle: None },
        ..spec()
    }
}

fn restart_spec(mode: RestartMode, max_restarts: Option<u32>) -> berth_core::SandboxSpec {
    berth_core::SandboxSpec {
        restart: RestartPolicy {
            mode,
            max_restarts,
            backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(10),
        },
        ..spec()
    }
}

/// A store holding one sandbox named "box", created at T0 from `spec` (and `deadline`).
fn created(spec: berth_core::SandboxSpec, deadline: Option<Timestamp>) -> Store {
    Store::with_box(spec, deadline, T0)
}

fn run(store: &mut Store, command: Command, now: Timestamp) -> Result<berth_core::Decision, berth_core::Error> {
    store.execute_once(&Request::new(command, None), now)
}

fn expire(deadline: Timestamp) -> Command {
    Command::ExpireSandbox { name: "box".into(), deadline }
}

fn renew(renewal: Renewal) -> Command {
    Command::RenewSandbox { name: "box".into(), renewal }
}

fn restart() -> Command {
    Command::RestartSandbox { name: "box".into() }
}

fn record(store: &Store) -> Sandbox {
    store.by_name("box").cloned().unwrap()
}

/// Moves the stored sandbox to Ready, as its supervisor connecting does.
fn ready(store: &mut Store) {
    store.box_ready(T0);
}

/// Moves the stored sandbox from Stopping to Stopped, as the driver's stop reply does.
fn stopped(store: &mut Store) {
    let s = record(store);
    assert_eq!(s.phase, Phase::Stopping);
    let next = Sandbox { phase: Phase::Stopped, resource_version: s.resource_version + 1, ..s.clone() };
    store.commit(&[Write::UpdateSandbox { record: next, expected: s.resource_version }]).unwrap();
}

/// Merges the main process's exit with `code` at `now`.
fn main_exits(store: &mut Store, code: i32, now: Timestamp) -> Sandbox {
    let before = record(store);
    let exited =
        Observation::MainProcessExited { generation: before.generation, exit_code: code, out_of_memory: false };
    let d = merge(Some(&before), &before.id, &exited, now).unwrap();
    store.commit(&d.writes).unwrap();
    record(store)
}

#[test]
fn a_ttl_sets_the_deadline_from_the_create_and_an_absolute_one_is_kept() {
    assert_eq!(record(&created(ttl_spec(60, OnExpiry::Stop), None)).deadline, Some(at(60)));
    assert_eq!(record(&created(ttl_spec(60, OnExpiry::Stop), Some(at(5)))).deadline, Some(at(5)));
    assert_eq!(record(&created(spec(), None)).deadline, None);
}

#[test]
fn a_bad_lifetime_or_policy_is_refused_naming_its_field_and_writes_nothing() {
    let cases = [
        (ttl_spec(0, OnExpiry::Stop), None, "invalid spec.lifetime.ttl_ms: must be positive"),
        (
            ttl_spec(31 * 24 * 3600, OnExpiry::Stop),
            None,
            "invalid spec.lifetime.ttl_ms: must be at most 2592000s (the gateway's --max-ttl)",
        ),
        (spec(), Some(T0), "invalid deadline_unix_ms: must be in the future (by the store's clock)"),
        (
            berth_core::SandboxSpec {
                restart: RestartPolicy { backoff: Duration::ZERO, ..RestartPolicy::default() },
                ..spec()
            },
            None,
            "invalid spec.restart.backoff_ms: must be between 100 and 86400000 ms",
        ),
    ];
    for (spec, deadline, message) in cases {
        let e = decide(&Request::new(create_box(spec, deadline), None), &Default::default(), T0).unwrap_err();
        assert_eq!((e.code(), e.to_string().as_str()), (Code::InvalidArgument, message));
    }
}

#[test]
fn an_expiry_stops_or_deletes_once_its_deadline_has_passed_and_not_before() {
    let mut store = created(ttl_spec(60, OnExpiry::Stop), None);
    ready(&mut store);
    let early = run(&mut store, expire(at(60)), at(59)).unwrap();
    assert!(early.writes.is_empty() && early.effects.is_empty(), "not yet due: {early:?}");

    let d = run(&mut store, expire(at(60)), at(61)).unwrap();
    let s = record(&store);
    assert_eq!((s.phase.kind(), s.intent, s.expired_at), (PhaseKind::Stopping, Intent::Stopped, Some(at(61))));
    assert_eq!(d.effects, [Effect::Stop { sandbox: s.id.clone(), generation: 1 }]);
    let again = run(&mut store, expire(at(60)), at(62)).unwrap();
    assert!(again.writes.is_empty(), "an expired deadline expires once");
    assert_eq!(timers::next(&s, T0), None, "nothing more is due");

    let mut store = created(ttl_spec(60, OnExpiry::Delete), None);
    let d = run(&mut store, expire(at(60)), at(60)).unwrap();
    let s = record(&store);
    assert_eq!((s.phase.kind(), s.intent), (PhaseKind::Deleting, Intent::Deleted));
    assert_eq!(d.effects, [Effect::Delete { sandbox: s.id.clone() }]);
}

#[test]
fn an_expiry_of_a_stopped_sandbox_marks_it_and_stops_nothing() {
    let mut store = created(ttl_spec(60, OnExpiry::Stop), None);
    run(&mut store, Command::StopSandbox { name: "box".into() }, at(1)).unwrap();
    stopped(&mut store);
    let d = run(&mut store, expire(at(60)), at(70)).unwrap();
    assert_eq!(d.effects, []);
    assert_eq!(record(&store).expired_at, Some(at(70)));
}

/// T1's race, the interleaving pinned: the holder reads the record and decides the expiry of
/// the old deadline; a renew commits in between; the expiry's write conflicts, and decided again
/// on the fresh record it is a no-op. A renewed sandbox is never reaped by the deadline it
/// replaced.
#[test]
fn a_renew_that_commits_first_leaves_nothing_to_expire() {
    let mut store = created(ttl_spec(60, OnExpiry::Delete), None);
    ready(&mut store);
    let request = Request::new(expire(at(60)), None);
    let stale = decide(&request, &store.reads(&request), at(61)).unwrap();
    // Decided on the old record, the expiry is due, once the store's clock reached its deadline.
    assert_eq!(stale.writes.len(), 2, "{stale:?}");
    assert_eq!(stale.writes[1], Write::NotBefore(at(60)));

    run(&mut store, renew(Renewal::SpecTtl), at(59)).unwrap();
    assert_eq!(record(&store).deadline, Some(at(119)));
    let conflict = store.commit(&stale.writes).unwrap_err();
    assert_eq!((conflict.expected, conflict.current), (Some(2), Some(3)));

    let fresh = decide(&request, &store.reads(&request), at(61)).unwrap();
    assert!(fresh.writes.is_empty() && fresh.effects.is_empty(), "{fresh:?}");
    assert_eq!(record(&store).phase, Phase::Ready);
    assert_eq!(timers::next(&record(&store), at(61)), Some((at(119), Timer::Expire { deadline: at(119) })));
}

#[test]
fn a_renew_sets_the_deadline_and_says_what_is_wrong_when_it_cannot() {
    let mut store = created(ttl_spec(60, OnExpiry::Stop), None);
    run(&mut store, renew(Renewal::SpecTtl), at(30)).unwrap();
    assert_eq!(record(&store).deadline, Some(at(90)));
    run(&mut store, renew(Renewal::Ttl(Duration::from_secs(5))), at(31)).unwrap();
    assert_eq!(record(&store).deadline, Some(at(36)));
    run(&mut store, renew(Renewal::Deadline(at(500))), at(32)).unwrap();
    assert_eq!(record(&store).deadline, Some(at(500)));

    let v = record(&store).resource_version;
    let stale = store.execute_once(&Request::new(renew(Renewal::SpecTtl), Some(v - 1)), at(33)).unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);

    let mut plain = created(spec(), None);
    let e = run(&mut plain, renew(Renewal::SpecTtl), at(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid ttl_ms: sandbox 'box' has no TTL in its spec: give a ttl_ms or a deadline_unix_ms"
    );
    run(&mut plain, Command::DeleteSandbox { name: "box".into() }, at(2)).unwrap();
    let e = run(&mut plain, renew(Renewal::Ttl(Duration::from_secs(5))), at(3)).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
}

#[test]
fn a_start_renews_a_ttl_and_refuses_a_passed_absolute_deadline() {
    let mut store = created(ttl_spec(60, OnExpiry::Stop), None);
    run(&mut store, expire(at(60)), at(60)).unwrap();
    stopped(&mut store);
    run(&mut store, Command::StartSandbox { name: "box".into() }, at(100)).unwrap();
    let s = record(&store);
    assert_eq!((s.deadline, s.expired_at, s.generation), (Some(at(160)), None, 2));

    let mut store = created(spec(), Some(at(10)));
    run(&mut store, Command::StopSandbox { name: "box".into() }, at(1)).unwrap();
    stopped(&mut store);
    let e = run(&mut store, Command::StartSandbox { name: "box".into() }, at(11)).unwrap_err();
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (Code::FailedPrecondition, "sandbox 'box' is past its deadline: renew it before starting it")
    );
    run(&mut store, renew(Renewal::Ttl(Duration::from_secs(30))), at(12)).unwrap();
    run(&mut store, Command::StartSandbox { name: "box".into() }, at(13)).unwrap();
    assert_eq!(record(&store).phase, Phase::Starting);
}

#[test]
fn a_failure_schedules_the_restart_its_policy_asks_for_with_a_doubling_backoff() {
    let mut store = created(restart_spec(RestartMode::OnFailure, Some(2)), None);
    ready(&mut store);
    let s = main_exits(&mut store, 3, at(10));
    assert_eq!(s.restarts, Restarts { count: 0, next_at: Some(at(12)) });
    assert_eq!(timers::next(&s, at(10)), Some((at(12), Timer::Restart)));

    let early = run(&mut store, restart(), at(11)).unwrap();
    assert!(early.writes.is_empty(), "not yet due");
    let d = run(&mut store, restart(), at(12)).unwrap();
    let s = record(&store);
    assert_eq!(
        (s.phase.kind(), s.generation, s.restarts),
        (PhaseKind::Starting, 2, Restarts { count: 1, next_at: None })
    );
    assert_eq!(s.run, Run::Pending);
    assert!(!s.exit_fence.settled, "a restart's fence is a Start's");
    assert_eq!(d.effects, [Effect::Start { sandbox: s.id.clone(), generation: 2 }]);

    ready(&mut store);
    assert_eq!(main_exits(&mut store, 3, at(20)).restarts.next_at, Some(at(24)), "twice the wait");
    run(&mut store, restart(), at(24)).unwrap();
    ready(&mut store);
    let s = main_exits(&mut store, 3, at(30));
    assert_eq!(
        (s.phase.kind(), s.restarts),
        (PhaseKind::Error, Restarts { count: 2, next_at: None }),
        "the maximum reached: it stays in Error with the count"
    );
    assert_eq!(timers::next(&s, T0), None);

    // A user's start resets the count.
    run(&mut store, Command::StartSandbox { name: "box".into() }, at(40)).unwrap();
    assert_eq!(record(&store).restarts, Restarts::default());
}

#[test]
fn which_ends_restart_depends_on_the_mode() {
    for (mode, code, restarts) in [
        (RestartMode::Never, 1, false),
        (RestartMode::OnFailure, 1, true),
        (RestartMode::OnFailure, 0, false),
        (RestartMode::Always, 0, true),
        (RestartMode::Always, 137, true),
    ] {
        let mut store = created(restart_spec(mode, None), None);
        ready(&mut store);
        let s = main_exits(&mut store, code, at(10));
        assert_eq!(s.restarts.next_at.is_some(), restarts, "{mode:?} after exit {code}");
    }
    // A lost compute resource is a failure too.
    let mut store = created(restart_spec(RestartMode::OnFailure, None), None);
    ready(&mut store);
    let before = record(&store);
    let gone = Observation::Runtime {
        source: berth_core::RuntimeSource::PollGet,
        state: berth_core::RuntimeState::Absent { at: None },
        as_of_version: None,
    };
    let d = merge(Some(&before), &before.id, &gone, at(5)).unwrap();
    assert_eq!(d.outcome, Outcome::Written);
    let Some(after) = d.sandbox() else { panic!("{d:?}") };
    assert!(matches!(after.phase, Phase::Error(Failure { reason: FailureReason::ComputeResourceMissing, .. })));
    assert_eq!(after.restarts.next_at, Some(at(7)));
}

#[test]
fn a_users_stop_cancels_a_scheduled_restart_and_an_expiry_comes_before_it() {
    let mut store = created(restart_spec(RestartMode::Always, None), None);
    ready(&mut store);
    main_exits(&mut store, 1, at(10));
    run(&mut store, Command::StopSandbox { name: "box".into() }, at(11)).unwrap();
    let s = record(&store);
    assert_eq!(s.restarts.next_at, None);
    assert!(run(&mut store, restart(), at(20)).unwrap().writes.is_empty());

    let spec = berth_core::SandboxSpec {
        lifetime: Lifetime { ttl: Some(Duration::from_secs(11)), ..Lifetime::default() },
        ..restart_spec(RestartMode::Always, None)
    };
    let mut store = created(spec, None);
    ready(&mut store);
    let s = main_exits(&mut store, 1, at(10));
    assert_eq!(timers::next(&s, at(10)), Some((at(11), Timer::Expire { deadline: at(11) })), "the expiry is due first");
    assert!(run(&mut store, restart(), at(12)).unwrap().writes.is_empty(), "no restart past the deadline");
    run(&mut store, expire(at(11)), at(12)).unwrap();
    let s = record(&store);
    assert_eq!((s.intent, s.restarts.next_at, timers::next(&s, T0)), (Intent::Stopped, None, None));
}

#[test]
fn an_exit_marker_of_the_run_is_the_next_generations_fence() {
    let mut store = created(restart_spec(RestartMode::Always, None), None);
    ready(&mut store);
    let before = record(&store);
    let exit = ExitMarker { started_at: Timestamp(10), finished_at: Timestamp(20), exit_code: 0, out_of_memory: false };
    let seen = Observation::Runtime {
        source: berth_core::RuntimeSource::WatchEvent,
        state: berth_core::RuntimeState::Exited(exit),
        as_of_version: None,
    };
    let d = merge(Some(&before), &before.id, &seen, at(3)).unwrap();
    store.commit(&d.writes).unwrap();
    assert!(record(&store).completed());
    run(&mut store, restart(), at(5)).unwrap();
    assert_eq!(record(&store).exit_fence.marker, Some(exit));
}

/// A restart due before the deadline comes first; once the deadline has passed too (a holder
/// that was away), the expiry does, and the restart is never taken.
#[test]
fn a_restart_before_the_deadline_comes_first_until_the_deadline_passes() {
    let spec = berth_core::SandboxSpec {
        lifetime: Lifetime { ttl: Some(Duration::from_secs(20)), ..Lifetime::default() },
        ..restart_spec(RestartMode::Always, None)
    };
    let mut store = created(spec, None);
    ready(&mut store);
    let s = main_exits(&mut store, 1, at(10));
    assert_eq!(timers::next(&s, at(10)), Some((at(12), Timer::Restart)));
    assert_eq!(timers::next(&s, at(21)), Some((at(20), Timer::Expire { deadline: at(20) })));
    assert!(run(&mut store, restart(), at(21)).unwrap().writes.is_empty());
}
