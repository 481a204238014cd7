//! A production gateway: its data directory (see [`crate::data_dir`]), the store, the driver, the
//! engine, recovery, the reconcile loops and the listeners, and a graceful shutdown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_core::NodeId;
use berth_drivers::Driver;
use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{ContainerConfig, ContainerDriver};
use berth_drivers::process::{ProcessConfig, ProcessDriver};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{info, warn};

use crate::config::{Config, DriverKind, StoreLocation};
use crate::data_dir::DataDir;
use crate::engine::{Engine, EngineSettings};
use crate::lease::{self, LeaseSettings};
use crate::node::NodeSettings;
use crate::reconcile::ReconcileSettings;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::SqliteStore;
use crate::store::{NodeOffer, Store};

/// How long a shutdown waits for effects under way to finish.
const DRAIN_FOR: Duration = Duration::from_secs(10);
/// How long a shutdown waits for connections to close once their streams were told to end. A
/// client that reads takes the little left in its stream (what an exec or the logs wrote
/// before the signal, then UNAVAILABLE) in well under a second; one that does not read holds
/// its connection open for good, and must not hold the stop up until a service manager kills
/// the gateway (Docker waits 10 s by default). Past this the gateway exits with the connection
/// open, and its client reconnects as after a crash. A shutdown therefore lasts at most the
/// longer of this and [`DRAIN_FOR`], which only effects under way reach.
const STREAMS_END_WITHIN: Duration = Duration::from_secs(3);
/// The most request metadata (HTTP/2 header list, as HPACK counts it) a call may carry. hyper's
/// default, 16 KiB, refuses a larger one with HTTP 431 before any gRPC status exists, so a
/// client sees UNKNOWN; within this limit the call reaches authentication and validation.
const MAX_HEADER_LIST: u32 = 64 * 1024;

fn seed() -> Result<u64, String> {
    let mut buf = [0u8; 8];
    getrandom::fill(&mut buf).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(u64::from_le_bytes(buf))
}

