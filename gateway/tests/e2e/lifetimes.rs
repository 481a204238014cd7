//! Lifetimes and restart policies on every driver (DESIGN 9.1, 9.2): a TTL'd sandbox is gone
//! (or stopped) after its deadline and a renewed one is not; an `always` sandbox comes back by
//! itself after its run is killed, and after every run dies while the gateway is down (a host
//! reboot, as seen from Berth), and a `never` one stays in Error; a sandbox left idle expires,
//! while an exec or a logs follow holds its idle timeout off. Then bad input.

use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::Code;

use crate::conformance::{Runtime, Target, clean_up, target};
use crate::harness::*;

fn lifetime(ttl: Duration, on_expiry: pb::OnExpiry) -> pb::Lifetime {
    pb::Lifetime {
        ttl_ms: Some(ttl.as_millis() as i64),
        idle_timeout_ms: None,
        on_expiry: on_expiry as i32,
        on_idle: None,
    }
}

fn idle(timeout: Duration, on_expiry: pb::OnExpiry) -> pb::Lifetime {
    pb::Lifetime {
        ttl_ms: None,
        idle_timeout_ms: Some(timeout.as_millis() as i64),
        on_expiry: on_expiry as i32,
        on_idle: None,
    }
}

pub(crate) fn always(backoff_ms: i64) -> pb::RestartPolicy {
    pb::RestartPolicy {
        mode: pb::RestartMode::Always as i32,
        max_restarts: None,
        backoff_ms: Some(backoff_ms),
        max_backoff_ms: Some(2_000),
    }
}

async fn create_policy(
    target: &Target,
    sandboxes: &mut Sandboxes,
    name: &str,
    command: &[&str],
    lifetime: Option<pb::Lifetime>,
    restart: Option<pb::RestartPolicy>,
) -> pb::Sandbox {
    let mut spec = spec(command);
    spec.image = crate::conformance::image_for(target).to_string();
    spec.lifetime = lifetime;
    spec.restart = restart;
    let request = pb::CreateSandboxRequest {
        name: name.into(),
        spec: Some(spec),
        providers: vec![],
        expected_resource_version: None,
        deadline_unix_ms: None,
        from_snapshot: String::new(),
    };
    sandboxes.create_sandbox(request).await.unwrap().into_inner().sandbox.unwrap()
}

async fn renew(sandboxes: &mut Sandboxes, name: &str, ttl_ms: Option<i64>) -> Result<pb::Sandbox, tonic::Status> {
    let request =
        pb::RenewSandboxRequest { name: name.into(), ttl_ms, deadline_unix_ms: None, expected_resource_version: None };
    sandboxes.renew_sandbox(request).await.map(|r| r.into_inner().sandbox.unwrap())
}

