//! Where the files API reads and writes a sandbox's files (DESIGN 8.3): its workspace, through
//! the driver, in any phase but Deleting.

use std::path::PathBuf;

use berth_core::PhaseKind;
use berth_drivers::files::Limits;

use super::Engine;
use crate::error::ApiError;

/// What the files API reaches: a sandbox's workspace, and the bounds on what it moves.
#[derive(Clone)]
pub struct Files {
    engine: Engine,
}

impl Files {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The workspace of the sandbox named `name`, when its run is placed on this gateway's node.
    pub async fn workspace(&self, name: &str) -> Result<PathBuf, ApiError> {
        let sandbox = self.engine.sandbox_named(name).await?;
        if sandbox.phase.kind() == PhaseKind::Deleting {
            let phase = PhaseKind::Deleting;
            return Err(
                berth_core::Error::WrongPhase { sandbox: name.to_string(), action: "copy files of", phase }.into()
            );
        }
        if !self.engine.runs_here(&sandbox)
            && let Some(placed) = sandbox.placement
        {
            return Err(ApiError::Elsewhere { sandbox: name.to_string(), node: placed.node });
        }
        Ok(self.engine.inner.driver.workspace(&sandbox.id).await?)
    }

    pub fn limits(&self) -> Limits {
        self.engine.inner.settings.files
    }
}
