//! One conformance suite, run against every driver: the process driver, Docker and Podman.
//! Each test drives a real gateway binary on a real runtime. Docker and Podman tests need their
//! daemons (`ci/runtimes up`) and a static supervisor (`ci/build-static-supervisor`); under
//! `ci/test` (`BERTH_REQUIRE_RUNTIMES=1`) a missing one is a failure, elsewhere the test says
//! it skips.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use berth_core::{RuntimeState, SandboxId, SandboxSpec, StartReply};
use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{ContainerConfig, ContainerDriver, Engine, container_name, image, volume_name};
use berth_drivers::process::{ProcessConfig, ProcessDriver};
use berth_drivers::{Act, CrashPoint, Driver, Launch};
use berth_gateway::data_dir::SOCKET_DIR;
use berth_proto::v1 as pb;

use crate::harness::*;

const IMAGE: &str = "berth-test/sandbox:1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Process,
    Docker,
    Podman,
}

/// A runtime a test can use: how to start a gateway on it, and how to reach it out of band.
pub(crate) struct Target {
    pub(crate) runtime: Runtime,
    socket: Option<String>,
    instance: String,
}

fn required() -> bool {
    std::env::var("BERTH_REQUIRE_RUNTIMES").is_ok_and(|v| v == "1")
}

fn unavailable(runtime: Runtime, why: &str) -> Option<Target> {
    assert!(!required(), "{runtime:?} is required under ci/test but unavailable: {why}");
    eprintln!("skipping the {runtime:?} conformance test: {why} (run ci/runtimes up, or ci/test)");
    None
}

fn static_supervisor() -> Option<PathBuf> {
    std::env::var_os("BERTH_TEST_STATIC_SUPERVISOR").map(PathBuf::from).filter(|p| p.exists())
}

/// Imports the sandbox image into a runtime once per test process.
async fn import_image(engine: &dyn Engine) -> Result<(), String> {
    let supervisor = static_supervisor().ok_or("no static supervisor")?;
    let rootfs = image::rootfs(std::path::Path::new(image::BUSYBOX), &supervisor).map_err(|e| e.to_string())?;
    engine.import_image(IMAGE, rootfs).await.map_err(|e| e.to_string())
}

static DOCKER_IMAGE: OnceLock<Result<(), String>> = OnceLock::new();
static PODMAN_IMAGE: OnceLock<Result<(), String>> = OnceLock::new();

pub(crate) async fn target(runtime: Runtime, test: &str) -> Option<Target> {
    let instance = format!("t-{test}").chars().take(40).collect::<String>();
    if runtime == Runtime::Process {
        return Some(Target { runtime, socket: None, instance });
    }
    let (variable, once) = match runtime {
        Runtime::Docker => ("BERTH_TEST_DOCKER_SOCKET", &DOCKER_IMAGE),
        _ => ("BERTH_TEST_PODMAN_SOCKET", &PODMAN_IMAGE),
    };
    let Ok(socket) = std::env::var(variable) else { return unavailable(runtime, &format!("{variable} is not set")) };
    if static_supervisor().is_none() {
        return unavailable(runtime, "BERTH_TEST_STATIC_SUPERVISOR does not name a static berth-supervisor");
    }
    let engine: Box<dyn Engine> = match runtime {
        Runtime::Docker => match DockerEngine::connect(&socket, &instance).await {
            Ok(e) => Box::new(e),
            Err(e) => return unavailable(runtime, &e.to_string()),
        },
        _ => match PodmanEngine::connect(&socket, &instance).await {
            Ok(e) => Box::new(e),
            Err(e) => return unavailable(runtime, &e.to_string()),
        },
    };
    if once.get().is_none() {
        let imported = import_image(engine.as_ref()).await;
        let _ = once.set(imported);
    }
    if let Some(Err(e)) = once.get() {
        return unavailable(runtime, &format!("the sandbox image: {e}"));
    }
    Some(Target { runtime, socket: Some(socket), instance })
}

impl Target {
    fn gateway_args(&self) -> Vec<String> {
        let mut args = vec!["--instance".to_string(), self.instance.clone()];
        match self.runtime {
            Runtime::Process => args.extend(["--driver".into(), "process".into()]),
            Runtime::Docker | Runtime::Podman => {
                let (driver, flag) = if self.runtime == Runtime::Docker {
                    ("docker", "--docker-socket")
                } else {
                    ("podman", "--podman-socket")
                };
                let supervisor = static_supervisor().expect("checked").display().to_string();
                args.extend([
                    "--driver".into(),
                    driver.into(),
                    flag.into(),
                    self.socket.clone().expect("a socket"),
                    "--supervisor-bin".into(),
                    supervisor,
                ]);
            }
        }
        args
    }

    pub(crate) async fn gateway(&self, data: &DataDir, extra: &[&str]) -> Gateway {
        let mut args = self.gateway_args();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Gateway::start(data, &args).await
    }

    /// A second driver on the gateway's runtime and state, for what only a driver can do: a
    /// start that lands late.
    async fn driver(&self, data: &DataDir) -> Box<dyn Driver> {
        let socket_dir = data.path.join(SOCKET_DIR);
        let containers = |dir: &str| ContainerConfig {
            root: data.path.join(dir),
            supervisor: static_supervisor().expect("checked"),
            socket_dir: socket_dir.clone(),
        };
        let socket = self.socket.clone().unwrap_or_default();
        match self.runtime {
            Runtime::Process => Box::new(
                ProcessDriver::new(ProcessConfig {
                    root: data.path.join("sandboxes"),
                    supervisor: bin("berth-supervisor"),
                    gateway: format!("unix:{}", socket_dir.display()),
                })
                .unwrap(),
            ),
            Runtime::Docker => {
                let engine = DockerEngine::connect(&socket, &self.instance).await.unwrap();
                Box::new(ContainerDriver::new(engine, containers("docker")).unwrap())
            }
            Runtime::Podman => {
                let engine = PodmanEngine::connect(&socket, &self.instance).await.unwrap();
                Box::new(ContainerDriver::new(engine, containers("podman")).unwrap())
            }
        }
    }

