//! Many hosts (DESIGN 14): creates to Ready across three nodes beside one, and the time from a
//! node's death to its sandboxes Ready on the others. Real gateway processes on the process
//! driver, each with a data directory of its own (so each its own node), on one PostgreSQL
//! database, all on this machine: what placement and routing through the store cost, not what
//! more hosts would add.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use berth_proto::v1 as pb;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use tonic::metadata::MetadataValue;

use super::{figure, pg};

const TOKEN: &str = "bench-nodes-token-0123456789";

/// N node gateways on one database, node i in `dir/n<i>`; killed, with their runs, when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    gateways: Vec<Option<Child>>,
    address: String,
}

impl Cluster {
    /// n1 reaches the store as the database's own host would, in plaintext; the others as other
    /// hosts would, over TLS checked against `ca`.
    fn start(url: &str, nodes: usize, supervisor: &Path, ca: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut gateways = Vec::new();
        for i in 1..=nodes {
            let (name, data) = (format!("n{i}"), dir.path().join(format!("n{i}")));
            std::fs::create_dir_all(&data).unwrap();
            let mut command = Command::new(env!("CARGO_BIN_EXE_berth-gateway"));
            if i == 1 {
                command.args(["--store", url]);
            } else {
                command.args(["--store", &format!("{url}&sslmode=require")]).arg("--store-ca").arg(ca);
            }
            let child = command
                .args(["--data-dir", data.to_str().unwrap(), "--listen", "127.0.0.1:0"])
                .args(["--name", &name, "--node", &name, "--api-token", TOKEN, "--lease-ttl", "2s"])
                .args(["--driver", "process", "--poll-interval", "500ms", "--log", "warn"])
                .arg("--supervisor-bin")
                .arg(supervisor)
                .stderr(std::fs::File::create(data.join("gateway.log")).unwrap())
                .spawn()
                .unwrap();
            gateways.push(Some(child));
        }
        let first = dir.path().join("n1").join("n1.addr");
        let deadline = Instant::now() + Duration::from_secs(30);
        let address = loop {
            if let Ok(address) = std::fs::read_to_string(&first) {
                break address.trim().to_string();
            }
            assert!(Instant::now() < deadline, "node n1 did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Self { dir, gateways, address }
    }

    async fn client(
        &self,
    ) -> SandboxesClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>> {
        let channel = tonic::transport::Channel::from_shared(self.address.clone()).unwrap().connect().await.unwrap();
        SandboxesClient::with_interceptor(channel, Bearer)
    }

    /// Every node live (by the store's clock), as the first gateway lists them.
    async fn live(&self, nodes: usize) {
        let channel = tonic::transport::Channel::from_shared(self.address.clone()).unwrap().connect().await.unwrap();
        let mut client = berth_proto::v1::nodes_client::NodesClient::with_interceptor(channel, Bearer);
        let deadline = Instant::now() + Duration::from_secs(30);
        while client
            .list_nodes(pb::ListNodesRequest {})
            .await
            .unwrap()
            .into_inner()
            .nodes
            .iter()
            .filter(|n| n.live)
            .count()
            < nodes
        {
            assert!(Instant::now() < deadline, "the nodes did not register");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Node `i` lost as a host is: its gateway and every run on it killed at once.
    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.gateways[i - 1].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        kill_runs(&self.dir.path().join(format!("n{i}")));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 1..=self.gateways.len() {
            self.kill(i);
        }
    }
}

/// Kills the process group of every run the process driver keeps under `data`.
fn kill_runs(data: &Path) {
    let Ok(entries) = std::fs::read_dir(data.join("sandboxes")) else { return };
    for entry in entries.flatten() {
        let state = std::fs::read_to_string(entry.path().join("run/state.json")).unwrap_or_default();
        let pid = serde_json::from_str::<serde_json::Value>(&state).ok().and_then(|s| s["pid"].as_i64());
        if let Some(pid) = pid.filter(|p| *p > 1) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[derive(Clone)]
struct Bearer;

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {TOKEN}")).unwrap());
        Ok(request)
    }
}

type Client = SandboxesClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>>;

/// Creates `count` sandboxes at once (each restarting always) and waits until every one is
/// Ready; returns how long that took.
async fn create_ready(client: &Client, count: usize) -> Duration {
    let began = Instant::now();
    let creates = (0..count).map(|i| {
        let mut client = client.clone();
        async move {
            let restart = pb::RestartPolicy {
                mode: pb::RestartMode::Always as i32,
                backoff_ms: Some(100),
                max_backoff_ms: Some(1_000),
                ..Default::default()
            };
            let spec = pb::SandboxSpec {
                command: vec!["sleep".into(), "3600".into()],
                restart: Some(restart),
                ..Default::default()
            };
            let request = pb::CreateSandboxRequest { name: format!("b{i}"), spec: Some(spec), ..Default::default() };
            client.create_sandbox(request).await.unwrap();
        }
    });
    futures_util::future::join_all(creates).await;
    settled(client, count, |_| true).await;
    began.elapsed()
}

/// Waits until `count` sandboxes are Ready and `also` holds of each.
async fn settled(client: &Client, count: usize, also: impl Fn(&pb::Sandbox) -> bool) -> Vec<pb::Sandbox> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let request = pb::ListSandboxesRequest { page_size: 500, ..Default::default() };
        let listed = client.clone().list_sandboxes(request).await.unwrap().into_inner().sandboxes;
        let ready = listed.iter().filter(|s| s.phase == pb::Phase::Ready as i32 && also(s)).count();
        if ready == count {
            return listed;
        }
        assert!(Instant::now() < deadline, "{ready} of {count} settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn nodes(runtime: &tokio::runtime::Runtime, quick: bool) {
    let (Ok(_), Some(supervisor)) =
        (std::env::var("BERTH_TEST_POSTGRES_URL"), std::env::var_os("BERTH_TEST_STATIC_SUPERVISOR").map(PathBuf::from))
    else {
        println!("nodes: skipped (set BERTH_TEST_POSTGRES_URL and BERTH_TEST_STATIC_SUPERVISOR; ci/bench does)");
        return;
    };
    let Some(ca) = pg::server_ca("the nodes bench") else { return };
    let count = if quick { 3 } else { 30 };
    println!("{count} sandboxes created at once to Ready, nodes as gateway processes on the process driver");
    for nodes in [1, 3] {
        let (took, cluster) = runtime.block_on(async {
            let url = pg::fresh_schema(&format!("bench_{nodes}_nodes")).await.unwrap();
            let cluster = Cluster::start(&url, nodes, &supervisor, &ca);
            cluster.live(nodes).await;
            // One renewal each with the others live: a node whose every renewal was made alone
            // is never fenced (DESIGN 14), and the death below must measure a fence.
            tokio::time::sleep(Duration::from_secs(2)).await;
            (create_ready(&cluster.client().await, count).await, cluster)
        });
        let rate = count as f64 / took.as_secs_f64();
        println!("{nodes} node(s): {took:?}, {rate:.1} sandboxes/s");
        figure(&format!("creates to Ready across {nodes} node(s), {count} at once"), rate, "sandboxes/s");
        if nodes == 3 {
            death(runtime, cluster, count);
        }
    }
    println!();
}

/// The time from the death of a node holding sandboxes (n2 or n3: the client's gateway is n1's)
/// to its sandboxes Ready on the others, in their next generation.
fn death(runtime: &tokio::runtime::Runtime, mut cluster: Cluster, count: usize) {
    let took = runtime.block_on(async {
        let client = cluster.client().await;
        let placed = settled(&client, count, |_| true).await;
        let on = |node: &str| placed.iter().filter(|s| s.node == node).map(|s| s.name.clone()).collect::<Vec<_>>();
        let (victim, lost) = [(2, on("n2")), (3, on("n3"))].into_iter().max_by_key(|(_, lost)| lost.len())?;
        if lost.is_empty() {
            return None;
        }
        let (name, died) = (format!("n{victim}"), Instant::now());
        cluster.kill(victim);
        settled(&client, count, |s| s.node != name && (!lost.contains(&s.name) || s.generation == 2)).await;
        Some((name, lost.len(), died.elapsed()))
    });
    match took {
        Some((node, lost, took)) => {
            println!("{node} killed -> its {lost} sandbox(es) Ready on the others: {took:?} (lease time-to-live 2 s)");
            figure("node death to its sandboxes Ready elsewhere, ttl 2s", took.as_secs_f64() * 1e3, "ms");
        }
        None => println!("node death: skipped (every sandbox was placed on n1, the client's node)"),
    }
}
