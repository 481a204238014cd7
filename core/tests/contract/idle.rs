//! DESIGN 9.1's idle timeout: the activity that restarts the idle clock, the execs that hold
//! an expiry off while they are open, and the expiry itself. Exact outcomes for given times,
//! and the activity-versus-expiry interleavings pinned.

use core::time::Duration;

use berth_core::exec::{self, ExecEnd, ExecId, ExecSpec, Report};
use berth_core::lifetime::{Lifetime, OnExpiry};
use berth_core::timers::{self, Timer};
use berth_core::{
    Command, Decision, Effect, Error, Intent, MainProcess, Observation, Outcome, Phase, PhaseKind, Request, Sandbox,
    SandboxId, SandboxSpec, Timestamp, Write, decide, merge,
};

use crate::world::{Store, create_box, spec};

const T0: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.plus(Duration::from_secs(secs))
}

fn idle_spec(secs: u64, on_expiry: OnExpiry) -> SandboxSpec {
    SandboxSpec {
        lifetime: Lifetime { idle_timeout: Some(Duration::from_secs(secs)), ttl: None, on_expiry, on_idle: None },
        ..spec()
    }
}

fn run(store: &mut Store, command: Command, now: Timestamp) -> Result<Decision, Error> {
    store.execute_once(&Request::new(command, None), now)
}

fn record(store: &Store) -> Sandbox {
    store.by_name("box").cloned().unwrap()
}

/// A store holding sandbox "box", created at T0 from `spec` and Ready.
fn ready(spec: SandboxSpec) -> Store {
    let mut store = Store::with_box(spec, None, T0);
    store.box_ready(T0);
    store
}

fn expire_idle(since: Timestamp) -> Command {
    Command::ExpireIdle { name: "box".into(), since }
}

fn exec_spec() -> ExecSpec {
    ExecSpec { argv: vec!["sleep".into(), "100".into()], ..Default::default() }
}

/// Admits exec `id` at `now` and commits it.
fn admit(store: &mut Store, id: &str, now: Timestamp) -> exec::Exec {
    let sandbox = record(store);
    let id = ExecId::parse("exec_id", id).unwrap();
    let admission = exec::admit("box", &id, &exec_spec(), Some(&sandbox), None, now).unwrap();
    store.commit(&admission.writes).unwrap();
    admission.exec().expect("an admission answers its exec").clone()
}

/// Its run reports `exec` ended at `now`; commits what that writes.
fn end(store: &mut Store, exec: &exec::Exec, now: Timestamp) -> Vec<Write> {
    let sandbox = record(store);
    let report =
        Report::Ended { end: ExecEnd::Exited(0), message: String::new(), output_bytes: 0, out_of_memory: false };
    let change = exec::report(exec, Some(&sandbox), exec.generation, &report, now);
    store.commit(&change.writes).unwrap();
    change.writes
}

#[test]
fn the_idle_clock_starts_at_the_create_and_expires_a_sandbox_left_alone() {
    let mut store = ready(idle_spec(30, OnExpiry::Stop));
    let s = record(&store);
    assert_eq!(s.active_at, Some(T0));
    assert_eq!(timers::next(&s, T0), Some((at(30), Timer::Idle { since: T0 })));
    assert!(run(&mut store, expire_idle(T0), at(29)).unwrap().writes.is_empty(), "not yet");
    let d = run(&mut store, expire_idle(T0), at(30)).unwrap();
    assert_eq!(d.effects, [Effect::Stop { sandbox: s.id.clone(), generation: 1 }]);
    let s = record(&store);
    assert_eq!(
        (s.intent, s.phase.kind(), s.idle_expired_at, s.expired_at),
        (Intent::Stopped, PhaseKind::Stopping, Some(at(30)), None)
    );
    assert_eq!(timers::next(&s, at(30)), None, "a stopped sandbox has no idle clock");

    let mut store = ready(idle_spec(30, OnExpiry::Delete));
    run(&mut store, expire_idle(T0), at(31)).unwrap();
    assert_eq!((record(&store).intent, record(&store).phase), (Intent::Deleted, Phase::Deleting));
}

