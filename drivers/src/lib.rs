//! berth-drivers: the [`Driver`] trait every runtime implements, and the process driver.
//!
//! A driver executes effects and reports what the runtime shows; it decides nothing. Its
//! replies and reports go through berth-core's merge like every other observation. Times in
//! [`RuntimeState`] are the runtime's own clock.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::identity::RuntimeToken;
use berth_core::record::Content;
use berth_core::{Hold, RuntimeState, SandboxId, SandboxSpec, Secret, SnapshotId, StartReply, VolumeId};
use futures_util::Stream;

pub mod container;
pub mod env;
/// The logs' format, for whoever reads what [`Driver::logs`] returns.
pub use berth_logs as logs;
pub mod files;
/// What drivers and supervisors exchange, for the simulator's stand-ins of the supervisor.
pub use berth_handoff as handoff;
pub mod process;
mod sandbox_lock;
pub mod snapshot;
mod state_file;
pub mod tombstone;

/// A failed file-system step, as a driver error: the caller may try again.
pub(crate) fn io(context: &str, e: std::io::Error) -> DriverError {
    DriverError::Unavailable(format!("{context}: {e}"))
}

/// [`Driver::logs`] of logs kept on this host, in `dir`. Read in place, not on a blocking
/// thread: a read is at most a few hundred KiB of what was just written (in the page cache),
/// and in the simulator a thread would make the run's order depend on the host's scheduler.
pub(crate) fn read_logs(
    dir: &Path,
    log: &berth_logs::Log,
    from: u64,
    max: usize,
    over: bool,
) -> Result<berth_logs::Read, DriverError> {
    berth_logs::read(dir, log, from, max, over)
        .map_err(|e| DriverError::Failed(format!("the sandbox's logs are unreadable: {e}")))
}

/// The bytes the regular files under `path` hold, links not followed: a path (or a part of the
/// tree) gone meanwhile holds none. Walked on a blocking thread (only a metrics scrape asks,
/// never the simulator's runs).
pub(crate) async fn tree_bytes(path: std::path::PathBuf) -> Result<u64, DriverError> {
    fn walk(path: &std::path::Path) -> std::io::Result<u64> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        if meta.is_file() {
            return Ok(meta.len());
        }
        if !meta.is_dir() {
            return Ok(0);
        }
        let mut total = 0;
        for entry in std::fs::read_dir(path)? {
            total += walk(&entry?.path())?;
        }
        Ok(total)
    }
    let context = format!("measuring {}", path.display());
    tokio::task::spawn_blocking(move || walk(&path))
        .await
        .map_err(|e| DriverError::Failed(format!("{context}: {e}")))?
        .map_err(|e| io(&context, e))
}

/// A removal from the file system, where absence is success.
pub(crate) fn removed(result: std::io::Result<()>, context: &str) -> Result<(), DriverError> {
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(context, e)),
        _ => Ok(()),
    }
}

/// Whether the node may still make a run (DESIGN 14, N1). A driver asks at the last moment
/// before it makes one: a start held up (behind a lock, a slow runtime) past the node's lease
/// must not make a run the store may meanwhile have placed on another node.
#[derive(Clone)]
pub struct Fence(std::sync::Arc<dyn Fn() -> bool + Send + Sync>);

impl Fence {
    /// A fence asked through `holds`.
    pub fn new(holds: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(holds))
    }

    /// One that always holds: a single host, a driver's own tests.
    pub fn open() -> Self {
        Self::new(|| true)
    }

    /// Nothing, if the node may make the run; otherwise the effect is left, unavailable, to be
    /// driven again once the node holds its lease.
    pub fn holds(&self) -> bool {
        (self.0)()
    }

    pub fn check(&self) -> Result<(), DriverError> {
        if self.holds() {
            Ok(())
        } else {
            Err(DriverError::Unavailable("the node does not hold its lease: no run is made".to_string()))
        }
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}

