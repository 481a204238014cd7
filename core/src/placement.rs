//! Placement (DESIGN 14): which node runs a sandbox's next run.
//!
//! A pure decision over what the store says of the nodes at one moment: each node's lease
//! (held or lapsed, on the database's clock, which the caller has read), whether it drains, its
//! labels, its capacity and what the sandboxes already placed on it reserve. The caller commits
//! the answer, (node, epoch), in the sandbox's conditional write, so two gateways deciding at
//! once cannot both place it: one write wins, the other decides again over what it reads next.
//!
//! Spread by default: of the nodes that can take the sandbox, the one whose fullest resource
//! would be least full after it, then the one with fewest sandboxes, then the one the sandbox's
//! own id ranks first ([`rank`]: rendezvous hashing), so that sandboxes placed at once from one
//! view of the loads (creates racing, each unaware of the others) spread over the tied nodes
//! rather than all taking one. Only integers are compared (fractions by cross-multiplication),
//! so every gateway and every simulated run picks the same node from the same inputs.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Code, Error};
use crate::id::{NodeId, SandboxId};
use crate::limits::ResourceLimits;
pub use crate::record::Placement;
use crate::record::{Intent, Sandbox};

/// What a node offers, or what is reserved of it. A CPU or memory capacity of 0 means the node
/// does not count that resource: sandboxes are placed there without reserving it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub sandboxes: u64,
}

impl Capacity {
    /// What a sandbox with `limits` reserves: its limits (none where it sets none) and one slot.
    pub fn of(limits: &ResourceLimits) -> Self {
        Self {
            cpu_millis: limits.cpu_millis.unwrap_or(0),
            memory_bytes: limits.memory_bytes.unwrap_or(0),
            sandboxes: 1,
        }
    }

    fn plus(self, other: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
            sandboxes: self.sandboxes.saturating_add(other.sandboxes),
        }
    }
}

/// A node as the store shows it when the decision is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: NodeId,
    /// The epoch of its current lease: every effect sent to it carries this one.
    pub epoch: u64,
    /// Whether its lease is held now by the store's clock. A lapsed node is fenced: nothing new
    /// goes there, whatever its other columns say.
    pub live: bool,
    /// `node drain`: it keeps what runs on it and takes nothing new.
    pub draining: bool,
    pub labels: BTreeMap<String, String>,
    pub capacity: Capacity,
    /// What the sandboxes placed on it reserve, Stopped ones aside.
    pub placed: Capacity,
}

/// Why a node cannot take a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfit {
    Lapsed,
    /// Lapsed, and the sandbox placed there may still have something of its run alive on it
    /// ([`crate::fencing::may_linger`]): its next generation waits for the node to come back
    /// or to be fenced.
    Lingering,
    Draining,
    /// The selector's `label` (key and value) is not one of the node's labels.
    Selector {
        key: String,
        value: String,
    },
    /// `resource` has `free` left and the sandbox asks for `wanted`.
    Full {
        resource: &'static str,
        free: u64,
        wanted: u64,
    },
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::Lapsed => f.write_str("its lease has lapsed"),
            Unfit::Lingering => f.write_str(
                "its lease has lapsed and the sandbox's last run may still be alive there: \
                 it is placed again once the node is back or fenced",
            ),
            Unfit::Draining => f.write_str("it is draining"),
            Unfit::Selector { key, value } => write!(f, "it has no label {key}={value}"),
            Unfit::Full { resource, free, wanted } => write!(f, "{resource}: {free} free, {wanted} asked"),
        }
    }
}

/// No node can take the sandbox: each node's reason, in id order (none when there is no node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaced(pub Vec<(NodeId, Unfit)>);

impl Unplaced {
    /// Whether waiting may help by itself: no node is registered, or every one is fenced until
    /// its lease is granted again (a gateway taking over a data directory's node, a node
    /// restarting).
    pub fn transient(&self) -> bool {
        self.0.iter().all(|(_, why)| matches!(why, Unfit::Lapsed | Unfit::Lingering))
    }

    /// Its status class: unavailable while it is [`Unplaced::transient`]; a lack of room is a
    /// quota of the nodes'; a selector or a drain holds until an operator acts.
    pub fn code(&self) -> Code {
        if self.transient() {
            Code::Unavailable
        } else if self.0.iter().any(|(_, why)| matches!(why, Unfit::Full { .. })) {
            Code::ResourceExhausted
        } else {
            Code::FailedPrecondition
        }
    }

