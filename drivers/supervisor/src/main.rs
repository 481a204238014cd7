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
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_handoff::exit::Exit;
use berth_handoff::{began, flag, var};
use berth_proto::v1::Accepted;
use berth_supervisor::cgroup;
use berth_supervisor::exec::Execs;
use berth_supervisor::ports::{Loopback, Wire};
use berth_supervisor::session::{self, MainExit, Observer, Run, SessionEnd};
use clap::Parser;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long a command gets to end after SIGTERM when the supervisor must stop it itself.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(version, about = "Runs a sandbox's command and keeps its session with the Berth gateway")]
struct Args {
    /// Where gateways' supervisor API listens: `unix:/path/to/socket`, `unix:/a/directory`
    /// (each `*.sock` in it: the gateways sharing a data directory) or `http://host:port`.
    /// Several, separated by commas or given again: the session goes to any gateway that
    /// answers, and moves on to the next when its gateway goes away.
    #[arg(long, env = var::SUPERVISOR_GATEWAY, value_delimiter = ',', required = true)]
    gateway: Vec<String>,
    /// Where to record the command's exit code and finish time for the driver.
    #[arg(long = flag::EXIT_FILE)]
    exit_file: Option<PathBuf>,
    /// Where to record, once it has its token and before anything else, that this run began: the
    /// generation its token names. The process driver's proof that a run it lost track of (its
    /// gateway died as it spawned it, and the run died since without recording an exit) did
    /// begin; a container driver's word on which generation a run it did not start is.
    #[arg(long = flag::BEGAN_FILE)]
    began_file: Option<PathBuf>,
    /// The runtime token of this run.
    #[arg(long, env = var::RUNTIME_TOKEN, hide_env_values = true, required_unless_present = "token_file")]
    token: Option<String>,
    /// A file holding the runtime token (container drivers rewrite it before every start).
    #[arg(long = flag::TOKEN_FILE, conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Where to keep the ids of the execs this generation's runs started, so that a run restarted
    /// out of band never runs one again. Without it, only this process remembers.
    #[arg(long)]
    exec_log: Option<PathBuf>,
    /// Where to keep the command's output, per generation (DESIGN 8.2): outside the workspace,
    /// where the driver's host reads it while the run goes on and after it is over.
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Also pass the command's output on to the supervisor's own stdout and stderr (which a
    /// container runtime keeps).
    #[arg(long, requires = "logs")]
    echo_output: bool,
    /// A JSON object of environment variables for the command (the spec's and the providers'),
    /// read at start.
    #[arg(long = flag::ENV_FILE)]
    env_file: Option<PathBuf>,
    /// A cgroup directory to join before the command starts (the process driver's, holding the
    /// sandbox's limits); given again for each controller's. Failing to join one, the command
    /// does not run.
    #[arg(long = "cgroup")]
    cgroups: Vec<PathBuf>,
    /// Where to take the run's proxy requests (the sandbox's loopback, `127.0.0.1:3128`): each
    /// connection goes out through a gateway's egress proxy, which decides by the run's policy.
    #[arg(long)]
    egress_proxy: Option<std::net::SocketAddr>,
    /// The sandbox's command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn log(message: impl std::fmt::Display) {
    eprintln!("berth-supervisor: {message}");
}

async fn connect(gateway: &str) -> Result<Channel, String> {
    // HTTP/2 keepalive notices a gateway that went away without closing the connection; wide
    // windows keep a connection into the run (a download through the preview proxy) moving.
    let keepalive = |endpoint: Endpoint| {
        berth_proto::carry::wide(endpoint)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
    };
    if let Some(path) = gateway.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        });
        // The authority is unused: the connector dials the socket.
        keepalive(Endpoint::from_static("http://berth-gateway"))
            .connect_with_connector(connector)
            .await
            .map_err(|e| e.to_string())
    } else {
        let endpoint = Endpoint::from_shared(gateway.to_string()).map_err(|e| e.to_string())?;
        keepalive(endpoint).connect().await.map_err(|e| e.to_string())
    }
}

/// New connections to the endpoint `gateway` names, beside its channel: for each connection
/// into the run (`ports::open`).
fn wire(gateway: &str) -> Result<Wire, String> {
    if let Some(path) = gateway.strip_prefix("unix:") {
        let path = Arc::new(PathBuf::from(path));
        return Ok(Arc::new(move || {
            let path = Arc::clone(&path);
            Box::pin(async move {
                let stream = tokio::net::UnixStream::connect(path.as_path()).await?;
                Ok(Box::new(stream) as Box<dyn berth_supervisor::ports::Connection>)
            })
        }));
    }
    let uri: Uri = gateway.parse().map_err(|e| format!("{gateway}: {e}"))?;
    let host = uri.host().ok_or_else(|| format!("{gateway} names no host"))?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    Ok(Arc::new(move || {
        let host = host.clone();
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as Box<dyn berth_supervisor::ports::Connection>)
        })
    }))
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

/// The binary's ear on its session: the log.
struct Log;

