//! Podman, through its libpod API (podman-api).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::limits::{CPU_PERIOD_US, ResourceLimits, cfs_quota_us};
use berth_core::{SandboxId, Timestamp};
use futures_util::StreamExt;
use podman_api::Podman;
use podman_api::models::{ContainerMount, LinuxCpu, LinuxMemory, LinuxPids, LinuxResources, NamedVolume, Namespace};
use podman_api::opts::{
    ContainerCheckpointOpts, ContainerCommitOpts, ContainerCreateOpts, ContainerDeleteOpts, ContainerListFilter,
    ContainerListOpts, ContainerRestoreOpts, ContainerStopOpts, EventsOpts, ImageImportOpts, ImageListFilter,
    ImageListOpts, ImageTagOpts, VolumeCreateOpts, VolumeListFilter, VolumeListOpts,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    ContainerSpec, Engine, EngineError, EngineEvent, EventStream, Inspection, LABEL_OWNER, LABEL_SANDBOX, LABEL_STORE,
    Start, Status, of_store,
};

pub struct PodmanEngine {
    podman: Podman,
    owner: String,
    store: Option<String>,
    cpus: u64,
    /// Why this Podman cannot checkpoint, if it cannot (found at connect).
    no_checkpoints: Option<String>,
}

fn error(e: podman_api::Error) -> EngineError {
    match e {
        podman_api::Error::Fault { code, message } => fault(code.as_u16(), message),
        other => EngineError::Unreachable(other.to_string()),
    }
}

/// What an HTTP error from Podman means.
fn fault(code: u16, message: String) -> EngineError {
    // A container removed while Podman looks it up is a 500 from its database ("no container
    // with ID … found in database", "… does not exist in database"): it is absent, and reporting
    // the runtime unreachable would fail a whole reconcile sweep over one vanished container.
    let vanished =
        code == 500 && (message.contains("does not exist in database") || message.contains("found in database"));
    if code == 404 || vanished {
        EngineError::NotFound(message)
    } else if (400..500).contains(&code) {
        EngineError::Refused(message)
    } else {
        EngineError::Unreachable(format!("{code}: {message}"))
    }
}

/// The spec's limits as the OCI runtime takes them (what `podman run --cpus --memory
/// --memory-swap --pids-limit` sends).
fn resources(limits: &ResourceLimits) -> LinuxResources {
    let cpu = limits.cpu_millis.map(|millis| LinuxCpu {
        cpus: None,
        mems: None,
        period: Some(CPU_PERIOD_US),
        quota: Some(i64::try_from(cfs_quota_us(millis)).unwrap_or(i64::MAX)),
        realtime_period: None,
        realtime_runtime: None,
        shares: None,
    });
    let memory = limits.memory_bytes.map(|bytes| {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        LinuxMemory {
            disable_oom_killer: None,
            kernel: None,
            kernel_tcp: None,
            limit: Some(bytes),
            reservation: None,
            // Memory and swap together: no swap beyond the limit.
            swap: Some(bytes),
            swappiness: None,
            use_hierarchy: None,
        }
    });
    LinuxResources {
        block_io: None,
        cpu,
        devices: None,
        hugepage_limits: None,
        memory,
        network: None,
        pids: limits.pids.map(|n| LinuxPids { limit: Some(i64::try_from(n).unwrap_or(i64::MAX)) }),
        rdma: None,
        unified: None,
    }
}

/// What `criu check` (the check Podman's own `podman info` leaves out) says is wrong on this
/// host, if anything: its errors, or why it could not run. Podman checkpoints
/// through CRIU on the host it runs on, which is this one (it is reached by a local socket).
async fn criu_fails() -> Option<String> {
    let output = match tokio::process::Command::new("criu").arg("check").output().await {
        Ok(output) => output,
        Err(e) => return Some(format!("`criu check` could not run ({e}): install Debian's criu")),
    };
    if output.status.success() {
        return None;
    }
    let said = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    // Its errors without their source locations; its helpers' exit statuses say nothing more.
    let errors: Vec<&str> = said
        .lines()
        .filter_map(|l| l.split_once("): ").map(|(_, e)| e.trim()))
        .filter(|e| !e.starts_with("exited, status="))
        .collect();
    let why = if errors.is_empty() { said.trim().to_string() } else { errors.join("; ") };
    Some(format!("`criu check` fails on this host ({}): {why}", output.status))
}

