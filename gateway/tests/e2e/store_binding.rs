//! A data directory belongs to the store it was first used with. A gateway started on it with
//! another store (a forgotten `--store`) would find the directory's sandboxes without records and
//! delete them as orphans: it refuses to start instead, and touches nothing (issue 13, defect 5).

use berth_gateway::store::Store;
use berth_gateway::store::sqlite::SqliteStore;
use berth_proto::v1 as pb;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_another_store_refuses_the_data_directory_and_its_sandboxes_live_on() {
    let data = DataDir::new();
    let stores = tempfile::tempdir().unwrap();
    let path = |name: &str| stores.path().join(name);
    let first = format!("sqlite:{}", path("first.db").display());
    let other = format!("sqlite:{}", path("other.db").display());

    let mut gateway = Gateway::start(&data, &["--store", &first]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create(&mut sandboxes, "keep", COUNTING, &[]).await.id;
    let (ready, _) = wait_phase(&mut sandboxes, "keep", pb::Phase::Ready).await;
    std::fs::write(data.workspace(&id).join("work"), "precious").unwrap();
    let pid = data.run_pid(&id).unwrap();
    gateway.terminate();

    let said = refused(&data, &["--store", &other]).await;
    let identity = |file: &str| SqliteStore::open(&path(file)).unwrap().identity().to_string();
    for mention in [identity("first.db"), identity("other.db"), other.clone(), "--store (BERTH_STORE)".into()] {
        assert!(said.contains(&mention), "the refusal does not mention {mention:?}:\n{said}");
    }

    // Untouched: the workspace and the run.
    assert_eq!(std::fs::read_to_string(data.workspace(&id).join("work")).unwrap(), "precious");
    assert_eq!(workspace_file(&data.path, &id, "starts").as_deref(), Some("1"));
    assert_eq!(data.run_pid(&id), Some(pid));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).expect("the sandbox's run was stopped");

    let gateway = Gateway::start(&data, &["--store", &first]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let (after, _) = wait_phase(&mut sandboxes, "keep", pb::Phase::Ready).await;
    assert_eq!((after.id, after.generation), (id.clone(), ready.generation));
    assert_eq!(data.run_pid(&id), Some(pid), "the run was replaced");
    assert_eq!(workspace_file(&data.path, &id, "starts").as_deref(), Some("1"));
}
