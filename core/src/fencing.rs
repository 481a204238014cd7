//! Fencing (DESIGN 14, N1): what a node may run, and when it must stop.
//!
//! A node holds a lease in the store, renewed on the database's clock; each grant after a
//! lapse has a new epoch. The store decides: a sandbox's placement is (node, epoch,
//! generation), committed in its conditional write, and nothing else is authority over where
//! it runs. So when a node is cut off, the store's side wins:
//!
//! - the gateways treat the node's runs as lost only once its lease has lapsed by the
//!   database's clock, and may place a new generation elsewhere;
//! - the node relies on its lease for nine tenths of its time-to-live counted from when it
//!   asked ([`crate::lease::relied_until`]), which ends before the store's expiry however late
//!   the answer came; at that moment, not having renewed, it stops every run it holds.
//!
//! The node's stops begin before a new run may start elsewhere, as long as the two clocks run
//! at rates within a tenth of each other; the rest of that tenth is the time the stops have. A node that comes back under a new epoch
//! keeps only what the store still places on it ([`on_return`]) before it acts on anything.

use crate::id::NodeId;
use crate::phase::{FailureReason, Phase};
use crate::record::{Placement, Sandbox};

/// Where the store says a sandbox's current generation runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub node: NodeId,
    /// The epoch of the node's lease the placement was made (or last adopted) under.
    pub epoch: u64,
    pub generation: u64,
}

/// What a node does with a run it holds, after its lease is granted again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Placed here under this epoch: nothing to do.
    Keep,
    /// Placed here under an earlier epoch of this node's and never placed elsewhere (the store
    /// did not fence it in between): the node writes the placement's epoch up to its own,
    /// conditionally, before it does anything else with the run.
    Adopt,
    /// Not placed here any more (deleted, placed on another node, or a newer generation
    /// decided), or placed under an epoch this node never had: stopped before the node acts.
    Stop,
}

/// A node `me` holding lease `epoch` decides about its run of generation `generation` of a
/// sandbox, which the store places at `placed` (`None`: the sandbox is gone, or placed nowhere).
pub fn on_return(me: &NodeId, epoch: u64, generation: u64, placed: Option<&Placed>) -> Held {
    match placed {
        Some(p) if p.node == *me && p.generation == generation => match p.epoch.cmp(&epoch) {
            std::cmp::Ordering::Equal => Held::Keep,
            std::cmp::Ordering::Less => Held::Adopt,
            // A placement from an epoch not yet granted to this node means its own view is stale.
            std::cmp::Ordering::Greater => Held::Stop,
        },
        _ => Held::Stop,
    }
}

/// Where a sandbox placed at `placement` is placed once node `me`, holding its lease in
/// `epoch`, adopts the run of it that it holds, if that changes anything: a sandbox placed
/// nowhere (recorded before placement was, when there was one host) becomes `me`'s, and one
/// placed on `me` under an earlier epoch takes `epoch` ([`Held::Adopt`]); one placed elsewhere
/// is not `me`'s to adopt.
pub fn adopted(placement: Option<&Placement>, me: &NodeId, epoch: u64) -> Option<Placement> {
    match placement {
        None => Some(Placement { node: me.clone(), epoch }),
        Some(at) if at.node == *me && at.epoch < epoch => Some(Placement { node: me.clone(), epoch }),
        Some(_) => None,
    }
}

/// Whether a fence of its node changes `sandbox`: something of its run may still be alive there
/// ([`may_linger`]), or a stop or a delete its node was to carry out.
pub fn touches(sandbox: &Sandbox) -> bool {
    may_linger(sandbox)
}

/// Whether something of `sandbox`'s run may still be alive on the node it is placed on: anything
/// but a run its node stopped, or one the store already took for lost (its compute gone, or its
/// node fenced). A failed run's supervisor, and what its command started, may outlive it; so
/// until its node is back (and stops it) or fenced (having stopped it), no new generation of it
/// goes to another node.
pub fn may_linger(sandbox: &Sandbox) -> bool {
    match &sandbox.phase {
        Phase::Stopped => false,
        Phase::Error(failure) => failure.reason != FailureReason::ComputeResourceMissing,
        _ => true,
    }
}

/// What a gateway holds of its node's lease, as the node's side of fencing sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Held here, granted in this epoch.
    Held(u64),
    /// Not held here: not yet, given up, or held by a gateway sharing the node's data directory
    /// (and so its runtime), which keeps it for the node.
    Sibling,
    /// Lapsed here unrenewed while other nodes were live: the store may fence the node and
    /// place its sandboxes elsewhere at any moment.
    Lapsed,
}

/// Whether a node whose lease ended here stops every run it holds: when the lease ran out
/// unrenewed (`lapsed`; not given up, nor taken over by a sibling) while other nodes were live
/// at its last renewal (`others_live`), the store may fence the node and place its sandboxes on
/// them, so its runs must be gone first. The only node there is, the store places nowhere else:
/// its runs go on through an outage of the store.
pub fn stops_on_lapse(lapsed: bool, others_live: bool) -> bool {
    lapsed && others_live && !crate::bug!(LapsedNodeRunsOn)
}

