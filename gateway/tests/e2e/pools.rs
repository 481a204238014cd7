//! Templates and warm pools on every driver (DESIGN 9.4): a pool fills to its size, two
//! clients claiming at once get two sandboxes, a claim's provider reaches execs at once, the
//! pool refills after claims, and a deleted template takes its unclaimed members with it while
//! claimed sandboxes stay. Then bad input.

use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::Code;

use crate::conformance::{Runtime, clean_up, image_for, target};
use crate::exec::{run, start};
use crate::harness::*;

async fn create_template(templates: &mut Templates, image: &str, min_ready: u32) -> pb::Template {
    let mut spec = spec(&["sleep", "3600"]);
    spec.image = image.to_string();
    let request =
        pb::CreateTemplateRequest { name: "web".into(), spec: Some(spec), min_ready, expected_resource_version: None };
    templates.create_template(request).await.unwrap().into_inner().template.unwrap()
}

fn claim(providers: &[&str], wait_ms: Option<u32>) -> pb::ClaimSandboxRequest {
    pb::ClaimSandboxRequest {
        template: "web".into(),
        labels: [("agent".to_string(), "a1".to_string())].into(),
        providers: providers.iter().map(|p| p.to_string()).collect(),
        wait_ms,
    }
}

/// The pool once `ready` of its members are Ready and it has no others; panics after 60 s.
async fn pool_ready(templates: &mut Templates, ready: u32) -> pb::Pool {
    let mut last = None;
    for _ in 0..600 {
        let t = templates.get_template(pb::GetTemplateRequest { name: "web".into() }).await.unwrap().into_inner();
        let pool = t.template.unwrap().pool.unwrap();
        if pool.ready == ready && pool.members == ready {
            return pool;
        }
        last = Some(pool);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the pool never had {ready} Ready members: {last:?}");
}

async fn pools_refill_and_claims_never_share(runtime: Runtime) {
    let Some(target) = target(runtime, "pools").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut templates = gateway.templates().await;
    let mut providers = gateway.providers().await;
    create_provider(&mut providers, "llm", "POOL_SECRET", "s3cret").await;
    create_template(&mut templates, image_for(&target), 2).await;
    let first = pool_ready(&mut templates, 2).await;

    // Two clients at once: two sandboxes, each one of the pool's.
    let (mut a, mut b) = (templates.clone(), templates.clone());
    let (x, y) = tokio::join!(a.claim_sandbox(claim(&["llm"], None)), b.claim_sandbox(claim(&[], None)));
    let (x, y) = (x.unwrap().into_inner().sandbox.unwrap(), y.unwrap().into_inner().sandbox.unwrap());
    assert_ne!(x.id, y.id, "{runtime:?}: two claims got one sandbox");
    for s in [&x, &y] {
        assert!(first.member_names.contains(&s.name), "{runtime:?}: {} was not a member", s.name);
        assert_eq!((phase(s), s.pool_member, s.template.as_str()), (pb::Phase::Ready, false, "web"), "{runtime:?}");
        assert_eq!(s.spec.as_ref().unwrap().labels.get("agent").map(String::as_str), Some("a1"));
    }
    assert_eq!(x.providers, ["llm"]);
    // The provider attached at the claim reaches an exec at once, without a restart.
    let mut execs = gateway.execs().await;
    let read = run(&mut execs, start(&x.name, &["sh", "-c", "echo \"$POOL_SECRET\""])).await;
    assert_eq!(read.stdout, b"s3cret\n", "{runtime:?}: {read:?}");
    assert_eq!(get(&mut sandboxes, &x.name).await.unwrap().generation, 1, "{runtime:?}: no restart for it");

    // The pool refills with new members.
    let refilled = pool_ready(&mut templates, 2).await;
    assert!(!refilled.member_names.contains(&x.name) && !refilled.member_names.contains(&y.name));

    // Emptied, a claim fails at once, or waits for the pool to be given a member again.
    let set = |n| pb::SetPoolRequest { template: "web".into(), min_ready: n, expected_resource_version: None };
    templates.set_pool(set(0)).await.unwrap();
    pool_ready(&mut templates, 0).await;
    let empty = templates.claim_sandbox(claim(&[], None)).await.unwrap_err();
    assert_eq!(empty.code(), Code::Unavailable, "{runtime:?}: {empty}");
    assert!(empty.message().contains("retry"), "{empty}");
    let mut waiting = templates.clone();
    let waited = tokio::spawn(async move { waiting.claim_sandbox(claim(&[], Some(60_000))).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    templates.set_pool(set(1)).await.unwrap();
    let got = waited.await.unwrap().unwrap().into_inner().sandbox.unwrap();
    assert_eq!(phase(&got), pb::Phase::Ready, "{runtime:?}");

    // The template's deletion takes its unclaimed members; claimed sandboxes stay.
    pool_ready(&mut templates, 1).await;
    templates.set_pool(set(1)).await.unwrap();
    let member = templates.get_template(pb::GetTemplateRequest { name: "web".into() }).await.unwrap().into_inner();
    let member = member.template.unwrap().pool.unwrap().member_names[0].clone();
    templates
        .delete_template(pb::DeleteTemplateRequest { name: "web".into(), expected_resource_version: None })
        .await
        .unwrap();
    wait_gone(&mut sandboxes, &member).await;
    for s in [&x, &y, &got] {
        assert_eq!(phase(&get(&mut sandboxes, &s.name).await.unwrap()), pb::Phase::Ready, "{runtime:?}: {}", s.name);
    }
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn pools_refill_and_claims_never_share() {
                    super::pools_refill_and_claims_never_share(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_templates_and_claims_name_their_field_and_write_nothing() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &["--max-pool", "5"]).await;
    let mut templates = gateway.templates().await;
    let mut sandboxes = gateway.sandboxes().await;
    let big = pb::CreateTemplateRequest {
        name: "web".into(),
        spec: Some(spec(&["sleep", "3600"])),
        min_ready: 6,
        expected_resource_version: None,
    };
    let e = templates.create_template(big).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("min_ready") && e.message().contains("--max-pool"), "{e}");
    let long = pb::CreateTemplateRequest {
        name: "x".repeat(55),
        spec: Some(spec(&["sleep", "3600"])),
        min_ready: 1,
        expected_resource_version: None,
    };
    let e = templates.create_template(long).await.unwrap_err();
    assert!(e.code() == Code::InvalidArgument && e.message().contains("name"), "{e}");
    let e = templates.get_template(pb::GetTemplateRequest { name: "web".into() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "nothing was written: {e}");

    let e = templates.claim_sandbox(claim(&[], None)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(e.message().contains("template 'web'"), "{e}");
    create_template(&mut templates, "host", 0).await;
    let e = templates.claim_sandbox(claim(&[], Some(700_000))).await.unwrap_err();
    assert!(e.code() == Code::InvalidArgument && e.message().contains("wait_ms"), "{e}");
    let e = templates.claim_sandbox(claim(&["missing"], None)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    let mut reserved = claim(&[], None);
    reserved.labels.insert("berth.pool".into(), "x".into());
    let e = templates.claim_sandbox(reserved).await.unwrap_err();
    assert!(e.code() == Code::InvalidArgument && e.message().contains("labels[berth.pool]"), "{e}");
    let e = templates
        .set_pool(pb::SetPoolRequest { template: "web".into(), min_ready: 1, expected_resource_version: Some(9) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted, "{e}");
    let all = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner();
    assert!(all.sandboxes.is_empty(), "no refused request made a sandbox: {:?}", all.sandboxes);
}
