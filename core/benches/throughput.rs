//! berth-core throughput: observation merges, command decisions and placements per second.
//! Criterion prints each as elements per second ("thrpt").

use std::collections::BTreeMap;
use std::hint::black_box;

use berth_core::limits::ResourceLimits;
use berth_core::placement::{Capacity, Node, place};
use berth_core::{
    Command, ExitFence, ExitMarker, Intent, MainProcess, Observation, Phase, Provider, Reads, Request, Run,
    RuntimeSource, RuntimeState, Sandbox, SandboxId, SandboxSpec, Secret, StartReply, Timestamp, decide, merge,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn t(n: i64) -> Timestamp {
    Timestamp::from_unix_nanos(n)
}

fn sandbox(i: usize, phase: Phase, intent: Intent, run: Run) -> Sandbox {
    let fence = ExitMarker { started_at: t(50), finished_at: t(100), exit_code: 143, out_of_memory: false };
    let spec = SandboxSpec {
        image: "berth/sandbox:1".into(),
        command: vec!["sleep".into(), "infinity".into()],
        env: [("HOME".to_string(), "/workspace".to_string())].into(),
        labels: [("team".to_string(), "platform".to_string())].into(),
        ..SandboxSpec::default()
    };
    Sandbox {
        providers: std::sync::Arc::new(["openai".to_string()].into()),
        intent,
        phase,
        resource_version: 12,
        generation: 3,
        exit_fence: ExitFence { marker: Some(fence), settled: true },
        run,
        last_exit: Some(fence),
        updated_at: t(2),
        ..Sandbox::new(SandboxId::new(format!("sb-{i:08}")), &format!("box-{i}"), spec, t(1))
    }
}

/// The observations a reconcile loop merges most: stale snapshots inside a start, fresh exits,
/// steady-state polls, supervisor connects, driver replies.
fn merges() -> Vec<(Sandbox, Observation)> {
    let poll = |state| Observation::Runtime { source: RuntimeSource::PollList, state, as_of_version: Some(12) };
    let stale = ExitMarker { started_at: t(50), finished_at: t(100), exit_code: 143, out_of_memory: false };
    let fresh = ExitMarker { started_at: t(200), finished_at: t(300), exit_code: 3, out_of_memory: false };
    (0..1000)
        .map(|i| match i % 5 {
            0 => (sandbox(i, Phase::Starting, Intent::Running, Run::Pending), poll(RuntimeState::Exited(stale))),
            1 => (
                sandbox(i, Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) }),
                poll(RuntimeState::Running { started_at: t(200), held: None }),
            ),
            2 => (
                sandbox(i, Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) }),
                poll(RuntimeState::Exited(fresh)),
            ),
            3 => (
                sandbox(i, Phase::Starting, Intent::Running, Run::Pending),
                Observation::SupervisorConnected { generation: 3, main: MainProcess::Running },
            ),
            _ => (
                sandbox(i, Phase::Starting, Intent::Running, Run::Pending),
                Observation::Started { generation: 3, reply: StartReply::Running { started_at: t(200) } },
            ),
        })
        .collect()
}

fn decisions() -> Vec<(Request, Reads)> {
    let provider = Provider {
        endpoints: Default::default(),
        name: "anthropic".into(),
        kind: "llm".into(),
        credentials: [("ANTHROPIC_API_KEY".to_string(), Secret::new("k"))].into(),
        resource_version: 4,
        created_at: t(1),
        updated_at: t(1),
    };
    (0..1000)
        .map(|i| {
            let name = format!("box-{i}");
            let (command, phase, intent, run) = match i % 4 {
                0 => (Command::StopSandbox { name }, Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) }),
                1 => (
                    Command::StartSandbox { name },
                    Phase::Stopped,
                    Intent::Stopped,
                    Run::Ended(ExitMarker {
                        started_at: t(200),
                        finished_at: t(300),
                        exit_code: 143,
                        out_of_memory: false,
                    }),
                ),
                2 => {
                    (Command::DeleteSandbox { name }, Phase::Ready, Intent::Running, Run::Started { at: Some(t(200)) })
                }
                _ => (
                    Command::AttachProvider { sandbox: name, provider: "anthropic".into() },
                    Phase::Ready,
                    Intent::Running,
                    Run::Started { at: Some(t(200)) },
                ),
            };
            let reads = Reads {
                sandbox: Some(sandbox(i, phase, intent, run)),
                providers: BTreeMap::from([("anthropic".to_string(), provider.clone())]),
                users: vec![],
                ..Reads::default()
            };
            (Request::new(command, None), reads)
        })
        .collect()
}

/// A sandbox to place: its limits and node selector.
type Wanted = (ResourceLimits, BTreeMap<String, String>, berth_core::SandboxId);

/// A hundred nodes (a few lapsed, a few draining, two zones, loads of every kind), and a
/// thousand sandboxes to place on them.
fn placements() -> (Vec<Node>, Vec<Wanted>) {
    const GIB: u64 = 1 << 30;
    let nodes = (0..100u64)
        .map(|i| Node {
            id: berth_core::NodeId::new(format!("node-{i:03}")),
            epoch: i + 1,
            live: i % 17 != 0,
            draining: i % 23 == 0,
            labels: BTreeMap::from([("zone".to_string(), if i % 2 == 0 { "east" } else { "west" }.to_string())]),
            capacity: Capacity { cpu_millis: 16_000, memory_bytes: 64 * GIB, sandboxes: 200 },
            placed: Capacity { cpu_millis: (i * 137) % 16_000, memory_bytes: (i * 7 % 64) * GIB, sandboxes: i % 200 },
        })
        .collect();
    let sandboxes = (0..1000u64)
        .map(|i| {
            let limits = ResourceLimits {
                cpu_millis: (i % 3 != 0).then_some(250 * (1 + i % 8)),
                memory_bytes: (i % 5 != 0).then_some((1 + i % 4) * GIB),
                pids: None,
            };
            let selector = match i % 4 {
                0 => BTreeMap::from([("zone".to_string(), "east".to_string())]),
                _ => BTreeMap::new(),
            };
            (limits, selector, berth_core::SandboxId::new(format!("sb-{i:04x}")))
        })
        .collect();
    (nodes, sandboxes)
}

fn throughput(c: &mut Criterion) {
    let now = t(1_000);
    let merges = merges();
    let mut group = c.benchmark_group("core");
    group.throughput(Throughput::Elements(merges.len() as u64));
    group.bench_function("observation merges", |b| {
        b.iter(|| {
            for (record, observation) in &merges {
                black_box(merge(Some(record), &record.id, observation, now).ok());
            }
        })
    });
    let decisions = decisions();
    group.throughput(Throughput::Elements(decisions.len() as u64));
    group.bench_function("command decisions", |b| {
        b.iter(|| {
            for (request, reads) in &decisions {
                black_box(decide(request, reads, now).ok());
            }
        })
    });
    let (nodes, sandboxes) = placements();
    group.throughput(Throughput::Elements(sandboxes.len() as u64));
    group.bench_function("placements over 100 nodes", |b| {
        b.iter(|| {
            for (limits, selector, id) in &sandboxes {
                black_box(place(&nodes, limits, selector, id).ok());
            }
        })
    });
    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
