//! The supervisor's cgroups (DESIGN 10).
//!
//! The process driver makes a cgroup per sandbox for its limits; the supervisor joins it before
//! the command starts, so the command and everything it starts are held by them (a process
//! moved in after its first fork would leave that child outside). A container is in its
//! runtime's cgroup already.
//!
//! Either way the kernel counts, per memory cgroup, the processes it killed for memory. The
//! count before the command and after it tells a command the OOM killer ended from one killed
//! by anyone else with the same SIGKILL.

use std::path::{Path, PathBuf};

use procfs::ProcessCGroups;
use procfs::process::{MountInfos, Process};

/// Moves this process (all its threads) into each cgroup directory.
pub fn join(dirs: &[PathBuf]) -> std::io::Result<()> {
    for dir in dirs {
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .map_err(|e| std::io::Error::new(e.kind(), format!("joining the cgroup {}: {e}", dir.display())))?;
    }
    Ok(())
}

/// How many processes the kernel killed for memory in this process's memory cgroup (and
/// those under it), or `None` where that cannot be read.
pub fn oom_kills() -> Option<u64> {
    let me = Process::myself().ok()?;
    let file = memory_counter(&me.cgroups().ok()?, &me.mountinfo().ok()?)?;
    counter(&std::fs::read_to_string(file).ok()?)
}

/// The file holding the memory cgroup's kill count: cgroup v1's memory controller if it is
/// mounted, else the unified (v2) hierarchy's.
fn memory_counter(cgroups: &ProcessCGroups, mounts: &MountInfos) -> Option<PathBuf> {
    let v1 = cgroups.0.iter().find(|c| c.controllers.iter().any(|c| c == "memory"));
    if let Some(v1) = v1
        && let Some(dir) = mounted(mounts, &v1.pathname, |fs, options| fs == "cgroup" && options.contains_key("memory"))
    {
        return Some(dir.join("memory.oom_control"));
    }
    let v2 = cgroups.0.iter().find(|c| c.hierarchy == 0 && c.controllers.is_empty())?;
    Some(mounted(mounts, &v2.pathname, |fs, _| fs == "cgroup2")?.join("memory.events"))
}

/// Where cgroup `path` is seen in the mount table: a mount of the right kind whose root holds
/// it (a container sees its own cgroup as its mount's root).
fn mounted(
    mounts: &MountInfos,
    path: &str,
    kind: impl Fn(&str, &std::collections::HashMap<String, Option<String>>) -> bool,
) -> Option<PathBuf> {
    mounts.iter().filter(|m| kind(&m.fs_type, &m.super_options)).find_map(|m| {
        let below = Path::new(path).strip_prefix(&m.root).ok()?;
        Some(m.mount_point.join(below))
    })
}

/// `oom_kill N` in v1's memory.oom_control and v2's memory.events alike.
fn counter(file: &str) -> Option<u64> {
    file.lines().find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use procfs::FromBufRead;

    use super::*;

    fn parse(cgroups: &str, mounts: &str) -> Option<PathBuf> {
        let cgroups = ProcessCGroups::from_buf_read(cgroups.as_bytes()).unwrap();
        memory_counter(&cgroups, &MountInfos::from_buf_read(mounts.as_bytes()).unwrap())
    }

    const V1_MOUNTS: &str = "\
25 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
35 31 0:30 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
36 31 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
37 31 0:32 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";

    #[test]
    fn on_a_v1_host_the_memory_controllers_cgroup_is_read() {
        let cgroups = "12:pids:/berth/sb-1\n7:memory:/berth/sb-1\n0::/berth/sb-1\n";
        let file = parse(cgroups, V1_MOUNTS).unwrap();
        assert_eq!(file, Path::new("/sys/fs/cgroup/memory/berth/sb-1/memory.oom_control"));
    }

    #[test]
    fn in_a_container_its_own_cgroup_is_the_mounts_root() {
        let mounts = "1066 1060 0:31 /docker/0123 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
        let cgroups = "7:memory:/docker/0123\n";
        let file = parse(cgroups, mounts).unwrap();
        assert_eq!(file, Path::new("/sys/fs/cgroup/memory/memory.oom_control"));
    }

    #[test]
    fn on_a_v2_host_the_unified_hierarchy_is_read() {
        let mounts = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let file = parse("0::/berth/sb-1\n", mounts).unwrap();
        assert_eq!(file, Path::new("/sys/fs/cgroup/berth/sb-1/memory.events"));
        // A cgroup outside what is mounted cannot be read.
        let mounts = "30 25 0:26 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(parse("0::/berth/sb-1\n", mounts), None);
    }

    #[test]
    fn the_kill_count_is_read_by_its_key() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(counter(v1), Some(3));
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(counter(v2), Some(1));
        assert_eq!(counter("oom 2\n"), None);
    }

    #[test]
    fn this_hosts_counter_reads() {
        // Wherever the tests run in a cgroup of their own kernel, the count is readable.
        if Path::new("/proc/self/mountinfo").exists() && Path::new("/sys/fs/cgroup").exists() {
            assert!(oom_kills().is_some(), "no memory cgroup kill count under /sys/fs/cgroup");
        }
    }
}
