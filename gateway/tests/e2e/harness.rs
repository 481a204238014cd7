//! Real gateways for end-to-end tests: the `berth-gateway` binary on a real TCP port, with a
//! real SQLite file and real sandbox processes in a temporary data directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_core::SandboxId;
use berth_core::identity::{IdentityKey, RuntimeIdentity, RuntimeToken, derive_token};
use berth_proto::v1 as pb;
use berth_proto::v1::execs_client::ExecsClient;
use berth_proto::v1::providers_client::ProvidersClient;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The PostgreSQL server the tests of this binary share, one of which stops and restarts it:
/// every test on PostgreSQL holds this shared while it runs, that one exclusively, so that none
/// meets the outage it makes.
pub static POSTGRES_SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub type Sandboxes = SandboxesClient<InterceptedService<Channel, Bearer>>;
pub type Providers = ProvidersClient<InterceptedService<Channel, Bearer>>;
pub type Execs = ExecsClient<InterceptedService<Channel, Bearer>>;
pub type LogsService = berth_proto::v1::logs_client::LogsClient<InterceptedService<Channel, Bearer>>;
pub type Templates = berth_proto::v1::templates_client::TemplatesClient<InterceptedService<Channel, Bearer>>;
pub type Snapshots = berth_proto::v1::snapshots_client::SnapshotsClient<InterceptedService<Channel, Bearer>>;
pub type VolumesService = berth_proto::v1::volumes_client::VolumesClient<InterceptedService<Channel, Bearer>>;

#[derive(Clone)]
pub struct Bearer(pub String);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: Request<()>) -> Result<Request<()>, Status> {
        r.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {}", self.0)).unwrap());
        Ok(r)
    }
}

pub fn bin(name: &str) -> PathBuf {
    let gateway = PathBuf::from(env!("CARGO_BIN_EXE_berth-gateway"));
    let path = gateway.with_file_name(name);
    assert!(path.exists(), "{} is missing: run `cargo build --workspace --bins` first (ci/test does)", path.display());
    path
}

/// A temporary data directory that outlives gateway restarts, and cleans up every sandbox
/// process it holds when dropped.
pub struct DataDir {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl DataDir {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("berth-e2e-").tempdir().unwrap();
        Self { path: dir.path().to_path_buf(), _dir: dir }
    }

    /// The pid of a sandbox's current run (its supervisor), from the process driver's state.
    pub fn run_pid(&self, id: &str) -> Option<i32> {
        let state = std::fs::read_to_string(self.path.join("sandboxes").join(id).join("run/state.json")).ok()?;
        // A run the driver adopted after it had ended is recorded with pid 0: no process, and
        // killpg(0) would kill this test's own process group (and whatever runs the tests).
        serde_json::from_str::<serde_json::Value>(&state).ok()?["pid"].as_i64().map(|p| p as i32).filter(|p| *p > 1)
    }

