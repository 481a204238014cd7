//! DESIGN 10: the providers whose endpoints a run may reach are those attached as its
//! generation was committed, less those detached since.

use std::collections::BTreeMap;

use berth_core::egress::{Policy, run_policy};
use berth_core::{Command, Outcome, Provider};

use crate::world::World;

fn endpoints(rules: &[&str]) -> Policy {
    Policy::parse("endpoints", rules.iter().copied()).unwrap()
}

fn provider(w: &mut World, name: &str, rules: &[&str]) -> Provider {
    let command = Command::CreateProvider {
        name: name.into(),
        kind: "api".into(),
        credentials: BTreeMap::new(),
        endpoints: endpoints(rules),
    };
    match w.request(command, None).unwrap() {
        Outcome::Provider(p) => *p,
        other => panic!("{other:?}"),
    }
}

fn reachable(w: &World, providers: &[&Provider]) -> Vec<String> {
    let records = providers.iter().map(|p| (p.name.clone(), (*p).clone())).collect();
    run_policy(&w.sandbox("box"), &records).allow.iter().map(ToString::to_string).collect()
}

#[test]
fn an_attach_opens_at_the_next_start_and_a_detach_closes_at_once() {
    let mut w = World::default();
    let one = provider(&mut w, "one", &["one.test"]);
    let two = provider(&mut w, "two", &["*.two.test", "10.0.0.0/8"]);
    w.create("box", &["one"]).unwrap();
    let id = w.id("box");
    w.run_all_effects();
    w.connect_live_supervisor(&id).unwrap().unwrap();
    assert_eq!(reachable(&w, &[&one, &two]), ["one.test"], "the create's providers are the first run's");

    w.request(Command::AttachProvider { sandbox: "box".into(), provider: "two".into() }, None).unwrap();
    let s = w.sandbox("box");
    assert!(s.providers.contains("two") && !s.egress_providers.contains("two"));
    assert_eq!(reachable(&w, &[&one, &two]), ["one.test"], "an attach does not widen the running generation");

    w.stop("box").unwrap();
    w.run_all_effects();
    w.start("box").unwrap();
    assert_eq!(
        reachable(&w, &[&one, &two]),
        ["one.test", "*.two.test", "10.0.0.0/8"],
        "the start's generation has what was attached as it was committed"
    );

    w.request(Command::DetachProvider { sandbox: "box".into(), provider: "one".into() }, None).unwrap();
    assert_eq!(reachable(&w, &[&one, &two]), ["*.two.test", "10.0.0.0/8"], "a detach closes at once");
    // Attached again, it waits for the next start once more.
    w.request(Command::AttachProvider { sandbox: "box".into(), provider: "one".into() }, None).unwrap();
    assert_eq!(reachable(&w, &[&one, &two]), ["*.two.test", "10.0.0.0/8"]);
}

#[test]
fn a_spec_policy_holds_for_every_run_and_a_provider_gone_opens_nothing() {
    let mut w = World::default();
    let one = provider(&mut w, "one", &["one.test"]);
    let spec = berth_core::SandboxSpec { egress: endpoints(&["192.0.2.0/24"]), ..crate::world::spec() };
    let command = Command::CreateSandbox {
        id: berth_core::SandboxId::new("sb-box"),
        name: "box".into(),
        spec,
        providers: ["one".to_string()].into(),
        deadline: None,
    };
    w.request(command, None).unwrap();
    assert_eq!(reachable(&w, &[&one]), ["one.test", "192.0.2.0/24"]);
    assert_eq!(reachable(&w, &[]), ["192.0.2.0/24"], "a provider whose record is gone has no endpoints");
}
