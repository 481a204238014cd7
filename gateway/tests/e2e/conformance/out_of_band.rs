//! Runs removed, killed or restarted behind the gateway's back (by the operator or the runtime).

use super::*;

pub(crate) async fn out_of_band_removal_and_kill(runtime: Runtime) {
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
pub(crate) async fn a_late_start_of_an_older_generation_is_refused_after_out_of_band_removal(runtime: Runtime) {
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

/// Defect 3 of issue 13: `docker restart` (or `podman restart`) of a sandbox's container, then
/// one StartSandbox: Ready, and it stays Ready. The run started out of band is the one a stop
/// ends to make room; its exit is not the new generation's. Containers only: a process has no
/// restart outside its driver.
pub(crate) async fn an_out_of_band_restart_then_one_start_is_ready(runtime: Runtime) {
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
