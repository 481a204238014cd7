//! Routing (DESIGN 14): a call that works inside a sandbox (an exec, an attach, its logs, an
//! upload or a download) is served by a gateway of the node that runs it, since the run's
//! supervisor, its output and its workspace are on that node's host. A gateway given such a
//! call for a sandbox another node runs carries it, whole, to that node's address as the node
//! registered it, and relays the answer; the client never knows. A call carried once is served
//! where it lands (marked [`FORWARDED`]), so two gateways whose reads of a placement disagree
//! for a moment cannot pass a call back and forth.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::engine::Engine;
use crate::error::ApiError;

/// The metadata entry a carried call bears.
pub const FORWARDED: &str = "berth-forwarded";

/// Where a call about a sandbox is served.
pub enum Route {
    /// Here: this gateway's node runs it, or it is not found (which this gateway says), or the
    /// call was carried here already.
    Here,
    /// A gateway of the node that runs it.
    Node(Carrier),
}

/// The way to the gateway of the node that runs a sandbox.
pub struct Carrier {
    pub channel: Channel,
    node: berth_core::NodeId,
    sandbox: String,
}

impl Carrier {
    /// A carried call's failure as the client sees it: no answer from the node's gateway (not
    /// reached, its certificate refused: the status carries its cause, which an answer never
    /// does) or its UNAVAILABLE is UNAVAILABLE naming the sandbox's node; any other answer is
    /// the node's own word and passes unchanged.
    pub fn unreached(&self, status: Status) -> Status {
        let unanswered = std::error::Error::source(&status).is_some();
        if !unanswered && status.code() != tonic::Code::Unavailable {
            return status;
        }
        Status::unavailable(format!(
            "sandbox '{}' runs on node '{}', not reachable: {}",
            self.sandbox,
            self.node,
            status.message()
        ))
    }
}

/// Where a call bearing `metadata` about sandbox `name` is served. A sandbox placed on a node
/// that is not live is UNAVAILABLE, naming the node: its run is out of reach until the node
/// comes back or is fenced.
pub async fn route(engine: &Engine, metadata: &MetadataMap, name: &str) -> Result<Route, Status> {
    let Some(peers) = engine.settings().peers.as_ref().filter(|_| !metadata.contains_key(FORWARDED)) else {
        return Ok(Route::Here);
    };
    let record = engine.store().sandbox_by_name(name).await.map_err(ApiError::from)?;
    let Some(placed) = record.filter(|r| !engine.runs_here(r)).and_then(|r| r.placement) else {
        return Ok(Route::Here);
    };
    let node = engine.store().node(&placed.node).await.map_err(ApiError::from)?;
    let unreachable =
        |why: &str| Status::unavailable(format!("sandbox '{name}' runs on node '{}', {why}", placed.node));
    let node = match node {
        Some(node) if node.live => node,
        Some(_) => return Err(unreachable("whose lease has lapsed: try again once it is back or fenced")),
        None => return Err(unreachable("which is not registered")),
    };
    match peers.channel(&node.offer.address) {
        Ok(channel) => Ok(Route::Node(Carrier { channel, node: placed.node, sandbox: name.to_string() })),
        Err(e) => Err(unreachable(&format!("not reachable: {e}"))),
    }
}

/// `message` as the call carried to another node's gateway: with this gateway's credentials
/// (gateways sharing a store share the API token) and marked carried.
pub fn carried<T>(engine: &Engine, message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(peers) = engine.settings().peers.as_ref() {
        request.metadata_mut().insert("authorization", peers.bearer());
    }
    request.metadata_mut().insert(FORWARDED, MetadataValue::from_static("1"));
    request
}
