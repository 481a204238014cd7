//! Docker, through bollard.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::{SandboxId, Timestamp};
use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerConfig, ContainerCreateBody, ContainerStateStatusEnum, EventMessage, HostConfig, Mount, MountType,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder, EventsOptionsBuilder,
    InspectContainerOptions, ListContainersOptionsBuilder, ListImagesOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder, RemoveVolumeOptions, StartContainerOptions,
    StopContainerOptionsBuilder, TagImageOptionsBuilder,
};
use futures_util::StreamExt;

use super::{
    ContainerSpec, Engine, EngineError, EngineEvent, EventStream, Inspection, LABEL_OWNER, LABEL_SANDBOX, LABEL_STORE,
    Start, Status, of_store,
};

/// Docker's checkpoints (`docker checkpoint`) are an experimental feature of the daemon's, off
/// by default, restored only by a `docker start --checkpoint`: Berth checkpoints on Podman.
const NO_CHECKPOINTS: &str = "Docker's checkpoints are experimental (off unless the daemon runs with --experimental); use Podman, as root, with CRIU";

pub struct DockerEngine {
    docker: Docker,
    owner: String,
    store: Option<String>,
    cpus: u64,
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

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A runtime event as the driver sees it; `None` for one it ignores, or of another store.
fn engine_event(
    event: Result<EventMessage, BollardError>,
    store: Option<&str>,
) -> Option<Result<EngineEvent, EngineError>> {
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
    let attributes = event.actor.and_then(|a| a.attributes)?;
    if !of_store(attributes.get(LABEL_STORE).map(String::as_str), store) {
        return None;
    }
    let sandbox = attributes.get(LABEL_SANDBOX)?;
    let at = Timestamp::from_unix_nanos(event.time_nano.unwrap_or_default());
    Some(Ok(EngineEvent { sandbox: SandboxId::new(sandbox.clone()), removed, at }))
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
        let info = docker.info().await.map_err(error)?;
        let cpus = info.ncpu.and_then(|n| u64::try_from(n).ok()).unwrap_or(1).max(1);
        Ok(Self { docker, owner: owner.to_string(), store: None, cpus })
    }

    /// Binds the engine to a store: it labels what it makes with the store's identity and sees
    /// only that store's containers and volumes (and the unlabelled ones of older releases).
    pub fn with_store(self, store: &str) -> Self {
        Self { store: Some(store.to_string()), ..self }
    }

    fn ours(&self, labels: Option<&HashMap<String, String>>) -> bool {
        of_store(labels.and_then(|l| l.get(LABEL_STORE)).map(String::as_str), self.store.as_deref())
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

    fn store(&self) -> Option<&str> {
        self.store.as_deref()
    }

    fn cpus(&self) -> u64 {
        self.cpus
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
        mounts.extend(spec.volumes.iter().map(|v| Mount {
            target: Some(v.target.clone()),
            source: Some(v.name.clone()),
            typ: Some(MountType::VOLUME),
            read_only: Some(v.read_only),
            ..Default::default()
        }));
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
                // The host opens what the sandbox leaves in its workspace and logs directory:
                // never a device node it made.
                cap_drop: Some(vec![super::NO_DEVICE_NODES.into()]),
                nano_cpus: spec.limits.cpu_millis.map(|m| saturating_i64(m.saturating_mul(1_000_000))),
                memory: spec.limits.memory_bytes.map(saturating_i64),
                // Memory and swap together: no swap beyond the limit, so a run that needs more
                // memory is killed rather than slowed to a crawl.
                memory_swap: spec.limits.memory_bytes.map(saturating_i64),
                pids_limit: spec.limits.pids.map(saturating_i64),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&spec.name).build();
        self.docker.create_container(Some(options), body).await.map(|_| ()).map_err(error)
    }

