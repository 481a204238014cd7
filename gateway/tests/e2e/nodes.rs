//! Nodes (DESIGN 14): a gateway registers the host it runs on as a node, under a lease one
//! process holds at a time; gateways sharing a data directory are one node, whose lease moves,
//! in a new epoch, when its holder dies. Placement on the node; drain and undrain; delete,
//! refused while live or holding sandboxes; the CLI's listing.

use std::time::{Duration, Instant};

use berth_proto::v1 as pb;
use berth_proto::v1::nodes_client::NodesClient;
use tonic::Code;

use crate::cli::{berth, berth_with_stdin};
use crate::harness::*;
use crate::pg;

type Nodes = NodesClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>>;

async fn nodes(gateway: &Gateway) -> Nodes {
    NodesClient::with_interceptor(gateway.channel().await, Bearer(gateway.token.clone()))
}

/// The nodes once `settled` holds of them (within 20 s).
async fn nodes_until(nodes: &mut Nodes, settled: impl Fn(&[pb::Node]) -> bool) -> Vec<pb::Node> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = nodes.list_nodes(pb::ListNodesRequest {}).await.unwrap().into_inner().nodes;
        if settled(&listed) || Instant::now() > deadline {
            assert!(settled(&listed), "the nodes never settled: {listed:?}");
            return listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn drain(nodes: &mut Nodes, id: &str, draining: bool) -> Result<pb::Node, tonic::Status> {
    let request = pb::DrainNodeRequest { id: id.to_string() };
    let reply = if draining { nodes.drain_node(request).await } else { nodes.undrain_node(request).await };
    Ok(reply?.into_inner().node.unwrap())
}

#[tokio::test]
async fn a_gateway_registers_its_host_as_a_node_with_what_it_offers_and_drains_it() {
    let data = DataDir::new();
    let flags = ["--node", "n1", "--node-label", "zone=a", "--node-sandboxes", "40"];
    let mut gateway = Gateway::start(&data, &flags).await;
    let mut client = nodes(&gateway).await;
    let listed = nodes_until(&mut client, |n| n.iter().any(|n| n.live)).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let node = &listed[0];
    assert_eq!((node.id.as_str(), node.epoch, node.holder.as_str(), node.draining), ("n1", 1, "gateway", false));
    assert_eq!(node.address, gateway.address);
    assert_eq!(node.labels.get("zone").map(String::as_str), Some("a"));
    let capacity = node.capacity.unwrap();
    assert_eq!(capacity.sandboxes, 40);
    assert!(capacity.cpu_millis >= 1000 && capacity.memory_bytes > 0, "{capacity:?}");

    // Drained and back; a renewal keeps the drain.
    assert!(drain(&mut client, "n1", true).await.unwrap().draining);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = client.get_node(pb::GetNodeRequest { id: "n1".into() }).await.unwrap().into_inner().node.unwrap();
    assert!(got.draining && got.live, "{got:?}");
    assert!(!drain(&mut client, "n1", false).await.unwrap().draining);

    // Bad input names the field; a node never registered is NOT_FOUND, for a drain too.
    let missing = client.get_node(pb::GetNodeRequest { id: "n9".into() }).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(missing.message().contains("'n9'"), "{missing:?}");
    assert_eq!(drain(&mut client, "n9", true).await.unwrap_err().code(), Code::NotFound);
    let bad = client.get_node(pb::GetNodeRequest { id: "N/1".into() }).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("id"), "{bad:?}");

    // The CLI's listing, as JSON.
    let out = berth(&data, &["node", "list", "-o", "json"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["id"], "n1", "{shown}");
    assert_eq!((shown["live"].as_bool(), shown["capacity"]["sandboxes"].as_u64()), (Some(true), Some(40)));

    // A live node is not deleted: it would register again.
    let live = client.delete_node(pb::DeleteNodeRequest { id: "n1".into() }).await.unwrap_err();
    assert_eq!(live.code(), Code::FailedPrecondition);
    assert!(live.message().contains("gateway holds its lease"), "{live:?}");

    // A gateway that stops gives the lease up: the node is fenced at once, and granted again
    // in a new epoch.
    gateway.terminate();
    let mut gateway = Gateway::start(&data, &flags).await;
    let mut client = nodes(&gateway).await;
    let listed = nodes_until(&mut client, |n| n.iter().any(|n| n.live)).await;
    assert_eq!((listed[0].epoch, listed[0].live), (2, true), "{listed:?}");

    // Moved to another node name, the old one is left released: deleted, through the CLI.
    gateway.terminate();
    let gateway = Gateway::start(&data, &["--node", "n2"]).await;
    let mut client = nodes(&gateway).await;
    nodes_until(&mut client, |n| n.iter().any(|n| n.id == "n2" && n.live)).await;
    let out = berth(&data, &["node", "delete", "n1"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = client.list_nodes(pb::ListNodesRequest {}).await.unwrap().into_inner().nodes;
    assert_eq!(listed.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), ["n2"]);
    let again = berth(&data, &["node", "delete", "n1"]).await;
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("'n1'"));
}

#[tokio::test]
async fn a_sandbox_is_placed_on_a_node_that_takes_it_and_holds_it_there_against_a_delete() {
    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &["--node", "n1", "--node-label", "zone=a"]).await;
    let mut client = nodes(&gateway).await;
    let out =
        berth(&data, &["-o", "json", "sandbox", "create", "one", "--node-selector", "zone=a", "--", "sleep", "3600"])
            .await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let epoch = nodes_until(&mut client, |n| n.iter().any(|n| n.live)).await[0].epoch;
    assert_eq!((shown["node"].as_str(), shown["node_epoch"].as_u64()), (Some("n1"), Some(epoch)), "{shown}");
    assert_eq!(shown["spec"]["node_selector"]["zone"], "a", "{shown}");
    let table = berth(&data, &["sandbox", "list"]).await;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    let (header, row) = (table.lines().next().unwrap(), table.lines().nth(1).unwrap());
    assert!(header.contains(" NODE ") && row.split_whitespace().any(|cell| cell == "n1"), "{table}");

    // Drained, it takes nothing new: the create fails naming the node and why, writing nothing.
    drain(&mut client, "n1", true).await.unwrap();
    let refused = berth(&data, &["sandbox", "create", "two", "--no-wait", "--", "sleep", "3600"]).await;
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why.contains("cannot place sandbox 'two'"), "{why}");
    assert!(why.contains("n1: it is draining"), "{why}");
    assert!(!berth(&data, &["sandbox", "get", "two"]).await.status.success(), "nothing was written");
    // What runs stays where it is.
    let kept = berth(&data, &["-o", "json", "sandbox", "get", "one"]).await;
    let kept: serde_json::Value = serde_json::from_slice(&kept.stdout).unwrap();
    assert_eq!((kept["phase"].as_str(), kept["node"].as_str()), (Some("Ready"), Some("n1")), "{kept}");
    drain(&mut client, "n1", false).await.unwrap();
    let unselected = ["sandbox", "create", "two", "--no-wait", "--node-selector", "zone=b", "--", "sleep", "3600"];
    let refused = berth(&data, &unselected).await;
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why.contains("n1: it has no label zone=b"), "{why}");
    let out = berth(&data, &["sandbox", "create", "two", "--", "sleep", "3600"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let node = berth(&data, &["-o", "json", "node", "get", "n1"]).await;
    let node: serde_json::Value = serde_json::from_slice(&node.stdout).unwrap();
    assert_eq!(node["placed"]["sandboxes"], 2, "{node}");

    // Its gateway gone (the lease given up), the node still holds what runs there: its delete
    // is refused, naming how many, until they are stopped. No process runs n1 any more, so the
    // stops complete once n1 is fenced (twice the lease's TTL after n2's gateway first sees it
    // lapsed), and n2, whose runtime is the same data directory's, removes the runs the store
    // no longer places on it.
    gateway.terminate();
    let _gateway = Gateway::start(&data, &["--node", "n2", "--lease-ttl", "2s"]).await;
    let refused = berth(&data, &["node", "delete", "n1"]).await;
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why.contains("node 'n1' holds 2 sandbox(es)"), "{why}");
    let out = berth(&data, &["sandbox", "stop", "one", "two"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = berth(&data, &["node", "delete", "n1"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for name in ["one", "two"] {
        let sandbox = berth(&data, &["-o", "json", "sandbox", "get", name]).await;
        let sandbox: serde_json::Value = serde_json::from_slice(&sandbox.stdout).unwrap();
        assert_eq!(sandbox["phase"], "Stopped", "{sandbox}");
    }
    // Started again (one asks for zone=a, which n2 is not), two is placed on n2, which keeps its workspace (the runtime is the same)
    // rather than refusing a sandbox its runtime once removed.
    let out = berth(&data, &["sandbox", "start", "two"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let two = berth(&data, &["-o", "json", "sandbox", "get", "two"]).await;
    let two: serde_json::Value = serde_json::from_slice(&two.stdout).unwrap();
    assert_eq!((two["phase"].as_str(), two["node"].as_str()), (Some("Ready"), Some("n2")), "{two}");
}

#[tokio::test]
async fn a_node_granted_its_lease_again_adopts_its_runs_under_the_new_epoch() {
    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &["--node", "n1"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    create(&mut sandboxes, "kept", &["sleep", "3600"], &[]).await;
    let (made, _) = wait_phase(&mut sandboxes, "kept", pb::Phase::Ready).await;
    assert_eq!((made.node.as_str(), made.node_epoch), ("n1", 1));
    // Stopped and started again: the lease given up and granted in epoch 2. The run lived on;
    // the node's sweep adopts it (its placement's epoch moves up), and nothing else changes.
    gateway.terminate();
    let gateway = Gateway::start(&data, &["--node", "n1"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let (adopted, _) =
        wait_for(&mut sandboxes, "kept", Duration::from_secs(20), |s| s.is_some_and(|s| s.node_epoch == 2)).await;
    let adopted = adopted.unwrap();
    assert_eq!((phase(&adopted), adopted.generation, adopted.node.as_str()), (pb::Phase::Ready, 1, "n1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_a_data_directory_are_one_node_whose_lease_moves_when_its_holder_dies() {
    let _server = POSTGRES_SERVER.read().await;
    let Some(url) = pg::fresh_schema("one_node").await else { return };
    let data = DataDir::new();
    let args = |name| ["--store", &url, "--name", name, "--lease-ttl", "2s"].map(str::to_string);
    let (a, b) = (args("g1"), args("g2"));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let (g1, g2) = tokio::join!(Gateway::start(&data, &a), Gateway::start(&data, &b));
    let mut gateways = [g1, g2];
    let mut client = nodes(&gateways[0]).await;
    let listed = nodes_until(&mut client, |n| n.iter().any(|n| n.live)).await;
    // One node, the data directory's (its instance name), held by one of them.
    assert_eq!(listed.len(), 1, "{listed:?}");
    let node = listed[0].clone();
    assert_eq!(node.epoch, 1);
    let instance = std::fs::read_to_string(data.path.join("instance-id")).unwrap();
    assert_eq!(node.id, instance.trim());
    let holder = ["g1", "g2"].iter().position(|g| *g == node.holder).expect("held by one of them");
    let other = 1 - holder;
    gateways[holder].kill9();
    // Killed, it cannot give the lease up: the other takes it once it lapses, in a new epoch.
    let mut client = nodes(&gateways[other]).await;
    let started = Instant::now();
    let listed = nodes_until(&mut client, |n| n.iter().any(|n| n.live && n.epoch == 2)).await;
    assert_eq!(listed[0].holder, ["g1", "g2"][other], "{listed:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "taken over after {:?}", started.elapsed());
}

/// Two hosts' worth: gateways with data directories of their own (each its own runtime, so each
/// its own node: n1 labelled host=one, n2 host=two) sharing one PostgreSQL database and one API
/// token, each also given its `extra` flags. n2 reaches the database as a node on another host
/// would, over TLS (sslmode=require, the server's certificate checked against its CA).
pub(crate) async fn two_nodes(test: &str, extra: [&[&str]; 2]) -> Option<([DataDir; 2], [Gateway; 2])> {
    let url = pg::fresh_schema(test).await?;
    let ca = pg::server_ca(test)?;
    let over_tls = format!("{url}&sslmode=require");
    let mut second = vec!["--store-ca", ca.to_str().unwrap()];
    second.extend(extra[1]);
    Some(two_nodes_on([&url, &over_tls], [extra[0], &second]).await)
}

/// [`two_nodes`], each reaching the database at its own URL of it.
async fn two_nodes_on(urls: [&str; 2], extra: [&[&str]; 2]) -> ([DataDir; 2], [Gateway; 2]) {
    let data = [DataDir::new(), DataDir::new()];
    let flags = |node: &'static str, host: &'static str, extra: &[&str]| {
        let url = urls[usize::from(node == "n2")];
        let mut flags = vec!["--store", url, "--name", node, "--node", node, "--node-label", host, "--lease-ttl", "2s"];
        flags.extend(extra.iter().copied());
        flags.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let first = flags("n1", "host=one", extra[0]);
    let first = Gateway::start(&data[0], &first.iter().map(String::as_str).collect::<Vec<_>>()).await;
    std::fs::copy(data[0].path.join("api-token"), data[1].path.join("api-token")).unwrap();
    let second = flags("n2", "host=two", extra[1]);
    let second = Gateway::start(&data[1], &second.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let mut client = nodes(&first).await;
    nodes_until(&mut client, |n| n.iter().filter(|n| n.live).count() == 2).await;
    (data, [first, second])
}

/// The process driver's directory of a sandbox in a data directory: there while its node has it.
fn kept_in(data: &DataDir, sandbox: &pb::Sandbox) -> bool {
    data.path.join("sandboxes").join(&sandbox.id).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_runs_on_the_node_it_is_placed_on_whichever_gateway_decided() {
    let _server = POSTGRES_SERVER.read().await;
    let http = free_port();
    let http_listen = format!("127.0.0.1:{http}");
    let Some((data, gateways)) = two_nodes("two_nodes", [&["--http-listen", &http_listen], &[]]).await else { return };
    let mut through_one = gateways[0].sandboxes().await;
    let mut through_two = gateways[1].sandboxes().await;

    // Decided through n1's gateway, placed on n2: n2's runtime runs it, n1's never holds it.
    let spec = |host: &str| pb::SandboxSpec {
        command: ["sh", "-c", "echo far started; sleep 3600"].map(String::from).to_vec(),
        node_selector: [("host".to_string(), host.to_string())].into(),
        ..Default::default()
    };
    let create = |name: &str, host: &str| pb::CreateSandboxRequest {
        name: name.into(),
        spec: Some(spec(host)),
        ..Default::default()
    };
    through_one.create_sandbox(create("far", "two")).await.unwrap();
    let (far, _) = wait_phase(&mut through_one, "far", pb::Phase::Ready).await;
    assert_eq!((far.node.as_str(), far.generation), ("n2", 1), "{far:?}");
    assert!(kept_in(&data[1], &far) && !kept_in(&data[0], &far));
    through_two.create_sandbox(create("near", "one")).await.unwrap();
    let (near, _) = wait_phase(&mut through_two, "near", pb::Phase::Ready).await;
    assert_eq!(near.node, "n1", "{near:?}");
    assert!(kept_in(&data[0], &near) && !kept_in(&data[1], &near));

    // Exec (with stdin and an exit code), an attach, logs and files of the sandbox on n2, through
    // n1's gateway: carried to n2's and relayed.
    let ran = berth_with_stdin(
        &data[0],
        &["sandbox", "exec", "-i", "far", "--", "sh", "-c", "cat; echo out; exit 3"],
        b"in\n",
    )
    .await;
    assert_eq!(ran.status.code(), Some(3), "{}", String::from_utf8_lossy(&ran.stderr));
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "in\nout\n");
    let ran =
        berth(&data[0], &["sandbox", "exec", "--id", "job-1", "far", "--", "sh", "-c", "echo to-logs >&2; echo again"])
            .await;
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let attached = berth(&data[0], &["exec", "attach", "far", "job-1", "--offset", "0"]).await;
    assert_eq!(String::from_utf8_lossy(&attached.stdout), "again\n", "{}", String::from_utf8_lossy(&attached.stderr));
    let logs = berth(&data[0], &["sandbox", "logs", "far"]).await;
    assert!(String::from_utf8_lossy(&logs.stdout).contains("far started"), "{}", String::from_utf8_lossy(&logs.stderr));
    let files = tempfile::tempdir().unwrap();
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(files.path().join("blob"), &payload).unwrap();
    let into = berth(&data[0], &["sandbox", "cp", files.path().join("blob").to_str().unwrap(), "far:blob"]).await;
    assert!(into.status.success(), "{}", String::from_utf8_lossy(&into.stderr));
    let back = files.path().join("back");
    let out = berth(&data[0], &["sandbox", "cp", "far:blob", back.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&back).unwrap() == payload, "the bytes came back changed");
    let on_n2 = berth(&data[1], &["sandbox", "exec", "far", "--", "wc", "-c", "blob"]).await;
    assert_eq!(String::from_utf8_lossy(&on_n2.stdout).trim(), "3000000 blob", "written on n2's host");

    // A cancel through n1's gateway ends the run's exec on n2 (carried to n2's gateway, whose
    // session tells the run at once; the sweep would tell it within its period otherwise).
    let mut execs = gateways[0].execs().await;
    let long =
        pb::ExecStart { exec_id: "long".into(), ..crate::exec::start("far", &["sh", "-c", "echo up; sleep 3600"]) };
    let (mut stream, _input) = crate::exec::open(&mut execs, long).await.unwrap();
    // Running (its first output read), so the cancel must reach the run, not only its record.
    let up = loop {
        match stream.message().await.unwrap().and_then(|m| m.output) {
            Some(pb::exec_output::Output::Chunk(chunk)) => break chunk.data.len() as u64,
            Some(_) => {}
            None => panic!("the exec's stream ended before its output"),
        }
    };
    let request = pb::ExecRequest { sandbox: "far".into(), exec_id: "long".into() };
    assert!(execs.cancel_exec(request).await.unwrap().into_inner().exec.unwrap().cancel_requested);
    let cancelled = crate::exec::read_all(stream, up, Duration::from_secs(20)).await;
    assert_eq!(cancelled.state(), pb::ExecState::Cancelled);

    // The HTTP/JSON API's exec through n1's gateway runs on n2 too.
    let curl = crate::http::Curl { base: format!("http://{http_listen}"), token: data[0].token() };
    let body = r#"{"argv": ["sh", "-c", "cat blob | wc -c; exit 4"]}"#;
    let (status, text) = curl.call("POST", "/v1/sandboxes/far/execs", Some(body), None);
    assert_eq!(status, 200, "{text}");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let end = &lines.last().unwrap()["end"];
    assert_eq!((end["state"].as_str(), end["exit_code"].as_i64()), (Some("EXEC_STATE_EXITED"), Some(4)), "{text}");
    // "3000000\n", base64: the blob is there, on n2's host.
    assert!(lines.iter().any(|l| l["chunk"]["data"] == "MzAwMDAwMAo="), "{text}");

    // Several sweeps of both runtimes later, neither sandbox was taken for absent by the node
    // that does not run it: each still Ready in its first generation.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (sandboxes, name) in [(&mut through_one, "far"), (&mut through_two, "near")] {
        let s = get(sandboxes, name).await.unwrap();
        assert_eq!((phase(&s), s.generation), (pb::Phase::Ready, 1), "{s:?}");
    }

    // Stop, start and delete through the gateway of the node that does not run it.
    lifecycle(&mut through_one, "stop", "far").await.unwrap();
    wait_phase(&mut through_one, "far", pb::Phase::Stopped).await;
    lifecycle(&mut through_one, "start", "far").await.unwrap();
    let (far, _) = wait_phase(&mut through_one, "far", pb::Phase::Ready).await;
    assert_eq!((far.node.as_str(), far.generation), ("n2", 2), "{far:?}");
    lifecycle(&mut through_one, "delete", "far").await.unwrap();
    wait_gone(&mut through_one, "far").await;
    lifecycle(&mut through_two, "delete", "near").await.unwrap();
    wait_gone(&mut through_two, "near").await;
    for (data, sandbox) in [(&data[1], &far), (&data[0], &near)] {
        assert!(!kept_in(data, sandbox), "{} left on its node", sandbox.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_restartable_sandboxes_come_back_on_another_and_its_others_fail_saying_why() {
    let _server = POSTGRES_SERVER.read().await;
    let Some((data, [first, mut second])) = two_nodes("node_death", [&[], &[]]).await else { return };
    let mut client = nodes(&first).await;
    let mut sandboxes = first.sandboxes().await;
    let policy = crate::lifetimes::always(100);
    // Both on n2 (n1 drained meanwhile), one that restarts and one that does not.
    drain(&mut client, "n1", true).await.unwrap();
    for (name, restart) in [("phoenix", Some(policy)), ("mortal", None)] {
        let spec = pb::SandboxSpec { command: vec!["sleep".into(), "3600".into()], restart, ..Default::default() };
        let request = pb::CreateSandboxRequest { name: name.into(), spec: Some(spec), ..Default::default() };
        sandboxes.create_sandbox(request).await.unwrap();
        let (made, _) = wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
        assert_eq!((made.node.as_str(), made.generation), ("n2", 1), "{made:?}");
    }
    drain(&mut client, "n1", false).await.unwrap();

    // n2 dies without giving its lease up: once it lapses (2 s) and stays lapsed (twice that),
    // n1's gateway fences it. The sandbox that restarts comes back Ready on n1 in its next
    // generation; the other fails, saying its node's lease lapsed.
    second.kill9();
    let died = Instant::now();
    let (phoenix, _) = wait_for(&mut sandboxes, "phoenix", Duration::from_secs(30), |s| {
        s.is_some_and(|s| phase(s) == pb::Phase::Ready && s.generation == 2)
    })
    .await;
    let phoenix = phoenix.unwrap();
    assert_eq!(phoenix.node, "n1", "{phoenix:?}");
    assert!(kept_in(&data[0], &phoenix), "its new run is n1's");
    eprintln!("a dead node's sandbox was Ready elsewhere {:?} after the death", died.elapsed());
    let mortal = get(&mut sandboxes, "mortal").await.unwrap();
    assert_eq!(phase(&mortal), pb::Phase::Error, "{mortal:?}");
    let failure = mortal.failure.unwrap();
    assert_eq!(failure.reason, "ComputeResourceMissing");
    assert!(failure.message.contains("node n2's lease lapsed"), "{failure:?}");
    // Started again by its user, it is placed on the live node.
    lifecycle(&mut sandboxes, "start", "mortal").await.unwrap();
    let (mortal, _) = wait_phase(&mut sandboxes, "mortal", pb::Phase::Ready).await;
    assert_eq!((mortal.node.as_str(), mortal.generation), ("n1", 2), "{mortal:?}");
}

/// A TCP relay to the database that a test cuts (every connection dropped, new ones refused)
/// and heals: one node's link to the store, on loopback.
struct Link {
    at: std::net::SocketAddr,
    up: tokio::sync::watch::Sender<bool>,
}

impl Link {
    async fn to(server: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (up, _) = tokio::sync::watch::channel(true);
        let (at, server, state) = (listener.local_addr().unwrap(), server.to_string(), up.subscribe());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let mut state = state.clone();
                if !*state.borrow_and_update() {
                    continue;
                }
                let server = server.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&server).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = state.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Self { at, up }
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

/// Whether process `pid` is alive (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_store_stops_its_runs_and_after_the_heal_holds_only_what_is_placed_on_it() {
    let _server = POSTGRES_SERVER.read().await;
    let Some(url) = pg::fresh_schema("node_cut").await else { return };
    let (user, rest) = url.split_once('@').unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let link = Link::to(authority).await;
    let cut_url = format!("{user}@{}/{path}", link.at);
    let (data, [first, _second]) = two_nodes_on([&url, &cut_url], [&[], &[]]).await;
    let mut sandboxes = first.sandboxes().await;
    let policy = crate::lifetimes::always(100);
    let spec = pb::SandboxSpec {
        command: ["sh", "-c", "echo $$ > main.pid; exec sleep 3600"].map(String::from).to_vec(),
        restart: Some(policy),
        ..Default::default()
    };
    // On n2 (n1 drained meanwhile), free to move.
    let mut client = nodes(&first).await;
    drain(&mut client, "n1", true).await.unwrap();
    let request = pb::CreateSandboxRequest { name: "cut".into(), spec: Some(spec), ..Default::default() };
    sandboxes.create_sandbox(request).await.unwrap();
    let (made, _) = wait_phase(&mut sandboxes, "cut", pb::Phase::Ready).await;
    assert_eq!(made.node, "n2");
    drain(&mut client, "n1", false).await.unwrap();
    let pid_file = data[1].path.join("sandboxes").join(&made.id).join("workspace").join("main.pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "no {}", pid_file.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(alive(pid));

    // Cut: n2's lease lapses unrenewed (n1 is live), so n2 stops its run before the store fences
    // it; the store fences n2 and the policy places the next generation on n1. Never two runs.
    link.set(false);
    let (moved, _) = wait_for(&mut sandboxes, "cut", Duration::from_secs(30), |s| {
        s.is_some_and(|s| phase(s) == pb::Phase::Ready && s.generation == 2)
    })
    .await;
    assert_eq!(moved.unwrap().node, "n1");
    assert!(!alive(pid), "the cut node's run of generation 1 still runs beside generation 2 on n1");
    let log = data[1].log_of("n2");
    assert!(log.contains("stopping every run it holds"), "{log}");

    // Healed: n2 is granted its lease again and starts nothing of what the store placed
    // elsewhere; what is left of it there (its workspace, kept, as the store may place it there
    // again) goes with the sandbox's delete.
    link.set(true);
    let again = get(&mut sandboxes, "cut").await.unwrap();
    let logs = || format!("n1:\n{}\nn2:\n{}", data[0].log_of("n1"), data[1].log_of("n2"));
    let got = (phase(&again), again.generation, again.node.as_str());
    assert_eq!(got, (pb::Phase::Ready, 2, "n1"), "{again:?}\n{}", logs());
    assert!(!alive(pid), "n2 ran its old run again");
    let kept = data[1].path.join("sandboxes").join(&made.id);
    lifecycle(&mut sandboxes, "delete", "cut").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while kept.exists() {
        assert!(Instant::now() < deadline, "n2 kept a deleted sandbox's workspace: {}\n{}", kept.display(), logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
