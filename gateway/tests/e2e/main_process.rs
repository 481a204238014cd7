//! DESIGN 9.3, on the process driver: how the sandbox's main process ends decides its phase.

use std::time::Duration;

use berth_proto::v1 as pb;

use crate::harness::*;

/// Defect 8 of issue 13: a command that cannot be started never reports Ready; the record
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_be_started_is_never_ready_and_the_record_says_why() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    create(&mut sandboxes, "typo", &["/no/such/binary", "--flag"], &[]).await;
    let (s, seen) = wait_phase(&mut sandboxes, "typo", pb::Phase::Error).await;
    assert!(!seen.contains(&pb::Phase::Ready), "reported Ready on the way: {seen:?}");
    let failure = s.failure.unwrap();
    assert_eq!(failure.reason, "CommandFailedToStart");
    assert!(failure.message.contains("/no/such/binary") && failure.message.contains("No such file"), "{failure:?}");
    // A command that is not executable: the same, with its own cause.
    let script = data.path.join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    create(&mut sandboxes, "noexec", &[script.to_str().unwrap()], &[]).await;
    let (s, seen) = wait_phase(&mut sandboxes, "noexec", pb::Phase::Error).await;
    assert!(!seen.contains(&pb::Phase::Ready), "reported Ready on the way: {seen:?}");
    assert!(s.failure.unwrap().message.contains("Permission denied"));
}

/// Exit 0 completes the generation: Stopped, intent still Running, and a Start runs the
/// command again as a new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_exits_0_completes_and_a_start_runs_it_again() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create(&mut sandboxes, "job", &["sh", "-c", "echo run >> runs; sleep 0.3; exit 0"], &[]).await.id;
    let (done, _) = wait_for(&mut sandboxes, "job", Duration::from_secs(30), |s| s.is_some_and(|s| s.completed)).await;
    let done = done.unwrap();
    assert_eq!((phase(&done), done.intent, done.failure), (pb::Phase::Stopped, pb::Intent::Running as i32, None));
    lifecycle(&mut sandboxes, "start", "job").await.unwrap();
    let (again, _) = wait_for(&mut sandboxes, "job", Duration::from_secs(30), |s| {
        s.is_some_and(|s| s.completed && s.generation == 2)
    })
    .await;
    assert_eq!(phase(&again.unwrap()), pb::Phase::Stopped);
    assert_eq!(workspace_file(&data.path, &id, "runs").as_deref(), Some("run\nrun"));
    // A non-zero exit is still a failure, with its code.
    create(&mut sandboxes, "fails", &["sh", "-c", "sleep 0.3; exit 3"], &[]).await;
    let (s, _) = wait_phase(&mut sandboxes, "fails", pb::Phase::Error).await;
    assert_eq!(s.failure.unwrap().exit_code, Some(3));
}
