//! `berth sandbox`: create, read and drive sandboxes; each lifecycle command waits for its
//! target phase unless told not to.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_proto::v1 as pb;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tonic::Status;

use super::Output;
use super::client::{Client, Failed};
use super::exec::window_size;
use super::logs::Beginning;
use super::ports::forward_ports;
use super::print::{phase_name, sandbox_json};
use super::spec::{SpecArgs, Versioned, Wait, pair, unix_millis, wire_millis};

#[derive(Subcommand)]
pub(super) enum SandboxCmd {
    /// Create a sandbox running COMMAND (or, with --from-snapshot, what the snapshot's source
    /// ran, with its image and files) and wait until it is Ready.
    Create {
        name: String,
        /// Make it from this snapshot: its spec, image and files (only --label and --provider
        /// may be given beside it).
        #[arg(long, conflicts_with_all = [
            "image", "env", "ttl", "idle_timeout", "on_expiry", "on_idle", "restart", "max_restarts",
            "restart_backoff", "restart_max_backoff", "cpus", "memory", "pids", "allow", "command",
        ])]
        from_snapshot: Option<String>,
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
        #[command(flatten)]
        settle: Settle,
        /// The command and its arguments.
        #[arg(last = true, required_unless_present = "from_snapshot")]
        command: Vec<String>,
    },
    /// Make COUNT new sandboxes from one consistent point of NAME's files (all of them or
    /// none), and wait until each is Ready. NAME keeps running: a Ready one is frozen only for
    /// the copy. The forks are named NAME-1, NAME-2, .. (the lowest numbers free) unless named.
    Fork {
        name: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// A fork's name (repeatable: as many as --count, in order).
        #[arg(long = "as")]
        names: Vec<String>,
        /// A label for every fork, KEY=VALUE (repeatable).
        #[arg(long = "label", short, value_parser = pair)]
        labels: Vec<(String, String)>,
        #[command(flatten)]
        wait: Wait,
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
    /// Stop sandboxes (their workspaces are kept), each in turn, and wait until each is Stopped.
    Stop {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Start stopped (or failed) sandboxes with new runtime identities, each in turn, and wait
    /// until each is Ready.
    Start {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
        #[command(flatten)]
        settle: Settle,
    },
    /// Freeze a Ready sandbox's processes, keeping their memory, and wait until it is Paused.
    /// Nothing restarts: the generation and identity stay. While paused no exec runs and the
    /// idle timeout is held; the deadline still applies.
    Pause {
        name: String,
        /// Write the run's memory to disk and end its processes instead (CRIU; rootful Podman
        /// only): the pause outlives a reboot of the host, and `resume` restores it.
        #[arg(long)]
        checkpoint: bool,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Thaw (or restore from its checkpoint) a paused sandbox and wait until it is Ready again,
    /// where it left off.
    Resume {
        name: String,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Print a URL of the gateway's preview proxy that reaches PORT of the sandbox's current
    /// run, its access token in the query (none for a public port). The token is the run's:
    /// after a stop and start it gets 410 Gone; ask again.
    Url { name: String, port: u32 },
    /// Forward a local TCP port to PORT of the sandbox's current run, through the gateway,
    /// until Ctrl-C: each connection to 127.0.0.1:LOCAL (LOCAL 0: any free port, printed)
    /// becomes one to the run's loopback at PORT.
    PortForward {
        name: String,
        /// `[LOCAL:]PORT`.
        #[arg(value_parser = forward_ports)]
        ports: (u16, u16),
        /// The local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: std::net::IpAddr,
    },
    /// Delete sandboxes and everything made for them, each in turn, and wait until each is gone.
    Delete {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
    /// Copy a file or directory into or out of a sandbox's workspace by `docker cp`'s rules: one
    /// side is `NAME:PATH` (relative to the workspace, or under /workspace). Into an existing
    /// directory SRC keeps its name; elsewhere it lands as DST (a file over a file, a new file or
    /// directory); `SRC/.` copies a directory's contents; `-` is a tar stream on stdin (into an
    /// existing directory) or stdout. Works on a Stopped sandbox too.
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
        #[arg(long, default_value_t = 0, conflicts_with = "tail")]
        offset: u64,
        /// Only the last N lines written so far (both streams together, in the order written),
        /// then, with --follow, what comes after them.
        #[arg(long, short = 'n', value_name = "N")]
        tail: Option<usize>,
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

/// How long a new run is watched after Ready before it counts as started.
#[derive(clap::Args)]
pub(super) struct Settle {
    /// After Ready, watch the run this much longer: a command gone by then (one that exits at
    /// once) fails the command with its reason and exit code, rather than a Ready already over.
    /// 0 returns at Ready.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    settle: Duration,
}

/// Why a run seen Ready did not stay up for `settle`: its policy restarted it (`now`).
fn gone_at_once(name: &str, settle: Duration, now: &pb::Sandbox) -> Failed {
    Failed(format!(
        "sandbox '{name}' did not stay up: its command exited within {} of Ready and the restart \
         policy restarted it (restart {}, generation {}); `berth sandbox logs {name}` shows its output",
        humantime::format_duration(settle),
        now.restart_count,
        now.generation
    ))
}

/// The lifecycle commands that take several sandboxes.
#[derive(Clone, Copy)]
enum Verb {
    Stop,
    Start { settle: Duration },
    Delete,
}

/// What a lifecycle command waits for.
#[derive(Clone, Copy)]
enum Target {
    /// Ready, and then still up (the same generation, not failed) for this long.
    Ready(Duration),
    Paused,
    Stopped,
    Gone,
}

impl Client {
    /// Every page of the sandboxes `selector` picks, and the first page's cursor: a fleet watch
    /// from it misses nothing the pages do not show.
    pub(super) async fn list_all(
        &mut self,
        selector: &BTreeMap<String, String>,
    ) -> Result<(Vec<pb::Sandbox>, String), Status> {
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
            // Once Ready, it is watched to stay so: the generation that was Ready, the newest
            // record, and until when.
            let mut settling: Option<(u64, pb::Sandbox, tokio::time::Instant)> = None;
            loop {
                let next = match &settling {
                    None => events.message().await?,
                    Some((_, latest, until)) => match tokio::time::timeout_at(*until, events.message()).await {
                        Ok(next) => next?,
                        Err(_) => return Ok(Some(latest.clone())),
                    },
                };
                let Some(event) = next else { break };
                let Some(s) = event.sandbox else {
                    return match target {
                        Target::Gone => Ok(None),
                        _ => Err(Failed(format!("sandbox '{name}' was deleted"))),
                    };
                };
                spinner.set_message(format!("{name}: {}", phase_name(s.phase)));
                let phase = pb::Phase::try_from(s.phase).unwrap_or(pb::Phase::Unspecified);
                if let Some((_, latest, _)) = &mut settling {
                    *latest = s.clone();
                }
                match (target, phase) {
                    (Target::Ready(settle), pb::Phase::Ready) => match &settling {
                        None if settle.is_zero() => return Ok(Some(s)),
                        None => settling = Some((s.generation, s, tokio::time::Instant::now() + settle)),
                        Some((generation, _, _)) if s.generation == *generation => {}
                        Some(_) => return Err(gone_at_once(name, settle, &s)),
                    },
                    (Target::Paused, pb::Phase::Paused) | (Target::Stopped, pb::Phase::Stopped) => return Ok(Some(s)),
                    // The command ran and exited 0 before it was seen Ready, or within its
                    // settling: done, not failed.
                    (Target::Ready(_), pb::Phase::Stopped) if s.completed => return Ok(Some(s)),
                    (Target::Ready(_) | Target::Paused | Target::Stopped, pb::Phase::Error) => {
                        let f = s.failure.unwrap_or_default();
                        let code = f.exit_code.map(|c| format!(", exit code {c}")).unwrap_or_default();
                        return Err(Failed(format!("sandbox '{name}' failed: {}{code} ({})", f.reason, f.message)));
                    }
                    // Restarted by its policy while settling: the command did not stay up.
                    (Target::Ready(settle), _) if settling.is_some() && s.restart_count > 0 => {
                        return Err(gone_at_once(name, settle, &s));
                    }
                    // Its run ended (a completion, or a stop) before it could be frozen.
                    (Target::Paused, pb::Phase::Stopping | pb::Phase::Stopped | pb::Phase::Deleting) => {
                        return Err(Failed(format!("sandbox '{name}' is {} and will not pause", phase_name(s.phase))));
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

    /// `verb` on each of `names` in turn, as docker's verbs do: a sandbox that fails is told on
    /// stderr, naming it, and the rest go on; the command fails if any did.
    async fn each(&mut self, verb: Verb, names: Vec<String>, version: Versioned, wait: &Wait) -> Result<(), Failed> {
        if let [name] = names.as_slice() {
            return self.one(verb, name.clone(), version.expected_version, wait).await;
        }
        if version.expected_version.is_some() {
            return Err(Failed("--expected-version is one sandbox's version: give it with one NAME".into()));
        }
        let mut failed = Vec::new();
        for name in &names {
            if let Err(Failed(message)) = self.one(verb, name.clone(), None, wait).await {
                eprintln!("error: {name}: {message}");
                failed.push(name.as_str());
            }
        }
        match failed.as_slice() {
            [] => Ok(()),
            failed => Err(Failed(format!("{} of {} failed: {}", failed.len(), names.len(), failed.join(", ")))),
        }
    }

    async fn one(&mut self, verb: Verb, name: String, version: Option<u64>, wait: &Wait) -> Result<(), Failed> {
        let request = pb::LifecycleRequest { name, expected_resource_version: version };
        let (reply, target) = match verb {
            Verb::Stop => (self.sandboxes.stop_sandbox(request).await?, Target::Stopped),
            Verb::Start { settle } => (self.sandboxes.start_sandbox(request).await?, Target::Ready(settle)),
            Verb::Delete => (self.sandboxes.delete_sandbox(request).await?, Target::Gone),
        };
        self.lifecycle(reply.into_inner(), target, wait).await
    }

    async fn lifecycle(&mut self, reply: pb::SandboxReply, target: Target, wait: &Wait) -> Result<(), Failed> {
        let sandbox = reply.sandbox.unwrap_or_default();
        // A start or stop that found the sandbox where it was headed changed nothing: say so.
        let already = match (target, pb::Phase::try_from(sandbox.phase)) {
            (Target::Ready(_), Ok(pb::Phase::Ready)) => Some("Ready"),
            (Target::Stopped, Ok(pb::Phase::Stopped)) => Some("Stopped"),
            (Target::Paused, Ok(pb::Phase::Paused)) if sandbox.intent == pb::Intent::Paused as i32 => Some("Paused"),
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
            None => self.print_deleted("sandbox", &sandbox.name),
        }
        Ok(())
    }

    pub(super) async fn sandbox(&mut self, command: SandboxCmd) -> Result<u8, Failed> {
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
            SandboxCmd::Logs { name, follow, generation, offset, tail } => {
                let from = match tail {
                    Some(lines) => Beginning::Tail(lines),
                    None => Beginning::Offset(offset),
                };
                return self.logs(name, generation.unwrap_or(0), from, follow).await;
            }
            SandboxCmd::Create { name, from_snapshot, spec, providers, deadline, wait, settle, command } => {
                let spec = match &from_snapshot {
                    Some(_) => pb::SandboxSpec { labels: spec.labels(), ..Default::default() },
                    None => spec.wire(command),
                };
                let request = pb::CreateSandboxRequest {
                    name,
                    spec: Some(spec),
                    providers,
                    expected_resource_version: None,
                    deadline_unix_ms: deadline.map(unix_millis),
                    from_snapshot: from_snapshot.unwrap_or_default(),
                };
                let reply = self.sandboxes.create_sandbox(request).await?.into_inner();
                self.lifecycle(reply, Target::Ready(settle.settle), &wait).await
            }
            SandboxCmd::Fork { name, count, names, labels, wait } => {
                let request = pb::ForkSandboxRequest { name, count, names, labels: labels.into_iter().collect() };
                let forks = self.snapshots.fork_sandbox(request).await?.into_inner().sandboxes;
                if wait.no_wait {
                    self.print_sandboxes(&forks);
                    return Ok(0);
                }
                let mut ready = Vec::with_capacity(forks.len());
                for fork in forks {
                    if let Some(s) = self.wait(&fork.name, Target::Ready(Duration::ZERO), &wait).await? {
                        ready.push(s);
                    }
                }
                self.print_sandboxes(&ready);
                Ok(())
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
            SandboxCmd::Watch { name: Some(name), .. } => return self.watch_one(name).await,
            SandboxCmd::Stop { names, version, wait } => self.each(Verb::Stop, names, version, &wait).await,
            SandboxCmd::Start { names, version, wait, settle } => {
                self.each(Verb::Start { settle: settle.settle }, names, version, &wait).await
            }
            SandboxCmd::Pause { name, checkpoint, version, wait } => {
                let request =
                    pb::PauseRequest { name, expected_resource_version: version.expected_version, checkpoint };
                let reply = self.sandboxes.pause_sandbox(request).await?.into_inner();
                self.lifecycle(reply, Target::Paused, &wait).await
            }
            SandboxCmd::Resume { name, version, wait } => {
                let request = pb::LifecycleRequest { name, expected_resource_version: version.expected_version };
                let reply = self.sandboxes.resume_sandbox(request).await?.into_inner();
                // The run was up before the pause: nothing new to see settle.
                self.lifecycle(reply, Target::Ready(Duration::ZERO), &wait).await
            }
            SandboxCmd::Url { name, port } => {
                let url = self.sandboxes.get_port_url(pb::GetPortUrlRequest { name, port }).await?.into_inner();
                match self.output {
                    Output::Json => say!(
                        "{:#}",
                        json!({
                            "url": url.url, "token": url.token, "generation": url.generation,
                            "public": url.public, "sandbox_id": url.sandbox_id,
                        })
                    ),
                    Output::Table => say!("{}", url.url),
                }
                Ok(())
            }
            SandboxCmd::PortForward { name, ports, address } => self.port_forward(name, ports, address).await,
            SandboxCmd::Delete { names, version, wait } => self.each(Verb::Delete, names, version, &wait).await,
        }
        .map(|()| 0)
    }
}
