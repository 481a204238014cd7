//! Nodes (DESIGN 14): the `Nodes` service, over the store's node rows.

use berth_core::{NodeId, validate};
use berth_proto::v1 as pb;
use berth_proto::v1::nodes_server::Nodes;
use tonic::{Request, Response, Status};

use super::public::core_invalid;
use crate::engine::Engine;
use crate::error::ApiError;
use berth_core::placement::Capacity;

use crate::store::{Node, NodeRemoval};

pub struct NodeApi {
    engine: Engine,
}

impl NodeApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// Node `id` as it stands, or NOT_FOUND naming it.
    async fn node(&self, id: &str) -> Result<Response<pb::NodeReply>, Status> {
        match self.engine.store().node(&node_id(id)?).await.map_err(ApiError::from)? {
            Some(node) => {
                let loads = self.engine.store().node_loads().await.map_err(ApiError::from)?;
                let placed = loads.get(&node.id).copied().unwrap_or_default();
                Ok(Response::new(pb::NodeReply { node: Some(shown(node, placed)) }))
            }
            None => Err(not_found(id)),
        }
    }

    async fn drain(&self, id: &str, draining: bool) -> Result<Response<pb::NodeReply>, Status> {
        if !self.engine.store().drain_node(&node_id(id)?, draining).await.map_err(ApiError::from)? {
            return Err(not_found(id));
        }
        self.node(id).await
    }
}

/// A node id from a request: a DNS label, as `--node` takes, or INVALID_ARGUMENT naming the
/// field.
fn node_id(id: &str) -> Result<NodeId, Status> {
    validate::dns_label("id", id).map_err(core_invalid)?;
    Ok(NodeId::new(id))
}

fn not_found(id: &str) -> Status {
    Status::not_found(format!("node '{id}' is not registered"))
}

fn shown(node: Node, placed: Capacity) -> pb::Node {
    let wire = |c: Capacity| pb::NodeCapacity {
        cpu_millis: c.cpu_millis,
        memory_bytes: c.memory_bytes,
        sandboxes: c.sandboxes,
    };
    pb::Node {
        id: node.id.to_string(),
        address: node.offer.address,
        labels: node.offer.labels,
        capacity: Some(wire(node.offer.capacity)),
        placed: Some(wire(placed)),
        draining: node.draining,
        epoch: node.lease.term,
        holder: node.lease.holder.unwrap_or_default(),
        live: node.live,
    }
}

#[tonic::async_trait]
impl Nodes for NodeApi {
    async fn get_node(&self, request: Request<pb::GetNodeRequest>) -> Result<Response<pb::NodeReply>, Status> {
        self.node(&request.into_inner().id).await
    }

    async fn list_nodes(&self, _: Request<pb::ListNodesRequest>) -> Result<Response<pb::ListNodesReply>, Status> {
        let nodes = self.engine.store().nodes().await.map_err(ApiError::from)?;
        let loads = self.engine.store().node_loads().await.map_err(ApiError::from)?;
        let shown = |n: Node| {
            let placed = loads.get(&n.id).copied().unwrap_or_default();
            shown(n, placed)
        };
        Ok(Response::new(pb::ListNodesReply { nodes: nodes.into_iter().map(shown).collect() }))
    }

    async fn drain_node(&self, request: Request<pb::DrainNodeRequest>) -> Result<Response<pb::NodeReply>, Status> {
        self.drain(&request.into_inner().id, true).await
    }

    async fn undrain_node(&self, request: Request<pb::DrainNodeRequest>) -> Result<Response<pb::NodeReply>, Status> {
        self.drain(&request.into_inner().id, false).await
    }

    async fn delete_node(
        &self,
        request: Request<pb::DeleteNodeRequest>,
    ) -> Result<Response<pb::DeleteNodeReply>, Status> {
        let id = request.into_inner().id;
        match self.engine.store().delete_node(&node_id(&id)?).await.map_err(ApiError::from)? {
            NodeRemoval::Removed => Ok(Response::new(pb::DeleteNodeReply {})),
            NodeRemoval::NotFound => Err(not_found(&id)),
            NodeRemoval::Live(lease) => Err(Status::failed_precondition(format!(
                "node '{id}' is live: {} holds its lease (epoch {}) and would register it again; stop it first",
                lease.holder.as_deref().unwrap_or("a process"),
                lease.term
            ))),
            NodeRemoval::Holding(sandboxes) => Err(Status::failed_precondition(format!(
                "node '{id}' holds {sandboxes} sandbox(es) that are not stopped: stop or delete them first \
                 (a start places a stopped one anew)"
            ))),
        }
    }
}