    async fn start(&self, container: &str) -> Result<Start, EngineError> {
        match self.docker.start_container(container, None::<StartContainerOptions>).await {
            Ok(()) => Ok(Start::Began),
            // 304: already running.
            Err(BollardError::DockerResponseServerError { status_code: 304, .. }) => Ok(Start::WasRunning),
            Err(e) => Err(error(e)),
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

    async fn pause(&self, container: &str) -> Result<(), EngineError> {
        self.docker.pause_container(container).await.map_err(error)
    }

    async fn unpause(&self, container: &str) -> Result<(), EngineError> {
        self.docker.unpause_container(container).await.map_err(error)
    }

    fn checkpoints(&self) -> Result<(), String> {
        Err(NO_CHECKPOINTS.to_string())
    }

    async fn checkpoint(&self, _: &str) -> Result<(), EngineError> {
        Err(EngineError::Refused(NO_CHECKPOINTS.to_string()))
    }

    async fn restore(&self, _: &str) -> Result<(), EngineError> {
        Err(EngineError::Refused(NO_CHECKPOINTS.to_string()))
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

    async fn volume_path(&self, name: &str) -> Result<Option<PathBuf>, EngineError> {
        match self.docker.inspect_volume(name).await.map_err(error) {
            Ok(volume) => Ok(Some(PathBuf::from(volume.mountpoint))),
            Err(EngineError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
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
            Some(ContainerStateStatusEnum::PAUSED) => Status::Paused,
            Some(ContainerStateStatusEnum::CREATED) => Status::Created,
            Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD) => Status::Exited,
            _ => Status::Other,
        };
        Ok(Some(Inspection {
            status,
            started_at: state.started_at.as_deref().and_then(super::parse_time),
            finished_at: state.finished_at.as_deref().and_then(super::parse_time),
            exit_code: i32::try_from(state.exit_code.unwrap_or_default()).unwrap_or(-1),
            out_of_memory: state.oom_killed.unwrap_or(false),
            checkpointed: false,
            restored: false,
        }))
    }

    async fn list(&self) -> Result<Vec<SandboxId>, EngineError> {
        let options = ListContainersOptionsBuilder::default().all(true).filters(&owned(&self.owner)).build();
        let containers = self.docker.list_containers(Some(options)).await.map_err(error)?;
        Ok(containers
            .into_iter()
            .filter(|c| self.ours(c.labels.as_ref()))
            .filter_map(|c| c.labels.and_then(|l| l.get(LABEL_SANDBOX).cloned()))
            .map(SandboxId::new)
            .collect())
    }

    async fn list_volumes(&self) -> Result<Vec<String>, EngineError> {
        let options = ListVolumesOptionsBuilder::default().filters(&owned(&self.owner)).build();
        let volumes = self.docker.list_volumes(Some(options)).await.map_err(error)?;
        Ok(volumes
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| self.ours(Some(&v.labels)))
            .map(|v| v.name)
            .collect())
    }

    async fn events(&self) -> Result<EventStream, EngineError> {
        let mut filters = owned(&self.owner);
        filters.insert("type".into(), vec!["container".into()]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        let store = self.store.clone();
        let stream = self
            .docker
            .events(Some(options))
            .filter_map(move |event| std::future::ready(engine_event(event, store.as_deref())));
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

    async fn commit(&self, container: &str, reference: &str) -> Result<(), EngineError> {
        let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
        let options = CommitContainerOptionsBuilder::default().container(container).repo(repo).tag(tag).pause(false);
        self.docker.commit_container(options.build(), ContainerConfig::default()).await.map(|_| ()).map_err(error)
    }

    async fn tag_image(&self, source: &str, target: &str) -> Result<(), EngineError> {
        let (repo, tag) = target.rsplit_once(':').unwrap_or((target, "latest"));
        let options = TagImageOptionsBuilder::default().repo(repo).tag(tag).build();
        self.docker.tag_image(source, Some(options)).await.map_err(error)
    }

    async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        let options = RemoveImageOptionsBuilder::default().force(false).build();
        match self.docker.remove_image(reference, Some(options), None).await.map_err(error) {
            Err(EngineError::NotFound(_)) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn image_tags(&self, repository: &str) -> Result<Vec<String>, EngineError> {
        let filters = HashMap::from([("reference", vec![repository])]);
        let options = ListImagesOptionsBuilder::default().filters(&filters).build();
        let images = self.docker.list_images(Some(options)).await.map_err(error)?;
        Ok(tags_of(repository, images.into_iter().flat_map(|i| i.repo_tags)))
    }
}

/// The tags among `references` (`repository:tag`, with or without a registry) of `repository`.
pub(super) fn tags_of(repository: &str, references: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut tags: Vec<String> = references
        .into_iter()
        .filter_map(|r| {
            let (repo, tag) = r.rsplit_once(':')?;
            let repo = repo.rsplit_once('/').map_or(repo, |(_, name)| name);
            (repo == repository).then(|| tag.to_string())
        })
        .collect();
    tags.sort();
    tags.dedup();
    tags
}

#[cfg(test)]
mod tests {
    use bollard::models::EventActor;

    use super::*;

    fn die(labels: &[(&str, &str)]) -> Result<EventMessage, BollardError> {
        let attributes = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ok(EventMessage {
            action: Some("die".into()),
            actor: Some(EventActor { id: None, attributes: Some(attributes) }),
            time_nano: Some(7),
            ..Default::default()
        })
    }

    #[test]
    fn events_of_another_stores_sandboxes_are_not_seen() {
        let sandbox = (LABEL_SANDBOX, "sb-1");
        let seen = |event, store| engine_event(event, store).map(|e| e.unwrap().sandbox.to_string());
        assert_eq!(seen(die(&[sandbox, (LABEL_STORE, "s1")]), Some("s1")), Some("sb-1".to_string()));
        assert_eq!(seen(die(&[sandbox, (LABEL_STORE, "s2")]), Some("s1")), None);
        // Made before containers carried the store's identity: still its owner's.
        assert_eq!(seen(die(&[sandbox]), Some("s1")), Some("sb-1".to_string()));
        assert_eq!(seen(die(&[sandbox, (LABEL_STORE, "s2")]), None), Some("sb-1".to_string()));
    }
}
