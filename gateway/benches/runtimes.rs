//! Start-to-Ready through the gateway beside the runtime's own start of the same container,
//! median of 20, and execs through Berth beside the runtime's own `exec` of the same container:
//! `true`'s round trip (p50, p99 of 100), one exec streaming 1 GiB, and 64 at once; then a
//! warm pool's claims beside create-to-Ready (p50, p99 of 20); pause and resume to Paused and
//! Ready beside the runtime's own `pause` and `unpause` (p50, p99 of 20); a snapshot of a
//! Ready sandbox with 100 MiB in its workspace (p50, p99 of 20), a fork of 10 to all Ready
//! (median of 3), and a create from that snapshot to Ready beside a plain create (p50, p99 of
//! 20); for Docker and Podman.
//! Needs the daemons and a static supervisor, named as the
//! tests name them (`BERTH_TEST_DOCKER_SOCKET`, `BERTH_TEST_PODMAN_SOCKET`,
//! `BERTH_TEST_STATIC_SUPERVISOR`; `ci/bench` sets them up). Asserts nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{Engine, Status, container_name, image};
use berth_gateway::config::DriverKind;
use berth_proto::v1 as pb;

mod support;
use support::{engine_name, wait_phase};

const IMAGE: &str = "berth-bench/sandbox:1";
const RUNS: usize = 20;

/// `cargo bench` passes `--bench`; `cargo test --benches` does not, and runs this as a smoke so
/// it cannot rot: a few runs, not twenty.
fn runs() -> usize {
    if std::env::args().any(|a| a == "--bench") { RUNS } else { 3 }
}

fn median(samples: Vec<Duration>) -> Duration {
    quantile(samples, 50)
}

/// The `percent`th percentile, nearest rank.
fn quantile(mut samples: Vec<Duration>, percent: usize) -> Duration {
    samples.sort();
    samples[(samples.len() * percent / 100).min(samples.len() - 1)]
}

/// How many exec round trips, how many bytes streamed, how many execs at once.
fn exec_sizes() -> (usize, u64, usize) {
    if std::env::args().any(|a| a == "--bench") { (100, 1 << 30, 64) } else { (3, 16 << 20, 8) }
}

