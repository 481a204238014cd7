//! Gateway configuration: command-line flags, `BERTH_*` environment variables, and an optional
//! TOML file, in that order of precedence, over built-in defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// Each sandbox is a process group on this host (no isolation; nothing to install).
    Process,
    /// Each sandbox is a Docker container.
    Docker,
    /// Each sandbox is a Podman container.
    Podman,
    /// Docker if its socket answers, else Podman if its socket answers, else the process driver.
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Where records are kept.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite file: the embedded default, for one gateway.
    Sqlite(PathBuf),
    /// A PostgreSQL database (its URL), which several gateways may share.
    Postgres(String),
}

impl StoreLocation {
    /// `sqlite` (the file in `data_dir`), `sqlite:PATH`, or `postgres://…` / `postgresql://…`.
    fn parse(value: &str, data_dir: &Path) -> Result<Self, String> {
        if value == "sqlite" {
            Ok(StoreLocation::Sqlite(crate::data_dir::database(data_dir)))
        } else if let Some(path) = value.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
            Ok(StoreLocation::Sqlite(PathBuf::from(path)))
        } else if value.starts_with("postgres://") || value.starts_with("postgresql://") {
            Ok(StoreLocation::Postgres(value.to_string()))
        } else {
            Err("store: expected sqlite, sqlite:PATH or a postgres:// URL".to_string())
        }
    }
}

/// The URL with its password (if any) replaced: this is what logs and errors may show.
impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreLocation::Postgres(url) => {
                let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
                match rest.split_once('@') {
                    Some((user, host)) if user.contains(':') => {
                        let user = user.split(':').next().unwrap_or_default();
                        write!(f, "{scheme}://{user}:<redacted>@{host}")
                    }
                    _ => write!(f, "{url}"),
                }
            }
        }
    }
}

impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreLocation({self})")
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 500ms, 10s or 2m: {e}"))
}

