//! The fleet-wide watch: every change to every selected sandbox, resumable from a cursor across
//! disconnects and gateway restarts, on SQLite and through another gateway on PostgreSQL.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_proto::v1 as pb;
use tonic::{Code, Streaming};

use crate::harness::*;
use crate::pg;

fn labelled(name: &str, team: &str) -> pb::CreateSandboxRequest {
    let mut spec = spec(&["sleep", "3600"]);
    spec.labels = [("team".to_string(), team.to_string())].into();
    pb::CreateSandboxRequest { name: name.into(), spec: Some(spec), ..Default::default() }
}

fn team(team: &str) -> BTreeMap<String, String> {
    [("team".to_string(), team.to_string())].into()
}

async fn watch(
    sandboxes: &mut Sandboxes,
    team_: &str,
    cursor: &str,
) -> Result<Streaming<pb::SandboxEvent>, tonic::Status> {
    let request = pb::WatchSandboxesRequest { label_selector: team(team_), cursor: cursor.into() };
    sandboxes.watch_sandboxes(request).await.map(|r| r.into_inner())
}

/// What one event says: (name, resource version, removed); a bookmark is ("", 0, false).
fn said(event: &pb::SandboxEvent) -> (String, u64, bool) {
    (event.name.clone(), event.sandbox.as_ref().map_or(0, |s| s.resource_version), event.removed)
}

/// Reads events until `done` holds for the last, recording each; panics on timeout.
async fn read_until(
    events: &mut Streaming<pb::SandboxEvent>,
    seen: &mut Vec<pb::SandboxEvent>,
    done: impl Fn(&pb::SandboxEvent) -> bool,
) {
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.message().await.unwrap() {
            let finished = done(&event);
            seen.push(event);
            if finished {
                return;
            }
        }
        panic!("the watch ended");
    });
    if read.await.is_err() {
        panic!("timed out; seen: {:?}", seen.iter().map(said).collect::<Vec<_>>());
    }
}

fn ready(name: &str) -> impl Fn(&pb::SandboxEvent) -> bool {
    let name = name.to_string();
    move |e| e.name == name && e.sandbox.as_ref().is_some_and(|s| phase(s) == pb::Phase::Ready)
}

fn phase_is(name: &str, want: pb::Phase) -> impl Fn(&pb::SandboxEvent) -> bool {
    let name = name.to_string();
    move |e| e.name == name && e.sandbox.as_ref().is_some_and(|s| phase(s) == want)
}

fn removed(name: &str) -> impl Fn(&pb::SandboxEvent) -> bool {
    let name = name.to_string();
    move |e| e.name == name && e.removed
}

/// Every sandbox's versions, in the order the events gave them, bookmarks left out.
fn versions(seen: &[pb::SandboxEvent]) -> BTreeMap<String, Vec<(u64, bool)>> {
    let mut out: BTreeMap<String, Vec<(u64, bool)>> = BTreeMap::new();
    for event in seen.iter().filter(|e| !e.name.is_empty()) {
        out.entry(event.name.clone())
            .or_default()
            .push((event.sandbox.as_ref().map_or(0, |s| s.resource_version), event.removed));
    }
    out
}

