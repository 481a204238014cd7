//! Podman, through its libpod API (podman-api).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::{SandboxId, Timestamp};
use futures_util::StreamExt;
use podman_api::Podman;
use podman_api::models::{ContainerMount, NamedVolume, Namespace};
use podman_api::opts::{
    ContainerCreateOpts, ContainerDeleteOpts, ContainerListFilter, ContainerListOpts, ContainerStopOpts, EventsOpts,
    ImageImportOpts, VolumeCreateOpts, VolumeListFilter, VolumeListOpts,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    ContainerSpec, Engine, EngineError, EngineEvent, EventStream, Inspection, LABEL_OWNER, LABEL_SANDBOX, Status,
};

pub struct PodmanEngine {
    podman: Podman,
    owner: String,
}

fn error(e: podman_api::Error) -> EngineError {
    match e {
        podman_api::Error::Fault { code, message } if code.as_u16() == 404 => EngineError::NotFound(message),
        podman_api::Error::Fault { code, message } if code.is_client_error() => EngineError::Refused(message),
        other => EngineError::Unreachable(other.to_string()),
    }
}

fn nanos(t: &chrono::DateTime<chrono::Utc>) -> Option<Timestamp> {
    t.timestamp_nanos_opt().map(Timestamp::from_unix_nanos).filter(|t| t.0 > 0)
}

impl PodmanEngine {
    pub async fn connect(socket: &str, owner: &str) -> Result<Self, EngineError> {
        let podman = Podman::unix(socket);
        podman.ping().await.map_err(error)?;
        Ok(Self { podman, owner: owner.to_string() })
    }
}

#[async_trait]
impl Engine for PodmanEngine {
    fn name(&self) -> &'static str {
        "podman"
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<(), EngineError> {
        let mounts: Vec<ContainerMount> = spec
            .binds
            .iter()
            .map(|b| ContainerMount {
                destination: Some(b.target.clone()),
                source: Some(b.source.display().to_string()),
                _type: Some("bind".into()),
                options: Some(vec![if b.read_only { "ro" } else { "rw" }.into(), "rbind".into()]),
                uid_mappings: None,
                gid_mappings: None,
            })
            .collect();
        let volume = NamedVolume {
            dest: Some(spec.volume.1.clone()),
            name: Some(spec.volume.0.clone()),
            is_anonymous: None,
            options: None,
        };
        let opts = ContainerCreateOpts::builder()
            .name(&spec.name)
            .image(&spec.image)
            .entrypoint(spec.entrypoint.clone())
            .command(spec.command.clone())
            .env(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .labels(spec.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .mounts(mounts)
            .volumes([volume])
            .work_dir(&spec.workdir)
            .net_namespace(Namespace { nsmode: Some("none".into()), value: None })
            .init(true)
            .stop_timeout(spec.stop_grace.as_secs().max(1))
            .build();
        self.podman.containers().create(&opts).await.map(|_| ()).map_err(error)
    }

    async fn start(&self, container: &str) -> Result<(), EngineError> {
        match self.podman.containers().get(container).start(None).await.map_err(error) {
            // 304: already running.
            Err(EngineError::Unreachable(m)) if m.contains("304") => Ok(()),
            other => other,
        }
    }

    async fn stop(&self, container: &str, grace: Duration) -> Result<(), EngineError> {
        let opts = ContainerStopOpts::builder().timeout(grace.as_secs().max(1) as usize).build();
        match self.podman.containers().get(container).stop(&opts).await.map_err(error) {
            Err(EngineError::Unreachable(m)) if m.contains("304") => Ok(()),
            other => other,
        }
    }

    async fn remove(&self, container: &str) -> Result<(), EngineError> {
        let opts = ContainerDeleteOpts::builder().force(true).volumes(true).build();
        match self.podman.containers().get(container).delete(&opts).await.map_err(error) {
            Err(EngineError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    async fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<(), EngineError> {
        if self.podman.volumes().get(name).exists().await.map_err(error)? {
            return Ok(());
        }
        let opts =
            VolumeCreateOpts::builder().name(name).labels(labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))).build();
        self.podman.volumes().create(&opts).await.map(|_| ()).map_err(error)
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        match self.podman.volumes().get(name).delete().await.map_err(error) {
            Err(EngineError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    async fn inspect(&self, container: &str) -> Result<Option<Inspection>, EngineError> {
        let response = match self.podman.containers().get(container).inspect().await.map_err(error) {
            Ok(r) => r,
            Err(EngineError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(state) = response.state else {
            return Err(EngineError::Unreachable(format!("{container}: inspected without a state")));
        };
        let status = match state.status.as_deref() {
            Some("running") => Status::Running,
            Some("created" | "configured" | "initialized") => Status::Created,
            Some("exited" | "stopped") => Status::Exited,
            _ => Status::Other,
        };
        Ok(Some(Inspection {
            status,
            started_at: state.started_at.as_ref().and_then(nanos),
            finished_at: state.finished_at.as_ref().and_then(nanos),
            exit_code: state.exit_code.unwrap_or_default(),
        }))
    }

    async fn list(&self) -> Result<Vec<SandboxId>, EngineError> {
        let opts = ContainerListOpts::builder()
            .all(true)
            .filter([ContainerListFilter::LabelKeyVal(LABEL_OWNER.into(), self.owner.clone())])
            .build();
        let containers = self.podman.containers().list(&opts).await.map_err(error)?;
        Ok(containers
            .into_iter()
            .filter_map(|c| c.labels.and_then(|l| l.get(LABEL_SANDBOX).cloned()))
            .map(SandboxId::new)
            .collect())
    }

    async fn list_volumes(&self) -> Result<Vec<String>, EngineError> {
        let opts = VolumeListOpts::builder()
            .filter([VolumeListFilter::LabelKeyVal(LABEL_OWNER.into(), self.owner.clone())])
            .build();
        let volumes = self.podman.volumes().list(&opts).await.map_err(error)?;
        Ok(volumes.into_iter().map(|v| v.name).collect())
    }

    async fn events(&self) -> Result<EventStream, EngineError> {
        // The client's event stream borrows it: a task owns a client and forwards the events.
        let podman = self.podman.clone();
        let owner = self.owner.clone();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let opts = EventsOpts::builder()
                .stream(true)
                .filters([
                    ("type".to_string(), vec!["container".to_string()]),
                    ("label".to_string(), vec![format!("{LABEL_OWNER}={owner}")]),
                ])
                .build();
            let mut events = podman.events(&opts);
            while let Some(event) = events.next().await {
                let item = match event {
                    Err(e) => Err(error(e)),
                    Ok(event) => {
                        // `died` and `remove` are reliable; `stop` is not emitted by every path.
                        let removed = match event.action.as_str() {
                            "remove" => true,
                            "start" | "died" | "create" | "stop" => false,
                            _ => continue,
                        };
                        let Some(sandbox) = event.actor.attributes.get(LABEL_SANDBOX).cloned() else { continue };
                        let at = nanos(&event.time_nano).unwrap_or_default();
                        Ok(EngineEvent { sandbox: SandboxId::new(sandbox), removed, at })
                    }
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }

    async fn import_image(&self, reference: &str, rootfs: Vec<u8>) -> Result<(), EngineError> {
        let opts = ImageImportOpts::builder().reference(reference).build();
        self.podman.images().import(&opts, rootfs).await.map(|_| ()).map_err(error)
    }
}