/// The Berth gateway: serves the public and supervisor gRPC APIs and keeps every sandbox
/// converging to its intent.
#[derive(Parser, Debug, Default)]
#[command(name = "berth-gateway", version, about, long_about = None)]
pub struct Flags {
    /// A TOML file with any of the settings below (keys as the flags, with '_' for '-').
    #[arg(long, env = "BERTH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the gRPC API. [default: 127.0.0.1:7420]
    #[arg(long, env = "BERTH_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address of the Prometheus metrics, `GET /metrics` with the public API's bearer token
    /// (`authorization: Bearer <token>`). [default: off]
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Address of the HTTP/JSON API (the public API's calls as JSON over HTTP, the same token).
    /// [default: off]
    #[arg(long, env = "BERTH_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Address of E2B's sandbox API (DESIGN 15): point the `e2b` SDKs' `E2B_API_URL` here,
    /// with Berth's API token as their API key. [default: off]
    #[arg(long, env = "BERTH_E2B_LISTEN")]
    pub e2b_listen: Option<SocketAddr>,
    /// Address of the preview proxy: HTTP to the ports of sandboxes' runs, at
    /// `/sandboxes/<sandbox>/ports/<port>/` (and `<port>-<sandbox>.<domain>` with
    /// --proxy-domain). [default: off]
    #[arg(long, env = "BERTH_PROXY_LISTEN")]
    pub proxy_listen: Option<SocketAddr>,
    /// The domain the preview proxy routes by Host under: `<port>-<sandbox>.<domain>` (its DNS
    /// a wildcard to the proxy). [default: none, path routing only]
    #[arg(long, env = "BERTH_PROXY_DOMAIN", value_parser = proxy_domain)]
    pub proxy_domain: Option<String>,
    /// A PEM certificate chain (leaf first): every TCP listener (the API, the HTTP/JSON API,
    /// the metrics, the preview proxy) then speaks TLS alone, and the gateway's address is
    /// written as https://. Needs --tls-key. [default: plaintext]
    #[arg(long, env = "BERTH_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "BERTH_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The PEM CA certificates this gateway trusts when it reaches another gateway over
    /// https:// (one sharing its data directory). [default: the system's roots]
    #[arg(long, env = "BERTH_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Where the database, secrets and sandboxes live. [default: $XDG_DATA_HOME/berth, or ~/.local/share/berth]
    #[arg(long, env = "BERTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The runtime that runs sandboxes. [default: process]
    #[arg(long, env = "BERTH_DRIVER")]
    pub driver: Option<DriverKind>,
    /// Where records are kept: `sqlite` (<data-dir>/berth.db), `sqlite:PATH`, or a PostgreSQL
    /// URL, `postgres://user[:password]@host[:port]/database`, which several gateways may
    /// share. The data directory belongs to the store it was first used with
    /// (<data-dir>/store-id): given another, the gateway refuses to start. [default: sqlite]
    #[arg(long, env = "BERTH_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// The public API's bearer token. [default: read from, or created in, <data-dir>/api-token]
    #[arg(long, env = "BERTH_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The berth-supervisor binary every sandbox runs; container drivers need a statically
    /// linked one. [default: next to berth-gateway]
    #[arg(long, env = "BERTH_SUPERVISOR_BIN")]
    pub supervisor_bin: Option<PathBuf>,
    /// Docker's API socket. [default: DOCKER_HOST's unix socket, else /var/run/docker.sock]
    #[arg(long, env = "BERTH_DOCKER_SOCKET")]
    pub docker_socket: Option<PathBuf>,
    /// Podman's API socket. [default: /run/podman/podman.sock]
    #[arg(long, env = "BERTH_PODMAN_SOCKET")]
    pub podman_socket: Option<PathBuf>,
    /// This gateway's name in a shared container runtime: it sees only the containers it made.
    /// Gateways sharing a store share it too. [default: read from, or created in,
    /// <data-dir>/instance-id]
    #[arg(long, env = "BERTH_INSTANCE")]
    pub instance: Option<String>,
    /// This gateway's own name among gateways sharing a store (letters, digits, '.', '_', '-'):
    /// its name in the reconcile lease, its supervisor socket `<data-dir>/run/<name>.sock` and
    /// its address file `<data-dir>/<name>.addr`. [default: gateway]
    #[arg(long, env = "BERTH_NAME")]
    pub name: Option<String>,
    /// The node this gateway runs sandboxes as (DESIGN 14; a DNS label):
    /// gateways sharing a data directory are one node, whose lease one of them holds.
    /// [default: the instance name, made a DNS label]
    #[arg(long, env = "BERTH_NODE")]
    pub node: Option<String>,
    /// A label of the node, KEY=VALUE (repeatable): what sandboxes' node selectors match.
    #[arg(long = "node-label", env = "BERTH_NODE_LABELS", value_delimiter = ' ', value_parser = node_label)]
    pub node_labels: Vec<(String, String)>,
    /// How many sandboxes the node takes. [default: 1000]
    #[arg(long, env = "BERTH_NODE_SANDBOXES")]
    pub node_sandboxes: Option<u64>,
    /// How long the reconcile lease lasts unrenewed: how soon another gateway takes over
    /// reconciling when its holder dies. [default: 15s]
    #[arg(long, env = "BERTH_LEASE_TTL", value_parser = duration)]
    pub lease_ttl: Option<Duration>,
    /// Time between two reconcile sweeps of the whole runtime. [default: 10s]
    #[arg(long, env = "BERTH_POLL_INTERVAL", value_parser = duration)]
    pub poll_interval: Option<Duration>,
    /// A transition unconfirmed this long is re-driven by the next sweep. [default: 30s]
    #[arg(long, env = "BERTH_REDRIVE_AFTER", value_parser = duration)]
    pub redrive_after: Option<Duration>,
    /// How long a stop waits for a graceful exit before it forces one. [default: 10s]
    #[arg(long, env = "BERTH_STOP_GRACE", value_parser = duration)]
    pub stop_grace: Option<Duration>,
    /// The most one upload's tar stream may hold, in bytes. [default: 1073741824 (1 GiB)]
    #[arg(long, env = "BERTH_MAX_UPLOAD_BYTES")]
    pub max_upload_bytes: Option<u64>,
    /// The longest TTL a sandbox may have, and how far ahead its deadline may be. [default: 30d]
    #[arg(long, env = "BERTH_MAX_TTL", value_parser = duration)]
    pub max_ttl: Option<Duration>,
    /// The most Ready sandboxes one template's warm pool may keep. [default: 100]
    #[arg(long, env = "BERTH_MAX_POOL")]
    pub max_pool: Option<u32>,
    /// The most snapshots the store may hold, forks' own included. [default: 100]
    #[arg(long, env = "BERTH_MAX_SNAPSHOTS")]
    pub max_snapshots: Option<u32>,
    /// The most bytes the store's snapshots may hold together. [default: 53687091200 (50 GiB)]
    #[arg(long, env = "BERTH_MAX_SNAPSHOT_BYTES")]
    pub max_snapshot_bytes: Option<u64>,
    /// Supervisors' heartbeat interval. [default: 5s]
    #[arg(long, env = "BERTH_HEARTBEAT", value_parser = duration)]
    pub heartbeat: Option<Duration>,
    /// How many of the newest sandbox changes the store's change log keeps: a fleet watch can
    /// resume from a cursor that many changes old. [default: 10000]
    #[arg(long, env = "BERTH_CHANGES_KEPT")]
    pub changes_kept: Option<u64>,
    /// How many connections this gateway keeps to a PostgreSQL store at most: gateways sharing
    /// a server share its max_connections. [default: 8]
    #[arg(long, env = "BERTH_STORE_CONNECTIONS")]
    pub store_connections: Option<usize>,
    /// The PEM CA certificates a PostgreSQL store's certificate is checked against, when its
    /// URL says sslmode=require (TLS, never plaintext, certificate and name checked).
    /// [default: the system's roots]
    #[arg(long, env = "BERTH_STORE_CA")]
    pub store_ca: Option<PathBuf>,
    /// Pins a host name to addresses for the egress proxy, before DNS (as curl's --resolve):
    /// NAME=ADDRESS[,ADDRESS...] (repeatable).
    #[arg(long = "egress-resolve", env = "BERTH_EGRESS_RESOLVE", value_delimiter = ' ', value_parser = crate::egress::pin)]
    pub egress_resolve: Vec<(String, Vec<std::net::IpAddr>)>,
    /// Log filter, in `RUST_LOG` syntax. [default: info]
    #[arg(long, env = "BERTH_LOG")]
    pub log: Option<String>,
    /// Log format. [default: text]
    #[arg(long, env = "BERTH_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
}

/// The TOML file: the same settings, every one optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    http_listen: Option<SocketAddr>,
    e2b_listen: Option<SocketAddr>,
    proxy_listen: Option<SocketAddr>,
    proxy_domain: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    driver: Option<DriverKind>,
    store: Option<String>,
    api_token: Option<String>,
    supervisor_bin: Option<PathBuf>,
    docker_socket: Option<PathBuf>,
    podman_socket: Option<PathBuf>,
    instance: Option<String>,
    name: Option<String>,
    node: Option<String>,
    node_labels: Option<BTreeMap<String, String>>,
    node_sandboxes: Option<u64>,
    lease_ttl: Option<String>,
    poll_interval: Option<String>,
    redrive_after: Option<String>,
    stop_grace: Option<String>,
    max_upload_bytes: Option<u64>,
    max_ttl: Option<String>,
    max_pool: Option<u32>,
    max_snapshots: Option<u32>,
    max_snapshot_bytes: Option<u64>,
    heartbeat: Option<String>,
    changes_kept: Option<u64>,
    store_connections: Option<usize>,
    store_ca: Option<PathBuf>,
    egress_resolve: Option<Vec<String>>,
    log: Option<String>,
    log_format: Option<LogFormat>,
}

