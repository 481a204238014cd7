//! Gateways sharing a container runtime see only the containers and volumes of their own store:
//! a gateway labels what it makes with its store's identity, and an engine bound to another
//! store does not list it, so that store's gateway can never reap it as an orphan (issue 13,
//! defect 5). Needs Docker and Podman as the conformance suite does (`ci/runtimes up`, a static
//! supervisor); skips without them unless `BERTH_REQUIRE_RUNTIMES=1`.

use std::path::PathBuf;

use berth_core::SandboxId;
use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{Engine, image, volume_name};
use berth_gateway::data_dir::STORE_ID_FILE;
use berth_proto::v1 as pb;

use crate::harness::*;

/// Its own tag, so that importing it never races the conformance suite's import of theirs.
const IMAGE: &str = "berth-test/store-labels:1";

async fn engine(driver: &str, socket: &str, owner: &str, store: &str) -> Box<dyn Engine> {
    if driver == "docker" {
        Box::new(DockerEngine::connect(socket, owner).await.unwrap().with_store(store))
    } else {
        Box::new(PodmanEngine::connect(socket, owner).await.unwrap().with_store(store))
    }
}

async fn only_its_stores_resources_are_seen(driver: &str, socket_variable: &str) {
    let required = std::env::var("BERTH_REQUIRE_RUNTIMES").is_ok_and(|v| v == "1");
    let socket = std::env::var(socket_variable).ok();
    let supervisor = std::env::var_os("BERTH_TEST_STATIC_SUPERVISOR").map(PathBuf::from).filter(|p| p.exists());
    let (Some(socket), Some(supervisor)) = (socket, supervisor) else {
        assert!(
            !required,
            "{driver} is required under ci/test but {socket_variable} or a static supervisor is missing"
        );
        eprintln!("skipping the {driver} store label test: run ci/runtimes up, or ci/test");
        return;
    };
    let owner = format!("t-store-labels-{driver}");
    let rootfs = image::rootfs(std::path::Path::new(image::BUSYBOX), &supervisor).unwrap();
    let theirs = engine(driver, &socket, &owner, "another-store").await;
    theirs.import_image(IMAGE, rootfs).await.unwrap();

    let data = DataDir::new();
    let socket_flag = format!("--{driver}-socket");
    let supervisor = supervisor.display().to_string();
    let args = ["--instance", &owner, "--driver", driver, &socket_flag, &socket, "--supervisor-bin", &supervisor];
    let gateway = Gateway::start(&data, &args).await;
    let mut sandboxes = gateway.sandboxes().await;
    let spec =
        pb::SandboxSpec { image: IMAGE.into(), command: vec!["sleep".into(), "3600".into()], ..Default::default() };
    let request = pb::CreateSandboxRequest { name: "labelled".into(), spec: Some(spec), ..Default::default() };
    let id = SandboxId::new(sandboxes.create_sandbox(request).await.unwrap().into_inner().sandbox.unwrap().id);
    wait_phase(&mut sandboxes, "labelled", pb::Phase::Ready).await;

    let store = std::fs::read_to_string(data.path.join(STORE_ID_FILE)).unwrap();
    let store = store.lines().next().unwrap();
    let ours = engine(driver, &socket, &owner, store).await;
    // Listed by an engine of its own store and not by one of another: labelled with this one.
    assert!(ours.list().await.unwrap().contains(&id));
    assert!(!theirs.list().await.unwrap().contains(&id), "another store's engine sees {id}");
    assert!(ours.list_volumes().await.unwrap().contains(&volume_name(&id)));
    assert!(
        !theirs.list_volumes().await.unwrap().contains(&volume_name(&id)),
        "another store's engine sees its volume"
    );

    lifecycle(&mut sandboxes, "delete", "labelled").await.unwrap();
    wait_gone(&mut sandboxes, "labelled").await;
    assert!(!ours.list().await.unwrap().contains(&id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_lists_only_its_stores_containers_and_volumes() {
    only_its_stores_resources_are_seen("docker", "BERTH_TEST_DOCKER_SOCKET").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_lists_only_its_stores_containers_and_volumes() {
    only_its_stores_resources_are_seen("podman", "BERTH_TEST_PODMAN_SOCKET").await;
}
