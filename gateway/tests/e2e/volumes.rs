//! Volumes on every driver (DESIGN 13.2): two sandboxes share a volume's files; its delete is
//! refused while they use it, naming them, and taken at once after their deletes; deletes of a
//! sandbox and then its volume, one right after the other, are never refused and leave nothing
//! behind.

use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::Code;

use crate::conformance::{Runtime, Target, clean_up, image_for, target, target_alone};
use crate::exec::{run, start};
use crate::harness::*;

/// Where a run finds the volume it mounts at `path`: there in a container; the process
/// driver's runs share the host's filesystem and find a link under `$BERTH_MOUNTS`.
fn seen_at(runtime: Runtime, path: &str) -> String {
    match runtime {
        Runtime::Process => format!("\"$BERTH_MOUNTS{path}\""),
        _ => path.to_string(),
    }
}

fn mount(volume: &str, path: &str, read_only: bool) -> pb::VolumeMount {
    pb::VolumeMount { volume: volume.into(), path: path.into(), read_only }
}

async fn create(
    target: &Target,
    sandboxes: &mut Sandboxes,
    name: &str,
    script: &str,
    volumes: Vec<pb::VolumeMount>,
) -> Result<pb::Sandbox, tonic::Status> {
    let spec = pb::SandboxSpec { image: image_for(target).into(), volumes, ..spec(&["sh", "-c", script]) };
    let request = pb::CreateSandboxRequest { name: name.into(), spec: Some(spec), ..Default::default() };
    Ok(sandboxes.create_sandbox(request).await?.into_inner().sandbox.unwrap())
}

async fn make(volumes: &mut VolumesService, name: &str) -> Result<pb::Volume, tonic::Status> {
    Ok(volumes.create_volume(pb::CreateVolumeRequest { name: name.into() }).await?.into_inner().volume.unwrap())
}

async fn delete(volumes: &mut VolumesService, name: &str) -> Result<pb::Volume, tonic::Status> {
    let request = pb::DeleteVolumeRequest { name: name.into(), expected_resource_version: None };
    Ok(volumes.delete_volume(request).await?.into_inner().volume.unwrap())
}

async fn volume_gone(volumes: &mut VolumesService, name: &str) {
    for _ in 0..600 {
        match volumes.get_volume(pb::GetVolumeRequest { name: name.into() }).await {
            Err(s) if s.code() == Code::NotFound => return,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("volume '{name}' is still there after 30 s");
}

async fn sh(execs: &mut Execs, sandbox: &str, script: &str) -> (Vec<u8>, Option<i32>) {
    let read = run(execs, start(sandbox, &["sh", "-c", script])).await;
    (read.stdout.clone(), read.exit_code())
}

async fn two_sandboxes_share_a_volume_that_outlives_them(runtime: Runtime) {
    let Some(target) = target(runtime, "volumes").await else { return };
    let data = DataDir::new();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gateway = target.gateway(&data, &["--metrics-listen", &format!("127.0.0.1:{metrics}")]).await;
    let (mut sandboxes, mut volumes, mut execs) =
        (gateway.sandboxes().await, gateway.volumes().await, gateway.execs().await);

    let made = make(&mut volumes, "data").await.unwrap();
    assert_eq!((made.phase, made.resource_version), (pb::VolumePhase::Ready as i32, 1), "{made:?}");
    assert_eq!(make(&mut volumes, "data").await.unwrap_err().code(), Code::AlreadyExists);
    let at = seen_at(runtime, "/data");
    let writer = format!("echo hello > {at}/shared; exec sleep 3600");
    let a = create(&target, &mut sandboxes, "a", &writer, vec![mount("data", "/data", false)]).await.unwrap();
    let label = a.spec.clone().unwrap().labels.get("berth.volume.data").cloned();
    assert_eq!(label.as_deref(), Some(made.id.as_str()), "the create binds the sandbox to the volume's id");
    create(&target, &mut sandboxes, "b", "exec sleep 3600", vec![mount("data", "/srv/data", true)]).await.unwrap();
    wait_phase(&mut sandboxes, "a", pb::Phase::Ready).await;
    wait_phase(&mut sandboxes, "b", pb::Phase::Ready).await;

    // What one writes the other reads, through its own path.
    let seen_b = seen_at(runtime, "/srv/data");
    let mut read = (Vec::new(), None);
    for _ in 0..100 {
        read = sh(&mut execs, "b", &format!("cat {seen_b}/shared")).await;
        if read.0 == b"hello\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read, (b"hello\n".to_vec(), Some(0)), "{runtime:?}");
    // Measured on the runtime at each scrape: the one file's 6 bytes.
    let (_, body) = crate::metrics::scrape(metrics, Some(&format!("Bearer {}", gateway.token))).await;
    assert_eq!(crate::metrics::value(&body, "berth_volume_bytes"), 6.0, "{runtime:?}");
    assert_eq!(crate::metrics::value(&body, "berth_volumes{phase=\"Ready\"}"), 1.0, "{runtime:?}");
    assert_eq!(
        sh(&mut execs, "b", &format!("echo from-b >> {seen_b}/log")).await.1 == Some(0),
        runtime == Runtime::Process,
        "{runtime:?}: read-only is enforced in a container, and cannot be on the process driver"
    );
    // A volume is not in the workspace: a snapshot does not copy it.
    assert_eq!(sh(&mut execs, "a", "ls").await.0, b"", "{runtime:?}");

    // In use: refused, naming the users.
    let refused = delete(&mut volumes, "data").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("a, b"), "{refused:?}");
    let shown = volumes.get_volume(pb::GetVolumeRequest { name: "data".into() }).await.unwrap().into_inner();
    assert_eq!(shown.volume.unwrap().users, ["a", "b"]);

    // The files outlive a sandbox: one made after reads them.
    lifecycle(&mut sandboxes, "delete", "a").await.unwrap();
    wait_gone(&mut sandboxes, "a").await;
    create(&target, &mut sandboxes, "c", "exec sleep 3600", vec![mount("data", "/data", false)]).await.unwrap();
    wait_phase(&mut sandboxes, "c", pb::Phase::Ready).await;
    assert_eq!(sh(&mut execs, "c", &format!("cat {at}/shared")).await.0, b"hello\n", "{runtime:?}");

    // Bad input, each with its code and field.
    let unknown = create(&target, &mut sandboxes, "d", "true", vec![mount("nope", "/data", false)]).await.unwrap_err();
    assert_eq!(unknown.code(), Code::FailedPrecondition, "{unknown:?}");
    assert!(unknown.message().contains("spec.volumes[0].volume"), "{unknown:?}");
    let bad = create(&target, &mut sandboxes, "d", "true", vec![mount("data", "/workspace", false)]).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("spec.volumes[0].path"), "{bad:?}");
    let bad = make(&mut volumes, "Bad_Name").await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("name"), "{bad:?}");

    // Deleting the users first never blocks the volume's delete after: taken at once, its
    // files removed once their runs are.
    lifecycle(&mut sandboxes, "delete", "b").await.unwrap();
    lifecycle(&mut sandboxes, "delete", "c").await.unwrap();
    let deleting = delete(&mut volumes, "data").await.unwrap();
    assert_eq!(deleting.phase, pb::VolumePhase::Deleting as i32, "{deleting:?}");
    let again = create(&target, &mut sandboxes, "e", "true", vec![mount("data", "/data", false)]).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    volume_gone(&mut volumes, "data").await;
    clean_up(&target, &data, &mut sandboxes).await;
}

