//! `berth`: the command-line client of the public API.
//!
//! It finds the gateway and its token from flags, `BERTH_*` variables, or the gateway's data
//! directory. Lifecycle commands wait for their target phase by default, showing the current
//! phase, and fail (non-zero status, the server's message) if the sandbox lands in Error.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use berth_proto::v1 as pb;
use berth_proto::v1::execs_client::ExecsClient;
use berth_proto::v1::files_client::FilesClient;
use berth_proto::v1::gateway_client::GatewayClient;
use berth_proto::v1::logs_client::LogsClient;
use berth_proto::v1::providers_client::ProvidersClient;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use berth_proto::v1::templates_client::TemplatesClient;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tonic::Request;
use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::config::default_data_dir;
use crate::server::{API_TOKEN_FILE, DEFAULT_NAME, address_file};

/// `println!` that ends the CLI quietly once whoever reads its output has gone
/// (`berth sandbox list | head -1`), as a Unix tool does, instead of panicking on the write.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::say(format_args!($($arg)*))
    };
}

mod templates;

#[derive(Parser)]
#[command(name = "berth", version, about = "Drive a Berth gateway: sandboxes and providers")]
pub struct Cli {
    #[command(flatten)]
    connection: Connection,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Top,
}

/// Where the gateway is, and the token it takes.
#[derive(Args, Clone)]
struct Connection {
    /// The gateway's address (a bare HOST:PORT is taken as http://HOST:PORT). [default: from
    /// <data-dir>/<name>.addr, else http://127.0.0.1:7420]
    #[arg(long, env = "BERTH_GATEWAY", global = true)]
    gateway: Option<String>,
    /// Which gateway of the data directory, by its --name. [default: "gateway", or the only one
    /// there]
    #[arg(long = "name", env = "BERTH_GATEWAY_NAME", global = true)]
    gateway_name: Option<String>,
    /// The API token. [default: from <data-dir>/api-token]
    #[arg(long, env = "BERTH_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// The gateway's data directory, to find its address and token.
    #[arg(long, env = "BERTH_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Top {
    /// Create, inspect and drive sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Create, inspect and attach providers (credentials for sandboxes).
    #[command(subcommand)]
    Provider(ProviderCmd),
    /// Inspect, attach to and cancel execs.
    #[command(subcommand)]
    Exec(ExecCmd),
    /// Create, inspect and delete templates: named specs with a warm pool.
    #[command(subcommand)]
    Template(templates::TemplateCmd),
    /// Size and inspect templates' warm pools.
    #[command(subcommand)]
    Pool(templates::PoolCmd),
    /// Print this client's version and the gateway's.
    Version,
    /// Print a shell completion script: `berth completions bash > /etc/bash_completion.d/berth`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum ExecCmd {
    /// Print an exec's output from an offset until it ends; exits with its exit status.
    Attach {
        sandbox: String,
        id: String,
        /// Where to start in its output (stdout and stderr together, in bytes).
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// Show one exec.
    Get { sandbox: String, id: String },
    /// List a sandbox's execs (every page).
    List { sandbox: String },
    /// Cancel an exec: it is killed (TERM, then KILL) and ends Cancelled, unless it ended first.
    Cancel { sandbox: String, id: String },
}

#[derive(Args)]
struct Wait {
    /// Return once the gateway accepted the command, without waiting for the target phase.
    #[arg(long)]
    no_wait: bool,
    /// Give up waiting after this long.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// What a sandbox runs, and its policies: for a sandbox or a template.
#[derive(Args)]
struct SpecArgs {
    /// The image to run (the process driver runs COMMAND on this host and ignores it).
    #[arg(long, default_value = "host")]
    image: String,
    /// An environment variable, KEY=VALUE (repeatable).
    #[arg(long = "env", short, value_parser = pair)]
    env: Vec<(String, String)>,
    /// A label, KEY=VALUE (repeatable).
    #[arg(long = "label", short, value_parser = pair)]
    labels: Vec<(String, String)>,
    #[command(flatten)]
    lifetime: LifetimeArgs,
    #[command(flatten)]
    restart: RestartArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// Where its runs may connect, through Berth's egress proxy: a host name, `*.suffix` or a
    /// CIDR block (repeatable). Without one, nowhere.
    #[arg(long = "allow")]
    allow: Vec<String>,
}

/// What the run may use; the runtime enforces it.
#[derive(Args)]
struct LimitArgs {
    /// CPU cores, fractional (0.5, 1.5): the CPU time it gets per wall-clock time.
    #[arg(long, value_parser = cpus)]
    cpus: Option<i64>,
    /// Memory, swap included: bytes, or with a suffix (512Mi, 2G). A run needing more is killed
    /// and ends in Error OutOfMemory.
    #[arg(long, value_parser = bytes)]
    memory: Option<i64>,
    /// Processes and threads together, the supervisor's few included.
    #[arg(long)]
    pids: Option<i64>,
}

impl LimitArgs {
    fn wire(&self) -> Option<pb::ResourceLimits> {
        let limits = pb::ResourceLimits { cpu_millis: self.cpus, memory_bytes: self.memory, pids: self.pids };
        (limits != pb::ResourceLimits::default()).then_some(limits)
    }
}

/// `--cpus` in thousandths of a core.
fn cpus(s: &str) -> Result<i64, String> {
    match s.parse::<f64>() {
        Ok(cores) if cores.is_finite() && cores > 0.0 => Ok((cores * 1000.0).round() as i64),
        _ => Err(format!("{s:?} is not a positive number of cores")),
    }
}

/// A byte count: a number with an optional suffix, k M G T (powers of 1000) or Ki Mi Gi Ti
/// (of 1024), with or without a trailing B.
fn bytes(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not a size: a number of bytes, or with a suffix (512Mi, 2G)");
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let number: i64 = s[..digits].parse().map_err(|_| bad())?;
    let suffix = s[digits..].trim().trim_end_matches(['B', 'b']);
    let scale: i64 = match suffix {
        "" => 1,
        "k" | "K" => 1000,
        "Ki" => 1 << 10,
        "M" => 1000 * 1000,
        "Mi" => 1 << 20,
        "G" => 1000 * 1000 * 1000,
        "Gi" => 1 << 30,
        "T" => 1000 * 1000 * 1000 * 1000,
        "Ti" => 1 << 40,
        _ => return Err(bad()),
    };
    number.checked_mul(scale).ok_or_else(bad)
}

impl SpecArgs {
    fn wire(self: Box<Self>, command: Vec<String>) -> pb::SandboxSpec {
        pb::SandboxSpec {
            image: self.image,
            command,
            env: self.env.into_iter().collect(),
            labels: self.labels.into_iter().collect(),
            lifetime: Some(self.lifetime.wire()),
            restart: Some(self.restart.wire()),
            limits: self.limits.wire(),
            egress: (!self.allow.is_empty()).then_some(pb::EgressPolicy { allow: self.allow }),
        }
    }
}

#[derive(Args)]
struct LifetimeArgs {
    /// The deadline is this long after the create (a pool member's: after its claim), and
    /// after every renew and start.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// While it is meant to run, expire it after this long without activity (no exec, attach
    /// or logs follow; an open exec holds it off). Counted from the create (a pool member's:
    /// its claim) and every start.
    #[arg(long, value_parser = humantime::parse_duration)]
    idle_timeout: Option<Duration>,
    /// What the deadline and the idle timeout do when they pass.
    #[arg(long, value_enum, default_value_t = OnExpiryArg::Stop)]
    on_expiry: OnExpiryArg,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnExpiryArg {
    Stop,
    Delete,
}

#[derive(Args)]
struct RestartArgs {
    /// Start a new generation when the run ends by itself: never, on a failure, or always.
    #[arg(long, value_enum, default_value_t = RestartArg::Never)]
    restart: RestartArg,
    /// The most restarts since the last create or start; then it stays ended with the count.
    #[arg(long, requires = "restart")]
    max_restarts: Option<u32>,
    /// The wait before the first restart; it doubles with each one. [default: 1s]
    #[arg(long, value_parser = humantime::parse_duration)]
    restart_backoff: Option<Duration>,
    /// The longest wait between restarts. [default: 5m]
    #[arg(long, value_parser = humantime::parse_duration)]
    restart_max_backoff: Option<Duration>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RestartArg {
    Never,
    OnFailure,
    Always,
}

fn wire_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn unix_millis(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => wire_millis(d),
        Err(e) => -wire_millis(e.duration()),
    }
}

fn show_time(unix_ms: Option<i64>) -> String {
    let Some(ms) = unix_ms.and_then(|ms| u64::try_from(ms).ok()) else { return String::new() };
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

impl LifetimeArgs {
    fn wire(&self) -> pb::Lifetime {
        pb::Lifetime {
            ttl_ms: self.ttl.map(wire_millis),
            idle_timeout_ms: self.idle_timeout.map(wire_millis),
            on_expiry: match self.on_expiry {
                OnExpiryArg::Stop => pb::OnExpiry::Stop,
                OnExpiryArg::Delete => pb::OnExpiry::Delete,
            } as i32,
        }
    }
}

impl RestartArgs {
    fn wire(&self) -> pb::RestartPolicy {
        pb::RestartPolicy {
            mode: match self.restart {
                RestartArg::Never => pb::RestartMode::Never,
                RestartArg::OnFailure => pb::RestartMode::OnFailure,
                RestartArg::Always => pb::RestartMode::Always,
            } as i32,
            max_restarts: self.max_restarts,
            backoff_ms: self.restart_backoff.map(wire_millis),
            max_backoff_ms: self.restart_max_backoff.map(wire_millis),
        }
    }
}

#[derive(Args)]
struct Versioned {
    /// Fail with ABORTED unless the record still has this resource version.
    #[arg(long)]
    expected_version: Option<u64>,
}

fn pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[derive(Subcommand)]
enum SandboxCmd {
    /// Create a sandbox running COMMAND and wait until it is Ready.
    Create {
        name: String,
        #[command(flatten)]
        spec: Box<SpecArgs>,
        /// A provider to attach (repeatable).
        #[arg(long = "provider", short)]
        providers: Vec<String>,
        /// An absolute deadline instead of a TTL, RFC 3339 (`2026-12-01T18:00:00Z`).
        #[arg(long, value_parser = humantime::parse_rfc3339_weak, conflicts_with = "ttl")]
        deadline: Option<std::time::SystemTime>,
        #[command(flatten)]
        wait: Wait,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Take a Ready sandbox from a template's warm pool (never one another claim got), with
    /// labels and providers added; prints it.
    Claim {
        template: String,
        /// A label to add, KEY=VALUE (repeatable).
        #[arg(long = "label", short, value_parser = pair)]
        labels: Vec<(String, String)>,
        /// A provider to attach: its credentials reach execs at once (repeatable).
        #[arg(long = "provider", short)]
        providers: Vec<String>,
        /// Wait this long for a Ready member if the pool has none (default: fail at once).
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
    },
    /// Give a sandbox a new deadline: its TTL (or --ttl) from now, or --deadline. An expired,
    /// stopped sandbox stays stopped until started.
    Renew {
        name: String,
        /// The new deadline is this long from now (default: the sandbox's TTL).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "deadline")]
        ttl: Option<Duration>,
        /// The new deadline, RFC 3339 (`2026-12-01T18:00:00Z`).
        #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
        deadline: Option<std::time::SystemTime>,
        #[command(flatten)]
        version: Versioned,
    },
    /// Show one sandbox.
    Get { name: String },
    /// List sandboxes (every page).
    List {
        /// Only sandboxes with this label, KEY=VALUE (repeatable).
        #[arg(long = "selector", short, value_parser = pair)]
        selector: Vec<(String, String)>,
    },
    /// Print the sandbox, then every change, until it is gone or interrupted. Without a name,
    /// every sandbox (or those the selector picks), then every change to any of them, until
    /// interrupted: through gateway restarts, resuming where it was.
    Watch {
        name: Option<String>,
        /// Only sandboxes with this label, KEY=VALUE (repeatable; without a name only).
        #[arg(long = "selector", short, value_parser = pair, conflicts_with = "name")]
        selector: Vec<(String, String)>,
    },
    /// Stop a sandbox (its workspace is kept) and wait until it is Stopped.
    Stop {
        name: String,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Start a stopped (or failed) sandbox with a new runtime identity and wait until it is Ready.
    Start {
        name: String,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Delete a sandbox and everything made for it, and wait until it is gone.
    Delete {
        name: String,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Copy a file or directory into or out of a sandbox's workspace, like `docker cp`: one side
    /// is `NAME:PATH` (relative to the workspace, or under /workspace), and SRC is copied into
    /// the directory DST (made if missing), keeping its name. Works on a Stopped sandbox too.
    Cp { src: String, dst: String },
    /// Print what the sandbox's command wrote, stdout to stdout and stderr to stderr: its
    /// current run's output, or an earlier generation's (kept for the newest 8, even once the
    /// sandbox is Stopped or in Error).
    Logs {
        name: String,
        /// Go on printing as the command writes, until its run ends.
        #[arg(long, short)]
        follow: bool,
        /// The generation whose run's output to print (default: the current one).
        #[arg(long)]
        generation: Option<u64>,
        /// Start at this byte offset of the output.
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// Run a command in a Ready sandbox, streaming its output; exits with its exit status
    /// (128+N if signal N killed it, 124 if it timed out).
    Exec {
        name: String,
        /// Pass this terminal's stdin to the command.
        #[arg(long, short)]
        interactive: bool,
        /// Run the command on a terminal (its output is then one stream); with -i this
        /// terminal is put in raw mode and its size follows this one's.
        #[arg(long, short)]
        tty: bool,
        /// Kill the command after this long (it ends TimedOut).
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// The exec's id: running again with the same id and command attaches to the first
        /// run instead of running it twice.
        #[arg(long)]
        id: Option<String>,
        /// An environment variable, KEY=VALUE (repeatable).
        #[arg(long = "env", short, value_parser = pair)]
        env: Vec<(String, String)>,
        /// The working directory in the sandbox.
        #[arg(long, short)]
        workdir: Option<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ProviderCmd {
    /// Create a provider. Credential values are read from this process's environment, so they
    /// never appear in a command line.
    Create {
        name: String,
        #[arg(long)]
        kind: String,
        /// A credential: the name of an environment variable of this process whose value it
        /// takes, also the name it gets in sandboxes (repeatable).
        #[arg(long = "credential-from-env")]
        credentials: Vec<String>,
        /// Where the credentials are for: a host name, `*.suffix` or a CIDR block (repeatable).
        /// Attaching the provider lets a sandbox's runs reach them from their next start.
        #[arg(long = "endpoint")]
        endpoints: Vec<String>,
    },
    /// Show one provider (credential names only).
    Get { name: String },
    /// List providers.
    List,
    /// Delete a provider (refused while a sandbox that is not being deleted uses it).
    Delete {
        name: String,
        #[command(flatten)]
        version: Versioned,
    },
    /// Attach a provider to a sandbox (applies at its next start).
    Attach {
        sandbox: String,
        provider: String,
        #[command(flatten)]
        version: Versioned,
    },
    /// Detach a provider from a sandbox.
    Detach {
        sandbox: String,
        provider: String,
        #[command(flatten)]
        version: Versioned,
    },
}

type Authed = InterceptedService<Channel, Bearer>;

#[derive(Clone)]
struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, tonic::Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

struct Client {
    /// How it connected, to connect again.
    connection: Connection,
    sandboxes: SandboxesClient<Authed>,
    providers: ProvidersClient<Authed>,
    execs: ExecsClient<Authed>,
    logs: LogsClient<Authed>,
    files: FilesClient<Authed>,
    templates: TemplatesClient<Authed>,
    gateway: GatewayClient<Authed>,
    output: Output,
}

/// Whether a stream ended with `code` because the gateway went away (a restart, a lost
/// connection), so that it is worth connecting again.
fn lost(code: tonic::Code) -> bool {
    matches!(code, tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Aborted)
}

/// A failure, printed as `error: ...`.
struct Failed(String);

impl From<tonic::Status> for Failed {
    fn from(s: tonic::Status) -> Self {
        Failed(format!("{:?}: {}", s.code(), s.message()))
    }
}

fn phase_name(phase: i32) -> &'static str {
    pb::Phase::try_from(phase).map_or("Unknown", |p| match p {
        pb::Phase::Unspecified => "Unknown",
        pb::Phase::Provisioning => "Provisioning",
        pb::Phase::Starting => "Starting",
        pb::Phase::Ready => "Ready",
        pb::Phase::Stopping => "Stopping",
        pb::Phase::Stopped => "Stopped",
        pb::Phase::Deleting => "Deleting",
        pb::Phase::Error => "Error",
    })
}

fn intent_name(intent: i32) -> &'static str {
    pb::Intent::try_from(intent).map_or("Unknown", |i| match i {
        pb::Intent::Unspecified => "Unknown",
        pb::Intent::Running => "Running",
        pb::Intent::Stopped => "Stopped",
        pb::Intent::Deleted => "Deleted",
    })
}

fn spec_json(spec: &pb::SandboxSpec) -> serde_json::Value {
    json!({
        "image": spec.image, "command": spec.command, "env": spec.env, "labels": spec.labels,
        "lifetime": spec.lifetime.map(|l| json!({
            "ttl_ms": l.ttl_ms, "idle_timeout_ms": l.idle_timeout_ms,
            "on_expiry": if l.on_expiry == pb::OnExpiry::Delete as i32 { "delete" } else { "stop" },
        })),
        "restart": spec.restart.map(|r| json!({
            "mode": pb::RestartMode::try_from(r.mode).map_or("never", |m| match m {
                pb::RestartMode::OnFailure => "on-failure",
                pb::RestartMode::Always => "always",
                pb::RestartMode::Never | pb::RestartMode::Unspecified => "never",
            }),
            "max_restarts": r.max_restarts, "backoff_ms": r.backoff_ms, "max_backoff_ms": r.max_backoff_ms,
        })),
        "limits": spec.limits.map(|l| json!({
            "cpu_millis": l.cpu_millis, "memory_bytes": l.memory_bytes, "pids": l.pids,
        })),
        "egress": spec.egress.as_ref().map(|e| &e.allow),
    })
}

fn sandbox_json(s: &pb::Sandbox) -> serde_json::Value {
    let spec = s.spec.clone().unwrap_or_default();
    json!({
        "id": s.id, "name": s.name, "phase": phase_name(s.phase), "intent": intent_name(s.intent),
        "failure": s.failure.as_ref().map(|f| json!({"reason": f.reason, "exit_code": f.exit_code, "message": f.message})),
        "completed": s.completed,
        "resource_version": s.resource_version, "generation": s.generation, "providers": s.providers,
        "egress_providers": s.egress_providers,
        "deadline_unix_ms": s.deadline_unix_ms, "expired_at_unix_ms": s.expired_at_unix_ms,
        "active_at_unix_ms": s.active_at_unix_ms, "idle_expired_at_unix_ms": s.idle_expired_at_unix_ms,
        "restart_count": s.restart_count, "next_restart_unix_ms": s.next_restart_unix_ms,
        "template": (!s.template.is_empty()).then_some(&s.template), "pool_member": s.pool_member,
        "spec": spec_json(&spec),
        "created_at_unix_ms": s.created_at_unix_ms, "updated_at_unix_ms": s.updated_at_unix_ms,
    })
}

fn provider_json(p: &pb::Provider) -> serde_json::Value {
    json!({
        "name": p.name, "kind": p.kind, "credential_names": p.credential_names, "endpoints": p.endpoints,
        "resource_version": p.resource_version,
    })
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<String>| {
        cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(line));
    out.join("\n")
}

fn sandbox_row(s: &pb::Sandbox) -> Vec<String> {
    let reason = match &s.failure {
        Some(f) => match f.exit_code {
            Some(code) => format!("{} (exit {code})", f.reason),
            None => f.reason.clone(),
        },
        None if s.completed => "Completed (exit 0)".to_string(),
        None if s.expired_at_unix_ms.is_some() => "Expired".to_string(),
        None if s.idle_expired_at_unix_ms.is_some() => "Expired (idle)".to_string(),
        None => String::new(),
    };
    vec![
        s.name.clone(),
        phase_name(s.phase).to_string(),
        intent_name(s.intent).to_string(),
        s.generation.to_string(),
        s.resource_version.to_string(),
        s.providers.join(","),
        show_time(s.deadline_unix_ms),
        s.restart_count.to_string(),
        reason,
    ]
}

const SANDBOX_HEADER: [&str; 9] =
    ["NAME", "PHASE", "INTENT", "GENERATION", "VERSION", "PROVIDERS", "DEADLINE", "RESTARTS", "REASON"];

/// What a lifecycle command waits for.
#[derive(Clone, Copy)]
enum Target {
    Ready,
    Stopped,
    Gone,
}

impl Client {
    /// Every page of the sandboxes `selector` picks, and the first page's cursor: a fleet watch
    /// from it misses nothing the pages do not show.
    async fn list_all(&mut self, selector: &BTreeMap<String, String>) -> Result<(Vec<pb::Sandbox>, String), Status> {
        let mut all = Vec::new();
        let mut first = None;
        let mut page_token = String::new();
        loop {
            let request = pb::ListSandboxesRequest { page_size: 500, page_token, label_selector: selector.clone() };
            let reply = self.sandboxes.list_sandboxes(request).await?.into_inner();
            first.get_or_insert(reply.cursor);
            all.extend(reply.sandboxes);
            if reply.next_page_token.is_empty() {
                return Ok((all, first.unwrap_or_default()));
            }
            page_token = reply.next_page_token;
        }
    }

    fn print_change(&self, name: &str, sandbox: Option<&pb::Sandbox>) {
        match (sandbox, self.output) {
            (Some(s), Output::Json) => say!("{}", sandbox_json(s)),
            (Some(s), Output::Table) => say!("{}", sandbox_row(s).join("  ").trim_end()),
            (None, Output::Json) => say!("{}", json!({"name": name, "removed": true})),
            (None, Output::Table) => say!("{name}  removed"),
        }
    }

    /// `berth sandbox watch` without a name: the listing, then the fleet watch from its cursor;
    /// after a lost connection the same watch from the last cursor, after a cursor the gateway
    /// no longer reaches back to a new listing (printing what it changed).
    async fn watch_fleet(&mut self, selector: BTreeMap<String, String>) -> Result<u8, Failed> {
        // What was printed of each sandbox: its id and version.
        let mut shown: BTreeMap<String, (String, u64)> = BTreeMap::new();
        let mut cursor: Option<String> = None;
        loop {
            let ended = match cursor.clone() {
                None => match self.list_all(&selector).await {
                    Ok((all, first)) => {
                        let listed: BTreeMap<String, (String, u64)> =
                            all.iter().map(|s| (s.name.clone(), (s.id.clone(), s.resource_version))).collect();
                        let gone: Vec<String> = shown.keys().filter(|n| !listed.contains_key(*n)).cloned().collect();
                        for name in gone {
                            self.print_change(&name, None);
                        }
                        for s in all.iter().filter(|s| shown.get(&s.name) != listed.get(&s.name)) {
                            self.print_change(&s.name, Some(s));
                        }
                        shown = listed;
                        cursor = Some(first);
                        continue;
                    }
                    Err(status) => status,
                },
                Some(from) => {
                    let request = pb::WatchSandboxesRequest { label_selector: selector.clone(), cursor: from };
                    match self.sandboxes.watch_sandboxes(request).await {
                        Ok(events) => self.follow_fleet(events.into_inner(), &mut shown, &mut cursor).await,
                        Err(status) => status,
                    }
                }
            };
            match ended.code() {
                tonic::Code::FailedPrecondition => {
                    eprintln!("berth: {}", ended.message());
                    cursor = None;
                }
                code if lost(code) => {
                    eprintln!("berth: lost the gateway ({}); reconnecting", ended.message());
                    self.reconnect().await;
                    eprintln!("berth: reconnected; watching from where it was");
                }
                _ => return Err(ended.into()),
            }
        }
    }

    /// Prints the fleet watch's changes not yet shown; why it ended.
    async fn follow_fleet(
        &self,
        mut events: tonic::Streaming<pb::SandboxEvent>,
        shown: &mut BTreeMap<String, (String, u64)>,
        cursor: &mut Option<String>,
    ) -> Status {
        loop {
            let event = match events.message().await {
                Ok(Some(event)) => event,
                Ok(None) => return Status::unavailable("the gateway ended the watch"),
                Err(status) => return status,
            };
            if event.name.is_empty() {
                *cursor = Some(event.cursor);
                continue;
            }
            match &event.sandbox {
                _ if event.removed => {
                    shown.remove(&event.name);
                    self.print_change(&event.name, None);
                }
                // A listing of several pages can show a change the watch then brings again.
                Some(s) if shown.get(&s.name).is_none_or(|(id, v)| *id != s.id || *v < s.resource_version) => {
                    shown.insert(s.name.clone(), (s.id.clone(), s.resource_version));
                    self.print_change(&s.name, Some(s));
                }
                _ => {}
            }
            *cursor = Some(event.cursor);
        }
    }

    /// Connects again, however long the gateway takes to come back: it may restart at another
    /// address (its address file says where).
    async fn reconnect(&mut self) {
        let mut wait = Duration::from_millis(200);
        loop {
            tokio::time::sleep(wait).await;
            if let Ok(client) = connect(&self.connection, self.output).await {
                *self = client;
                return;
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    fn print_sandboxes(&self, sandboxes: &[pb::Sandbox]) {
        match self.output {
            Output::Json if sandboxes.len() == 1 => say!("{:#}", sandbox_json(&sandboxes[0])),
            Output::Json => say!("{:#}", json!(sandboxes.iter().map(sandbox_json).collect::<Vec<_>>())),
            Output::Table => say!("{}", table(&SANDBOX_HEADER, sandboxes.iter().map(sandbox_row).collect())),
        }
    }

    fn print_providers(&self, providers: &[pb::Provider]) {
        match self.output {
            Output::Json if providers.len() == 1 => say!("{:#}", provider_json(&providers[0])),
            Output::Json => say!("{:#}", json!(providers.iter().map(provider_json).collect::<Vec<_>>())),
            Output::Table => say!(
                "{}",
                table(
                    &["NAME", "KIND", "CREDENTIALS", "ENDPOINTS", "VERSION"],
                    providers
                        .iter()
                        .map(|p| vec![
                            p.name.clone(),
                            p.kind.clone(),
                            p.credential_names.join(","),
                            p.endpoints.join(","),
                            p.resource_version.to_string()
                        ])
                        .collect()
                )
            ),
        }
    }

    /// The gateway's version and what it runs on (the client's is printed before connecting).
    async fn version(&mut self) -> Result<(), Failed> {
        let info = self.gateway.get_info(pb::GetInfoRequest {}).await?.into_inner();
        match self.output {
            Output::Json => say!(
                "{}",
                json!({"client": env!("CARGO_PKG_VERSION"), "gateway": {
                    "version": info.version, "name": info.name, "store": info.store, "driver": info.driver,
                }})
            ),
            Output::Table => {
                say!("gateway {} ({}, {} store, {} driver)", info.version, info.name, info.store, info.driver)
            }
        }
        Ok(())
    }

    /// Waits for `target`, showing the phase; fails on Error (unless that is where a stop or
    /// delete is headed from).
    async fn wait(&mut self, name: &str, target: Target, wait: &Wait) -> Result<Option<pb::Sandbox>, Failed> {
        let spinner = ProgressBar::new_spinner();
        spinner.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"));
        spinner.enable_steady_tick(Duration::from_millis(100));
        let waiting = tokio::time::timeout(wait.timeout, async {
            let watch = self.sandboxes.watch_sandbox(pb::WatchSandboxRequest { name: name.to_string() }).await;
            let mut events = match (watch, target) {
                (Ok(events), _) => events.into_inner(),
                // Already gone before the watch began.
                (Err(s), Target::Gone) if s.code() == tonic::Code::NotFound => return Ok(None),
                (Err(s), _) => return Err(s.into()),
            };
            while let Some(event) = events.message().await? {
                let Some(s) = event.sandbox else {
                    return match target {
                        Target::Gone => Ok(None),
                        _ => Err(Failed(format!("sandbox '{name}' was deleted"))),
                    };
                };
                spinner.set_message(format!("{name}: {}", phase_name(s.phase)));
                let phase = pb::Phase::try_from(s.phase).unwrap_or(pb::Phase::Unspecified);
                match (target, phase) {
                    (Target::Ready, pb::Phase::Ready) | (Target::Stopped, pb::Phase::Stopped) => return Ok(Some(s)),
                    // The command ran and exited 0 before it was seen Ready: done, not failed.
                    (Target::Ready, pb::Phase::Stopped) if s.completed => return Ok(Some(s)),
                    (Target::Ready | Target::Stopped, pb::Phase::Error) => {
                        let f = s.failure.unwrap_or_default();
                        return Err(Failed(format!("sandbox '{name}' failed: {} ({})", f.reason, f.message)));
                    }
                    _ => {}
                }
            }
            Err(Failed(format!("the watch of '{name}' ended early")))
        });
        let result = tokio::select! {
            result = waiting => result,
            _ = tokio::signal::ctrl_c() => {
                spinner.finish_and_clear();
                eprintln!(
                    "berth: stopped waiting; the gateway carries on with '{name}' (`berth sandbox get {name}` shows where it is)"
                );
                std::process::exit(130);
            }
        };
        spinner.finish_and_clear();
        result.unwrap_or_else(|_| Err(Failed(format!("timed out after {:?} waiting for '{name}'", wait.timeout))))
    }

    async fn lifecycle(&mut self, reply: pb::SandboxReply, target: Target, wait: &Wait) -> Result<(), Failed> {
        let sandbox = reply.sandbox.unwrap_or_default();
        // A start or stop that found the sandbox where it was headed changed nothing: say so.
        let already = match (target, pb::Phase::try_from(sandbox.phase)) {
            (Target::Ready, Ok(pb::Phase::Ready)) => Some("Ready"),
            (Target::Stopped, Ok(pb::Phase::Stopped)) => Some("Stopped"),
            _ => None,
        };
        if let Some(phase) = already {
            eprintln!("berth: sandbox '{}' is already {phase} (generation {})", sandbox.name, sandbox.generation);
        }
        if wait.no_wait {
            self.print_sandboxes(&[sandbox]);
            return Ok(());
        }
        match self.wait(&sandbox.name, target, wait).await? {
            Some(s) => self.print_sandboxes(&[s]),
            None if self.output == Output::Json => say!("{}", json!({"name": sandbox.name, "deleted": true})),
            None => say!("sandbox '{}' deleted", sandbox.name),
        }
        Ok(())
    }

    async fn sandbox(&mut self, command: SandboxCmd) -> Result<u8, Failed> {
        match command {
            SandboxCmd::Exec { name, interactive, tty, timeout, id, env, workdir, command } => {
                let start = pb::ExecStart {
                    sandbox: name,
                    argv: command,
                    env: env.into_iter().collect(),
                    cwd: workdir.unwrap_or_default(),
                    tty,
                    stdin: interactive,
                    timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
                    exec_id: id.unwrap_or_default(),
                    window: tty.then(window_size).flatten(),
                };
                return self.exec(start).await;
            }
            SandboxCmd::Cp { src, dst } => return self.cp(&src, &dst).await,
            SandboxCmd::Claim { template, labels, providers, wait } => {
                let request = pb::ClaimSandboxRequest {
                    template,
                    labels: labels.into_iter().collect(),
                    providers,
                    wait_ms: wait.map(|w| u32::try_from(w.as_millis()).unwrap_or(u32::MAX)),
                };
                let reply = self.templates.claim_sandbox(request).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
                Ok(())
            }
            SandboxCmd::Logs { name, follow, generation, offset } => {
                let request =
                    pb::ReadLogsRequest { sandbox: name, generation: generation.unwrap_or(0), offset, follow };
                return print_logs(self.logs.read_logs(request).await?.into_inner()).await;
            }
            SandboxCmd::Create { name, spec, providers, deadline, wait, command } => {
                let request = pb::CreateSandboxRequest {
                    name,
                    spec: Some(spec.wire(command)),
                    providers,
                    expected_resource_version: None,
                    deadline_unix_ms: deadline.map(unix_millis),
                };
                let reply = self.sandboxes.create_sandbox(request).await?.into_inner();
                self.lifecycle(reply, Target::Ready, &wait).await
            }
            SandboxCmd::Renew { name, ttl, deadline, version } => {
                let request = pb::RenewSandboxRequest {
                    name,
                    ttl_ms: ttl.map(wire_millis),
                    deadline_unix_ms: deadline.map(unix_millis),
                    expected_resource_version: version.expected_version,
                };
                let reply = self.sandboxes.renew_sandbox(request).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
                Ok(())
            }
            SandboxCmd::Get { name } => {
                let reply = self.sandboxes.get_sandbox(pb::GetSandboxRequest { name }).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
                Ok(())
            }
            SandboxCmd::List { selector } => {
                let (all, _) = self.list_all(&selector.into_iter().collect()).await?;
                match self.output {
                    Output::Json => say!("{:#}", json!(all.iter().map(sandbox_json).collect::<Vec<_>>())),
                    Output::Table => self.print_sandboxes(&all),
                }
                Ok(())
            }
            SandboxCmd::Watch { name: None, selector } => {
                return self.watch_fleet(selector.into_iter().collect()).await;
            }
            SandboxCmd::Watch { name: Some(name), .. } => {
                let mut events =
                    self.sandboxes.watch_sandbox(pb::WatchSandboxRequest { name: name.clone() }).await?.into_inner();
                while let Some(event) = events.message().await? {
                    match (event.sandbox, self.output) {
                        (Some(s), Output::Json) => say!("{}", sandbox_json(&s)),
                        (Some(s), Output::Table) => say!("{}", sandbox_row(&s).join("  ").trim_end()),
                        (None, Output::Json) => say!("{}", json!({"name": name, "removed": true})),
                        (None, Output::Table) => say!("{name}  removed"),
                    }
                }
                Ok(())
            }
            SandboxCmd::Stop { name, version, wait } => {
                let request = pb::LifecycleRequest { name, expected_resource_version: version.expected_version };
                let reply = self.sandboxes.stop_sandbox(request).await?.into_inner();
                self.lifecycle(reply, Target::Stopped, &wait).await
            }
            SandboxCmd::Start { name, version, wait } => {
                let request = pb::LifecycleRequest { name, expected_resource_version: version.expected_version };
                let reply = self.sandboxes.start_sandbox(request).await?.into_inner();
                self.lifecycle(reply, Target::Ready, &wait).await
            }
            SandboxCmd::Delete { name, version, wait } => {
                let request = pb::LifecycleRequest { name, expected_resource_version: version.expected_version };
                let reply = self.sandboxes.delete_sandbox(request).await?.into_inner();
                self.lifecycle(reply, Target::Gone, &wait).await
            }
        }
        .map(|()| 0)
    }

    async fn provider(&mut self, command: ProviderCmd) -> Result<(), Failed> {
        match command {
            ProviderCmd::Create { name, kind, credentials, endpoints } => {
                let mut values = BTreeMap::new();
                for key in credentials {
                    let value = std::env::var(&key)
                        .map_err(|_| Failed(format!("--credential-from-env {key}: no such environment variable")))?;
                    values.insert(key, value);
                }
                let request = pb::CreateProviderRequest {
                    name,
                    kind,
                    credentials: values,
                    expected_resource_version: None,
                    endpoints,
                };
                let reply = self.providers.create_provider(request).await?.into_inner();
                self.print_providers(&[reply.provider.unwrap_or_default()]);
            }
            ProviderCmd::Get { name } => {
                let reply = self.providers.get_provider(pb::GetProviderRequest { name }).await?.into_inner();
                self.print_providers(&[reply.provider.unwrap_or_default()]);
            }
            ProviderCmd::List => {
                let mut all = Vec::new();
                let mut page_token = String::new();
                loop {
                    let reply = self
                        .providers
                        .list_providers(pb::ListProvidersRequest { page_size: 500, page_token })
                        .await?
                        .into_inner();
                    all.extend(reply.providers);
                    if reply.next_page_token.is_empty() {
                        break;
                    }
                    page_token = reply.next_page_token;
                }
                match self.output {
                    Output::Json => say!("{:#}", json!(all.iter().map(provider_json).collect::<Vec<_>>())),
                    Output::Table => self.print_providers(&all),
                }
            }
            ProviderCmd::Delete { name, version } => {
                let request = pb::DeleteProviderRequest {
                    name: name.clone(),
                    expected_resource_version: version.expected_version,
                };
                self.providers.delete_provider(request).await?;
                match self.output {
                    Output::Json => say!("{}", json!({"name": name, "deleted": true})),
                    Output::Table => say!("provider '{name}' deleted"),
                }
            }
            ProviderCmd::Attach { sandbox, provider, version } => {
                let request =
                    pb::AttachRequest { sandbox, provider, expected_resource_version: version.expected_version };
                let reply = self.providers.attach_provider(request).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
            }
            ProviderCmd::Detach { sandbox, provider, version } => {
                let request =
                    pb::AttachRequest { sandbox, provider, expected_resource_version: version.expected_version };
                let reply = self.providers.detach_provider(request).await?.into_inner();
                self.print_sandboxes(&[reply.sandbox.unwrap_or_default()]);
            }
        }
        Ok(())
    }
}

/// The status `berth` exits with for an exec that ended so: its own code, 128+N for signal N,
/// 124 for a timeout (as timeout(1)), 130 for a cancel, 255 for a lost run.
fn exec_status(exec: &pb::Exec) -> u8 {
    let code = match pb::ExecState::try_from(exec.state).unwrap_or_default() {
        pb::ExecState::Exited => exec.exit_code.unwrap_or(1),
        pb::ExecState::Signalled => 128 + exec.signal.unwrap_or(0),
        pb::ExecState::TimedOut => 124,
        pb::ExecState::Cancelled => 130,
        _ => 255,
    };
    u8::try_from(code & 0xff).unwrap_or(255)
}

fn exec_state_name(state: i32) -> &'static str {
    pb::ExecState::try_from(state).map_or("Unknown", |s| match s {
        pb::ExecState::Unspecified => "Unknown",
        pb::ExecState::Admitted => "Admitted",
        pb::ExecState::Running => "Running",
        pb::ExecState::Exited => "Exited",
        pb::ExecState::Signalled => "Signalled",
        pb::ExecState::TimedOut => "TimedOut",
        pb::ExecState::Cancelled => "Cancelled",
        pb::ExecState::Lost => "Lost",
    })
}

fn exec_json(e: &pb::Exec) -> serde_json::Value {
    json!({
        "id": e.id, "sandbox": e.sandbox, "argv": e.argv, "state": exec_state_name(e.state),
        "exit_code": e.exit_code, "signal": e.signal, "message": e.message, "generation": e.generation,
        "cancel_requested": e.cancel_requested, "output_bytes": e.output_bytes,
        "resource_version": e.resource_version,
    })
}

fn exec_row(e: &pb::Exec) -> Vec<String> {
    let end = match (e.exit_code, e.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => e.message.clone(),
    };
    vec![e.id.clone(), exec_state_name(e.state).to_string(), end, e.argv.join(" ")]
}

impl Client {
    fn print_execs(&self, execs: &[pb::Exec]) {
        match self.output {
            Output::Json if execs.len() == 1 => say!("{:#}", exec_json(&execs[0])),
            Output::Json => say!("{:#}", json!(execs.iter().map(exec_json).collect::<Vec<_>>())),
            Output::Table => {
                say!("{}", table(&["ID", "STATE", "END", "COMMAND"], execs.iter().map(exec_row).collect()))
            }
        }
    }

    /// Runs `start`, passing stdin if it asks for it, and prints the output as it comes.
    async fn exec(&mut self, start: pb::ExecStart) -> Result<u8, Failed> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (interactive, tty) = (start.stdin, start.tty);
        let first = pb::ExecInput { input: Some(pb::exec_input::Input::Start(start)) };
        tx.send(first).await.map_err(|_| Failed("the request stream closed".into()))?;
        // Without stdin the request side stays open until the end all the same: closing it early
        // would end nothing, but some proxies take a half-closed stream for a finished call.
        let raw = (interactive && tty).then(RawMode::enter).flatten();
        let held = if interactive {
            if tty {
                tokio::spawn(follow_window(tx.clone()));
            }
            tokio::spawn(send_stdin(tx));
            None
        } else {
            Some(tx)
        };
        let events = self.execs.exec(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
        let status = print_output(events).await;
        drop(held);
        drop(raw);
        status
    }

    async fn exec_command(&mut self, command: ExecCmd) -> Result<u8, Failed> {
        match command {
            ExecCmd::Attach { sandbox, id, offset } => {
                let request = pb::AttachExecRequest { sandbox, exec_id: id, offset };
                let events = self.execs.attach_exec(request).await?.into_inner();
                print_output(events).await
            }
            ExecCmd::Get { sandbox, id } => {
                let reply = self.execs.get_exec(pb::ExecRequest { sandbox, exec_id: id }).await?.into_inner();
                self.print_execs(&[reply.exec.unwrap_or_default()]);
                Ok(0)
            }
            ExecCmd::List { sandbox } => {
                let mut all = Vec::new();
                let mut page_token = String::new();
                loop {
                    let request = pb::ListExecsRequest { sandbox: sandbox.clone(), page_size: 500, page_token };
                    let reply = self.execs.list_execs(request).await?.into_inner();
                    all.extend(reply.execs);
                    if reply.next_page_token.is_empty() {
                        break;
                    }
                    page_token = reply.next_page_token;
                }
                self.print_execs(&all);
                Ok(0)
            }
            ExecCmd::Cancel { sandbox, id } => {
                let reply = self.execs.cancel_exec(pb::ExecRequest { sandbox, exec_id: id }).await?.into_inner();
                self.print_execs(&[reply.exec.unwrap_or_default()]);
                Ok(0)
            }
        }
    }
}

/// `NAME:PATH` as a sandbox and a path in it; a local path otherwise.
fn sandbox_path(arg: &str) -> Option<(&str, &str)> {
    let (name, path) = arg.split_once(':')?;
    let named = !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    named.then_some((name, path))
}

/// `src` packed as a tar stream (links as links), in a file.
fn pack_local(src: &std::path::Path) -> Result<std::fs::File, Failed> {
    use std::io::Seek as _;
    let failed = |e: std::io::Error| Failed(format!("cannot pack {}: {e}", src.display()));
    let name = src.file_name().ok_or_else(|| Failed(format!("{} names no file", src.display())))?;
    let mut spool = tempfile::tempfile().map_err(failed)?;
    {
        let mut builder = tar::Builder::new(&mut spool);
        builder.follow_symlinks(false);
        if std::fs::symlink_metadata(src).map_err(failed)?.is_dir() {
            builder.append_dir_all(name, src).map_err(failed)?;
        } else {
            builder.append_path_with_name(src, name).map_err(failed)?;
        }
        builder.finish().map_err(failed)?;
    }
    spool.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
    Ok(spool)
}

impl Client {
    async fn cp(&mut self, src: &str, dst: &str) -> Result<u8, Failed> {
        match (sandbox_path(src), sandbox_path(dst)) {
            (None, Some((sandbox, path))) => self.upload(std::path::Path::new(src), sandbox, path).await,
            (Some((sandbox, path)), None) => self.download(sandbox, path, std::path::Path::new(dst)).await,
            _ => Err(Failed("one side of cp is NAME:PATH in a sandbox, the other a local path".into())),
        }
    }

    async fn upload(&mut self, src: &std::path::Path, sandbox: &str, path: &str) -> Result<u8, Failed> {
        use std::io::Read as _;
        let mut spool = pack_local(src)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let start = pb::UploadStart { sandbox: sandbox.to_string(), path: path.to_string() };
        tx.send(pb::UploadInput { input: Some(pb::upload_input::Input::Start(start)) }).await.ok();
        let sending = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match spool.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let data = pb::UploadInput { input: Some(pb::upload_input::Input::Data(buf[..n].to_vec())) };
                        if tx.blocking_send(data).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let reply = self.files.upload(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
        sending.abort();
        let files = reply?.into_inner().files;
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        say!("copied {} entries ({bytes} bytes) into {sandbox}:{path}", files.len());
        Ok(0)
    }

    async fn download(&mut self, sandbox: &str, path: &str, dst: &std::path::Path) -> Result<u8, Failed> {
        use sha2::Digest as _;
        use std::io::{Seek as _, Write as _};
        let request = pb::DownloadRequest { sandbox: sandbox.to_string(), path: path.to_string() };
        let mut stream = self.files.download(request).await?.into_inner();
        let failed = |e: std::io::Error| Failed(format!("cannot unpack into {}: {e}", dst.display()));
        let mut spool = tempfile::tempfile().map_err(failed)?;
        let mut hasher = sha2::Sha256::new();
        let end = loop {
            match stream.message().await?.and_then(|m| m.output) {
                Some(pb::download_output::Output::Data(data)) => {
                    hasher.update(&data);
                    spool.write_all(&data).map_err(failed)?;
                }
                Some(pb::download_output::Output::End(end)) => break end,
                None => return Err(Failed("the gateway closed the download before its end".into())),
            }
        };
        let got = hex::encode(hasher.finalize());
        if got != end.sha256 {
            return Err(Failed(format!("the download arrived damaged: SHA-256 {got}, sent {}", end.sha256)));
        }
        spool.seek(std::io::SeekFrom::Start(0)).map_err(failed)?;
        std::fs::create_dir_all(dst).map_err(failed)?;
        tar::Archive::new(spool).unpack(dst).map_err(failed)?;
        say!("copied {} entries ({} bytes of tar) from {sandbox}:{path}", end.files.len(), end.bytes);
        Ok(0)
    }
}

/// This terminal's size, if stdout is one.
fn window_size() -> Option<pb::WindowSize> {
    let (rows, cols) = console::Term::stdout().size_checked()?;
    Some(pb::WindowSize { rows: rows.into(), cols: cols.into() })
}

/// Sends this terminal's size whenever it changes.
async fn follow_window(tx: tokio::sync::mpsc::Sender<pb::ExecInput>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut changes) = signal(SignalKind::window_change()) else { return };
    while changes.recv().await.is_some() {
        let Some(window) = window_size() else { continue };
        if tx.send(pb::ExecInput { input: Some(pb::exec_input::Input::Resize(window)) }).await.is_err() {
            return;
        }
    }
}

/// This terminal in raw mode (keys go to the command as typed, Ctrl-C included), until dropped.
struct RawMode(nix::sys::termios::Termios);

impl RawMode {
    fn enter() -> Option<Self> {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let before = tcgetattr(&stdin).ok()?;
        let mut raw = before.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(Self(before))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, &self.0);
    }
}

async fn send_stdin(tx: tokio::sync::mpsc::Sender<pb::ExecInput>) {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0; 64 << 10];
    loop {
        let input = match stdin.read(&mut buffer).await {
            Ok(0) | Err(_) => pb::exec_input::Input::CloseStdin(pb::CloseStdin {}),
            Ok(n) => pb::exec_input::Input::Stdin(buffer[..n].to_vec()),
        };
        let closing = matches!(input, pb::exec_input::Input::CloseStdin(_));
        if tx.send(pb::ExecInput { input: Some(input) }).await.is_err() || closing {
            break;
        }
    }
    // The request side stays open: the exec runs on whatever the client does.
    std::future::pending::<()>().await;
}

/// One line to stdout, for [`say!`].
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        ended_output(&e);
    }
}

/// The end of the CLI once its output cannot be written: quietly if its reader went, else
/// saying why.
fn ended_output(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write the output: {e}");
    std::process::exit(1);
}

/// Writes a chunk of output where its stream goes: stderr to stderr, the rest to stdout.
fn write_chunk(chunk: &pb::OutputChunk) -> Result<(), Failed> {
    use std::io::Write as _;
    if chunk.stream == i32::from(pb::OutputStream::Stderr) {
        return std::io::stderr().write_all(&chunk.data).map_err(|e| Failed(format!("cannot write the output: {e}")));
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(&chunk.data).and_then(|()| out.flush()) {
        ended_output(&e);
    }
    Ok(())
}

/// Writes a sandbox's logs as they come.
async fn print_logs(mut events: tonic::Streaming<pb::LogsOutput>) -> Result<u8, Failed> {
    use pb::logs_output::Output as Event;
    while let Some(event) = events.message().await? {
        match event.output {
            Some(Event::Chunk(chunk)) => write_chunk(&chunk)?,
            Some(Event::Gap(gap)) => {
                eprintln!("berth: output {}..{} is no longer kept (over the generation's cap)", gap.from, gap.to)
            }
            Some(Event::End(_)) => return Ok(0),
            None => {}
        }
    }
    Err(Failed("the gateway closed the logs' stream before their end".into()))
}

/// Writes an exec's output to stdout and stderr as it comes; the exit status of its end.
async fn print_output(mut events: tonic::Streaming<pb::ExecOutput>) -> Result<u8, Failed> {
    use pb::exec_output::Output as Event;
    while let Some(event) = events.message().await? {
        match event.output {
            Some(Event::Chunk(chunk)) => write_chunk(&chunk)?,
            Some(Event::Gap(gap)) => {
                eprintln!("berth: output {}..{} is no longer kept (over the exec's cap)", gap.from, gap.to)
            }
            Some(Event::End(exec)) => {
                if !exec.message.is_empty() {
                    eprintln!("berth: exec {} {}: {}", exec.id, exec_state_name(exec.state), exec.message);
                }
                return Ok(exec_status(&exec));
            }
            Some(Event::Admitted(_)) | None => {}
        }
    }
    Err(Failed("the gateway closed the exec's stream before it ended".into()))
}

fn read_trimmed(path: PathBuf) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Where the gateway is, and where that was learnt: the flag (a bare `HOST:PORT` taken as
/// plain HTTP), the address file of the gateway named, of the one gateway of the data
/// directory, or the default.
fn gateway_address(cli: &Connection, data: &std::path::Path) -> Result<(String, String), Failed> {
    if let Some(address) = &cli.gateway {
        let address = if address.contains("://") { address.clone() } else { format!("http://{address}") };
        return Ok((address, "--gateway".to_string()));
    }
    let from_file = |name: &str| {
        let path = data.join(address_file(name));
        read_trimmed(path.clone()).map(|address| (address, path.display().to_string()))
    };
    if let Some(name) = &cli.gateway_name {
        return from_file(name).ok_or_else(|| {
            Failed(format!("no gateway named {name:?} has run from {} (no {})", data.display(), address_file(name)))
        });
    }
    if let Some(found) = from_file(DEFAULT_NAME) {
        return Ok(found);
    }
    let mut named: Vec<String> = std::fs::read_dir(data)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(".addr").map(str::to_string))
        .collect();
    named.sort();
    match named.as_slice() {
        [] => Ok(("http://127.0.0.1:7420".to_string(), "the default".to_string())),
        [one] => from_file(one).ok_or_else(|| Failed(format!("{} is empty", data.join(address_file(one)).display()))),
        several => Err(Failed(format!(
            "several gateways have run from {}: {}; pick one with --name (or --gateway)",
            data.display(),
            several.join(", ")
        ))),
    }
}

/// An error and every cause under it: a transport error says why ("connection refused").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = c.source();
    }
    message
}

async fn connect(cli: &Connection, output: Output) -> Result<Client, Failed> {
    let data = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    let (address, source) = gateway_address(cli, &data)?;
    let token = cli.token.clone().or_else(|| read_trimmed(data.join(API_TOKEN_FILE))).ok_or_else(|| {
        Failed(format!(
            "no API token: pass --token, set BERTH_TOKEN, or point --data-dir at the gateway's ({})",
            data.display()
        ))
    })?;
    let bearer = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|_| Failed("the token is not valid ASCII".into()))?;
    let channel = Endpoint::from_shared(address.clone())
        .map_err(|e| Failed(format!("{address:?} (from {source}) is not a gateway address: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| {
            Failed(format!(
                "cannot reach the gateway at {address} (from {source}): {}; is it running?",
                with_causes(&e)
            ))
        })?;
    let auth = Bearer(bearer);
    Ok(Client {
        connection: cli.clone(),
        sandboxes: SandboxesClient::with_interceptor(channel.clone(), auth.clone()),
        providers: ProvidersClient::with_interceptor(channel.clone(), auth.clone()),
        execs: ExecsClient::with_interceptor(channel.clone(), auth.clone()),
        logs: LogsClient::with_interceptor(channel.clone(), auth.clone()),
        files: FilesClient::with_interceptor(channel.clone(), auth.clone()),
        templates: TemplatesClient::with_interceptor(channel.clone(), auth.clone()),
        gateway: GatewayClient::with_interceptor(channel, auth),
        output,
    })
}

/// Runs the CLI; returns the process's exit status.
pub async fn main(cli: Cli) -> std::process::ExitCode {
    let result = async {
        let command = match cli.command {
            Top::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "berth", &mut std::io::stdout());
                return Ok(0);
            }
            // The client's version, even when no gateway answers.
            Top::Version => {
                say!("client {}", env!("CARGO_PKG_VERSION"));
                Top::Version
            }
            command => command,
        };
        let mut client = connect(&cli.connection, cli.output).await?;
        match command {
            Top::Sandbox(c) => client.sandbox(c).await,
            Top::Provider(c) => client.provider(c).await.map(|()| 0),
            Top::Exec(c) => client.exec_command(c).await,
            Top::Template(c) => client.template(c).await.map(|()| 0),
            Top::Pool(c) => client.pool(c).await.map(|()| 0),
            Top::Version => client.version().await.map(|()| 0),
            // Answered above, before connecting.
            Top::Completions { .. } => Ok(0),
        }
    }
    .await;
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(Failed(message)) => {
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_thousandths_of_a_core() {
        assert_eq!(cpus("1.5"), Ok(1500));
        assert_eq!(cpus("0.25"), Ok(250));
        assert_eq!(cpus("2"), Ok(2000));
        for bad in ["0", "-1", "NaN", "inf", "one"] {
            assert!(cpus(bad).unwrap_err().contains(bad), "{bad}");
        }
    }

    #[test]
    fn sizes_take_decimal_and_binary_suffixes() {
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("512Mi"), Ok(512 << 20));
        assert_eq!(bytes("512MiB"), Ok(512 << 20));
        assert_eq!(bytes("2G"), Ok(2_000_000_000));
        assert_eq!(bytes("1Ti"), Ok(1 << 40));
        assert_eq!(bytes("3k"), Ok(3000));
        for bad in ["", "Mi", "1.5G", "12 parsecs", "-1", "9999999999Ti"] {
            assert!(bytes(bad).unwrap_err().contains("is not a size"), "{bad}");
        }
    }
}