/// The settings the gateway runs with. Its `Debug` is what the gateway logs at start: every
/// setting, the token only as where it came from and a store URL without its password.
#[derive(Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub http_listen: Option<SocketAddr>,
    pub e2b_listen: Option<SocketAddr>,
    pub proxy_listen: Option<SocketAddr>,
    pub proxy_domain: Option<String>,
    /// The certificate chain and key every TCP listener serves TLS with.
    pub tls: Option<TlsFiles>,
    pub tls_ca: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub driver: DriverKind,
    pub store: StoreLocation,
    pub api_token: Option<String>,
    pub supervisor_bin: PathBuf,
    pub docker_socket: PathBuf,
    pub podman_socket: PathBuf,
    pub instance: Option<String>,
    pub name: String,
    /// `None`: the instance name.
    pub node: Option<String>,
    pub node_labels: BTreeMap<String, String>,
    pub node_sandboxes: u64,
    pub lease_ttl: Duration,
    pub poll_interval: Duration,
    pub redrive_after: Duration,
    pub stop_grace: Duration,
    pub max_upload_bytes: u64,
    pub max_ttl: Duration,
    pub max_pool: u32,
    pub max_snapshots: u32,
    pub max_snapshot_bytes: u64,
    pub heartbeat: Duration,
    pub changes_kept: u64,
    pub store_connections: usize,
    pub store_ca: Option<PathBuf>,
    pub egress_resolve: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    pub log: String,
    pub log_format: LogFormat,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = match self.api_token {
            Some(_) => "<given>",
            None => "<in the data directory>",
        };
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("metrics_listen", &self.metrics_listen)
            .field("http_listen", &self.http_listen)
            .field("e2b_listen", &self.e2b_listen)
            .field("proxy_listen", &self.proxy_listen)
            .field("proxy_domain", &self.proxy_domain)
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca)
            .field("data_dir", &self.data_dir)
            .field("driver", &self.driver)
            .field("store", &format_args!("{}", self.store))
            .field("api_token", &format_args!("{token}"))
            .field("supervisor_bin", &self.supervisor_bin)
            .field("docker_socket", &self.docker_socket)
            .field("podman_socket", &self.podman_socket)
            .field("instance", &self.instance)
            .field("name", &self.name)
            .field("node", &self.node)
            .field("node_labels", &self.node_labels)
            .field("node_sandboxes", &self.node_sandboxes)
            .field("lease_ttl", &self.lease_ttl)
            .field("poll_interval", &self.poll_interval)
            .field("redrive_after", &self.redrive_after)
            .field("stop_grace", &self.stop_grace)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("max_ttl", &self.max_ttl)
            .field("max_pool", &self.max_pool)
            .field("max_snapshots", &self.max_snapshots)
            .field("max_snapshot_bytes", &self.max_snapshot_bytes)
            .field("heartbeat", &self.heartbeat)
            .field("changes_kept", &self.changes_kept)
            .field("store_connections", &self.store_connections)
            .field("store_ca", &self.store_ca)
            .field("egress_resolve", &self.egress_resolve)
            .field("log", &self.log)
            .field("log_format", &self.log_format)
            .finish()
    }
}