fn nanos(t: &chrono::DateTime<chrono::Utc>) -> Option<Timestamp> {
    t.timestamp_nanos_opt().map(Timestamp::from_unix_nanos).filter(|t| t.0 > 0)
}

impl PodmanEngine {
    pub async fn connect(socket: &str, owner: &str) -> Result<Self, EngineError> {
        let podman = Podman::unix(socket);
        podman.ping().await.map_err(error)?;
        let info = podman.info().await.map_err(error)?;
        let host = info.host.as_ref();
        let cpus = host.and_then(|h| h.cpus).and_then(|n| u64::try_from(n).ok()).unwrap_or(1).max(1);
        let rootless = host.and_then(|h| h.security.as_ref()).and_then(|s| s.rootless).unwrap_or(true);
        let no_checkpoints = if rootless {
            Some("this Podman runs rootless, and CRIU checkpoints only as root".to_string())
        } else {
            criu_fails().await
        };
        Ok(Self { podman, owner: owner.to_string(), store: None, cpus, no_checkpoints })
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
impl Engine for PodmanEngine {
    fn name(&self) -> &'static str {
        "podman"
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
        let volumes = spec.volumes.iter().map(|v| NamedVolume {
            dest: Some(v.target.clone()),
            name: Some(v.name.clone()),
            is_anonymous: None,
            options: Some(vec![if v.read_only { "ro" } else { "rw" }.into()]),
        });
        let opts = ContainerCreateOpts::builder()
            .name(&spec.name)
            .image(&spec.image)
            .entrypoint(spec.entrypoint.clone())
            .command(spec.command.clone())
            .env(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .labels(spec.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .mounts(mounts)
            .volumes(volumes)
            .work_dir(&spec.workdir)
            .net_namespace(Namespace { nsmode: Some("none".into()), value: None })
            .init(true)
            // The host opens what the sandbox leaves in its workspace and logs directory: never
            // a device node it made.
            .drop_capabilities([super::NO_DEVICE_NODES])
            .stop_timeout(spec.stop_grace.as_secs().max(1))
            .resource_limits(resources(&spec.limits))
            .build();
        self.podman.containers().create(&opts).await.map(|_| ()).map_err(error)
    }

    async fn start(&self, container: &str) -> Result<Start, EngineError> {
        match self.podman.containers().get(container).start(None).await.map_err(error) {
            Ok(()) => Ok(Start::Began),
            // 304: already running.
            Err(EngineError::Unreachable(m)) if m.contains("304") => Ok(Start::WasRunning),
            Err(e) => Err(e),
        }
    }

    async fn stop(&self, container: &str, grace: Duration) -> Result<(), EngineError> {
        let opts = ContainerStopOpts::builder().timeout(grace.as_secs().max(1) as usize).build();
        match self.podman.containers().get(container).stop(&opts).await.map_err(error) {
            Err(EngineError::Unreachable(m)) if m.contains("304") => Ok(()),
            other => other,
        }
    }

    async fn pause(&self, container: &str) -> Result<(), EngineError> {
        self.podman.containers().get(container).pause().await.map_err(error)
    }

    fn checkpoints(&self) -> Result<(), String> {
        self.no_checkpoints.clone().map_or(Ok(()), Err)
    }

    async fn checkpoint(&self, container: &str) -> Result<(), EngineError> {
        // Kept on disk with the container (not exported), its processes ended: a restore
        // brings the run back, a reboot in between included.
        let opts = ContainerCheckpointOpts::builder().leave_running(false).build();
        self.podman.containers().get(container).checkpoint(&opts).await.map(drop).map_err(error)
    }

    async fn restore(&self, container: &str) -> Result<(), EngineError> {
        let opts = ContainerRestoreOpts::builder().build();
        self.podman.containers().get(container).restore(&opts).await.map(drop).map_err(error)
    }

    async fn unpause(&self, container: &str) -> Result<(), EngineError> {
        self.podman.containers().get(container).unpause().await.map_err(error)
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

    async fn volume_path(&self, name: &str) -> Result<Option<PathBuf>, EngineError> {
        match self.podman.volumes().get(name).inspect().await.map_err(error) {
            Ok(volume) => Ok(Some(PathBuf::from(volume.mountpoint))),
            Err(EngineError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
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
            Some("paused") => Status::Paused,
            Some("created" | "configured" | "initialized") => Status::Created,
            Some("exited" | "stopped") => Status::Exited,
            _ => Status::Other,
        };
        Ok(Some(Inspection {
            status,
            started_at: state.started_at.as_ref().and_then(nanos),
            finished_at: state.finished_at.as_ref().and_then(nanos),
            exit_code: state.exit_code.unwrap_or_default(),
            out_of_memory: state.oom_killed.unwrap_or(false),
            checkpointed: state.checkpointed.unwrap_or(false),
            restored: state.restored.unwrap_or(false),
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
            .filter(|c| self.ours(c.labels.as_ref()))
            .filter_map(|c| c.labels.and_then(|l| l.get(LABEL_SANDBOX).cloned()))
            .map(SandboxId::new)
            .collect())
    }

    async fn list_volumes(&self) -> Result<Vec<String>, EngineError> {
        let opts = VolumeListOpts::builder()
            .filter([VolumeListFilter::LabelKeyVal(LABEL_OWNER.into(), self.owner.clone())])
            .build();
        let volumes = self.podman.volumes().list(&opts).await.map_err(error)?;
        Ok(volumes.into_iter().filter(|v| self.ours(Some(&v.labels))).map(|v| v.name).collect())
    }

    async fn events(&self) -> Result<EventStream, EngineError> {
        // The client's event stream borrows it: a task owns a client and forwards the events.
        let podman = self.podman.clone();
        let owner = self.owner.clone();
        let store = self.store.clone();
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
                        let attributes = &event.actor.attributes;
                        if !of_store(attributes.get(LABEL_STORE).map(String::as_str), store.as_deref()) {
                            continue;
                        }
                        let Some(sandbox) = attributes.get(LABEL_SANDBOX).cloned() else { continue };
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

    async fn commit(&self, container: &str, reference: &str) -> Result<(), EngineError> {
        let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
        let opts = ContainerCommitOpts::builder().repo(repo).tag(tag).pause(false).build();
        self.podman.containers().get(container).commit(&opts).await.map_err(error)
    }

    async fn tag_image(&self, source: &str, target: &str) -> Result<(), EngineError> {
        let (repo, tag) = target.rsplit_once(':').unwrap_or((target, "latest"));
        let opts = ImageTagOpts::builder().repo(repo).tag(tag).build();
        self.podman.images().get(source).tag(&opts).await.map_err(error)
    }

    async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        match self.podman.images().get(reference).delete().await.map_err(error) {
            Err(EngineError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    async fn image_tags(&self, repository: &str) -> Result<Vec<String>, EngineError> {
        let filter = ImageListFilter::Reference(repository.to_string().into(), None);
        let opts = ImageListOpts::builder().filter([filter]).build();
        let images = self.podman.images().list(&opts).await.map_err(error)?;
        Ok(super::docker::tags_of(repository, images.into_iter().flat_map(|i| i.repo_tags.unwrap_or_default())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_gone_from_podmans_database_is_absent_not_an_unreachable_runtime() {
        for message in [
            "no container with ID 3f2a found in database: no such container",
            "container 3f2a does not exist in database: no such container",
        ] {
            assert_eq!(fault(500, message.into()), EngineError::NotFound(message.into()));
        }
        assert_eq!(fault(404, "no such container".into()), EngineError::NotFound("no such container".into()));
        assert_eq!(fault(409, "name in use".into()), EngineError::Refused("name in use".into()));
        assert!(matches!(fault(500, "runtime error: crun failed".into()), EngineError::Unreachable(_)));
        assert!(matches!(fault(503, "does not exist in database".into()), EngineError::Unreachable(_)));
    }
}
