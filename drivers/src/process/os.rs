//! What the process driver asks of the operating system: spawn a process group, read a
//! process's state, signal a process or a group, find a supervisor by the identity in its environment, and
//! tell the time. [`HostOs`] is the real one (`/proc`, `kill`, `tokio::process`); the
//! simulator has its own, so the driver's bookkeeping runs there as it does here.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use berth_core::SandboxId;
use berth_core::limits::ResourceLimits;
use futures_util::future::BoxFuture;
use nix::unistd::Pid;

use super::cgroup::Cgroups;
use crate::snapshot::Copying;
use crate::{DriverError, io};

/// A process to start as the leader of a new process group, with only `env` in its
/// environment (the host may add its own `PATH` underneath). No `Debug`: the environment holds
/// the run's token and credentials.
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    /// Where its standard output and error go (appended).
    pub log: PathBuf,
}

/// A spawned process.
pub struct Child {
    pub pid: i32,
    /// Its start time in the kernel: tells a recycled pid from this process.
    pub kernel_start: u64,
    /// Resolves when it ends, with its exit code (128 + the signal that killed it), or `None`
    /// when that cannot be known.
    pub exit: BoxFuture<'static, Option<i32>>,
}

/// What the kernel shows of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessStat {
    /// Neither a zombie nor dead.
    pub live: bool,
    pub kernel_start: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

#[async_trait]
pub trait Os: Send + Sync + 'static {
    /// The runtime's clock: Unix nanoseconds.
    fn now(&self) -> i64;

    /// Where the driver copies a workspace for a snapshot or a seed.
    fn copying(&self) -> Copying {
        Copying::Blocking
    }

    /// Starts `spec`. An error the program caused (it cannot be run) is
    /// [`DriverError::Failed`].
    async fn spawn(&self, spec: SpawnSpec) -> Result<Child, DriverError>;

    fn stat(&self, pid: i32) -> Option<ProcessStat>;

    /// Sends `signal` as kill(2) does: to the process `pid` if positive, to every process of the
    /// group `-pid` if negative (the driver never names 0, 1 or -1).
    fn kill(&self, pid: i32, signal: Signal);

    /// The live leader of a process group whose environment says it is `generation`'s
    /// supervisor of `sandbox` (`BERTH_SANDBOX_ID`, `BERTH_GENERATION`): its pid and kernel start.
    fn find_supervisor(&self, sandbox: &SandboxId, generation: u64) -> Option<(i32, u64)>;

    /// The process group of a live process whose environment names `generation`'s run of
    /// `sandbox`, whatever its role: what a run whose supervisor is gone left running (the
    /// command's children inherit its variables). Never the caller's own group, nor one whose
    /// leader lives: that is a live run's (a process may join any group of its session).
    fn find_group(&self, sandbox: &SandboxId, generation: u64) -> Option<i32>;

    /// Kills every process group an exec of the sandbox's runs leads (its environment names the
    /// sandbox but no generation). An exec leads its own group, so it outlives a supervisor
    /// killed without the chance to stop it.
    fn kill_execs(&self, sandbox: &SandboxId);

    /// The CPUs a sandbox's CPU share may use at most.
    fn cpus(&self) -> u64;

    /// Why this host cannot enforce one of `limits`: the spec's field, and the reason.
    fn unenforceable(&self, limits: &ResourceLimits) -> Option<(&'static str, String)>;

    /// Makes the sandbox's cgroups holding `limits`, and returns the directories its supervisor
    /// joins (none without limits). An error is [`DriverError::Failed`]: the run cannot have
    /// the limits it was given.
    fn limit(&self, sandbox: &SandboxId, limits: &ResourceLimits) -> Result<Vec<PathBuf>, DriverError>;

    /// Kills whatever is left in the sandbox's cgroups and removes them.
    async fn unlimit(&self, sandbox: &SandboxId) -> Result<(), DriverError>;

    /// Freezes (`frozen`) or thaws every process of the sandbox's run, through its freezer
    /// cgroup; returns once all are so. A host that gives the run no freezer is
    /// [`DriverError::Failed`], saying why.
    async fn freeze(&self, sandbox: &SandboxId, frozen: bool) -> Result<(), DriverError>;

    /// Whether the sandbox's run is frozen.
    fn frozen(&self, sandbox: &SandboxId) -> bool;

    /// Why this host gives runs no freezer, if it does not.
    fn no_freezer(&self) -> Option<String>;
}

/// The machine the gateway runs on, as one process driver sees it: the processes and cgroups of
/// its own runs. Two process drivers on one machine (two nodes of a test rig, one sandbox moved
/// from one to the other) never signal, freeze or remove each other's.
pub struct HostOs {
    cgroups: Cgroups,
    /// Where the driver keeps its sandboxes: a run's processes carry `BERTH_MOUNTS` beneath it.
    root: PathBuf,
}

impl HostOs {
    /// This machine, for the process driver keeping its sandboxes in `root`, with the cgroups it
    /// lets the gateway make (found once), named in a scope of `root`'s own.
    pub fn at(root: &Path) -> Self {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(root.as_os_str().as_encoded_bytes());
        Self { cgroups: Cgroups::detect(&hex::encode(&digest[..4])), root: root.to_path_buf() }
    }

    /// The processes of this driver's runs of `sandbox` that pass `also`: those naming the
    /// sandbox whose `BERTH_MOUNTS` is beneath this driver's root (one started before runs
    /// carried it is taken for this driver's: there was one process driver per machine then).
    fn processes(&self, sandbox: &SandboxId, also: impl Fn(&[&[u8]]) -> bool) -> impl Iterator<Item = (i32, i32)> {
        let name = format!("{}=", crate::env::MOUNTS_VAR);
        let (root, id) = (self.root.clone(), sandbox.clone());
        processes(sandbox, move |vars| {
            let theirs = vars.iter().find_map(|v| v.strip_prefix(name.as_bytes()));
            belongs(&root, &id, theirs) && also(vars)
        })
    }

