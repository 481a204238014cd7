//! Reads (GetSandbox, ListSandboxes) to clients that delay their ACKs, with Nagle's algorithm on
//! and off in the client, and the gateway's CPU time per call.

use super::*;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Read {
    Get,
    List,
}

/// How many sandboxes the read load's gateway holds: a ListSandboxes reply has them all.
pub(crate) const READ_FLEET: usize = 16;

/// The name of the gateway's threads in the read benchmark: its runtime's workers and blocking
/// pool (the store's reads), apart from the clients'.
pub(crate) const GATEWAY_THREADS: &str = "bench-gateway";

/// CPU time the gateway's threads have had: its runtime's and the SQLite store's writer's
/// (`schedstat`'s nanoseconds on a CPU, per thread).
pub(crate) fn gateway_cpu() -> Duration {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with(GATEWAY_THREADS) || comm.starts_with("berth-sqlite") {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            nanos += stat.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Duration::from_nanos(nanos)
}

/// `clients` clients each making `calls` reads of one kind against a gateway holding
/// [`READ_FLEET`] sandboxes, speaking as `wire` says. Rate, p50, p99, calls, the reply's size
/// in bytes, and the gateway's CPU time per call.
pub(crate) async fn read_load(
    read: Read,
    wire: Wire,
    clients: usize,
    calls: usize,
) -> (f64, Duration, Duration, usize, usize, Duration) {
    let dir = tempfile::tempdir().unwrap();
    // The gateway on threads of its own, so that its CPU time is told apart from the clients'.
    let gateway = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(GATEWAY_THREADS)
        .enable_all()
        .build()
        .unwrap();
    let engine = engine(dir.path()).await;
    let tls = Arc::new((wire == Wire::Tls).then(BenchTls::new));
    let served = Arc::clone(&tls);
    let address = gateway.spawn(async move { serve_over(&engine, served.as_ref().as_ref()).await }).await.unwrap();
    let mut setup = client(address.clone(), wire, tls.as_ref().as_ref()).await;
    // Labels make a GetSandbox reply (about 280 bytes) large enough to be written in more than
    // one segment.
    let labels: BTreeMap<String, String> = (0..3).map(|i| (format!("note-{i}"), "n".repeat(50))).collect();
    for i in 0..READ_FLEET {
        let spec = pb::SandboxSpec {
            image: "i".into(),
            command: vec!["sleep".into(), "infinity".into()],
            labels: labels.clone(),
            ..Default::default()
        };
        let request = pb::CreateSandboxRequest { name: format!("s{i:02}"), spec: Some(spec), ..Default::default() };
        setup.create_sandbox(request).await.unwrap();
    }
    let size = match read {
        Read::Get => {
            let reply = setup.get_sandbox(pb::GetSandboxRequest { name: "s00".into() }).await.unwrap();
            prost::Message::encoded_len(&reply.into_inner())
        }
        Read::List => {
            let reply = setup.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap().into_inner();
            assert_eq!(reply.sandboxes.len(), READ_FLEET);
            prost::Message::encoded_len(&reply)
        }
    };
    let mut connected = Vec::new();
    for _ in 0..clients {
        connected.push(client(address.clone(), wire, tls.as_ref().as_ref()).await);
    }
    let cpu = gateway_cpu();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut client) in connected.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(calls);
            for i in 0..calls {
                let t = Instant::now();
                match read {
                    Read::Get => {
                        let name = format!("s{:02}", (c + i) % READ_FLEET);
                        client.get_sandbox(pb::GetSandboxRequest { name }).await.unwrap();
                    }
                    Read::List => {
                        client.list_sandboxes(pb::ListSandboxesRequest::default()).await.unwrap();
                    }
                }
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let (rate, p50, p99, calls) = latency_figures(tasks, started).await;
    let cpu = (gateway_cpu() - cpu) / calls as u32;
    gateway.shutdown_background();
    (rate, p50, p99, calls, size, cpu)
}

pub(crate) fn reads(runtime: &tokio::runtime::Runtime, quick: bool) {
    println!("reads to clients that delay ACKs (gRPC over loopback TCP, SQLite, {READ_FLEET} sandboxes)");
    println!(
        "{:>14} {:>8} {:>14} {:>8} {:>10} {:>12} {:>12} {:>12} {:>14}",
        "rpc", "bytes", "client", "clients", "rpcs", "rpc/s", "p50", "p99", "gateway CPU"
    );
    // A second or more per row, as for the lifecycle rows.
    let reads = if quick { vec![(1, 20), (4, 20)] } else { vec![(1, 10_000), (16, 2_000)] };
    for read in [Read::Get, Read::List] {
        for wire in [Wire::Nodelay, Wire::Nagle, Wire::Tls] {
            for &(clients, calls) in &reads {
                let (rate, p50, p99, n, size, cpu) = runtime.block_on(read_load(read, wire, clients, calls));
                let rpc = match read {
                    Read::Get => "GetSandbox",
                    Read::List => "ListSandboxes",
                };
                let kind = match wire {
                    Wire::Nodelay => "nodelay",
                    Wire::Nagle => "no nodelay",
                    Wire::Tls => "TLS",
                };
                println!(
                    "{rpc:>14} {size:>8} {kind:>14} {clients:>8} {n:>10} {rate:>12.0} {:>12?} {:>12?} {:>14?}",
                    p50, p99, cpu
                );
                let what = match read {
                    Read::Get => "GetSandbox".to_string(),
                    Read::List => format!("ListSandboxes of {READ_FLEET}"),
                };
                // The rows of the clients that set nodelay keep the names earlier reports used.
                let label = match wire {
                    Wire::Nodelay => format!("{what}, {clients} clients"),
                    Wire::Nagle => format!("{what}, {clients} clients without nodelay"),
                    Wire::Tls => format!("{what}, {clients} clients over TLS"),
                };
                figure(&label, rate, "rpc/s");
                figure(&format!("{label}, p50"), p50.as_secs_f64() * 1e3, "ms");
                figure(&format!("{label}, p99"), p99.as_secs_f64() * 1e3, "ms");
                figure(&format!("gateway CPU per call, {label}"), cpu.as_secs_f64() * 1e3, "ms");
            }
        }
    }
    println!();
}