#[test]
fn a_sandbox_without_an_idle_timeout_keeps_no_clock_and_its_execs_write_nothing_of_it() {
    let mut store = ready(spec());
    assert_eq!(record(&store).active_at, None);
    assert!(run(&mut store, expire_idle(T0), at(1_000)).unwrap().writes.is_empty());
    let e = admit(&mut store, "e1", at(1));
    assert_eq!(record(&store).resource_version, 2, "the admission only checked the version");
    assert_eq!(end(&mut store, &e, at(2)).len(), 1, "the end writes only the exec");
    let touch = Command::TouchSandbox { name: "box".into(), id: SandboxId::new("sb-1") };
    assert!(run(&mut store, touch, at(3)).unwrap().writes.is_empty());
}

#[test]
fn an_exec_is_activity_from_its_admission_to_its_end() {
    let mut store = ready(idle_spec(30, OnExpiry::Stop));
    let e = admit(&mut store, "e1", at(10));
    let s = record(&store);
    assert_eq!((s.active_at, s.resource_version), (Some(at(10)), 3), "the admission wrote the clock");
    // The exec runs past the timeout: open, it holds the expiry off, and the timer that fires
    // decides nothing (the exec's end, which touches the record, reschedules it).
    assert_eq!(timers::next(&s, at(40)), Some((at(40), Timer::Idle { since: at(10) })));
    assert!(run(&mut store, expire_idle(at(10)), at(100)).unwrap().writes.is_empty());
    let writes = end(&mut store, &e, at(100));
    assert_eq!(writes.len(), 2, "the exec's end and the sandbox's clock, in one transaction");
    let s = record(&store);
    assert_eq!(s.active_at, Some(at(100)));
    assert!(run(&mut store, expire_idle(at(10)), at(131)).unwrap().writes.is_empty(), "a stale since is a no-op");
    assert!(run(&mut store, expire_idle(at(100)), at(129)).unwrap().writes.is_empty());
    run(&mut store, expire_idle(at(100)), at(130)).unwrap();
    assert_eq!(record(&store).idle_expired_at, Some(at(130)));
}

/// The idle expiry's read saw no open exec; an admission committed before its write. The
/// expiry's write conflicts, and decided again it is a no-op: the admission moved the clock.
#[test]
fn an_exec_admitted_between_the_expirys_read_and_its_write_wins() {
    let mut store = ready(idle_spec(30, OnExpiry::Stop));
    let request = Request::new(expire_idle(T0), None);
    let decision = decide(&request, &store.reads(&request), at(30)).unwrap();
    assert_eq!(decision.effects.len(), 1, "the expiry was decided");
    admit(&mut store, "e1", at(30));
    let conflict = store.commit(&decision.writes).unwrap_err();
    assert_eq!((conflict.expected, conflict.current), (Some(2), Some(3)));
    let again = decide(&request, &store.reads(&request), at(30)).unwrap();
    assert!(again.writes.is_empty());
    assert_eq!(record(&store).intent, Intent::Running);
}

/// The other order: the expiry commits first, and the admission, decided on the record before
/// it, conflicts; decided again it is refused, the sandbox being stopped.
#[test]
fn an_expiry_committed_between_an_admissions_read_and_its_write_wins() {
    let mut store = ready(idle_spec(30, OnExpiry::Stop));
    let id = ExecId::parse("exec_id", "e1").unwrap();
    let admission = exec::admit("box", &id, &exec_spec(), Some(&record(&store)), None, at(30)).unwrap();
    run(&mut store, expire_idle(T0), at(30)).unwrap();
    assert!(store.commit(&admission.writes).is_err());
    let err = exec::admit("box", &id, &exec_spec(), Some(&record(&store)), None, at(30)).unwrap_err();
    assert_eq!(err.to_string(), "cannot exec in sandbox 'box' while it is Stopping");
    assert!(store.execs.is_empty());
}

