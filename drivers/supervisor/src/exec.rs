//! The execs of one run (DESIGN 8.1): each exec id runs at most once in this run (E1), every
//! exec's output is kept with offsets, and each one ends exactly once: by itself, by its
//! timeout or by a cancel. The registry is this process's: a run is one supervisor process, so
//! an exec of another run (generation) can never reach it (E2).
//!
//! A command runs in its own process group, so a timeout or a cancel kills everything it
//! started (TERM, then KILL after [`KILL_AFTER`]).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use berth_proto::v1 as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, watch};

use crate::output::{Follower, Output, Stream};

/// How long a command gets after SIGTERM before it is killed.
pub const KILL_AFTER: Duration = Duration::from_secs(2);
/// How long after a command exited its output streams may stay open (something it started in
/// the background still holds them) before the exec ends without the rest.
const DRAIN_FOR: Duration = Duration::from_millis(500);
/// Each exec's output kept, at most (DESIGN 8.1).
pub const DEFAULT_OUTPUT_CAP: usize = 8 << 20;
const READ_BUFFER: usize = 64 << 10;

/// How an exec ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signalled(i32),
    TimedOut,
    Cancelled,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Running,
    Ended { end: End, message: String, output_bytes: u64 },
}

impl Status {
    /// How far along it is: reports only ever move forward.
    pub fn rank(&self) -> u8 {
        match self {
            Status::Running => 1,
            Status::Ended { .. } => 2,
        }
    }
}

/// What a client sends a running exec.
enum Control {
    Stdin(Vec<u8>),
    CloseStdin,
    Resize(pb::WindowSize),
    Signal(i32),
    Cancel,
}

struct Entry {
    output: Arc<Output>,
    status: Mutex<Status>,
    control: mpsc::UnboundedSender<Control>,
}

#[derive(Clone)]
pub struct Execs {
    entries: Arc<Mutex<BTreeMap<String, Arc<Entry>>>>,
    /// Told of every status change.
    changed: watch::Sender<()>,
    cap: usize,
}

impl std::fmt::Debug for Execs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execs").field("execs", &self.entries().len()).finish_non_exhaustive()
    }
}

impl Default for Execs {
    fn default() -> Self {
        Self::new(DEFAULT_OUTPUT_CAP)
    }
}

impl Execs {
    pub fn new(cap: usize) -> Self {
        Self { entries: Arc::default(), changed: watch::Sender::new(()), cap }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        self.entries().get(id).cloned()
    }

