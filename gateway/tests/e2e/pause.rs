//! Pause and resume on every driver (DESIGN 12.1): a frozen run makes no progress (a counter it
//! writes does not move), no exec is admitted while paused, nothing restarts (the generation
//! and the run's identity stay), and a paused sandbox stops and deletes like any other.

use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::Code;

use crate::conformance::{Runtime, Target, clean_up, create_in, target};
use crate::exec::{open, run, start};
use crate::harness::*;

/// Counts in its workspace, every 50 ms, for as long as it runs.
const TICKING: &[&str] = &["sh", "-c", "i=0; while true; do i=$((i + 1)); echo $i > ticks; sleep 0.05; done"];

fn ticks(target: &Target, data: &DataDir, id: &str) -> u64 {
    target.workspace_file(data, id, "ticks").and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// Waits until the counter has moved past `after`.
async fn ticking_past(target: &Target, data: &DataDir, id: &str, after: u64) -> u64 {
    let mut waited = Duration::ZERO;
    loop {
        let now = ticks(target, data, id);
        if now > after {
            return now;
        }
        assert!(waited < Duration::from_secs(20), "the counter never moved past {after}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
}

/// The status an exec's admission gets.
async fn exec_refusal(execs: &mut Execs, name: &str) -> tonic::Status {
    match open(execs, start(name, &["true"])).await {
        Err(status) => status,
        Ok((mut stream, _input)) => match stream.message().await {
            Err(status) => status,
            Ok(message) => panic!("an exec was admitted to a paused sandbox: {message:?}"),
        },
    }
}

async fn a_paused_run_makes_no_progress_and_resumes_where_it_was(runtime: Runtime) {
    let Some(target) = target(runtime, "pause").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut execs = gateway.execs().await;
    let id = create_in(&target, &mut sandboxes, "frozen", TICKING).await.id;
    let (ready, _) = wait_phase(&mut sandboxes, "frozen", pb::Phase::Ready).await;
    ticking_past(&target, &data, &id, 0).await;
    let identity = target.run_identity(&data, &id);

    for round in 0..3 {
        let accepted = lifecycle(&mut sandboxes, "pause", "frozen").await.unwrap();
        assert_eq!(accepted.intent, pb::Intent::Paused as i32, "{runtime:?}");
        let (paused, _) = wait_phase(&mut sandboxes, "frozen", pb::Phase::Paused).await;
        assert_eq!((paused.generation, paused.intent), (ready.generation, pb::Intent::Paused as i32));
        // Frozen: the counter stands still, however long it is watched.
        let held = ticks(&target, &data, &id);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(ticks(&target, &data, &id), held, "{runtime:?} round {round}: a paused run made progress");
        let refusal = exec_refusal(&mut execs, "frozen").await;
        assert_eq!(refusal.code(), Code::FailedPrecondition, "{runtime:?}: {refusal:?}");
        assert!(refusal.message().contains("Paused"), "{refusal:?}");
        // A repeated pause changes nothing.
        let again = lifecycle(&mut sandboxes, "pause", "frozen").await.unwrap();
        assert_eq!(again.resource_version, paused.resource_version, "{runtime:?}");

        lifecycle(&mut sandboxes, "resume", "frozen").await.unwrap();
        let (resumed, _) = wait_phase(&mut sandboxes, "frozen", pb::Phase::Ready).await;
        assert_eq!(resumed.generation, ready.generation, "{runtime:?}: nothing restarted");
        assert_eq!(target.run_identity(&data, &id), identity, "{runtime:?}: the run's identity is the same");
        // It carries on from where it was, in the same run.
        ticking_past(&target, &data, &id, held).await;
        let read = run(&mut execs, start("frozen", &["sh", "-c", "echo alive"])).await;
        assert_eq!(read.stdout, b"alive\n", "{runtime:?}");
    }

    // A resume of a sandbox not paused is a no-op; a pause of one that is not Ready is refused.
    let ready_again = lifecycle(&mut sandboxes, "resume", "frozen").await.unwrap();
    assert_eq!(ready_again.phase, pb::Phase::Ready as i32);
    lifecycle(&mut sandboxes, "pause", "frozen").await.unwrap();
    wait_phase(&mut sandboxes, "frozen", pb::Phase::Paused).await;
    // A paused sandbox stops like any other (thawed first, so its stop is graceful).
    lifecycle(&mut sandboxes, "stop", "frozen").await.unwrap();
    let (stopped, seen) = wait_phase(&mut sandboxes, "frozen", pb::Phase::Stopped).await;
    assert!(!seen.contains(&pb::Phase::Error), "{runtime:?}: {seen:?}");
    assert_eq!(stopped.generation, ready.generation);
    let refused = lifecycle(&mut sandboxes, "pause", "frozen").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("cannot pause sandbox 'frozen' while it is Stopped"), "{refused:?}");
    let refused = lifecycle(&mut sandboxes, "resume", "frozen").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    // And a paused one deletes, leaving nothing behind.
    lifecycle(&mut sandboxes, "start", "frozen").await.unwrap();
    wait_phase(&mut sandboxes, "frozen", pb::Phase::Ready).await;
    lifecycle(&mut sandboxes, "pause", "frozen").await.unwrap();
    wait_phase(&mut sandboxes, "frozen", pb::Phase::Paused).await;
    clean_up(&target, &data, &mut sandboxes).await;
}

/// DESIGN 12.1: a checkpoint where the runtime can make one (rootful Podman with a working
/// CRIU) holds the run as the freezer does and a resume restores it, in the same generation;
/// everywhere else `pause --checkpoint` is refused, naming the driver and why, and changes
/// nothing. (On the machines Berth is tested on CRIU does not work: see the README.)
async fn a_checkpoint_holds_the_run_where_the_runtime_can_make_one_and_is_refused_elsewhere(runtime: Runtime) {
    let Some(target) = target(runtime, "checkpoint").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(&target, &mut sandboxes, "disk", TICKING).await.id;
    let (ready, _) = wait_phase(&mut sandboxes, "disk", pb::Phase::Ready).await;
    ticking_past(&target, &data, &id, 0).await;
    match lifecycle(&mut sandboxes, "checkpoint", "disk").await {
        Err(refused) => {
            assert_eq!(refused.code(), Code::FailedPrecondition, "{runtime:?}: {refused:?}");
            let why = match runtime {
                Runtime::Process => "the process driver cannot checkpoint here: a run outside a container",
                Runtime::Docker => "the docker driver cannot checkpoint here: Docker's checkpoints are experimental",
                // Rootless, or a `criu check` that fails (as it does here), or no criu at all.
                Runtime::Podman => "the podman driver cannot checkpoint here: ",
            };
            assert!(refused.message().starts_with(why), "{runtime:?}: {refused:?}");
            assert!(
                runtime != Runtime::Podman || refused.message().contains("criu") || refused.message().contains("CRIU")
            );
            let after = get(&mut sandboxes, "disk").await.unwrap();
            assert_eq!(
                (after.intent, after.phase, after.generation, after.checkpoint),
                (pb::Intent::Running as i32, pb::Phase::Ready as i32, ready.generation, false),
                "{runtime:?}: a refused checkpoint changed nothing"
            );
        }
        Ok(accepted) => {
            assert_eq!(runtime, Runtime::Podman, "only Podman checkpoints");
            assert!(accepted.checkpoint);
            let (paused, _) = wait_phase(&mut sandboxes, "disk", pb::Phase::Paused).await;
            let held = ticks(&target, &data, &id);
            tokio::time::sleep(Duration::from_millis(600)).await;
            assert_eq!(ticks(&target, &data, &id), held, "a checkpointed run made progress");
            // A freezer's pause of a checkpointed sandbox is refused: resume it first.
            let other = lifecycle(&mut sandboxes, "pause", "disk").await.unwrap_err();
            assert!(other.message().contains("is paused to a checkpoint already"), "{other:?}");
            lifecycle(&mut sandboxes, "resume", "disk").await.unwrap();
            let (resumed, _) = wait_phase(&mut sandboxes, "disk", pb::Phase::Ready).await;
            assert_eq!((resumed.generation, paused.generation), (ready.generation, ready.generation));
            ticking_past(&target, &data, &id, held).await;
        }
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_paused_run_makes_no_progress_and_resumes_where_it_was() {
                    super::a_paused_run_makes_no_progress_and_resumes_where_it_was(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_checkpoint_holds_the_run_where_the_runtime_can_make_one_and_is_refused_elsewhere() {
                    let runtime = Runtime::$runtime;
                    super::a_checkpoint_holds_the_run_where_the_runtime_can_make_one_and_is_refused_elsewhere(runtime)
                        .await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);