/// Runs `argv` in the sandbox through Berth; how many bytes of output it streamed.
async fn exec(execs: &mut support::Execs, argv: &[&str]) -> u64 {
    use pb::exec_output::Output;
    let start = pb::ExecStart {
        sandbox: "bench".into(),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    let first = pb::ExecInput { input: Some(pb::exec_input::Input::Start(start)) };
    let mut stream = execs.exec(tokio_stream::iter([first])).await.unwrap().into_inner();
    let mut bytes = 0;
    while let Some(message) = stream.message().await.unwrap() {
        match message.output {
            Some(Output::Chunk(chunk)) => bytes += chunk.data.len() as u64,
            Some(Output::End(end)) => {
                assert_eq!(end.exit_code, Some(0), "{argv:?} ended {end:?}");
                return bytes;
            }
            _ => {}
        }
    }
    panic!("the exec's stream closed before its end");
}

/// The runtime's own CLI, `exec` in `container`; how many bytes it printed.
async fn runtime_exec(kind: DriverKind, socket: &str, container: &str, argv: &[&str]) -> u64 {
    let (program, flag) = if kind == DriverKind::Docker { ("docker", "-H") } else { ("podman", "--url") };
    let mut child = tokio::process::Command::new(program)
        .args([flag, &format!("unix://{socket}"), "exec", container])
        .args(argv)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let bytes = tokio::io::copy(&mut child.stdout.take().unwrap(), &mut tokio::io::sink()).await.unwrap();
    assert!(child.wait().await.unwrap().success(), "{program} exec {argv:?}");
    bytes
}

/// Exec figures through Berth and through the runtime alone, in the sandbox `bench` of `client`.
async fn measure_execs(kind: DriverKind, socket: &str, gateway: &mut support::Gateway, container: &str) {
    let (round_trips, stream_bytes, at_once) = exec_sizes();
    let name = engine_name(kind);
    let mut berth = Vec::new();
    let mut alone = Vec::new();
    for _ in 0..round_trips {
        let started = Instant::now();
        exec(&mut gateway.execs, &["true"]).await;
        berth.push(started.elapsed());
        let started = Instant::now();
        runtime_exec(kind, socket, container, &["true"]).await;
        alone.push(started.elapsed());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (who, samples) in [("Berth", berth), (name, alone)] {
        let (p50, p99) = (quantile(samples.clone(), 50), quantile(samples, 99));
        println!("{name:<8} exec true, {who:<7} p50 {p50:>10?}  p99 {p99:>10?}");
        let who = if who == "Berth" { format!("through Berth, {name}") } else { format!("{name} exec alone") };
        println!("figure: exec true round trip p50 {who} = {:.3} ms", ms(p50));
        println!("figure: exec true round trip p99 {who} = {:.3} ms", ms(p99));
    }
    let head = ["head", "-c", &stream_bytes.to_string(), "/dev/zero"];
    let started = Instant::now();
    assert_eq!(exec(&mut gateway.execs, &head).await, stream_bytes);
    let berth = stream_bytes as f64 / started.elapsed().as_secs_f64() / 1e6;
    let started = Instant::now();
    assert_eq!(runtime_exec(kind, socket, container, &head).await, stream_bytes);
    let alone = stream_bytes as f64 / started.elapsed().as_secs_f64() / 1e6;
    println!(
        "{name:<8} one exec streaming {} MiB: Berth {berth:.0} MB/s, {name} exec {alone:.0} MB/s",
        stream_bytes >> 20
    );
    println!("figure: exec output throughput through Berth, {name} = {berth:.1} MB/s");
    println!("figure: exec output throughput {name} exec alone = {alone:.1} MB/s");
    let started = Instant::now();
    let runs: Vec<_> = (0..at_once)
        .map(|_| {
            let mut execs = gateway.execs.clone();
            tokio::spawn(async move { exec(&mut execs, &["true"]).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap();
    }
    let berth = started.elapsed();
    let started = Instant::now();
    let runs: Vec<_> = (0..at_once)
        .map(|_| {
            let (socket, container) = (socket.to_string(), container.to_string());
            tokio::spawn(async move { runtime_exec(kind, &socket, &container, &["true"]).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap();
    }
    let alone = started.elapsed();
    println!("{name:<8} {at_once} execs at once: Berth {berth:?}, {name} exec {alone:?}");
    println!("figure: {at_once} concurrent exec true through Berth, {name} = {:.3} ms", ms(berth));
    println!("figure: {at_once} concurrent exec true, {name} exec alone = {:.3} ms", ms(alone));
}

/// The runtime's own CLI, `verb` (pause, unpause) of `container`.
async fn runtime_verb(kind: DriverKind, socket: &str, container: &str, verb: &str) {
    let (program, flag) = if kind == DriverKind::Docker { ("docker", "-H") } else { ("podman", "--url") };
    let status = tokio::process::Command::new(program)
        .args([flag, &format!("unix://{socket}"), verb, container])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success(), "{program} {verb} {container}");
}

/// A pause to Paused and a resume to Ready through Berth, each from the call to the phase as a
/// client waiting on it sees it, in the Ready sandbox `bench`.
async fn measure_pauses(gateway: &mut support::Gateway) -> (Vec<Duration>, Vec<Duration>) {
    let client = &mut gateway.sandboxes;
    let lifecycle = || pb::LifecycleRequest { name: "bench".into(), expected_resource_version: None };
    let (mut pauses, mut resumes) = (vec![], vec![]);
    for _ in 0..runs() {
        let started = Instant::now();
        let pause = pb::PauseRequest { name: "bench".into(), ..Default::default() };
        client.pause_sandbox(pause).await.unwrap();
        wait_phase(client, "bench", pb::Phase::Paused).await;
        pauses.push(started.elapsed());
        let started = Instant::now();
        client.resume_sandbox(lifecycle()).await.unwrap();
        wait_phase(client, "bench", pb::Phase::Ready).await;
        resumes.push(started.elapsed());
    }
    (pauses, resumes)
}

/// Berth's pauses and resumes beside the runtime's own `pause` and `unpause`.
fn print_pauses(kind: DriverKind, berth: (Vec<Duration>, Vec<Duration>), alone: (Vec<Duration>, Vec<Duration>)) {
    let name = engine_name(kind);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (what, berth, alone, verb) in [("pause", berth.0, alone.0, "pause"), ("resume", berth.1, alone.1, "unpause")] {
        let (b50, b99) = (quantile(berth.clone(), 50), quantile(berth, 99));
        let (a50, a99) = (quantile(alone.clone(), 50), quantile(alone, 99));
        println!("{name:<8} {what}: Berth p50 {b50:?} p99 {b99:?}; {name} {verb} p50 {a50:?} p99 {a99:?}");
        println!("figure: {what} p50 through Berth, {name} = {:.3} ms", ms(b50));
        println!("figure: {what} p99 through Berth, {name} = {:.3} ms", ms(b99));
        println!("figure: {name} {verb} alone p50 = {:.3} ms", ms(a50));
        println!("figure: {name} {verb} alone p99 = {:.3} ms", ms(a99));
    }
}

/// A snapshot of `bench` once 100 MiB are in its workspace, a fork of it 10 ways until all are
/// Ready, and a create from the snapshot beside a plain create, each to Ready.
async fn measure_snapshots(kind: DriverKind, gateway: &mut support::Gateway) {
    let (mib, forks, fork_runs) = if std::env::args().any(|a| a == "--bench") { (100, 10, 3) } else { (4, 2, 1) };
    exec(&mut gateway.execs, &["sh", "-c", &format!("head -c {} /dev/zero > big", mib << 20)]).await;
    let mut snapshots = Vec::new();
    let mut size = 0;
    for i in 0..runs() {
        let started = Instant::now();
        let request = pb::CreateSnapshotRequest { name: format!("s{i}"), sandbox: "bench".into(), no_wait: false };
        let snapshot = gateway.snapshots.create_snapshot(request).await.unwrap().into_inner().snapshot.unwrap();
        snapshots.push(started.elapsed());
        size = snapshot.size_bytes;
    }
    let mut forked = Vec::new();
    for round in 0..fork_runs {
        let names: Vec<String> = (0..forks).map(|i| format!("fork{round}-{i}")).collect();
        let started = Instant::now();
        let request = pb::ForkSandboxRequest {
            name: "bench".into(),
            count: forks,
            names: names.clone(),
            labels: Default::default(),
        };
        gateway.snapshots.fork_sandbox(request).await.unwrap();
        for name in &names {
            wait_phase(&mut gateway.sandboxes, name, pb::Phase::Ready).await;
        }
        forked.push(started.elapsed());
        for name in names {
            gateway
                .sandboxes
                .delete_sandbox(pb::LifecycleRequest { name, expected_resource_version: None })
                .await
                .unwrap();
        }
    }
    let spec =
        || pb::SandboxSpec { image: IMAGE.into(), command: vec!["sleep".into(), "3600".into()], ..Default::default() };
    let (mut from_snapshot, mut plain) = (Vec::new(), Vec::new());
    for i in 0..runs() {
        for (made, from) in [(&mut from_snapshot, "s0"), (&mut plain, "")] {
            let name = format!("made{i}{}", if from.is_empty() { "p" } else { "s" });
            let request = pb::CreateSandboxRequest {
                name: name.clone(),
                spec: Some(if from.is_empty() { spec() } else { pb::SandboxSpec::default() }),
                from_snapshot: from.into(),
                ..Default::default()
            };
            let started = Instant::now();
            gateway.sandboxes.create_sandbox(request).await.unwrap();
            wait_phase(&mut gateway.sandboxes, &name, pb::Phase::Ready).await;
            made.push(started.elapsed());
            gateway
                .sandboxes
                .delete_sandbox(pb::LifecycleRequest { name, expected_resource_version: None })
                .await
                .unwrap();
        }
    }
    for i in 0..runs() {
        let request = pb::DeleteSnapshotRequest { name: format!("s{i}"), expected_resource_version: None };
        // Refused while a sandbox made from it is still being deleted: asked again.
        while gateway.snapshots.delete_snapshot(request.clone()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    exec(&mut gateway.execs, &["rm", "big"]).await;
    let name = engine_name(kind);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (s50, s99) = (quantile(snapshots.clone(), 50), quantile(snapshots, 99));
    println!("{name:<8} snapshot of {mib} MiB ({size} bytes kept): p50 {s50:?} p99 {s99:?}");
    println!("figure: snapshot of a {mib} MiB workspace p50, {name} = {:.3} ms", ms(s50));
    println!("figure: snapshot of a {mib} MiB workspace p99, {name} = {:.3} ms", ms(s99));
    let fork = median(forked);
    println!("{name:<8} fork of {forks} to all Ready: median {fork:?} (goal on Docker: under 2 s)");
    println!("figure: fork of {forks} to all Ready, {name} = {:.3} ms", ms(fork));
    for (what, samples) in [("create from a snapshot", from_snapshot), ("plain create", plain)] {
        let (p50, p99) = (quantile(samples.clone(), 50), quantile(samples, 99));
        println!("{name:<8} {what} to Ready: p50 {p50:?} p99 {p99:?}");
        println!("figure: {what} to Ready p50, {name} = {:.3} ms", ms(p50));
        println!("figure: {what} to Ready p99, {name} = {:.3} ms", ms(p99));
    }
}

/// A warm pool's claims (each with the pool full again first) beside create-to-Ready, both
/// through the gateway on this runtime (SQLite).
async fn measure_claims(kind: DriverKind, gateway: &mut support::Gateway) {
    const SIZE: u32 = 4;
    let spec =
        || pb::SandboxSpec { image: IMAGE.into(), command: vec!["sleep".into(), "3600".into()], ..Default::default() };
    let templates = &mut gateway.templates;
    let request =
        pb::CreateTemplateRequest { name: "bench".into(), spec: Some(spec()), min_ready: SIZE, ..Default::default() };
    templates.create_template(request).await.unwrap();
    let full = |templates: &mut support::Templates| {
        let mut templates = templates.clone();
        async move {
            loop {
                let t = templates.get_template(pb::GetTemplateRequest { name: "bench".into() }).await.unwrap();
                let pool = t.into_inner().template.unwrap().pool.unwrap();
                if pool.ready == SIZE && pool.members == SIZE {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let mut claims = Vec::new();
    let mut claimed = Vec::new();
    for _ in 0..runs() {
        full(templates).await;
        let started = Instant::now();
        let request = pb::ClaimSandboxRequest { template: "bench".into(), ..Default::default() };
        let s = templates.claim_sandbox(request).await.unwrap().into_inner().sandbox.unwrap();
        claims.push(started.elapsed());
        claimed.push(s.name);
    }
    let request = pb::SetPoolRequest { template: "bench".into(), min_ready: 0, expected_resource_version: None };
    templates.set_pool(request).await.unwrap();
    let client = &mut gateway.sandboxes;
    let mut creates = Vec::new();
    for i in 0..runs() {
        let name = format!("cold{i}");
        let started = Instant::now();
        let request = pb::CreateSandboxRequest { name: name.clone(), spec: Some(spec()), ..Default::default() };
        client.create_sandbox(request).await.unwrap();
        wait_phase(client, &name, pb::Phase::Ready).await;
        creates.push(started.elapsed());
        claimed.push(name);
    }
    for name in claimed {
        client.delete_sandbox(pb::LifecycleRequest { name, expected_resource_version: None }).await.unwrap();
    }
    let delete = pb::DeleteTemplateRequest { name: "bench".into(), expected_resource_version: None };
    gateway.templates.delete_template(delete).await.unwrap();
    let name = engine_name(kind);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (claim50, claim99) = (quantile(claims.clone(), 50), quantile(claims, 99));
    let (create50, create99) = (quantile(creates.clone(), 50), quantile(creates, 99));
    println!(
        "{name:<8} claim from a warm pool p50 {claim50:?} p99 {claim99:?}; create-to-Ready p50 {create50:?} p99 {create99:?}"
    );
    println!("figure: claim from a warm pool p50, {name} = {:.3} ms", ms(claim50));
    println!("figure: claim from a warm pool p99, {name} = {:.3} ms", ms(claim99));
    println!("figure: create-to-Ready p50, {name} = {:.3} ms", ms(create50));
    println!("figure: create-to-Ready p99, {name} = {:.3} ms", ms(create99));
}

/// Median Start-to-Ready through a gateway, then the runtime's own start of that container.
async fn measure(kind: DriverKind, socket: &str, engine: &dyn Engine, supervisor: &Path) -> (Duration, Duration) {
    let mut gateway = support::gateway(kind, socket, engine.owner(), supervisor).await;
    let client = &mut gateway.sandboxes;
    let spec =
        pb::SandboxSpec { image: IMAGE.into(), command: vec!["sleep".into(), "3600".into()], ..Default::default() };
    let created = client
        .create_sandbox(pb::CreateSandboxRequest { name: "bench".into(), spec: Some(spec), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    wait_phase(client, "bench", pb::Phase::Ready).await;
    let container = container_name(&berth_core::SandboxId::new(&created.id));
    measure_execs(kind, socket, &mut gateway, &container).await;
    let berth_pauses = measure_pauses(&mut gateway).await;
    measure_claims(kind, &mut gateway).await;
    measure_snapshots(kind, &mut gateway).await;
    let client = &mut gateway.sandboxes;
    let lifecycle = || pb::LifecycleRequest { name: "bench".into(), expected_resource_version: None };
    let mut through_gateway = Vec::new();
    for _ in 0..runs() {
        client.stop_sandbox(lifecycle()).await.unwrap();
        wait_phase(client, "bench", pb::Phase::Stopped).await;
        let started = Instant::now();
        client.start_sandbox(lifecycle()).await.unwrap();
        wait_phase(client, "bench", pb::Phase::Ready).await;
        through_gateway.push(started.elapsed());
    }
    client.stop_sandbox(lifecycle()).await.unwrap();
    wait_phase(client, "bench", pb::Phase::Stopped).await;
    // The same container, started by the runtime alone, with no gateway watching it.
    gateway.stop_serving();
    let mut by_runtime = Vec::new();
    let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
    for _ in 0..runs() {
        let started = Instant::now();
        engine.start(&container).await.unwrap();
        while engine.inspect(&container).await.unwrap().is_none_or(|i| i.status != Status::Running) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        by_runtime.push(started.elapsed());
        // And its own pause and unpause of the running container, as a user's CLI makes them.
        let started = Instant::now();
        runtime_verb(kind, socket, &container, "pause").await;
        pauses.push(started.elapsed());
        let started = Instant::now();
        runtime_verb(kind, socket, &container, "unpause").await;
        resumes.push(started.elapsed());
        engine.stop(&container, Duration::from_secs(5)).await.unwrap();
    }
    print_pauses(kind, berth_pauses, (pauses, resumes));
    let id = berth_core::SandboxId::new(container.trim_start_matches("berth-"));
    engine.remove(&container).await.unwrap();
    engine.remove_volume(&berth_drivers::container::volume_name(&id)).await.unwrap();
    (median(through_gateway), median(by_runtime))
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(supervisor) = std::env::var_os("BERTH_TEST_STATIC_SUPERVISOR").map(PathBuf::from) else {
        println!("start-to-ready: skipped (set BERTH_TEST_STATIC_SUPERVISOR and the runtime sockets; ci/bench does)");
        return;
    };
    println!("Through Berth beside the runtime alone: execs, then Start-to-Ready (median of {})", runs());
    for (variable, kind) in
        [("BERTH_TEST_DOCKER_SOCKET", DriverKind::Docker), ("BERTH_TEST_PODMAN_SOCKET", DriverKind::Podman)]
    {
        let Ok(socket) = std::env::var(variable) else {
            println!("{kind:?}: skipped ({variable} is not set)");
            continue;
        };
        let (berth, alone) = runtime.block_on(async {
            let owner = format!("bench-{}", std::process::id());
            let engine: Box<dyn Engine> = match kind {
                DriverKind::Docker => Box::new(DockerEngine::connect(&socket, &owner).await.unwrap()),
                _ => Box::new(PodmanEngine::connect(&socket, &owner).await.unwrap()),
            };
            let rootfs = image::rootfs(Path::new(image::BUSYBOX), &supervisor).unwrap();
            engine.import_image(IMAGE, rootfs).await.unwrap();
            measure(kind, &socket, engine.as_ref(), &supervisor).await
        });
        let name = engine_name(kind);
        let overhead = berth.saturating_sub(alone);
        println!("{name:<8} Start-to-Ready: Berth {berth:?}, {name} start {alone:?}, overhead {overhead:?}");
        println!("figure: Start-to-Ready through Berth, {name} = {:.3} ms", berth.as_secs_f64() * 1e3);
        println!("figure: {name} start alone = {:.3} ms", alone.as_secs_f64() * 1e3);
    }
}
