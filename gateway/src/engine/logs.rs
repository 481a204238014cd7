//! Which run's logs a read is of (DESIGN 8.2), and reading them through the driver.

use berth_core::{PhaseKind, SandboxId};
use berth_drivers::logs::{KEPT_GENERATIONS, Log, Read};

use super::Engine;
use crate::error::ApiError;

/// One generation's logs, as a reader sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogsOf {
    pub sandbox: SandboxId,
    pub generation: u64,
    /// The run has ended: what it wrote is all there is.
    pub over: bool,
}

/// What the logs API reaches: which run's logs a read is of, and reading them.
#[derive(Clone)]
pub struct Logs {
    engine: Engine,
}

impl Logs {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The logs of `generation` (0: the current one) of the sandbox named `name`, as its record
    /// stands now.
    pub async fn of(&self, name: &str, generation: u64) -> Result<LogsOf, ApiError> {
        let sandbox = self.engine.sandbox_named(name).await?;
        let current = sandbox.generation;
        let generation = if generation == 0 { current } else { generation };
        if generation > current {
            let reason = format!("sandbox '{name}' has run generations up to {current}");
            return Err(berth_core::Error::Invalid { field: "generation".into(), reason }.into());
        }
        if generation + KEPT_GENERATIONS <= current {
            let reason = format!(
                "the logs of generation {generation} are no longer kept (the newest {KEPT_GENERATIONS} generations' are: {} to {current})",
                current + 1 - KEPT_GENERATIONS
            );
            return Err(berth_core::Error::Invalid { field: "generation".into(), reason }.into());
        }
        let running = matches!(
            sandbox.phase.kind(),
            PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready | PhaseKind::Stopping
        );
        Ok(LogsOf { sandbox: sandbox.id, generation, over: generation < current || !running })
    }

    pub async fn read(&self, of: &LogsOf, from: u64, max: usize) -> Result<Read, ApiError> {
        let log = Log::Main { generation: of.generation };
        Ok(self.engine.inner.driver.logs(&of.sandbox, &log, from, max, of.over).await?)
    }
}