/// Whether the store may fence a node whose lease is not live: one that said, at its last
/// renewal, that it stops its runs on a lapse ([`stops_on_lapse`]), or whose process gave its
/// lease up (it said it is gone). A node that renewed alone keeps its runs through a lapse:
/// fencing it could put its sandboxes on two nodes at once, so what is placed on it waits.
pub fn fenceable(stops_when_lapsed: bool, given_up: bool) -> bool {
    stops_when_lapsed || given_up
}

/// Whether a gateway whose standing in its node's lease is `standing` may make a run (start or resume one)
/// of a sandbox the store places on its node at `placement` (`None`: recorded before placement
/// was). An effect is carried out for the placement's epoch: a node whose lease lapsed refuses
/// every one (a run it made could overlap the next generation's elsewhere), and one whose view
/// is older than the placement (an epoch it does not know it was granted) refuses it too. An
/// earlier epoch of its own is still its to run: the store fences a node only by placing its
/// sandboxes anew, so a placement that still names the node was never fenced.
pub fn may_run(standing: Standing, placement: Option<&Placement>) -> bool {
    match (standing, placement) {
        (Standing::Lapsed, _) => crate::bug!(LapsedNodeRunsOn),
        (Standing::Sibling, _) | (Standing::Held(_), None) => true,
        (Standing::Held(held), Some(at)) => at.epoch <= held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(node: &str, epoch: u64, generation: u64) -> Placed {
        Placed { node: NodeId::new(node), epoch, generation }
    }

    #[test]
    fn a_returning_node_keeps_only_what_the_store_still_places_on_it() {
        let me = NodeId::new("n1");
        assert_eq!(on_return(&me, 4, 2, Some(&placed("n1", 4, 2))), Held::Keep);
        assert_eq!(on_return(&me, 4, 2, Some(&placed("n1", 3, 2))), Held::Adopt);
        // Placed elsewhere, a new generation decided, deleted: stopped.
        assert_eq!(on_return(&me, 4, 2, Some(&placed("n2", 1, 2))), Held::Stop);
        assert_eq!(on_return(&me, 4, 2, Some(&placed("n1", 4, 3))), Held::Stop);
        assert_eq!(on_return(&me, 4, 2, Some(&placed("n2", 7, 3))), Held::Stop);
        assert_eq!(on_return(&me, 4, 2, None), Held::Stop);
        assert_eq!(on_return(&me, 4, 2, Some(&placed("n1", 5, 2))), Held::Stop);
    }

    #[test]
    fn a_node_adopts_what_is_placed_nowhere_or_on_it_in_an_earlier_epoch_and_nothing_else() {
        let me = NodeId::new("n1");
        let at = |node: &str, epoch| Placement { node: NodeId::new(node), epoch };
        assert_eq!(adopted(None, &me, 4), Some(at("n1", 4)));
        assert_eq!(adopted(Some(&at("n1", 3)), &me, 4), Some(at("n1", 4)));
        assert_eq!(adopted(Some(&at("n1", 4)), &me, 4), None, "placed as it is");
        assert_eq!(adopted(Some(&at("n1", 5)), &me, 4), None, "an epoch this node was not granted");
        assert_eq!(adopted(Some(&at("n2", 1)), &me, 4), None, "another node's");
    }

    #[test]
    fn a_node_stops_its_runs_when_its_lease_lapses_only_if_the_store_could_place_them_elsewhere() {
        assert!(stops_on_lapse(true, true));
        assert!(!stops_on_lapse(true, false), "the only node: nowhere else to run them");
        assert!(!stops_on_lapse(false, true), "given up or taken over by a sibling");
    }

    #[test]
    fn the_store_fences_only_a_node_that_stops_its_runs_or_gave_its_lease_up() {
        assert!(fenceable(true, false));
        assert!(fenceable(false, true));
        assert!(!fenceable(false, false), "renewed alone: it keeps its runs");
    }

    #[test]
    fn a_run_is_made_only_under_a_lease_at_least_as_new_as_its_placement() {
        let at = |epoch| Placement { node: NodeId::new("n1"), epoch };
        assert!(may_run(Standing::Held(4), Some(&at(4))));
        assert!(may_run(Standing::Held(5), Some(&at(4))), "placed under an earlier epoch, never fenced");
        assert!(!may_run(Standing::Held(4), Some(&at(5))), "placed under an epoch this view has not seen");
        assert!(may_run(Standing::Held(4), None), "recorded before placement");
        assert!(!may_run(Standing::Lapsed, Some(&at(4))), "lapsed: the store may fence the node");
        assert!(!may_run(Standing::Lapsed, None));
        assert!(may_run(Standing::Sibling, Some(&at(4))), "a sibling holds the node's lease");
    }
}
