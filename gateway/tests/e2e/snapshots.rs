//! Snapshots, creates from them and forks on every driver (DESIGN 12.2, 12.3): a sandbox made
//! from a snapshot starts with exactly the files the snapshot copied (and, on Docker and Podman,
//! its source's container filesystem), byte for byte, whatever its source did after; a fork
//! makes all its sandboxes Ready from one point while its source runs on; and an acknowledged
//! delete leaves no copy, image or directory behind.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::Code;

use crate::conformance::{Runtime, Target, clean_up, create_in, target};
use crate::exec::{run, start};
use crate::harness::*;

/// Writes a small file and a larger one in a directory, and in a container a file outside the
/// workspace (the process driver's runs share the host's), then waits. Once: a sandbox made
/// from a snapshot of it runs it again over the files it started with.
fn writer(runtime: Runtime) -> [&'static str; 3] {
    let script = match runtime {
        Runtime::Process => {
            "[ -f written ] || { echo one > a.txt; mkdir -p d; i=0; \
             while [ $i -lt 4096 ]; do echo line-$i-0123456 >> d/big; i=$((i + 1)); done; echo done > written; }; \
             sleep 3600"
        }
        _ => {
            "[ -f written ] || { echo one > a.txt; mkdir -p d; i=0; \
             while [ $i -lt 4096 ]; do echo line-$i-0123456 >> d/big; i=$((i + 1)); done; \
             echo layer > /tmp/berth-layer; echo done > written; }; sleep 3600"
        }
    };
    ["sh", "-c", script]
}

async fn get(sandboxes: &mut Sandboxes, name: &str) -> pb::Sandbox {
    sandboxes.get_sandbox(pb::GetSandboxRequest { name: name.into() }).await.unwrap().into_inner().sandbox.unwrap()
}

async fn snapshot(snapshots: &mut Snapshots, name: &str, from: &str) -> Result<pb::Snapshot, tonic::Status> {
    let request = pb::CreateSnapshotRequest { name: name.into(), sandbox: from.into(), no_wait: false };
    Ok(snapshots.create_snapshot(request).await?.into_inner().snapshot.unwrap())
}

async fn from_snapshot(sandboxes: &mut Sandboxes, name: &str, snapshot: &str) -> Result<pb::Sandbox, tonic::Status> {
    let spec = pb::SandboxSpec { labels: BTreeMap::from([("made".into(), "from-s1".into())]), ..Default::default() };
    let request = pb::CreateSandboxRequest {
        name: name.into(),
        spec: Some(spec),
        providers: vec![],
        expected_resource_version: None,
        deadline_unix_ms: None,
        from_snapshot: snapshot.into(),
    };
    Ok(sandboxes.create_sandbox(request).await?.into_inner().sandbox.unwrap())
}

/// The same bytes, said without printing them.
fn same(got: &[u8], want: &[u8], what: &str) {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got == want,
        "{what}: not byte for byte: {} bytes against {}, first difference at {first:?}",
        got.len(),
        want.len()
    );
}

async fn cat(execs: &mut Execs, name: &str, path: &str) -> Vec<u8> {
    run(execs, start(name, &["cat", path])).await.stdout
}

