//! Gateway throughput. Prints lifecycle RPCs per second with p50/p99 latency at 1, 16 and 64
//! concurrent clients (real gRPC over loopback TCP, the SQLite store on disk, a no-op driver);
//! 64 clients again on PostgreSQL, with one gateway and with three sharing the database (when
//! `BERTH_TEST_POSTGRES_URL` names one: `ci/bench` starts it); the time from killing the
//! reconcile lease's holder (real gateway processes) to another gateway's first reconcile
//! sweep; the time of one reconcile sweep over 1,000 and 10,000 sandboxes; and reads
//! (GetSandbox, ListSandboxes of 16) whose replies the server writes in several segments, to
//! clients that delay their ACKs, as Linux does, with Nagle's algorithm off in the client and
//! on; and connections through the egress proxy (the supervisor's listener code, the gateway's
//! proxy over its Unix socket) beside direct ones to a local server: the time to a first byte,
//! a round trip on an open connection, and bulk throughput. It asserts nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::identity::IdentityKey;
use berth_core::lifetime::Lifetime;
use berth_core::{Command, Request, RuntimeState, SandboxId, SandboxSpec, StartReply, Timestamp};
use berth_drivers::{Driver, DriverError, Launch, ListPage, WatchStream};
use berth_gateway::engine::{Engine, EngineSettings};
use berth_gateway::reconcile::{ReconcileSettings, sweep};
use berth_gateway::store::postgres::PostgresStore;
use berth_gateway::store::sqlite::SqliteStore;
use berth_gateway::store::{PageRequest, Store};
use berth_gateway::timers::Schedule;
use berth_proto::v1 as pb;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use tonic::metadata::MetadataValue;

/// Answers at once, as if every runtime call succeeded: the gateway's own cost is measured.
#[derive(Default)]
struct NoopDriver {
    states: Mutex<BTreeMap<SandboxId, RuntimeState>>,
    clock: Mutex<i64>,
}

impl NoopDriver {
    fn tick(&self) -> Timestamp {
        let mut c = self.clock.lock().unwrap();
        *c += 1;
        Timestamp::from_unix_nanos(*c)
    }
}

#[async_trait]
impl Driver for NoopDriver {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn admit(&self, _: &berth_core::SandboxSpec) -> Result<(), berth_core::Error> {
        Ok(())
    }
    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        let started_at = self.tick();
        self.states.lock().unwrap().insert(launch.sandbox, RuntimeState::Running { started_at });
        Ok(StartReply::Running { started_at })
    }
    async fn stop(&self, sandbox: &SandboxId, _: u64, _: Duration) -> Result<RuntimeState, DriverError> {
        let finished_at = self.tick();
        let mut states = self.states.lock().unwrap();
        let state = match states.get(sandbox) {
            Some(RuntimeState::Running { started_at }) => RuntimeState::Exited(berth_core::ExitMarker {
                started_at: *started_at,
                finished_at,
                exit_code: 143,
                out_of_memory: false,
            }),
            Some(other) => *other,
            None => RuntimeState::Absent { at: None },
        };
        states.insert(sandbox.clone(), state);
        Ok(state)
    }
    async fn delete(&self, sandbox: &SandboxId, _: Duration) -> Result<(), DriverError> {
        self.states.lock().unwrap().remove(sandbox);
        Ok(())
    }
    async fn get(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        Ok(self.states.lock().unwrap().get(sandbox).copied().unwrap_or(RuntimeState::Absent { at: None }))
    }
    async fn list(&self, after: Option<&SandboxId>, limit: usize) -> Result<ListPage, DriverError> {
        let states = self.states.lock().unwrap();
        let mut items: Vec<_> = states
            .iter()
            .filter(|(id, _)| after.is_none_or(|a| *id > a))
            .take(limit + 1)
            .map(|(i, s)| (i.clone(), *s))
            .collect();
        let next = (items.len() > limit).then(|| {
            items.truncate(limit);
            items.last().unwrap().0.clone()
        });
        Ok(ListPage { items, next })
    }
    async fn workspace(&self, _: &SandboxId) -> Result<std::path::PathBuf, DriverError> {
        Err(DriverError::Failed("this driver keeps no workspace".into()))
    }

    async fn logs(
        &self,
        _: &SandboxId,
        _: &berth_drivers::logs::Log,
        from: u64,
        _: usize,
        _: bool,
    ) -> Result<berth_drivers::logs::Read, DriverError> {
        Ok(berth_drivers::logs::Read::End { offset: from, exit_code: None })
    }

    async fn watch(&self) -> Result<WatchStream, DriverError> {
        Ok(Box::pin(futures_util::stream::pending()))
    }
}

