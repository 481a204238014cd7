//! Docker, through bollard.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::{SandboxId, Timestamp};
use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, HostConfig, Mount, MountType, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, EventsOptionsBuilder, InspectContainerOptions,
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptions,
    StartContainerOptions, StopContainerOptionsBuilder,
};
use futures_util::StreamExt;

use super::{
    ContainerSpec, Engine, EngineError, EngineEvent, EventStream, Inspection, LABEL_OWNER, LABEL_SANDBOX, Status,
};

pub struct DockerEngine {
    docker: Docker,
    owner: String,
}

fn error(e: BollardError) -> EngineError {
    match e {
        BollardError::DockerResponseServerError { status_code: 404, message } => EngineError::NotFound(message),
        BollardError::DockerResponseServerError { status_code, message } if (400..500).contains(&status_code) => {
            EngineError::Refused(message)
        }
        other => EngineError::Unreachable(other.to_string()),
    }
}

/// Only this owner's containers and volumes.
fn owned(owner: &str) -> HashMap<String, Vec<String>> {
    [("label".to_string(), vec![format!("{LABEL_OWNER}={owner}")])].into()
}

impl DockerEngine {
    /// Connects to the daemon's socket and settles on the API version it speaks.
    pub async fn connect(socket: &str, owner: &str) -> Result<Self, EngineError> {
        let docker = Docker::connect_with_socket(socket, 120, bollard::API_DEFAULT_VERSION).map_err(error)?;
        let docker = docker.negotiate_version().await.map_err(error)?;
        docker.ping().await.map_err(error)?;
        Ok(Self { docker, owner: owner.to_string() })
    }
}

#[async_trait]
impl Engine for DockerEngine {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<(), EngineError> {
        let mut mounts: Vec<Mount> = spec
            .binds
            .iter()
            .map(|b| Mount {
                target: Some(b.target.clone()),
                source: Some(b.source.display().to_string()),
                typ: Some(MountType::BIND),
                read_only: Some(b.read_only),
                ..Default::default()
            })
            .collect();
        mounts.push(Mount {
            target: Some(spec.volume.1.clone()),
            source: Some(spec.volume.0.clone()),
            typ: Some(MountType::VOLUME),
            ..Default::default()
        });
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            entrypoint: Some(spec.entrypoint.clone()),
            cmd: Some(spec.command.clone()),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            working_dir: Some(spec.workdir.clone()),
            stop_timeout: Some(spec.stop_grace.as_secs().max(1) as i64),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                network_mode: Some("none".into()),
                init: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&spec.name).build();
        self.docker.create_container(Some(options), body).await.map(|_| ()).map_err(error)
    }

    async fn start(&self, container: &str) -> Result<(), EngineError> {
        match self.docker.start_container(container, None::<StartContainerOptions>).await {
            // 304: already running.
            Err(BollardError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            other => other.map_err(error),
        }
    }

    async fn stop(&self, container: &str, grace: Duration) -> Result<(), EngineError> {
        let seconds = i32::try_from(grace.as_secs().max(1)).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::default().t(seconds).build();
        match self.docker.stop_container(container, Some(options)).await {
            Err(BollardError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            other => other.map_err(error),
        }
    }

    async fn remove(&self, container: &str) -> Result<(), EngineError> {
        let options = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match self.docker.remove_container(container, Some(options)).await.map_err(error) {
            Err(EngineError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    async fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<(), EngineError> {
        let request = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            ..Default::default()
        };
        // Creating an existing volume returns it unchanged.
        self.docker.create_volume(request).await.map(|_| ()).map_err(error)
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        match self.docker.remove_volume(name, None::<RemoveVolumeOptions>).await.map_err(error) {
            Err(EngineError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    async fn inspect(&self, container: &str) -> Result<Option<Inspection>, EngineError> {
        let response =
            match self.docker.inspect_container(container, None::<InspectContainerOptions>).await.map_err(error) {
                Ok(r) => r,
                Err(EngineError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
        let state = response.state.unwrap_or_default();
        let status = match state.status {
            Some(ContainerStateStatusEnum::RUNNING) => Status::Running,
            Some(ContainerStateStatusEnum::CREATED) => Status::Created,
            Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD) => Status::Exited,
            _ => Status::Other,
        };
        Ok(Some(Inspection {
            status,
            started_at: state.started_at.as_deref().and_then(super::parse_time),
            finished_at: state.finished_at.as_deref().and_then(super::parse_time),
            exit_code: i32::try_from(state.exit_code.unwrap_or_default()).unwrap_or(-1),
        }))
    }

    async fn list(&self) -> Result<Vec<SandboxId>, EngineError> {
        let options = ListContainersOptionsBuilder::default().all(true).filters(&owned(&self.owner)).build();
        let containers = self.docker.list_containers(Some(options)).await.map_err(error)?;
        Ok(containers
            .into_iter()
            .filter_map(|c| c.labels.and_then(|l| l.get(LABEL_SANDBOX).cloned()))
            .map(SandboxId::new)
            .collect())
    }

    async fn list_volumes(&self) -> Result<Vec<String>, EngineError> {
        let options = ListVolumesOptionsBuilder::default().filters(&owned(&self.owner)).build();
        let volumes = self.docker.list_volumes(Some(options)).await.map_err(error)?;
        Ok(volumes.volumes.unwrap_or_default().into_iter().map(|v| v.name).collect())
    }

    async fn events(&self) -> Result<EventStream, EngineError> {
        let mut filters = owned(&self.owner);
        filters.insert("type".into(), vec!["container".into()]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        let stream = self.docker.events(Some(options)).filter_map(|event| async move {
            let event = match event {
                Ok(event) => event,
                Err(e) => return Some(Err(error(e))),
            };
            let action = event.action.unwrap_or_default();
            // `stop` is not reliable (Podman's compat API omits it): die and destroy are.
            let removed = match action.as_str() {
                "destroy" | "remove" => true,
                "start" | "die" | "create" | "kill" | "stop" => false,
                _ => return None,
            };
            let sandbox = event.actor.and_then(|a| a.attributes).and_then(|a| a.get(LABEL_SANDBOX).cloned())?;
            let at = Timestamp::from_unix_nanos(event.time_nano.unwrap_or_default());
            Some(Ok(EngineEvent { sandbox: SandboxId::new(sandbox), removed, at }))
        });
        Ok(Box::pin(stream))
    }

    async fn import_image(&self, reference: &str, rootfs: Vec<u8>) -> Result<(), EngineError> {
        let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
        let options = CreateImageOptionsBuilder::default().from_src("-").repo(repo).tag(tag).build();
        let mut progress = self.docker.create_image(Some(options), Some(bollard::body_full(rootfs.into())), None);
        while let Some(step) = progress.next().await {
            step.map_err(error)?;
        }
        Ok(())
    }
}
