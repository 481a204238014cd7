//! DESIGN 14: where a command that makes a run places it, committed in the write that makes
//! it, and what a fence of its node does to it. Exact outcomes for given nodes.

use std::collections::BTreeMap;

use berth_core::placement::{Capacity, Node};
use berth_core::restart::{RestartMode, RestartPolicy, Restarts};
use berth_core::{
    Code, Command, Error, Failure, FailureReason, Intent, NodeId, Observation, Phase, PhaseKind, Placement, Reads,
    Request, Run, Sandbox, SandboxId, SandboxSpec, Timestamp, Write, decide, merge,
};

use crate::world::spec;

const NOW: Timestamp = Timestamp::from_unix_millis(1_800_000_000_000);

fn node(id: &str, epoch: u64, placed: u64) -> Node {
    Node {
        id: NodeId::new(id),
        epoch,
        live: true,
        draining: false,
        labels: BTreeMap::new(),
        capacity: Capacity { cpu_millis: 0, memory_bytes: 0, sandboxes: 10 },
        placed: Capacity { sandboxes: placed, ..Capacity::default() },
    }
}

fn lapsed(mut n: Node) -> Node {
    n.live = false;
    n
}

fn at(node: &str, epoch: u64) -> Option<Placement> {
    Some(Placement { node: NodeId::new(node), epoch })
}

fn create(spec: SandboxSpec, nodes: Vec<Node>) -> Result<berth_core::Decision, Error> {
    let command = Command::CreateSandbox {
        id: SandboxId::new("sb-1"),
        name: "box".into(),
        spec,
        providers: [].into(),
        deadline: None,
    };
    decide(&Request::new(command, None), &Reads { nodes, ..Reads::default() }, NOW)
}

fn made(decision: &berth_core::Decision) -> &Sandbox {
    match &decision.writes[0] {
        Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => s,
        other => panic!("{other:?}"),
    }
}

/// A sandbox of generation 2 placed on `node` under `epoch`, ended as `phase` says.
fn placed(node: &str, epoch: u64, phase: Phase, intent: Intent) -> Sandbox {
    Sandbox {
        phase,
        intent,
        generation: 2,
        run: Run::Pending,
        placement: at(node, epoch),
        ..Sandbox::new(SandboxId::new("sb-1"), "box", spec(), Timestamp::from_unix_millis(1))
    }
}

fn on(sandbox: Sandbox, command: Command, nodes: Vec<Node>) -> Result<berth_core::Decision, Error> {
    decide(&Request::new(command, None), &Reads { sandbox: Some(sandbox), nodes, ..Reads::default() }, NOW)
}

fn start() -> Command {
    Command::StartSandbox { name: "box".into() }
}

