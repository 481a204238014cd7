//! What a driver keeps of a snapshot on this host (DESIGN 12.2): its source's workspace as one
//! tar archive, and how a sandbox made from it gets those files.
//!
//! ```text
//! <root>/.snapshots/<snapshot id>/workspace.tar          the workspace as it was copied
//! <root>/.snapshots/<snapshot id>/workspace.sum          its size and the sum of its files
//! <root>/.snapshots/<snapshot id>/workspace.tar.partial  a copy being written
//! <root>/<sandbox id>/seeded                             the sandbox's workspace has its snapshot's files
//! ```
//!
//! An archive is written aside and renamed into place, so one that exists is whole; taking a
//! snapshot again (a re-driven copy) writes it anew. The archive is packed and unpacked by
//! [`crate::files`], the files API's own code: nothing in a workspace is trusted, whichever
//! sandbox wrote it. A seed unpacks into an emptied workspace and only then records `seeded`,
//! so a start cut short seeds again from the start, and a seeded workspace is never seeded over.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use berth_core::SnapshotId;
use sha2::{Digest, Sha256};

use crate::files::{self, FileSum, FilesError};
use crate::state_file::{read_json, write_json};
use crate::{DriverError, io, removed};

/// The archive's file name in a snapshot's directory.
const ARCHIVE: &str = "workspace.tar";
/// Its size and sum, beside it.
const SUM: &str = "workspace.sum";
/// The marker a seeded sandbox's directory holds.
const SEEDED: &str = "seeded";

/// Bounds a snapshot's archive lives within: a workspace any run could write.
const LIMITS: files::Limits = files::Limits { max_bytes: 1 << 40, max_entries: 10_000_000 };

/// What a copy kept: its archive's size in bytes, and the sum of its files ([`digest`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kept {
    pub size_bytes: u64,
    pub sha256: String,
}

/// Where a copy's work (packing a workspace, unpacking a snapshot into one: seconds for a large
/// workspace) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copying {
    /// On a blocking thread, so that no async worker of the gateway waits on the disk meanwhile.
    Blocking,
    /// In place: the simulator's, where a thread would make a run's order depend on the host's
    /// scheduler.
    Inline,
}

impl Copying {
    async fn run<T: Send + 'static>(self, work: impl FnOnce() -> T + Send + 'static) -> T {
        match self {
            Copying::Inline => work(),
            Copying::Blocking => match tokio::task::spawn_blocking(work).await {
                Ok(done) => done,
                // A blocking task is never cancelled: only its panic ends it early.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            },
        }
    }
}

/// A driver's snapshots, under its root.
#[derive(Clone, Debug)]
pub struct Snapshots {
    root: PathBuf,
    copying: Copying,
}

fn files_error(context: &str, e: FilesError) -> DriverError {
    match e {
        // The workspace is the sandbox's: what it holds can be refused, and that is final.
        FilesError::Invalid { .. } | FilesError::TooLarge(_) | FilesError::NotFound(_) => {
            DriverError::Failed(format!("{context}: {e}"))
        }
        FilesError::Io(_) => DriverError::Unavailable(format!("{context}: {e}")),
    }
}

/// A copy's write that failed: for want of space the copy fails (and keeps nothing), as one of
/// a workspace too large does; anything else is tried again.
fn written(context: &str, e: io::Error) -> DriverError {
    if files::no_space(&e) { DriverError::Failed(format!("{context}: {e}")) } else { io(context, e) }
}

/// A writer that counts what goes through it.
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The sum of a workspace's files: of each one's kind, path, size and content's SHA-256, in path
/// order. Not of the archive, whose headers carry times a copy of the files does not keep.
fn digest(mut files: Vec<FileSum>) -> String {
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut hasher = Sha256::new();
    for f in files {
        hasher.update(format!("{:?} {} {} {}\n", f.kind, f.path.escape_default(), f.size, f.sha256));
    }
    hex::encode(hasher.finalize())
}

impl Snapshots {
    /// The snapshots of the driver whose root is `root`.
    pub fn under(root: &Path, copying: Copying) -> Self {
        Self { root: root.join(".snapshots"), copying }
    }

    fn dir(&self, id: &SnapshotId) -> PathBuf {
        self.root.join(id.as_str())
    }