    pub fn changed(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Every exec's status, by id.
    pub fn statuses(&self) -> Vec<(String, Status)> {
        let entries = self.entries();
        entries
            .iter()
            .map(|(id, e)| (id.clone(), e.status.lock().unwrap_or_else(PoisonError::into_inner).clone()))
            .collect()
    }

    pub fn output(&self, id: &str) -> Option<Arc<Output>> {
        self.entry(id).map(|e| e.output.clone())
    }

    /// Starts `run` unless its id ran or runs already (then nothing happens: its status says how
    /// it stands). A follower from `follow_from` is in place before the command runs.
    pub fn run(&self, run: pb::RunExec, follow_from: Option<u64>) -> Option<Follower> {
        let (control, controls) = mpsc::unbounded_channel();
        let entry =
            Arc::new(Entry { output: Arc::new(Output::new(self.cap)), status: Mutex::new(Status::Running), control });
        {
            let mut entries = self.entries();
            if let Some(known) = entries.get(&run.exec_id) {
                return follow_from.map(|offset| known.output.follow(offset));
            }
            entries.insert(run.exec_id.clone(), entry.clone());
        }
        let follower = follow_from.map(|offset| entry.output.follow(offset));
        if run.cancelled {
            self.finish(&entry, End::Cancelled, "cancelled before it ran".into());
            return follower;
        }
        self.changed.send_replace(());
        tokio::spawn(drive(self.clone(), entry, run, controls));
        follower
    }

    fn finish(&self, entry: &Entry, end: End, message: String) {
        entry.output.complete();
        let output_bytes = entry.output.total();
        *entry.status.lock().unwrap_or_else(PoisonError::into_inner) = Status::Ended { end, message, output_bytes };
        self.changed.send_replace(());
    }

    fn control(&self, id: &str, control: Control) {
        if let Some(entry) = self.entry(id) {
            let _ = entry.control.send(control);
        }
    }

    pub fn stdin(&self, id: &str, data: Vec<u8>, close: bool) {
        if !data.is_empty() {
            self.control(id, Control::Stdin(data));
        }
        if close {
            self.control(id, Control::CloseStdin);
        }
    }

    pub fn resize(&self, id: &str, window: pb::WindowSize) {
        self.control(id, Control::Resize(window));
    }

    pub fn signal(&self, id: &str, signal: i32) {
        self.control(id, Control::Signal(signal));
    }

    pub fn cancel(&self, id: &str) {
        self.control(id, Control::Cancel);
    }

    /// Cancels every exec and waits until each has ended (killed, at worst, after
    /// [`KILL_AFTER`]): an exec runs in its own process group, which outlives the run's
    /// supervisor unless it is killed first.
    pub async fn stop_all(&self) {
        let entries: Vec<Arc<Entry>> = self.entries().values().cloned().collect();
        for entry in &entries {
            let _ = entry.control.send(Control::Cancel);
        }
        let mut changed = self.changed();
        let all_ended = async {
            loop {
                changed.borrow_and_update();
                if self.statuses().iter().all(|(_, s)| s.rank() == 2) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(KILL_AFTER + DRAIN_FOR + Duration::from_secs(1), all_ended).await;
    }
}

/// Where a client's stdin goes: a pipe, or the terminal of a command run with one.
enum Input {
    Pipe(ChildStdin),
    Terminal(pty_process::OwnedWritePty),
    Closed,
}

impl Input {
    async fn write(&mut self, data: &[u8]) {
        let written = match self {
            Input::Pipe(pipe) => pipe.write_all(data).await,
            Input::Terminal(terminal) => terminal.write_all(data).await,
            Input::Closed => return,
        };
        if written.is_err() {
            *self = Input::Closed;
        }
    }

    /// No more input. A terminal stays the command's output, so it is told end of file as a
    /// terminal's user tells it: Ctrl-D.
    async fn close(&mut self) {
        if let Input::Terminal(terminal) = self {
            let _ = terminal.write_all(&[4]).await;
        } else {
            *self = Input::Closed;
        }
    }

    fn resize(&self, window: &pb::WindowSize) {
        if let Input::Terminal(terminal) = self {
            let _ = terminal.resize(size(window));
        }
    }
}

fn size(window: &pb::WindowSize) -> pty_process::Size {
    let clamp = |n: u32| u16::try_from(n.max(1)).unwrap_or(u16::MAX);
    pty_process::Size::new(clamp(window.rows), clamp(window.cols))
}

/// A started command: its process, what it writes, and where its input goes.
struct Spawned {
    child: Child,
    outputs: Vec<(Box<dyn AsyncRead + Send + Unpin>, Stream)>,
    input: Input,
}

fn spawn(run: &pb::RunExec) -> std::io::Result<Spawned> {
    if run.tty {
        return spawn_on_terminal(run);
    }
    let mut command = tokio::process::Command::new(&run.argv[0]);
    command
        .args(&run.argv[1..])
        .envs(&run.env)
        .env_remove("BERTH_RUNTIME_TOKEN")
        .env_remove("BERTH_SUPERVISOR_GATEWAY")
        // An exec leads its own process group: without its run's generation it is never taken
        // for the run's supervisor, which the process driver finds by these variables.
        .env_remove("BERTH_GENERATION")
        .stdin(if run.stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if !run.cwd.is_empty() {
        command.current_dir(&run.cwd);
    }
    let mut child = command.spawn()?;
    let mut outputs: Vec<(Box<dyn AsyncRead + Send + Unpin>, Stream)> = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        outputs.push((Box::new(stdout), Stream::Stdout));
    }
    if let Some(stderr) = child.stderr.take() {
        outputs.push((Box::new(stderr), Stream::Stderr));
    }
    let input = child.stdin.take().map_or(Input::Closed, Input::Pipe);
    Ok(Spawned { child, outputs, input })
}

/// The command on a terminal of its own: it leads a new session (so its process group too),
/// and everything it writes is one stream.
fn spawn_on_terminal(run: &pb::RunExec) -> std::io::Result<Spawned> {
    let (terminal, pts) = pty_process::open().map_err(std::io::Error::other)?;
    terminal
        .resize(size(&run.window.unwrap_or(pb::WindowSize { rows: 24, cols: 80 })))
        .map_err(std::io::Error::other)?;
    let mut command = pty_process::Command::new(&run.argv[0])
        .args(&run.argv[1..])
        .envs(&run.env)
        .env_remove("BERTH_RUNTIME_TOKEN")
        .env_remove("BERTH_SUPERVISOR_GATEWAY")
        .env_remove("BERTH_GENERATION")
        .kill_on_drop(true);
    if !run.env.contains_key("TERM") {
        command = command.env("TERM", "xterm");
    }
    if !run.cwd.is_empty() {
        command = command.current_dir(&run.cwd);
    }
    let child = command.spawn(pts).map_err(std::io::Error::other)?;
    let (output, input) = terminal.into_split();
    Ok(Spawned { child, outputs: vec![(Box::new(output), Stream::Tty)], input: Input::Terminal(input) })
}

/// Copies one stream into the output until it closes.
async fn copy(mut from: impl AsyncRead + Unpin, stream: Stream, output: Arc<Output>) {
    let mut buffer = vec![0; READ_BUFFER];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        output.append(stream, &buffer[..n]).await;
    }
}

fn group_signal(pid: Option<u32>, signal: Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = killpg(Pid::from_raw(pid), signal);
    }
}

/// Runs one exec to its end.
async fn drive(execs: Execs, entry: Arc<Entry>, run: pb::RunExec, mut controls: mpsc::UnboundedReceiver<Control>) {
    let Spawned { mut child, outputs, mut input } = match spawn(&run) {
        Ok(spawned) => spawned,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            execs.finish(&entry, End::Exited(code), format!("cannot run {:?}: {e}", run.argv[0]));
            return;
        }
    };
    let pid = child.id();
    let mut readers = tokio::task::JoinSet::new();
    for (from, stream) in outputs {
        readers.spawn(copy(from, stream, entry.output.clone()));
    }
    let deadline = run.timeout_ms.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let timeout = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    // Set once the exec is being killed on purpose: how it will have ended.
    let mut killing: Option<End> = None;
    let kill = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(kill);
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status,
            () = &mut timeout, if killing.is_none() => {
                killing = Some(End::TimedOut);
                group_signal(pid, Signal::SIGTERM);
                kill.as_mut().reset(tokio::time::Instant::now() + KILL_AFTER);
            }
            () = &mut kill => group_signal(pid, Signal::SIGKILL),
            control = controls.recv() => match control {
                Some(Control::Stdin(data)) => input.write(&data).await,
                Some(Control::CloseStdin) => input.close().await,
                Some(Control::Resize(window)) => input.resize(&window),
                Some(Control::Signal(n)) => {
                    if let Ok(signal) = Signal::try_from(n) {
                        group_signal(pid, signal);
                    }
                }
                Some(Control::Cancel) if killing.is_none() => {
                    killing = Some(End::Cancelled);
                    group_signal(pid, Signal::SIGTERM);
                    kill.as_mut().reset(tokio::time::Instant::now() + KILL_AFTER);
                }
                Some(Control::Cancel) | None => {}
            },
        }
    };
    drop(input);
    // Output written just before the exit is still in the pipes. Something the command left
    // running in the background may hold them open: the rest is not waited for once they stay
    // quiet for a while, unless a reader is what holds the output back.
    let mut seen = entry.output.total();
    loop {
        match tokio::time::timeout(DRAIN_FOR, readers.join_next()).await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {
                let now = entry.output.total();
                if now == seen && !entry.output.held_back() {
                    break;
                }
                seen = now;
            }
        }
    }
    readers.abort_all();
    let (end, message) = match (killing, status) {
        (Some(end), _) => (end, String::new()),
        (None, Ok(status)) => match (status.code(), status.signal()) {
            (Some(code), _) => (End::Exited(code), String::new()),
            (None, Some(signal)) => (End::Signalled(signal), String::new()),
            (None, None) => (End::Exited(1), "the exit status was unreadable".into()),
        },
        (None, Err(e)) => (End::Exited(1), format!("cannot wait for the command: {e}")),
    };
    execs.finish(&entry, end, message);
}
