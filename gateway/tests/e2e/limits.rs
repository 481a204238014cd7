//! Resource limits (DESIGN 10) on every driver: the process driver's own cgroups, Docker's and
//! Podman's. A memory hog ends in Error OutOfMemory, a fork bomb is held by the process limit
//! (and the supervisor, in the same cgroup, survives it), and a busy loop gets about its CPU
//! share. The sandbox's cgroup is found from the host through its run's first process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_proto::v1 as pb;

use crate::conformance::{Runtime, Target, clean_up, image_for, supervisor_pids, target};
use crate::harness::*;

const MIB: i64 = 1 << 20;

async fn create_limited(
    target: &Target,
    sandboxes: &mut Sandboxes,
    name: &str,
    command: &[&str],
    limits: pb::ResourceLimits,
) -> pb::Sandbox {
    let mut s = spec(command);
    s.image = image_for(target).to_string();
    s.limits = Some(limits);
    let request = pb::CreateSandboxRequest { name: name.into(), spec: Some(s), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap().into_inner().sandbox.unwrap()
}

/// The host pid of the sandbox's run: the process driver's supervisor, a container's init.
fn run_pid(target: &Target, id: &str) -> i32 {
    let pid = match target.runtime {
        Runtime::Process => supervisor_pids(id).first().copied(),
        _ => {
            let container = berth_drivers::container::container_name(&berth_core::SandboxId::new(id));
            target.cli(&["inspect", "--format", "{{.State.Pid}}", &container]).parse().ok()
        }
    };
    pid.filter(|p| *p > 0).unwrap_or_else(|| panic!("{:?}: no live run of {id}", target.runtime))
}

/// Where `file` of `pid`'s cgroup of `controller` is on the host (cgroup v1's per-controller
/// hierarchy, else the unified one).
fn cgroup_file(pid: i32, controller: &str, file: &str) -> PathBuf {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        if controllers.split(',').any(|c| c == controller) {
            let mount = std::fs::read_dir("/sys/fs/cgroup")
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.file_name().unwrap().to_str().unwrap().split(',').any(|c| c == controller))
                .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup").join(controller));
            return mount.join(path.trim_start_matches('/')).join(file);
        }
    }
    let unified = cgroups.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup");
    PathBuf::from("/sys/fs/cgroup").join(unified.trim_start_matches('/')).join(file)
}

fn read_number(path: &PathBuf, key: Option<&str>) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value = match key {
        None => text.trim(),
        Some(key) => text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')).unwrap_or("0"),
    };
    value.trim().parse().unwrap_or_else(|e| panic!("{}: {text:?}: {e}", path.display()))
}