async fn deadlines_expire_and_renews_save(runtime: Runtime) {
    let Some(target) = target(runtime, "ttl").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let ttl = Duration::from_secs(3);
    let sleep: &[&str] = &["sleep", "3600"];
    let deleted =
        create_policy(&target, &mut sandboxes, "deleted", sleep, Some(lifetime(ttl, pb::OnExpiry::Delete)), None).await;
    create_policy(&target, &mut sandboxes, "stopped", sleep, Some(lifetime(ttl, pb::OnExpiry::Stop)), None).await;
    let kept =
        create_policy(&target, &mut sandboxes, "kept", sleep, Some(lifetime(ttl, pb::OnExpiry::Delete)), None).await;
    let first_deadline = kept.deadline_unix_ms.expect("a TTL sets a deadline");
    assert_eq!(first_deadline - kept.created_at_unix_ms, 3_000, "the deadline is the TTL after the create");
    for name in ["deleted", "stopped", "kept"] {
        wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
    }
    let renewed = renew(&mut sandboxes, "kept", Some(60_000)).await.unwrap();
    assert!(renewed.deadline_unix_ms.unwrap() > first_deadline + 50_000, "{renewed:?}");

    wait_gone(&mut sandboxes, "deleted").await;
    let (stopped, _) = wait_phase(&mut sandboxes, "stopped", pb::Phase::Stopped).await;
    assert_eq!(stopped.intent, pb::Intent::Stopped as i32, "an expiry is a stop: {stopped:?}");
    assert!(stopped.expired_at_unix_ms.is_some_and(|at| at >= stopped.deadline_unix_ms.unwrap()), "{stopped:?}");
    // Well past the first deadline, the renewed one runs on, untouched.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept_now = get(&mut sandboxes, "kept").await.unwrap();
    assert_eq!((phase(&kept_now), kept_now.generation, kept_now.expired_at_unix_ms), (pb::Phase::Ready, 1, None));
    assert!(data.log().contains(&deleted.id) && data.log().contains("expired"), "the gateway says what it expired");

    // A start renews the TTL, and clears the expiry.
    lifecycle(&mut sandboxes, "start", "stopped").await.unwrap();
    let (again, _) = wait_phase(&mut sandboxes, "stopped", pb::Phase::Ready).await;
    assert!(again.deadline_unix_ms.unwrap() > stopped.deadline_unix_ms.unwrap(), "{again:?}");
    assert_eq!((again.expired_at_unix_ms, again.generation), (None, 2));
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn always_comes_back_after_its_runs_die(runtime: Runtime) {
    let Some(target) = target(runtime, "always").await else { return };
    let data = DataDir::new();
    let mut gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let id = create_policy(&target, &mut sandboxes, "always", COUNTING, None, Some(always(200))).await.id;
    let never = create_policy(&target, &mut sandboxes, "never", COUNTING, None, None).await.id;
    wait_phase(&mut sandboxes, "always", pb::Phase::Ready).await;
    wait_phase(&mut sandboxes, "never", pb::Phase::Ready).await;
    // Each run counts itself once it is under way; killed before that, it would not.
    target.wait_workspace_file(&data, &id, "starts", "1").await;

    target.kill_out_of_band(&id);
    target.kill_out_of_band(&never);
    let back = |s: Option<&pb::Sandbox>| s.is_some_and(|s| phase(s) == pb::Phase::Ready && s.generation == 2);
    let (s, seen) = wait_for(&mut sandboxes, "always", Duration::from_secs(30), back).await;
    let s = s.unwrap();
    // The watch may open after the Error was already replaced: the count says there was one.
    assert_eq!(s.restart_count, 1, "{runtime:?}: {seen:?}");
    let (failed, _) = wait_phase(&mut sandboxes, "never", pb::Phase::Error).await;
    assert_eq!((failed.restart_count, failed.next_restart_unix_ms), (0, None), "{runtime:?}");

    // Every run dies while the gateway is down: the gateway finds them ended when it is back,
    // and the policy starts the next generation.
    target.wait_workspace_file(&data, &id, "starts", "2").await;
    gateway.kill9();
    drop(gateway);
    target.kill_out_of_band(&id);
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let back = |s: Option<&pb::Sandbox>| s.is_some_and(|s| phase(s) == pb::Phase::Ready && s.generation == 3);
    let (s, seen) = wait_for(&mut sandboxes, "always", Duration::from_secs(30), back).await;
    assert_eq!(s.unwrap().restart_count, 2, "{runtime:?}: {seen:?}");
    // Three runs, one workspace.
    target.wait_workspace_file(&data, &id, "starts", "3").await;
    let never_now = get(&mut sandboxes, "never").await.unwrap();
    assert_eq!((phase(&never_now), never_now.generation), (pb::Phase::Error, 1), "{runtime:?}");

    // A user's stop wins over the policy.
    lifecycle(&mut sandboxes, "stop", "always").await.unwrap();
    let (stopped, _) = wait_phase(&mut sandboxes, "always", pb::Phase::Stopped).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = get(&mut sandboxes, "always").await.unwrap();
    assert_eq!((phase(&still), still.generation), (pb::Phase::Stopped, stopped.generation), "{runtime:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

async fn idle_sandboxes_expire_and_activity_holds_them_off(runtime: Runtime) {
    let Some(target) = target(runtime, "idle").await else { return };
    let data = DataDir::new();
    let gateway = target.gateway(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let timeout = Duration::from_secs(4);
    let sleep: &[&str] = &["sleep", "3600"];
    for (name, on_expiry) in [
        ("busy", pb::OnExpiry::Stop),
        ("followed", pb::OnExpiry::Stop),
        ("idle", pb::OnExpiry::Stop),
        ("gone", pb::OnExpiry::Delete),
    ] {
        create_policy(&target, &mut sandboxes, name, sleep, Some(idle(timeout, on_expiry)), None).await;
    }
    for name in ["busy", "followed", "idle", "gone"] {
        wait_phase(&mut sandboxes, name, pb::Phase::Ready).await;
    }
    // An exec running twice the timeout, and a logs follow open as long.
    let mut execs = gateway.execs().await;
    let exec =
        tokio::spawn(async move { crate::exec::run(&mut execs, crate::exec::start("busy", &["sleep", "8"])).await });
    let mut logs = gateway.logs().await;
    let follow = pb::ReadLogsRequest { sandbox: "followed".into(), generation: 0, offset: 0, follow: true };
    let follow = logs.read_logs(follow).await.unwrap().into_inner();

    let (stopped, _) = wait_phase(&mut sandboxes, "idle", pb::Phase::Stopped).await;
    assert_eq!((stopped.intent, stopped.expired_at_unix_ms), (pb::Intent::Stopped as i32, None), "{runtime:?}");
    assert!(stopped.idle_expired_at_unix_ms.unwrap() - stopped.created_at_unix_ms >= 4_000, "{stopped:?}");
    wait_gone(&mut sandboxes, "gone").await;
    let ran = exec.await.unwrap();
    assert_eq!(ran.exit_code(), Some(0), "{runtime:?}");
    // Eight seconds, twice the timeout: both held off, the busy one's clock restarted by the end.
    let mut last = Vec::new();
    for name in ["busy", "followed"] {
        let s = get(&mut sandboxes, name).await.unwrap();
        assert_eq!((phase(&s), s.idle_expired_at_unix_ms), (pb::Phase::Ready, None), "{runtime:?} {s:?}");
        // The busy one's clock counts from the exec's end, the followed one's from a touch a
        // quarter of the timeout ago at most: both well past where they would have expired.
        let active = s.active_at_unix_ms.unwrap();
        assert!(active - s.created_at_unix_ms >= 6_000, "{runtime:?} {s:?}");
        last.push(active);
    }
    // Left alone, each expires a timeout after its last activity.
    drop(follow);
    for (name, active) in ["busy", "followed"].into_iter().zip(last) {
        let (s, _) = wait_phase(&mut sandboxes, name, pb::Phase::Stopped).await;
        assert!(s.idle_expired_at_unix_ms.unwrap() - active >= 4_000, "{runtime:?} {s:?}");
    }
    assert!(data.log().contains("idle for its idle timeout"), "the gateway says what it expired");
    // A start runs the clock again, from the start.
    lifecycle(&mut sandboxes, "start", "idle").await.unwrap();
    let (again, _) = wait_phase(&mut sandboxes, "idle", pb::Phase::Ready).await;
    assert_eq!(again.idle_expired_at_unix_ms, None, "{again:?}");
    assert!(again.active_at_unix_ms.unwrap() >= stopped.idle_expired_at_unix_ms.unwrap(), "{again:?}");
    clean_up(&target, &data, &mut sandboxes).await;
}

macro_rules! on_every_driver {
    ($($runtime:ident => $module:ident),*) => {
        $(
            mod $module {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn deadlines_expire_and_renews_save() {
                    super::deadlines_expire_and_renews_save(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn always_comes_back_after_its_runs_die() {
                    super::always_comes_back_after_its_runs_die(Runtime::$runtime).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn idle_sandboxes_expire_and_activity_holds_them_off() {
                    super::idle_sandboxes_expire_and_activity_holds_them_off(Runtime::$runtime).await
                }
            }
        )*
    };
}

on_every_driver!(Process => process, Docker => docker, Podman => podman);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lifetimes_and_policies_name_their_field_and_write_nothing() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &["--max-ttl", "1h"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let with = |lifetime: Option<pb::Lifetime>, restart: Option<pb::RestartPolicy>, deadline: Option<i64>| {
        let mut s = spec(&["sleep", "3600"]);
        s.lifetime = lifetime;
        s.restart = restart;
        pb::CreateSandboxRequest {
            name: "bad".into(),
            spec: Some(s),
            providers: vec![],
            expected_resource_version: None,
            deadline_unix_ms: deadline,
            from_snapshot: String::new(),
        }
    };
    let ttl = |ms: i64| Some(pb::Lifetime { ttl_ms: Some(ms), idle_timeout_ms: None, on_expiry: 0, on_idle: None });
    let idle_ms = |ms: i64| Some(pb::Lifetime { ttl_ms: None, idle_timeout_ms: Some(ms), on_expiry: 0, on_idle: None });
    let cases = [
        (with(ttl(0), None, None), "spec.lifetime.ttl_ms"),
        (with(ttl(-5), None, None), "spec.lifetime.ttl_ms"),
        (with(ttl(2 * 3600 * 1000), None, None), "spec.lifetime.ttl_ms"),
        (with(idle_ms(0), None, None), "spec.lifetime.idle_timeout_ms"),
        (with(idle_ms(-1), None, None), "spec.lifetime.idle_timeout_ms"),
        (with(idle_ms(500), None, None), "spec.lifetime.idle_timeout_ms"),
        (with(idle_ms(2 * 3600 * 1000), None, None), "spec.lifetime.idle_timeout_ms"),
        (
            with(Some(pb::Lifetime { ttl_ms: None, idle_timeout_ms: None, on_expiry: 9, on_idle: None }), None, None),
            "spec.lifetime.on_expiry",
        ),
        (with(None, None, Some(1_000)), "deadline_unix_ms"),
        (with(None, Some(pb::RestartPolicy { mode: 7, ..always(200) }), None), "spec.restart.mode"),
        (with(None, Some(always(5)), None), "spec.restart.backoff_ms"),
        (
            with(None, Some(pb::RestartPolicy { max_backoff_ms: Some(100), ..always(200) }), None),
            "spec.restart.max_backoff_ms",
        ),
        (with(None, Some(pb::RestartPolicy { backoff_ms: Some(-1), ..always(200) }), None), "spec.restart.backoff_ms"),
    ];
    for (request, field) in cases {
        let status = sandboxes.create_sandbox(request).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status}");
        assert!(status.message().contains(field), "{field}: {status}");
    }
    assert_eq!(get(&mut sandboxes, "bad").await.unwrap_err().code(), Code::NotFound, "nothing was written");

    let missing = renew(&mut sandboxes, "missing", Some(1_000)).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing}");
    create(&mut sandboxes, "plain", &["sleep", "3600"], &[]).await;
    let before = get(&mut sandboxes, "plain").await.unwrap();
    let no_ttl = renew(&mut sandboxes, "plain", None).await.unwrap_err();
    assert_eq!(no_ttl.code(), Code::InvalidArgument, "{no_ttl}");
    assert!(no_ttl.message().contains("ttl_ms"), "{no_ttl}");
    let both = pb::RenewSandboxRequest {
        name: "plain".into(),
        ttl_ms: Some(1_000),
        deadline_unix_ms: Some(i64::MAX),
        expected_resource_version: None,
    };
    let both = sandboxes.renew_sandbox(both).await.unwrap_err();
    assert_eq!(both.code(), Code::InvalidArgument, "{both}");
    let too_long = renew(&mut sandboxes, "plain", Some(2 * 3600 * 1000)).await.unwrap_err();
    assert!(too_long.message().contains("--max-ttl"), "{too_long}");
    let stale = pb::RenewSandboxRequest {
        name: "plain".into(),
        ttl_ms: Some(1_000),
        deadline_unix_ms: None,
        expected_resource_version: Some(before.resource_version + 5),
    };
    assert_eq!(sandboxes.renew_sandbox(stale).await.unwrap_err().code(), Code::Aborted);
    let after = get(&mut sandboxes, "plain").await.unwrap();
    assert_eq!(after.deadline_unix_ms, None, "no refused renew set a deadline");
}
