//! Defect 4 of issue 13: sixteen clients attaching and detaching a provider on one sandbox,
//! without expected versions, beside a stop/start cycler, got "under contention" failures of
//! server-owned commands (I3 says never). `BERTH_CONTENTION_SECS` sets how long it runs (5 s
//! here; `ci/contention` runs it for 10 minutes).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use berth_proto::v1 as pb;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_server_owned_writers_on_one_sandbox_never_fail() {
    let seconds: u64 = std::env::var("BERTH_CONTENTION_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &["--poll-interval", "50ms"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut providers = gateway.providers().await;
    for p in ["p0", "p1"] {
        let request = pb::CreateProviderRequest {
            endpoints: Default::default(),
            name: p.into(),
            kind: "test".into(),
            credentials: [(format!("{}_KEY", p.to_uppercase()), "v".to_string())].into(),
            expected_resource_version: None,
        };
        providers.create_provider(request).await.unwrap();
    }
    create(&mut sandboxes, "hot", &["sleep", "3600"], &[]).await;
    wait_phase(&mut sandboxes, "hot", pb::Phase::Ready).await;

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..16 {
        let (stop, calls) = (stop.clone(), calls.clone());
        let mut providers = gateway.providers().await;
        writers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let request = pb::AttachRequest {
                    sandbox: "hot".into(),
                    provider: format!("p{}", w % 2),
                    expected_resource_version: None,
                };
                let result = if i.is_multiple_of(2) {
                    providers.attach_provider(request).await
                } else {
                    providers.detach_provider(request).await
                };
                calls.fetch_add(1, Ordering::Relaxed);
                if let Err(status) = result {
                    failures.push(format!("writer {w}: {status}"));
                }
                i += 1;
            }
            failures
        }));
    }
    let cycler = {
        let stop = stop.clone();
        let mut sandboxes = gateway.sandboxes().await;
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut cycles = 0;
            while !stop.load(Ordering::Relaxed) {
                for (verb, target) in [("stop", pb::Phase::Stopped), ("start", pb::Phase::Ready)] {
                    match lifecycle(&mut sandboxes, verb, "hot").await {
                        Ok(_) => {
                            wait_phase(&mut sandboxes, "hot", target).await;
                        }
                        Err(status) => failures.push(format!("{verb}: {status}")),
                    }
                }
                cycles += 1;
            }
            (cycles, failures)
        })
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for writer in writers {
        failures.extend(writer.await.unwrap());
    }
    let (cycles, cycle_failures) = cycler.await.unwrap();
    failures.extend(cycle_failures);
    let calls = calls.load(Ordering::Relaxed);
    eprintln!("{calls} attach/detach calls and {cycles} stop/start cycles in {seconds} s");
    assert!(failures.is_empty(), "{} of {calls} calls failed:\n{}", failures.len(), failures.join("\n"));
    assert!(calls > 0 && cycles > 0, "nothing ran");
    assert!(!data.log().contains("kept conflicting"), "the gateway gave up on a write");
}