impl Observer for Log {
    fn accepted(&mut self, accepted: &Accepted) {
        log(format_args!("connected: sandbox {} generation {}", accepted.sandbox_id, accepted.generation));
    }
    fn lost(&mut self, error: &str, retry_in: Duration) {
        log(format_args!("session lost ({error}); retrying in {retry_in:?}"));
    }
    fn gave_up(&mut self) {
        log("giving up reporting the exit; the driver's record of it remains");
    }
}

/// Keeps a session up with any of `gateways` (each attempt the next endpoint they name then).
async fn keep_session(gateways: Vec<String>, run: Run) -> SessionEnd {
    let connect = move |attempt: usize| {
        let gateways = gateways.clone();
        async move {
            let all = endpoints(&gateways);
            match all.get(attempt % all.len().max(1)) {
                None => Err(format!("no gateway socket in {}", gateways.join(","))),
                Some(gateway) => {
                    let channel = connect(gateway).await.map_err(|e| format!("{gateway}: {e}"))?;
                    Ok(session::Gateway { channel, wire: wire(gateway)? })
                }
            }
        }
    };
    session::keep_session(connect, run, &mut Log).await
}

/// The proxy listener's loop: each connection carried through a gateway. One connection to a
/// gateway serves them all while its socket stays; when it goes, the next one `gateways` name.
async fn proxy(listener: tokio::net::TcpListener, gateways: Vec<String>, token: String) {
    let token = std::sync::Arc::new(token);
    let mut current: Option<(String, Channel)> = None;
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        let _ = client.set_nodelay(true);
        let all = endpoints(&gateways);
        if current.as_ref().is_none_or(|(endpoint, _)| !all.contains(endpoint)) {
            current = None;
            for endpoint in all {
                // A gateway that died leaving its socket must not hold up the connections after.
                if let Ok(Ok(channel)) = tokio::time::timeout(Duration::from_secs(2), connect(&endpoint)).await {
                    current = Some((endpoint, channel));
                    break;
                }
            }
        }
        let Some((_, channel)) = current.clone() else {
            log("egress: no gateway answers; the connection is closed");
            continue;
        };
        let token = token.clone();
        tokio::spawn(async move {
            if let Err(e) = berth_supervisor::egress::serve(client, &token, channel).await {
                log(format_args!("egress: {e}"));
            }
        });
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// Writes a record for the driver (berth-handoff's format).
fn write_record(path: &Path, bytes: &[u8], what: &str) {
    if let Err(e) = berth_handoff::write(path, bytes) {
        log(format_args!("cannot record {what} in {}: {e}", path.display()));
    }
}

fn record_exit(path: &Path, exit: MainExit) {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let finished_at = i64::try_from(since.as_nanos()).unwrap_or(i64::MAX);
    let MainExit { code, out_of_memory } = exit;
    let exit = Exit { exit_code: code, finished_at, generation: None, out_of_memory };
    write_record(path, &exit.to_bytes(), "the exit");
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

fn main() -> ExitCode {
    let args = Args::parse();
    // The supervisor shares its sandbox's process limit. Tokio panics when it needs a thread for
    // blocking work (its stdout and stderr) and can make none, but hands the work to one it has:
    // one made at the start and kept for good lets a fork bomb in the sandbox use up the limit
    // without taking the supervisor down with it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_secs(u64::from(u32::MAX)))
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(async {
            let _ = tokio::task::spawn_blocking(|| ()).await;
            supervise(args).await
        }),
        Err(e) => {
            log(format_args!("cannot start: {e}"));
            ExitCode::from(2)
        }
    }
}

async fn supervise(args: Args) -> ExitCode {
    // The driver's record first: it must exist by the time anyone learns of the exit.
    let record = |exit: MainExit| {
        if let Some(path) = &args.exit_file {
            record_exit(path, exit);
        }
        ExitCode::from(u8::try_from(exit.code & 0xff).unwrap_or(1))
    };
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => token.clone(),
        (None, path) => match path.as_ref().map(std::fs::read_to_string) {
            Some(Ok(token)) => berth_handoff::token::parse(&token).to_string(),
            _ => {
                log(format_args!(
                    "no runtime token: pass --token, {} or a readable {}",
                    var::RUNTIME_TOKEN,
                    flag::arg(flag::TOKEN_FILE)
                ));
                return ExitCode::from(2);
            }
        },
    };
    let env: std::collections::BTreeMap<String, String> = match &args.env_file {
        None => Default::default(),
        Some(path) => match std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| berth_handoff::env::parse(&b).map_err(|e| e.to_string()))
        {
            Ok(env) => env,
            Err(e) => {
                log(format_args!("cannot read the environment from {}: {e}", path.display()));
                return ExitCode::from(2);
            }
        },
    };
    // The gateway checks the token; the run only needs to know whose it says it is.
    let Some(generation) = berth_core::identity::claimed(&token).map(|identity| identity.generation) else {
        log("the runtime token is malformed");
        return ExitCode::from(2);
    };
    if let Some(path) = &args.began_file {
        write_record(path, &began::to_bytes(generation), "the run's beginning");
    }
    let logs = args.logs.as_ref().and_then(|dir| {
        berth_logs::prune(dir, generation)
            .and_then(|()| {
                berth_logs::Writer::open(dir, &berth_logs::Log::Main { generation }, berth_logs::DEFAULT_CAP)
            })
            .map_err(|e| log(format_args!("cannot open the logs in {}: {e}; the output goes unlogged", dir.display())))
            .ok()
    });
    // Listening before the command starts, so its first connection finds the proxy.
    if let Some(addr) = args.egress_proxy {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => drop(tokio::spawn(proxy(listener, args.gateway.clone(), token.clone()))),
            Err(e) => log(format_args!("cannot take proxy requests on {addr}: {e}; the run has no egress")),
        }
    }
    let joined = cgroup::join(&args.cgroups);
    // Counted before the command starts: a kill for memory while it runs raises the count.
    let kills_before = cgroup::oom_kills();
    let piped = || if logs.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::inherit() };
    let (exit_tx, exit_rx) = watch::channel(None);
    // The command starts before the session opens, so the hello can tell a command that could
    // not start, or ended at once, from a running one.
    // Outside its cgroup the command would run without the limits it was given: it does not run.
    let spawned = joined.and_then(|()| {
        let mut command = tokio::process::Command::new(&args.command[0]);
        command.args(&args.command[1..]).envs(&env);
        // After the environment file, so not even a file naming them could hand them on.
        for name in var::KEPT_FROM_COMMAND {
            command.env_remove(name);
        }
        command
            .stdout(piped())
            .stderr(piped())
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {:?}: {e}", args.command[0])))
    });
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let cause = e.to_string();
            log(&cause);
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            if let Some(writer) = logs {
                berth_supervisor::logs::never_ran(writer, &cause, code);
            }
            let exit = MainExit { code, out_of_memory: false };
            let status = record(exit);
            let _ = exit_tx.send(Some(exit));
            let run = Run {
                token,
                exit: exit_rx,
                failed_to_start: Some(cause),
                execs: Execs::default(),
                ports: std::sync::Arc::new(Loopback),
            };
            let _ = keep_session(args.gateway.clone(), run).await;
            return status;
        }
    };
    let capture = logs.map(|writer| {
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        berth_supervisor::logs::capture(writer, stdout.expect("piped"), stderr.expect("piped"), args.echo_output)
    });
    // The logs are complete before the exit is recorded or reported.
    let finish = |code: i32| async move {
        if let Some(capture) = capture {
            capture.finish(code).await;
        }
    };
    let started: std::sync::Arc<dyn berth_supervisor::exec::StartedLog> = match &args.exec_log {
        Some(dir) => std::sync::Arc::new(berth_supervisor::exec::InDirectory(dir.clone())),
        None => std::sync::Arc::new(berth_supervisor::exec::InMemory::default()),
    };
    let execs = Execs::new(
        berth_supervisor::exec::DEFAULT_OUTPUT_CAP,
        std::sync::Arc::new(berth_supervisor::launch::Host),
        started,
    );
    // Each exec's output goes beside the main process's: any gateway on the host reads it, and
    // it outlives the run.
    let execs = match &args.logs {
        Some(dir) => execs.with_logs(dir.clone()),
        None => execs,
    };
    let run =
        Run { token, exit: exit_rx, failed_to_start: None, execs: execs.clone(), ports: std::sync::Arc::new(Loopback) };
    let mut session = tokio::spawn(keep_session(args.gateway.clone(), run));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    // Told to terminate, the command's exit is the stop's doing, not a failure of the command:
    // the runtime reports that exit, the supervisor does not.
    let mut terminated = false;
    let code = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status.map(exit_code).unwrap_or(1),
            end = &mut session => {
                let reason = match end {
                    Ok(SessionEnd::Rejected(status)) => status.message().to_string(),
                    _ => "the session ended".to_string(),
                };
                log(format_args!("the gateway rejected this run ({reason}); stopping"));
                execs.stop_all().await;
                let code = stop(&mut child).await;
                finish(code).await;
                return record(MainExit { code, out_of_memory: false });
            }
            Some(()) = async { match terminate.as_mut() { Some(t) => t.recv().await, None => std::future::pending().await } } => {
                terminated = true;
                // The execs are stopped along with the command, not after it.
                tokio::spawn({
                    let execs = execs.clone();
                    async move { execs.stop_all().await }
                });
                // Passed on, in case only the supervisor was signalled.
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
                }
            }
        }
    };
    // Docker's and Podman's rule too: a failed run during which the kernel killed something of
    // it for memory (the command, or a process it waited on) ran out of memory.
    let out_of_memory = code != 0 && kills_before.zip(cgroup::oom_kills()).is_some_and(|(before, now)| now > before);
    match out_of_memory {
        true => log(format_args!("the command exited with code {code}, killed for memory")),
        false => log(format_args!("the command exited with code {code}")),
    }
    // The run is over: its execs end with it.
    execs.stop_all().await;
    finish(code).await;
    let exit = MainExit { code, out_of_memory };
    let status = record(exit);
    if !terminated {
        let _ = exit_tx.send(Some(exit));
        let _ = session.await;
    }
    status
}
