//! Many hosts for real (DESIGN 14, issue 41's first acceptance point), on the rig `ci/cluster up 3`
//! makes: three nodes, each a gateway on the process driver in a network namespace of its own,
//! and a gateway on the host whose clients this test is, all speaking TLS under the rig's CA. Run by `ci/cluster test`, which starts
//! the rig and exports where it is (`BERTH_GATEWAY`, `BERTH_TOKEN`, `BERTH_CA_FILE`,
//! `BERTH_CLUSTER_NODES`, `BERTH_CLUSTER_STORE`); a
//! plain `cargo test` without it skips, saying so.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use berth_proto::v1 as pb;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use tonic::transport::Channel;

use crate::files::{FilesService, upload};
use crate::harness::*;
use crate::ports::{forward_echoes, port_server, put_server};

const SANDBOXES: usize = 30;

struct Rig {
    address: String,
    token: String,
    /// The rig's CA: every gateway of it serves TLS only.
    ca: std::path::PathBuf,
    nodes: usize,
    /// The rig's PostgreSQL, as the host's gateway reaches it (loopback).
    store: String,
}

impl Rig {
    fn found() -> Option<Self> {
        let env = |name| std::env::var(name).ok();
        let required = env("BERTH_REQUIRE_CLUSTER").is_some_and(|v| v == "1");
        let Some(nodes) = env("BERTH_CLUSTER_NODES") else {
            assert!(!required, "BERTH_CLUSTER_NODES is not set: run this through `ci/cluster test`");
            eprintln!("skipping the multi-host rig's test: no rig (ci/cluster test runs it)");
            return None;
        };
        let (address, token, ca) = (env("BERTH_GATEWAY")?, env("BERTH_TOKEN")?, env("BERTH_CA_FILE")?.into());
        Some(Self { address, token, ca, nodes: nodes.parse().ok()?, store: env("BERTH_CLUSTER_STORE")? })
    }

