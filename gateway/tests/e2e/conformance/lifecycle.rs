//! Ready through the supervisor, repeated cycles, real exits, stops and deletes mid-transition,
//! and a delete's stop grace.

use super::*;

pub(crate) async fn ready_through_the_supervisor(runtime: Runtime) {
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

pub(crate) async fn fifty_cycles_keep_the_workspace_with_polls_inside_starts(runtime: Runtime) {
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

pub(crate) async fn a_real_exit_is_an_error_with_its_code(runtime: Runtime) {
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

pub(crate) async fn stop_and_delete_while_starting_or_stopping(runtime: Runtime) {
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
pub(crate) async fn a_delete_gives_the_run_its_stop_grace(runtime: Runtime) {
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