/// What a driver needs to start one generation's run.
#[derive(Clone, Debug)]
pub struct Launch {
    pub sandbox: SandboxId,
    pub name: String,
    pub generation: u64,
    pub spec: SandboxSpec,
    /// The attached providers' credentials, by environment variable name.
    pub credentials: BTreeMap<String, Secret>,
    /// The generation's runtime token, installed before the sandbox's process starts.
    pub token: RuntimeToken,
    /// The snapshot the sandbox was made from (DESIGN 12.2): its files are the sandbox's before
    /// its first run (unless the record says a run of it started: they are then its own, lost
    /// with its workspace if that is removed out of band), and on a container runtime its image
    /// is the sandbox's for good.
    pub seed: Option<berth_core::record::Seed>,
    /// Asked just before the run is made.
    pub fence: Fence,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The runtime could not be reached or did not answer in time: the effect may or may not
    /// have happened. Recovery re-drives it.
    #[error("runtime unavailable: {0}")]
    Unavailable(String),
    /// The runtime refused the operation.
    #[error("runtime refused: {0}")]
    Failed(String),
}

/// A step of a start, stop or delete where a gateway can die, for the tests that check what it
/// leaves behind (feature `fault-points`; DESIGN 11 D1). Production code never cuts one short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Start: recorded as begun; the runtime was not asked yet.
    BeforeRuntimeStart,
    /// Start: the runtime started the run; the driver recorded nothing of it.
    AfterRuntimeStart,
    /// Stop: the runtime was told to stop the run (SIGTERM, or the engine's stop answered); the
    /// driver saw nothing of its end.
    AfterStopAsked,
    /// Delete: the sandbox's tombstone is written; nothing was removed yet.
    AfterTombstone,
    /// Delete: the run and the compute resource are gone; the workspace, the driver's state and
    /// the lock are left.
    AfterRuntimeRemove,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 5] = [
        CrashPoint::BeforeRuntimeStart,
        CrashPoint::AfterRuntimeStart,
        CrashPoint::AfterStopAsked,
        CrashPoint::AfterTombstone,
        CrashPoint::AfterRuntimeRemove,
    ];

    /// The operation this step belongs to.
    pub fn act(self) -> Act {
        match self {
            CrashPoint::BeforeRuntimeStart | CrashPoint::AfterRuntimeStart => Act::Start,
            CrashPoint::AfterStopAsked => Act::Stop,
            CrashPoint::AfterTombstone | CrashPoint::AfterRuntimeRemove => Act::Delete,
        }
    }
}

/// The driver operations a [`CrashPoint`] can cut short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Start,
    Stop,
    Delete,
}

/// An operation cut short at its crash point.
pub(crate) fn crashed(at: CrashPoint) -> DriverError {
    let act = format!("{:?}", at.act()).to_lowercase();
    DriverError::Unavailable(format!("the {act} was cut short at {at:?}"))
}

/// `Ok` when an operation run with a crash point ended there; the operation's end otherwise.
#[cfg(feature = "fault-points")]
pub(crate) fn cut_short<T: std::fmt::Debug>(ended: Result<T, DriverError>, at: CrashPoint) -> Result<(), DriverError> {
    match ended {
        Err(e) if e == crashed(at) => Ok(()),
        Ok(reply) => Err(DriverError::Failed(format!("the {:?} ended ({reply:?}) before {at:?}", at.act()))),
        Err(e) => Err(e),
    }
}

/// One item of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The initial sync: what the runtime shows of one sandbox when the stream opened.
    Sync { sandbox: SandboxId, state: RuntimeState },
    /// The initial sync is complete.
    Synced,
    /// A change seen live.
    Changed { sandbox: SandboxId, state: RuntimeState },
}

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, DriverError>> + Send>>;

/// One page of [`Driver::list`], ordered by sandbox id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub items: Vec<(SandboxId, RuntimeState)>,
    /// The id to continue after; `None` on the last page.
    pub next: Option<SandboxId>,
}

impl ListPage {
    /// The page of `ids` (in any order, repeats allowed) after `after`, each looked up with
    /// `driver.get`; those found absent meanwhile are left out.
    pub async fn of(
        driver: &(impl Driver + ?Sized),
        mut ids: Vec<SandboxId>,
        after: Option<&SandboxId>,
        limit: usize,
    ) -> Result<Self, DriverError> {
        let limit = limit.max(1);
        ids.sort();
        ids.dedup();
        let ids: Vec<SandboxId> = ids.into_iter().filter(|id| after.is_none_or(|a| id > a)).take(limit + 1).collect();
        let mut page = ListPage::default();
        for id in ids.iter().take(limit) {
            let state = driver.get(id).await?;
            if !matches!(state, RuntimeState::Absent { .. }) {
                page.items.push((id.clone(), state));
            }
        }
        if ids.len() > limit {
            page.next = ids.get(limit - 1).cloned();
        }
        Ok(page)
    }
}

