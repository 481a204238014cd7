//! DESIGN 9.4: templates, refills and claims. Exact outcomes, the racing interleavings pinned.

use std::collections::{BTreeMap, BTreeSet};

use berth_core::template::{POOL_LABEL, is_member, spent};
use berth_core::{
    Code, Command, Decision, Effect, Error, MainProcess, Observation, Outcome, Phase, Request, SandboxId, Timestamp,
    Write, decide, merge,
};

use crate::world::{Store, spec};

const T0: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);

fn run(store: &mut Store, command: Command) -> Result<Decision, Error> {
    store.execute_once(&Request::new(command, None), T0)
}

fn fill(n: u64) -> Command {
    Command::FillPool { template: "web".into(), id: SandboxId::new(format!("sb-m{n}")), name: format!("web-{n:08x}") }
}

fn claim(labels: &[(&str, &str)], providers: &[&str]) -> Command {
    Command::ClaimSandbox {
        template: "web".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        providers: providers.iter().map(|p| p.to_string()).collect::<BTreeSet<_>>(),
    }
}

/// A store with template "web" (pool of `min_ready`) and provider "p1".
fn with_template(min_ready: u32) -> Store {
    let mut store = Store::default();
    run(&mut store, Command::CreateTemplate { name: "web".into(), spec: spec(), min_ready }).unwrap();
    let credentials = [("P1_KEY".to_string(), berth_core::Secret::new("s"))].into();
    run(
        &mut store,
        Command::CreateProvider { endpoints: Default::default(), name: "p1".into(), kind: "k".into(), credentials },
    )
    .unwrap();
    store
}

/// Makes every member Ready, as their supervisors connecting do.
fn all_ready(store: &mut Store) {
    let members: Vec<_> = store.sandboxes.values().filter(|s| is_member(s, "web")).cloned().collect();
    for s in members {
        let connected = Observation::SupervisorConnected { generation: s.generation, main: MainProcess::Running };
        let d = merge(Some(&s), &s.id, &connected, T0).unwrap();
        store.commit(&d.writes).unwrap();
    }
}

#[test]
fn a_fill_makes_a_member_only_while_the_pool_is_short() {
    let mut store = with_template(2);
    let d = run(&mut store, fill(1)).unwrap();
    let Outcome::Sandbox(member) = &d.outcome else { panic!("{d:?}") };
    assert_eq!(member.spec.labels.get(POOL_LABEL).map(String::as_str), Some("web"));
    assert_eq!(
        (member.template.as_deref(), member.deadline, member.phase.clone()),
        (Some("web"), None, Phase::Provisioning)
    );
    assert_eq!(d.effects, [Effect::Start { sandbox: member.id.clone(), generation: 1 }]);
    assert!(matches!(&d.writes[1], Write::UpdateTemplate { record, expected: 1 } if record.made == 1));
    run(&mut store, fill(2)).unwrap();
    let full = run(&mut store, fill(3)).unwrap();
    assert!(full.writes.is_empty() && full.effects.is_empty(), "a full pool makes nothing: {full:?}");
    assert_eq!(store.sandboxes.len(), 2);
}

/// Two fills decided on one count: the template's version makes the second conflict, and
/// decided again it sees the member the first made.
#[test]
fn two_fills_decided_on_one_count_never_overfill() {
    let mut store = with_template(1);
    let (a, b) = (Request::new(fill(1), None), Request::new(fill(2), None));
    let first = decide(&a, &store.reads(&a), T0).unwrap();
    let second = decide(&b, &store.reads(&b), T0).unwrap();
    store.commit(&first.writes).unwrap();
    assert!(store.commit(&second.writes).is_err(), "the second fill conflicts on the template");
    let again = decide(&b, &store.reads(&b), T0).unwrap();
    assert!(again.writes.is_empty());
    assert_eq!(store.sandboxes.len(), 1);
}

