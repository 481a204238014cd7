//! The process driver's limits (DESIGN 10), on this host's cgroups.
//!
//! A sandbox with limits gets a cgroup `berth/<scope>-<sandbox id>` holding them (the scope
//! names the driver, so two process drivers on one machine, two nodes of a test rig, never
//! touch each other's runs of one sandbox): on cgroup v1 one per
//! controller a limit needs (`cpu`, `memory`, `pids`), on v2 one in the unified hierarchy. They
//! are made before each start, joined by the supervisor before its command runs, and removed
//! with the sandbox, after whatever is left in them is killed. Making a cgroup needs a writable
//! cgroup file system (the gateway as root, or a delegated v2 subtree): where there is none, a
//! limit is refused at admission, never run without.
//!
//! Every run, limited or not, also joins a freezer where the host has one (v1's `freezer`
//! controller, v2's `cgroup.freeze` of the same sandbox cgroup): that is what a pause freezes
//! (DESIGN 12.1). Where there is none the run starts all the same, and a pause is refused
//! saying why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_core::SandboxId;
use berth_core::limits::{CPU_PERIOD_US, ResourceLimits, cfs_quota_us};
use procfs::process::{MountInfos, Process};

/// Where Berth's cgroups go under each hierarchy's root.
const PARENT: &str = "berth";
/// How long the processes left in a removed sandbox's cgroup get to die after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The controllers each limit needs.
const CONTROLLERS: [(&str, &str); 3] =
    [("cpu", "spec.limits.cpu_millis"), ("memory", "spec.limits.memory_bytes"), ("pids", "spec.limits.pids")];

/// How long a freeze or a thaw may take to hold every process.
const FREEZE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
enum Hierarchy {
    /// cgroup v1: where each usable controller is mounted (at its root), or why it is not usable;
    /// and the freezer's, likewise.
    V1 { controllers: BTreeMap<&'static str, Result<PathBuf, String>>, freezer: Result<PathBuf, String> },
    /// cgroup v2: the unified hierarchy's root, and the controllers delegated to `berth/`.
    V2 { root: PathBuf, controllers: Vec<String> },
    /// Neither: why.
    Unusable(String),
}

/// This host's cgroups, as one process driver names its sandboxes' in them (its scope, if any).
#[derive(Debug)]
pub struct Cgroups(Hierarchy, String);

fn io_error(context: String, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{context}: {e}"))
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value).map_err(|e| io_error(format!("writing {value:?} to {}", path.display()), e))
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_error(format!("creating {}", dir.display()), e))
}

impl Cgroups {
    /// This host's, as the mount table shows them; `berth/` is made under each usable one. The
    /// sandboxes' cgroups are named in `scope`.
    pub fn detect(scope: &str) -> Self {
        let hierarchy = match Process::myself().and_then(|me| me.mountinfo()) {
            Ok(mounts) => Self::on(&mounts).0,
            Err(e) => Hierarchy::Unusable(format!("the mount table is unreadable: {e}")),
        };
        Self(hierarchy, scope.to_string())
    }

    /// The name of `sandbox`'s cgroups under `berth/`.
    fn leaf(&self, sandbox: &SandboxId) -> String {
        match self.1.as_str() {
            "" => sandbox.to_string(),
            scope => format!("{scope}-{sandbox}"),
        }
    }

    fn on(mounts: &MountInfos) -> Self {
        let v1 = |controller: &str| {
            mounts.iter().find(|m| m.fs_type == "cgroup" && m.root == "/" && m.super_options.contains_key(controller))
        };
        let usable = |controller: &str| match v1(controller) {
            None => Err(format!("no cgroup v1 {controller} controller is mounted")),
            Some(m) => make_dir(&m.mount_point.join(PARENT)).map(|()| m.mount_point.clone()).map_err(|e| e.to_string()),
        };
        if CONTROLLERS.iter().chain([&("freezer", "")]).any(|(controller, _)| v1(controller).is_some()) {
            let controllers = CONTROLLERS.iter().map(|(controller, _)| (*controller, usable(controller))).collect();
            return Self(Hierarchy::V1 { controllers, freezer: usable("freezer") }, String::new());
        }
        match mounts.iter().find(|m| m.fs_type == "cgroup2" && m.root == "/") {
            None => Self(Hierarchy::Unusable("no cgroup file system is mounted".into()), String::new()),
            Some(m) => match delegate(&m.mount_point) {
                Ok(controllers) => Self(Hierarchy::V2 { root: m.mount_point.clone(), controllers }, String::new()),
                Err(e) => Self(Hierarchy::Unusable(e.to_string()), String::new()),
            },
        }
    }

