//! The lock a driver holds while it acts on one sandbox: its own in-process lock, which
//! serializes one gateway's tasks, then a file lock at `<root>/.locks/<sandbox id>`, which keeps
//! out the other gateways sharing the driver's root (several gateways on one host). Only a start
//! makes the lock file, so looking at a sandbox no start made leaves nothing behind; a delete
//! removes it last, still holding it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use berth_core::SandboxId;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::{DriverError, io};

/// The folder under a driver's root that holds the lock files (a dot keeps it apart from
/// sandbox ids).
pub const LOCKS_DIR: &str = ".locks";
/// How often a driver waiting for another gateway's lock on a sandbox looks again.
const POLL: Duration = Duration::from_millis(5);

pub struct SandboxLocks {
    dir: PathBuf,
    local: SyncMutex<BTreeMap<SandboxId, Arc<Mutex<()>>>>,
}

/// Held while acting on a sandbox.
pub struct SandboxGuard {
    /// `None` for a sandbox no start has made (nothing to keep others from).
    _file: Option<File>,
    _local: OwnedMutexGuard<()>,
}

impl SandboxLocks {
    /// The locks of the sandboxes under `root`.
    pub fn new(root: PathBuf) -> Self {
        Self { dir: root.join(LOCKS_DIR), local: SyncMutex::default() }
    }

    fn local(&self, sandbox: &SandboxId) -> Arc<Mutex<()>> {
        let mut locks = self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(sandbox.clone()).or_default().clone()
    }

    fn path(&self, sandbox: &SandboxId) -> PathBuf {
        self.dir.join(sandbox.as_str())
    }

    fn file(&self, sandbox: &SandboxId, create: bool) -> Result<Option<File>, DriverError> {
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(|e| io(&format!("creating {}", self.dir.display()), e))?;
        }
        let path = self.path(sandbox);
        match std::fs::OpenOptions::new().create(create).truncate(false).write(true).mode(0o600).open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(io(&format!("opening {}", path.display()), e)),
        }
    }

    /// Waits for the sandbox's lock; `create` (a start) makes its lock file if it has none.
    pub async fn lock(&self, sandbox: &SandboxId, create: bool) -> Result<SandboxGuard, DriverError> {
        let local = self.local(sandbox).lock_owned().await;
        let file = self.file(sandbox, create)?;
        if let Some(file) = &file {
            loop {
                match file.try_lock() {
                    Ok(()) => break,
                    Err(std::fs::TryLockError::WouldBlock) => tokio::time::sleep(POLL).await,
                    Err(std::fs::TryLockError::Error(e)) => return Err(io("locking the sandbox", e)),
                }
            }
        }
        Ok(SandboxGuard { _file: file, _local: local })
    }

    /// The sandbox's lock if nobody holds it.
    pub fn try_lock(&self, sandbox: &SandboxId) -> Option<SandboxGuard> {
        let local = self.local(sandbox).try_lock_owned().ok()?;
        let file = self.file(sandbox, false).ok()?;
        if let Some(file) = &file {
            file.try_lock().ok()?;
        }
        Some(SandboxGuard { _file: file, _local: local })
    }

    /// Removes the sandbox's lock file, the last step of its delete (the caller holds the lock):
    /// whoever waits on it then acts on a deleted sandbox, which finds nothing.
    pub fn remove(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        match std::fs::remove_file(self.path(sandbox)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing the sandbox's lock", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two gateways' drivers on one root: each has its own locks over the same files.
    fn two_gateways() -> (tempfile::TempDir, SandboxLocks, SandboxLocks) {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (SandboxLocks::new(root.path().into()), SandboxLocks::new(root.path().into()));
        (root, a, b)
    }

    #[tokio::test]
    async fn a_sandbox_started_by_one_gateway_is_locked_for_the_other() {
        let (_root, a, b) = two_gateways();
        let id = SandboxId::new("sb");
        let held = a.lock(&id, true).await.unwrap();
        assert!(b.try_lock(&id).is_none(), "the other gateway got a held lock");
        let waiting = tokio::spawn(async move { b.lock(&SandboxId::new("sb"), false).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the other gateway did not wait");
        drop(held);
        waiting.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn looking_at_a_sandbox_no_start_made_leaves_nothing_and_delete_removes_the_lock() {
        let (root, a, b) = two_gateways();
        let id = SandboxId::new("sb");
        drop(a.lock(&id, false).await.unwrap());
        assert!(!root.path().join(LOCKS_DIR).exists(), "a look made the lock folder");
        let held = a.lock(&id, true).await.unwrap();
        assert!(root.path().join(LOCKS_DIR).join("sb").exists());
        a.remove(&id).unwrap();
        drop(held);
        assert!(!root.path().join(LOCKS_DIR).join("sb").exists());
        assert!(b.try_lock(&id).is_some());
        a.remove(&id).unwrap();
    }
}
