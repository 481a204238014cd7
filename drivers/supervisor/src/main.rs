//! berth-supervisor: runs inside every sandbox.
//!
//! It starts the sandbox's command, proves the run's identity to the gateway with the runtime
//! token it was given (`BERTH_RUNTIME_TOKEN`, never passed on to the command), keeps the
//! session alive with heartbeats, and reports how the command exited: to the gateway, and to a
//! file the driver reads. Its connection is the sandbox's readiness signal. It reconnects with
//! backoff when the gateway restarts; a gateway that rejects its identity (a stale generation)
//! makes it stop the command and exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_proto::v1::gateway_message::Message as FromGateway;
use berth_proto::v1::hello::MainProcess;
use berth_proto::v1::supervisor_client::SupervisorClient;
use berth_proto::v1::supervisor_message::Message as ToGateway;
use berth_proto::v1::{Heartbeat, Hello, MainProcessExit, SupervisorMessage};
use clap::Parser;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long the supervisor keeps trying to report the command's exit before giving up.
const REPORT_FOR: Duration = Duration::from_secs(15);
/// How long a command gets to end after SIGTERM when the supervisor must stop it itself.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(version, about = "Runs a sandbox's command and keeps its session with the Berth gateway")]
struct Args {
    /// Where gateways' supervisor API listens: `unix:/path/to/socket`, `unix:/a/directory`
    /// (each `*.sock` in it: the gateways sharing a data directory) or `http://host:port`.
    /// Several, separated by commas or given again: the session goes to any gateway that
    /// answers, and moves on to the next when its gateway goes away.
    #[arg(long, env = "BERTH_SUPERVISOR_GATEWAY", value_delimiter = ',', required = true)]
    gateway: Vec<String>,
    /// Where to record the command's exit code and finish time for the driver.
    #[arg(long)]
    exit_file: Option<PathBuf>,
    /// The runtime token of this run.
    #[arg(long, env = "BERTH_RUNTIME_TOKEN", hide_env_values = true, required_unless_present = "token_file")]
    token: Option<String>,
    /// A file holding the runtime token (container drivers rewrite it before every start).
    #[arg(long, conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// A JSON object of environment variables for the command (the spec's and the providers'),
    /// read at start.
    #[arg(long)]
    env_file: Option<PathBuf>,
    /// The sandbox's command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn log(message: impl std::fmt::Display) {
    eprintln!("berth-supervisor: {message}");
}

async fn connect(gateway: &str) -> Result<Channel, String> {
    if let Some(path) = gateway.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        });
        // The authority is unused: the connector dials the socket.
        Endpoint::from_static("http://berth-gateway").connect_with_connector(connector).await.map_err(|e| e.to_string())
    } else {
        let endpoint = Endpoint::from_shared(gateway.to_string()).map_err(|e| e.to_string())?;
        endpoint.connect().await.map_err(|e| e.to_string())
    }
}

/// Every endpoint the `--gateway` values name right now: a directory stands for the sockets it
/// holds at this moment, as gateways come and go.
fn endpoints(gateways: &[String]) -> Vec<String> {
    let mut all = Vec::new();
    for gateway in gateways {
        match gateway.strip_prefix("unix:").map(Path::new).filter(|p| p.is_dir()) {
            Some(dir) => {
                let mut sockets: Vec<String> = std::fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|entry| entry.path())
                    .filter(|path| path.extension().is_some_and(|e| e == "sock"))
                    .map(|path| format!("unix:{}", path.display()))
                    .collect();
                sockets.sort();
                all.extend(sockets);
            }
            None => all.push(gateway.clone()),
        }
    }
    all
}

enum SessionEnd {
    /// The gateway acknowledged the command's exit.
    Reported,
    /// The gateway will never accept this run: stop.
    Rejected(String),
}

/// Whether a refusal is final: this run's identity is stale, invalid, or its sandbox is gone.
fn is_final(code: Code) -> bool {
    matches!(code, Code::PermissionDenied | Code::Unauthenticated | Code::NotFound)
}

/// One connection: hello, heartbeats, and the exit report once the command has exited. The
/// hello says whether the command already ended (or never started), so that such a run is
/// never taken for Ready.
async fn session(
    gateway: &str,
    token: &str,
    exit: &mut watch::Receiver<Option<i32>>,
    failed_to_start: Option<&str>,
) -> Result<SessionEnd, String> {
    let channel = connect(gateway).await?;
    let (tx, rx) = mpsc::channel(4);
    let send = |m: ToGateway| {
        let tx = tx.clone();
        async move { tx.send(SupervisorMessage { message: Some(m) }).await.map_err(|_| "the session closed".to_string()) }
    };
    let main_process = match (failed_to_start, *exit.borrow()) {
        (Some(cause), _) => Some(MainProcess::FailedToStart(cause.to_string())),
        (None, Some(code)) => Some(MainProcess::Exited(code)),
        (None, None) => None,
    };
    send(ToGateway::Hello(Hello { runtime_token: token.to_string(), main_process })).await?;
    let mut inbound = match SupervisorClient::new(channel).session(ReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) if is_final(status.code()) => return Ok(SessionEnd::Rejected(status.message().to_string())),
        Err(status) => return Err(status.to_string()),
    };
    let accepted = match inbound.message().await {
        Ok(Some(m)) => match m.message {
            Some(FromGateway::Accepted(a)) => a,
            other => return Err(format!("expected Accepted, got {other:?}")),
        },
        Ok(None) => return Err("the gateway closed the session".to_string()),
        Err(status) if is_final(status.code()) => return Ok(SessionEnd::Rejected(status.message().to_string())),
        Err(status) => return Err(status.to_string()),
    };
    log(format_args!("connected: sandbox {} generation {}", accepted.sandbox_id, accepted.generation));
    let mut heartbeat =
        tokio::time::interval(Duration::from_millis(u64::from(accepted.heartbeat_interval_ms.max(100))));
    let mut reported = false;
    loop {
        let exited = if reported { None } else { *exit.borrow_and_update() };
        if let Some(code) = exited {
            send(ToGateway::Exit(MainProcessExit { exit_code: code })).await?;
            reported = true;
        }
        tokio::select! {
            biased;
            message = inbound.message() => match message {
                Ok(Some(m)) => if let Some(FromGateway::ExitAck(_)) = m.message { return Ok(SessionEnd::Reported) },
                Ok(None) => return Err("the gateway closed the session".to_string()),
                Err(status) if is_final(status.code()) => return Ok(SessionEnd::Rejected(status.message().to_string())),
                Err(status) => return Err(status.to_string()),
            },
            _ = exit.changed(), if !reported => {}
            _ = heartbeat.tick() => send(ToGateway::Heartbeat(Heartbeat {})).await?,
        }
    }
}