/// Rounds of a volume made, mounted by a new sandbox, then the sandbox's delete and the
/// volume's, each sent without waiting for the one before: `BERTH_VOLUME_ROUNDS` of them
/// (1,000 on the process driver, 100 on a container runtime unless it says; `ci/volume-rounds`
/// runs 1,000 on each).
async fn deletes_one_after_the_other_refuse_nothing_and_leak_nothing(runtime: Runtime) {
    let Some(target) = target_alone(runtime, "volume-rounds").await else { return };
    let default = if runtime == Runtime::Process { 1000 } else { 100 };
    let rounds: usize = std::env::var("BERTH_VOLUME_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(default);
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let (mut sandboxes, mut volumes) = (gateway.sandboxes().await, gateway.volumes().await);
    let mut refused = Vec::new();
    for round in 0..rounds {
        let (volume, sandbox) = (format!("v{round}"), format!("s{round}"));
        make(&mut volumes, &volume).await.unwrap();
        create(&target, &mut sandboxes, &sandbox, "exec sleep 3600", vec![mount(&volume, "/data", false)])
            .await
            .unwrap();
        lifecycle(&mut sandboxes, "delete", &sandbox).await.unwrap();
        if let Err(e) = delete(&mut volumes, &volume).await {
            refused.push(format!("{volume}: {e:?}"));
        }
    }
    assert!(
        refused.is_empty(),
        "{runtime:?}: {} of {rounds} refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );
    // The runtime works through every removal asked for. How fast depends on the machine and
    // what else runs, so what fails is a minute in which nothing more went away: a leak.
    const STALL: Duration = Duration::from_secs(60);
    let (mut fewest, mut since) = (usize::MAX, tokio::time::Instant::now());
    loop {
        // A page holds every round's (at most 1,000).
        let all = pb::ListVolumesRequest { page_size: 1000, ..Default::default() };
        let left = volumes.list_volumes(all).await.unwrap().into_inner().volumes;
        let all = pb::ListSandboxesRequest { page_size: 1000, ..Default::default() };
        let users = sandboxes.list_sandboxes(all).await.unwrap().into_inner().sandboxes;
        if left.is_empty() && users.is_empty() {
            break;
        }
        if left.len() + users.len() < fewest {
            (fewest, since) = (left.len() + users.len(), tokio::time::Instant::now());
        }
        if since.elapsed() >= STALL {
            let log = data.log();
            let said: Vec<&str> = log.lines().filter(|l| l.contains("volume")).rev().take(20).collect();
            panic!(
                "{runtime:?}: {} volumes and {} sandboxes still there, none gone in {STALL:?}, first {:?}; the gateway said:\n{}",
                left.len(),
                users.len(),
                left.first(),
                said.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn two_sandboxes_share_a_volume_that_outlives_them() {
                    super::two_sandboxes_share_a_volume_that_outlives_them(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn deletes_one_after_the_other_refuse_nothing_and_leak_nothing() {
                    super::deletes_one_after_the_other_refuse_nothing_and_leak_nothing(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);