/// The files of `--tls-cert` and `--tls-key`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A domain the preview proxy routes under: a host name, lowercased.
fn proxy_domain(text: &str) -> Result<String, String> {
    berth_core::egress::host_name(text).map_err(|why| format!("'{text}' is not a domain: {why}"))
}

/// A node's label, `KEY=VALUE`, as a user's sandbox label is.
fn node_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text.split_once('=').ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    berth_core::validate::user_label("node_labels", key, value).map_err(|e| e.to_string())?;
    Ok((key.to_string(), value.to_string()))
}

/// A gateway's name names files: keep it to a safe alphabet.
fn gateway_name(name: String) -> Result<String, String> {
    let valid = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if valid {
        Ok(name)
    } else {
        Err(format!("name: {name:?} must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"))
    }
}

fn default_docker_socket() -> PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

impl Config {
    pub fn load(flags: Flags) -> Result<Self, String> {
        let file: File = match &flags.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => File::default(),
        };
        let from_file = |name: &str, value: Option<String>| -> Result<Option<Duration>, String> {
            value.map(|v| duration(&v).map_err(|e| format!("{name}: {e}"))).transpose()
        };
        let supervisor_bin = match flags.supervisor_bin.or(file.supervisor_bin) {
            Some(path) => path,
            None => std::env::current_exe()
                .map_err(|e| format!("cannot locate berth-supervisor: {e}"))?
                .with_file_name("berth-supervisor"),
        };
        let data_dir = flags.data_dir.or(file.data_dir).unwrap_or_else(crate::data_dir::default_path);
        let store = StoreLocation::parse(flags.store.or(file.store).as_deref().unwrap_or("sqlite"), &data_dir)?;
        let name = gateway_name(flags.name.or(file.name).unwrap_or_else(|| crate::data_dir::DEFAULT_NAME.to_string()))?;
        let node = flags
            .node
            .or(file.node)
            .map(|node| berth_core::validate::dns_label("node", &node).map(|()| node).map_err(|e| e.to_string()))
            .transpose()?;
        let node_labels = if flags.node_labels.is_empty() {
            let labels = file.node_labels.unwrap_or_default();
            for (key, value) in &labels {
                node_label(&format!("{key}={value}"))?;
            }
            labels
        } else {
            flags.node_labels.into_iter().collect()
        };
        let node_sandboxes = match flags.node_sandboxes.or(file.node_sandboxes) {
            Some(0) => {
                return Err("node_sandboxes: a node that takes no sandbox cannot run any; give at least 1".into());
            }
            n => n.unwrap_or(1000),
        };
        let lease_ttl = flags.lease_ttl.or(from_file("lease_ttl", file.lease_ttl)?).unwrap_or(Duration::from_secs(15));
        if lease_ttl < Duration::from_millis(300) {
            return Err(format!("lease_ttl: {lease_ttl:?} is too short to renew in time; give at least 300ms"));
        }
        let changes_kept = flags.changes_kept.or(file.changes_kept).unwrap_or(crate::store::CHANGES_KEPT);
        if changes_kept == 0 {
            return Err("changes_kept: 0 would keep no change for a watch to resume from; give at least 1".into());
        }
        let store_connections = match (flags.store_connections.or(file.store_connections), &store) {
            (Some(0), _) => return Err("store_connections: 0 connections could serve no call; give at least 1".into()),
            (Some(_), StoreLocation::Sqlite(_)) => {
                return Err("store_connections: applies to a postgres:// store, and the store is SQLite".into());
            }
            (n, _) => n.unwrap_or(crate::store::postgres::CONNECTIONS),
        };
        let store_ca = flags.store_ca.or(file.store_ca);
        if store_ca.is_some() && matches!(store, StoreLocation::Sqlite(_)) {
            return Err("store_ca: applies to a postgres:// store, and the store is SQLite".into());
        }
        let egress_resolve = if flags.egress_resolve.is_empty() {
            file.egress_resolve
                .unwrap_or_default()
                .iter()
                .map(|pin| crate::egress::pin(pin).map_err(|e| format!("egress_resolve: {e}")))
                .collect::<Result<_, _>>()?
        } else {
            flags.egress_resolve.into_iter().collect()
        };
        let tls = match (flags.tls_cert.or(file.tls_cert), flags.tls_key.or(file.tls_key)) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => return Err("tls_key: --tls-cert needs the certificate's key (--tls-key)".into()),
            (None, Some(_)) => return Err("tls_cert: --tls-key needs its certificate (--tls-cert)".into()),
        };
        Ok(Self {
            listen: flags.listen.or(file.listen).unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7420))),
            metrics_listen: flags.metrics_listen.or(file.metrics_listen),
            http_listen: flags.http_listen.or(file.http_listen),
            e2b_listen: flags.e2b_listen.or(file.e2b_listen),
            proxy_listen: flags.proxy_listen.or(file.proxy_listen),
            proxy_domain: match flags.proxy_domain {
                Some(domain) => Some(domain),
                None => {
                    file.proxy_domain.map(|d| proxy_domain(&d).map_err(|e| format!("proxy_domain: {e}"))).transpose()?
                }
            },
            tls,
            tls_ca: flags.tls_ca.or(file.tls_ca),
            data_dir,
            driver: flags.driver.or(file.driver).unwrap_or(DriverKind::Process),
            store,
            api_token: flags.api_token.or(file.api_token),
            supervisor_bin,
            docker_socket: flags.docker_socket.or(file.docker_socket).unwrap_or_else(default_docker_socket),
            podman_socket: flags
                .podman_socket
                .or(file.podman_socket)
                .unwrap_or_else(|| PathBuf::from("/run/podman/podman.sock")),
            instance: flags.instance.or(file.instance),
            name,
            node,
            node_labels,
            node_sandboxes,
            lease_ttl,
            poll_interval: flags
                .poll_interval
                .or(from_file("poll_interval", file.poll_interval)?)
                .unwrap_or(Duration::from_secs(10)),
            redrive_after: flags
                .redrive_after
                .or(from_file("redrive_after", file.redrive_after)?)
                .unwrap_or(Duration::from_secs(30)),
            stop_grace: flags
                .stop_grace
                .or(from_file("stop_grace", file.stop_grace)?)
                .unwrap_or(Duration::from_secs(10)),
            max_upload_bytes: flags
                .max_upload_bytes
                .or(file.max_upload_bytes)
                .unwrap_or(berth_drivers::files::Limits::default().max_bytes),
            max_ttl: flags
                .max_ttl
                .or(from_file("max_ttl", file.max_ttl)?)
                .unwrap_or(berth_core::validate::Limits::default().max_ttl),
            max_pool: flags.max_pool.or(file.max_pool).unwrap_or(berth_core::validate::Limits::default().max_pool),
            max_snapshots: flags
                .max_snapshots
                .or(file.max_snapshots)
                .unwrap_or(berth_core::validate::Limits::default().max_snapshots),
            max_snapshot_bytes: flags
                .max_snapshot_bytes
                .or(file.max_snapshot_bytes)
                .unwrap_or(berth_core::validate::Limits::default().max_snapshot_bytes),
            heartbeat: flags.heartbeat.or(from_file("heartbeat", file.heartbeat)?).unwrap_or(Duration::from_secs(5)),
            changes_kept,
            store_connections,
            store_ca,
            egress_resolve,
            log: flags.log.or(file.log).unwrap_or_else(|| "info".to_string()),
            log_format: flags.log_format.or(file.log_format).unwrap_or(LogFormat::Text),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let dir = std::env::temp_dir().join(format!("berth-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("berth.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:9000\"\npoll_interval = \"250ms\"\nstop_grace = \"3s\"\n").unwrap();
        let flags = Flags { config: Some(path.clone()), stop_grace: Some(Duration::from_secs(7)), ..Flags::default() };
        let config = Config::load(flags).unwrap();
        assert_eq!(config.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(config.poll_interval, Duration::from_millis(250));
        assert_eq!(config.stop_grace, Duration::from_secs(7));
        assert_eq!(config.redrive_after, Duration::from_secs(30));
        std::fs::write(&path, "poll_interval = \"often\"\n").unwrap();
        let err = Config::load(Flags { config: Some(path.clone()), ..Flags::default() }).unwrap_err();
        assert!(err.contains("poll_interval"), "{err}");
        std::fs::write(&path, "egress_resolve = [\"One.test=127.0.0.2,::1\"]\n").unwrap();
        let pinned = Config::load(Flags { config: Some(path.clone()), ..Flags::default() }).unwrap();
        let one: Vec<std::net::IpAddr> = vec!["127.0.0.2".parse().unwrap(), "::1".parse().unwrap()];
        assert_eq!(pinned.egress_resolve, [("one.test".to_string(), one)].into());
        let flag = vec![("two.test".to_string(), vec!["127.0.0.3".parse().unwrap()])];
        let flags = Flags { config: Some(path.clone()), egress_resolve: flag.clone(), ..Flags::default() };
        assert_eq!(
            Config::load(flags).unwrap().egress_resolve,
            flag.into_iter().collect(),
            "the flags replace the file's"
        );
        std::fs::write(&path, "egress_resolve = [\"one.test\"]\n").unwrap();
        let err = Config::load(Flags { config: Some(path.clone()), ..Flags::default() }).unwrap_err();
        assert!(err.contains("egress_resolve"), "{err}");
        std::fs::write(&path, "pol_interval = \"1s\"\n").unwrap();
        let err = Config::load(Flags { config: Some(path), ..Flags::default() }).unwrap_err();
        assert!(err.contains("pol_interval"), "unknown keys are named: {err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn gateway_names_name_files_so_only_a_safe_alphabet_passes() {
        let load = |name: &str| Config::load(Flags { name: Some(name.into()), ..Flags::default() });
        assert_eq!(load("gw-2.east_1").unwrap().name, "gw-2.east_1");
        assert_eq!(Config::load(Flags::default()).unwrap().name, "gateway");
        for bad in ["", ".hidden", "a/b", "../x", "a b", &"x".repeat(65)] {
            let err = load(bad).unwrap_err();
            assert!(err.starts_with("name:"), "{bad:?}: {err}");
        }
        let short = Config::load(Flags { lease_ttl: Some(Duration::from_millis(100)), ..Flags::default() });
        assert!(short.unwrap_err().starts_with("lease_ttl:"));
    }

    #[test]
    fn a_node_is_named_and_labelled_as_safely_as_a_gateway_and_takes_a_sandbox_at_least() {
        let defaults = Config::load(Flags::default()).unwrap();
        assert_eq!((defaults.node, defaults.node_labels.len(), defaults.node_sandboxes), (None, 0, 1000));
        let flags = Flags {
            node: Some("rack1-n2".into()),
            node_labels: vec![("zone".into(), "a".into())],
            node_sandboxes: Some(40),
            ..Flags::default()
        };
        let config = Config::load(flags).unwrap();
        assert_eq!(config.node.as_deref(), Some("rack1-n2"));
        assert_eq!(config.node_labels, BTreeMap::from([("zone".to_string(), "a".to_string())]));
        assert_eq!(config.node_sandboxes, 40);
        for bad in ["a/b", "Upper", "-n1", &"n".repeat(64)] {
            let err = Config::load(Flags { node: Some(bad.into()), ..Flags::default() }).unwrap_err();
            assert!(err.contains("node"), "{bad}: {err}");
        }
        let err = Config::load(Flags { node_sandboxes: Some(0), ..Flags::default() }).unwrap_err();
        assert!(err.starts_with("node_sandboxes:"), "{err}");
        assert!(node_label("zone=a").is_ok());
        assert!(node_label("zone").unwrap_err().contains("KEY=VALUE"));
        for bad in ["-zone=a", "berth.zone=a", "zone=a b"] {
            assert!(node_label(bad).unwrap_err().contains("node_labels"), "{bad}");
        }
    }

    #[test]
    fn stores_are_named_by_url_and_passwords_never_shown() {
        let data = Path::new("/var/lib/berth");
        let load = |store: &str| {
            Config::load(Flags { data_dir: Some(data.into()), store: Some(store.into()), ..Flags::default() })
        };
        assert_eq!(load("sqlite").unwrap().store, StoreLocation::Sqlite(data.join("berth.db")));
        assert_eq!(load("sqlite:/tmp/b.db").unwrap().store, StoreLocation::Sqlite("/tmp/b.db".into()));
        let pg = load("postgres://berth:s3cret@db.internal:5433/berth").unwrap().store;
        assert_eq!(pg, StoreLocation::Postgres("postgres://berth:s3cret@db.internal:5433/berth".into()));
        assert_eq!(pg.to_string(), "postgres://berth:<redacted>@db.internal:5433/berth");
        assert!(!format!("{pg:?}").contains("s3cret"));
        assert_eq!(load("postgresql://db/berth").unwrap().store.to_string(), "postgresql://db/berth");
        for bad in ["mysql://db", "sqlite:", "berth.db"] {
            let err = load(bad).unwrap_err();
            assert!(err.starts_with("store:"), "{bad}: {err}");
        }
    }

    #[test]
    fn store_connections_size_a_postgres_pool_only() {
        let load = |store: &str, connections: Option<usize>| {
            Config::load(Flags { store: Some(store.into()), store_connections: connections, ..Flags::default() })
        };
        let pg = "postgres://db/berth";
        assert_eq!(load(pg, None).unwrap().store_connections, crate::store::postgres::CONNECTIONS);
        assert_eq!(load(pg, Some(3)).unwrap().store_connections, 3);
        let err = load(pg, Some(0)).unwrap_err();
        assert!(err.starts_with("store_connections: 0"), "{err}");
        let err = load("sqlite", Some(4)).unwrap_err();
        assert!(err.starts_with("store_connections:") && err.contains("SQLite"), "{err}");
        assert!(load("sqlite", None).is_ok());
    }

    #[test]
    fn a_store_ca_is_for_a_postgres_store() {
        let load = |store: &str| {
            Config::load(Flags { store: Some(store.into()), store_ca: Some("ca.pem".into()), ..Flags::default() })
        };
        let config = load("postgres://db/berth?sslmode=require").unwrap();
        assert_eq!(config.store_ca.as_deref(), Some(Path::new("ca.pem")));
        let err = load("sqlite").unwrap_err();
        assert!(err.starts_with("store_ca:") && err.contains("SQLite"), "{err}");
    }
}
