//! The process driver, Berth's embedded default runtime.
//!
//! Each sandbox is a process group led by `berth-supervisor`, started in the sandbox's own
//! workspace directory under the driver's root. Everything the driver knows lives in files
//! beside the workspace, so a gateway that restarts adopts the runs it finds instead of
//! restarting them:
//!
//! ```text
//! <root>/<sandbox id>/workspace/      the command's working directory, kept across stop and start
//! <root>/<sandbox id>/run/state.json  the newest run: generation, pid, its kernel start time, start time
//! <root>/<sandbox id>/run/exit.json   how that run ended (written by the supervisor, else by the driver)
//! <root>/<sandbox id>/run/output.log  the supervisor's and the command's output
//! <root>/.started/<sandbox id>         the newest generation ever started
//! <root>/.locks/<sandbox id>           locked while the driver acts on the sandbox
//! ```
//!
//! Several gateways may share the root (gateways sharing a store on one host): a file lock per
//! sandbox serializes them as the in-process lock serializes one gateway's tasks.
//!
//! The newest started generation lives outside the sandbox's folder: removing the folder out of
//! band must not let a start of an older generation, still on its way, run after a newer one did.
//!
//! The runtime clock is the host's wall clock. There is no isolation beyond a process group:
//! the command runs as the gateway's user.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Once};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use berth_core::{ExitMarker, RuntimeState, SandboxId, StartReply, Timestamp};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::sandbox_lock::SandboxLocks;
use crate::{Driver, DriverError, Launch, ListPage, WatchEvent, WatchStream, io};

/// The exit code reported for a run whose supervisor was killed before it could record one.
pub const KILLED_EXIT_CODE: i32 = 137;
/// How often the driver looks for runs that ended, to report them on its watch stream.
const MONITOR_INTERVAL: Duration = Duration::from_millis(200);
/// How long an older generation's run may take to stop when a newer one replaces it.
const REPLACE_GRACE: Duration = Duration::from_secs(5);
/// The folder under the root holding each sandbox's newest started generation. Its leading dot
/// keeps it apart from sandbox ids.
const STARTED_DIR: &str = ".started";

#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// Where sandboxes live: `<data dir>/sandboxes`.
    pub root: PathBuf,
    /// The `berth-supervisor` binary.
    pub supervisor: PathBuf,
    /// Where supervisors reach the gateway: `unix:/path/to/socket` or `http://host:port`.
    pub gateway: String,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct RunFile {
    generation: u64,
    pid: i32,
    /// The process's start time in the kernel (clock ticks since boot): tells a recycled pid
    /// from our supervisor.
    kernel_start: u64,
    started_at: i64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ExitFile {
    pub exit_code: i32,
    pub finished_at: i64,
}

pub struct ProcessDriver {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProcessConfig,
    locks: SandboxLocks,
    events: broadcast::Sender<(SandboxId, RuntimeState)>,
    monitor: Once,
}

fn now_nanos() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
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

fn alive(run: &RunFile) -> bool {
    matches!(proc_stat(run.pid), Some((state, start)) if start == run.kernel_start && state != 'Z' && state != 'X')
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, DriverError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| DriverError::Failed(format!("{} is unreadable: {e}", path.display()))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&format!("reading {}", path.display()), e)),
    }
}

/// Writes atomically (temporary file, then rename), so a reader never sees half a file.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DriverError> {
    let tmp = path.with_extension("tmp");
    let result = (|| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| io(&format!("writing {}", path.display()), e))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), DriverError> {
    let bytes = serde_json::to_vec(value).map_err(|e| DriverError::Failed(e.to_string()))?;
    write_file(path, &bytes, 0o600)
}

/// Ends what is left of a run's process group. The group id stays the supervisor's pid while
/// any member lives, so it cannot name someone else's group here.
fn kill_group(run: &RunFile, signal: Signal) {
    let _ = killpg(Pid::from_raw(run.pid), signal);
}

impl ProcessDriver {
    pub fn new(config: ProcessConfig) -> Result<Self, DriverError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.root)
            .map_err(|e| io(&format!("creating {}", config.root.display()), e))?;
        let (events, _) = broadcast::channel(1024);
        let locks = SandboxLocks::new(config.root.clone());
        Ok(Self { inner: Arc::new(Inner { config, locks, events, monitor: Once::new() }) })
    }

    /// The workspace directory of a sandbox (for tests and operators).
    pub fn workspace(&self, sandbox: &SandboxId) -> PathBuf {
        self.inner.dir(sandbox).join("workspace")
    }
}

