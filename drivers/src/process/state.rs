//! What the driver keeps of each sandbox on disk: its directory, the run file of its current
//! run, and the start gate's record of the newest generation it began.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use berth_core::SandboxId;
use berth_core::start_gate::StartRecord;
use berth_handoff::exit::Exit;
use berth_handoff::{began, exit};
use serde::{Deserialize, Serialize};

use super::Inner;
use super::os::Os;
use crate::state_file::{self, read_json, write_json};
use crate::{DriverError, io};

/// The folder under the root holding each sandbox's newest started generation. Its leading dot
/// keeps it apart from sandbox ids.
pub(super) const STARTED_DIR: &str = ".started";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RunFile {
    pub(super) generation: u64,
    pub(super) pid: i32,
    /// The process's start time in the kernel (clock ticks since boot): tells a recycled pid
    /// from our supervisor.
    pub(super) kernel_start: u64,
    pub(super) started_at: i64,
}

/// The start gate's record as this driver keeps it, with when the begun run was started (the
/// runtime's start time of a run adopted after a crash).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(super) struct Begun {
    #[serde(flatten)]
    pub(super) gate: StartRecord,
    pub(super) started_at: i64,
}

/// `.started/<id>` as it may be: from before the start gate, the bare number of a confirmed
/// generation.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum StartedFile {
    Begun(Begun),
    Legacy(u64),
}

impl<O: Os> Inner<O> {
    pub(super) fn dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.root.join(sandbox.as_str())
    }

    /// Where the sandbox's supervisors keep their logs (berth-logs): beside the workspace, so
    /// they outlive every run and go with the sandbox.
    pub(super) fn logs_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.dir(sandbox).join("logs")
    }

    pub(super) fn run_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.dir(sandbox).join("run")
    }

    pub(super) fn started_file(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.root.join(STARTED_DIR).join(sandbox.as_str())
    }

    /// The start gate's record of the sandbox.
    pub(super) fn begun(&self, sandbox: &SandboxId) -> Result<Option<Begun>, DriverError> {
        Ok(read_json::<StartedFile>(&self.started_file(sandbox))?.map(|file| match file {
            StartedFile::Begun(begun) => begun,
            StartedFile::Legacy(generation) => Begun { gate: StartRecord::confirmed(generation), started_at: 0 },
        }))
    }

    pub(super) fn record_begun(&self, sandbox: &SandboxId, begun: Begun) -> Result<(), DriverError> {
        write_json(&self.started_file(sandbox), &begun)
    }

    /// Resolves a start a dead gateway began and never confirmed: its run, if it began, is
    /// found and recorded as the sandbox's run. Every look at a sandbox settles it first, so a
    /// stop or a delete stops what runs even when no start was re-driven (the caller holds the
    /// lock). Whether the begun generation's run is now the recorded one.
    pub(super) fn settle(&self, sandbox: &SandboxId) -> Result<bool, DriverError> {
        let Some(begun) = self.begun(sandbox)?.filter(|b| !b.gate.confirmed) else { return Ok(false) };
        let generation = begun.gate.generation;
        let adopt = |pid, kernel_start| {
            let run = RunFile { generation, pid, kernel_start, started_at: begun.started_at };
            let run_dir = self.run_dir(sandbox);
            // A folder removed under a live run: the run is still the one to stop.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&run_dir)
                .map_err(|e| io(&format!("creating {}", run_dir.display()), e))?;
            write_json(&run_dir.join("state.json"), &run)
        };
        let found = if self.run_file(sandbox)?.is_some_and(|r| r.generation == generation) {
            true
        } else if let Some((pid, kernel_start)) = self.os.find_supervisor(sandbox, generation) {
            adopt(pid, kernel_start)?;
            true
        } else if !self.dir(sandbox).exists() {
            // The start made the sandbox's folder before it recorded the start as begun, so the
            // folder was removed since, out of band, with whatever ran in it: the generation's
            // run may have happened and is never run again (its compute resource is missing).
            true
        } else if self.began(sandbox)? == Some(generation)
            || read_json::<Exit>(&self.run_dir(sandbox).join(exit::FILE))?
                .is_some_and(|exit| exit.generation.is_none_or(|g| g == generation))
        {
            // Its supervisor is gone, but lived long enough to say it began, or to record an
            // exit (both are cleared before a start is begun): it ran, and ended. An exit the
            // driver recorded itself for the previous generation's dead run, on a look in
            // between, is no sign of this one. What its command started may still run in its
            // group: recorded as the run's, the group is what a stop ends. While a member lives
            // the kernel hands its id to no other process, so a process at that pid is the
            // group's own leader, a zombie; the id is never signalled once another holds it.
            match self.os.find_group(sandbox, generation) {
                Some(group) => adopt(group, self.os.stat(group).map_or(0, |stat| stat.kernel_start))?,
                None => adopt(0, 0)?,
            }
            true
        } else {
            false
        };
        if found {
            self.record_begun(sandbox, Begun { gate: StartRecord::confirmed(generation), ..begun })?;
        }
        Ok(found)
    }

    /// The generation whose supervisor last began, as it wrote it.
    pub(super) fn began(&self, sandbox: &SandboxId) -> Result<Option<u64>, DriverError> {
        let bytes = state_file::read(&self.run_dir(sandbox).join(began::FILE))?;
        Ok(bytes.and_then(|bytes| began::parse(&bytes)))
    }

    pub(super) fn run_file(&self, sandbox: &SandboxId) -> Result<Option<RunFile>, DriverError> {
        read_json(&self.run_dir(sandbox).join("state.json"))
    }
}