#[test]
fn a_claim_takes_one_ready_member_and_makes_it_the_claimers() {
    let spec_with_ttl = berth_core::SandboxSpec {
        lifetime: berth_core::lifetime::Lifetime {
            ttl: Some(core::time::Duration::from_secs(60)),
            on_expiry: berth_core::lifetime::OnExpiry::Delete,
            idle_timeout: None,
            on_idle: None,
        },
        ..spec()
    };
    let mut store = Store::default();
    run(&mut store, Command::CreateTemplate { name: "web".into(), spec: spec_with_ttl, min_ready: 2 }).unwrap();
    let credentials = [("P1_KEY".to_string(), berth_core::Secret::new("s"))].into();
    run(
        &mut store,
        Command::CreateProvider { endpoints: Default::default(), name: "p1".into(), kind: "k".into(), credentials },
    )
    .unwrap();
    run(&mut store, fill(1)).unwrap();
    run(&mut store, fill(2)).unwrap();
    let e = run(&mut store, claim(&[], &[])).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "no member is Ready yet: {e}");
    all_ready(&mut store);

    let d = run(&mut store, claim(&[("team", "a")], &["p1"])).unwrap();
    let Outcome::Sandbox(claimed) = d.outcome else { panic!() };
    assert_eq!(&*claimed.name, "web-00000001", "the first by name");
    assert!(!is_member(&claimed, "web"));
    assert_eq!(claimed.spec.labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(*claimed.providers, ["p1".to_string()].into());
    assert_eq!(claimed.deadline, Some(T0.plus(core::time::Duration::from_secs(60))), "the TTL runs from the claim");
    assert!(matches!(&d.writes[1], Write::UpdateProvider { .. }), "an attach at claim bumps the provider");
    assert!(d.effects.is_empty(), "a claim starts nothing: the member runs already");

    let second = run(&mut store, claim(&[], &[])).unwrap();
    let Outcome::Sandbox(second) = second.outcome else { panic!() };
    assert_eq!(&*second.name, "web-00000002");
    let e = run(&mut store, claim(&[], &[])).unwrap_err();
    assert_eq!(
        (e.code(), e.to_string().as_str()),
        (
            Code::Unavailable,
            "the pool of template 'web' has no Ready sandbox to claim now; retry shortly (it refills), or ask to wait"
        )
    );
}

/// P1's race, pinned: two claims decided on one read pick the same member; the second's write
/// conflicts, and decided again it takes the other member.
#[test]
fn two_claims_racing_never_get_one_member() {
    let mut store = with_template(2);
    run(&mut store, fill(1)).unwrap();
    run(&mut store, fill(2)).unwrap();
    all_ready(&mut store);
    let request = Request::new(claim(&[], &[]), None);
    let first = decide(&request, &store.reads(&request), T0).unwrap();
    let second = decide(&request, &store.reads(&request), T0).unwrap();
    assert_eq!(first.writes, second.writes, "decided on one read, both pick the first member");
    store.commit(&first.writes).unwrap();
    assert!(store.commit(&second.writes).is_err());
    let again = decide(&request, &store.reads(&request), T0).unwrap();
    let (Outcome::Sandbox(a), Outcome::Sandbox(b)) = (first.outcome, again.outcome) else { panic!() };
    assert_ne!(a.id, b.id);
}

