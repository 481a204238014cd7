//! The gateway's side of the simulated runtime: an [`Engine`] for the real container driver,
//! whose calls cross to the runtime's host and may fail, come back late or never.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::SandboxId;
use berth_drivers::container::{
    ContainerSpec, Engine, EngineError, EventStream, Inspection, Start, sandbox_of_container,
};
use berth_drivers::snapshot::Copying;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::runtime::{Answer, Call, DRIVER_TIMEOUT, Request};

pub struct SimEngine {
    calls: mpsc::UnboundedSender<Request>,
    /// The gateway this engine client belongs to.
    gateway: usize,
    /// The identity of the store the gateway is bound to.
    store: String,
}

impl SimEngine {
    pub fn new(calls: mpsc::UnboundedSender<Request>, gateway: usize, store: String) -> Self {
        Self { calls, gateway, store }
    }

    async fn call(&self, call: Call) -> Result<Answer, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.calls
            .send(Request { gateway: self.gateway, call, reply: tx })
            .map_err(|_| EngineError::Unreachable("the runtime is gone".to_string()))?;
        match tokio::time::timeout(DRIVER_TIMEOUT, rx).await {
            Ok(Ok(Answer::Failed(e))) => Err(e),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(EngineError::Unreachable("the runtime's reply was lost".to_string())),
            Err(_) => Err(EngineError::Unreachable("the runtime did not answer in time".to_string())),
        }
    }

    async fn done(&self, call: Call) -> Result<(), EngineError> {
        match self.call(call).await? {
            Answer::Done => Ok(()),
            _ => Err(unexpected()),
        }
    }
}

fn unexpected() -> EngineError {
    EngineError::Unreachable("the runtime answered another call".to_string())
}

fn sandbox(container: &str) -> Result<SandboxId, EngineError> {
    sandbox_of_container(container).ok_or_else(|| EngineError::NotFound(format!("No such container: {container}")))
}

#[async_trait]
impl Engine for SimEngine {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn owner(&self) -> &str {
        // Gateways sharing a data directory share an owner, as they do in production.
        "sim"
    }

    fn store(&self) -> Option<&str> {
        Some(&self.store)
    }

    fn cpus(&self) -> u64 {
        crate::world::HOST_CPUS
    }

    // A thread would make a run's order depend on the host's scheduler.
    fn copying(&self) -> Copying {
        Copying::Inline
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<(), EngineError> {
        self.done(Call::Create(Box::new(spec.clone()))).await
    }

    async fn start(&self, container: &str) -> Result<Start, EngineError> {
        match self.call(Call::Start(sandbox(container)?)).await? {
            Answer::Started(start) => Ok(start),
            _ => Err(unexpected()),
        }
    }

    async fn stop(&self, container: &str, _grace: Duration) -> Result<(), EngineError> {
        self.done(Call::Stop(sandbox(container)?)).await
    }

    async fn pause(&self, container: &str) -> Result<(), EngineError> {
        self.done(Call::Freeze(sandbox(container)?, true)).await
    }

    async fn unpause(&self, container: &str) -> Result<(), EngineError> {
        self.done(Call::Freeze(sandbox(container)?, false)).await
    }

    /// The simulated runtime checkpoints as rootful Podman with a working CRIU would: the
    /// real runtimes here cannot (see the README), so this is where the driver's checkpoint
    /// path is tried.
    fn checkpoints(&self) -> Result<(), String> {
        Ok(())
    }

    async fn checkpoint(&self, container: &str) -> Result<(), EngineError> {
        self.done(Call::Checkpoint(sandbox(container)?, true)).await
    }

    async fn restore(&self, container: &str) -> Result<(), EngineError> {
        self.done(Call::Checkpoint(sandbox(container)?, false)).await
    }

    async fn remove(&self, container: &str) -> Result<(), EngineError> {
        self.done(Call::Remove(sandbox(container)?)).await
    }

    async fn create_volume(&self, name: &str, _labels: &BTreeMap<String, String>) -> Result<(), EngineError> {
        self.done(Call::CreateVolume(name.to_string())).await
    }

    async fn volume_path(&self, name: &str) -> Result<Option<PathBuf>, EngineError> {
        match self.call(Call::VolumePath(name.to_string())).await? {
            Answer::Path(path) => Ok(path),
            _ => Err(unexpected()),
        }
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.done(Call::RemoveVolume(name.to_string())).await
    }

    async fn inspect(&self, container: &str) -> Result<Option<Inspection>, EngineError> {
        match self.call(Call::Inspect(sandbox(container)?)).await? {
            Answer::Inspection(inspection) => Ok(inspection),
            _ => Err(unexpected()),
        }
    }

    async fn list(&self) -> Result<Vec<SandboxId>, EngineError> {
        match self.call(Call::List).await? {
            Answer::Sandboxes(ids) => Ok(ids),
            _ => Err(unexpected()),
        }
    }

    async fn list_volumes(&self) -> Result<Vec<String>, EngineError> {
        match self.call(Call::ListVolumes).await? {
            Answer::Volumes(names) => Ok(names),
            _ => Err(unexpected()),
        }
    }

    async fn events(&self) -> Result<EventStream, EngineError> {
        match self.call(Call::Events).await? {
            Answer::Events(rx) => Ok(Box::pin(UnboundedReceiverStream::new(rx))),
            _ => Err(unexpected()),
        }
    }

    async fn import_image(&self, reference: &str, _rootfs: Vec<u8>) -> Result<(), EngineError> {
        Err(EngineError::Refused(format!("the simulated runtime runs no images; {reference} was not imported")))
    }

    async fn commit(&self, container: &str, reference: &str) -> Result<(), EngineError> {
        self.done(Call::Commit(sandbox(container)?, reference.to_string())).await
    }

    async fn tag_image(&self, source: &str, target: &str) -> Result<(), EngineError> {
        self.done(Call::Tag(source.to_string(), target.to_string())).await
    }

    async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        self.done(Call::RemoveImage(reference.to_string())).await
    }

    async fn image_tags(&self, repository: &str) -> Result<Vec<String>, EngineError> {
        match self.call(Call::ImageTags(repository.to_string())).await? {
            Answer::Volumes(tags) => Ok(tags),
            _ => Err(unexpected()),
        }
    }
}
