//! A production gateway: the data directory and its secrets, the store, the driver, the
//! engine, recovery, the reconcile loops and the listeners, and a graceful shutdown.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_core::identity::IdentityKey;
use berth_drivers::Driver;
use berth_drivers::container::docker::DockerEngine;
use berth_drivers::container::podman::PodmanEngine;
use berth_drivers::container::{ContainerConfig, ContainerDriver};
use berth_drivers::process::{ProcessConfig, ProcessDriver};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{info, warn};

use crate::config::{Config, DriverKind, StoreLocation};
use crate::engine::{Engine, EngineSettings};
use crate::lease::{self, LeaseSettings};
use crate::reconcile::ReconcileSettings;
use crate::store::Store;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::SqliteStore;

/// Files of the data directory.
pub const API_TOKEN_FILE: &str = "api-token";
pub const IDENTITY_KEY_FILE: &str = "identity.key";
pub const DATABASE_FILE: &str = "berth.db";
pub const INSTANCE_FILE: &str = "instance-id";
/// The identity of the store the data directory belongs to (see [`bind_to_store`]).
pub const STORE_ID_FILE: &str = "store-id";
/// The gateway's name unless configured: the one gateway of a data directory.
pub const DEFAULT_NAME: &str = "gateway";
/// The supervisors' sockets, one per gateway, in a directory of their own: supervisors are
/// given the directory and connect to any gateway listening in it, and containers mount it,
/// which keeps working when a restarted gateway replaces its socket.
pub const SOCKET_DIR: &str = "run";

/// Where a gateway writes the address it listens on, for the CLI: `<name>.addr`.
pub fn address_file(name: &str) -> String {
    format!("{name}.addr")
}

/// A gateway's supervisor socket in [`SOCKET_DIR`]: `<name>.sock`.
pub fn supervisor_socket(name: &str) -> String {
    format!("{name}.sock")
}
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

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(hex::encode(buf))
}

/// Makes `path` hold `contents`, readable by its owner only, unless it exists already. The file
/// is written whole aside, then linked into place, so gateways sharing a data directory and
/// starting together agree on one value and never read half of it. Whether this call made it.
fn write_private(path: &Path, contents: &str) -> Result<bool, String> {
    let aside = path.with_extension(format!("{}.tmp", random_hex(8)?));
    let linked = write_aside(&aside, contents).and_then(|()| std::fs::hard_link(&aside, path));
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(format!("creating {}: {e}", path.display())),
    }
}

/// Writes `contents` to `path` readable by its owner only, in place of what was there: written
/// aside, then renamed over it, so a reader sees the old contents or the new.
fn replace_private(path: &Path, contents: &str) -> Result<(), String> {
    let aside = path.with_extension(format!("{}.tmp", random_hex(8)?));
    let written = write_aside(&aside, contents).and_then(|()| std::fs::rename(&aside, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&aside);
    }
    written.map_err(|e| format!("writing {}: {e}", path.display()))
}

/// A new file at `aside`, readable by its owner only, holding `contents` durably.
fn write_aside(aside: &Path, contents: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(aside)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()
}

/// Reads a secret file, creating it with `bytes` random bytes on first start.
fn secret(path: &Path, bytes: usize) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let mode = std::fs::metadata(path).map_err(|e| e.to_string())?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(format!(
                    "{} is readable by others (mode {:o}); chmod 600 it",
                    path.display(),
                    mode & 0o777
                ));
            }
            Ok(s.trim().to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = random_hex(bytes)?;
            if write_private(path, &value)? {
                Ok(value)
            } else {
                // Another gateway sharing the data directory made it first: use theirs.
                secret(path, bytes)
            }
        }
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

fn identity_key(path: &Path) -> Result<IdentityKey, String> {
    let hex_key = secret(path, 32)?;
    let bytes: [u8; 32] = hex::decode(&hex_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("{} does not hold a 32-byte hex key", path.display()))?;
    Ok(IdentityKey::from_bytes(bytes))
}