/// Each sandbox's versions run one by one from `from` (missing none, repeating none), the last
/// a removal when `gone`.
fn assert_whole(seen: &BTreeMap<String, Vec<(u64, bool)>>, name: &str, from: u64, gone: bool) {
    let got = &seen[name];
    let (last, rest) = got.split_last().unwrap();
    let live: Vec<u64> = if gone {
        assert!(last.1, "{name}'s last event is its removal: {got:?}");
        rest.iter().map(|(v, _)| *v).collect()
    } else {
        got.iter().map(|(v, _)| *v).collect()
    };
    assert!(got.iter().filter(|(_, r)| *r).count() <= 1, "{name} removed once: {got:?}");
    let expected: Vec<u64> = (from..from + live.len() as u64).collect();
    assert_eq!(live, expected, "{name}'s every version, once each, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_watch_resumed_from_its_last_cursor_across_a_gateway_restart_misses_nothing_and_repeats_nothing() {
    let data = DataDir::new();
    let mut gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    sandboxes.create_sandbox(labelled("a1", "a")).await.unwrap();
    sandboxes.create_sandbox(labelled("b1", "b")).await.unwrap();
    wait_phase(&mut sandboxes, "a1", pb::Phase::Ready).await;
    let listing = sandboxes
        .list_sandboxes(pb::ListSandboxesRequest { label_selector: team("a"), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listing.sandboxes.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["a1"]);
    let a1_listed = listing.sandboxes[0].resource_version;

    let mut seen = Vec::new();
    let mut events = watch(&mut sandboxes, "a", &listing.cursor).await.unwrap();
    let first = events.message().await.unwrap().unwrap();
    assert_eq!(
        (first.name.as_str(), first.sandbox.is_none(), first.cursor.as_str()),
        ("", true, listing.cursor.as_str())
    );
    sandboxes.create_sandbox(labelled("a2", "a")).await.unwrap();
    sandboxes.create_sandbox(labelled("b2", "b")).await.unwrap();
    read_until(&mut events, &mut seen, ready("a2")).await;
    drop(events);
    let resume = seen.last().unwrap().cursor.clone();

    // Changes while no one watches, then the gateway dies and comes back.
    lifecycle(&mut sandboxes, "stop", "a1").await.unwrap();
    lifecycle(&mut sandboxes, "delete", "a2").await.unwrap();
    lifecycle(&mut sandboxes, "delete", "b1").await.unwrap();
    wait_phase(&mut sandboxes, "a1", pb::Phase::Stopped).await;
    wait_gone(&mut sandboxes, "a2").await;
    gateway.kill9();
    let gateway = Gateway::start(&data, &[]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let mut events = watch(&mut sandboxes, "a", &resume).await.unwrap();
    let first = events.message().await.unwrap().unwrap();
    assert_eq!(first.cursor, resume, "a resumed watch starts where it was");
    read_until(&mut events, &mut seen, removed("a2")).await;
    lifecycle(&mut sandboxes, "start", "a1").await.unwrap();
    read_until(&mut events, &mut seen, ready("a1")).await;
    // Ready can come before the driver's start reply, one write more, and that write may land
    // after any read: the watch must get to a1 as read after its Ready, whichever that is.
    let a1 = get(&mut sandboxes, "a1").await.unwrap();
    let current = a1.resource_version;
    if said(seen.last().unwrap()).1 < current {
        let caught_up = move |e: &pb::SandboxEvent| said(e).0 == "a1" && said(e).1 >= current;
        read_until(&mut events, &mut seen, caught_up).await;
    }

    assert!(seen.iter().all(|e| e.name.is_empty() || e.name.starts_with('a')), "the selector holds");
    let cursors: Vec<u64> = seen.iter().map(|e| e.cursor.split_once('.').unwrap().0.parse().unwrap()).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "cursors move forward: {cursors:?}");
    let by_sandbox = versions(&seen);
    assert_whole(&by_sandbox, "a1", a1_listed + 1, false);
    assert_whole(&by_sandbox, "a2", 1, true);
    assert_eq!(by_sandbox["a1"].last().unwrap().0, a1.resource_version, "the watch reached a1 as it is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_watch_refuses_cursors_it_cannot_resume_from() {
    let data = DataDir::new();
    let gateway = Gateway::start(&data, &["--changes-kept", "4"]).await;
    let mut sandboxes = gateway.sandboxes().await;
    let old = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner().cursor;
    sandboxes.create_sandbox(labelled("a1", "a")).await.unwrap();
    wait_phase(&mut sandboxes, "a1", pb::Phase::Ready).await;
    lifecycle(&mut sandboxes, "stop", "a1").await.unwrap();
    wait_phase(&mut sandboxes, "a1", pb::Phase::Stopped).await;
    lifecycle(&mut sandboxes, "start", "a1").await.unwrap();
    wait_phase(&mut sandboxes, "a1", pb::Phase::Ready).await;

    let refused = watch(&mut sandboxes, "a", &old).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("list the sandboxes again"), "{}", refused.message());
    let (position, store) = old.split_once('.').unwrap();
    let elsewhere = watch(&mut sandboxes, "a", &format!("{position}.another-store")).await.unwrap_err();
    assert_eq!(elsewhere.code(), Code::FailedPrecondition, "{elsewhere:?}");
    assert!(elsewhere.message().contains("another store"), "{}", elsewhere.message());
    let ahead = watch(&mut sandboxes, "a", &format!("999999.{store}")).await.unwrap_err();
    assert_eq!(ahead.code(), Code::FailedPrecondition, "{ahead:?}");
    for bad in ["garbage", "x.y", "-1.z"] {
        let status = watch(&mut sandboxes, "a", bad).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}: {status:?}");
        assert!(status.message().contains("cursor"), "names the field: {}", status.message());
    }
    let request =
        pb::WatchSandboxesRequest { label_selector: [("Bad Key".into(), "v".into())].into(), cursor: String::new() };
    let status = sandboxes.watch_sandboxes(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("label_selector"), "{}", status.message());

    // From now (no cursor): a bookmark first, then what happens next.
    let mut events = watch(&mut sandboxes, "a", "").await.unwrap();
    let first = events.message().await.unwrap().unwrap();
    assert!(first.name.is_empty() && !first.cursor.is_empty(), "{first:?}");
    lifecycle(&mut sandboxes, "stop", "a1").await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut events, &mut seen, phase_is("a1", pb::Phase::Stopped)).await;
    assert!(seen.iter().all(|e| e.name == "a1"), "only changes after the watch began");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_watch_through_one_gateway_sees_the_writes_made_through_another() {
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = pg::fresh_schema("fleet_watch_two_gateways").await else { return };
    // One data directory, as gateways sharing a store on one host run: the lease holder's
    // process driver must see the runs the other gateway's started (with a directory each, it
    // finds them missing).
    let data = DataDir::new();
    let a = Gateway::start(&data, &["--store", &url, "--name", "a"]).await;
    let b = Gateway::start(&data, &["--store", &url, "--name", "b"]).await;
    let mut through_a = a.sandboxes().await;
    let mut through_b = b.sandboxes().await;
    let mut events = watch(&mut through_a, "a", "").await.unwrap();
    events.message().await.unwrap().unwrap();
    let mut seen = Vec::new();
    for i in 0..3 {
        through_b.create_sandbox(labelled(&format!("via-b-{i}"), "a")).await.unwrap();
    }
    // Ready in whatever order they get there.
    for _ in 0..3 {
        let waiting: Vec<String> =
            (0..3).map(|i| format!("via-b-{i}")).filter(|n| !seen.iter().any(|e| ready(n)(e))).collect();
        read_until(&mut events, &mut seen, move |e| waiting.iter().any(|n| ready(n)(e))).await;
    }
    lifecycle(&mut through_b, "delete", "via-b-1").await.unwrap();
    read_until(&mut events, &mut seen, removed("via-b-1")).await;
    let by_sandbox = versions(&seen);
    assert_whole(&by_sandbox, "via-b-0", 1, false);
    assert_whole(&by_sandbox, "via-b-1", 1, true);
}