#[path = "../tests/support/postgres.rs"]
mod pg;

/// Gateway `n`'s engine on `store`; gateways sharing a store share one runtime too. Each has
/// its own seed, as each server draws one: gateways with one seed would make the same sandbox
/// ids, and their creates would conflict.
fn engine_on(store: Arc<dyn Store>, driver: Arc<NoopDriver>, n: u64) -> Engine {
    Engine::new(store, driver, IdentityKey::from_bytes([7; 32]), EngineSettings::default(), n)
}

fn engine(dir: &std::path::Path) -> Engine {
    engine_on(Arc::new(SqliteStore::open(&dir.join("berth.db")).unwrap()), Arc::default(), 0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Serves `engine`'s API on a loopback port; its address.
/// Calls per second since `started`, p50, p99 and the number of calls, of every client task's
/// latencies.
async fn latency_figures(
    tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
    started: Instant,
) -> (f64, Duration, Duration, usize) {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort();
    (all.len() as f64 / elapsed.as_secs_f64(), percentile(&all, 0.5), percentile(&all, 0.99), all.len())
}

async fn serve(engine: &Engine) -> String {
    let (routes, _) = berth_gateway::api::routes(engine, "bench-token-0123456789", Duration::from_secs(5)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(berth_gateway::tcp::incoming(listener)),
    );
    address
}

/// A client of the public API at `address`. Its kernel delays ACKs, as Linux does for any
/// client: a reply the server holds back until its previous segment is acknowledged (Nagle's
/// algorithm) then waits about 40 ms. With `nagle`, the client leaves Nagle's algorithm on for
/// its own requests, as many HTTP/2 stacks do: a request's data frame, written after its
/// headers, then waits for the server's ACK of the headers.
async fn client(address: String, nagle: bool) -> Client {
    let channel =
        tonic::transport::Endpoint::from_shared(address).unwrap().tcp_nodelay(!nagle).connect().await.unwrap();
    SandboxesClient::with_interceptor(channel, Auth("Bearer bench-token-0123456789".parse().unwrap()))
}

type Client = SandboxesClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Auth>>;

/// Sends the bench's token with every call.
#[derive(Clone)]
struct Auth(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

/// One create-stop-start-stop-delete cycle of sandbox `name` by `client`: each call's latency.
async fn cycle(client: &mut Client, name: &str) -> Vec<Duration> {
    let lifecycle = |name: &str| pb::LifecycleRequest { name: name.to_string(), expected_resource_version: None };
    let mut latencies = Vec::with_capacity(5);
    let t = Instant::now();
    let spec = pb::SandboxSpec { image: "i".into(), command: vec!["true".into()], ..Default::default() };
    let create = pb::CreateSandboxRequest { name: name.to_string(), spec: Some(spec), ..Default::default() };
    client.create_sandbox(create).await.unwrap();
    latencies.push(t.elapsed());
    for verb in ["stop", "start", "stop", "delete"] {
        let t = Instant::now();
        let result = match verb {
            "stop" => client.stop_sandbox(lifecycle(name)).await,
            "start" => client.start_sandbox(lifecycle(name)).await,
            _ => client.delete_sandbox(lifecycle(name)).await,
        };
        // A start may find the previous stop not finished yet: refused, and counted.
        if let Err(s) = result {
            assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s}");
        }
        latencies.push(t.elapsed());
    }
    latencies
}

/// `clients` clients, spread over one gateway per store of `stores`, each running
/// `cycles_per_client` create-stop-start-stop-delete cycles, timed once every client has run
/// `WARM_CYCLES` untimed: the figures are of gateways in their steady state, whose store
/// connections are open and whose statements are prepared. (Cold, three gateways opened three
/// times the connections inside the timed run, and prepared every statement on each.)
async fn rpc_load(
    stores: Vec<Arc<dyn Store>>,
    clients: usize,
    cycles_per_client: usize,
) -> (f64, Duration, Duration, usize) {
    const WARM_CYCLES: usize = 2;
    let driver = Arc::new(NoopDriver::default());
    let mut addresses = Vec::new();
    for (n, store) in (0..).zip(stores) {
        addresses.push(serve(&engine_on(store, Arc::clone(&driver), n)).await);
    }
    let warm = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let address = addresses[c % addresses.len()].clone();
        let warm = Arc::clone(&warm);
        tasks.push(tokio::spawn(async move {
            let mut client = client(address, false).await;
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

#[derive(Clone, Copy, Debug)]
enum Read {
    Get,
    List,
}

/// How many sandboxes the read load's gateway holds: a ListSandboxes reply has them all.
const READ_FLEET: usize = 16;

/// The name of the gateway's threads in the read benchmark: its runtime's workers and blocking
/// pool (the store's reads), apart from the clients'.
const GATEWAY_THREADS: &str = "bench-gateway";

/// CPU time the gateway's threads have had: its runtime's and the SQLite store's writer's
/// (`schedstat`'s nanoseconds on a CPU, per thread).
fn gateway_cpu() -> Duration {
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
/// [`READ_FLEET`] sandboxes, with Nagle's algorithm on in the clients or not. Rate, p50, p99,
/// calls, the reply's size in bytes, and the gateway's CPU time per call.
async fn read_load(
    read: Read,
    nagle: bool,
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
    let engine = engine(dir.path());
    let address = gateway.spawn(async move { serve(&engine).await }).await.unwrap();
    let mut setup = client(address.clone(), false).await;
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
        connected.push(client(address.clone(), nagle).await);
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

async fn sweep_time(sandboxes: usize) -> (Duration, usize) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let spec = SandboxSpec { image: "i".into(), command: vec!["true".into()], ..Default::default() };
    for i in 0..sandboxes {
        let command = Command::CreateSandbox {
            id: engine.new_sandbox_id(),
            name: format!("s{i:05}"),
            spec: spec.clone(),
            providers: Default::default(),
            deadline: None,
        };
        engine.execute(&Request::new(command, None)).await.unwrap();
    }
    // Let every start effect land, so the sweep sees a settled fleet.
    while engine.busy() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settings = ReconcileSettings::default();
    sweep(&engine, &settings).await.unwrap();
    let started = Instant::now();
    let stats = sweep(&engine, &settings).await.unwrap();
    (started.elapsed(), stats.records)
}

/// The lease holder's timers over `sandboxes` records on SQLite, every one with a deadline and
/// `due` of them past it: how long reading every record and scheduling them takes, and how long
/// expiring the due ones (a stop each, through the CAS) then takes.
async fn expiry_sweep_time(sandboxes: usize, due: usize) -> (Duration, Duration, usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    for i in 0..sandboxes {
        let ttl = if i < due { Duration::from_millis(1) } else { Duration::from_secs(3600) };
        let spec = SandboxSpec {
            image: "i".into(),
            command: vec!["true".into()],
            lifetime: Lifetime { ttl: Some(ttl), ..Lifetime::default() },
            ..Default::default()
        };
        let command = Command::CreateSandbox {
            id: engine.new_sandbox_id(),
            name: format!("s{i:05}"),
            spec,
            providers: Default::default(),
            deadline: None,
        };
        engine.execute(&Request::new(command, None)).await.unwrap();
    }
    while engine.busy() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What the holder's sweep reads anyway, then the schedule made of it.
    let started = Instant::now();
    let mut records = Vec::new();
    let mut page = PageRequest { after: None, limit: ReconcileSettings::default().page_size };
    loop {
        let batch = engine.store().list_sandboxes(&page, &BTreeMap::new()).await.unwrap();
        records.extend(batch.items);
        match batch.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    let mut schedule = Schedule::of(&records, engine.now());
    let scanned = started.elapsed();
    let scheduled = schedule.len();
    let started = Instant::now();
    let fired = schedule.fire_due(&engine).await;
    (scanned, started.elapsed(), scheduled, fired)
}

/// Seconds from SIGKILL of the lease holder (one of two gateway processes on PostgreSQL) to the
/// other's first reconcile sweep.
async fn takeover(url: &str) -> Duration {
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
    let took = "took the reconcile lease";
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

/// A machine-readable line for ci/bench's report.
fn figure(name: &str, value: f64, unit: &str) {
    println!("figure: {name} = {value:.3} {unit}");
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and runs this small, as a
    // smoke, so it cannot rot.
    let quick = !std::env::args().any(|a| a == "--bench")
        || std::env::var_os("BERTH_BENCH_QUICK").is_some_and(|v| !v.is_empty());
    // `cargo bench --bench gateway -- reads` runs only the sections named (lifecycle, postgres,
    // reads, sweeps); none named, all of them.
    let named: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wants = |section: &str| named.is_empty() || named.iter().any(|n| n == section);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if wants("lifecycle") {
        lifecycle(&runtime, quick);
    }
    if wants("postgres") {
        postgres(&runtime, quick);
    }
    if wants("reads") {
        reads(&runtime, quick);
    }
    if wants("sweeps") {
        sweeps(&runtime, quick);
    }
    if wants("egress") {
        egress(&runtime, quick);
    }
}

fn lifecycle(runtime: &tokio::runtime::Runtime, quick: bool) {
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

fn postgres(runtime: &tokio::runtime::Runtime, quick: bool) {
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
                        stores.push(Arc::new(PostgresStore::connect_with(&url, settings).await.unwrap()));
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
            figure("lease takeover to first sweep, ttl 2s", took.as_secs_f64() * 1e3, "ms");
        }
    }
    println!();
}

fn reads(runtime: &tokio::runtime::Runtime, quick: bool) {
    println!("reads to clients that delay ACKs (gRPC over loopback TCP, SQLite, {READ_FLEET} sandboxes)");
    println!(
        "{:>14} {:>8} {:>14} {:>8} {:>10} {:>12} {:>12} {:>12} {:>14}",
        "rpc", "bytes", "client", "clients", "rpcs", "rpc/s", "p50", "p99", "gateway CPU"
    );
    // A second or more per row, as for the lifecycle rows.
    let reads = if quick { vec![(1, 20), (4, 20)] } else { vec![(1, 10_000), (16, 2_000)] };
    for read in [Read::Get, Read::List] {
        for nagle in [false, true] {
            for &(clients, calls) in &reads {
                let (rate, p50, p99, n, size, cpu) = runtime.block_on(read_load(read, nagle, clients, calls));
                let rpc = match read {
                    Read::Get => "GetSandbox",
                    Read::List => "ListSandboxes",
                };
                let kind = if nagle { "no nodelay" } else { "nodelay" };
                println!(
                    "{rpc:>14} {size:>8} {kind:>14} {clients:>8} {n:>10} {rate:>12.0} {:>12?} {:>12?} {:>14?}",
                    p50, p99, cpu
                );
                let what = match read {
                    Read::Get => "GetSandbox".to_string(),
                    Read::List => format!("ListSandboxes of {READ_FLEET}"),
                };
                // The rows of the clients that set nodelay keep the names earlier reports used.
                let label = if nagle {
                    format!("{what}, {clients} clients without nodelay")
                } else {
                    format!("{what}, {clients} clients")
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

fn sweeps(runtime: &tokio::runtime::Runtime, quick: bool) {
    println!("reconcile sweep (SQLite, no-op driver listing every sandbox)");
    println!("{:>10} {:>14} {:>16}", "sandboxes", "sweep", "per sandbox");
    let fleets = if quick { vec![20] } else { vec![1_000, 10_000] };
    for n in fleets {
        let (took, records) = runtime.block_on(sweep_time(n));
        println!("{records:>10} {:>14?} {:>16?}", took, took / records as u32);
        figure(&format!("reconcile sweep, {records} sandboxes"), took.as_secs_f64() * 1e3, "ms");
    }
    println!();
    println!("expiry sweep: the lease holder's timers (SQLite, every sandbox with a deadline)");
    println!("{:>10} {:>14} {:>8} {:>16}", "sandboxes", "schedule scan", "due", "expiring them");
    let fleets = if quick { vec![(20, 2)] } else { vec![(1_000, 10), (10_000, 100)] };
    for (n, due) in fleets {
        let (scan, fire, scheduled, fired) = runtime.block_on(expiry_sweep_time(n, due));
        assert_eq!((scheduled, fired), (n, due), "every deadline scheduled, the due ones expired");
        println!("{scheduled:>10} {:>14?} {fired:>8} {:>16?}", scan, fire);
        figure(&format!("expiry sweep schedule scan, {n} sandboxes"), scan.as_secs_f64() * 1e3, "ms");
        figure(&format!("expiring {due} due sandboxes of {n}"), fire.as_secs_f64() * 1e3, "ms");
    }
}

/// A local upstream: each connection's first line is a byte count to send back then close, or
/// `echo`, to echo every byte until the client closes.
async fn upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let mut stream = tokio::io::BufReader::new(stream);
                let mut line = String::new();
                if stream.read_line(&mut line).await.is_err() {
                    return;
                }
                if line.trim() == "echo" {
                    let (mut read, mut write) = tokio::io::split(stream);
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                } else if let Ok(size) = line.trim().parse::<usize>() {
                    let chunk = vec![7u8; 64 * 1024];
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        if stream.get_mut().write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    let _ = stream.get_mut().shutdown().await;
                }
            });
        }
    });
    addr
}

/// A gateway serving the supervisor API on a Unix socket (as containers reach it), with one
/// sandbox allowed `upstream`, and the supervisor's proxy listener for that sandbox's run: the
/// listener's address.
async fn egress_proxy(dir: &std::path::Path, upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let engine = engine_on(Arc::new(berth_gateway::store::memory::MemoryStore::new()), Arc::default(), 0);
    let spec = SandboxSpec {
        image: "i".into(),
        command: vec!["true".into()],
        egress: berth_core::egress::Policy::parse("allow", [upstream.ip().to_string().as_str()]).unwrap(),
        ..Default::default()
    };
    let create = Command::CreateSandbox {
        id: engine.new_sandbox_id(),
        name: "agent".into(),
        spec,
        providers: Default::default(),
        deadline: None,
    };
    let Ok(berth_core::Outcome::Sandbox(sandbox)) = engine.execute(&Request::new(create, None)).await else {
        panic!("the sandbox was not created")
    };
    let identity =
        berth_core::identity::RuntimeIdentity { sandbox: sandbox.id.clone(), generation: sandbox.generation };
    let token = berth_core::identity::derive_token(engine.key(), &identity).expose().to_string();
    let socket = dir.join("gateway.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let (routes, _) = berth_gateway::api::routes(&engine, "bench-token", Duration::from_secs(5)).await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    let channel = tonic::transport::Endpoint::from_static("http://berth-gateway")
        .connect_with_connector(connector)
        .await
        .unwrap();
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = proxy.accept().await {
            client.set_nodelay(true).unwrap();
            let (token, channel) = (token.clone(), channel.clone());
            tokio::spawn(async move { berth_supervisor::egress::serve(client, &token, channel).await });
        }
    });
    addr
}

/// A connection to `upstream`, directly or through `proxy` (CONNECT answered 200), carrying
/// `first` once open.
async fn open(
    upstream: std::net::SocketAddr,
    proxy: Option<std::net::SocketAddr>,
    first: &str,
) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(proxy.unwrap_or(upstream)).await.unwrap();
    stream.set_nodelay(true).unwrap();
    if proxy.is_some() {
        stream.write_all(format!("CONNECT {upstream} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    }
    stream.write_all(first.as_bytes()).await.unwrap();
    stream
}

fn egress(runtime: &tokio::runtime::Runtime, quick: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (connections, trips, bulk) = if quick { (10, 50, 8 << 20) } else { (300, 3_000, 512 << 20) };
    println!("egress: through the proxy (supervisor listener -> gateway over a Unix socket) beside direct, loopback");
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>14} {:>12}",
        "path", "first byte p50", "p99", "round trip p50", "p99", "MB/s"
    );
    let dir = tempfile::tempdir().unwrap();
    let upstream = runtime.block_on(upstream());
    let proxy = runtime.block_on(egress_proxy(dir.path(), upstream));
    for (path, via) in [("direct", None), ("proxy", Some(proxy))] {
        let (first, trip, rate) = runtime.block_on(async {
            let mut first = Vec::new();
            for _ in 0..connections {
                let t = Instant::now();
                let mut stream = open(upstream, via, "1\n").await;
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await.unwrap();
                first.push(t.elapsed());
            }
            let mut stream = open(upstream, via, "echo\n").await;
            let mut trip = Vec::new();
            let mut byte = [0u8; 1];
            for _ in 0..trips {
                let t = Instant::now();
                stream.write_all(b"x").await.unwrap();
                stream.read_exact(&mut byte).await.unwrap();
                trip.push(t.elapsed());
            }
            let t = Instant::now();
            let mut stream = open(upstream, via, &format!("{bulk}\n")).await;
            let mut buffer = vec![0u8; 256 * 1024];
            let mut got = 0;
            loop {
                match stream.read(&mut buffer).await.unwrap() {
                    0 => break,
                    n => got += n,
                }
            }
            assert_eq!(got, bulk);
            (first, trip, got as f64 / t.elapsed().as_secs_f64() / 1e6)
        });
        let (mut first, mut trip) = (first, trip);
        first.sort();
        trip.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{path:>8} {:>14?} {:>14?} {:>14?} {:>14?} {rate:>12.0}",
            percentile(&first, 0.5),
            percentile(&first, 0.99),
            percentile(&trip, 0.5),
            percentile(&trip, 0.99)
        );
        figure(&format!("egress {path}: connection to first byte p50"), ms(percentile(&first, 0.5)), "ms");
        figure(&format!("egress {path}: connection to first byte p99"), ms(percentile(&first, 0.99)), "ms");
        figure(&format!("egress {path}: round trip p50"), ms(percentile(&trip, 0.5)), "ms");
        figure(&format!("egress {path}: round trip p99"), ms(percentile(&trip, 0.99)), "ms");
        figure(&format!("egress {path}: throughput"), rate, "MB/s");
    }
    println!();
}
