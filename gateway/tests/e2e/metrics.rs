//! The Prometheus endpoint (`--metrics-listen`): scraped over plain HTTP as Prometheus does,
//! with the API's token, after a create, a stop, a start and an exec.

use std::time::Duration;

use berth_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::*;

/// `GET /metrics` on `port` with `authorization` (if any): the status line and the body.
pub(crate) async fn scrape(port: u16, authorization: Option<&str>) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let auth = authorization.map(|a| format!("authorization: {a}\r\n")).unwrap_or_default();
    let request = format!("GET /metrics HTTP/1.1\r\nhost: berth\r\n{auth}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

pub(crate) fn value(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_counts_phases_transitions_driver_calls_execs_and_the_lease() {
    let data = DataDir::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gateway = Gateway::start(&data, &["--metrics-listen", &format!("127.0.0.1:{port}")]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut providers = gateway.providers().await;
    create_provider(&mut providers, "llm", "VERY_SECRET_KEY", "hunter2").await;
    create(&mut sandboxes, "metered", &["sleep", "3600"], &["llm"]).await;
    wait_phase(&mut sandboxes, "metered", pb::Phase::Ready).await;
    lifecycle(&mut sandboxes, "stop", "metered").await.unwrap();
    wait_phase(&mut sandboxes, "metered", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "metered").await.unwrap();
    wait_phase(&mut sandboxes, "metered", pb::Phase::Ready).await;
    let mut execs = gateway.execs().await;
    let ran = crate::exec::run(&mut execs, crate::exec::start("metered", &["true"])).await;
    assert_eq!(ran.exit_code(), Some(0));
    // A sweep (every 500 ms here) and the lease's renewal have run.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (status, _) = scrape(port, None).await;
    assert!(status.contains("401"), "{status}");
    let (status, _) = scrape(port, Some("Bearer not-the-token-at-all")).await;
    assert!(status.contains("401"), "{status}");
    let (status, body) = scrape(port, Some(&format!("Bearer {}", gateway.token))).await;
    assert!(status.contains("200"), "{status}");
    assert_eq!(value(&body, "berth_sandboxes{phase=\"Ready\"}"), 1.0);
    assert_eq!(value(&body, "berth_sandboxes{phase=\"Error\"}"), 0.0);
    for kind in ["create_to_ready", "start_to_ready", "stop_to_stopped"] {
        assert_eq!(value(&body, &format!("berth_transition_seconds_count{{kind=\"{kind}\"}}")), 1.0, "{kind}");
    }
    assert!(value(&body, "berth_driver_call_seconds_count{op=\"start\"}") >= 2.0);
    assert_eq!(value(&body, "berth_execs_admitted_total"), 1.0);
    assert_eq!(value(&body, "berth_execs_ended_total{state=\"Exited\"}"), 1.0);
    assert_eq!(value(&body, "berth_execs_open"), 0.0);
    assert_eq!(value(&body, "berth_lease_held"), 1.0);
    assert!(value(&body, "berth_lease_term") >= 1.0);
    assert!(value(&body, "berth_reconcile_sweep_seconds_count") >= 1.0);
    assert!(value(&body, "berth_phase_transitions_total{from=\"Starting\",to=\"Ready\"}") >= 1.0);
    for secret in ["metered", "llm", "VERY_SECRET_KEY", "hunter2", &gateway.token] {
        assert!(!body.contains(secret), "{secret} in the metrics");
    }
}
