//! `berth.v1.Gateway`: what a gateway is (its version and name, its store and driver), for
//! `berth version` and for clients that check what they talk to.

use berth_proto::v1 as pb;
use berth_proto::v1::gateway_server::Gateway;
use tonic::{Request, Response, Status};

use crate::engine::Engine;

pub struct GatewayApi {
    engine: Engine,
}

impl GatewayApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

#[tonic::async_trait]
impl Gateway for GatewayApi {
    async fn get_info(&self, _: Request<pb::GetInfoRequest>) -> Result<Response<pb::GatewayInfo>, Status> {
        Ok(Response::new(pb::GatewayInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            name: self.engine.settings().name.clone(),
            store: self.engine.store().kind().to_string(),
            driver: self.engine.driver().name().to_string(),
            e2b_url: self.engine.settings().e2b_url.clone().unwrap_or_default(),
        }))
    }
}