/// Binds the data directory to the store the gateway runs on, or refuses a store that is not
/// the one it is bound to. Sandboxes in the data directory (the process driver's, and the
/// container drivers' state) belong to that store's records: on any other store they would have
/// no record, and reconciling would delete them as orphans. A data directory without the file
/// (a first start, or one from before stores had identities) is bound at this start. The file
/// also says where the store was when it was bound, for the message.
fn bind_to_store(data: &Path, location: &StoreLocation, identity: &str) -> Result<(), String> {
    let path = data.join(STORE_ID_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if write_private(&path, &format!("{identity}\n{location}\n"))? {
                return Ok(());
            }
            // Another gateway sharing the data directory bound it first: check against that.
            return bind_to_store(data, location, identity);
        }
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut lines = text.lines();
    let bound = lines.next().map(str::trim).filter(|id| !id.is_empty()).ok_or_else(|| {
        format!("{} names no store; remove it to bind {} to this gateway's store", path.display(), data.display())
    })?;
    if bound == identity {
        return Ok(());
    }
    let was = lines.next().map_or(String::new(), |w| format!("{w} when it was bound; "));
    Err(format!(
        "refusing to start: the data directory {} belongs to store {bound} ({was}see {}), not to this gateway's \
         store {identity} ({location}), which would take its sandboxes for orphans and delete them. Is --store \
         (BERTH_STORE) missing or wrong? Give the store the data directory belongs to, or another --data-dir.",
        data.display(),
        path.display()
    ))
}

fn seed() -> Result<u64, String> {
    let mut buf = [0u8; 8];
    getrandom::fill(&mut buf).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(u64::from_le_bytes(buf))
}

