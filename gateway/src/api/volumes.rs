//! Volumes (DESIGN 13.2): the `Volumes` service.

use berth_core::{Command, Outcome, Request as CoreRequest, Volume, VolumeId, validate};
use berth_proto::v1 as pb;
use berth_proto::v1::volumes_server::Volumes;
use tonic::{Request, Response, Status};

use super::convert;
use super::public::{core_invalid, page};
use crate::engine::Engine;
use crate::error::ApiError;

pub struct VolumeApi {
    engine: Engine,
}

impl VolumeApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// The volume as the API shows it, with the sandboxes that mount it.
    async fn shown(&self, volume: Volume) -> Result<pb::Volume, Status> {
        let users = self.engine.store().sandboxes_mounting(&volume).await.map_err(ApiError::from)?;
        Ok(convert::volume(volume, users.iter().map(|s| s.name.to_string()).collect()))
    }

    async fn reply(&self, outcome: Outcome) -> Result<Response<pb::VolumeReply>, Status> {
        match outcome {
            Outcome::Volume(v) => Ok(Response::new(pb::VolumeReply { volume: Some(self.shown(*v).await?) })),
            other => Err(Status::internal(format!("a volume's command answered {other:?}"))),
        }
    }
}

#[tonic::async_trait]
impl Volumes for VolumeApi {
    async fn create_volume(
        &self,
        request: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::VolumeReply>, Status> {
        let name = request.into_inner().name;
        let id = VolumeId::new(format!("vol-{:016x}{:016x}", self.engine.random(), self.engine.random()));
        let outcome = self.engine.execute(&CoreRequest::new(Command::CreateVolume { id, name }, None)).await?;
        self.reply(outcome).await
    }

    async fn get_volume(&self, request: Request<pb::GetVolumeRequest>) -> Result<Response<pb::VolumeReply>, Status> {
        let name = request.into_inner().name;
        validate::volume_name("name", &name).map_err(core_invalid)?;
        match self.engine.store().volume(&name).await.map_err(ApiError::from)? {
            Some(v) => self.reply(Outcome::Volume(v.into())).await,
            None => Err(Status::not_found(format!("volume '{name}' not found"))),
        }
    }

    async fn list_volumes(
        &self,
        request: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesReply>, Status> {
        let r = request.into_inner();
        let batch =
            self.engine.store().list_volumes(&page(r.page_size, r.page_token)?).await.map_err(ApiError::from)?;
        let mut volumes = Vec::with_capacity(batch.items.len());
        for v in batch.items {
            volumes.push(self.shown(v).await?);
        }
        Ok(Response::new(pb::ListVolumesReply { volumes, next_page_token: batch.next.unwrap_or_default() }))
    }

    async fn delete_volume(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::VolumeReply>, Status> {
        let r = request.into_inner();
        let command = Command::DeleteVolume { name: r.name };
        let outcome = self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await?;
        self.reply(outcome).await
    }
}
