//! A restarted gateway adopting running sandboxes, and two gateways racing on one sandbox.

use super::*;

pub(crate) async fn a_restarted_gateway_adopts_running_sandboxes(runtime: Runtime) {
    let Some(target) = target(runtime, "adopt").await else { return };
    let data = DataDir::new();
    let mut gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_in(&target, &mut sandboxes, "kept", &["sleep", "3600"]).await.id;
    wait_phase(&mut sandboxes, "kept", pb::Phase::Ready).await;
    let before = target.run_identity(&data, &id);
    gateway.kill9();
    drop(gateway);
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    // Give the supervisor time to reconnect, and the reconcile loop time to look.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = get(&mut sandboxes, "kept").await.unwrap();
    assert_eq!((phase(&s), s.generation), (pb::Phase::Ready, 1), "{runtime:?}");
    assert_eq!(target.run_identity(&data, &id), before, "{runtime:?}: the sandbox was restarted, not adopted");
    assert!(data.log().contains("supervisor connected"), "the supervisor reconnected");
    clean_up(&target, &data, &mut sandboxes).await;
}

/// Two gateways on one database and one data directory racing on one sandbox (PostgreSQL).
pub(crate) async fn two_gateways_racing_on_one_sandbox_get_only_what_the_contract_allows(runtime: Runtime) {
    let Some(target) = target(runtime, "race").await else { return };
    let schema = format!("race_{runtime:?}").to_lowercase();
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = crate::pg::fresh_schema(&schema).await else { return };
    let data = DataDir::new();
    crate::several::race_on_one_sandbox(&data, &url, &target.gateway_args(), image_for(&target)).await;
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}
