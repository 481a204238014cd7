//! Tombstones of deleted sandboxes. A start can reach a driver after its sandbox's delete: the
//! effect was re-checked against the record just before the delete was decided, then held up (a
//! slow store read, a runtime that answered late) while another gateway deleted the sandbox.
//! Starting then would make resources no record stands for, and a volume or state directory
//! without a container is something no sweep ever finds again. So a delete leaves a tombstone,
//! one empty file under `<root>/.deleted/`, before it removes anything, and a start finding one
//! makes nothing. Sandbox ids are never reused, so a tombstone never stands in a new sandbox's way.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use berth_core::{SandboxId, StartReply};

use crate::{DriverError, io};

/// The folder under a driver's root that holds the tombstones (a dot keeps it apart from
/// sandbox ids).
pub const TOMBSTONES_DIR: &str = ".deleted";

pub struct Tombstones {
    dir: PathBuf,
}

impl Tombstones {
    /// The tombstones of the sandboxes under `root`.
    pub fn new(root: &Path) -> Self {
        Self { dir: root.join(TOMBSTONES_DIR) }
    }

    /// Marks `sandbox` deleted, for good.
    pub fn mark(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| io(&format!("creating {}", self.dir.display()), e))?;
        let path = self.dir.join(sandbox.as_str());
        std::fs::write(&path, b"").map_err(|e| io(&format!("writing {}", path.display()), e))
    }

    /// Whether `sandbox` was deleted.
    pub fn holds(&self, sandbox: &SandboxId) -> Result<bool, DriverError> {
        let path = self.dir.join(sandbox.as_str());
        path.try_exists().map_err(|e| io(&format!("reading {}", path.display()), e))
    }
}

/// The reply to a start of a deleted sandbox.
pub fn deleted() -> StartReply {
    StartReply::Failed { message: "the sandbox was deleted".to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_sandbox_stays_deleted_and_others_are_untouched() {
        let root = tempfile::tempdir().unwrap();
        let tombstones = Tombstones::new(root.path());
        let (gone, other) = (SandboxId::new("gone"), SandboxId::new("other"));
        assert!(!tombstones.holds(&gone).unwrap());
        tombstones.mark(&gone).unwrap();
        tombstones.mark(&gone).unwrap();
        assert!(tombstones.holds(&gone).unwrap());
        assert!(!tombstones.holds(&other).unwrap());
        assert!(root.path().join(TOMBSTONES_DIR).join("gone").exists());
    }
}