    /// Why this host cannot enforce one of `limits`: its field, and the reason.
    pub fn unenforceable(&self, limits: &ResourceLimits) -> Option<(&'static str, String)> {
        let asked = [limits.cpu_millis.is_some(), limits.memory_bytes.is_some(), limits.pids.is_some()];
        CONTROLLERS.iter().zip(asked).filter(|(_, asked)| *asked).find_map(|((controller, field), _)| {
            let why = match &self.0 {
                Hierarchy::V1 { controllers, .. } => {
                    controllers.get(controller).and_then(|u| u.as_ref().err().cloned())
                }
                Hierarchy::V2 { controllers, .. } if !controllers.iter().any(|c| c == controller) => {
                    Some(format!("the cgroup v2 {controller} controller is not available to {PARENT}/"))
                }
                Hierarchy::V2 { .. } => None,
                Hierarchy::Unusable(why) => Some(why.clone()),
            };
            why.map(|why| (*field, format!("cannot make a cgroup for it: {why}")))
        })
    }

    /// The sandbox's cgroup directories, as they are or would be (v1's freezer last).
    fn dirs(&self, sandbox: &SandboxId) -> Vec<(&'static str, PathBuf)> {
        match &self.0 {
            Hierarchy::V1 { controllers, freezer } => controllers
                .iter()
                .map(|(controller, root)| (*controller, root))
                .chain([("freezer", freezer)])
                .filter_map(|(controller, root)| {
                    Some((controller, root.as_ref().ok()?.join(PARENT).join(self.leaf(sandbox))))
                })
                .collect(),
            Hierarchy::V2 { root, .. } => vec![("", root.join(PARENT).join(self.leaf(sandbox)))],
            Hierarchy::Unusable(_) => Vec::new(),
        }
    }

    /// Makes the sandbox's cgroups holding `limits` (again, before each start: the values are
    /// the spec's, which never changes) and its freezer's, and returns the directories its
    /// supervisor joins. A freezer that cannot be made is left out (the run cannot be paused,
    /// and a pause says why); a limit that cannot be held is an error.
    pub fn make(&self, sandbox: &SandboxId, limits: &ResourceLimits) -> std::io::Result<Vec<PathBuf>> {
        if let Some((field, why)) = self.unenforceable(limits) {
            return Err(std::io::Error::other(format!("{field}: {why}")));
        }
        let mut joined = Vec::new();
        for (controller, dir) in self.dirs(sandbox) {
            let files = settings(controller, limits);
            let freezer = matches!(controller, "freezer" | "");
            if files.is_empty() && !freezer {
                continue;
            }
            if let Err(e) = make_dir(&dir) {
                if files.is_empty() {
                    tracing::warn!(sandbox = %sandbox, error = %e, "no freezer for this run: it cannot be paused");
                    continue;
                }
                return Err(e);
            }
            for (file, value) in files {
                // memory.memsw is there only with swap accounting on; without it there is no
                // swap to hold back.
                if file.ends_with("memsw.limit_in_bytes") || file == "memory.swap.max" {
                    if dir.join(file).exists() {
                        write(&dir.join(file), &value)?;
                    }
                    continue;
                }
                write(&dir.join(file), &value)?;
            }
            joined.push(dir);
        }
        Ok(joined)
    }

