//! Each command's plan, exactly: what the executor reads, which records its writers hold, and
//! what logs call it. A plan that reads less than its rule decides on, or holds less than it
//! writes, compiles; these pin it.

use std::collections::{BTreeMap, BTreeSet};

use berth_core::lifetime::Renewal;
use berth_core::plan::{Lock, Named, Plan, ProviderReads};
use berth_core::{Command, Kind, Sandbox, SandboxId, SandboxSpec, Timestamp};

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn sandbox(name: &str) -> Lock {
    Lock::Sandbox(name.into())
}

fn provider(name: &str) -> Lock {
    Lock::Provider(name.into())
}

fn template(name: &str) -> Lock {
    Lock::Template(name.into())
}

/// A plan's reads and locks as one comparable row.
#[derive(Debug, PartialEq, Eq)]
struct Row<'a> {
    name: &'static str,
    sandbox: Option<&'a str>,
    template: Option<&'a str>,
    /// Providers read for a sandbox attached to `p1`.
    providers: BTreeSet<String>,
    users_of: Option<&'a str>,
    members: bool,
    open_execs: bool,
    /// Whether it reads the nodes to place a run.
    places: bool,
    locks: Vec<Lock>,
    subject: (Kind, &'a str),
}

fn row<'a>(plan: &Plan<'a>) -> Row<'a> {
    let attached = Sandbox {
        providers: std::sync::Arc::new(names(&["p1"])),
        ..Sandbox::new(SandboxId::new("sb-1"), "box", SandboxSpec::default(), Timestamp(0))
    };
    Row {
        name: plan.name,
        sandbox: plan.sandbox.map(|s| s.name),
        template: plan.template.map(|t| t.name),
        providers: plan.providers_to_read(Some(&attached)),
        users_of: plan.users_of,
        members: plan.members,
        places: plan.places,
        open_execs: plan.open_execs,
        locks: plan.locks().into_iter().collect(),
        subject: plan.subject(),
    }
}