#[test]
fn a_stream_touches_the_clock_of_its_own_sandbox_only() {
    let mut store = ready(idle_spec(30, OnExpiry::Stop));
    let touch = |id: &str| Command::TouchSandbox { name: "box".into(), id: SandboxId::new(id) };
    let d = run(&mut store, touch("sb-1"), at(20)).unwrap();
    assert_eq!(d.writes.len(), 1);
    assert_eq!(record(&store).active_at, Some(at(20)));
    assert!(run(&mut store, touch("sb-1"), at(20)).unwrap().writes.is_empty(), "nothing new to write");
    assert!(run(&mut store, touch("sb-other"), at(25)).unwrap().writes.is_empty(), "another sandbox of that name");
    assert_eq!(timers::next(&record(&store), at(25)), Some((at(50), Timer::Idle { since: at(20) })));
}

#[test]
fn a_start_restarts_the_clock_and_the_earlier_expiry_is_next() {
    let mut store = ready(idle_spec(30, OnExpiry::Stop));
    run(&mut store, expire_idle(T0), at(30)).unwrap();
    let s = record(&store);
    let stopped = Sandbox { phase: Phase::Stopped, resource_version: s.resource_version + 1, ..s.clone() };
    store.commit(&[Write::UpdateSandbox { record: stopped, expected: s.resource_version }]).unwrap();
    run(&mut store, Command::StartSandbox { name: "box".into() }, at(40)).unwrap();
    let s = record(&store);
    assert_eq!((s.active_at, s.idle_expired_at), (Some(at(40)), None));

    // A deadline before the idle timeout is next; once it has been renewed past, the idle one.
    let mut lifetime = idle_spec(30, OnExpiry::Stop).lifetime;
    lifetime.ttl = Some(Duration::from_secs(20));
    let store = ready(SandboxSpec { lifetime, ..spec() });
    let mut s = record(&store);
    assert_eq!(timers::next(&s, T0), Some((at(20), Timer::Expire { deadline: at(20) })));
    s.deadline = Some(at(60));
    assert_eq!(timers::next(&s, T0), Some((at(30), Timer::Idle { since: T0 })));
}

#[test]
fn a_pool_member_ages_only_from_its_claim() {
    let mut store = Store::default();
    let template = Command::CreateTemplate { name: "web".into(), spec: idle_spec(30, OnExpiry::Delete), min_ready: 1 };
    run(&mut store, template, T0).unwrap();
    let fill = Command::FillPool { template: "web".into(), id: SandboxId::new("sb-m1"), name: "web-1".into() };
    let Outcome::Sandbox(member) = run(&mut store, fill, T0).unwrap().outcome else { panic!("a member") };
    assert_eq!((member.active_at, timers::next(&member, at(100))), (None, None));
    let connected = Observation::SupervisorConnected { generation: 1, main: MainProcess::Running };
    store.commit(&merge(Some(&member), &member.id, &connected, T0).unwrap().writes).unwrap();
    let claim =
        Command::ClaimSandbox { template: "web".into(), labels: Default::default(), providers: Default::default() };
    let Outcome::Sandbox(claimed) = run(&mut store, claim, at(100)).unwrap().outcome else { panic!("claimed") };
    assert_eq!(timers::next(&claimed, at(100)), Some((at(130), Timer::Idle { since: at(100) })));
}

#[test]
fn an_idle_timeout_out_of_bounds_is_refused_naming_its_field() {
    let cases = [
        (Duration::ZERO, "invalid spec.lifetime.idle_timeout_ms: must be positive"),
        (Duration::from_millis(999), "invalid spec.lifetime.idle_timeout_ms: must be at least 1000 ms"),
        (
            Duration::from_secs(31 * 24 * 3600),
            "invalid spec.lifetime.idle_timeout_ms: must be at most 2592000s (the gateway's --max-ttl)",
        ),
    ];
    for (idle, message) in cases {
        let lifetime = Lifetime { idle_timeout: Some(idle), ..Lifetime::default() };
        let spec = SandboxSpec { lifetime, ..spec() };
        let mut store = Store::default();
        assert_eq!(run(&mut store, create_box(spec.clone(), None), T0).unwrap_err().to_string(), message);
        let template = Command::CreateTemplate { name: "web".into(), spec, min_ready: 0 };
        assert_eq!(run(&mut store, template, T0).unwrap_err().to_string(), message);
        assert!(store.sandboxes.is_empty() && store.templates.is_empty(), "nothing written");
    }
}