    /// Kills whatever is left in the sandbox's cgroups and removes them. Absence is success.
    pub async fn remove(&self, sandbox: &SandboxId) -> std::io::Result<()> {
        // A frozen process takes no signal (on v1 not even SIGKILL) until it is thawed.
        if self.frozen(sandbox) {
            self.freeze(sandbox, false).await?;
        }
        for (_, dir) in self.dirs(sandbox) {
            if !dir.exists() {
                continue;
            }
            let deadline = tokio::time::Instant::now() + KILL_WAIT;
            loop {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
                if pids.is_empty() {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(std::io::Error::other(format!(
                        "{} still holds processes {pids:?} after SIGKILL",
                        dir.display()
                    )));
                }
                for pid in pids.into_iter().filter(|pid| *pid > 1) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_error(format!("removing {}", dir.display()), e));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Cgroups {
    /// The sandbox's freezer directory, or why this host gives it none.
    fn freezer(&self, sandbox: &SandboxId) -> Result<PathBuf, String> {
        let dir = match &self.0 {
            Hierarchy::V1 { freezer, .. } => freezer.clone()?.join(PARENT).join(self.leaf(sandbox)),
            Hierarchy::V2 { root, .. } => root.join(PARENT).join(self.leaf(sandbox)),
            Hierarchy::Unusable(why) => return Err(why.clone()),
        };
        match dir.is_dir() {
            true => Ok(dir),
            false => Err(format!("its run is in no freezer cgroup ({} is missing)", dir.display())),
        }
    }

    /// Why this host gives runs no freezer, if it does not.
    pub fn no_freezer(&self) -> Option<String> {
        match &self.0 {
            Hierarchy::V1 { freezer, .. } => freezer.as_ref().err().cloned(),
            Hierarchy::V2 { .. } => None,
            Hierarchy::Unusable(why) => Some(why.clone()),
        }
    }

    /// Whether the sandbox's run is frozen (every process of it held).
    pub fn frozen(&self, sandbox: &SandboxId) -> bool {
        self.freezer(sandbox).is_ok_and(|dir| read_frozen(&dir, self.is_v1()) == Some(true))
    }

    fn is_v1(&self) -> bool {
        matches!(self.0, Hierarchy::V1 { .. })
    }

    /// Freezes (`frozen`) or thaws the sandbox's run, and waits until the kernel says every
    /// process of it is so.
    pub async fn freeze(&self, sandbox: &SandboxId, frozen: bool) -> std::io::Result<()> {
        let dir =
            self.freezer(sandbox).map_err(|why| std::io::Error::other(format!("cannot freeze the run: {why}")))?;
        let v1 = self.is_v1();
        let (file, value) = match (v1, frozen) {
            (true, true) => ("freezer.state", "FROZEN"),
            (true, false) => ("freezer.state", "THAWED"),
            (false, true) => ("cgroup.freeze", "1"),
            (false, false) => ("cgroup.freeze", "0"),
        };
        let deadline = tokio::time::Instant::now() + FREEZE_WAIT;
        loop {
            // v1 may settle back to FREEZING when a process was in a state it could not freeze
            // in: asking again retries it.
            write(&dir.join(file), value)?;
            if read_frozen(&dir, v1) == Some(frozen) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(std::io::Error::other(format!(
                    "{} did not become {value} within {FREEZE_WAIT:?}",
                    dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// What a freezer directory says: frozen, thawed, or (v1's FREEZING, an unreadable file)
/// neither yet.
fn read_frozen(dir: &Path, v1: bool) -> Option<bool> {
    if v1 {
        return match std::fs::read_to_string(dir.join("freezer.state")).ok()?.trim() {
            "FROZEN" => Some(true),
            "THAWED" => Some(false),
            _ => None,
        };
    }
    let events = std::fs::read_to_string(dir.join("cgroup.events")).ok()?;
    events.lines().find_map(|l| l.strip_prefix("frozen ")).map(|v| v.trim() == "1")
}

/// What to write in a sandbox's cgroup of `controller` ("" for v2's one) for `limits`, in
/// order: a v1 memory limit before memory and swap together, which may never be below it. A
/// cgroup made before holds these same values (a spec never changes), so writing them again
/// changes nothing.
fn settings(controller: &str, limits: &ResourceLimits) -> Vec<(&'static str, String)> {
    let mut files = Vec::new();
    match controller {
        "freezer" => {}
        "cpu" => {
            if let Some(millis) = limits.cpu_millis {
                files.push(("cpu.cfs_period_us", CPU_PERIOD_US.to_string()));
                files.push(("cpu.cfs_quota_us", cfs_quota_us(millis).to_string()));
            }
        }
        "memory" => {
            if let Some(bytes) = limits.memory_bytes {
                files.push(("memory.limit_in_bytes", bytes.to_string()));
                files.push(("memory.memsw.limit_in_bytes", bytes.to_string()));
            }
        }
        "pids" => {
            if let Some(pids) = limits.pids {
                files.push(("pids.max", pids.to_string()));
            }
        }
        _ => {
            if let Some(millis) = limits.cpu_millis {
                files.push(("cpu.max", format!("{} {CPU_PERIOD_US}", cfs_quota_us(millis))));
            }
            if let Some(bytes) = limits.memory_bytes {
                files.push(("memory.max", bytes.to_string()));
                files.push(("memory.swap.max", "0".to_string()));
            }
            if let Some(pids) = limits.pids {
                files.push(("pids.max", pids.to_string()));
            }
        }
    }
    files
}

/// Makes `berth/` under a v2 root with every limit's controller it can have delegated: each
/// must be enabled in the root's `cgroup.subtree_control` and then in `berth/`'s.
fn delegate(root: &Path) -> std::io::Result<Vec<String>> {
    let read =
        |path: &Path| std::fs::read_to_string(path).map_err(|e| io_error(format!("reading {}", path.display()), e));
    let available = read(&root.join("cgroup.controllers"))?;
    let wanted: Vec<String> = CONTROLLERS
        .iter()
        .map(|(controller, _)| controller.to_string())
        .filter(|c| available.split_whitespace().any(|a| a == c))
        .collect();
    let parent = root.join(PARENT);
    make_dir(&parent)?;
    let enable: String = wanted.iter().map(|c| format!("+{c} ")).collect();
    for dir in [root, parent.as_path()] {
        if !enable.is_empty() {
            write(&dir.join("cgroup.subtree_control"), enable.trim_end())?;
        }
    }
    let enabled = read(&parent.join("cgroup.subtree_control"))?;
    Ok(wanted.into_iter().filter(|c| enabled.split_whitespace().any(|e| e == c)).collect())
}

#[cfg(test)]
mod tests {
    use procfs::FromBufRead;

    use super::*;

    fn limits(cpu: Option<u64>, memory: Option<u64>, pids: Option<u64>) -> ResourceLimits {
        ResourceLimits { cpu_millis: cpu, memory_bytes: memory, pids }
    }

    #[test]
    fn each_limit_is_written_where_its_controller_reads_it() {
        let all = limits(Some(1500), Some(64 << 20), Some(100));
        assert_eq!(
            settings("cpu", &all),
            [("cpu.cfs_period_us", "100000".to_string()), ("cpu.cfs_quota_us", "150000".to_string())]
        );
        let memory = settings("memory", &all);
        assert_eq!(memory[0], ("memory.limit_in_bytes", (64u64 << 20).to_string()));
        assert_eq!(memory[1].0, "memory.memsw.limit_in_bytes");
        assert_eq!(settings("pids", &all), [("pids.max", "100".to_string())]);
        let v2 = settings("", &all);
        assert_eq!(v2[0], ("cpu.max", "150000 100000".to_string()));
        assert!(v2.contains(&("memory.swap.max", "0".to_string())));
        // A controller no limit needs gets nothing, and so no cgroup.
        assert!(settings("cpu", &limits(None, Some(64 << 20), None)).is_empty());
    }

    #[test]
    fn a_host_without_a_writable_cgroup_file_system_refuses_limits_by_field() {
        let none = MountInfos::from_buf_read("25 30 0:22 / /sys rw - sysfs sysfs rw\n".as_bytes()).unwrap();
        let cgroups = Cgroups::on(&none);
        let (field, why) = cgroups.unenforceable(&limits(None, Some(64 << 20), None)).unwrap();
        assert_eq!(field, "spec.limits.memory_bytes");
        assert!(why.contains("no cgroup file system"), "{why}");
        assert_eq!(cgroups.unenforceable(&ResourceLimits::default()), None);
        let id = SandboxId::new("sb-1");
        assert!(cgroups.make(&id, &ResourceLimits::default()).unwrap().is_empty());
        assert!(cgroups.make(&id, &limits(Some(100), None, None)).is_err());
    }

    #[test]
    fn on_v1_a_missing_controller_refuses_only_its_own_limit() {
        let dir = tempfile::tempdir().unwrap();
        let memory = dir.path().join("memory");
        let mounts = format!("36 31 0:31 / {} rw - cgroup cgroup rw,memory\n", memory.display());
        let cgroups = Cgroups::on(&MountInfos::from_buf_read(mounts.as_bytes()).unwrap());
        assert_eq!(cgroups.unenforceable(&limits(None, Some(64 << 20), None)), None);
        let (field, _) = cgroups.unenforceable(&limits(Some(100), Some(64 << 20), None)).unwrap();
        assert_eq!(field, "spec.limits.cpu_millis");
        assert!(memory.join(PARENT).is_dir());
    }
}