    fn group_leaders(&self, sandbox: &SandboxId, also: impl Fn(&[&[u8]]) -> bool) -> impl Iterator<Item = i32> {
        self.processes(sandbox, also).filter_map(|(pid, pgid)| (pid == pgid).then_some(pid))
    }
}

/// Whether a process of `sandbox`'s whose environment gives `mounts` as its `BERTH_MOUNTS`
/// (`None`: it gives none, as a run started before runs carried it) is a run of the process
/// driver that keeps its sandboxes in `root`. Two process drivers on one machine tell their
/// runs apart by it; a run without it is taken for this driver's (there was one per machine).
pub fn belongs(root: &Path, sandbox: &SandboxId, mounts: Option<&[u8]>) -> bool {
    let ours = root.join(sandbox.as_str()).join(super::MOUNTS_DIR);
    mounts.is_none_or(|m| m == ours.as_os_str().as_encoded_bytes())
}

/// `Some((state letter, kernel start time))` of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is parenthesized and may itself hold spaces or parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 22 of stat overall is the 20th after the command name.
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

#[async_trait]
impl Os for HostOs {
    fn now(&self) -> i64 {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
    }

    async fn spawn(&self, spec: SpawnSpec) -> Result<Child, DriverError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&spec.log)
            .map_err(|e| io("opening the output log", e))?;
        let log2 = log.try_clone().map_err(|e| io("opening the output log", e))?;
        let mut child = tokio::process::Command::new(&spec.program)
            .args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()))
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .spawn()
            .map_err(|e| DriverError::Failed(format!("cannot run {}: {e}", spec.program.display())))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| DriverError::Failed("the supervisor exited before it could be recorded".to_string()))?;
        let kernel_start = proc_stat(pid).map(|(_, s)| s).unwrap_or_default();
        let exit = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            let status = child.wait().await.ok()?;
            status.code().or_else(|| status.signal().map(|sig| 128 + sig))
        });
        Ok(Child { pid, kernel_start, exit })
    }

    fn stat(&self, pid: i32) -> Option<ProcessStat> {
        proc_stat(pid).map(|(state, kernel_start)| ProcessStat { live: state != 'Z' && state != 'X', kernel_start })
    }

    fn kill(&self, pid: i32, signal: Signal) {
        let signal = match signal {
            Signal::Term => nix::sys::signal::Signal::SIGTERM,
            Signal::Kill => nix::sys::signal::Signal::SIGKILL,
        };
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
    }

    fn find_supervisor(&self, sandbox: &SandboxId, generation: u64) -> Option<(i32, u64)> {
        let generation_var = format!("BERTH_GENERATION={generation}");
        let pid = self.group_leaders(sandbox, |vars| vars.contains(&generation_var.as_bytes())).next()?;
        let stat = self.stat(pid)?;
        stat.live.then_some((pid, stat.kernel_start))
    }

    fn find_group(&self, sandbox: &SandboxId, generation: u64) -> Option<i32> {
        let generation_var = format!("BERTH_GENERATION={generation}");
        let ours = nix::unistd::getpgrp().as_raw();
        let leader_lives = |pgid: i32| self.stat(pgid).is_some_and(|stat| stat.live);
        let mut members = self.processes(sandbox, |vars| vars.contains(&generation_var.as_bytes()));
        members.find_map(|(_, pgid)| (pgid > 1 && pgid != ours && !leader_lives(pgid)).then_some(pgid))
    }

    fn kill_execs(&self, sandbox: &SandboxId) {
        for pid in self.group_leaders(sandbox, |vars| !vars.iter().any(|v| v.starts_with(b"BERTH_GENERATION="))) {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    fn cpus(&self) -> u64 {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
    }

    fn unenforceable(&self, limits: &ResourceLimits) -> Option<(&'static str, String)> {
        self.cgroups.unenforceable(limits)
    }

    fn limit(&self, sandbox: &SandboxId, limits: &ResourceLimits) -> Result<Vec<PathBuf>, DriverError> {
        self.cgroups.make(sandbox, limits).map_err(|e| DriverError::Failed(format!("the sandbox's limits: {e}")))
    }

    async fn unlimit(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        self.cgroups.remove(sandbox).await.map_err(|e| io("removing the sandbox's cgroups", e))
    }

    async fn freeze(&self, sandbox: &SandboxId, frozen: bool) -> Result<(), DriverError> {
        self.cgroups.freeze(sandbox, frozen).await.map_err(|e| DriverError::Failed(e.to_string()))
    }

    fn frozen(&self, sandbox: &SandboxId) -> bool {
        self.cgroups.frozen(sandbox)
    }

    fn no_freezer(&self) -> Option<String> {
        self.cgroups.no_freezer()
    }
}

/// The live processes whose environment names `sandbox` and passes `also`, in pid order: each
/// pid and its process group.
fn processes(sandbox: &SandboxId, also: impl Fn(&[&[u8]]) -> bool) -> impl Iterator<Item = (i32, i32)> {
    let id_var = format!("BERTH_SANDBOX_ID={sandbox}");
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().filter_map(move |pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let live = proc_stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X');
        if !(vars.contains(&id_var.as_bytes()) && also(&vars) && live) {
            return None;
        }
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(pid))).ok()?.as_raw();
        Some((pid, pgid))
    })
}