    /// The copy of snapshot `id` made already, if one was: a copy once placed is the
    /// snapshot's for good, so a copy re-driven (its answer lost with a gateway, or asked again
    /// by another) answers the same.
    pub fn existing(&self, id: &SnapshotId) -> Result<Option<Kept>, DriverError> {
        let dir = self.dir(id);
        if !dir.join(ARCHIVE).exists() {
            return Ok(None);
        }
        // Written before the archive was placed.
        read_json(&dir.join(SUM))?
            .map(Some)
            .ok_or_else(|| DriverError::Failed(format!("snapshot {id}'s copy has no sum beside it")))
    }

    /// Makes snapshot `id`'s directory, before anything else is kept of it anywhere (an image
    /// a runtime commits): what [`Snapshots::list`] finds is then all a host keeps of snapshots.
    pub fn begin(&self, id: &SnapshotId) -> Result<(), DriverError> {
        let dir = self.dir(id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io(&format!("creating {}", dir.display()), e))
    }

    /// Copies the workspace at `workspace` as snapshot `id` (see [`Snapshots::existing`] for
    /// a copy made before), where its [`Copying`] says.
    pub async fn keep(&self, id: &SnapshotId, workspace: &Path) -> Result<Kept, DriverError> {
        let (this, id, workspace) = (self.clone(), id.clone(), workspace.to_path_buf());
        self.copying.run(move || this.keep_here(&id, &workspace)).await
    }

    fn keep_here(&self, id: &SnapshotId, workspace: &Path) -> Result<Kept, DriverError> {
        if let Some(kept) = self.existing(id)? {
            return Ok(kept);
        }
        self.begin(id)?;
        let dir = self.dir(id);
        // One copy of a snapshot at a time: its driver holds its source's lock meanwhile.
        let partial = dir.join(format!("{ARCHIVE}.partial"));
        let written = (|| {
            let file = File::create(&partial).map_err(|e| io("creating the snapshot's archive", e))?;
            let (out, kept) = pack(workspace, io::BufWriter::new(file))?;
            let file = out.into_inner().map_err(|e| written("writing the snapshot's archive", e.into_error()))?;
            file.sync_all().map_err(|e| written("syncing the snapshot's archive", e))?;
            // The sum first: an archive in place always has its sum beside it.
            write_json(&dir.join(SUM), &kept)?;
            Ok(kept)
        })();
        let kept = match written {
            Ok(kept) => kept,
            Err(e) => {
                removed(std::fs::remove_file(&partial), "removing an unfinished copy")?;
                return Err(e);
            }
        };
        std::fs::rename(&partial, dir.join(ARCHIVE)).map_err(|e| io("placing the snapshot's archive", e))?;
        File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing the snapshot's directory", e))?;
        Ok(kept)
    }

    /// Removes everything of snapshot `id` this directory keeps (last: see [`Snapshots::begin`]);
    /// absence is success.
    pub fn remove(&self, id: &SnapshotId) -> Result<(), DriverError> {
        removed(std::fs::remove_dir_all(self.dir(id)), "removing the snapshot's copy")
    }

    /// The snapshots this host keeps anything of: a copy, part of one, or (on a container
    /// runtime) an image.
    pub fn list(&self) -> Result<Vec<SnapshotId>, DriverError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing snapshots", e)),
        };
        let mut ids: Vec<SnapshotId> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .map(SnapshotId::new)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Whether the sandbox whose directory is `sandbox_dir` has its snapshot's files.
    pub fn seeded(sandbox_dir: &Path) -> bool {
        sandbox_dir.join(SEEDED).exists()
    }

    /// Gives the workspace at `workspace` snapshot `id`'s files, once: an unfinished seed
    /// before it is emptied first, a finished one is left alone. `sandbox_dir` is the sandbox's
    /// own directory, where the marker goes. Where its [`Copying`] says.
    pub async fn seed(&self, id: &SnapshotId, workspace: &Path, sandbox_dir: &Path) -> Result<(), DriverError> {
        let (this, id) = (self.clone(), id.clone());
        let (workspace, sandbox_dir) = (workspace.to_path_buf(), sandbox_dir.to_path_buf());
        self.copying.run(move || this.seed_here(&id, &workspace, &sandbox_dir)).await
    }

    fn seed_here(&self, id: &SnapshotId, workspace: &Path, sandbox_dir: &Path) -> Result<(), DriverError> {
        if Self::seeded(sandbox_dir) {
            return Ok(());
        }
        let archive = self.dir(id).join(ARCHIVE);
        let mut file = match File::open(&archive) {
            Ok(file) => file,
            // Final: a snapshot's copy does not come back.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(DriverError::Failed(format!("snapshot {id} has no copy on this host to start from")));
            }
            Err(e) => return Err(io("opening the snapshot's archive", e)),
        };
        empty(workspace)?;
        files::unpack(workspace, Path::new(""), &mut file, LIMITS)
            .map_err(|e| files_error("copying the snapshot's files", e))?;
        crate::state_file::write(&sandbox_dir.join(SEEDED), id.as_str().as_bytes())
    }
}

