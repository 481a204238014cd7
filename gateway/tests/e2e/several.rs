//! Several gateways on one PostgreSQL database and one data directory, with the process driver:
//! every gateway serves both APIs, exactly one holds the reconcile lease, and when that one is
//! killed another takes the lease over within its time-to-live, supervisors move to a living
//! gateway, and every sandbox converges to its intent. The clients' histories, readers on every
//! gateway included, are checked for linearizability. Two gateways racing on one sandbox run on
//! every driver, from the conformance suite.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth_proto::v1 as pb;
use tonic::Code;

use crate::harness::*;
use crate::history::History;
use crate::pg;

const NAMES: [&str; 3] = ["g1", "g2", "g3"];
const LEASE_TTL: Duration = Duration::from_secs(2);
const TOOK_LEASE: &str = "took the reconcile lease";

fn holders(data: &DataDir) -> Vec<&'static str> {
    NAMES.into_iter().filter(|name| data.log_of(name).contains(TOOK_LEASE)).collect()
}

async fn wait_for_holder(data: &DataDir, among: &[&'static str]) -> &'static str {
    for _ in 0..200 {
        if let Some(name) = holders(data).into_iter().find(|name| among.contains(name)) {
            return name;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no gateway of {among:?} took the lease");
}

/// Waits until `name` settles in `target` (`None`: deleted), asking the gateway `via`.
async fn settle(history: &History, gateways: &[Gateway], via: usize, name: &str, target: Option<pb::Phase>) {
    let mut sandboxes = gateways[via].sandboxes().await;
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut last = None;
    while Instant::now() < deadline {
        match history.get(&mut sandboxes, name).await {
            Ok(s) if Some(phase(&s)) == target => return,
            Ok(s) => last = Some(phase(&s)),
            Err(status) if status.code() == Code::NotFound && target.is_none() => return,
            Err(status) => panic!("{name} via {}: {status:?}", NAMES[via]),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} did not reach {target:?} (last {last:?})");
}

/// Reads every sandbox through each gateway, over and over until `reading` turns false, so the
/// history sees every transition from every side.
async fn readers(
    history: &Arc<History>,
    gateways: &[Gateway],
    names: &[String],
    reading: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut readers = Vec::new();
    for gateway in gateways {
        let (history, reading, names) = (history.clone(), reading.clone(), names.to_vec());
        let mut sandboxes = gateway.sandboxes().await;
        readers.push(tokio::spawn(async move {
            while reading.load(Ordering::Relaxed) {
                for name in &names {
                    // A call the killed gateway never answers records nothing.
                    let _ = tokio::time::timeout(Duration::from_secs(2), history.get(&mut sandboxes, name)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    readers
}

async fn assert_linearizable(history: &History, readers: Vec<tokio::task::JoinHandle<()>>, reading: &AtomicBool) {
    reading.store(false, Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    let violations = history.violations();
    assert!(violations.is_empty(), "not linearizable ({} calls):\n{}", history.len(), violations.join("\n"));
    eprintln!("{} calls, linearizable", history.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_survive_the_lease_holder_killed_mid_workload() {
    let _server = crate::harness::POSTGRES_SERVER.read().await;
    let Some(url) = pg::fresh_schema("three_gateways").await else { return };
    let data = DataDir::new();
    let ttl = format!("{}ms", LEASE_TTL.as_millis());
    // All three at once on a fresh data directory: they agree on its secrets and its schema.
    let args: Vec<[&str; 6]> =
        NAMES.iter().map(|name| ["--store", &url, "--name", name, "--lease-ttl", &ttl]).collect();
    let (g1, g2, g3) =
        tokio::join!(Gateway::start(&data, &args[0]), Gateway::start(&data, &args[1]), Gateway::start(&data, &args[2]));
    let mut gateways = vec![g1, g2, g3];
    let first = wait_for_holder(&data, &NAMES).await;
    assert_eq!(holders(&data), vec![first], "one holder at a time");
    let holder = NAMES.iter().position(|n| *n == first).unwrap();

    // A mixed workload, its requests spread over the three gateways: creates, then at once
    // stops and deletes of some, with the holder killed while their effects are under way.
    let names: Vec<String> = (0..9).map(|i| format!("box-{i}")).collect();
    let history = Arc::new(History::default());
    let mut ids = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut sandboxes = gateways[i % 3].sandboxes().await;
        ids.push(history.create(&mut sandboxes, name, spec(&["sleep", "3600"])).await.id);
    }
    let reading = Arc::new(AtomicBool::new(true));
    let readers = readers(&history, &gateways, &names, &reading).await;
    // The sandboxes that stay running are Ready before the kill: their supervisors hold sessions.
    for name in &names[6..] {
        settle(&history, &gateways, 0, name, Some(pb::Phase::Ready)).await;
    }
    for (i, name) in names.iter().enumerate().take(6) {
        let mut sandboxes = gateways[(i + 1) % 3].sandboxes().await;
        let verb = if i < 3 { "stop" } else { "delete" };
        // A stop may meet Provisioning: it is accepted in every phase but Deleting.
        history.lifecycle(&mut sandboxes, verb, name).await.unwrap_or_else(|s| panic!("{verb} {name}: {s:?}"));
    }
    let killed = Instant::now();
    gateways[holder].kill9();
    let survivors: Vec<&'static str> = NAMES.iter().copied().filter(|n| *n != first).collect();
    let next = wait_for_holder(&data, &survivors).await;
    let takeover = killed.elapsed();
    // It lapses one time-to-live after the last renewal at most; give the renewal cadence and a
    // loaded machine some room, but not another whole time-to-live.
    assert!(takeover < LEASE_TTL * 2 + Duration::from_secs(1), "{next} took the lease {takeover:?} after the kill");
    eprintln!("{next} took the lease over {takeover:?} after {first} was killed");

    // Every acknowledged operation holds and every sandbox converges, seen through both survivors.
    let alive: Vec<usize> = (0..3).filter(|i| *i != holder).collect();
    for (i, name) in names.iter().enumerate() {
        let target = match i {
            0..3 => Some(pb::Phase::Stopped),
            3..6 => None,
            _ => Some(pb::Phase::Ready),
        };
        for via in &alive {
            settle(&history, &gateways, *via, name, target).await;
        }
    }
    // No transition left unfinished, and the two survivors answer the same.
    let mut views = Vec::new();
    for via in &alive {
        let mut sandboxes = gateways[*via].sandboxes().await;
        let all = sandboxes.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner().sandboxes;
        views.push(all.iter().map(|s| (s.name.clone(), phase(s), s.resource_version)).collect::<Vec<_>>());
    }
    assert_eq!(views[0], views[1]);
    assert_eq!(views[0].len(), 6);

    // Supervisors whose session was with the killed gateway found a survivor.
    let connected = |log: &str, id: &str| log.contains(&format!("supervisor connected sandbox={id}"));
    for id in &ids[6..] {
        if connected(&data.log_of(first), id) {
            let moved = survivors.iter().any(|name| connected(&data.log_of(name), id));
            assert!(moved, "{id}'s supervisor did not reconnect to {survivors:?}");
        }
    }
    // A start through a survivor brings a stopped sandbox to Ready again.
    let mut sandboxes = gateways[alive[0]].sandboxes().await;
    history.lifecycle(&mut sandboxes, "start", "box-0").await.unwrap();
    settle(&history, &gateways, alive[1], "box-0", Some(pb::Phase::Ready)).await;
    for name in names.iter().take(3).chain(names.iter().skip(6)) {
        history.lifecycle(&mut sandboxes, "delete", name).await.unwrap();
    }
    for name in names.iter().take(3).chain(names.iter().skip(6)) {
        settle(&history, &gateways, alive[1], name, None).await;
    }
    assert_linearizable(&history, readers, &reading).await;
}

/// Two gateways on the database `url` and the data directory `data` (with `driver_args`)
/// racing to stop, start and delete one sandbox of `image`: they get only what the contract
/// allows, and their clients' histories are linearizable. Run on every driver by the
/// conformance suite.
pub async fn race_on_one_sandbox(data: &DataDir, url: &str, driver_args: &[String], image: &str) {
    let ttl = format!("{}ms", LEASE_TTL.as_millis());
    let mut gateways = Vec::new();
    for name in &NAMES[..2] {
        let mut args: Vec<&str> = driver_args.iter().map(String::as_str).collect();
        args.extend(["--store", url, "--name", name, "--lease-ttl", &ttl]);
        gateways.push(Gateway::start(data, &args).await);
    }
    let (mut one, mut two) = (gateways[0].sandboxes().await, gateways[1].sandboxes().await);
    let history = Arc::new(History::default());
    history.create(&mut one, "raced", pb::SandboxSpec { image: image.into(), ..spec(&["sleep", "3600"]) }).await;
    let reading = Arc::new(AtomicBool::new(true));
    let readers = readers(&history, &gateways, &["raced".to_string()], &reading).await;
    settle(&history, &gateways, 1, "raced", Some(pb::Phase::Ready)).await;
    for round in 0..5 {
        // Two stops at once: both succeed (the later one finds it stopping), one stop.
        let generation = history.get(&mut one, "raced").await.unwrap().generation;
        let (a, b) =
            tokio::join!(history.lifecycle(&mut one, "stop", "raced"), history.lifecycle(&mut two, "stop", "raced"));
        assert!(a.is_ok() && b.is_ok(), "round {round}: {a:?} {b:?}");
        settle(&history, &gateways, 0, "raced", Some(pb::Phase::Stopped)).await;
        assert_eq!(history.get(&mut two, "raced").await.unwrap().generation, generation, "a stop makes no generation");
        // Two starts at once: both succeed, and they make exactly one new generation.
        let (a, b) =
            tokio::join!(history.lifecycle(&mut one, "start", "raced"), history.lifecycle(&mut two, "start", "raced"));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!((a.generation, b.generation), (generation + 1, generation + 1), "round {round}");
        settle(&history, &gateways, 1, "raced", Some(pb::Phase::Ready)).await;
        assert_eq!(history.get(&mut one, "raced").await.unwrap().generation, generation + 1);
    }
    // Two deletes at once: each succeeds or finds it already gone, never anything else.
    let (a, b) =
        tokio::join!(history.lifecycle(&mut one, "delete", "raced"), history.lifecycle(&mut two, "delete", "raced"));
    for reply in [&a, &b] {
        assert!(reply.as_ref().err().is_none_or(|s| s.code() == Code::NotFound), "{a:?} {b:?}");
    }
    assert!(a.is_ok() || b.is_ok(), "one of them deleted it: {a:?} {b:?}");
    settle(&history, &gateways, 0, "raced", None).await;
    assert_linearizable(&history, readers, &reading).await;
}