/// Runs a gateway until SIGINT or SIGTERM, then shuts it down within [`STREAMS_END_WITHIN`]
/// (or [`DRAIN_FOR`] while effects are under way). Tasks still running then (a connection whose
/// client does not read, say) are left to the caller to drop without waiting.
pub async fn run(config: Config) -> Result<(), String> {
    let data = DataDir::create(&config.data_dir)?;
    info!(settings = ?config, "berth-gateway starting");
    let token = match &config.api_token {
        Some(t) if t.len() < 16 => return Err("the API token must be at least 16 characters".to_string()),
        given => data.api_token(given.as_deref())?,
    };
    let key = data.identity_key()?;
    let store: Arc<dyn Store> = match &config.store {
        StoreLocation::Sqlite(path) => {
            Arc::new(SqliteStore::keeping_changes(path, config.changes_kept).map_err(|e| e.to_string())?)
        }
        StoreLocation::Postgres(url) => {
            let settings = crate::store::postgres::Settings {
                changes_kept: config.changes_kept,
                connections: config.store_connections,
                ca: config.store_ca.clone(),
            };
            Arc::new(PostgresStore::connect_with(url, settings).await.map_err(|e| e.to_string())?)
        }
    };
    data.bind_to_store(&config.store, store.identity())?;

    let socket_dir = data.socket_dir()?;
    let socket: PathBuf = data.supervisor_socket(&config.name);
    if tokio::net::UnixStream::connect(&socket).await.is_ok() {
        return Err(format!(
            "another gateway named {:?} is serving from {}; give each gateway its own --name",
            config.name,
            data.path().display()
        ));
    }
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing the stale {}: {e}", socket.display())),
    }
    let unix = UnixListener::bind(&socket).map_err(|e| format!("binding {}: {e}", socket.display()))?;
    if !config.supervisor_bin.exists() {
        return Err(format!(
            "berth-supervisor not found at {} (build it, or pass --supervisor-bin)",
            config.supervisor_bin.display()
        ));
    }
    let instance = match &config.instance {
        Some(name) => name.clone(),
        None => data.instance()?,
    };
    let driver = driver(&config, &data, &socket_dir, &instance, store.identity()).await?;
    let tls = config.tls.as_ref().map(|files| crate::tls::ServerTls::load(&files.cert, &files.key)).transpose()?;
    let acceptor = |protocols| tls.as_ref().map(|tls| tls.acceptor(protocols));
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Bound before the engine is made: `GetInfo` tells where (for `berth e2b env`).
    let e2b = bound(config.e2b_listen, "--e2b-listen", acceptor(crate::tls::Protocols::Http1)).await?;
    // Bound before the engine is made: the URLs it hands out name the address bound.
    let proxy = match config.proxy_listen {
        Some(at) => {
            let listener = TcpListener::bind(at).await.map_err(|e| format!("binding {at} (--proxy-listen): {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            Some((listener, crate::ports::Preview::new(scheme, bound, config.proxy_domain.clone())))
        }
        None => None,
    };
    let files =
        berth_drivers::files::Limits { max_bytes: config.max_upload_bytes, ..berth_drivers::files::Limits::default() };
    let node_id = config.node.as_deref().map_or_else(|| crate::node::default_id(&instance), NodeId::new);
    let settings = EngineSettings {
        stop_grace: config.stop_grace,
        files,
        limits: berth_core::validate::Limits {
            max_ttl: config.max_ttl,
            max_pool: config.max_pool,
            max_snapshots: config.max_snapshots,
            max_snapshot_bytes: config.max_snapshot_bytes,
        },
        name: config.name.clone(),
        egress: Arc::new(crate::egress::HostUpstream { pins: config.egress_resolve.clone() }),
        preview: proxy.as_ref().map(|(_, preview)| preview.clone()),
        peers: Some(crate::ports::Peers::new(data.path(), &config.name, &token, config.tls_ca.clone())?),
        node_wait: crate::node::takeover_within(config.lease_ttl),
        e2b_url: e2b.as_ref().map(|(_, at)| format!("{scheme}://{at}")),
        node: node_id.clone(),
        ..EngineSettings::default()
    };
    let engine = Engine::new(store, driver, key, settings, seed()?);

    let listener = TcpListener::bind(config.listen).await.map_err(|e| format!("binding {}: {e}", config.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    data.write_address(&config.name, scheme, address)?;

    let reconcile_settings = ReconcileSettings {
        poll_interval: config.poll_interval,
        redrive_after: config.redrive_after,
        ..ReconcileSettings::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let lease = LeaseSettings { holder: config.name.clone(), ttl: config.lease_ttl };
    let leading = tokio::spawn(lease::lead(engine.clone(), lease, reconcile_settings.clone(), stop_rx.clone()));
    let node = NodeSettings {
        id: node_id,
        holder: config.name.clone(),
        offer: NodeOffer {
            address: format!("{scheme}://{address}"),
            labels: config.node_labels.clone(),
            capacity: crate::node::host_capacity(config.node_sandboxes),
            stops_when_lapsed: false,
            e2b_address: e2b.as_ref().map(|(_, at)| format!("{scheme}://{at}")),
        },
        ttl: config.lease_ttl,
        company: Some(data.path().join("node-company")),
    };
    info!(node = %node.id, capacity = ?node.offer.capacity, labels = ?node.offer.labels, "registering this host as a node");
    let noding = tokio::spawn(crate::node::keep(engine.clone(), node, reconcile_settings, stop_rx.clone()));
    tokio::spawn(crate::engine::execs::Execs::new(engine.clone()).settle_forever());

    let (routes, health) = crate::api::routes(&engine, &token, config.heartbeat).await;
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let server = || grpc().add_routes(routes.clone());
    // Both endpoints take supervisors' ingress connections beside gRPC (`ingress::sort`).
    let incoming =
        crate::ingress::sort(engine.clone(), crate::tcp::incoming(listener, acceptor(crate::tls::Protocols::Grpc)));
    let tcp = tokio::spawn(server().serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone())));
    let metrics = bound(config.metrics_listen, "--metrics-listen", acceptor(crate::tls::Protocols::Http1)).await?;
    let metrics = metrics.map(|(listener, at)| {
        info!(address = %at, "metrics serving at /metrics");
        let auth = crate::api::auth::BearerAuth::new(&token);
        tokio::spawn(crate::metrics::serve(engine.clone(), listener, auth, stopped(stop_rx.clone())))
    });
    let http = bound(config.http_listen, "--http-listen", acceptor(crate::tls::Protocols::Http1)).await?;
    let http = serve_http1(http, stopped(stop_rx.clone()), |at| {
        info!(address = %at, "HTTP/JSON API serving at /v1");
        crate::api::http::router(&engine, &token)
    });
    let e2b = serve_http1(e2b, stopped(stop_rx.clone()), |at| {
        info!(address = %at, "E2B's sandbox API serving");
        crate::api::e2b::router(&engine, &token)
    });
    let preview = proxy.map(|(listener, preview)| {
        info!(address = %preview.authority, domain = ?preview.domain, "preview proxy serving at /sandboxes/<sandbox>/ports/<port>/");
        let proxy = crate::ports::Proxy::new(engine.clone(), &token, preview.domain);
        let incoming = crate::tcp::incoming(listener, acceptor(crate::tls::Protocols::Either));
        tokio::spawn(crate::ports::serve(proxy, incoming, stopped(stop_rx.clone())))
    });
    let incoming = crate::ingress::sort(engine.clone(), UnixListenerStream::new(unix));
    let local = tokio::spawn(server().serve_with_incoming_shutdown(incoming, stopped(stop_rx)));
    info!(
        %address,
        name = config.name,
        data_dir = %data.path().display(),
        store = %config.store,
        driver = engine.driver().name(),
        "berth-gateway serving"
    );

    shutdown_signal().await;
    info!(
        "shutting down: no new requests, every stream ends (its client reconnects); letting effects under way finish"
    );
    let _ = stop_tx.send(true);
    engine.shutdown().begin();
    health.shut_down().await;
    // Reconcile stops and the lease is given up, so another gateway takes over at once. A store
    // that does not answer cannot hold the shutdown up: the lease then lapses by itself.
    let effects = async {
        let deadline = tokio::time::Instant::now() + DRAIN_FOR;
        if tokio::time::timeout_at(deadline, leading).await.is_err() {
            warn!("the store did not take the reconcile lease back in time; it lapses by itself");
        }
        if tokio::time::timeout_at(deadline, noding).await.is_err() {
            warn!("the store did not take the node's lease back in time; it lapses by itself");
        }
        while engine.busy() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let connections = async {
        let _ = tcp.await;
        let _ = local.await;
        for task in [metrics, http, e2b].into_iter().flatten() {
            let _ = task.await;
        }
        if let Some(task) = preview {
            let _ = task.await;
        }
    };
    let (_, closed) = tokio::join!(effects, tokio::time::timeout(STREAMS_END_WITHIN, connections));
    if closed.is_err() {
        warn!(
            within = ?STREAMS_END_WITHIN,
            "connections still open after their streams were told to end (clients not reading); exiting with them open"
        );
    }
    let _ = std::fs::remove_file(&socket);
    info!("stopped; sandboxes keep running and are adopted at the next start");
    Ok(())
}

/// The gRPC server as a gateway serves it: keepalive to notice clients gone, and wide windows
/// so that a stream carrying bulk (a connection into a run, an exec's output, a download) is
/// not held to HTTP/2's default 64 KiB in flight.
pub fn grpc() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .initial_stream_window_size(Some(berth_proto::carry::STREAM_WINDOW))
        .initial_connection_window_size(Some(berth_proto::carry::CONNECTION_WINDOW))
        .max_frame_size(Some(berth_proto::carry::MAX_FRAME))
}

/// The configured runtime's driver; `auto` takes the first runtime that answers. Container
/// engines are bound to `store`: they label what they make with it and see only its resources.
async fn driver(
    config: &Config,
    data: &DataDir,
    socket_dir: &Path,
    instance: &str,
    store: &str,
) -> Result<Arc<dyn Driver>, String> {
    let containers = |runtime: &str| ContainerConfig {
        root: data.runtime_state(runtime),
        supervisor: config.supervisor_bin.clone(),
        socket_dir: socket_dir.to_path_buf(),
    };
    let docker = || async {
        let socket = config.docker_socket.display().to_string();
        let engine = DockerEngine::connect(&socket, instance).await.map_err(|e| format!("Docker at {socket}: {e}"))?;
        Ok::<_, String>(engine.with_store(store))
    };
    let podman = || async {
        let socket = config.podman_socket.display().to_string();
        let engine = PodmanEngine::connect(&socket, instance).await.map_err(|e| format!("Podman at {socket}: {e}"))?;
        Ok::<_, String>(engine.with_store(store))
    };
    let process = || -> Result<Arc<dyn Driver>, String> {
        let driver = ProcessDriver::new(ProcessConfig {
            root: data.sandboxes(),
            supervisor: config.supervisor_bin.clone(),
            gateway: format!("unix:{}", socket_dir.display()),
        });
        Ok(Arc::new(driver.map_err(|e| e.to_string())?))
    };
    let wrap = |d: Result<Arc<dyn Driver>, berth_drivers::DriverError>| d.map_err(|e| e.to_string());
    match config.driver {
        DriverKind::Process => process(),
        DriverKind::Docker => {
            wrap(ContainerDriver::new(docker().await?, containers("docker")).map(|d| Arc::new(d) as _))
        }
        DriverKind::Podman => {
            wrap(ContainerDriver::new(podman().await?, containers("podman")).map(|d| Arc::new(d) as _))
        }
        DriverKind::Auto => {
            if let Ok(engine) = docker().await {
                return wrap(ContainerDriver::new(engine, containers("docker")).map(|d| Arc::new(d) as _));
            }
            if let Ok(engine) = podman().await {
                return wrap(ContainerDriver::new(engine, containers("podman")).map(|d| Arc::new(d) as _));
            }
            process()
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// A listener for an HTTP/1.1 service at `at` (the setting `flag`), if set, with TLS when the
/// gateway serves it, and the address it bound.
async fn bound(
    at: Option<std::net::SocketAddr>,
    flag: &str,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<Option<(crate::tcp::Listener, std::net::SocketAddr)>, String> {
    let Some(at) = at else { return Ok(None) };
    let listener = TcpListener::bind(at).await.map_err(|e| format!("binding {at} ({flag}): {e}"))?;
    let listener = crate::tcp::Listener::new(listener, tls).map_err(|e| e.to_string())?;
    let bound = axum::serve::Listener::local_addr(&listener).map_err(|e| e.to_string())?;
    Ok(Some((listener, bound)))
}

/// Serves the router `made` for the address bound over HTTP/1.1, if one is, until `stop`.
fn serve_http1(
    bound: Option<(crate::tcp::Listener, std::net::SocketAddr)>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    made: impl FnOnce(std::net::SocketAddr) -> axum::Router,
) -> Option<tokio::task::JoinHandle<std::io::Result<()>>> {
    let (listener, at) = bound?;
    let router = made(at);
    Some(tokio::spawn(axum::serve(listener, router).with_graceful_shutdown(stop).into_future()))
}
