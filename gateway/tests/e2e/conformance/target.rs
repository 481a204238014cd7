//! The runtimes a test can use (the process driver, Docker, Podman), how to start a gateway on
//! one and reach it out of band, and the create and clean-up every test shares.

use super::*;

pub(crate) const IMAGE: &str = "berth-test/sandbox:1";

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
    // A test's hold on its container runtime. One that floods it (a hundred containers and
    // volumes asked for at once) holds it alone: on two cores the runtime's backlog outlasted
    // the 30-second waits of whichever test ran beside it.
    _shared: Option<tokio::sync::RwLockReadGuard<'static, ()>>,
    _alone: Option<tokio::sync::RwLockWriteGuard<'static, ()>>,
}

static DOCKER_CLAIM: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
static PODMAN_CLAIM: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

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
pub(crate) async fn import_image(engine: &dyn Engine) -> Result<(), String> {
    let supervisor = static_supervisor().ok_or("no static supervisor")?;
    let rootfs = image::rootfs(std::path::Path::new(image::BUSYBOX), &supervisor).map_err(|e| e.to_string())?;
    engine.import_image(IMAGE, rootfs).await.map_err(|e| e.to_string())
}

static DOCKER_IMAGE: OnceLock<Result<(), String>> = OnceLock::new();
static PODMAN_IMAGE: OnceLock<Result<(), String>> = OnceLock::new();

pub(crate) async fn target(runtime: Runtime, test: &str) -> Option<Target> {
    claimed(runtime, test, false).await
}

/// A target whose container runtime no other test uses while it is held.
pub(crate) async fn target_alone(runtime: Runtime, test: &str) -> Option<Target> {
    claimed(runtime, test, true).await
}

async fn claimed(runtime: Runtime, test: &str, alone: bool) -> Option<Target> {
    let instance = format!("t-{test}").chars().take(40).collect::<String>();
    if runtime == Runtime::Process {
        return Some(Target { runtime, socket: None, instance, _shared: None, _alone: None });
    }
    let (variable, once, claim) = match runtime {
        Runtime::Docker => ("BERTH_TEST_DOCKER_SOCKET", &DOCKER_IMAGE, &DOCKER_CLAIM),
        _ => ("BERTH_TEST_PODMAN_SOCKET", &PODMAN_IMAGE, &PODMAN_CLAIM),
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
    let (_shared, _alone) = if alone { (None, Some(claim.write().await)) } else { (Some(claim.read().await), None) };
    Some(Target { runtime, socket: Some(socket), instance, _shared, _alone })
}

impl Target {
    pub(crate) fn gateway_args(&self) -> Vec<String> {
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
    pub(crate) async fn driver(&self, data: &DataDir) -> Box<dyn Driver> {
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
    pub(crate) fn run_identity(&self, data: &DataDir, id: &str) -> Option<String> {
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
    pub(crate) fn remove_out_of_band(&self, data: &DataDir, id: &str) {
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
    pub(crate) fn leftovers(&self, data: &DataDir) -> Vec<String> {
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
            // Images committed of snapshots carry their source container's labels.
            let images = self.cli(&["images", "--filter", &label, "--format", "{{.Repository}}:{{.Tag}}"]);
            left.extend(
                containers
                    .lines()
                    .chain(volumes.lines())
                    .chain(images.lines())
                    .filter(|l| !l.is_empty())
                    .map(str::to_string),
            );
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

pub(crate) async fn create_with(
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
        from_snapshot: String::new(),
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
