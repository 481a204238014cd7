//! The gateway on PostgreSQL, and the database stopped and started again under load: clients
//! get UNAVAILABLE while it is down (never another error), nothing acknowledged is lost, and the
//! gateway recovers by itself. It stops and starts the server `ci/postgres` runs.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::Code;

use crate::harness::*;
use crate::pg;

fn ci_postgres(verb: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/postgres");
    let status = Command::new(script).arg(verb).status().unwrap();
    assert!(status.success(), "ci/postgres {verb} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_unavailable_then_the_gateway_recovers_by_itself() {
    let _server = crate::harness::POSTGRES_SERVER.write().await;
    let Some(url) = pg::fresh_schema("database_outage").await else { return };
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &["--store", &url]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let before = create(&mut sandboxes, "before", COUNTING, &[]).await;
    wait_phase(&mut sandboxes, "before", pb::Phase::Ready).await;

    // Load: creates one after another, through the outage and after it.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let mut sandboxes = gateway.sandboxes().await;
        let stop = Arc::clone(&stop);
        async move {
            let mut outcomes = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let request = pb::CreateSandboxRequest {
                    name: format!("load-{i}"),
                    spec: Some(spec(&["sleep", "3600"])),
                    ..Default::default()
                };
                let reply = sandboxes.create_sandbox(request).await;
                outcomes.push((format!("load-{i}"), reply.map(|_| ()).map_err(|s| s.code())));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            outcomes
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    ci_postgres("stop");
    let down = get(&mut sandboxes, "before").await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert!(down.message().contains("postgres"), "says what is unavailable: {}", down.message());
    tokio::time::sleep(Duration::from_secs(2)).await;
    ci_postgres("start");

    // Back by itself: no restart of the gateway.
    let mut back = false;
    for _ in 0..100 {
        if get(&mut sandboxes, "before").await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the gateway did not recover:\n{}", data.log());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let outcomes = load.await.unwrap();

    let unavailable = outcomes.iter().filter(|(_, o)| *o == Err(Code::Unavailable)).count();
    assert!(unavailable > 0, "the outage was seen: {outcomes:?}");
    for (name, outcome) in &outcomes {
        match outcome {
            // Acknowledged: it is there, and converges.
            Ok(()) => {
                wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
            }
            // A create whose commit reply was lost may have landed: either way is allowed.
            Err(Code::Unavailable) => {}
            Err(other) => panic!("{name}: {other:?}, only UNAVAILABLE is allowed while the database is down"),
        }
    }
    // What was there before is untouched, and the lifecycle goes on.
    let (after, _) = wait_phase(&mut sandboxes, "before", pb::Phase::Ready).await;
    assert_eq!(after.id, before.id);
    lifecycle(&mut sandboxes, "stop", "before").await.unwrap();
    wait_phase(&mut sandboxes, "before", pb::Phase::Stopped).await;
    let log = data.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("store unavailable"), "the outage is logged: {log}");
}
