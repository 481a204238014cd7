//! `berth sandbox exec` and `berth exec`: run a command in a sandbox and follow its output,
//! attach to, read, list and cancel execs.

use berth_proto::v1 as pb;
use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Broke, Client, Failed, Reconnect};
use super::logs::Position;
use super::print::table;

#[derive(Subcommand)]
pub(super) enum ExecCmd {
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
    pub(super) async fn exec(&mut self, start: pb::ExecStart) -> Result<u8, Failed> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (interactive, tty) = (start.stdin, start.tty);
        let (sandbox, id) = (start.sandbox.clone(), Some(start.exec_id.clone()).filter(|id| !id.is_empty()));
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
        let status = self.follow_output(&sandbox, id, Position(0), Some(events), interactive).await;
        drop(held);
        drop(raw);
        status
    }

    /// Prints an exec's output from `events` (else from an attach at `at`) to its end, and
    /// returns its exit status. Through a lost gateway it attaches again from the offset it
    /// got to; not an exec it does not know the id of yet (it may not have been admitted), nor
    /// an `interactive` one, whose stdin an attach would not pass on.
    async fn follow_output(
        &mut self,
        sandbox: &str,
        mut id: Option<String>,
        mut at: Position,
        mut events: Option<tonic::Streaming<pb::ExecOutput>>,
        interactive: bool,
    ) -> Result<u8, Failed> {
        let mut reconnect = Reconnect::new();
        loop {
            let opened = match events.take() {
                Some(events) => Ok(events),
                None => {
                    let exec_id = id.clone().unwrap_or_default();
                    let request = pb::AttachExecRequest { sandbox: sandbox.to_string(), exec_id, offset: at.0 };
                    self.execs.attach_exec(request).await.map(tonic::Response::into_inner)
                }
            };
            let before = at.0;
            let ended = match opened {
                Ok(events) => print_output(events, &mut at, &mut id).await,
                Err(status) => Err(status.into()),
            };
            if at.0 != before {
                reconnect.progressed();
            }
            let (broke, exec_id) = match (ended, &id) {
                (Ok(status), _) => return Ok(status),
                (Err(broke), Some(exec_id)) if !interactive => (broke, exec_id),
                (Err(broke), _) => return Err(broke.into()),
            };
            let resume = format!("reading exec {exec_id} on from offset {}", at.0);
            reconnect.after(self, broke, &resume).await?;
        }
    }

    pub(super) async fn exec_command(&mut self, command: ExecCmd) -> Result<u8, Failed> {
        match command {
            ExecCmd::Attach { sandbox, id, offset } => {
                self.follow_output(&sandbox, Some(id), Position(offset), None, false).await
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

/// This terminal's size, if stdout is one.
pub(super) fn window_size() -> Option<pb::WindowSize> {
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

/// Writes an exec's output to stdout and stderr as it comes, learning its id as it is
/// admitted; the exit status of its end.
async fn print_output(
    mut events: tonic::Streaming<pb::ExecOutput>,
    at: &mut Position,
    id: &mut Option<String>,
) -> Result<u8, Broke> {
    use pb::exec_output::Output as Event;
    while let Some(event) = events.message().await? {
        match event.output {
            Some(Event::Chunk(chunk)) => at.write(&chunk)?,
            Some(Event::Admitted(exec)) => *id = Some(exec.id),
            Some(Event::Gap(gap)) if at.skip(&gap) => {
                eprintln!("berth: output {}..{} is no longer kept (over the exec's cap)", gap.from, gap.to)
            }
            Some(Event::End(exec)) => {
                if !exec.message.is_empty() {
                    eprintln!("berth: exec {} {}: {}", exec.id, exec_state_name(exec.state), exec.message);
                }
                return Ok(exec_status(&exec));
            }
            Some(Event::Gap(_)) | None => {}
        }
    }
    Err(Failed("the gateway closed the exec's stream before it ended".into()).into())
}