#[test]
fn bad_templates_and_claims_name_their_field() {
    let mut store = with_template(1);
    let cases: Vec<(Command, Code, &str)> = vec![
        (
            Command::CreateTemplate { name: "x".repeat(55), spec: spec(), min_ready: 1 },
            Code::InvalidArgument,
            "invalid name: must be at most 54 characters, so that its pool members' names fit a DNS label",
        ),
        (
            Command::CreateTemplate { name: "big".into(), spec: spec(), min_ready: 101 },
            Code::InvalidArgument,
            "invalid min_ready: must be at most 100 (the gateway's --max-pool)",
        ),
        (
            Command::CreateTemplate { name: "web".into(), spec: spec(), min_ready: 1 },
            Code::AlreadyExists,
            "template 'web' already exists",
        ),
        (Command::SetPool { template: "nope".into(), min_ready: 1 }, Code::NotFound, "template 'nope' not found"),
        (
            Command::ClaimSandbox { template: "nope".into(), labels: BTreeMap::new(), providers: BTreeSet::new() },
            Code::NotFound,
            "template 'nope' not found",
        ),
        (
            claim(&[("berth.pool", "x")], &[]),
            Code::InvalidArgument,
            "invalid labels[berth.pool]: labels starting with berth. are set by Berth",
        ),
        (claim(&[], &["missing"]), Code::FailedPrecondition, "provider 'missing' does not exist (field providers)"),
    ];
    for (command, code, message) in cases {
        let e = run(&mut store, command).unwrap_err();
        assert_eq!((e.code(), e.to_string().as_str()), (code, message));
    }
    let versioned = store.execute_once(&Request::new(claim(&[], &[]), Some(3)), T0).unwrap_err();
    assert_eq!(versioned.code(), Code::InvalidArgument);
    let stale =
        store.execute_once(&Request::new(Command::SetPool { template: "web".into(), min_ready: 3 }, Some(9)), T0);
    assert_eq!(stale.unwrap_err().code(), Code::Aborted);
    let labelled = berth_core::SandboxSpec { labels: [("berth.x".to_string(), "y".to_string())].into(), ..spec() };
    let e = run(&mut store, Command::CreateTemplate { name: "lab".into(), spec: labelled, min_ready: 0 }).unwrap_err();
    assert_eq!(e.to_string(), "invalid spec.labels[berth.x]: labels starting with berth. are set by Berth");
}

/// DESIGN 9.4: pool members count against the same limits as other sandboxes. A template's
/// spec is held to a create's limits, field for field, and every member runs under them.
#[test]
fn pool_members_are_held_to_the_limits_of_any_sandbox() {
    let limited = |memory_bytes| {
        let mut s = spec();
        s.limits.memory_bytes = Some(memory_bytes);
        s
    };
    let mut store = Store::default();
    let small = limited(berth_core::limits::MIN_MEMORY_BYTES - 1);
    let create = Command::CreateSandbox {
        id: SandboxId::new("sb-one"),
        name: "one".into(),
        spec: small.clone(),
        providers: BTreeSet::new(),
        deadline: None,
    };
    let create = run(&mut store, create).unwrap_err();
    let template =
        run(&mut store, Command::CreateTemplate { name: "web".into(), spec: small, min_ready: 1 }).unwrap_err();
    assert_eq!((template.code(), template.to_string()), (create.code(), create.to_string()));
    assert!(create.to_string().contains("spec.limits.memory_bytes"), "{create}");
    assert!(store.sandboxes.is_empty() && store.templates.is_empty());

    let held = limited(64 << 20);
    run(&mut store, Command::CreateTemplate { name: "web".into(), spec: held.clone(), min_ready: 2 }).unwrap();
    run(&mut store, fill(1)).unwrap();
    let member = store.sandboxes.values().find(|s| is_member(s, "web")).unwrap();
    assert_eq!(member.spec.limits, held.limits);
}

#[test]
fn a_member_that_failed_with_no_restart_coming_is_spent() {
    let mut store = with_template(1);
    run(&mut store, fill(1)).unwrap();
    all_ready(&mut store);
    let ready = store.by_name("web-00000001").cloned().unwrap();
    assert!(!spent(&ready));
    let failed = berth_core::Sandbox {
        phase: Phase::Error(berth_core::Failure {
            reason: berth_core::FailureReason::MainProcessExited,
            exit_code: Some(1),
            message: String::new(),
        }),
        ..ready.clone()
    };
    assert!(spent(&failed));
    let mut restarting = failed.clone();
    std::sync::Arc::make_mut(&mut restarting.spec).restart.mode = berth_core::restart::RestartMode::Always;
    restarting.restarts.next_at = Some(T0);
    assert!(!spent(&restarting), "its policy brings it back");
    assert!(!spent(&berth_core::Sandbox { phase: Phase::Deleting, ..failed }), "already going");
}
