//! N2 (DESIGN 16, many hosts): after faults stop, every sandbox is placed on a live node or
//! ended as its policy says; none waits on a fenced node. Checked once the quiet phase is over,
//! each record against the nodes whose leases the store holds live then.

use std::collections::BTreeSet;

use berth_core::{NodeId, Sandbox};

/// The sandboxes of `records` that something still waits on (a run, a stop or a delete their
/// node is to carry out) on a node not in `live`.
pub fn stranded(records: &[Sandbox], live: &BTreeSet<NodeId>) -> Vec<String> {
    records
        .iter()
        .filter(|s| berth_core::fencing::touches(s))
        .filter_map(|s| {
            let at = s.placement.as_ref()?;
            (!live.contains(&at.node)).then(|| {
                format!(
                    "{} is {} on {} (epoch {}), whose lease is not live, after the quiet phase",
                    s.name, s.phase, at.node, at.epoch
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use berth_core::{Intent, Phase, Placement};

    use super::*;
    use crate::invariants::sandbox;

    fn on(node: &str, phase: Phase) -> Sandbox {
        let mut s = sandbox("sb1", Intent::Running, phase, 2);
        s.placement = Some(Placement { node: NodeId::new(node), epoch: 3 });
        s
    }

    #[test]
    fn a_sandbox_on_a_live_node_or_ended_is_fine() {
        let live = BTreeSet::from([NodeId::new("node-0")]);
        assert_eq!(stranded(&[on("node-0", Phase::Ready)], &live), Vec::<String>::new());
        let ended = on("node-1", Phase::Stopped);
        assert_eq!(stranded(&[ended], &live), Vec::<String>::new());
    }

    #[test]
    fn a_sandbox_waiting_on_a_node_gone_fires() {
        let live = BTreeSet::from([NodeId::new("node-0")]);
        assert_eq!(
            stranded(&[on("node-1", Phase::Ready)], &live),
            ["sb1 is Ready on node-1 (epoch 3), whose lease is not live, after the quiet phase"]
        );
    }
}
