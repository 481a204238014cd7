//! The store's side of fencing (DESIGN 14, N2), carried out by the reconcile lease holder: a
//! node whose lease lapsed and stayed lapsed is fenced, and each run placed on it is merged as
//! lost ([`berth_core::Observation::NodeFenced`]), so that its stop completes, its delete ends
//! and its restart policy may place a new generation on a live node. The node's side (it stops
//! what it can no longer renew, and removes on its return what the store placed elsewhere) is
//! the node's lease and reconcile ([`crate::node`], [`crate::reconcile`]).
//!
//! A node is fenced only after `grace` without a live lease, seen by this holder: long enough
//! for a gateway sharing its data directory (its runtime) to take its lease over, or for its
//! own gateway to restart, so that neither loses what runs there. The holder's own node is
//! never fenced by it: this gateway is that node's process, alive, and renews its lease.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_core::{NodeId, Observation, Sandbox};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::engine::Engine;

/// Since when each node other than this gateway's has been seen without a live lease, and in
/// which epoch.
#[derive(Default)]
struct Lapses(BTreeMap<NodeId, (u64, Instant)>);

impl Lapses {
    /// Notes what the nodes' leases are at `now`; returns the nodes lapsed for `grace` or
    /// longer, each with the epoch its lease was last granted in.
    fn note(&mut self, nodes: &[crate::store::Node], me: &NodeId, now: Instant, grace: Duration) -> Vec<(NodeId, u64)> {
        let fenceable = |n: &&crate::store::Node| {
            !n.live
                && n.id != *me
                && berth_core::fencing::fenceable(n.offer.stops_when_lapsed, n.lease.holder.is_none())
        };
        let lapsed: BTreeMap<&NodeId, u64> = nodes.iter().filter(fenceable).map(|n| (&n.id, n.lease.term)).collect();
        self.0.retain(|id, (epoch, _)| lapsed.get(id) == Some(epoch));
        for (id, epoch) in &lapsed {
            self.0.entry((*id).clone()).or_insert((*epoch, now));
        }
        self.0
            .iter()
            .filter(|(_, (_, since))| now - *since >= grace)
            .map(|(id, (epoch, _))| (id.clone(), *epoch))
            .collect()
    }
}

/// Fences, from each batch of every record the holder reads, the runs placed on nodes lapsed for
/// `grace`.
pub async fn fencing_loop(engine: Engine, mut records: mpsc::Receiver<Vec<Sandbox>>, grace: Duration) {
    let mut lapses = Lapses::default();
    while let Some(batch) = records.recv().await {
        let nodes = match engine.store().nodes().await {
            Ok(nodes) => nodes,
            Err(e) => {
                debug!(error = %e, "cannot read the nodes; the next batch fences");
                continue;
            }
        };
        let fenced = lapses.note(&nodes, &engine.settings().node, Instant::now(), grace);
        for (node, epoch) in fenced {
            let placed = batch.iter().filter(|s| {
                s.placement.as_ref().is_some_and(|at| at.node == node && at.epoch <= epoch)
                    && berth_core::fencing::touches(s)
            });
            for sandbox in placed {
                info!(sandbox = %sandbox.name, node = %node, epoch, "the sandbox's node is fenced: its run is lost");
                let observation = Observation::NodeFenced { node: node.clone(), epoch };
                if let Err(e) = engine.observe(&sandbox.id, &observation, Some(sandbox.clone())).await {
                    warn!(sandbox = %sandbox.name, error = %e, "cannot merge a fence; the next batch tries again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Lease, Node, NodeOffer};

    fn node(id: &str, epoch: u64, live: bool) -> Node {
        let lease = Lease { holder: live.then(|| id.to_string()), term: epoch };
        let offer = NodeOffer { stops_when_lapsed: true, ..NodeOffer::default() };
        Node { id: NodeId::new(id), offer, draining: false, lease, live }
    }

    #[test]
    fn a_node_is_fenced_once_lapsed_for_the_grace_and_never_this_gateways_own() {
        let (me, grace, t0) = (NodeId::new("a"), Duration::from_secs(4), Instant::now());
        let at = |s| t0 + Duration::from_secs(s);
        let mut lapses = Lapses::default();
        let both_lapsed = [node("a", 2, false), node("b", 5, false), node("c", 1, true)];
        assert_eq!(lapses.note(&both_lapsed, &me, at(0), grace), []);
        assert_eq!(lapses.note(&both_lapsed, &me, at(3), grace), []);
        assert_eq!(lapses.note(&both_lapsed, &me, at(4), grace), [(NodeId::new("b"), 5)]);
        // Taken again (live, or lapsed again in a new epoch): the wait starts over.
        assert_eq!(lapses.note(&[node("b", 6, false)], &me, at(5), grace), []);
        assert_eq!(lapses.note(&[node("b", 6, true)], &me, at(9), grace), []);
        assert_eq!(lapses.note(&[node("b", 6, false)], &me, at(10), grace), []);
        assert_eq!(lapses.note(&[node("b", 6, false)], &me, at(14), grace), [(NodeId::new("b"), 6)]);
    }

    #[test]
    fn a_node_that_renewed_alone_is_never_fenced() {
        let (me, grace, t0) = (NodeId::new("a"), Duration::from_secs(4), Instant::now());
        let mut alone = node("b", 5, false);
        alone.offer.stops_when_lapsed = false;
        alone.lease.holder = Some("b".to_string());
        let mut lapses = Lapses::default();
        assert_eq!(lapses.note(std::slice::from_ref(&alone), &me, t0, grace), []);
        assert_eq!(lapses.note(std::slice::from_ref(&alone), &me, t0 + Duration::from_secs(60), grace), []);
        // Given up by its process, it is fenced like any other.
        alone.lease.holder = None;
        assert_eq!(lapses.note(std::slice::from_ref(&alone), &me, t0 + Duration::from_secs(61), grace), []);
        assert_eq!(lapses.note(&[alone], &me, t0 + Duration::from_secs(65), grace), [(NodeId::new("b"), 5)]);
    }
}
