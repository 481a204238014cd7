//! `berth node`: the hosts that run sandboxes (DESIGN 14), as registered in the store.

use berth_proto::v1 as pb;
use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Client, Failed};
use super::print::table;

#[derive(Subcommand)]
pub(super) enum NodeCmd {
    /// List every registered node: whether its lease is held (LIVE), its epoch, and what of each
    /// resource it offers its sandboxes reserve (placed/offered).
    List,
    /// Show one node.
    Get { id: String },
    /// Give the node nothing new; what runs on it stays.
    Drain { id: String },
    /// Take a drained node back.
    Undrain { id: String },
    /// Remove a node whose lease is not held (its processes stopped, or gone): refused while
    /// one holds it.
    Delete { id: String },
}

fn capacity_json(c: Option<pb::NodeCapacity>) -> serde_json::Value {
    let c = c.unwrap_or_default();
    json!({"cpu_millis": c.cpu_millis, "memory_bytes": c.memory_bytes, "sandboxes": c.sandboxes})
}

fn node_json(n: &pb::Node) -> serde_json::Value {
    json!({
        "id": n.id, "address": n.address, "labels": n.labels, "live": n.live, "draining": n.draining,
        "epoch": n.epoch, "holder": n.holder,
        "capacity": capacity_json(n.capacity), "placed": capacity_json(n.placed),
    })
}

fn row(n: &pb::Node) -> Vec<String> {
    let (capacity, placed) = (n.capacity.unwrap_or_default(), n.placed.unwrap_or_default());
    let state = match (n.live, n.draining) {
        (true, false) => "Live",
        (true, true) => "Live, draining",
        (false, false) => "Lapsed",
        (false, true) => "Lapsed, draining",
    };
    let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    vec![
        n.id.clone(),
        state.to_string(),
        n.epoch.to_string(),
        n.holder.clone(),
        format!("{:.1}/{:.1}", placed.cpu_millis as f64 / 1000.0, capacity.cpu_millis as f64 / 1000.0),
        format!("{:.1}/{:.1}", gib(placed.memory_bytes), gib(capacity.memory_bytes)),
        format!("{}/{}", placed.sandboxes, capacity.sandboxes),
        labels.join(","),
        n.address.clone(),
    ]
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

impl Client {
    fn print_nodes(&self, nodes: &[pb::Node]) {
        match self.output {
            Output::Json if nodes.len() == 1 => say!("{:#}", node_json(&nodes[0])),
            Output::Json => say!("{:#}", json!(nodes.iter().map(node_json).collect::<Vec<_>>())),
            Output::Table => {
                let header = ["ID", "STATE", "EPOCH", "HOLDER", "CPUS", "MEMORY GIB", "SANDBOXES", "LABELS", "ADDRESS"];
                say!("{}", table(&header, nodes.iter().map(row).collect()));
            }
        }
    }

    pub(super) async fn node(&mut self, command: NodeCmd) -> Result<(), Failed> {
        let reply = match command {
            NodeCmd::List => {
                let nodes = self.nodes.list_nodes(pb::ListNodesRequest {}).await?.into_inner().nodes;
                self.print_nodes(&nodes);
                return Ok(());
            }
            NodeCmd::Get { id } => self.nodes.get_node(pb::GetNodeRequest { id }).await?,
            NodeCmd::Drain { id } => self.nodes.drain_node(pb::DrainNodeRequest { id }).await?,
            NodeCmd::Undrain { id } => self.nodes.undrain_node(pb::DrainNodeRequest { id }).await?,
            NodeCmd::Delete { id } => {
                self.nodes.delete_node(pb::DeleteNodeRequest { id: id.clone() }).await?;
                self.print_deleted("node", &id);
                return Ok(());
            }
        };
        self.print_nodes(&[reply.into_inner().node.unwrap_or_default()]);
        Ok(())
    }
}