/// Packs the workspace at `workspace` into `out` as a snapshot's archive: what was written and
/// its size and sum.
fn pack<W: Write>(workspace: &Path, out: W) -> Result<(W, Kept), DriverError> {
    let mut out = Counting { inner: out, written: 0 };
    let files =
        files::pack(workspace, Path::new(""), &mut out, LIMITS).map_err(|e| files_error("copying the workspace", e))?;
    Ok((out.inner, Kept { size_bytes: out.written, sha256: digest(files) }))
}

/// What a snapshot of the workspace at `workspace` would hold, kept nowhere: a sandbox made from
/// a snapshot, before anything changes it, sums as its snapshot did (the simulator's S1).
pub fn sum(workspace: &Path) -> Result<Kept, DriverError> {
    pack(workspace, io::sink()).map(|(_, kept)| kept)
}

/// Removes everything in the directory `dir`, leaving it.
fn empty(dir: &Path) -> Result<(), DriverError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io("reading the workspace", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io("reading the workspace", e))?;
        let path = entry.path();
        let result = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        removed(result, "emptying the workspace")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_a_new_workspace_the_copied_files_once() {
        let host = tempfile::tempdir().unwrap();
        let source = host.path().join("source");
        std::fs::create_dir_all(source.join("sub")).unwrap();
        std::fs::write(source.join("a.txt"), b"hello").unwrap();
        std::fs::write(source.join("sub/b.bin"), vec![7u8; 70_000]).unwrap();
        let snapshots = Snapshots::under(host.path(), Copying::Inline);
        let id = SnapshotId::new("sn-1");
        let kept = snapshots.keep_here(&id, &source).unwrap();
        assert!(kept.size_bytes > 70_000);
        // A copy once placed is the snapshot's: taken again, even of changed files, it answers
        // the same.
        std::fs::write(source.join("a.txt"), b"changed").unwrap();
        assert_eq!(snapshots.keep_here(&id, &source).unwrap(), kept);
        assert_eq!(snapshots.existing(&id).unwrap(), Some(kept.clone()));
        std::fs::write(source.join("a.txt"), b"hello").unwrap();
        assert_eq!(snapshots.list().unwrap(), vec![id.clone()]);

        let sandbox = host.path().join("sb-2");
        let workspace = sandbox.join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        // A seed cut short left a file behind: the seed starts from empty.
        std::fs::write(workspace.join("half"), b"x").unwrap();
        snapshots.seed_here(&id, &workspace, &sandbox).unwrap();
        assert!(!workspace.join("half").exists());
        assert_eq!(std::fs::read(workspace.join("a.txt")).unwrap(), b"hello");
        assert_eq!(std::fs::read(workspace.join("sub/b.bin")).unwrap(), vec![7u8; 70_000]);
        // The same files sum the same, whatever their times.
        assert_eq!(sum(&workspace).unwrap().sha256, kept.sha256);
        std::fs::write(workspace.join("a.txt"), b"hellO").unwrap();
        assert_ne!(sum(&workspace).unwrap().sha256, kept.sha256);
        std::fs::write(workspace.join("a.txt"), b"hello").unwrap();

        // Seeded once: what the run writes afterwards is never seeded over, even once the
        // snapshot is gone.
        std::fs::write(workspace.join("a.txt"), b"changed").unwrap();
        snapshots.remove(&id).unwrap();
        snapshots.remove(&id).unwrap();
        snapshots.seed_here(&id, &workspace, &sandbox).unwrap();
        assert_eq!(std::fs::read(workspace.join("a.txt")).unwrap(), b"changed");
        // A sandbox not yet seeded cannot start from a snapshot that is gone.
        let other = host.path().join("sb-4");
        std::fs::create_dir_all(other.join("workspace")).unwrap();
        let gone = snapshots.seed_here(&id, &other.join("workspace"), &other).unwrap_err();
        assert!(matches!(gone, DriverError::Failed(_)), "{gone}");
    }
}