impl Inner {
    fn dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.root.join(sandbox.as_str())
    }

    fn run_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.dir(sandbox).join("run")
    }

    fn started_file(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.root.join(STARTED_DIR).join(sandbox.as_str())
    }

    /// The newest generation this driver ever started for the sandbox.
    fn newest_started(&self, sandbox: &SandboxId) -> Result<Option<u64>, DriverError> {
        read_json(&self.started_file(sandbox))
    }

    fn run_file(&self, sandbox: &SandboxId) -> Result<Option<RunFile>, DriverError> {
        read_json(&self.run_dir(sandbox).join("state.json"))
    }

    /// How `run` ended. A run that died without its supervisor recording the exit gets one
    /// recorded now, once, so every later look reports the same finish time.
    fn ended(&self, sandbox: &SandboxId, run: &RunFile, code_if_unknown: i32) -> Result<ExitMarker, DriverError> {
        let path = self.run_dir(sandbox).join("exit.json");
        let exit = match read_json::<ExitFile>(&path)? {
            Some(exit) => exit,
            None => {
                kill_group(run, Signal::SIGKILL);
                let exit = ExitFile { exit_code: code_if_unknown, finished_at: now_nanos().max(run.started_at + 1) };
                write_json(&path, &exit)?;
                exit
            }
        };
        Ok(ExitMarker {
            started_at: Timestamp::from_unix_nanos(run.started_at),
            finished_at: Timestamp::from_unix_nanos(exit.finished_at),
            exit_code: exit.exit_code,
        })
    }

    /// What the runtime shows; the caller holds the sandbox's lock.
    fn observe(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        if !self.dir(sandbox).exists() {
            return Ok(RuntimeState::Absent { at: Some(Timestamp::from_unix_nanos(now_nanos())) });
        }
        let Some(run) = self.run_file(sandbox)? else { return Ok(RuntimeState::Created) };
        if alive(&run) {
            return Ok(RuntimeState::Running { started_at: Timestamp::from_unix_nanos(run.started_at) });
        }
        Ok(RuntimeState::Exited(self.ended(sandbox, &run, KILLED_EXIT_CODE)?))
    }

    /// Stops the run (if one lives) and waits until its whole group is gone.
    async fn stop_locked(&self, sandbox: &SandboxId, grace: Duration) -> Result<RuntimeState, DriverError> {
        if let Some(run) = self.run_file(sandbox)?
            && alive(&run)
        {
            kill_group(&run, Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + grace;
            while alive(&run) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            while alive(&run) {
                kill_group(&run, Signal::SIGKILL);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The supervisor may have gone first; nothing of the group may outlive the stop.
            kill_group(&run, Signal::SIGKILL);
        }
        self.observe(sandbox)
    }

    fn spawn(self: &Arc<Self>, launch: &Launch) -> Result<RunFile, DriverError> {
        let dir = self.dir(&launch.sandbox);
        let run_dir = self.run_dir(&launch.sandbox);
        let workspace = dir.join("workspace");
        let started = self.config.root.join(STARTED_DIR);
        for d in [&dir, &run_dir, &workspace, &started] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(|e| io(&format!("creating {}", d.display()), e))?;
        }
        let exit_path = run_dir.join("exit.json");
        match std::fs::remove_file(&exit_path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io("clearing the previous exit", e)),
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(run_dir.join("output.log"))
            .map_err(|e| io("opening output.log", e))?;
        let log2 = log.try_clone().map_err(|e| io("opening output.log", e))?;
        let mut command = tokio::process::Command::new(&self.config.supervisor);
        command
            .arg("--gateway")
            .arg(&self.config.gateway)
            .arg("--exit-file")
            .arg(&exit_path)
            .arg("--")
            .args(&launch.spec.command)
            .current_dir(&workspace)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()))
            .env("HOME", &workspace)
            .envs(&launch.spec.env)
            .envs(launch.credentials.iter().map(|(k, v)| (k, v.expose())))
            .env("BERTH_SANDBOX_ID", launch.sandbox.as_str())
            .env("BERTH_SANDBOX_NAME", &launch.name)
            .env("BERTH_RUNTIME_TOKEN", launch.token.expose())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        let started_at = now_nanos();
        let mut child = command
            .spawn()
            .map_err(|e| DriverError::Failed(format!("cannot run {}: {e}", self.config.supervisor.display())))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| DriverError::Failed("the supervisor exited before it could be recorded".to_string()))?;
        let kernel_start = proc_stat(pid).map(|(_, s)| s).unwrap_or_default();
        let run = RunFile { generation: launch.generation, pid, kernel_start, started_at };
        write_json(&run_dir.join("state.json"), &run)?;
        write_json(&self.started_file(&launch.sandbox), &launch.generation)?;
        // Reap our own child and record its status if the supervisor could not.
        let inner = Arc::clone(self);
        let sandbox = launch.sandbox.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let code = status.ok().and_then(|s| {
                use std::os::unix::process::ExitStatusExt;
                s.code().or_else(|| s.signal().map(|sig| 128 + sig))
            });
            let Ok(_guard) = inner.locks.lock(&sandbox, false).await else { return };
            if inner.run_file(&sandbox).ok().flatten().is_some_and(|r| r.pid == run.pid) {
                let _ = inner.ended(&sandbox, &run, code.unwrap_or(KILLED_EXIT_CODE));
            }
        });
        Ok(run)
    }

    /// Publishes every change of any sandbox's state to watchers.
    async fn monitor(self: Arc<Self>) {
        let mut last: BTreeMap<SandboxId, RuntimeState> = BTreeMap::new();
        loop {
            let ids = self.ids().unwrap_or_default();
            let mut seen = BTreeMap::new();
            for id in ids {
                // A sandbox busy with a start or stop keeps its last state until the next round;
                // that operation's own reply reports it.
                match self.locks.try_lock(&id) {
                    Some(_guard) => {
                        if let Ok(state) = self.observe(&id) {
                            seen.insert(id, state);
                        }
                    }
                    None => {
                        if let Some(state) = last.get(&id) {
                            seen.insert(id, *state);
                        }
                    }
                }
            }
            for (id, state) in &seen {
                let changed = match (last.get(id), state) {
                    (Some(RuntimeState::Absent { .. }), RuntimeState::Absent { .. }) => false,
                    (before, now) => before != Some(now),
                };
                if changed {
                    let _ = self.events.send((id.clone(), *state));
                }
            }
            for id in last.keys().filter(|id| !seen.contains_key(*id)) {
                let _ = self
                    .events
                    .send((id.clone(), RuntimeState::Absent { at: Some(Timestamp::from_unix_nanos(now_nanos())) }));
            }
            last = seen;
            tokio::time::sleep(MONITOR_INTERVAL).await;
        }
    }

    /// Every sandbox directory, sorted.
    fn ids(&self) -> Result<Vec<SandboxId>, DriverError> {
        let entries = std::fs::read_dir(&self.config.root).map_err(|e| io("listing sandboxes", e))?;
        let mut ids: Vec<SandboxId> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            // The driver's own folders start with a dot; sandbox ids never do.
            .filter(|name| !name.starts_with('.'))
            .map(SandboxId::new)
            .collect();
        ids.sort();
        Ok(ids)
    }
}