/// Keeps a session up until the exit is reported or the gateway rejects this run.
async fn keep_session(
    gateways: Vec<String>,
    token: String,
    mut exit: watch::Receiver<Option<i32>>,
    failed_to_start: Option<String>,
) -> SessionEnd {
    let mut backoff = Duration::from_millis(100);
    let mut reporting_since = None;
    // Each attempt goes to the next endpoint: a gateway that went away is not tried twice running.
    let mut attempt = 0usize;
    loop {
        let all = endpoints(&gateways);
        match all.get(attempt % all.len().max(1)) {
            None => log(format_args!("no gateway socket in {}; retrying in {backoff:?}", gateways.join(","))),
            Some(gateway) => match session(gateway, &token, &mut exit, failed_to_start.as_deref()).await {
                Ok(end) => return end,
                Err(e) => log(format_args!("session with {gateway} lost ({e}); retrying in {backoff:?}")),
            },
        }
        if exit.borrow().is_some() {
            let since = *reporting_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > REPORT_FOR {
                log("giving up reporting the exit; the driver's record of it remains");
                return SessionEnd::Reported;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
        attempt = attempt.wrapping_add(1);
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// Records the exit for the driver: atomically, so it never reads half a file.
fn record_exit(path: &Path, code: i32) {
    let finished_at = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let body = format!("{{\"exit_code\":{code},\"finished_at\":{finished_at}}}");
    let tmp = path.with_extension("tmp");
    if let Err(e) = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, path)) {
        log(format_args!("cannot record the exit in {}: {e}", path.display()));
    }
}

async fn stop(child: &mut tokio::process::Child) -> i32 {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(Ok(status)) => exit_code(status),
        _ => {
            let _ = child.kill().await;
            child.wait().await.map(exit_code).unwrap_or(137)
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The driver's record first: it must exist by the time anyone learns of the exit.
    let record = |code: i32| {
        if let Some(path) = &args.exit_file {
            record_exit(path, code);
        }
        ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1))
    };
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => token.clone(),
        (None, path) => match path.as_ref().map(std::fs::read_to_string) {
            Some(Ok(token)) => token.trim().to_string(),
            _ => {
                log("no runtime token: pass --token, BERTH_RUNTIME_TOKEN or a readable --token-file");
                return ExitCode::from(2);
            }
        },
    };
    let env: std::collections::BTreeMap<String, String> = match &args.env_file {
        None => Default::default(),
        Some(path) => match std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(env) => env,
            Err(e) => {
                log(format_args!("cannot read the environment from {}: {e}", path.display()));
                return ExitCode::from(2);
            }
        },
    };
    let (exit_tx, exit_rx) = watch::channel(None);
    // The command starts before the session opens, so the hello can tell a command that could
    // not start, or ended at once, from a running one.
    let spawned = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env_remove("BERTH_RUNTIME_TOKEN")
        .env_remove("BERTH_SUPERVISOR_GATEWAY")
        .envs(&env)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let cause = format!("cannot run {:?}: {e}", args.command[0]);
            log(&cause);
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            let status = record(code);
            let _ = exit_tx.send(Some(code));
            let _ = keep_session(args.gateway.clone(), token, exit_rx, Some(cause)).await;
            return status;
        }
    };
    let mut session = tokio::spawn(keep_session(args.gateway.clone(), token, exit_rx, None));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    // Told to terminate, the command's exit is the stop's doing, not a failure of the command:
    // the runtime reports that exit, the supervisor does not.
    let mut terminated = false;
    let code = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status.map(exit_code).unwrap_or(1),
            end = &mut session => {
                let reason = match end { Ok(SessionEnd::Rejected(reason)) => reason, _ => "the session ended".to_string() };
                log(format_args!("the gateway rejected this run ({reason}); stopping"));
                return record(stop(&mut child).await);
            }
            Some(()) = async { match terminate.as_mut() { Some(t) => t.recv().await, None => std::future::pending().await } } => {
                terminated = true;
                // Passed on, in case only the supervisor was signalled.
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
                }
            }
        }
    };
    log(format_args!("the command exited with code {code}"));
    let status = record(code);
    if !terminated {
        let _ = exit_tx.send(Some(code));
        let _ = session.await;
    }
    status
}
