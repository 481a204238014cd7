//! R2 end to end: a provider can be deleted the moment its sandbox is being deleted, even
//! while another client keeps bumping the sandbox's version.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use berth_proto::v1 as pb;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_sandbox_then_its_provider_at_once_fifty_times_under_concurrent_writes() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut providers = gateway.providers().await;
    create_provider(&mut providers, "bumper", "BUMPER_TOKEN", "b").await;
    const SECRET: &str = "s3cret-value-that-must-stay-private";
    for i in 0..50 {
        let (sandbox, provider) = (format!("app-{i}"), format!("creds-{i}"));
        create_provider(&mut providers, &provider, "API_KEY", SECRET).await;
        let command = ["sh", "-c", "printf %s \"$API_KEY\" > key; exec sleep 3600"];
        let id = create(&mut sandboxes, &sandbox, &command, &[&provider]).await.id;
        wait_phase(&mut sandboxes, &sandbox, pb::Phase::Ready).await;
        if i == 0 {
            assert_eq!(
                workspace_file_once(&data.path, &id, "key", SECRET).await.as_deref(),
                Some(SECRET),
                "credentials reach the sandbox"
            );
        }
        // Another client keeps attaching and detaching a provider, bumping the version.
        let stop = Arc::new(AtomicBool::new(false));
        let bumper = {
            let (stop, name) = (stop.clone(), sandbox.clone());
            let mut providers = gateway.providers().await;
            tokio::spawn(async move {
                let mut bumps = 0;
                while !stop.load(Ordering::Relaxed) {
                    let request = pb::AttachRequest {
                        sandbox: name.clone(),
                        provider: "bumper".into(),
                        expected_resource_version: None,
                    };
                    let result = if bumps % 2 == 0 {
                        providers.attach_provider(request).await
                    } else {
                        providers.detach_provider(request).await
                    };
                    match result {
                        Ok(_) => bumps += 1,
                        // Once it is being deleted, or gone, it refuses further changes.
                        Err(s) if matches!(s.code(), tonic::Code::FailedPrecondition | tonic::Code::NotFound) => {}
                        Err(s) => panic!("a server-owned attach failed: {s}"),
                    }
                }
                bumps
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let deleting = lifecycle(&mut sandboxes, "delete", &sandbox).await.unwrap();
        assert_eq!(phase(&deleting), pb::Phase::Deleting);
        providers
            .delete_provider(pb::DeleteProviderRequest { name: provider.clone(), expected_resource_version: None })
            .await
            .unwrap_or_else(|s| panic!("iteration {i}: deleting {provider} right after {sandbox}: {s}"));
        stop.store(true, Ordering::Relaxed);
        assert!(bumper.await.unwrap() > 0, "the bumper made no write");
        wait_gone(&mut sandboxes, &sandbox).await;
    }
    // Secrets never reach replies or logs.
    let reply = providers.get_provider(pb::GetProviderRequest { name: "bumper".into() }).await.unwrap().into_inner();
    assert_eq!(reply.provider.unwrap().credential_names, vec!["BUMPER_TOKEN".to_string()]);
    let log = data.log();
    assert!(!log.contains(SECRET) && !log.contains(&gateway.token), "a secret reached the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_in_use_cannot_be_deleted_and_an_attached_one_reaches_the_next_start() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut providers = gateway.providers().await;
    let id =
        create(&mut sandboxes, "box", &["sh", "-c", "printf %s \"$LATE_KEY\" > late; exec sleep 3600"], &[]).await.id;
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    create_provider(&mut providers, "late", "LATE_KEY", "v2").await;
    providers
        .attach_provider(pb::AttachRequest {
            sandbox: "box".into(),
            provider: "late".into(),
            expected_resource_version: None,
        })
        .await
        .unwrap();
    let refused = providers
        .delete_provider(pb::DeleteProviderRequest { name: "late".into(), expected_resource_version: None })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("box"), "{}", refused.message());
    assert_eq!(
        workspace_file_once(&data.path, &id, "late", "").await.as_deref(),
        Some(""),
        "applies at the next start only"
    );
    lifecycle(&mut sandboxes, "stop", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "box").await.unwrap();
    wait_phase(&mut sandboxes, "box", pb::Phase::Ready).await;
    assert_eq!(workspace_file_once(&data.path, &id, "late", "v2").await.as_deref(), Some("v2"));
}