/// Runs a gateway until SIGINT or SIGTERM, then shuts it down within [`STREAMS_END_WITHIN`]
/// (or [`DRAIN_FOR`] while effects are under way). Tasks still running then (a connection whose
/// client does not read, say) are left to the caller to drop without waiting.
pub async fn run(config: Config) -> Result<(), String> {
    let data = &config.data_dir;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data)
        .map_err(|e| format!("creating {}: {e}", data.display()))?;
    info!(settings = ?config, "berth-gateway starting");
    let token = match &config.api_token {
        Some(t) if t.len() < 16 => return Err("the API token must be at least 16 characters".to_string()),
        // Written where the CLI on this host looks, replacing a token an earlier run made: the
        // file always holds the token the gateway takes.
        Some(t) => {
            replace_private(&data.join(API_TOKEN_FILE), t)?;
            t.clone()
        }
        None => secret(&data.join(API_TOKEN_FILE), 32)?,
    };
    let key = identity_key(&data.join(IDENTITY_KEY_FILE))?;
    let store: Arc<dyn Store> = match &config.store {
        StoreLocation::Sqlite(path) => {
            Arc::new(SqliteStore::keeping_changes(path, config.changes_kept).map_err(|e| e.to_string())?)
        }
        StoreLocation::Postgres(url) => {
            let settings = crate::store::postgres::Settings {
                changes_kept: config.changes_kept,
                connections: config.store_connections,
            };
            Arc::new(PostgresStore::connect_with(url, settings).await.map_err(|e| e.to_string())?)
        }
    };
    bind_to_store(data, &config.store, store.identity())?;

    let socket_dir = data.join(SOCKET_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&socket_dir)
        .map_err(|e| format!("creating {}: {e}", socket_dir.display()))?;
    let socket: PathBuf = socket_dir.join(supervisor_socket(&config.name));
    if tokio::net::UnixStream::connect(&socket).await.is_ok() {
        return Err(format!(
            "another gateway named {:?} is serving from {}; give each gateway its own --name",
            config.name,
            data.display()
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
    let driver = driver(&config, &socket_dir, store.identity()).await?;
    let files =
        berth_drivers::files::Limits { max_bytes: config.max_upload_bytes, ..berth_drivers::files::Limits::default() };
    let settings = EngineSettings {
        stop_grace: config.stop_grace,
        files,
        limits: berth_core::validate::Limits { max_ttl: config.max_ttl, max_pool: config.max_pool },
        name: config.name.clone(),
        egress: Arc::new(crate::egress::HostUpstream { pins: config.egress_resolve.clone() }),
        ..EngineSettings::default()
    };
    let engine = Engine::new(store, driver, key, settings, seed()?);

    let listener = TcpListener::bind(config.listen).await.map_err(|e| format!("binding {}: {e}", config.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    // Written aside and renamed into place: a reader (the CLI, a test) never sees half of it.
    let address_file = data.join(address_file(&config.name));
    let written = address_file.with_extension("addr.tmp");
    std::fs::write(&written, format!("http://{address}\n"))
        .and_then(|()| std::fs::rename(&written, &address_file))
        .map_err(|e| format!("writing {}: {e}", address_file.display()))?;

    let reconcile_settings = ReconcileSettings {
        poll_interval: config.poll_interval,
        redrive_after: config.redrive_after,
        ..ReconcileSettings::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let lease = LeaseSettings { holder: config.name.clone(), ttl: config.lease_ttl };
    let leading = tokio::spawn(lease::lead(engine.clone(), lease, reconcile_settings, stop_rx.clone()));
    tokio::spawn(crate::engine::execs::Execs::new(engine.clone()).settle_forever());

    let (routes, health) = crate::api::routes(&engine, &token, config.heartbeat).await;
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let server = || {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .http2_max_header_list_size(MAX_HEADER_LIST)
            .add_routes(routes.clone())
    };
    let tcp =
        tokio::spawn(server().serve_with_incoming_shutdown(crate::tcp::incoming(listener), stopped(stop_rx.clone())));
    let metrics = match config.metrics_listen {
        Some(at) => {
            let listener = TcpListener::bind(at).await.map_err(|e| format!("binding {at} (--metrics-listen): {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            info!(address = %bound, "metrics serving at /metrics");
            let auth = crate::api::auth::BearerAuth::new(&token);
            Some(tokio::spawn(crate::metrics::serve(engine.clone(), listener, auth, stopped(stop_rx.clone()))))
        }
        None => None,
    };
    let http = match config.http_listen {
        Some(at) => {
            let listener = TcpListener::bind(at).await.map_err(|e| format!("binding {at} (--http-listen): {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            info!(address = %bound, "HTTP/JSON API serving at /v1");
            Some(tokio::spawn(crate::api::http::serve(
                engine.clone(),
                listener,
                token.clone(),
                stopped(stop_rx.clone()),
            )))
        }
        None => None,
    };
    let local = tokio::spawn(server().serve_with_incoming_shutdown(UnixListenerStream::new(unix), stopped(stop_rx)));
    info!(
        %address,
        name = config.name,
        data_dir = %data.display(),
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
        while engine.busy() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let connections = async {
        let _ = tcp.await;
        let _ = local.await;
        for task in [metrics, http].into_iter().flatten() {
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

/// The configured runtime's driver; `auto` takes the first runtime that answers. Container
/// engines are bound to `store`: they label what they make with it and see only its resources.
async fn driver(config: &Config, socket_dir: &Path, store: &str) -> Result<Arc<dyn Driver>, String> {
    let data = &config.data_dir;
    let instance = match &config.instance {
        Some(name) => name.clone(),
        None => secret(&data.join(INSTANCE_FILE), 8)?,
    };
    let containers = |runtime: &str| ContainerConfig {
        root: data.join(runtime),
        supervisor: config.supervisor_bin.clone(),
        socket_dir: socket_dir.to_path_buf(),
    };
    let docker = || async {
        let socket = config.docker_socket.display().to_string();
        let engine = DockerEngine::connect(&socket, &instance).await.map_err(|e| format!("Docker at {socket}: {e}"))?;
        Ok::<_, String>(engine.with_store(store))
    };
    let podman = || async {
        let socket = config.podman_socket.display().to_string();
        let engine = PodmanEngine::connect(&socket, &instance).await.map_err(|e| format!("Podman at {socket}: {e}"))?;
        Ok::<_, String>(engine.with_store(store))
    };
    let process = || -> Result<Arc<dyn Driver>, String> {
        let driver = ProcessDriver::new(ProcessConfig {
            root: data.join("sandboxes"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_serves_only_the_store_it_was_first_used_with() {
        let data = tempfile::tempdir().unwrap();
        let first = StoreLocation::Sqlite(data.path().join("berth.db"));
        let other = StoreLocation::Postgres("postgres://berth:hunter2@db/berth".into());
        bind_to_store(data.path(), &first, "aaaa").unwrap();
        let file = data.path().join(STORE_ID_FILE);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        bind_to_store(data.path(), &first, "aaaa").unwrap();
        // The store is found by its identity, wherever it is now.
        bind_to_store(data.path(), &other, "aaaa").unwrap();

        let refused = bind_to_store(data.path(), &other, "bbbb").unwrap_err();
        for mention in ["aaaa", "bbbb", &first.to_string(), &other.to_string(), "--store", "BERTH_STORE"] {
            assert!(refused.contains(mention), "{refused:?} does not mention {mention:?}");
        }
        assert!(!refused.contains("hunter2"), "a password in an error: {refused}");

        std::fs::remove_file(&file).unwrap();
        bind_to_store(data.path(), &other, "bbbb").unwrap();
        assert!(bind_to_store(data.path(), &first, "aaaa").is_err());
    }
}