    /// The error a command that would make a run of `sandbox` fails with.
    pub fn error(self, sandbox: &str) -> Error {
        Error::Unplaced { sandbox: sandbox.to_string(), code: self.code(), why: self.to_string() }
    }
}

impl fmt::Display for Unplaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no node is registered");
        }
        f.write_str("no node can run it: ")?;
        for (i, (node, why)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{node}: {why}")?;
        }
        Ok(())
    }
}

/// Why `node` cannot take a sandbox reserving `wanted` and asking for `selector`, if it cannot.
pub fn unfit(node: &Node, wanted: Capacity, selector: &BTreeMap<String, String>) -> Option<Unfit> {
    if !node.live && !crate::bug!(PlacesOnLapsed) {
        return Some(Unfit::Lapsed);
    }
    if node.draining {
        return Some(Unfit::Draining);
    }
    if let Some((key, value)) = selector.iter().find(|(k, v)| node.labels.get(*k) != Some(*v)) {
        return Some(Unfit::Selector { key: key.clone(), value: value.clone() });
    }
    let resources = [
        ("cpu_millis", node.capacity.cpu_millis, node.placed.cpu_millis, wanted.cpu_millis),
        ("memory_bytes", node.capacity.memory_bytes, node.placed.memory_bytes, wanted.memory_bytes),
        ("sandboxes", node.capacity.sandboxes, node.placed.sandboxes, wanted.sandboxes),
    ];
    resources.into_iter().find_map(|(resource, capacity, placed, wanted)| {
        let counted = capacity > 0 || resource == "sandboxes";
        let free = capacity.saturating_sub(placed);
        (counted && wanted > free).then_some(Unfit::Full { resource, free, wanted })
    })
}

/// The fullest of a node's counted resources once `wanted` is placed on it, as a fraction.
fn fullest(node: &Node, wanted: Capacity) -> (u64, u64) {
    let after = node.placed.plus(wanted);
    [
        (after.cpu_millis, node.capacity.cpu_millis),
        (after.memory_bytes, node.capacity.memory_bytes),
        (after.sandboxes, node.capacity.sandboxes),
    ]
    .into_iter()
    .filter(|(_, capacity)| *capacity > 0)
    .fold((0, 1), |most, share| if less(most, share) { share } else { most })
}

/// Whether the fraction `a` is less than `b` (denominators never 0).
fn less((an, ad): (u64, u64), (bn, bd): (u64, u64)) -> bool {
    u128::from(an) * u128::from(bd) < u128::from(bn) * u128::from(ad)
}

/// The node a sandbox with `limits` and node `selector` goes to, or why none can take it.
pub fn place(
    nodes: &[Node],
    limits: &ResourceLimits,
    selector: &BTreeMap<String, String>,
    sandbox: &SandboxId,
) -> Result<Placement, Unplaced> {
    let wanted = Capacity::of(limits);
    let mut unfit_nodes = Vec::new();
    let mut best: Option<(&Node, (u64, u64))> = None;
    for node in nodes {
        if let Some(why) = unfit(node, wanted, selector) {
            unfit_nodes.push((node.id.clone(), why));
            continue;
        }
        let share = fullest(node, wanted);
        let better = match best {
            None => true,
            Some((current, current_share)) => {
                let key = |n: &Node| (n.placed.sandboxes, std::cmp::Reverse(rank(sandbox, &n.id)), n.id.clone());
                less(share, current_share) || (!less(current_share, share) && key(node) < key(current))
            }
        };
        if better {
            best = Some((node, share));
        }
    }
    match best {
        Some((node, _)) => Ok(Placement { node: node.id.clone(), epoch: node.epoch }),
        None => {
            unfit_nodes.sort_by(|a, b| a.0.cmp(&b.0));
            Err(Unplaced(unfit_nodes))
        }
    }
}