#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// A short name for logs: "process", "docker", "podman", "sim".
    fn name(&self) -> &'static str;

    /// Refuses a spec this driver cannot enforce here ([`berth_core::Error::Unenforceable`],
    /// naming the field; DESIGN 10): a limit is never silently left unenforced. Asked before a
    /// sandbox or template is written.
    fn admit(&self, spec: &SandboxSpec) -> Result<(), berth_core::Error>;

    /// Makes sure the sandbox's compute resource exists and that `launch.generation` has run:
    /// creates it if needed, installs the generation's identity before the process starts, and
    /// starts at most one run per generation, none for a generation older than one already
    /// started. A live run of an older generation is stopped first.
    ///
    /// Both limits hold even after the compute resource was removed out of band: the driver
    /// keeps its record of the newest started generation outside it. berth-core tells runs
    /// apart by their start times, so an older generation's start that lands late (a delayed
    /// effect, or a crashed gateway's call the runtime still completes) must never make a run
    /// that would pass for the current generation's.
    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError>;

    /// Stops whatever runs, gracefully and then by force after `grace`, and replies only once
    /// it has fully exited, with the final state. A stop decided for `generation` leaves alone a
    /// newer generation begun since (berth-core's [`berth_core::start_gate::stop_superseded`]) and
    /// replies with what the runtime shows.
    async fn stop(&self, sandbox: &SandboxId, generation: u64, grace: Duration) -> Result<RuntimeState, DriverError>;

    /// Stops every run the runtime holds, whatever its generation, as [`Driver::stop`] does,
    /// keeping the workspaces: the node's side of fencing (DESIGN 14), when the store may place
    /// the node's sandboxes elsewhere; for as long as `lapsed` holds (the node granted its lease
    /// again meanwhile may be making runs anew). The sandboxes it could not stop come back, with
    /// why.
    async fn stop_every_run(
        &self,
        grace: Duration,
        lapsed: &Fence,
    ) -> Result<Vec<(SandboxId, DriverError)>, DriverError> {
        let mut failed = Vec::new();
        let mut after = None;
        loop {
            let page = self.list(after.as_ref(), 500).await?;
            for (id, _) in &page.items {
                if !lapsed.holds() {
                    return Ok(failed);
                }
                if let Err(e) = self.stop(id, u64::MAX, grace).await {
                    failed.push((id.clone(), e));
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(failed),
            }
        }
    }

    /// Removes the compute resource and everything made for it (workspace, secrets), stopping
    /// what runs first as [`Driver::stop`] does (gracefully, by force after `grace`), so that a
    /// deleted sandbox's processes get the same chance to finish as a stopped one's. Absence is
    /// success.
    async fn delete(&self, sandbox: &SandboxId, grace: Duration) -> Result<(), DriverError>;

    /// Whether this host lets the driver hold runs as `hold` says at all: an error saying why
    /// not, before a pause is committed that could never be carried out.
    fn admit_pause(&self, hold: Hold) -> Result<(), berth_core::Error>;
    /// Holds every process of the sandbox's run as `hold` says, keeping its memory (DESIGN
    /// 12.1): frozen in place, or written to a checkpoint; a run held so already is left so,
    /// one held the other way is let go of first. The state the run is in after.
    async fn pause(&self, sandbox: &SandboxId, hold: Hold) -> Result<RuntimeState, DriverError>;
    /// Thaws or restores the sandbox's run; one not held is left so. The state the run is in
    /// after.
    async fn resume(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError>;
    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError>;

    /// Copies the sandbox's files as snapshot `snapshot` (DESIGN 12.2): its workspace, and on a
    /// container runtime its container's filesystem as an image. A live run is frozen for the
    /// moment of the copy and thawed after; a frozen or stopped one is copied as it is. A copy
    /// placed before under the same id is the snapshot's for good: it is answered again.
    /// [`DriverError::Failed`] says why no copy can be made (the sandbox has no files, the host
    /// has no freezer), and nothing of it is then kept.
    async fn snapshot(&self, sandbox: &SandboxId, snapshot: &SnapshotId) -> Result<Content, DriverError>;
    /// Removes everything kept of snapshot `snapshot`; absence is success. What sandboxes made
    /// from it hold of it is theirs and stays.
    async fn remove_snapshot(&self, snapshot: &SnapshotId) -> Result<(), DriverError>;
    /// The snapshots this driver keeps anything of, in id order: what the sweep compares with
    /// the records, so that nothing is kept of a snapshot without one.
    async fn snapshots(&self) -> Result<Vec<SnapshotId>, DriverError>;

    /// Removes everything the runtime keeps of volume `volume` (DESIGN 13.2); absence is
    /// success. Asked only once no sandbox mounting it is left.
    async fn remove_volume(&self, volume: &VolumeId) -> Result<(), DriverError>;
    /// The volumes this driver keeps, in id order: what the sweep compares with the records, so
    /// that nothing is kept of a volume without one. A volume's files are made by the first
    /// start that mounts it.
    async fn volumes(&self) -> Result<Vec<VolumeId>, DriverError>;
    /// The bytes volume `volume`'s files hold (none before a start that mounts it made them).
    async fn volume_bytes(&self, volume: &VolumeId) -> Result<u64, DriverError>;

    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError>;

    /// Up to about `max` bytes of `log` (a generation's main process, or an exec) from `from`
    /// (berth-logs). `over`: its command has ended, so what was written is all there is. The
    /// logs outlive the run and go with the sandbox's delete.
    async fn logs(
        &self,
        sandbox: &SandboxId,
        log: &berth_logs::Log,
        from: u64,
        max: usize,
        over: bool,
    ) -> Result<berth_logs::Read, DriverError>;

    /// Where the sandbox's workspace is on this host (the files API, [`files`]): it outlives
    /// every run, so files go in and out while the sandbox runs and while it is Stopped.
    async fn workspace(&self, sandbox: &SandboxId) -> Result<PathBuf, DriverError>;

    /// The runtime's events: an initial sync of every sandbox, [`WatchEvent::Synced`], then
    /// live changes. The stream ends or fails when the runtime's event source does; the caller
    /// reconnects (and gets a new initial sync).
    async fn watch(&self) -> Result<WatchStream, DriverError>;

    /// [`Driver::start`], cut short at `at` as if the gateway died there: what it did stays,
    /// nothing after it happens.
    #[cfg(feature = "fault-points")]
    async fn start_then_crash(&self, launch: Launch, at: CrashPoint) -> Result<(), DriverError> {
        let _ = launch;
        Err(no_fault_points(self.name(), at))
    }

    /// [`Driver::stop`], cut short at `at`.
    #[cfg(feature = "fault-points")]
    async fn stop_then_crash(
        &self,
        sandbox: &SandboxId,
        generation: u64,
        grace: Duration,
        at: CrashPoint,
    ) -> Result<(), DriverError> {
        let _ = (sandbox, generation, grace);
        Err(no_fault_points(self.name(), at))
    }

    /// [`Driver::delete`], cut short at `at`.
    #[cfg(feature = "fault-points")]
    async fn delete_then_crash(&self, sandbox: &SandboxId, grace: Duration, at: CrashPoint) -> Result<(), DriverError> {
        let _ = (sandbox, grace);
        Err(no_fault_points(self.name(), at))
    }
}

#[cfg(feature = "fault-points")]
fn no_fault_points(driver: &str, at: CrashPoint) -> DriverError {
    DriverError::Failed(format!("the {driver} driver has no fault point {at:?}"))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_trees_bytes_are_its_files_and_no_link_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/three"), b"abc").unwrap();
        std::fs::write(tree.join("five"), b"abcde").unwrap();
        std::fs::write(dir.path().join("outside"), vec![0u8; 1000]).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside"), tree.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), tree.join("a/up")).unwrap();
        assert_eq!(super::tree_bytes(tree.clone()).await.unwrap(), 8);
        assert_eq!(super::tree_bytes(tree.join("none")).await.unwrap(), 0, "nothing there holds nothing");
    }
}