    /// The runtime's CLI, pointed at the test's socket.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let socket = format!("unix://{}", self.socket.as_deref().expect("a container runtime"));
        let mut command = match self.runtime {
            Runtime::Docker => {
                let mut c = Command::new("docker");
                c.args(["-H", &socket]);
                c
            }
            _ => {
                let mut c = Command::new("podman");
                c.args(["--url", &socket]);
                c
            }
        };
        let out = command.args(args).output().expect("the runtime's CLI runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A file of the sandbox's workspace, read from the host.
    pub(crate) fn workspace_file(&self, data: &DataDir, id: &str, file: &str) -> Option<String> {
        match self.runtime {
            Runtime::Process => workspace_file(&data.path, id, file),
            _ => {
                let volume = volume_name(&berth_core::SandboxId::new(id));
                let mountpoint = self.cli(&["volume", "inspect", "--format", "{{.Mountpoint}}", &volume]);
                std::fs::read_to_string(PathBuf::from(mountpoint).join(file)).ok().map(|s| s.trim().to_string())
            }
        }
    }

    /// Waits until the sandbox's workspace file reads `want`; panics after 10 s (the workspace
    /// lost what its runs wrote).
    pub(crate) async fn wait_workspace_file(&self, data: &DataDir, id: &str, file: &str, want: &str) {
        let mut last = None;
        for _ in 0..500 {
            last = self.workspace_file(data, id, file);
            if last.as_deref() == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{:?}: {file} reads {last:?}, not {want:?}", self.runtime);
    }

    /// What identifies the run that is up now: the supervisor's pid, or the container's start.
    fn run_identity(&self, data: &DataDir, id: &str) -> Option<String> {
        match self.runtime {
            Runtime::Process => data.run_pid(id).map(|p| p.to_string()),
            _ => Some(self.cli(&[
                "inspect",
                "--format",
                "{{.State.StartedAt}}",
                &container_name(&berth_core::SandboxId::new(id)),
            ])),
        }
    }

    /// Removes the sandbox's compute resource behind Berth's back (`docker rm -f`).
    fn remove_out_of_band(&self, data: &DataDir, id: &str) {
        match self.runtime {
            Runtime::Process => {
                if let Some(pid) = data.run_pid(id) {
                    let _ =
                        nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
                // As an operator's `rm -rf` would, go on until it is gone: the dying run's
                // supervisor may still be writing its exit into the folder meanwhile.
                let dir = data.path.join("sandboxes").join(id);
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    match std::fs::remove_dir_all(&dir) {
                        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempts < 50 => {
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        result => break result.unwrap(),
                    }
                }
            }
            _ => {
                self.cli(&["rm", "-f", &container_name(&berth_core::SandboxId::new(id))]);
            }
        }
    }

    /// Kills the sandbox's run behind Berth's back (`docker kill`, or SIGKILL to the process
    /// group of every supervisor carrying its identity, recorded or not).
    pub(crate) fn kill_out_of_band(&self, id: &str) {
        match self.runtime {
            Runtime::Process => {
                let pids = supervisor_pids(id);
                assert!(!pids.is_empty(), "no run of {id} to kill");
                for pid in pids {
                    let group = nix::unistd::Pid::from_raw(pid);
                    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).unwrap();
                }
            }
            _ => {
                self.cli(&["kill", &container_name(&berth_core::SandboxId::new(id))]);
            }
        }
    }

    /// Everything of this gateway's left in the runtime: containers, volumes, state.
    fn leftovers(&self, data: &DataDir) -> Vec<String> {
        let dir = match self.runtime {
            Runtime::Process => "sandboxes",
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
        };
        let entries = |path: PathBuf| -> Vec<String> {
            std::fs::read_dir(path)
                .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default()
        };
        let mut left = Vec::new();
        for entry in entries(data.path.join(dir)) {
            // The drivers' own folders (started generations, locks): only what is in them
            // counts.
            // Tombstones stay: a deleted sandbox is never started again.
            if entry == berth_drivers::tombstone::TOMBSTONES_DIR {
                continue;
            }
            if entry.starts_with('.') {
                left.extend(entries(data.path.join(dir).join(&entry)).into_iter().map(|e| format!("{entry}/{e}")));
            } else {
                left.push(format!("state {entry}"));
            }
        }
        if self.runtime != Runtime::Process {
            let label = format!("label=dev.berth.owner={}", self.instance);
            let containers = self.cli(&["ps", "-a", "--filter", &label, "--format", "{{.Names}}"]);
            let volumes = self.cli(&["volume", "ls", "--filter", &label, "--format", "{{.Name}}"]);
            left.extend(containers.lines().chain(volumes.lines()).filter(|l| !l.is_empty()).map(str::to_string));
        }
        left
    }
}

pub(crate) fn image_for(target: &Target) -> &'static str {
    if target.runtime == Runtime::Process { "host" } else { IMAGE }
}

pub(crate) async fn create_in(target: &Target, sandboxes: &mut Sandboxes, name: &str, command: &[&str]) -> pb::Sandbox {
    create_with(target, sandboxes, name, command, &[]).await
}

async fn create_with(
    target: &Target,
    sandboxes: &mut Sandboxes,
    name: &str,
    command: &[&str],
    providers: &[&str],
) -> pb::Sandbox {
    let mut s = spec(command);
    s.image = image_for(target).to_string();
    let providers = providers.iter().map(|p| p.to_string()).collect();
    let request = pb::CreateSandboxRequest {
        name: name.into(),
        spec: Some(s),
        providers,
        expected_resource_version: None,
        deadline_unix_ms: None,
    };
    sandboxes.create_sandbox(request).await.unwrap().into_inner().sandbox.unwrap()
}

/// Deletes what a test made and checks nothing carrying its labels is left.
pub(crate) async fn clean_up(target: &Target, data: &DataDir, sandboxes: &mut Sandboxes) {
    let all = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner().sandboxes;
    for s in all {
        let _ = lifecycle(sandboxes, "delete", &s.name).await;
        wait_gone(sandboxes, &s.name).await;
    }
    let left = target.leftovers(data);
    let log = data.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(
        left.is_empty(),
        "left behind in {:?}: {left:?}; the gateway warned:\n{}",
        target.runtime,
        warnings.join("\n")
    );
}

async fn ready_through_the_supervisor(runtime: Runtime) {
    let Some(target) = target(runtime, "ready").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut providers = gateway.providers().await;
    const SECRET: &str = "conformance-secret";
    create_provider(&mut providers, "creds", "API_KEY", SECRET).await;
    let command = ["sh", "-c", "printf %s \"$API_KEY\" > key; exec sleep 3600"];
    let id = create_with(&target, &mut sandboxes, "web", &command, &["creds"]).await.id;
    let (ready, seen) = wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    assert_eq!(ready.generation, 1);
    assert!(seen.contains(&pb::Phase::Provisioning) || seen.first() == Some(&pb::Phase::Ready), "{seen:?}");
    // The provider's credentials reach the sandbox's environment.
    let mut waited = Duration::ZERO;
    while target.workspace_file(&data, &id, "key").as_deref() != Some(SECRET) {
        assert!(waited < Duration::from_secs(10), "{runtime:?}: the credential never reached the sandbox");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    clean_up(&target, &data, &mut sandboxes).await;
    providers
        .delete_provider(pb::DeleteProviderRequest { name: "creds".into(), expected_resource_version: None })
        .await
        .unwrap();
}

async fn fifty_cycles_keep_the_workspace_with_polls_inside_starts(runtime: Runtime) {
    let Some(target) = target(runtime, "cycles").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &["--poll-interval", "10ms"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(&target, &mut sandboxes, "cycler", COUNTING).await.id;
    wait_phase(&mut sandboxes, "cycler", pb::Phase::Ready).await;
    // Ready is the supervisor's connection; the workload counts its start a moment later, and a
    // stop at once could end it before it does.
    target.wait_workspace_file(&data, &id, "starts", "1").await;
    for cycle in 1..=50u64 {
        lifecycle(&mut sandboxes, "stop", "cycler").await.unwrap();
        let (_, seen) = wait_phase(&mut sandboxes, "cycler", pb::Phase::Stopped).await;
        assert!(!seen.contains(&pb::Phase::Error), "{runtime:?} cycle {cycle}: {seen:?}");
        lifecycle(&mut sandboxes, "start", "cycler").await.unwrap();
        let (ready, seen) = wait_phase(&mut sandboxes, "cycler", pb::Phase::Ready).await;
        assert!(!seen.contains(&pb::Phase::Error), "{runtime:?} cycle {cycle}: {seen:?}");
        assert_eq!(ready.generation, cycle + 1);
        target.wait_workspace_file(&data, &id, "starts", &(cycle + 1).to_string()).await;
    }
    assert_eq!(
        target.workspace_file(&data, &id, "starts").as_deref(),
        Some("51"),
        "the workspace survived every cycle"
    );
    assert!(!data.log().contains("new_phase=Some(Error)"), "no Error was ever written");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_real_exit_is_an_error_with_its_code(runtime: Runtime) {
    let Some(target) = target(runtime, "exit").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let command = ["sh", "-c", "if [ -e ran ]; then sleep 1; exit 3; fi; touch ran; exec sleep 3600"];
    let id = create_in(&target, &mut sandboxes, "flaky", &command).await.id;
    wait_phase(&mut sandboxes, "flaky", pb::Phase::Ready).await;
    // Ready is the supervisor's connection: under load, a stop at once could end the first run
    // before its `touch`, and the second would then run as the first.
    target.wait_workspace_file(&data, &id, "ran", "").await;
    lifecycle(&mut sandboxes, "stop", "flaky").await.unwrap();
    wait_phase(&mut sandboxes, "flaky", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "flaky").await.unwrap();
    let (failed, _) = wait_phase(&mut sandboxes, "flaky", pb::Phase::Error).await;
    assert_eq!(failed.failure.unwrap().exit_code, Some(3), "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn stop_and_delete_while_starting_or_stopping(runtime: Runtime) {
    let Some(target) = target(runtime, "races").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    // Stop while starting.
    create_in(&target, &mut sandboxes, "a", &["sleep", "3600"]).await;
    lifecycle(&mut sandboxes, "stop", "a").await.unwrap();
    wait_phase(&mut sandboxes, "a", pb::Phase::Stopped).await;
    // Delete while starting.
    create_in(&target, &mut sandboxes, "b", &["sleep", "3600"]).await;
    lifecycle(&mut sandboxes, "delete", "b").await.unwrap();
    wait_gone(&mut sandboxes, "b").await;
    // Delete while stopping (a workload that ignores SIGTERM takes the whole grace).
    create_in(&target, &mut sandboxes, "c", &["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]).await;
    wait_phase(&mut sandboxes, "c", pb::Phase::Ready).await;
    lifecycle(&mut sandboxes, "stop", "c").await.unwrap();
    lifecycle(&mut sandboxes, "delete", "c").await.unwrap();
    // Repeated deletes re-drive, and never fail.
    for _ in 0..3 {
        match lifecycle(&mut sandboxes, "delete", "c").await {
            Ok(s) => assert_eq!(phase(&s), pb::Phase::Deleting),
            Err(status) => assert_eq!(status.code(), tonic::Code::NotFound),
        }
    }
    wait_gone(&mut sandboxes, "c").await;
    clean_up(&target, &data, &mut sandboxes).await;
}

/// A delete of a running sandbox stops it as a stop does: TERM, the grace, then by force.
async fn a_delete_gives_the_run_its_stop_grace(runtime: Runtime) {
    let Some(target) = target(runtime, "deletegrace").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    // The process driver's run can leave a note where the delete does not reach; a container's
    // cannot, so its runtime's events say how it ended instead.
    let marker = data.path.join("terminated");
    // It takes a while to finish: only a run given its grace gets there.
    let on_term = match runtime {
        Runtime::Process => format!("sleep 1; echo graceful > {}; exit 0", marker.display()),
        _ => "sleep 1; exit 0".to_string(),
    };
    let script = format!("trap '{on_term}' TERM; while :; do sleep 0.1; done");
    let created = create_in(&target, &mut sandboxes, "graceful", &["sh", "-c", &script]).await;
    wait_phase(&mut sandboxes, "graceful", pb::Phase::Ready).await;
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - 1;
    lifecycle(&mut sandboxes, "delete", "graceful").await.unwrap();
    wait_gone(&mut sandboxes, "graceful").await;
    match runtime {
        Runtime::Process => {
            let note = std::fs::read_to_string(&marker).unwrap_or_default();
            assert_eq!(note.trim(), "graceful", "the run was killed without its TERM");
        }
        _ => {
            let container = format!("container={}", container_name(&SandboxId::new(&created.id)));
            let since = since.to_string();
            // How the run ended: TERM trapped is exit 0, the forced removal's SIGKILL 137.
            let (events, died) = match runtime {
                Runtime::Docker => {
                    let until = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
                        + 1)
                    .to_string();
                    let format = "{{.Action}} {{.Actor.Attributes.exitCode}}";
                    let args =
                        ["events", "--since", &since, "--until", &until, "--filter", &container, "--format", format];
                    (target.cli(&args), "die 0")
                }
                _ => {
                    let format = "{{.Status}} {{.ContainerExitCode}}";
                    let args =
                        ["events", "--stream=false", "--since", &since, "--filter", &container, "--format", format];
                    (target.cli(&args), "died 0")
                }
            };
            let events: Vec<&str> = events.lines().collect();
            assert!(events.contains(&died), "{runtime:?}: the run did not end by its TERM: {events:?}");
        }
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn out_of_band_removal_and_kill(runtime: Runtime) {
    let Some(target) = target(runtime, "oob").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let removed = create_in(&target, &mut sandboxes, "removed", &["sleep", "3600"]).await.id;
    let killed = create_in(&target, &mut sandboxes, "killed", &["sleep", "3600"]).await.id;
    wait_phase(&mut sandboxes, "removed", pb::Phase::Ready).await;
    wait_phase(&mut sandboxes, "killed", pb::Phase::Ready).await;
    target.remove_out_of_band(&data, &removed);
    // A removal may first show as the run's exit (Podman stops before it removes); it ends missing.
    let missing = |s: Option<&pb::Sandbox>| {
        s.and_then(|s| s.failure.as_ref()).is_some_and(|f| f.reason == "ComputeResourceMissing")
    };
    let (s, seen) = wait_for(&mut sandboxes, "removed", Duration::from_secs(30), missing).await;
    assert!(s.is_some(), "{runtime:?}: {seen:?}");
    assert!(seen.iter().all(|p| matches!(p, pb::Phase::Ready | pb::Phase::Error)), "{runtime:?}: {seen:?}");
    target.kill_out_of_band(&killed);
    let (s, _) = wait_phase(&mut sandboxes, "killed", pb::Phase::Error).await;
    assert_eq!(s.failure.unwrap().exit_code, Some(137), "{runtime:?}");
    // Both recover by Start, with a new generation.
    for name in ["removed", "killed"] {
        lifecycle(&mut sandboxes, "start", name).await.unwrap();
        let (s, _) = wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
        assert_eq!(s.generation, 2);
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

/// Generation 1's start lands late (a delayed effect, or a crashed gateway's call the runtime
/// still completes), after generation 2's run was removed out of band. The driver refuses it:
/// berth-core tells runs apart by start time, so that run would pass for generation 2's.
async fn a_late_start_of_an_older_generation_is_refused_after_out_of_band_removal(runtime: Runtime) {
    let Some(target) = target(runtime, "late").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(&target, &mut sandboxes, "box", &["sleep", "3600"]).await.id;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    lifecycle(&mut sandboxes, "stop", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    let (s, _) = wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    assert_eq!(s.generation, 2);
    target.remove_out_of_band(&data, &id);
    let missing = |s: Option<&pb::Sandbox>| {
        s.and_then(|s| s.failure.as_ref()).is_some_and(|f| f.reason == "ComputeResourceMissing")
    };
    let (s, seen) = wait_for(&mut sandboxes, "box", Duration::from_secs(30), missing).await;
    assert!(s.is_some(), "{runtime:?}: {seen:?}");

    let driver = target.driver(&data).await;
    let sandbox = SandboxId::new(&id);
    let launch = |generation| sleeping(&target, &data, &id, generation);
    let reply = driver.start(launch(1)).await.unwrap();
    assert_eq!(reply, StartReply::Failed { message: "generation 1 is superseded by 2".into() }, "{runtime:?}");
    // Nor does generation 2 get a second run.
    let reply = driver.start(launch(2)).await.unwrap();
    assert_eq!(reply, StartReply::Gone, "{runtime:?}");
    let state = driver.get(&sandbox).await.unwrap();
    assert!(matches!(state, RuntimeState::Absent { .. }), "{runtime:?}: {state:?}");

    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    let (s, _) = wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    assert_eq!(s.generation, 3);
    clean_up(&target, &data, &mut sandboxes).await;
}

/// How many live processes carry the sandbox's identity (the process driver's runs), or
/// whether its container runs (1 or 0).
fn live_runs(target: &Target, id: &str) -> usize {
    match target.runtime {
        Runtime::Process => supervisor_pids(id).len(),
        _ => {
            let running = target.cli(&[
                "inspect",
                "--format",
                "{{.State.Running}}",
                &container_name(&berth_core::SandboxId::new(id)),
            ]);
            usize::from(running == "true")
        }
    }
}

/// Waits (up to 5 s) until a run cut short right after its spawn shows to an outside look, as it
/// has long before a restarted gateway looks: under load a just-spawned supervisor was seen
/// missing from `/proc` by its identity (and its `began` file not yet written) for a moment.
async fn until_visible(target: &Target, id: &str) {
    for _ in 0..250 {
        if live_runs(target, id) > 0 {
            // Its first act, the `began` record, follows at once.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the run of {id} cut short after its start never showed");
}

/// The live supervisors carrying sandbox `id`'s identity, each leading its own group.
pub(crate) fn supervisor_pids(id: &str) -> Vec<i32> {
    let tag = format!("BERTH_SANDBOX_ID={id}");
    let leaders = std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        // An exec leads its own group too, but carries no generation.
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        let tagged = vars.contains(&tag.as_bytes()) && vars.iter().any(|v| v.starts_with(b"BERTH_GENERATION="));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let alive = !matches!(stat[stat.rfind(')')? + 2..].chars().next(), Some('Z' | 'X'));
        let leads = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).ok()?.as_raw() == pid;
        (tagged && alive && leads).then_some(pid)
    });
    leaders.collect()
}

/// What a driver gets to start `generation` of sandbox `id`, whose command sleeps.
fn sleeping(target: &Target, data: &DataDir, id: &str, generation: u64) -> Launch {
    Launch {
        sandbox: SandboxId::new(id),
        name: id.into(),
        generation,
        spec: SandboxSpec {
            image: image_for(target).into(),
            command: vec!["sleep".into(), "3600".into()],
            ..SandboxSpec::default()
        },
        credentials: Default::default(),
        token: data.runtime_token(id, generation),
    }
}

/// How many times [`a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation`]
/// goes through every crash point: `BERTH_CRASH_ROUNDS` (the long job `ci/crashes` sets 100).
fn crash_rounds() -> usize {
    std::env::var("BERTH_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(1)
}

/// D1 at every step (defects 1 and 2 of issue 13, and its acceptance 4): a gateway that dies at
/// any step of a start, a stop or a delete leaves nothing that the next gateway's driver runs a
/// second time, takes for another run's exit, or leaves behind; a stop that driver acknowledges
/// stops what runs.
async fn a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation(runtime: Runtime) {
    let Some(target) = target(runtime, "crash").await else { return };
    let data = DataDir::new();
    // The data directory's secrets; no gateway runs while the drivers act (its sweeps would
    // take these sandboxes, which have no records, for leftovers).
    drop(target.gateway(&data, &[]).await);
    for round in 0..crash_rounds() {
        for at in CrashPoint::ALL {
            // Container names are the runtime's, shared by every test: the id must be this run's.
            let id = &format!("sb-crash-{}-{round}-{at:?}", std::process::id()).to_lowercase();
            let case = format!("{runtime:?} {at:?}, round {round}");
            match at.act() {
                Act::Start => start_cut_short(&target, &data, id, at, &case).await,
                Act::Stop => stop_cut_short(&target, &data, id, at, &case).await,
                Act::Delete => delete_cut_short(&target, &data, id, at, &case).await,
            }
            let left = target.leftovers(&data);
            assert!(left.is_empty(), "{case}: left behind: {left:?}");
        }
    }
}

/// A start cut short before or after the runtime started the run: the next driver's look and
/// re-driven start find the run, if any, and run the generation once; its stop stops it.
async fn start_cut_short(target: &Target, data: &DataDir, id: &str, at: CrashPoint, case: &str) {
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(target, data, id, generation);
    let crashed = target.driver(data).await;
    crashed.start_then_crash(launch(1), at).await.unwrap();
    drop(crashed);
    let expected = usize::from(at == CrashPoint::AfterRuntimeStart);
    if expected == 1 {
        until_visible(target, id).await;
    }
    assert_eq!(live_runs(target, id), expected, "{case}: runs after the crash");

    let driver = target.driver(data).await;
    let seen = driver.get(&sandbox).await.unwrap();
    let reply = driver.start(launch(1)).await.unwrap();
    let StartReply::Running { started_at } = reply else { panic!("{case}: {reply:?}") };
    if let RuntimeState::Running { started_at: before } = seen {
        assert_eq!(before, started_at, "{case}: the run was started again");
    }
    assert_eq!(driver.start(launch(1)).await.unwrap(), StartReply::Running { started_at }, "{case}");
    assert_eq!(live_runs(target, id), 1, "{case}: one run of the generation");

    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(e) if e.started_at == started_at), "{case}: {stopped:?}");
    assert_eq!(live_runs(target, id), 0, "{case}: the acknowledged stop left a run");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
}

/// A stop cut short once the runtime was told to stop the run: the next driver shows the run's
/// own end (or the run, still ending), its stop is acknowledged with that end and nothing runs;
/// the next generation then runs once.
async fn stop_cut_short(target: &Target, data: &DataDir, id: &str, at: CrashPoint, case: &str) {
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(target, data, id, generation);
    let crashed = target.driver(data).await;
    let StartReply::Running { started_at } = crashed.start(launch(1)).await.unwrap() else {
        panic!("{case}: generation 1 did not start")
    };
    crashed.stop_then_crash(&sandbox, 1, Duration::from_secs(5), at).await.unwrap();
    drop(crashed);

    let driver = target.driver(data).await;
    let own = |state: &RuntimeState| match state {
        RuntimeState::Exited(e) => e.started_at == started_at,
        RuntimeState::Running { started_at: s } => *s == started_at,
        _ => false,
    };
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(own(&seen), "{case}: after the crash the runtime shows {seen:?}, not generation 1's run");
    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)) && own(&stopped), "{case}: the stop gave {stopped:?}");
    assert_eq!(live_runs(target, id), 0, "{case}: the acknowledged stop left a run");

    let StartReply::Running { started_at: next } = driver.start(launch(2)).await.unwrap() else {
        panic!("{case}: generation 2 did not start")
    };
    assert!(next > started_at, "{case}: generation 2's run started at {next:?}, before generation 1's");
    assert_eq!(driver.start(launch(2)).await.unwrap(), StartReply::Running { started_at: next }, "{case}");
    assert_eq!(live_runs(target, id), 1, "{case}: one run of generation 2");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
}

/// A delete cut short after its tombstone, or after the run and the compute resource went: the
/// next driver's delete finishes it, nothing runs and nothing is left, and a late start of the
/// deleted sandbox makes nothing.
async fn delete_cut_short(target: &Target, data: &DataDir, id: &str, at: CrashPoint, case: &str) {
    let sandbox = SandboxId::new(id);
    let crashed = target.driver(data).await;
    assert!(matches!(crashed.start(sleeping(target, data, id, 1)).await.unwrap(), StartReply::Running { .. }));
    crashed.delete_then_crash(&sandbox, Duration::from_secs(5), at).await.unwrap();
    drop(crashed);
    let expected = usize::from(at == CrashPoint::AfterTombstone);
    assert_eq!(live_runs(target, id), expected, "{case}: runs after the crash");

    let driver = target.driver(data).await;
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    assert_eq!(live_runs(target, id), 0, "{case}: the delete left a run");
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(matches!(seen, RuntimeState::Absent { .. }), "{case}: {seen:?}");
    let late = driver.start(sleeping(target, data, id, 1)).await.unwrap();
    assert!(matches!(late, StartReply::Failed { .. }), "{case}: a start after the delete gave {late:?}");
    assert_eq!(live_runs(target, id), 0, "{case}: the late start ran");
}

/// D1 on the stop side: a gateway that died right after the runtime started a run, before
/// recording it, must not leave a stop that succeeds while the run goes on.
async fn a_stop_after_a_crashed_start_stops_the_unrecorded_run(runtime: Runtime) {
    let Some(target) = target(runtime, "crashstop").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-crash-stop-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(&target, &data, id, generation);
    // Generation 1 ran and was stopped; generation 2's start was cut short after the runtime
    // started it.
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(launch(1)).await.unwrap(), StartReply::Running { .. }));
    driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    driver.start_then_crash(launch(2), CrashPoint::AfterRuntimeStart).await.unwrap();
    drop(driver);
    until_visible(&target, id).await;
    let driver = target.driver(&data).await;
    let stopped = driver.stop(&sandbox, 2, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{runtime:?}: {stopped:?}");
    assert_eq!(live_runs(&target, id), 0, "{runtime:?}: the acknowledged stop left generation 2 running");
    // And generation 2 is not started again: its run happened.
    let reply = driver.start(launch(2)).await.unwrap();
    assert!(matches!(reply, StartReply::Exited(_)), "{runtime:?}: {reply:?}");
    assert_eq!(live_runs(&target, id), 0);
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// D1, found by the simulator (process driver): a gateway died right after the supervisor was
/// spawned, and the run was killed before anyone looked; the re-driven start must take the
/// killed run for the generation's, not run the generation a second time. Found by the
/// 10,000-seed exploration: the run killed and its compute resource removed out of band, which
/// leaves nothing to tell that run from one never started; the generation's run may have
/// happened, so its resource is reported missing, nothing runs, and the next generation runs.
async fn a_run_killed_after_a_crashed_start_is_not_started_again(runtime: Runtime) {
    let Some(target) = target(runtime, "crashkill").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    for removed in [false, true] {
        let id = &format!("sb-crash-kill-{}-{removed}", std::process::id());
        let case = if removed { format!("{runtime:?}, killed and removed") } else { format!("{runtime:?}, killed") };
        let sandbox = SandboxId::new(id);
        let launch = |generation| sleeping(&target, &data, id, generation);
        let driver = target.driver(&data).await;
        driver.start_then_crash(launch(1), CrashPoint::AfterRuntimeStart).await.unwrap();
        drop(driver);
        until_visible(&target, id).await;
        target.kill_out_of_band(id);
        while live_runs(&target, id) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if removed {
            target.remove_out_of_band(&data, id);
        }
        let driver = target.driver(&data).await;
        let reply = driver.start(launch(1)).await.unwrap();
        if removed {
            assert_eq!(reply, StartReply::Gone, "{case}");
        } else {
            assert!(matches!(reply, StartReply::Exited(_)), "{case}: {reply:?}");
        }
        assert_eq!(live_runs(&target, id), 0, "{case}: generation 1 ran a second time");
        assert!(matches!(driver.start(launch(2)).await.unwrap(), StartReply::Running { .. }), "{case}");
        assert_eq!(live_runs(&target, id), 1, "{case}: one run of generation 2");
        driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    }
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// D1, found by the simulator with three gateways: a stop re-checked against the record, then
/// kept waiting for the driver's lock while another gateway started the next generation, ended
/// the run the user had just asked for. A stop decided for a generation leaves a newer one be.
async fn a_stop_decided_for_an_older_generation_leaves_the_newer_run_alone(runtime: Runtime) {
    let Some(target) = target(runtime, "stalestop").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-stale-stop-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(sleeping(&target, &data, id, 1)).await.unwrap(), StartReply::Running { .. }));
    let StartReply::Running { started_at } = driver.start(sleeping(&target, &data, id, 2)).await.unwrap() else {
        panic!("{runtime:?}: generation 2 did not start")
    };
    let seen = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(seen, RuntimeState::Running { started_at }, "{runtime:?}: the stale stop ended generation 2");
    assert_eq!(live_runs(&target, id), 1, "{runtime:?}");
    let stopped = driver.stop(&sandbox, 2, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{runtime:?}: {stopped:?}");
    assert_eq!(live_runs(&target, id), 0, "{runtime:?}");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// Found by the simulator with three gateways: a start re-checked against the record just before
/// the sandbox's delete was decided, then held up, reached the driver after the delete. It made
/// a workspace volume no record stood for, which nothing ever removed. A deleted sandbox is
/// never started again, and its late start leaves nothing behind.
async fn a_start_landing_after_the_delete_makes_nothing(runtime: Runtime) {
    let Some(target) = target(runtime, "latestart").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-late-start-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(sleeping(&target, &data, id, 1)).await.unwrap(), StartReply::Running { .. }));
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let late = driver.start(sleeping(&target, &data, id, 1)).await.unwrap();
    assert!(matches!(late, StartReply::Failed { .. }), "{runtime:?}: {late:?}");
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(matches!(seen, RuntimeState::Absent { .. }), "{runtime:?}: {seen:?}");
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// Found by the crash e2e test under load: generation 1's run was killed without recording its
/// exit, generation 2's start was cut short before anything ran, and a look in between recorded
/// generation 1's exit on its behalf. The re-driven start took that exit for generation 2's run
/// having happened, and the sandbox went to Error without ever running generation 2.
async fn a_look_between_a_crashed_start_and_its_redrive_does_not_pass_the_old_exit_for_the_new_run(runtime: Runtime) {
    let Some(target) = target(runtime, "oldexit").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-old-exit-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(&target, &data, id, generation);
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(launch(1)).await.unwrap(), StartReply::Running { .. }));
    target.kill_out_of_band(id);
    driver.start_then_crash(launch(2), CrashPoint::BeforeRuntimeStart).await.unwrap();
    drop(driver);
    let driver = target.driver(&data).await;
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(matches!(seen, RuntimeState::Exited(_)), "{runtime:?}: {seen:?}");
    let reply = driver.start(launch(2)).await.unwrap();
    assert!(matches!(reply, StartReply::Running { .. }), "{runtime:?}: generation 2 never ran: {reply:?}");
    assert_eq!(live_runs(&target, id), 1, "{runtime:?}");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

async fn a_restarted_gateway_adopts_running_sandboxes(runtime: Runtime) {
    let Some(target) = target(runtime, "adopt").await else { return };
    let data = DataDir::new();
    let mut gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(&target, &mut sandboxes, "kept", &["sleep", "3600"]).await.id;
    wait_phase(&mut sandboxes, "kept", pb::Phase::Ready).await;
    let before = target.run_identity(&data, &id);
    gateway.kill9();
    drop(gateway);
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    // Give the supervisor time to reconnect, and the reconcile loop time to look.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = get(&mut sandboxes, "kept").await.unwrap();
    assert_eq!((phase(&s), s.generation), (pb::Phase::Ready, 1), "{runtime:?}");
    assert_eq!(target.run_identity(&data, &id), before, "{runtime:?}: the sandbox was restarted, not adopted");
    assert!(data.log().contains("supervisor connected"), "the supervisor reconnected");
    clean_up(&target, &data, &mut sandboxes).await;
}

/// Two gateways on one database and one data directory racing on one sandbox (PostgreSQL).
async fn two_gateways_racing_on_one_sandbox_get_only_what_the_contract_allows(runtime: Runtime) {
    let Some(target) = target(runtime, "race").await else { return };
    let schema = format!("race_{runtime:?}").to_lowercase();
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = crate::pg::fresh_schema(&schema).await else { return };
    let data = DataDir::new();
    crate::several::race_on_one_sandbox(&data, &url, &target.gateway_args(), image_for(&target)).await;
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// Defect 3 of issue 13: `docker restart` (or `podman restart`) of a sandbox's container, then
/// one StartSandbox: Ready, and it stays Ready. The run started out of band is the one a stop
/// ends to make room; its exit is not the new generation's. Containers only: a process has no
/// restart outside its driver.
async fn an_out_of_band_restart_then_one_start_is_ready(runtime: Runtime) {
    let Some(target) = target(runtime, "restart").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(&target, &mut sandboxes, "box", &["sleep", "3600"]).await.id;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    target.cli(&["restart", "-t", "1", &container_name(&SandboxId::new(&id))]);
    // The restart's exit shows as an Error; a runtime may also restart too fast to be noticed.
    for _ in 0..50 {
        if phase(&get(&mut sandboxes, "box").await.unwrap()) == pb::Phase::Error {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = get(&mut sandboxes, "box").await.unwrap();
    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    let (ready, seen) = wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    assert!(ready.generation >= before.generation, "{runtime:?}: {seen:?}");
    // Ready, and it stays so: the exit of the run it replaced is not taken for its own.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = get(&mut sandboxes, "box").await.unwrap();
        assert_eq!(phase(&now), pb::Phase::Ready, "{runtime:?}: {:?} (was {:?})", now.failure, phase(&before));
        assert_eq!(now.generation, ready.generation, "{runtime:?}");
    }
    assert_eq!(live_runs(&target, &id), 1, "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

mod out_of_band_restart {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn docker() {
        super::an_out_of_band_restart_then_one_start_is_ready(Runtime::Docker).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn podman() {
        super::an_out_of_band_restart_then_one_start_is_ready(Runtime::Podman).await
    }
}

macro_rules! conformance {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn ready_through_the_supervisor() {
                    super::ready_through_the_supervisor(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn fifty_cycles_keep_the_workspace_with_polls_inside_starts() {
                    super::fifty_cycles_keep_the_workspace_with_polls_inside_starts(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_real_exit_is_an_error_with_its_code() {
                    super::a_real_exit_is_an_error_with_its_code(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn stop_and_delete_while_starting_or_stopping() {
                    super::stop_and_delete_while_starting_or_stopping(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_delete_gives_the_run_its_stop_grace() {
                    super::a_delete_gives_the_run_its_stop_grace(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn out_of_band_removal_and_kill() {
                    super::out_of_band_removal_and_kill(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_late_start_of_an_older_generation_is_refused_after_out_of_band_removal() {
                    super::a_late_start_of_an_older_generation_is_refused_after_out_of_band_removal(
                        Runtime::$runtime,
                    )
                    .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation() {
                    super::a_gateway_killed_at_each_step_of_start_stop_and_delete_leaves_one_run_per_generation(
                        Runtime::$runtime,
                    )
                    .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_stop_after_a_crashed_start_stops_the_unrecorded_run() {
                    super::a_stop_after_a_crashed_start_stops_the_unrecorded_run(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_run_killed_after_a_crashed_start_is_not_started_again() {
                    super::a_run_killed_after_a_crashed_start_is_not_started_again(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_stop_decided_for_an_older_generation_leaves_the_newer_run_alone() {
                    super::a_stop_decided_for_an_older_generation_leaves_the_newer_run_alone(Runtime::$runtime)
                        .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_start_landing_after_the_delete_makes_nothing() {
                    super::a_start_landing_after_the_delete_makes_nothing(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_look_between_a_crashed_start_and_its_redrive_does_not_pass_the_old_exit_for_the_new_run() {
                    super::a_look_between_a_crashed_start_and_its_redrive_does_not_pass_the_old_exit_for_the_new_run(
                        Runtime::$runtime,
                    )
                    .await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_restarted_gateway_adopts_running_sandboxes() {
                    super::a_restarted_gateway_adopts_running_sandboxes(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn two_gateways_racing_on_one_sandbox_get_only_what_the_contract_allows() {
                    super::two_gateways_racing_on_one_sandbox_get_only_what_the_contract_allows(Runtime::$runtime)
                        .await
                }
            }
        )*
    };
}

conformance!(Process => process, Docker => docker, Podman => podman);

/// The process driver's compute resource is the sandbox's folder, which an operator can remove
/// while the run in it goes on. A gateway died right after the spawn, and the folder went with
/// the run still alive: the re-driven start adopts that run rather than taking the folder's
/// absence for a run that ended, so the generation runs once and its stop stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_a_folder_removed_under_an_unrecorded_live_run_leaves_the_run_to_stop() {
    let Some(target) = target(Runtime::Process, "crashrmlive").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-crash-rm-live-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let launch = |generation| sleeping(&target, &data, id, generation);
    let driver = target.driver(&data).await;
    driver.start_then_crash(launch(1), CrashPoint::AfterRuntimeStart).await.unwrap();
    drop(driver);
    until_visible(&target, id).await;
    // `rm -rf` alone: the run lives on (it may still write into the folder meanwhile).
    let folder = data.path.join("sandboxes").join(id);
    while folder.exists() {
        let _ = std::fs::remove_dir_all(&folder);
    }
    assert_eq!(live_runs(&target, id), 1);
    let driver = target.driver(&data).await;
    let reply = driver.start(launch(1)).await.unwrap();
    assert!(matches!(reply, StartReply::Running { .. }), "the live run was not adopted: {reply:?}");
    assert_eq!(live_runs(&target, id), 1, "generation 1 ran a second time");
    let stopped = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{stopped:?}");
    assert_eq!(live_runs(&target, id), 0, "the acknowledged stop left the run");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind: {left:?}");
}
