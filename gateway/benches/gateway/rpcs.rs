//! Lifecycle RPCs: create-stop-start-stop-delete cycles on SQLite, then on PostgreSQL with one
//! gateway and with three, and the node lease's takeover after its holder is killed.

use super::*;

/// `clients` clients, spread over one gateway per store of `stores`, each running
/// `cycles_per_client` create-stop-start-stop-delete cycles, timed once every client has run
/// `WARM_CYCLES` untimed: the figures are of gateways in their steady state, whose store
/// connections are open and whose statements are prepared. (Cold, three gateways opened three
/// times the connections inside the timed run, and prepared every statement on each.)
pub(crate) async fn rpc_load(
    stores: Vec<Arc<dyn Store>>,
    clients: usize,
    cycles_per_client: usize,
) -> (f64, Duration, Duration, usize) {
    const WARM_CYCLES: usize = 2;
    let driver = Arc::new(NoopDriver::default());
    let mut addresses = Vec::new();
    for (n, store) in (0..).zip(stores) {
        addresses.push(serve(&engine_on(store, Arc::clone(&driver), n).await).await);
    }
    let warm = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let address = addresses[c % addresses.len()].clone();
        let warm = Arc::clone(&warm);
        tasks.push(tokio::spawn(async move {
            let mut client = client(address, Wire::Nodelay, None).await;
            for i in 0..WARM_CYCLES {
                cycle(&mut client, &format!("warm-c{c}-s{i}")).await;
            }
            warm.wait().await;
            let mut latencies = Vec::with_capacity(cycles_per_client * 5);
            for i in 0..cycles_per_client {
                latencies.extend(cycle(&mut client, &format!("c{c}-s{i}")).await);
            }
            latencies
        }));
    }
    warm.wait().await;
    latency_figures(tasks, Instant::now()).await
}

/// Seconds from SIGKILL of the node lease's holder (one of two gateway processes on PostgreSQL
/// sharing a data directory, so one node) to the other's first reconcile sweep.
pub(crate) async fn takeover(url: &str) -> Duration {
    const TTL: &str = "2s";
    let data = tempfile::tempdir().unwrap();
    let log = |name: &str| std::fs::read_to_string(data.path().join(format!("{name}.log"))).unwrap_or_default();
    let mut gateways: Vec<(&str, std::process::Child)> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let child = std::process::Command::new(env!("CARGO_BIN_EXE_berth-gateway"))
                .args(["--data-dir", data.path().to_str().unwrap(), "--listen", "127.0.0.1:0", "--store", url])
                .args(["--name", name, "--lease-ttl", TTL, "--poll-interval", "100ms", "--supervisor-bin", "/bin/true"])
                .args(["--log", "info,berth_gateway::reconcile=debug"])
                .stderr(std::fs::File::create(data.path().join(format!("{name}.log"))).unwrap())
                .spawn()
                .unwrap();
            (name, child)
        })
        .collect();
    // The node's lease: its holder reconciles the node's runtime.
    let took = "took node ";
    let deadline = Instant::now() + Duration::from_secs(60);
    let holder = loop {
        assert!(Instant::now() < deadline, "no gateway took the lease:\n{}\n{}", log("a"), log("b"));
        if let Some(i) = gateways.iter().position(|(name, _)| log(name).contains(took)) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (_, mut killed) = gateways.remove(holder);
    let (other, _) = gateways[0];
    let killed_at = Instant::now();
    killed.kill().unwrap();
    killed.wait().unwrap();
    let elapsed = loop {
        let text = log(other);
        assert!(Instant::now() < deadline + Duration::from_secs(60), "{other} never swept:\n{text}");
        if text.find(took).is_some_and(|at| text[at..].contains("reconcile sweep")) {
            break killed_at.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    for (_, child) in &mut gateways {
        let _ = child.kill();
        let _ = child.wait();
    }
    elapsed
}

pub(crate) fn lifecycle(runtime: &tokio::runtime::Runtime, quick: bool) {
    println!("gateway lifecycle RPCs (gRPC over loopback TCP, SQLite, no-op driver)");
    println!("{:>8} {:>10} {:>12} {:>12} {:>12}", "clients", "rpcs", "rpc/s", "p50", "p99");
    // Each row runs for a second or so: rows a fraction of a second long moved by a quarter from
    // one run to the next here.
    let loads = if quick { vec![(1, 2), (4, 2)] } else { vec![(1, 400), (16, 100), (64, 64)] };
    for (clients, cycles) in loads {
        let dir = tempfile::tempdir().unwrap();
        let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("berth.db")).unwrap());
        let (rate, p50, p99, n) = runtime.block_on(rpc_load(vec![sqlite], clients, cycles));
        println!("{clients:>8} {n:>10} {rate:>12.0} {:>12?} {:>12?}", p50, p99);
        figure(&format!("gateway lifecycle RPCs, {clients} clients"), rate, "rpc/s");
        figure(&format!("gateway RPC p50, {clients} clients"), p50.as_secs_f64() * 1e3, "ms");
        figure(&format!("gateway RPC p99, {clients} clients"), p99.as_secs_f64() * 1e3, "ms");
    }
    println!();
}

pub(crate) fn postgres(runtime: &tokio::runtime::Runtime, quick: bool) {
    match std::env::var("BERTH_TEST_POSTGRES_URL") {
        Err(_) => println!("PostgreSQL: skipped (set BERTH_TEST_POSTGRES_URL; ci/bench does)"),
        Ok(_) => {
            let (clients, cycles) = if quick { (4, 2) } else { (64, 64) };
            println!("{clients} clients on PostgreSQL (gRPC over loopback TCP, no-op driver)");
            println!(
                "{:>9} {:>12} {:>10} {:>12} {:>12} {:>12}",
                "gateways", "connections", "rpcs", "rpc/s", "p50", "p99"
            );
            let default = berth_gateway::store::postgres::CONNECTIONS;
            // Three gateways with the default pool each hold three times the server processes;
            // with three connections each they hold about one gateway's.
            for (gateways, connections) in [(1, default), (3, default), (3, 3)] {
                let (rate, p50, p99, n) = runtime.block_on(async {
                    let url = pg::fresh_schema(&format!("bench_{gateways}_gateways_{connections}")).await.unwrap();
                    let settings = berth_gateway::store::postgres::Settings { connections, ..Default::default() };
                    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
                    for _ in 0..gateways {
                        stores.push(Arc::new(PostgresStore::connect_with(&url, settings.clone()).await.unwrap()));
                    }
                    rpc_load(stores, clients, cycles).await
                });
                println!("{gateways:>9} {connections:>12} {n:>10} {rate:>12.0} {:>12?} {:>12?}", p50, p99);
                let each =
                    if connections == default { String::new() } else { format!(", {connections} connections each") };
                let label = format!("{clients} clients, {gateways} gateway(s) on PostgreSQL{each}");
                figure(&format!("lifecycle RPCs, {label}"), rate, "rpc/s");
                figure(&format!("RPC p50, {label}"), p50.as_secs_f64() * 1e3, "ms");
                figure(&format!("RPC p99, {label}"), p99.as_secs_f64() * 1e3, "ms");
            }
            let took = runtime.block_on(async {
                let url = pg::fresh_schema("bench_takeover").await.unwrap();
                takeover(&url).await
            });
            println!("lease holder killed -> another gateway's first sweep: {took:?} (lease time-to-live 2s)");
            figure("node lease takeover to first sweep, ttl 2s", took.as_secs_f64() * 1e3, "ms");
        }
    }
    println!();
}