/// How highly `sandbox` ranks `node` among nodes otherwise equal: a hash of the two (FNV-1a,
/// then a 64-bit finalizer so that ids differing in one character rank independently). Every
/// sandbox ranks the nodes in its own order, so sandboxes spread evenly over tied nodes, and a
/// node's arrival or departure changes only the choices that involved it.
fn rank(sandbox: &SandboxId, node: &NodeId) -> u64 {
    let bytes = sandbox.as_str().bytes().chain([0xff]).chain(node.as_str().bytes());
    let mut h = bytes.fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Where a new generation of `sandbox` runs. A sandbox placed before stays on its node while
/// that node can take it (its workspace is there), without counting twice what it already
/// reserves there; otherwise it is placed as a new one is, but never while its node's lease has
/// lapsed with something of its last run maybe still alive there (N1).
pub fn place_again(sandbox: &Sandbox, nodes: &[Node]) -> Result<Placement, Unplaced> {
    let limits = &sandbox.spec.limits;
    let selector = &sandbox.spec.node_selector;
    if let Some(at) = &sandbox.placement
        && let Some(node) = nodes.iter().find(|n| n.id == at.node)
    {
        if !node.live && crate::fencing::may_linger(sandbox) {
            return Err(Unplaced(vec![(node.id.clone(), Unfit::Lingering)]));
        }
        let wanted = if reserves(sandbox) { Capacity::default() } else { Capacity::of(limits) };
        if unfit(node, wanted, selector).is_none() {
            return Ok(Placement { node: node.id.clone(), epoch: node.epoch });
        }
    }
    place(nodes, limits, selector, &sandbox.id)
}

/// Places the new sandboxes of one decision (a fork's) one after another, each counted on its
/// node before the next is placed, so that they spread as if made one by one.
pub fn place_each<'s>(
    nodes: &[Node],
    sandboxes: impl IntoIterator<Item = &'s Sandbox>,
) -> Result<Vec<Placement>, (&'s Sandbox, Unplaced)> {
    let mut nodes = nodes.to_vec();
    let mut placements = Vec::new();
    for sandbox in sandboxes {
        let placed = place(&nodes, &sandbox.spec.limits, &sandbox.spec.node_selector, &sandbox.id)
            .map_err(|why| (sandbox, why))?;
        if let Some(node) = nodes.iter_mut().find(|n| n.id == placed.node) {
            node.placed = node.placed.plus(Capacity::of(&sandbox.spec.limits));
        }
        placements.push(placed);
    }
    Ok(placements)
}

/// What the sandboxes placed on each node reserve there ([`Node::placed`]).
pub fn loads<'s>(sandboxes: impl IntoIterator<Item = &'s Sandbox>) -> BTreeMap<NodeId, Capacity> {
    let mut loads = BTreeMap::<NodeId, Capacity>::new();
    for sandbox in sandboxes {
        if let Some(at) = sandbox.placement.as_ref().filter(|_| reserves(sandbox)) {
            let load = loads.entry(at.node.clone()).or_default();
            *load = load.plus(Capacity::of(&sandbox.spec.limits));
        }
    }
    loads
}

/// Whether node `node` runs `sandbox`'s runs: the one it is placed on. A sandbox placed nowhere
/// (recorded before nodes were) runs where its record was made, a single host: every node
/// takes it for its own, which is that host's one node.
pub fn runs_on(sandbox: &Sandbox, node: &NodeId) -> bool {
    sandbox.placement.as_ref().is_none_or(|at| at.node == *node)
}

