//! Calls that reach the driver late: a stop decided for an older generation, a start landing
//! after the delete.

use super::*;

/// D1, found by the simulator with three gateways: a stop re-checked against the record, then
/// kept waiting for the driver's lock while another gateway started the next generation, ended
/// the run the user had just asked for. A stop decided for a generation leaves a newer one be.
pub(crate) async fn a_stop_decided_for_an_older_generation_leaves_the_newer_run_alone(runtime: Runtime) {
    let Some(target) = target(runtime, "stalestop").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-stale-stop-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(sleeping(&target, &data, id, 1)).await.unwrap(), StartReply::Running { .. }));
    let StartReply::Running { started_at } = driver.start(sleeping(&target, &data, id, 2)).await.unwrap() else {
        panic!("{runtime:?}: generation 2 did not start")
    };
    let seen = driver.stop(&sandbox, 1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        seen,
        RuntimeState::Running { started_at, held: None },
        "{runtime:?}: the stale stop ended generation 2"
    );
    assert_eq!(live_runs(&target, id), 1, "{runtime:?}");
    let stopped = driver.stop(&sandbox, 2, Duration::from_secs(5)).await.unwrap();
    assert!(matches!(stopped, RuntimeState::Exited(_)), "{runtime:?}: {stopped:?}");
    assert_eq!(live_runs(&target, id), 0, "{runtime:?}");
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}

/// Found by the simulator with three gateways: a start re-checked against the record just before
/// the sandbox's delete was decided, then held up, reached the driver after the delete. It made
/// a workspace volume no record stood for, which nothing ever removed. A deleted sandbox is
/// never started again, and its late start leaves nothing behind.
pub(crate) async fn a_start_landing_after_the_delete_makes_nothing(runtime: Runtime) {
    let Some(target) = target(runtime, "latestart").await else { return };
    let data = DataDir::new();
    drop(target.gateway(&data, &[]).await);
    let id = &format!("sb-late-start-{}", std::process::id());
    let sandbox = SandboxId::new(id);
    let driver = target.driver(&data).await;
    assert!(matches!(driver.start(sleeping(&target, &data, id, 1)).await.unwrap(), StartReply::Running { .. }));
    driver.delete(&sandbox, Duration::from_secs(5)).await.unwrap();
    let late = driver.start(sleeping(&target, &data, id, 1)).await.unwrap();
    assert!(matches!(late, StartReply::Failed { .. }), "{runtime:?}: {late:?}");
    let seen = driver.get(&sandbox).await.unwrap();
    assert!(matches!(seen, RuntimeState::Absent { .. }), "{runtime:?}: {seen:?}");
    let left = target.leftovers(&data);
    assert!(left.is_empty(), "left behind in {runtime:?}: {left:?}");
}