#[test]
fn a_create_is_placed_under_the_chosen_nodes_epoch_in_the_write_that_makes_it() {
    let decision = create(spec(), vec![node("a", 3, 1), node("b", 5, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("b", 5));
    assert_eq!(decision.writes.len(), 1);
    // A selector narrows the nodes to those with its labels, however full.
    let mut east = node("a", 3, 6);
    east.labels.insert("zone".into(), "east".into());
    let selective = SandboxSpec { node_selector: [("zone".to_string(), "east".to_string())].into(), ..spec() };
    let decision = create(selective, vec![east, node("b", 5, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("a", 3));
}

#[test]
fn a_create_no_node_takes_writes_nothing_and_says_each_nodes_reason_in_its_class() {
    let refused = |nodes: Vec<Node>, spec: SandboxSpec| create(spec, nodes).expect_err("no node takes it");
    let none = refused(vec![], spec());
    assert_eq!(none.to_string(), "cannot place sandbox 'box': no node is registered");
    assert_eq!(none.code(), Code::Unavailable);
    // Fenced only: a gateway taking the lease over, a node restarting; waiting helps.
    let fenced = refused(vec![lapsed(node("a", 3, 0))], spec());
    assert_eq!(fenced.to_string(), "cannot place sandbox 'box': no node can run it: a: its lease has lapsed");
    assert_eq!(fenced.code(), Code::Unavailable);
    let full = refused(vec![lapsed(node("a", 3, 0)), node("b", 1, 10)], spec());
    assert_eq!(full.code(), Code::ResourceExhausted);
    assert!(full.to_string().ends_with("b: sandboxes: 0 free, 1 asked"), "{full}");
    let mut draining = node("a", 3, 0);
    draining.draining = true;
    assert_eq!(refused(vec![draining], spec()).code(), Code::FailedPrecondition);
    let selective = SandboxSpec { node_selector: [("gpu".to_string(), "yes".to_string())].into(), ..spec() };
    let unselected = refused(vec![node("a", 3, 0)], selective);
    assert_eq!(unselected.to_string(), "cannot place sandbox 'box': no node can run it: a: it has no label gpu=yes");
    assert_eq!(unselected.code(), Code::FailedPrecondition);
}

#[test]
fn a_node_selector_is_held_to_the_rules_of_labels_and_names_its_field() {
    let bad = SandboxSpec { node_selector: [("Bad Key".to_string(), "x".to_string())].into(), ..spec() };
    match create(bad, vec![node("a", 1, 0)]) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field, "spec.node_selector"),
        other => panic!("{other:?}"),
    }
    let bad = SandboxSpec { node_selector: [("zone".to_string(), "a b".to_string())].into(), ..spec() };
    match create(bad, vec![node("a", 1, 0)]) {
        Err(Error::Invalid { field, .. }) => assert_eq!(field, "spec.node_selector[zone]"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_start_stays_on_its_node_under_that_nodes_current_epoch_and_moves_only_when_it_cannot() {
    let stopped = || placed("a", 2, Phase::Stopped, Intent::Stopped);
    // a holds more than b, but the workspace is on a: the new generation stays there.
    let decision = on(stopped(), start(), vec![node("a", 4, 5), node("b", 1, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("a", 4));
    assert_eq!(made(&decision).generation, 3);
    // Its node fenced, draining or full: placed as a new sandbox is.
    let decision = on(stopped(), start(), vec![lapsed(node("a", 4, 0)), node("b", 1, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("b", 1));
    let mut draining = node("a", 4, 0);
    draining.draining = true;
    let decision = on(stopped(), start(), vec![draining, node("b", 1, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("b", 1));
    let decision = on(stopped(), start(), vec![node("a", 4, 10), node("b", 1, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("b", 1));
    // Nowhere to go: refused, nothing written, the record still where it was.
    let refused = on(stopped(), start(), vec![lapsed(node("a", 4, 0))]).unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
}

#[test]
fn a_restart_on_a_full_node_it_already_counts_on_stays_and_off_a_lapsed_one_moves_once_fenced() {
    let failed =
        Phase::Error(Failure { reason: FailureReason::ContainerExited, exit_code: Some(1), message: "x".into() });
    let crashed = || Sandbox {
        spec: SandboxSpec {
            restart: RestartPolicy { mode: RestartMode::Always, ..RestartPolicy::default() },
            ..spec()
        }
        .into(),
        restarts: Restarts { count: 0, next_at: Some(NOW) },
        ..placed("a", 2, failed.clone(), Intent::Running)
    };
    let restart = || Command::RestartSandbox { name: "box".into() };
    // a is full, but its count includes this sandbox (its intent is still Running).
    let decision = on(crashed(), restart(), vec![node("a", 2, 10), node("b", 1, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("a", 2));
    // a's lease lapsed: the crashed run's supervisor may still be alive there, so the restart
    // waits (it stays due, and the lease holder tries again) for a to come back or be fenced.
    let held = on(crashed(), restart(), vec![lapsed(node("a", 2, 10)), node("b", 1, 0)]).unwrap_err();
    assert_eq!(held.code(), Code::Unavailable);
    assert!(held.to_string().contains("may still be alive there"), "{held}");
    // Fenced, its run taken for lost: it moves.
    let lost = Failure { reason: FailureReason::ComputeResourceMissing, exit_code: None, message: "fenced".into() };
    let fenced = || Sandbox { phase: Phase::Error(lost.clone()), ..crashed() };
    let decision = on(fenced(), restart(), vec![lapsed(node("a", 2, 10)), node("b", 1, 0)]).unwrap();
    assert_eq!(made(&decision).placement, at("b", 1));
    // None live: the restart waits.
    assert_eq!(on(fenced(), restart(), vec![lapsed(node("a", 2, 10))]).unwrap_err().code(), Code::Unavailable);
}

#[test]
fn what_a_node_holds_counts_every_placed_sandbox_but_a_stopped_one() {
    let sandboxes = [
        placed("a", 1, Phase::Ready, Intent::Running),
        placed("a", 1, Phase::Stopped, Intent::Stopped),
        placed("a", 1, Phase::Paused, Intent::Paused),
        placed("b", 1, Phase::Deleting, Intent::Deleted),
        Sandbox { placement: None, ..placed("a", 1, Phase::Ready, Intent::Running) },
    ];
    let loads = berth_core::placement::loads(&sandboxes);
    let count = |n: &str| loads.get(&NodeId::new(n)).map(|c| c.sandboxes);
    assert_eq!((count("a"), count("b"), count("c")), (Some(2), Some(1), None));
}

/// A fence of node `node` up to `epoch`, merged into `sandbox` as it stands.
fn fence(sandbox: &Sandbox, node: &str, epoch: u64) -> berth_core::Decision {
    let fenced = Observation::NodeFenced { node: NodeId::new(node), epoch };
    merge(Some(sandbox), &sandbox.id, &fenced, NOW).unwrap()
}

#[test]
fn a_fenced_nodes_runs_are_lost_even_failed_ones_its_stops_done_and_its_deletes_ended() {
    let running = Sandbox {
        run: Run::Started { at: Some(Timestamp::from_unix_millis(5)) },
        ..placed("a", 3, Phase::Ready, Intent::Running)
    };
    // Placed there under the fenced epoch or an earlier one: the run is lost, and the failure
    // says where it went; nothing is sent to the node.
    for epoch in [3, 4] {
        let decision = fence(&running, "a", epoch);
        let after = made(&decision);
        assert_eq!(after.phase.kind(), PhaseKind::Error, "{decision:?}");
        let Phase::Error(Failure { reason, message, .. }) = &after.phase else { unreachable!() };
        assert_eq!(*reason, FailureReason::ComputeResourceMissing);
        assert_eq!(message, &format!("node a's lease lapsed (epoch {epoch}): the run placed there is lost"));
        assert_eq!((after.generation, after.intent), (2, Intent::Running), "the restart policy decides what next");
        assert!(decision.effects.is_empty(), "{decision:?}");
    }
    // A start not yet confirmed is lost too: the node may have made the run before it was cut off.
    let starting = placed("a", 3, Phase::Starting, Intent::Running);
    assert_eq!(made(&fence(&starting, "a", 3)).phase.kind(), PhaseKind::Error);
    // Another node's fence, or an epoch before the one the sandbox is placed under, says nothing of it.
    for (node, epoch) in [("b", 9), ("a", 2)] {
        let decision = fence(&running, node, epoch);
        assert!(decision.writes.is_empty() && decision.effects.is_empty(), "{decision:?}");
    }
    // A stop under way is done; a sandbox that runs nothing is left as it is.
    let stopping = placed("a", 3, Phase::Stopping, Intent::Stopped);
    assert_eq!(made(&fence(&stopping, "a", 3)).phase, Phase::Stopped);
    let stopped = placed("a", 3, Phase::Stopped, Intent::Stopped);
    assert!(fence(&stopped, "a", 3).writes.is_empty());
    // A failed run's supervisor may have outlived it on the node: the fence takes that for lost
    // too (so the sandbox may move), keeping what it had failed of; one already lost is left.
    let crashed = Failure { reason: FailureReason::ContainerExited, exit_code: Some(1), message: "exit 1".into() };
    let failed = placed("a", 3, Phase::Error(crashed), Intent::Running);
    let Phase::Error(Failure { reason, message, .. }) = made(&fence(&failed, "a", 3)).phase.clone() else {
        panic!("still failed")
    };
    assert_eq!(reason, FailureReason::ComputeResourceMissing);
    assert_eq!(
        message,
        "node a's lease lapsed (epoch 3): the run placed there is lost (it had failed: ContainerExited: exit 1)"
    );
    let lost = Failure { reason: FailureReason::ComputeResourceMissing, exit_code: None, message: "gone".into() };
    assert!(fence(&placed("a", 3, Phase::Error(lost), Intent::Running), "a", 3).writes.is_empty());
    // A delete under way ends: the record goes, the node removes what it holds if it comes back.
    let deleting = placed("a", 3, Phase::Deleting, Intent::Stopped);
    let decision = fence(&deleting, "a", 3);
    assert!(matches!(decision.writes[..], [Write::RemoveSandbox { .. }]), "{decision:?}");
    assert!(decision.effects.is_empty(), "{decision:?}");
}

#[test]
fn a_node_holding_a_run_adopts_it_when_it_is_placed_nowhere_or_on_it_under_an_earlier_epoch() {
    let held = |sandbox: &Sandbox, node: &str, epoch: u64| {
        let observation = Observation::Held { node: NodeId::new(node), epoch };
        merge(Some(sandbox), &sandbox.id, &observation, NOW).unwrap()
    };
    let running = Sandbox {
        run: Run::Started { at: Some(Timestamp::from_unix_millis(5)) },
        ..placed("a", 3, Phase::Ready, Intent::Running)
    };
    // Placed on it under an earlier epoch (it was granted its lease again): the epoch moves up,
    // nothing else changes and nothing is sent.
    let decision = held(&running, "a", 4);
    let after = made(&decision);
    assert_eq!(after.placement, at("a", 4));
    assert_eq!((after.phase.clone(), after.generation, after.run), (Phase::Ready, 2, running.run));
    assert!(decision.effects.is_empty());
    // Recorded before placement was: the node holding its run takes it.
    let legacy = Sandbox { placement: None, ..running.clone() };
    assert_eq!(made(&held(&legacy, "b", 9)).placement, at("b", 9));
    // As it is, another node's, or an epoch this node was not granted: nothing written.
    for (node, epoch) in [("a", 3), ("b", 9), ("a", 2)] {
        assert!(held(&running, node, epoch).writes.is_empty(), "{node} {epoch}");
    }
    // A sandbox being deleted is left to its delete.
    let deleting = placed("a", 3, Phase::Deleting, Intent::Stopped);
    assert!(held(&deleting, "a", 4).writes.is_empty());
}