#[async_trait]
impl Driver for ProcessDriver {
    fn name(&self) -> &'static str {
        "process"
    }

    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        let inner = &self.inner;
        let _guard = inner.locks.lock(&launch.sandbox, true).await?;
        let run = inner.run_file(&launch.sandbox)?;
        let newest = inner.newest_started(&launch.sandbox)?.max(run.map(|r| r.generation));
        if let Some(newest) = newest.filter(|n| *n > launch.generation) {
            return Ok(StartReply::Failed {
                message: format!("generation {} is superseded by {newest}", launch.generation),
            });
        }
        // This generation already ran: report its run, never start a second one.
        if newest == Some(launch.generation) {
            return Ok(match inner.observe(&launch.sandbox)? {
                RuntimeState::Running { started_at } if run.is_some_and(|r| r.generation == launch.generation) => {
                    StartReply::Running { started_at }
                }
                RuntimeState::Exited(marker) if run.is_some_and(|r| r.generation == launch.generation) => {
                    StartReply::Exited(marker)
                }
                _ => StartReply::Gone,
            });
        }
        if run.is_some() {
            inner.stop_locked(&launch.sandbox, REPLACE_GRACE).await?;
        }
        match inner.spawn(&launch) {
            Ok(run) => Ok(StartReply::Running { started_at: Timestamp::from_unix_nanos(run.started_at) }),
            Err(DriverError::Failed(message)) => Ok(StartReply::Failed { message }),
            Err(e) => Err(e),
        }
    }

    async fn stop(&self, sandbox: &SandboxId, grace: Duration) -> Result<RuntimeState, DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.stop_locked(sandbox, grace).await
    }

    async fn delete(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let inner = &self.inner;
        let _guard = inner.locks.lock(sandbox, false).await?;
        inner.stop_locked(sandbox, Duration::ZERO).await?;
        match std::fs::remove_dir_all(inner.dir(sandbox)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing the sandbox's directory", e)),
        }
        match std::fs::remove_file(inner.started_file(sandbox)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing the sandbox's started record", e)),
        }
        inner.locks.remove(sandbox)
    }

    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        let _guard = self.inner.locks.lock(sandbox, false).await?;
        self.inner.observe(sandbox)
    }

    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError> {
        ListPage::of(self, self.inner.ids()?, after, limit).await
    }

    async fn watch(&self) -> Result<WatchStream, DriverError> {
        let inner = Arc::clone(&self.inner);
        self.inner.monitor.call_once(|| {
            tokio::spawn(Arc::clone(&inner).monitor());
        });
        // Subscribe before the sync, so nothing that changes in between is missed.
        let events = inner.events.subscribe();
        let mut sync = Vec::new();
        for id in inner.ids()? {
            let _guard = inner.locks.lock(&id, false).await?;
            let state = inner.observe(&id)?;
            sync.push(Ok(WatchEvent::Sync { sandbox: id, state }));
        }
        sync.push(Ok(WatchEvent::Synced));
        let live = futures_util::stream::unfold(events, |mut events| async move {
            let item = match events.recv().await {
                Ok((sandbox, state)) => Ok(WatchEvent::Changed { sandbox, state }),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Err(DriverError::Unavailable(format!("the watch fell {n} events behind")))
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((item, events))
        });
        Ok(Box::pin(futures_util::StreamExt::chain(futures_util::stream::iter(sync), live)))
    }
}
