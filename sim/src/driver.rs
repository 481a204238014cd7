//! The gateway's side of the simulated runtime: a real `Driver`, whose calls cross to the
//! runtime's host and may come back late or never.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::{RuntimeState, SandboxId, StartReply};
use berth_drivers::{Driver, DriverError, Launch, ListPage, WatchStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::runtime::{Answer, Call, DRIVER_TIMEOUT, Request};
use crate::world::World;

pub struct SimDriver {
    world: Arc<World>,
    calls: mpsc::UnboundedSender<Request>,
    /// The gateway whose driver this is.
    gateway: String,
}

impl SimDriver {
    pub fn new(world: Arc<World>, calls: mpsc::UnboundedSender<Request>, gateway: String) -> Arc<Self> {
        Arc::new(Self { world, calls, gateway })
    }

    async fn call(&self, call: Call) -> Result<Answer, DriverError> {
        let what = match &call {
            Call::Start(launch) => format!("start {} generation {}", launch.name, launch.generation),
            Call::Stop(id) => format!("stop {}", crate::world::lock(&self.world.runtime).name(id)),
            Call::Delete(id) => format!("delete {}", crate::world::lock(&self.world.runtime).name(id)),
            Call::Get(id) => format!("get {}", crate::world::lock(&self.world.runtime).name(id)),
            Call::List(..) => "list".to_string(),
            Call::Watch => "watch".to_string(),
            Call::SupervisorExited(..) => String::new(),
        };
        if matches!(call, Call::List(..) | Call::Watch) {
            self.world.check_reconciling(&self.gateway, &what);
        }
        self.world.event(self.gateway.clone(), "driver", what);
        let (tx, rx) = oneshot::channel();
        self.calls
            .send(Request { call, reply: tx })
            .map_err(|_| DriverError::Unavailable("the runtime is gone".to_string()))?;
        match tokio::time::timeout(DRIVER_TIMEOUT, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(DriverError::Unavailable("the runtime's reply was lost".to_string())),
            Err(_) => Err(DriverError::Unavailable("the runtime did not answer in time".to_string())),
        }
    }
}

fn unexpected() -> DriverError {
    DriverError::Failed("the runtime answered another call".to_string())
}

#[async_trait]
impl Driver for SimDriver {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        match self.call(Call::Start(Box::new(launch))).await? {
            Answer::Start(reply) => Ok(reply),
            _ => Err(unexpected()),
        }
    }

    async fn stop(&self, sandbox: &SandboxId, _grace: Duration) -> Result<RuntimeState, DriverError> {
        match self.call(Call::Stop(sandbox.clone())).await? {
            Answer::State(state) => Ok(state),
            _ => Err(unexpected()),
        }
    }

    async fn delete(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        match self.call(Call::Delete(sandbox.clone())).await? {
            Answer::Deleted => Ok(()),
            _ => Err(unexpected()),
        }
    }

    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        match self.call(Call::Get(sandbox.clone())).await? {
            Answer::State(state) => Ok(state),
            _ => Err(unexpected()),
        }
    }

    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError> {
        match self.call(Call::List(after.cloned(), limit)).await? {
            Answer::List(page) => Ok(page),
            _ => Err(unexpected()),
        }
    }

    async fn watch(&self) -> Result<WatchStream, DriverError> {
        match self.call(Call::Watch).await? {
            Answer::Watch(rx) => Ok(Box::pin(UnboundedReceiverStream::new(rx))),
            _ => Err(unexpected()),
        }
    }
}
