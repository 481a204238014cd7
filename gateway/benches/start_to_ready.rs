//! Start-to-Ready through the gateway beside the runtime's own start of the same container,
//! median of 20, for Docker and Podman. Needs the daemons and a static supervisor, named as the
//! tests name them (`BERTH_TEST_DOCKER_SOCKET`, `BERTH_TEST_PODMAN_SOCKET`,
//! `BERTH_TEST_STATIC_SUPERVISOR`; `ci/bench` sets them up). Asserts nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{Engine, Status, container_name, image};
use berth_gateway::config::{Config, DriverKind, Flags};
use berth_proto::v1 as pb;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use tonic::metadata::MetadataValue;

const IMAGE: &str = "berth-bench/sandbox:1";
const RUNS: usize = 20;

/// `cargo bench` passes `--bench`; `cargo test --benches` does not, and runs this as a smoke so
/// it cannot rot: a few runs, not twenty.
fn runs() -> usize {
    if std::env::args().any(|a| a == "--bench") { RUNS } else { 3 }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn wait_phase(
    client: &mut SandboxesClient<
        tonic::service::interceptor::InterceptedService<tonic::transport::Channel, impl tonic::service::Interceptor>,
    >,
    name: &str,
    target: pb::Phase,
) {
    let mut events = client.watch_sandbox(pb::WatchSandboxRequest { name: name.into() }).await.unwrap().into_inner();
    while let Some(event) = events.message().await.unwrap() {
        if event.sandbox.is_some_and(|s| s.phase == target as i32) {
            return;
        }
    }
}

/// Median Start-to-Ready through a gateway, then the runtime's own start of that container.
async fn measure(kind: DriverKind, socket: &str, engine: &dyn Engine, supervisor: &Path) -> (Duration, Duration) {
    let data = tempfile::tempdir().unwrap();
    let flags = Flags {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(data.path().to_path_buf()),
        driver: Some(kind),
        supervisor_bin: Some(supervisor.to_path_buf()),
        docker_socket: Some(PathBuf::from(socket)),
        podman_socket: Some(PathBuf::from(socket)),
        instance: Some(engine.owner().to_string()),
        log: Some("warn".into()),
        ..Flags::default()
    };
    let gateway = tokio::spawn(berth_gateway::server::run(Config::load(flags).unwrap()));
    let address_file = data.path().join("gateway.addr");
    while !address_file.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let address = std::fs::read_to_string(&address_file).unwrap().trim().to_string();
    let token = std::fs::read_to_string(data.path().join("api-token")).unwrap();
    let bearer: MetadataValue<_> = format!("Bearer {}", token.trim()).parse().unwrap();
    let channel = tonic::transport::Endpoint::from_shared(address).unwrap().connect().await.unwrap();
    let mut client = SandboxesClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", bearer.clone());
        Ok(r)
    });
    let spec =
        pb::SandboxSpec { image: IMAGE.into(), command: vec!["sleep".into(), "3600".into()], ..Default::default() };
    let created = client
        .create_sandbox(pb::CreateSandboxRequest { name: "bench".into(), spec: Some(spec), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    wait_phase(&mut client, "bench", pb::Phase::Ready).await;
    let lifecycle = || pb::LifecycleRequest { name: "bench".into(), expected_resource_version: None };
    let mut through_gateway = Vec::new();
    for _ in 0..runs() {
        client.stop_sandbox(lifecycle()).await.unwrap();
        wait_phase(&mut client, "bench", pb::Phase::Stopped).await;
        let started = Instant::now();
        client.start_sandbox(lifecycle()).await.unwrap();
        wait_phase(&mut client, "bench", pb::Phase::Ready).await;
        through_gateway.push(started.elapsed());
    }
    client.stop_sandbox(lifecycle()).await.unwrap();
    wait_phase(&mut client, "bench", pb::Phase::Stopped).await;
    // The same container, started by the runtime alone, with no gateway watching it.
    gateway.abort();
    let container = container_name(&berth_core::SandboxId::new(created.id));
    let mut by_runtime = Vec::new();
    for _ in 0..runs() {
        let started = Instant::now();
        engine.start(&container).await.unwrap();
        while engine.inspect(&container).await.unwrap().is_none_or(|i| i.status != Status::Running) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        by_runtime.push(started.elapsed());
        engine.stop(&container, Duration::from_secs(5)).await.unwrap();
    }
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
    println!("Start-to-Ready through the gateway beside the runtime's own start (median of {})", runs());
    println!("{:<8} {:>16} {:>16} {:>12}", "runtime", "through Berth", "runtime alone", "overhead");
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
        println!("{name:<8} {berth:>16?} {alone:>16?} {:>12?}", berth.saturating_sub(alone));
        println!("figure: Start-to-Ready through Berth, {name} = {:.3} ms", berth.as_secs_f64() * 1e3);
        println!("figure: {name} start alone = {:.3} ms", alone.as_secs_f64() * 1e3);
    }
}

fn engine_name(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::Docker => "docker",
        DriverKind::Podman => "podman",
        _ => "other",
    }
}
