//! The gateway under test (a no-op driver, an engine on a store, served over loopback TCP), its
//! clients, and the latency figures every load shares.

use super::*;

/// Answers at once, as if every runtime call succeeded: the gateway's own cost is measured.
#[derive(Default)]
pub(crate) struct NoopDriver {
    states: Mutex<BTreeMap<SandboxId, RuntimeState>>,
    clock: Mutex<i64>,
}

impl NoopDriver {
    fn tick(&self) -> Timestamp {
        let mut c = self.clock.lock().unwrap();
        *c += 1;
        Timestamp::from_unix_nanos(*c)
    }

    /// A live run held as `held` says; the state after.
    fn hold(&self, sandbox: &SandboxId, held: Option<Hold>) -> RuntimeState {
        let mut states = self.states.lock().unwrap();
        match states.get_mut(sandbox) {
            Some(RuntimeState::Running { held: h, .. }) => *h = held,
            Some(_) => {}
            None => return RuntimeState::Absent { at: None },
        }
        states[sandbox]
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
    fn admit_pause(&self, _: Hold) -> Result<(), berth_core::Error> {
        Ok(())
    }
    async fn start(&self, launch: Launch) -> Result<StartReply, DriverError> {
        let started_at = self.tick();
        self.states.lock().unwrap().insert(launch.sandbox, RuntimeState::Running { started_at, held: None });
        Ok(StartReply::Running { started_at })
    }
    async fn stop(&self, sandbox: &SandboxId, _: u64, _: Duration) -> Result<RuntimeState, DriverError> {
        let finished_at = self.tick();
        let mut states = self.states.lock().unwrap();
        let state = match states.get(sandbox) {
            Some(RuntimeState::Running { started_at, .. }) => RuntimeState::Exited(berth_core::ExitMarker {
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
    async fn pause(&self, sandbox: &SandboxId, hold: Hold) -> Result<RuntimeState, DriverError> {
        Ok(self.hold(sandbox, Some(hold)))
    }
    async fn resume(&self, sandbox: &SandboxId) -> Result<RuntimeState, DriverError> {
        Ok(self.hold(sandbox, None))
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
    async fn snapshot(
        &self,
        _: &SandboxId,
        _: &berth_core::SnapshotId,
    ) -> Result<berth_core::record::Content, DriverError> {
        Err(DriverError::Failed("this driver keeps no workspace".into()))
    }
    async fn remove_snapshot(&self, _: &berth_core::SnapshotId) -> Result<(), DriverError> {
        Ok(())
    }
    async fn snapshots(&self) -> Result<Vec<berth_core::SnapshotId>, DriverError> {
        Ok(Vec::new())
    }
    async fn remove_volume(&self, _: &berth_core::VolumeId) -> Result<(), DriverError> {
        Ok(())
    }
    async fn volume_bytes(&self, _: &berth_core::VolumeId) -> Result<u64, DriverError> {
        Ok(0)
    }
    async fn volumes(&self) -> Result<Vec<berth_core::VolumeId>, DriverError> {
        Ok(Vec::new())
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

/// Gateway `n`'s engine on `store`; gateways sharing a store share one runtime too. Each has
/// its own seed, as each server draws one: gateways with one seed would make the same sandbox
/// ids, and their creates would conflict.
/// The store's one node is registered for an hour, held by the first gateway: nothing here
/// measures the lease.
pub(crate) async fn engine_on(store: Arc<dyn Store>, driver: Arc<NoopDriver>, n: u64) -> Engine {
    let offer = berth_gateway::store::NodeOffer {
        address: "http://127.0.0.1:1".into(),
        labels: Default::default(),
        capacity: berth_core::placement::Capacity { cpu_millis: 0, memory_bytes: 0, sandboxes: 1_000_000 },
        stops_when_lapsed: false,
        e2b_address: None,
    };
    let node = berth_core::NodeId::new("bench");
    store.acquire_node_lease(&node, "bench", &offer, Duration::from_secs(3600)).await.unwrap();
    let settings = EngineSettings { node, ..EngineSettings::default() };
    Engine::new(store, driver, IdentityKey::from_bytes([7; 32]), settings, n)
}

pub(crate) async fn engine(dir: &std::path::Path) -> Engine {
    engine_on(Arc::new(SqliteStore::open(&dir.join("berth.db")).unwrap()), Arc::default(), 0).await
}

pub(crate) fn bench_spec() -> SandboxSpec {
    SandboxSpec { image: "i".into(), command: vec!["true".into()], ..Default::default() }
}

/// An engine on a memory store with one sandbox, `web`, of `spec`, serving the supervisor API
/// on a Unix socket under `dir` (as containers reach it): the engine, the run's token, and the
/// gateway as a supervisor reaches it (a channel to the socket, and new connections to it).
pub(crate) async fn supervised(
    dir: &std::path::Path,
    spec: SandboxSpec,
) -> (Engine, String, berth_supervisor::session::Gateway) {
    let engine = engine_on(Arc::new(berth_gateway::store::memory::MemoryStore::new()), Arc::default(), 0).await;
    let create = Command::CreateSandbox {
        id: engine.new_sandbox_id(),
        name: "web".into(),
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
    tokio::spawn(berth_gateway::server::grpc().add_routes(routes).serve_with_incoming(berth_gateway::ingress::sort(
        engine.clone(),
        tokio_stream::wrappers::UnixListenerStream::new(listener),
    )));
    let dialed = socket.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = dialed.clone();
        async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    });
    // As berth-supervisor's channel is.
    let channel = berth_proto::carry::wide(tonic::transport::Endpoint::from_static("http://berth-gateway"))
        .connect_with_connector(connector)
        .await
        .unwrap();
    let wire: berth_supervisor::ports::Wire = Arc::new(move || {
        let socket = socket.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(socket).await?;
            Ok(Box::new(stream) as Box<dyn berth_supervisor::ports::Connection>)
        })
    });
    (engine, token, berth_supervisor::session::Gateway { channel, wire })
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Serves `engine`'s API on a loopback port; its address.
/// Calls per second since `started`, p50, p99 and the number of calls, of every client task's
/// latencies.
pub(crate) async fn latency_figures(
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

pub(crate) async fn serve(engine: &Engine) -> String {
    serve_over(engine, None).await
}

/// [`serve`], over TLS with `tls`'s certificate if given (then the address is `https://`).
pub(crate) async fn serve_over(engine: &Engine, tls: Option<&BenchTls>) -> String {
    let (routes, _) = berth_gateway::api::routes(engine, "bench-token-0123456789", Duration::from_secs(5)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let address = format!("{scheme}://{}", listener.local_addr().unwrap());
    let acceptor = tls.map(|tls| tls.server.acceptor(berth_gateway::tls::Protocols::Grpc));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(berth_gateway::tcp::incoming(listener, acceptor)),
    );
    address
}

/// A certificate for 127.0.0.1, signed by itself, as the gateway serves it and as its clients
/// trust it (`--tls-cert`, `--ca-file`).
pub(crate) struct BenchTls {
    server: berth_gateway::tls::ServerTls,
    dir: tempfile::TempDir,
}

impl BenchTls {
    pub(crate) fn new() -> Self {
        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cert.pem"), made.cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), made.signing_key.serialize_pem()).unwrap();
        let server =
            berth_gateway::tls::ServerTls::load(&dir.path().join("cert.pem"), &dir.path().join("key.pem")).unwrap();
        Self { server, dir }
    }

    fn ca(&self) -> std::path::PathBuf {
        self.dir.path().join("cert.pem")
    }
}

/// How a bench client speaks to the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Nagle's algorithm off, as Berth's own clients set it.
    Nodelay,
    /// Nagle's algorithm left on, as many HTTP/2 stacks do.
    Nagle,
    /// Nodelay, over TLS.
    Tls,
}

/// A client of the public API at `address`. Its kernel delays ACKs, as Linux does for any
/// client: a reply the server holds back until its previous segment is acknowledged (Nagle's
/// algorithm) then waits about 40 ms. With [`Wire::Nagle`], the client leaves Nagle's algorithm
/// on for its own requests: a request's data frame, written after its headers, then waits for
/// the server's ACK of the headers. Over TLS it trusts `tls`'s certificate.
pub(crate) async fn client(address: String, wire: Wire, tls: Option<&BenchTls>) -> Client {
    let endpoint = tonic::transport::Endpoint::from_shared(address.clone()).unwrap().tcp_nodelay(wire != Wire::Nagle);
    let ca = tls.map(BenchTls::ca);
    let endpoint = berth_gateway::tls::endpoint(endpoint, &address, ca.as_deref()).unwrap();
    let channel = endpoint.connect().await.unwrap();
    SandboxesClient::with_interceptor(channel, Auth("Bearer bench-token-0123456789".parse().unwrap()))
}

pub(crate) type Client =
    SandboxesClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Auth>>;

/// Sends the bench's token with every call.
#[derive(Clone)]
pub(crate) struct Auth(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

/// One create-stop-start-stop-delete cycle of sandbox `name` by `client`: each call's latency.
pub(crate) async fn cycle(client: &mut Client, name: &str) -> Vec<Duration> {
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