/// The run of "box" (started at T0) seen frozen (or thawed), as the driver's reply to a pause
/// (a resume) shows it.
fn freezer_seen(store: &mut Store, frozen: bool, now: Timestamp) {
    let s = record(store);
    let seen = berth_core::RuntimeState::Running { started_at: T0, held: frozen.then_some(berth_core::Hold::Freezer) };
    let source = if frozen { berth_core::RuntimeSource::PauseReply } else { berth_core::RuntimeSource::ResumeReply };
    let d = merge(Some(&s), &s.id, &Observation::Runtime { source, state: seen, as_of_version: None }, now).unwrap();
    store.commit(&d.writes).unwrap();
}

/// DESIGN 12.1: `on_idle: pause` pauses instead of stopping; while paused the idle clock is
/// held (no timer, no expiry however long), no exec is admitted; a resume counts from itself.
#[test]
fn an_idle_pause_holds_the_clock_until_the_resume_counts_it_again() {
    let spec = SandboxSpec {
        lifetime: Lifetime { on_idle: Some(OnExpiry::Pause), ..idle_spec(30, OnExpiry::Delete).lifetime },
        ..spec()
    };
    let mut store = ready(spec);
    let id = record(&store).id.clone();
    let d = run(&mut store, expire_idle(T0), at(30)).unwrap();
    assert_eq!(
        d.effects,
        [Effect::Pause { sandbox: id.clone(), generation: 1, hold: berth_core::Hold::Freezer }],
        "the idle timeout pauses"
    );
    let s = record(&store);
    assert_eq!((s.intent, s.phase.kind(), s.idle_expired_at), (Intent::Paused, PhaseKind::Ready, Some(at(30))));
    freezer_seen(&mut store, true, at(31));
    let s = record(&store);
    assert_eq!(s.phase.kind(), PhaseKind::Paused);
    assert_eq!(timers::next(&s, at(31)), None, "no idle timer while paused");
    assert!(run(&mut store, expire_idle(T0), at(3_000)).unwrap().writes.is_empty(), "the clock is held");
    let refused =
        exec::admit("box", &ExecId::parse("exec_id", "e1").unwrap(), &exec_spec(), Some(&s), None, at(40)).unwrap_err();
    assert_eq!(refused.code(), berth_core::Code::FailedPrecondition);
    assert!(refused.to_string().contains("while it is Paused"), "{refused}");

    let d = run(&mut store, Command::ResumeSandbox { name: "box".into() }, at(100)).unwrap();
    assert_eq!(d.effects, [Effect::Resume { sandbox: id, generation: 1 }]);
    let s = record(&store);
    assert_eq!((s.intent, s.active_at, s.idle_expired_at, s.generation), (Intent::Running, Some(at(100)), None, 1));
    freezer_seen(&mut store, false, at(101));
    let s = record(&store);
    assert_eq!(s.phase.kind(), PhaseKind::Ready);
    assert_eq!(timers::next(&s, at(101)), Some((at(130), Timer::Idle { since: at(100) })), "counted from the resume");
}

/// DESIGN 12.1: an exec is refused from the moment a pause is committed, before the runtime has
/// frozen anything (the phase is still Ready): it would be handed to a run frozen under it.
#[test]
fn an_exec_is_refused_as_soon_as_a_pause_is_committed() {
    let mut store = ready(spec());
    run(&mut store, Command::PauseSandbox { name: "box".into(), hold: berth_core::Hold::Freezer }, at(1)).unwrap();
    let s = record(&store);
    assert_eq!((s.intent, s.phase.kind()), (Intent::Paused, PhaseKind::Ready));
    let refused =
        exec::admit("box", &ExecId::parse("exec_id", "e1").unwrap(), &exec_spec(), Some(&s), None, at(2)).unwrap_err();
    assert!(refused.to_string().contains("while it is Paused"), "{refused}");
}