/// Whether `sandbox` counts in what its node has placed: everything but a stopped one (a
/// sandbox being deleted keeps its room until its record goes).
pub fn reserves(sandbox: &Sandbox) -> bool {
    sandbox.placement.is_some() && sandbox.intent != Intent::Stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn node(id: &str, capacity: Capacity, placed: Capacity) -> Node {
        Node { id: NodeId::new(id), epoch: 7, live: true, draining: false, labels: BTreeMap::new(), capacity, placed }
    }

    fn cap(cpu_millis: u64, memory_bytes: u64, sandboxes: u64) -> Capacity {
        Capacity { cpu_millis, memory_bytes, sandboxes }
    }

    fn limits(cpu_millis: Option<u64>, memory_bytes: Option<u64>) -> ResourceLimits {
        ResourceLimits { cpu_millis, memory_bytes, pids: None }
    }

    fn none() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn sb() -> SandboxId {
        SandboxId::new("sb-1")
    }

    #[test]
    fn the_node_least_full_after_the_sandbox_takes_it_with_that_nodes_epoch() {
        let mut a = node("a", cap(4000, 8 * GIB, 100), cap(3000, GIB, 3));
        a.epoch = 3;
        let mut b = node("b", cap(4000, 8 * GIB, 100), cap(1000, 6 * GIB, 3));
        b.epoch = 9;
        let c = node("c", cap(4000, 8 * GIB, 100), cap(2000, 2 * GIB, 3));
        // After a 1-core, 1 GiB sandbox: a is 100% of its CPU, b 87.5% of its memory, c 75%.
        let placed = place(&[a.clone(), b.clone(), c], &limits(Some(1000), Some(GIB)), &none(), &sb());
        assert_eq!(placed, Ok(Placement { node: NodeId::new("c"), epoch: 7 }));
        let placed = place(&[a, b], &limits(Some(1000), Some(GIB)), &none(), &sb());
        assert_eq!(placed, Ok(Placement { node: NodeId::new("b"), epoch: 9 }));
    }

    #[test]
    fn sandboxes_without_limits_spread_by_count_and_ties_go_to_the_node_the_sandbox_ranks_first() {
        let nodes = |placed: [u64; 3]| -> Vec<Node> {
            ["n2", "n1", "n3"].iter().zip(placed).map(|(id, n)| node(id, cap(0, 0, 10), cap(0, 0, n))).collect()
        };
        let unlimited = ResourceLimits::default();
        let to = |placed, id: &str| place(&nodes(placed), &unlimited, &none(), &SandboxId::new(id)).unwrap().node;
        // Tied: each sandbox's own ranking decides, the same from every gateway.
        let tied: Vec<NodeId> = ["sb-1", "sb-2", "sb-3", "sb-4"].iter().map(|id| to([0, 0, 0], id)).collect();
        assert_eq!(tied, ["n2", "n3", "n3", "n1"].map(NodeId::new));
        // Otherwise fewest sandboxes first.
        assert_eq!(to([0, 1, 0], "sb-1"), NodeId::new("n2"));
        assert_eq!(to([1, 1, 0], "sb-1"), NodeId::new("n3"));
        // Thirty sandboxes onto three equal nodes, one after another: ten each.
        let mut three = nodes([0, 0, 0]);
        for i in 0..30 {
            let to = place(&three, &unlimited, &none(), &SandboxId::new(format!("sb-{i}"))).unwrap().node;
            three.iter_mut().find(|n| n.id == to).unwrap().placed.sandboxes += 1;
        }
        assert!(three.iter().all(|n| n.placed.sandboxes == 10), "{three:?}");
        // Three hundred placed at once from one view of the loads (creates racing): spread too.
        let mut counts = BTreeMap::<NodeId, u32>::new();
        for i in 0..300 {
            let to = place(&nodes([0, 0, 0]), &unlimited, &none(), &SandboxId::new(format!("sb-{i:x}0"))).unwrap();
            *counts.entry(to.node).or_default() += 1;
        }
        assert!(counts.len() == 3 && counts.values().all(|n| (70..=130).contains(n)), "{counts:?}");
    }

    #[test]
    fn equal_shares_go_to_the_node_with_fewer_sandboxes() {
        // Both at half their memory after the sandbox; b holds fewer sandboxes.
        let a = node("a", cap(0, 4 * GIB, 100), cap(0, GIB, 4));
        let b = node("b", cap(0, 4 * GIB, 100), cap(0, GIB, 2));
        assert_eq!(place(&[a, b], &limits(None, Some(GIB)), &none(), &sb()).unwrap().node, NodeId::new("b"));
    }

    #[test]
    fn a_lapsed_draining_unselected_or_full_node_is_never_chosen_and_each_says_why() {
        let mut lapsed = node("a-lapsed", cap(0, 0, 10), cap(0, 0, 0));
        lapsed.live = false;
        // Lapsed wins over every other reason: a fenced node's columns are not to be trusted.
        lapsed.draining = true;
        let mut draining = node("b-draining", cap(0, 0, 10), cap(0, 0, 0));
        draining.draining = true;
        let mut other = node("c-other", cap(0, 0, 10), cap(0, 0, 0));
        other.labels.insert("zone".into(), "west".into());
        let full_memory = node("d-memory", cap(0, 4 * GIB, 10), cap(0, 3 * GIB, 1));
        let full_slots = node("e-slots", cap(0, 0, 2), cap(0, 0, 2));
        let selector = BTreeMap::from([("zone".to_string(), "east".to_string())]);
        let mut nodes = vec![full_slots, other, lapsed, draining, full_memory];
        for n in &mut nodes[3..] {
            n.labels.insert("zone".into(), "east".into());
        }
        nodes[0].labels.insert("zone".into(), "east".into());
        let unplaced = place(&nodes, &limits(None, Some(2 * GIB)), &selector, &sb()).unwrap_err();
        let id = NodeId::new;
        assert_eq!(
            unplaced,
            Unplaced(vec![
                (id("a-lapsed"), Unfit::Lapsed),
                (id("b-draining"), Unfit::Draining),
                (id("c-other"), Unfit::Selector { key: "zone".into(), value: "east".into() }),
                (id("d-memory"), Unfit::Full { resource: "memory_bytes", free: GIB, wanted: 2 * GIB }),
                (id("e-slots"), Unfit::Full { resource: "sandboxes", free: 0, wanted: 1 }),
            ])
        );
        assert_eq!(
            unplaced.to_string(),
            "no node can run it: a-lapsed: its lease has lapsed; b-draining: it is draining; \
             c-other: it has no label zone=east; d-memory: memory_bytes: 1073741824 free, 2147483648 asked; \
             e-slots: sandboxes: 0 free, 1 asked"
        );
        assert_eq!(
            place(&[], &ResourceLimits::default(), &none(), &sb()).unwrap_err().to_string(),
            "no node is registered"
        );
    }

    #[test]
    fn a_resource_a_node_does_not_count_is_not_reserved() {
        // No CPU capacity given: a 64-core limit fits, and the node's fullness is its memory.
        let a = node("a", cap(0, 4 * GIB, 10), cap(0, 0, 0));
        assert_eq!(place(&[a], &limits(Some(64_000), Some(GIB)), &none(), &sb()).unwrap().node, NodeId::new("a"));
    }

    #[test]
    fn the_decision_does_not_depend_on_the_order_nodes_are_read_in() {
        let nodes = vec![
            node("a", cap(2000, 0, 10), cap(1000, 0, 1)),
            node("b", cap(4000, 0, 10), cap(2000, 0, 1)),
            node("c", cap(8000, 0, 10), cap(5000, 0, 1)),
        ];
        let wanted = limits(Some(500), None);
        let first = place(&nodes, &wanted, &none(), &sb());
        let mut reversed = nodes.clone();
        reversed.reverse();
        assert_eq!(place(&reversed, &wanted, &none(), &sb()), first);
        // b: 2500 of 4000 (62.5%) beats a's 75% and c's 68.75%.
        assert_eq!(first.unwrap().node, NodeId::new("b"));
    }

    #[test]
    fn the_sandboxes_of_one_decision_spread_as_if_made_one_by_one_or_none_is_placed() {
        let sandbox = |name: &str| {
            let id = crate::id::SandboxId::new(name);
            Sandbox::new(id, name, crate::spec::SandboxSpec::default(), crate::time::Timestamp(0))
        };
        let forks = [sandbox("f1"), sandbox("f2"), sandbox("f3")];
        let names = |placed: Vec<Placement>| placed.into_iter().map(|p| p.node.to_string()).collect::<Vec<_>>();
        let empty = [node("a", cap(0, 0, 2), cap(0, 0, 0)), node("b", cap(0, 0, 2), cap(0, 0, 0))];
        assert_eq!(names(place_each(&empty, &forks).unwrap()), ["b", "a", "a"]);
        // Three need three slots and there are two: the one that does not fit is named.
        let nodes = [node("a", cap(0, 0, 2), cap(0, 0, 0)), node("b", cap(0, 0, 2), cap(0, 0, 2))];
        assert_eq!(names(place_each(&nodes, &forks[..2]).unwrap()), ["a", "a"]);
        let (unplaced, why) = place_each(&nodes, &forks).unwrap_err();
        assert_eq!(&*unplaced.name, "f3");
        assert_eq!(why.to_string(), "no node can run it: a: sandboxes: 0 free, 1 asked; b: sandboxes: 0 free, 1 asked");
    }

    #[test]
    fn a_sandbox_runs_on_the_node_it_is_placed_on_and_an_unplaced_one_on_any() {
        let id = crate::id::SandboxId::new("s");
        let mut sandbox = Sandbox::new(id, "s", crate::spec::SandboxSpec::default(), crate::time::Timestamp(0));
        let (a, b) = (NodeId::new("a"), NodeId::new("b"));
        assert!(runs_on(&sandbox, &a) && runs_on(&sandbox, &b));
        sandbox.placement = Some(Placement { node: a.clone(), epoch: 4 });
        assert!(runs_on(&sandbox, &a));
        assert!(!runs_on(&sandbox, &b));
    }
}
