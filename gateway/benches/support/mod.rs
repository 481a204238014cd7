//! What the runtime benchmarks share: a gateway in this process on a container runtime, with a
//! client of its API, and waiting for a phase.

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_gateway::config::{Config, DriverKind, Flags};
use berth_proto::v1 as pb;
use berth_proto::v1::execs_client::ExecsClient;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use berth_proto::v1::snapshots_client::SnapshotsClient;
use berth_proto::v1::templates_client::TemplatesClient;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds the API token to every call.
#[derive(Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

pub type Sandboxes = SandboxesClient<InterceptedService<Channel, Bearer>>;
pub type Execs = ExecsClient<InterceptedService<Channel, Bearer>>;
pub type Templates = TemplatesClient<InterceptedService<Channel, Bearer>>;
pub type Snapshots = SnapshotsClient<InterceptedService<Channel, Bearer>>;

/// A gateway serving from a temporary data directory until dropped.
pub struct Gateway {
    _data: tempfile::TempDir,
    pub sandboxes: Sandboxes,
    pub execs: Execs,
    pub templates: Templates,
    pub snapshots: Snapshots,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Gateway {
    /// Stops serving; the data directory stays until the gateway is dropped (what it made may
    /// still use it).
    pub fn stop_serving(&self) {
        self.task.abort();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a gateway on `kind` (its socket `socket`), labelling what it makes with `owner`.
pub async fn gateway(kind: DriverKind, socket: &str, owner: &str, supervisor: &Path) -> Gateway {
    let data = tempfile::tempdir().unwrap();
    let flags = Flags {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(data.path().to_path_buf()),
        driver: Some(kind),
        supervisor_bin: Some(supervisor.to_path_buf()),
        docker_socket: Some(PathBuf::from(socket)),
        podman_socket: Some(PathBuf::from(socket)),
        instance: Some(owner.to_string()),
        log: Some("warn".into()),
        ..Flags::default()
    };
    let task = tokio::spawn(berth_gateway::server::run(Config::load(flags).unwrap()));
    let address_file = data.path().join("gateway.addr");
    while !address_file.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let address = std::fs::read_to_string(&address_file).unwrap().trim().to_string();
    let token = std::fs::read_to_string(data.path().join("api-token")).unwrap();
    let bearer = Bearer(format!("Bearer {}", token.trim()).parse().unwrap());
    let channel = tonic::transport::Endpoint::from_shared(address).unwrap().connect().await.unwrap();
    Gateway {
        _data: data,
        sandboxes: SandboxesClient::with_interceptor(channel.clone(), bearer.clone()),
        execs: ExecsClient::with_interceptor(channel.clone(), bearer.clone()),
        templates: TemplatesClient::with_interceptor(channel.clone(), bearer.clone()),
        snapshots: SnapshotsClient::with_interceptor(channel, bearer),
        task,
    }
}

pub async fn wait_phase(client: &mut Sandboxes, name: &str, target: pb::Phase) {
    let mut events = client.watch_sandbox(pb::WatchSandboxRequest { name: name.into() }).await.unwrap().into_inner();
    while let Some(event) = events.message().await.unwrap() {
        if event.sandbox.is_some_and(|s| s.phase == target as i32) {
            return;
        }
    }
}

pub fn engine_name(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::Docker => "docker",
        DriverKind::Podman => "podman",
        _ => "other",
    }
}