    /// A channel to the host's gateway, trusting the rig's CA, or (`ca` none) trusting nothing.
    async fn channel_trusting(&self, ca: Option<&std::path::Path>) -> Result<Channel, tonic::transport::Error> {
        let mut tls = tonic::transport::ClientTlsConfig::new();
        if let Some(ca) = ca {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(ca).unwrap()));
        }
        Channel::from_shared(self.address.clone()).unwrap().tls_config(tls).unwrap().connect().await
    }

    async fn channel(&self) -> Channel {
        self.channel_trusting(Some(&self.ca)).await.unwrap()
    }

    async fn sandboxes(&self) -> Sandboxes {
        SandboxesClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    async fn files(&self) -> FilesService {
        berth_proto::v1::files_client::FilesClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    async fn execs(&self) -> Execs {
        berth_proto::v1::execs_client::ExecsClient::with_interceptor(self.channel().await, Bearer(self.token.clone()))
    }

    fn rig(&self, verb: &str, node: usize) {
        let status = Command::new("ci/cluster").current_dir(workspace()).args([verb, &node.to_string()]).status();
        assert!(status.unwrap().success(), "ci/cluster {verb} {node}");
    }
}

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The sandbox's command: a `sleep` whose argument is its own, so its runs can be counted on
/// the machine whatever node runs them.
fn sleeper(i: usize) -> String {
    (100_000 + i).to_string()
}

/// How many live processes run `sleep <arg>`, across every namespace.
fn runs_of(arg: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter(|entry| entry.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        .filter(|entry| {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let zombie = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
            let argv = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            !zombie && argv == format!("sleep\0{arg}\0").as_bytes()
        })
        .count()
}

async fn all(sandboxes: &mut Sandboxes) -> Vec<pb::Sandbox> {
    let request = pb::ListSandboxesRequest { page_size: 100, ..Default::default() };
    sandboxes.list_sandboxes(request).await.unwrap().into_inner().sandboxes
}

/// Waits (up to `within`) until every sandbox is Ready and `settled` holds of them; returns them
/// and how long it took.
async fn until(
    sandboxes: &mut Sandboxes,
    within: Duration,
    settled: impl Fn(&[pb::Sandbox]) -> bool,
) -> (Vec<pb::Sandbox>, Duration) {
    let began = Instant::now();
    loop {
        let listed = all(sandboxes).await;
        let ready = listed.len() == SANDBOXES && listed.iter().all(|s| phase(s) == pb::Phase::Ready);
        if ready && settled(&listed) {
            return (listed, began.elapsed());
        }
        let shown: Vec<_> = listed.iter().map(|s| (&s.name, phase(s), s.generation, &s.node)).collect();
        assert!(began.elapsed() < within, "not settled within {within:?}: {shown:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn per_node(listed: &[pb::Sandbox]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for s in listed {
        *counts.entry(s.node.clone()).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_sandboxes_spread_over_three_nodes_outlive_a_node_killed_and_a_node_cut() {
    let Some(rig) = Rig::found() else { return };
    assert_eq!(rig.nodes, 3, "ci/cluster up 3");
    let mut sandboxes = rig.sandboxes().await;
    let restart = crate::lifetimes::always(100);
    let with_server = port_server().is_some();
    for i in 0..SANDBOXES {
        // A port server once the test puts one in the workspace (on a few of them).
        let script = format!(
            "echo started s{i}; (while [ ! -x ./port-server ]; do sleep 0.2; done; exec ./port-server --tcp 7000) & exec sleep {}",
            sleeper(i)
        );
        let spec = pb::SandboxSpec { restart: Some(restart), ..spec(&["sh", "-c", &script]) };
        let request = pb::CreateSandboxRequest { name: format!("s{i}"), spec: Some(spec), ..Default::default() };
        sandboxes.create_sandbox(request).await.unwrap();
    }
    let (listed, took) = until(&mut sandboxes, Duration::from_secs(120), |_| true).await;
    eprintln!("{SANDBOXES} sandboxes Ready across the nodes {took:?} after the last create was answered");
    let spread = per_node(&listed);
    assert_eq!(spread, BTreeMap::from([("n1".into(), 10), ("n2".into(), 10), ("n3".into(), 10)]), "{spread:?}");

    // Exec, logs, files and a port of a sandbox on every node, through the host's gateway.
    let mut execs = rig.execs().await;
    let mut files = rig.files().await;
    for node in ["n1", "n2", "n3"] {
        let on = listed.iter().find(|s| s.node == node).unwrap();
        let name = on.name.clone();
        let out = exec_output(&mut execs, &name, &["sh", "-c", "echo from $PWD"]).await;
        assert!(out.starts_with("from /") && out.contains(&format!("/{node}/")), "{name} on {node}: {out}");
        let logs =
            berth_proto::v1::logs_client::LogsClient::with_interceptor(rig.channel().await, Bearer(rig.token.clone()))
                .read_logs(pb::ReadLogsRequest { sandbox: name.clone(), ..Default::default() })
                .await
                .unwrap()
                .into_inner();
        let text = read_all_logs(logs).await;
        assert!(text.contains(&format!("started {name}")), "{name} on {node}: {text:?}");
        let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        let mut archive = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(payload.len() as u64);
        header.set_mode(0o644);
        archive.append_data(&mut header, "blob", &payload[..]).unwrap();
        upload(&mut files, &name, ".", archive.into_inner().unwrap(), 1 << 20).await.unwrap();
        let sum = exec_output(&mut execs, &name, &["sha256sum", "blob"]).await;
        let want = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&payload));
        assert!(sum.starts_with(&want), "{name} on {node}: {sum}");
        if with_server {
            put_server(&mut files, &name).await;
            // Listening on 7000 (0x1B58) in the node's namespace.
            let listening = "timeout 10 sh -c 'until grep -q \":1B58 \" /proc/net/tcp; do sleep 0.1; done'";
            exec_output(&mut execs, &name, &["sh", "-c", listening]).await;
            forward_echoes(&mut sandboxes, &name, 7000).await;
        }
    }

    // n1 is lost with everything on it: its sandboxes come back Ready on n2 and n3, each in its
    // next generation, once n1's lease lapses and the gateway fences it.
    let on_n1: Vec<String> = listed.iter().filter(|s| s.node == "n1").map(|s| s.name.clone()).collect();
    rig.rig("kill-node", 1);
    let (listed, took) = until(&mut sandboxes, Duration::from_secs(60), |listed| {
        listed.iter().all(|s| s.node != "n1" && (!on_n1.contains(&s.name) || s.generation == 2))
    })
    .await;
    eprintln!("a killed node's 10 sandboxes were Ready on the others {took:?} after the kill (lease TTL 3 s)");
    assert_eq!(per_node(&listed).values().sum::<usize>(), SANDBOXES);

    // n2 cut off: it stops its runs, and its sandboxes come back on n3; healed, it removes what
    // the store placed elsewhere. Exactly one run of every sandbox is left on the machine.
    let on_n2: BTreeMap<String, u64> =
        listed.iter().filter(|s| s.node == "n2").map(|s| (s.name.clone(), s.generation)).collect();
    let before_cut: BTreeMap<String, u64> = listed.iter().map(|s| (s.name.clone(), s.generation)).collect();
    rig.rig("cut-node", 2);
    let (_, took) = until(&mut sandboxes, Duration::from_secs(60), |listed| {
        listed.iter().all(|s| s.node == "n3" && on_n2.get(&s.name).is_none_or(|g| s.generation == g + 1))
    })
    .await;
    eprintln!("a cut node's sandboxes were Ready on n3 {took:?} after the cut");
    rig.rig("heal-node", 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs: Vec<usize> = (0..SANDBOXES).map(|i| runs_of(&sleeper(i))).collect();
        if runs.iter().all(|n| *n == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "runs per sandbox after the heal: {runs:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And the heal cost nothing that ran elsewhere: no sandbox went past the generation the cut
    // gave it.
    let (listed, _) = until(&mut sandboxes, Duration::from_secs(10), |_| true).await;
    for s in &listed {
        let moved = u64::from(on_n2.contains_key(&s.name));
        assert_eq!(s.generation, before_cut[&s.name] + moved, "{} after the heal: {s:?}", s.name);
    }

    // TLS between every process that crosses a host: a client that does not trust the rig's CA,
    // or speaks plaintext to an https:// address, gets nothing.
    assert!(rig.channel_trusting(None).await.is_err(), "a client without the CA connected");
    let plain = rig.address.replacen("https://", "http://", 1);
    let plain = Channel::from_shared(plain).unwrap().connect().await;
    if let Ok(plain) = plain {
        let mut client = SandboxesClient::with_interceptor(plain, Bearer(rig.token.clone()));
        assert!(client.list_sandboxes(pb::ListSandboxesRequest::default()).await.is_err(), "plaintext was answered");
    }
    // The store's side: every node's connections to PostgreSQL are TLS, and plaintext from a
    // node's host is refused.
    let (admin, connection) = tokio_postgres::connect(&rig.store, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let from_nodes = "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s \
        JOIN pg_stat_activity a USING (pid) WHERE a.client_addr << '10.78.0.0/16'";
    let row = admin.query_one(from_nodes, &[]).await.unwrap();
    let (encrypted, all): (i64, i64) = (row.get(0), row.get(1));
    assert!(all > 0 && encrypted == all, "{encrypted} of the nodes' {all} store connections are TLS");
    let port = rig.store.rsplit(':').next().and_then(|p| p.split('/').next()).unwrap();
    let plaintext = format!("postgres://berth@10.78.1.1:{port}/berth?sslmode=disable");
    let psql = Command::new("ip").args(["netns", "exec", "berth-n1", "psql", &plaintext, "-c", "SELECT 1"]).output();
    let psql = psql.unwrap();
    let said = String::from_utf8_lossy(&psql.stderr);
    assert!(!psql.status.success() && said.contains("no encryption"), "plaintext from a node: {said}");

    // A node whose certificate another CA signed is refused by the gateway: a call about a
    // sandbox on it is UNAVAILABLE naming it, while a sandbox on a node the CA vouches for serves.
    rig.rig("rogue-node", 3);
    let on_n3 = listed.iter().find(|s| s.node == "n3").unwrap().name.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let refused = try_exec(&mut execs, &on_n3, &["true"]).await.unwrap_err();
        // Lapsed meanwhile (the restart), then refused for its certificate.
        if !refused.message().contains("lapsed") {
            break refused;
        }
        assert!(Instant::now() < deadline, "{refused:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("runs on node 'n3', not reachable"), "{refused:?}");
    let request =
        pb::CreateSandboxRequest { name: "fresh".into(), spec: Some(spec(&["sleep", "3600"])), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap();
    let (fresh, _) = wait_phase(&mut sandboxes, "fresh", pb::Phase::Ready).await;
    assert_eq!(fresh.node, "n2", "{fresh:?}");
    assert_eq!(exec_output(&mut execs, "fresh", &["echo", "vouched"]).await, "vouched\n");
}

/// What `argv` prints (stdout and stderr) run as an exec in sandbox `name`; it must exit 0.
async fn exec_output(execs: &mut Execs, name: &str, argv: &[&str]) -> String {
    let (text, code) = try_exec(execs, name, argv).await.unwrap();
    assert_eq!(code, Some(0), "{argv:?} in {name}: {text}");
    text
}

/// What `argv` prints run as an exec in sandbox `name`, and its exit code, or the call's error.
async fn try_exec(execs: &mut Execs, name: &str, argv: &[&str]) -> Result<(String, Option<i32>), tonic::Status> {
    let start = pb::ExecStart {
        sandbox: name.to_string(),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    let input = tokio_stream::iter([pb::ExecInput { input: Some(pb::exec_input::Input::Start(start)) }]);
    let mut output = execs.exec(input).await?.into_inner();
    let mut text = Vec::new();
    while let Some(message) = output.message().await? {
        match message.output {
            Some(pb::exec_output::Output::Chunk(chunk)) => text.extend(chunk.data),
            Some(pb::exec_output::Output::End(end)) => {
                return Ok((String::from_utf8_lossy(&text).into_owned(), end.exit_code));
            }
            _ => {}
        }
    }
    Err(tonic::Status::unknown("the exec's output ended without its end"))
}

async fn read_all_logs(mut logs: tonic::Streaming<pb::LogsOutput>) -> String {
    let mut text = Vec::new();
    while let Some(message) = logs.message().await.unwrap() {
        if let Some(pb::logs_output::Output::Chunk(chunk)) = message.output {
            text.extend(chunk.data);
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}