/// Waits until sandbox `name` is Ready; fails with what the gateway warned of if it is not.
async fn until_ready(sandboxes: &mut Sandboxes, data: &DataDir, name: &str) {
    for _ in 0..600 {
        if get(sandboxes, name).await.phase == pb::Phase::Ready as i32 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = data.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    panic!(
        "{name} is not Ready after 30 s: {:?}; the gateway warned:\n{}",
        get(sandboxes, name).await,
        warnings.join("\n")
    );
}

async fn snapshot_gone(snapshots: &mut Snapshots, name: &str) {
    for _ in 0..600 {
        match snapshots.get_snapshot(pb::GetSnapshotRequest { name: name.into() }).await {
            Err(s) if s.code() == Code::NotFound => return,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("snapshot '{name}' is still there after 30 s");
}

/// A gateway on `runtime` with sandbox `src` Ready, its files written: what each test starts from.
struct Source {
    target: Target,
    data: DataDir,
    _gateway: Gateway,
    sandboxes: Sandboxes,
    snapshots: Snapshots,
    execs: Execs,
    source: pb::Sandbox,
    ready: pb::Sandbox,
    /// The larger file it wrote.
    big: Vec<u8>,
}

async fn source(runtime: Runtime, test: &str) -> Option<Source> {
    let target = target(runtime, test).await?;
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let snapshots = gateway.snapshots().await;
    let mut execs = gateway.execs().await;
    let source = create_in(&target, &mut sandboxes, "src", &writer(runtime)).await;
    let (ready, _) = wait_phase(&mut sandboxes, "src", pb::Phase::Ready).await;
    target.wait_workspace_file(&data, &source.id, "written", "done").await;
    let big = cat(&mut execs, "src", "d/big").await;
    assert!(big.len() > 60_000, "{runtime:?}: {} bytes", big.len());
    Some(Source { target, data, _gateway: gateway, sandboxes, snapshots, execs, source, ready, big })
}

async fn files_copied_are_the_files_a_new_sandbox_starts_with(runtime: Runtime) {
    let Some(Source { target, data, _gateway, mut sandboxes, mut snapshots, mut execs, source, ready, big }) =
        source(runtime, "snapshots").await
    else {
        return;
    };
    let identity = target.run_identity(&data, &source.id);

    let s1 = snapshot(&mut snapshots, "s1", "src").await.unwrap();
    assert_eq!(s1.phase, pb::SnapshotPhase::Ready as i32, "{runtime:?}: {s1:?}");
    assert_eq!((s1.source.as_str(), s1.source_generation), ("src", ready.generation));
    assert!(s1.size_bytes > big.len() as u64, "{s1:?}");
    assert_eq!(s1.sha256.len(), 64, "{s1:?}");
    assert_eq!(s1.image.is_empty(), runtime == Runtime::Process, "{s1:?}");
    // Frozen only for the copy: the source runs on, the same run. A report that met the copy's
    // freeze may show it Paused for a moment (README, "the copy's freeze"): it is Ready again.
    let (after, _) = wait_phase(&mut sandboxes, "src", pb::Phase::Ready).await;
    assert_eq!((after.phase, after.generation), (pb::Phase::Ready as i32, ready.generation), "{runtime:?}");
    assert_eq!(target.run_identity(&data, &source.id), identity, "{runtime:?}: the source restarted");

    // What the source does afterwards is not in the snapshot.
    let change = match runtime {
        Runtime::Process => "echo two > a.txt; rm -r d",
        _ => "echo two > a.txt; rm -r d; echo changed > /tmp/berth-layer",
    };
    run(&mut execs, start("src", &["sh", "-c", change])).await;
    let copy = from_snapshot(&mut sandboxes, "copy", "s1").await.unwrap();
    assert_eq!(copy.from_snapshot, "s1");
    let labels = copy.spec.clone().unwrap().labels;
    assert_eq!((labels.get("berth.snapshot"), labels.get("made")), (Some(&"s1".into()), Some(&"from-s1".into())));
    assert_eq!(copy.generation, 1);
    wait_phase(&mut sandboxes, "copy", pb::Phase::Ready).await;
    assert_eq!(cat(&mut execs, "copy", "a.txt").await, b"one\n", "{runtime:?}");
    same(&cat(&mut execs, "copy", "d/big").await, &big, &format!("{runtime:?}: copy"));
    if runtime != Runtime::Process {
        // The container's own filesystem came with the image committed of it.
        assert_eq!(cat(&mut execs, "copy", "/tmp/berth-layer").await, b"layer\n", "{runtime:?}");
    }
    // A start of the copy afresh keeps what its run wrote: it is seeded once.
    run(&mut execs, start("copy", &["sh", "-c", "echo mine > a.txt"])).await;
    lifecycle(&mut sandboxes, "stop", "copy").await.unwrap();
    wait_phase(&mut sandboxes, "copy", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "copy").await.unwrap();
    wait_phase(&mut sandboxes, "copy", pb::Phase::Ready).await;
    assert_eq!(cat(&mut execs, "copy", "a.txt").await, b"mine\n", "{runtime:?}");
    let listed = snapshots.get_snapshot(pb::GetSnapshotRequest { name: "s1".into() }).await.unwrap().into_inner();
    assert_eq!(listed.snapshot.unwrap().users, vec!["copy".to_string()]);

    // Paused and Stopped sandboxes are copied as they are.
    lifecycle(&mut sandboxes, "pause", "src").await.unwrap();
    wait_phase(&mut sandboxes, "src", pb::Phase::Paused).await;
    let paused = snapshot(&mut snapshots, "s-paused", "src").await.unwrap();
    assert_eq!(paused.phase, pb::SnapshotPhase::Ready as i32, "{runtime:?}: {paused:?}");
    let still = get(&mut sandboxes, "src").await;
    assert_eq!(still.phase, pb::Phase::Paused as i32, "{runtime:?}: a copy of a paused sandbox thawed it");
    lifecycle(&mut sandboxes, "stop", "src").await.unwrap();
    wait_phase(&mut sandboxes, "src", pb::Phase::Stopped).await;
    let stopped = snapshot(&mut snapshots, "s-stopped", "src").await.unwrap();
    assert_eq!(stopped.sha256, paused.sha256, "{runtime:?}: the same files sum the same");

    // Bad input, each with its code and field.
    let refused = snapshot(&mut snapshots, "s1", "src").await.unwrap_err();
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    let refused = snapshot(&mut snapshots, "s9", "nobody").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let refused = snapshot(&mut snapshots, "Bad Name", "src").await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("name"), "{refused:?}");
    let refused = from_snapshot(&mut sandboxes, "copy2", "missing").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let request = pb::CreateSandboxRequest {
        name: "copy3".into(),
        spec: Some(pb::SandboxSpec { image: "other".into(), ..Default::default() }),
        from_snapshot: "s1".into(),
        ..Default::default()
    };
    let refused = sandboxes.create_sandbox(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // Deletes: acknowledged, then complete.
    for name in ["s1", "s-paused", "s-stopped"] {
        let deleting = snapshots
            .delete_snapshot(pb::DeleteSnapshotRequest { name: name.into(), expected_resource_version: None })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(deleting.snapshot.unwrap().phase, pb::SnapshotPhase::Deleting as i32);
        snapshot_gone(&mut snapshots, name).await;
    }
    // The copy lives on without its snapshot, even through a restart.
    lifecycle(&mut sandboxes, "stop", "copy").await.unwrap();
    wait_phase(&mut sandboxes, "copy", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "copy").await.unwrap();
    wait_phase(&mut sandboxes, "copy", pb::Phase::Ready).await;
    assert_eq!(cat(&mut execs, "copy", "a.txt").await, b"mine\n", "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn a_fork_makes_every_sandbox_from_one_point(runtime: Runtime) {
    let Some(Source { target, data, _gateway, mut sandboxes, mut snapshots, mut execs, ready, big, .. }) =
        source(runtime, "forks").await
    else {
        return;
    };

    let request = pb::ForkSandboxRequest {
        name: "src".into(),
        count: 3,
        names: vec![],
        labels: BTreeMap::from([("run".into(), "7".into())]),
    };
    let forked = snapshots.fork_sandbox(request).await.unwrap().into_inner();
    let names: Vec<&str> = forked.sandboxes.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["src-1", "src-2", "src-3"], "{runtime:?}");
    let mut ids = std::collections::BTreeSet::new();
    for fork in &forked.sandboxes {
        assert!(ids.insert(fork.id.clone()), "two forks share an id");
        let labels = fork.spec.clone().unwrap().labels;
        assert_eq!(labels.get("berth.fork-of"), Some(&"src".to_string()));
        assert_eq!(labels.get("run"), Some(&"7".to_string()));
        until_ready(&mut sandboxes, &data, &fork.name).await;
        same(&cat(&mut execs, &fork.name, "d/big").await, &big, &format!("{runtime:?}: {}", fork.name));
    }
    // The source runs on, the same generation.
    let after = get(&mut sandboxes, "src").await;
    assert_eq!((after.phase, after.generation), (pb::Phase::Ready as i32, ready.generation));
    // A second fork numbers on; names given are used; a taken one refuses the whole fork.
    let request = pb::ForkSandboxRequest { name: "src".into(), count: 1, names: vec![], labels: BTreeMap::new() };
    let next = snapshots.fork_sandbox(request).await.unwrap().into_inner();
    assert_eq!(next.sandboxes[0].name, "src-4");
    let request = pb::ForkSandboxRequest {
        name: "src".into(),
        count: 2,
        names: vec!["alpha".into(), "src-1".into()],
        labels: BTreeMap::new(),
    };
    let refused = snapshots.fork_sandbox(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    assert!(sandboxes.get_sandbox(pb::GetSandboxRequest { name: "alpha".into() }).await.is_err(), "all or nothing");
    let request = pb::ForkSandboxRequest { name: "src".into(), count: 101, names: vec![], labels: BTreeMap::new() };
    let refused = snapshots.fork_sandbox(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // Each fork's snapshot goes by itself once its forks have their files.
    let mut left = Vec::new();
    for _ in 0..400 {
        left = snapshots.list_snapshots(pb::ListSnapshotsRequest::default()).await.unwrap().into_inner().snapshots;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(left.is_empty(), "{runtime:?}: a fork's snapshot outlived its use: {left:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn files_copied_are_the_files_a_new_sandbox_starts_with() {
                    super::files_copied_are_the_files_a_new_sandbox_starts_with(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_fork_makes_every_sandbox_from_one_point() {
                    super::a_fork_makes_every_sandbox_from_one_point(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);