    pub fn workspace(&self, id: &str) -> PathBuf {
        self.path.join("sandboxes").join(id).join("workspace")
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.path.join("api-token")).unwrap().trim().to_string()
    }

    /// A runtime token of any generation, derived from the gateway's own key.
    pub fn runtime_token(&self, id: &str, generation: u64) -> RuntimeToken {
        let hex_key = std::fs::read_to_string(self.path.join("identity.key")).unwrap();
        let key = IdentityKey::from_bytes(hex::decode(hex_key.trim()).unwrap().try_into().unwrap());
        derive_token(&key, &RuntimeIdentity { sandbox: SandboxId::new(id), generation })
    }

    pub fn log(&self) -> String {
        self.log_of("gateway")
    }

    /// The log of the gateway named `name`.
    pub fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.path.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.path.join("sandboxes")) else { return };
        for e in entries.flatten() {
            if let Some(pid) = self.run_pid(&e.file_name().to_string_lossy()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

pub struct Gateway {
    child: Child,
    pub address: String,
    pub token: String,
    /// The CA file its certificate is checked against, when it serves TLS.
    pub ca: Option<PathBuf>,
}

impl Gateway {
    /// Starts a gateway on `data` with a short poll interval; waits until it serves. A gateway
    /// given `--name N` writes `N.addr` and logs to `N.log` (else `gateway.*`).
    pub async fn start(data: &DataDir, extra: &[&str]) -> Self {
        Self::start_trusting(data, extra, None).await
    }

    /// [`Gateway::start`] for a gateway serving TLS (`--tls-cert` in `extra`), its clients
    /// checking its certificate against the PEM file `ca`.
    pub async fn start_trusting(data: &DataDir, extra: &[&str], ca: Option<&Path>) -> Self {
        let name = extra.iter().position(|a| *a == "--name").map_or("gateway", |i| extra[i + 1]);
        let address_file = data.path.join(format!("{name}.addr"));
        let _ = std::fs::remove_file(&address_file);
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(data.path.join(format!("{name}.log"))).unwrap();
        // Test defaults, each unless `extra` sets it.
        let defaults =
            [("--poll-interval", "500ms"), ("--redrive-after", "2s"), ("--stop-grace", "5s"), ("--heartbeat", "1s")];
        let defaults =
            defaults.iter().filter(|(flag, _)| !extra.contains(flag)).flat_map(|(flag, value)| [*flag, *value]);
        let child = Command::new(bin("berth-gateway"))
            .args(["--data-dir", data.path.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(defaults)
            .args(["--log", "info,berth_gateway=debug"])
            .args(extra)
            .env_remove("BERTH_API_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        // Owned at once, so a failed start still kills and reaps it (Drop).
        let mut gateway =
            Gateway { child, address: String::new(), token: String::new(), ca: ca.map(Path::to_path_buf) };
        // Up to 30 s: a gateway on Podman runs `criu check` as it connects, which takes seconds
        // while the suite's other gateways start beside it.
        for _ in 0..600 {
            if let Ok(address) = std::fs::read_to_string(&address_file) {
                gateway.address = address.trim().to_string();
                gateway.token = data.token();
                gateway.sandboxes().await;
                return gateway;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the gateway did not start:\n{}", data.log_of(name));
    }

    pub async fn channel(&self) -> Channel {
        let endpoint = Channel::from_shared(self.address.clone()).unwrap();
        let endpoint = match &self.ca {
            Some(ca) => {
                let ca = tonic::transport::Certificate::from_pem(std::fs::read(ca).unwrap());
                endpoint.tls_config(tonic::transport::ClientTlsConfig::new().ca_certificate(ca)).unwrap()
            }
            None => endpoint,
        };
        endpoint.connect().await.unwrap()
    }

    pub async fn sandboxes(&self) -> Sandboxes {
        SandboxesClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    pub async fn providers(&self) -> Providers {
        ProvidersClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    pub async fn execs(&self) -> Execs {
        ExecsClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    pub async fn snapshots(&self) -> Snapshots {
        berth_proto::v1::snapshots_client::SnapshotsClient::with_interceptor(
            self.channel().await,
            Bearer(self.token.clone()),
        )
    }

    pub async fn volumes(&self) -> VolumesService {
        berth_proto::v1::volumes_client::VolumesClient::with_interceptor(
            self.channel().await,
            Bearer(self.token.clone()),
        )
    }

    pub async fn templates(&self) -> Templates {
        berth_proto::v1::templates_client::TemplatesClient::with_interceptor(
            self.channel().await,
            Bearer(self.token.clone()),
        )
    }

    pub async fn logs(&self) -> LogsService {
        berth_proto::v1::logs_client::LogsClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn terminate(&mut self) {
        self.sigterm();
        let _ = self.child.wait();
    }

    /// Asks the gateway to stop, as a service manager does, without waiting for it.
    pub fn sigterm(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }

    /// How the gateway exited, if it did within `limit`. Polled, so that the test's other tasks
    /// (clients reading their streams to the end) run meanwhile.
    pub async fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs a gateway on `data` that must refuse to start; what it printed. Panics (having killed
/// it) if it serves instead.
pub async fn refused(data: &DataDir, extra: &[&str]) -> String {
    let address_file = data.path.join("gateway.addr");
    let _ = std::fs::remove_file(&address_file);
    let output = data.path.join("refused.log");
    let mut child = Command::new(bin("berth-gateway"))
        .args(["--data-dir", data.path.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("BERTH_API_TOKEN")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&output).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..600 {
        if child.try_wait().unwrap().is_some() {
            return std::fs::read_to_string(&output).unwrap();
        }
        if address_file.exists() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gateway started:\n{}", std::fs::read_to_string(&output).unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the gateway neither served nor exited:\n{}", std::fs::read_to_string(&output).unwrap());
}

/// A loopback port free when asked.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn spec(command: &[&str]) -> pb::SandboxSpec {
    pb::SandboxSpec {
        image: "host".into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A workload that counts its starts in its workspace and then idles.
pub const COUNTING: &[&str] =
    &["sh", "-c", "n=$(cat starts 2>/dev/null || echo 0); echo $((n + 1)) > starts; exec sleep 3600"];

/// Creates provider `name` holding one credential, `key` = `value`.
pub async fn create_provider(providers: &mut Providers, name: &str, key: &str, value: &str) {
    let request = pb::CreateProviderRequest {
        endpoints: Default::default(),
        name: name.into(),
        kind: "test".into(),
        credentials: [(key.to_string(), value.to_string())].into(),
        expected_resource_version: None,
    };
    providers.create_provider(request).await.unwrap();
}

pub async fn create(sandboxes: &mut Sandboxes, name: &str, command: &[&str], providers: &[&str]) -> pb::Sandbox {
    let request = pb::CreateSandboxRequest {
        name: name.into(),
        spec: Some(spec(command)),
        providers: providers.iter().map(|p| p.to_string()).collect(),
        expected_resource_version: None,
        deadline_unix_ms: None,
        from_snapshot: String::new(),
    };
    sandboxes.create_sandbox(request).await.unwrap().into_inner().sandbox.unwrap()
}

pub async fn get(sandboxes: &mut Sandboxes, name: &str) -> Result<pb::Sandbox, Status> {
    sandboxes.get_sandbox(pb::GetSandboxRequest { name: name.into() }).await.map(|r| r.into_inner().sandbox.unwrap())
}

pub fn phase(s: &pb::Sandbox) -> pb::Phase {
    pb::Phase::try_from(s.phase).unwrap()
}

/// Follows the watch stream until `want` holds, recording every phase seen; panics (with the
/// phases) on timeout.
pub async fn wait_for(
    sandboxes: &mut Sandboxes,
    name: &str,
    timeout: Duration,
    want: impl Fn(Option<&pb::Sandbox>) -> bool,
) -> (Option<pb::Sandbox>, Vec<pb::Phase>) {
    let mut seen = Vec::new();
    let result = tokio::time::timeout(timeout, async {
        let mut events = sandboxes.watch_sandbox(pb::WatchSandboxRequest { name: name.into() }).await?.into_inner();
        while let Some(event) = events.message().await? {
            if let Some(s) = &event.sandbox {
                seen.push(phase(s));
            }
            if want(event.sandbox.as_ref()) {
                return Ok::<_, Status>(event.sandbox);
            }
        }
        Ok(None)
    })
    .await;
    match result {
        Ok(Ok(s)) => (s, seen),
        Ok(Err(status)) if status.code() == tonic::Code::NotFound && want(None) => (None, seen),
        other => panic!("waiting for {name}: {other:?}; phases seen: {seen:?}"),
    }
}

pub async fn wait_phase(sandboxes: &mut Sandboxes, name: &str, target: pb::Phase) -> (pb::Sandbox, Vec<pb::Phase>) {
    let (s, seen) = wait_for(sandboxes, name, Duration::from_secs(30), |s| s.is_some_and(|s| phase(s) == target)).await;
    (s.unwrap(), seen)
}

pub async fn wait_gone(sandboxes: &mut Sandboxes, name: &str) {
    wait_for(sandboxes, name, Duration::from_secs(30), |s| s.is_none()).await;
}

pub async fn lifecycle(sandboxes: &mut Sandboxes, verb: &str, name: &str) -> Result<pb::Sandbox, Status> {
    let request = pb::LifecycleRequest { name: name.into(), expected_resource_version: None };
    let reply = match verb {
        "stop" => sandboxes.stop_sandbox(request).await,
        "start" => sandboxes.start_sandbox(request).await,
        "pause" | "checkpoint" => {
            let checkpoint = verb == "checkpoint";
            sandboxes.pause_sandbox(pb::PauseRequest { name: name.into(), checkpoint, ..Default::default() }).await
        }
        "resume" => sandboxes.resume_sandbox(request).await,
        "delete" => sandboxes.delete_sandbox(request).await,
        other => panic!("no verb {other}"),
    };
    reply.map(|r| r.into_inner().sandbox.unwrap())
}

pub fn workspace_file(data: &Path, id: &str, file: &str) -> Option<String> {
    std::fs::read_to_string(data.join("sandboxes").join(id).join("workspace").join(file))
        .ok()
        .map(|s| s.trim().to_string())
}

/// A workspace file once it reads `want`, or what it last read after 10 s. Ready means the
/// run's supervisor is connected, not that its command has written yet.
pub async fn workspace_file_once(data: &Path, id: &str, file: &str, want: &str) -> Option<String> {
    let mut last = None;
    for _ in 0..200 {
        last = workspace_file(data, id, file);
        if last.as_deref() == Some(want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last
}
