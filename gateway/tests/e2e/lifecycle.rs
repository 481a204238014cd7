//! The lifecycle through the generated client, against a real gateway and real processes.

use berth_proto::v1 as pb;
use tokio_stream::StreamExt;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_lifecycle_through_the_generated_client() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;

    let created = create(&mut sandboxes, "web", COUNTING, &[]).await;
    assert_eq!(phase(&created), pb::Phase::Provisioning);
    assert_eq!((created.resource_version, created.generation), (1, 1));
    let (ready, _) = wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    assert_eq!(ready.generation, 1);

    let stopping = lifecycle(&mut sandboxes, "stop", "web").await.unwrap();
    assert_eq!(phase(&stopping), pb::Phase::Stopping);
    assert_eq!(pb::Intent::try_from(stopping.intent).unwrap(), pb::Intent::Stopped);
    wait_phase(&mut sandboxes, "web", pb::Phase::Stopped).await;
    let pid = data.run_pid(&created.id).unwrap();
    assert!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(), "the run is gone after a stop");

    let starting = lifecycle(&mut sandboxes, "start", "web").await.unwrap();
    assert_eq!((phase(&starting), starting.generation), (pb::Phase::Starting, 2));
    let (ready, _) = wait_phase(&mut sandboxes, "web", pb::Phase::Ready).await;
    assert_eq!(ready.generation, 2);
    assert_eq!(workspace_file_once(&data.path, &created.id, "starts", "2").await.as_deref(), Some("2"));

    // Every reply carries the version and phase; a list finds it by label-less paging.
    let list = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner();
    assert_eq!(list.sandboxes.len(), 1);
    assert!(list.next_page_token.is_empty());

    let deleting = lifecycle(&mut sandboxes, "delete", "web").await.unwrap();
    assert_eq!(phase(&deleting), pb::Phase::Deleting);
    wait_gone(&mut sandboxes, "web").await;
    assert!(!data.workspace(&created.id).exists(), "the workspace is removed with the sandbox");
    assert_eq!(get(&mut sandboxes, "web").await.unwrap_err().code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_stop_start_cycles_never_error_and_keep_the_workspace() {
    let data = DataDir::new();
    // Polls land inside the starts, as often as they can.
    let gateway = Gateway::start(&data, &["--poll-interval", "10ms"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create(&mut sandboxes, "cycler", COUNTING, &[]).await.id;
    wait_phase(&mut sandboxes, "cycler", pb::Phase::Ready).await;
    // Ready means the supervisor is connected, not that the command has counted its start yet:
    // stopped at once, it may be killed before it does (as each cycle below waits too).
    assert_eq!(workspace_file_once(&data.path, &id, "starts", "1").await.as_deref(), Some("1"));
    for cycle in 1..=50 {
        lifecycle(&mut sandboxes, "stop", "cycler").await.unwrap();
        let (_, seen) = wait_phase(&mut sandboxes, "cycler", pb::Phase::Stopped).await;
        assert!(!seen.contains(&pb::Phase::Error), "cycle {cycle}: {seen:?}");
        lifecycle(&mut sandboxes, "start", "cycler").await.unwrap();
        let (ready, seen) = wait_phase(&mut sandboxes, "cycler", pb::Phase::Ready).await;
        assert!(!seen.contains(&pb::Phase::Error), "cycle {cycle}: {seen:?}");
        assert_eq!(ready.generation, cycle + 1);
        let counted = (cycle + 1).to_string();
        assert_eq!(workspace_file_once(&data.path, &id, "starts", &counted).await, Some(counted), "cycle {cycle}");
    }
    assert!(!data.log().contains("new_phase=Some(Error)"), "no Error was ever written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_exit_of_the_restarted_workload_is_an_error_with_its_code() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    // The first run idles; every later run exits 3 shortly after starting.
    let command = ["sh", "-c", "if [ -e ran ]; then sleep 0.5; exit 3; fi; touch ran; exec sleep 3600"];
    let id = create(&mut sandboxes, "flaky", &command, &[]).await.id;
    wait_phase(&mut sandboxes, "flaky", pb::Phase::Ready).await;
    // Ready is the supervisor's connection: under load, a stop at once could end the first run
    // before its `touch`, and the second would then idle as the first (seen in CI).
    assert_eq!(workspace_file_once(&data.path, &id, "ran", "").await.as_deref(), Some(""));
    lifecycle(&mut sandboxes, "stop", "flaky").await.unwrap();
    wait_phase(&mut sandboxes, "flaky", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "flaky").await.unwrap();
    let (failed, _) = wait_phase(&mut sandboxes, "flaky", pb::Phase::Error).await;
    let failure = failed.failure.unwrap();
    assert_eq!(failure.exit_code, Some(3), "{failure:?}");
    assert!(["MainProcessExited", "ContainerExited"].contains(&failure.reason.as_str()), "{failure:?}");
    // Error is recoverable by Start (a new generation).
    let again = lifecycle(&mut sandboxes, "start", "flaky").await.unwrap();
    assert_eq!(again.generation, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_every_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut client = ServerReflectionClient::new(gateway.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = client.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let Some(Ok(reply)) = replies.next().await else { panic!("no reflection reply") };
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else { panic!("{reply:?}") };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    for expected in ["berth.v1.Providers", "berth.v1.Sandboxes", "berth.v1.Supervisor", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    // Health answers without a token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(gateway.channel().await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest { service: "berth.v1.Sandboxes".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}
