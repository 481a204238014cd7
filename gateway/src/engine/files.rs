//! Where the files API reads and writes a sandbox's files (DESIGN 8.3): its workspace, through
//! the driver, in any phase but Deleting.

use std::path::PathBuf;

use berth_core::{Kind, PhaseKind};
use berth_drivers::files::Limits;

use super::Engine;
use crate::error::ApiError;

impl Engine {
    /// The workspace of the sandbox named `name`.
    pub async fn workspace(&self, name: &str) -> Result<PathBuf, ApiError> {
        let not_found = || berth_core::Error::NotFound { kind: Kind::Sandbox, name: name.to_string() };
        let sandbox = self.inner.store.sandbox_by_name(name).await?.ok_or_else(not_found)?;
        if sandbox.phase.kind() == PhaseKind::Deleting {
            let phase = PhaseKind::Deleting;
            return Err(
                berth_core::Error::WrongPhase { sandbox: name.to_string(), action: "copy files of", phase }.into()
            );
        }
        Ok(self.inner.driver.workspace(&sandbox.id).await?)
    }

    pub fn file_limits(&self) -> Limits {
        self.inner.settings.files
    }
}