#[test]
fn every_command_reads_and_holds_exactly_what_its_rule_needs() {
    let spec = SandboxSpec::default();
    let id = SandboxId::new("sb-9");
    let two = names(&["p2", "p3"]);
    let sandbox_only = |name, subject| Row {
        name,
        sandbox: Some("box"),
        template: None,
        providers: BTreeSet::new(),
        users_of: None,
        members: false,
        open_execs: false,
        places: false,
        locks: vec![sandbox("box")],
        subject: (Kind::Sandbox, subject),
    };
    let cases: Vec<(Command, Row<'static>)> = vec![
        (
            Command::CreateSandbox {
                id: id.clone(),
                name: "box".into(),
                spec: spec.clone(),
                providers: two.clone(),
                deadline: None,
            },
            Row {
                providers: two.clone(),
                locks: vec![sandbox("box"), provider("p2"), provider("p3")],
                places: true,
                ..sandbox_only("CreateSandbox", "box")
            },
        ),
        (Command::StopSandbox { name: "box".into() }, sandbox_only("StopSandbox", "box")),
        (Command::StartSandbox { name: "box".into() }, Row { places: true, ..sandbox_only("StartSandbox", "box") }),
        (Command::DeleteSandbox { name: "box".into() }, sandbox_only("DeleteSandbox", "box")),
        (Command::RenewSandbox { name: "box".into(), renewal: Renewal::SpecTtl }, sandbox_only("RenewSandbox", "box")),
        (Command::ExpireSandbox { name: "box".into(), deadline: Timestamp(5) }, sandbox_only("ExpireSandbox", "box")),
        (
            Command::ExpireIdle { name: "box".into(), since: Timestamp(5) },
            Row { open_execs: true, ..sandbox_only("ExpireIdle", "box") },
        ),
        (Command::TouchSandbox { name: "box".into(), id: id.clone() }, sandbox_only("TouchSandbox", "box")),
        (Command::RestartSandbox { name: "box".into() }, Row { places: true, ..sandbox_only("RestartSandbox", "box") }),
        (
            // The sandbox's providers are read with the new one; only the new one is held.
            Command::AttachProvider { sandbox: "box".into(), provider: "p2".into() },
            Row {
                providers: names(&["p1", "p2"]),
                locks: vec![sandbox("box"), provider("p2")],
                ..sandbox_only("AttachProvider", "box")
            },
        ),
        (
            // A provider deleted already can still be detached: none is read or held.
            Command::DetachProvider { sandbox: "box".into(), provider: "p2".into() },
            sandbox_only("DetachProvider", "box"),
        ),
        (
            Command::CreateProvider {
                name: "p2".into(),
                kind: "llm".into(),
                credentials: BTreeMap::new(),
                endpoints: Default::default(),
            },
            Row {
                sandbox: None,
                providers: names(&["p2"]),
                locks: vec![provider("p2")],
                subject: (Kind::Provider, "p2"),
                ..sandbox_only("CreateProvider", "")
            },
        ),
        (
            Command::DeleteProvider { name: "p2".into() },
            Row {
                sandbox: None,
                providers: names(&["p2"]),
                users_of: Some("p2"),
                locks: vec![provider("p2")],
                subject: (Kind::Provider, "p2"),
                ..sandbox_only("DeleteProvider", "")
            },
        ),
        (
            Command::CreateTemplate { name: "t".into(), spec: spec.clone(), min_ready: 2 },
            Row {
                sandbox: None,
                template: Some("t"),
                locks: vec![template("t")],
                subject: (Kind::Template, "t"),
                ..sandbox_only("CreateTemplate", "")
            },
        ),
        (
            Command::SetPool { template: "t".into(), min_ready: 2 },
            Row {
                sandbox: None,
                template: Some("t"),
                locks: vec![template("t")],
                subject: (Kind::Template, "t"),
                ..sandbox_only("SetPool", "")
            },
        ),
        (
            Command::DeleteTemplate { name: "t".into() },
            Row {
                sandbox: None,
                template: Some("t"),
                locks: vec![template("t")],
                subject: (Kind::Template, "t"),
                ..sandbox_only("DeleteTemplate", "")
            },
        ),
        (
            // The member it makes is held under its new name, and nothing is read by it.
            Command::FillPool { template: "t".into(), id: id.clone(), name: "t-1".into() },
            Row {
                sandbox: None,
                template: Some("t"),
                members: true,
                places: true,
                locks: vec![sandbox("t-1"), template("t")],
                ..sandbox_only("FillPool", "")
            },
        ),
        (
            Command::ClaimSandbox { template: "t".into(), labels: BTreeMap::new(), providers: two.clone() },
            Row {
                sandbox: None,
                template: Some("t"),
                providers: two.clone(),
                members: true,
                locks: vec![provider("p2"), provider("p3"), template("t")],
                ..sandbox_only("ClaimSandbox", "")
            },
        ),
    ];
    for (command, expected) in cases {
        assert_eq!(row(&command.plan()), expected, "{command:?}");
    }
}

#[test]
fn every_name_a_command_carries_is_checked_before_anything_is_decided() {
    let attach = Command::AttachProvider { sandbox: "box".into(), provider: "p".into() };
    let plan = attach.plan();
    assert_eq!(plan.sandbox, Some(Named { field: "sandbox", name: "box" }));
    assert_eq!(plan.providers, ProviderReads::AttachedAnd(Named { field: "provider", name: "p" }));
    let detach = Command::DetachProvider { sandbox: "box".into(), provider: "p".into() };
    assert_eq!(detach.plan().checks, Some(Named { field: "provider", name: "p" }));
    // Each malformed name is INVALID_ARGUMENT naming its own field, whatever the reads.
    let reads = berth_core::Reads::default();
    let cases = [
        (Command::DetachProvider { sandbox: "box".into(), provider: "Bad_Name".into() }, "provider"),
        (Command::AttachProvider { sandbox: "Bad_Name".into(), provider: "p".into() }, "sandbox"),
        (Command::StopSandbox { name: "-x".into() }, "name"),
        (Command::FillPool { template: "t".into(), id: SandboxId::new("sb"), name: "a b".into() }, "name"),
        (Command::SetPool { template: "T!".into(), min_ready: 1 }, "template"),
        (Command::DeleteProvider { name: "".into() }, "name"),
    ];
    for (command, field) in cases {
        let err = berth_core::decide(&berth_core::Request::new(command.clone(), None), &reads, Timestamp(0))
            .expect_err("a malformed name");
        match err {
            berth_core::Error::Invalid { field: f, .. } => assert_eq!(f, field, "{command:?}"),
            other => panic!("{command:?}: {other}"),
        }
    }
}