async fn a_memory_hog_ends_in_error_out_of_memory(runtime: Runtime) {
    let Some(target) = target(runtime, "oom").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    // dd fills a 256 MiB buffer from /dev/zero: far past the sandbox's 32 MiB.
    let command = ["sh", "-c", "sleep 1; dd if=/dev/zero of=/dev/null bs=256M count=1; exit 3"];
    let limits = pb::ResourceLimits { memory_bytes: Some(32 * MIB), ..Default::default() };
    create_limited(&target, &mut sandboxes, "hog", &command, limits).await;
    let (failed, seen) = wait_phase(&mut sandboxes, "hog", pb::Phase::Error).await;
    let failure = failed.failure.unwrap();
    assert_eq!(failure.reason, "OutOfMemory", "{runtime:?}: {failure:?} after {seen:?}");
    assert!(failure.message.contains(&(32 * MIB).to_string()), "{runtime:?}: {}", failure.message);
    assert!(failure.exit_code.is_some_and(|c| c != 0), "{runtime:?}: {failure:?}");
    // The record says so ever after, whatever the runtime reports later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = get(&mut sandboxes, "hog").await.unwrap().failure.unwrap();
    assert_eq!(later.reason, "OutOfMemory", "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_fork_bomb_is_held_by_the_process_limit(runtime: Runtime) {
    let Some(target) = target(runtime, "forkbomb").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    const LIMIT: i64 = 64;
    // The bomb goes off in a subshell of its own, so the main process (a sleep) never needs a
    // fork. Half a core keeps its spinning from starving the tests running beside it.
    let command = ["sh", "-c", "(b() { b | b & }; b) & exec sleep 3600"];
    let limits = pb::ResourceLimits { pids: Some(LIMIT), cpu_millis: Some(500), ..Default::default() };
    let id = create_limited(&target, &mut sandboxes, "bomb", &command, limits).await.id;
    wait_phase(&mut sandboxes, "bomb", pb::Phase::Ready).await;
    let pid = run_pid(&target, &id);
    let (current, events) = (cgroup_file(pid, "pids", "pids.current"), cgroup_file(pid, "pids", "pids.events"));
    let max = cgroup_file(pid, "pids", "pids.max");
    assert_eq!(std::fs::read_to_string(&max).unwrap().trim(), LIMIT.to_string(), "{runtime:?}");
    let until = Instant::now() + Duration::from_secs(3);
    let mut highest = 0;
    while Instant::now() < until {
        highest = highest.max(read_number(&current, None));
        // The host goes on making processes.
        assert!(std::process::Command::new("true").status().unwrap().success(), "{runtime:?}: the host cannot fork");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(highest <= LIMIT as u64, "{runtime:?}: {highest} tasks under a limit of {LIMIT}");
    assert!(read_number(&events, Some("max")) > 0, "{runtime:?}: the bomb never reached the limit");
    // Its supervisor, in the same cgroup, still holds the session: the sandbox is Ready, and a
    // stop ends the run with the bomb.
    let after = get(&mut sandboxes, "bomb").await.unwrap();
    assert_eq!(phase(&after), pb::Phase::Ready, "{runtime:?}: {:?}", after.failure);
    lifecycle(&mut sandboxes, "stop", "bomb").await.unwrap();
    wait_phase(&mut sandboxes, "bomb", pb::Phase::Stopped).await;
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_busy_loop_gets_about_its_cpu_share(runtime: Runtime) {
    let Some(target) = target(runtime, "cpu").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let command = ["sh", "-c", "while :; do :; done"];
    let limits = pb::ResourceLimits { cpu_millis: Some(250), ..Default::default() };
    let id = create_limited(&target, &mut sandboxes, "busy", &command, limits).await.id;
    wait_phase(&mut sandboxes, "busy", pb::Phase::Ready).await;
    let pid = run_pid(&target, &id);
    let throttled = cgroup_file(pid, "cpu", "cpu.stat");
    // The CPU time of the run's processes (utime + stime of each, in clock ticks) over 3 s.
    let ticks = || -> u64 {
        let pids = std::fs::read_to_string(cgroup_file(pid, "cpu", "cgroup.procs")).unwrap();
        pids.lines()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{}/stat", p.trim())).ok())
            .map(|stat| {
                let fields: Vec<u64> = stat[stat.rfind(')').unwrap() + 2..]
                    .split(' ')
                    .skip(11)
                    .take(2)
                    .map(|f| f.parse().unwrap())
                    .collect();
                fields.iter().sum::<u64>()
            })
            .sum()
    };
    let hz = 100.0; // USER_HZ on Linux
    let (before, at) = (ticks(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let share = (ticks() - before) as f64 / hz / at.elapsed().as_secs_f64();
    // About a quarter of a core: never a whole one, which the loop would take unlimited.
    assert!((0.05..0.45).contains(&share), "{runtime:?}: the loop got {share:.2} cores under a limit of 0.25");
    assert!(read_number(&throttled, Some("nr_throttled")) > 0, "{runtime:?}: never throttled");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_cpu_share_past_the_host_is_refused_naming_the_field(runtime: Runtime) {
    let Some(target) = target(runtime, "toomanycpus").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let cpus = std::thread::available_parallelism().unwrap().get() as i64;
    let mut s = spec(&["sleep", "3600"]);
    s.image = image_for(&target).to_string();
    s.limits = Some(pb::ResourceLimits { cpu_millis: Some((cpus + 1) * 1000), ..Default::default() });
    let request = pb::CreateSandboxRequest { name: "greedy".into(), spec: Some(s), ..Default::default() };
    let status = sandboxes.create_sandbox(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{runtime:?}: {status}");
    assert!(status.message().contains("spec.limits.cpu_millis"), "{runtime:?}: {}", status.message());
    assert!(status.message().contains(&format!("{cpus} CPUs")), "{runtime:?}: {}", status.message());
    // Nothing was written; all the host has is granted.
    assert_eq!(get(&mut sandboxes, "greedy").await.unwrap_err().code(), tonic::Code::NotFound);
    create_limited(
        &target,
        &mut sandboxes,
        "all",
        &["sleep", "3600"],
        pb::ResourceLimits { cpu_millis: Some(cpus * 1000), ..Default::default() },
    )
    .await;
    wait_phase(&mut sandboxes, "all", pb::Phase::Ready).await;
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! limits {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_memory_hog_ends_in_error_out_of_memory() {
                    super::a_memory_hog_ends_in_error_out_of_memory(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_fork_bomb_is_held_by_the_process_limit() {
                    super::a_fork_bomb_is_held_by_the_process_limit(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_cpu_share_past_the_host_is_refused_naming_the_field() {
                    super::a_cpu_share_past_the_host_is_refused_naming_the_field(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_busy_loop_gets_about_its_cpu_share() {
                    super::a_busy_loop_gets_about_its_cpu_share(Runtime::$runtime).await
                }
            }
        )*
    };
}

limits!(Process => process, Docker => docker, Podman => podman);
