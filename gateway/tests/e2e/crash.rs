//! The gateway killed with SIGKILL while creates, stops, starts and deletes are under way.

use std::collections::BTreeMap;

use berth_proto::v1 as pb;

use crate::harness::*;

/// Ignores SIGTERM, so its stop takes the whole grace period: the kill lands inside it.
const STUBBORN: &[&str] = &["sh", "-c", "trap '' TERM; while true; do sleep 1; done"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_operations_then_restarted_every_acknowledged_operation_holds() {
    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut ids = BTreeMap::new();
    for name in ["keep-a", "keep-b", "stop-me", "stubborn", "restart-me", "delete-me"] {
        let command = if name == "stubborn" { STUBBORN } else { COUNTING };
        ids.insert(name, create(&mut sandboxes, name, command, &[]).await.id);
    }
    for name in ids.keys() {
        wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
    }
    let kept_pids: Vec<i32> = ["keep-a", "keep-b"].iter().map(|n| data.run_pid(&ids[n]).unwrap()).collect();

    // A burst of operations; each is acknowledged before the kill, few of their effects are done.
    lifecycle(&mut sandboxes, "stop", "restart-me").await.unwrap();
    wait_phase(&mut sandboxes, "restart-me", pb::Phase::Stopped).await;
    let acked = [
        create(&mut sandboxes, "new-a", COUNTING, &[]).await.phase,
        create(&mut sandboxes, "new-b", COUNTING, &[]).await.phase,
        lifecycle(&mut sandboxes, "stop", "stop-me").await.unwrap().phase,
        lifecycle(&mut sandboxes, "stop", "stubborn").await.unwrap().phase,
        lifecycle(&mut sandboxes, "start", "restart-me").await.unwrap().phase,
        lifecycle(&mut sandboxes, "delete", "delete-me").await.unwrap().phase,
    ];
    gateway.kill9();
    let expected_acks = [
        pb::Phase::Provisioning,
        pb::Phase::Provisioning,
        pb::Phase::Stopping,
        pb::Phase::Stopping,
        pb::Phase::Starting,
        pb::Phase::Deleting,
    ];
    assert_eq!(acked.to_vec(), expected_acks.iter().map(|p| *p as i32).collect::<Vec<_>>());

    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    for name in ["keep-a", "keep-b", "new-a", "new-b", "restart-me"] {
        wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
    }
    for name in ["stop-me", "stubborn"] {
        wait_phase(&mut sandboxes, name, pb::Phase::Stopped).await;
    }
    wait_gone(&mut sandboxes, "delete-me").await;

    // Running sandboxes were adopted, not restarted: same run, same generation.
    for (name, pid) in ["keep-a", "keep-b"].iter().zip(&kept_pids) {
        assert_eq!(data.run_pid(&ids[name]), Some(*pid), "{name} was restarted");
        let s = get(&mut sandboxes, name).await.unwrap();
        assert_eq!(
            (s.generation, workspace_file_once(&data.path, &ids[name], "starts", "1").await.as_deref()),
            (1, Some("1"))
        );
    }
    assert_eq!(get(&mut sandboxes, "restart-me").await.unwrap().generation, 2);
    // Nothing is left in a transitional phase.
    let all = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner().sandboxes;
    assert_eq!(all.len(), 7);
    for s in &all {
        assert!(matches!(phase(s), pb::Phase::Ready | pb::Phase::Stopped), "{} is {:?}", s.name, phase(s));
    }
    assert!(!data.workspace(&ids["delete-me"]).exists());
    // A graceful stop leaves sandboxes running for the next gateway.
    let mut gateway = gateway;
    gateway.terminate();
    assert!(data.log().contains("sandboxes keep running"), "no graceful shutdown logged");
    assert!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(kept_pids[0]), None).is_ok());
}

/// Group commit (issue 16): 32 clients writing at once, so SQLite's writer takes their commits
/// in groups, and the gateway killed with SIGKILL mid-burst. Restarted, every write a client
/// was told of is there; nothing half-written is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_in_a_group_committed_burst_every_acknowledged_write_is_there() {
    const CLIENTS: usize = 32;
    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &[]).await;
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut providers = gateway.providers().await;
        let acked = acked_tx.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("p{c}-{i}");
                let credentials = [("KEY".to_string(), format!("value-{c}-{i}"))].into();
                let request = pb::CreateProviderRequest {
                    endpoints: Default::default(),
                    name: name.clone(),
                    kind: "k".into(),
                    credentials,
                    expected_resource_version: None,
                };
                match providers.create_provider(request).await {
                    Ok(_) => {
                        let _ = acked.send(name);
                    }
                    // The gateway is gone: this write may or may not have landed; it was not acknowledged.
                    Err(_) => return,
                }
            }
        }));
    }
    drop(acked_tx);
    // Let the burst build up, then kill it in the middle.
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if acked_rx.len() >= 300 {
            break;
        }
    }
    gateway.kill9();
    for task in tasks {
        let _ = task.await;
    }
    let mut acked = std::collections::BTreeSet::new();
    while let Some(name) = acked_rx.recv().await {
        acked.insert(name);
    }

    let gateway = Gateway::start(&data, &[]).await;
    let mut providers = gateway.providers().await;
    let mut stored = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let reply = providers
            .list_providers(pb::ListProvidersRequest { page_size: 500, page_token })
            .await
            .unwrap()
            .into_inner();
        for p in reply.providers {
            stored.insert(p.name.clone(), p);
        }
        if reply.next_page_token.is_empty() {
            break;
        }
        page_token = reply.next_page_token;
    }
    let lost: Vec<&String> = acked.iter().filter(|n| !stored.contains_key(*n)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged writes lost: {lost:?}", lost.len(), acked.len());
    assert!(stored.values().all(|p| p.credential_names == ["KEY"] && p.resource_version == 1), "whole records only");
    assert!(stored.len() >= acked.len());
}
