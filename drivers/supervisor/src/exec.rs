//! The execs of one run (DESIGN 8.1): each exec id runs at most once in this run (E1), every
//! exec's output is kept with offsets, and each one ends exactly once: by itself, by its
//! timeout or by a cancel. The registry is this process's: a run is one supervisor process, so
//! an exec of another run (generation) can never reach it (E2).
//!
//! A timeout or a cancel signals everything the command started (TERM, then KILL after
//! [`KILL_AFTER`]); what starts commands is a [`Launcher`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use berth_proto::v1 as pb;
use nix::sys::signal::Signal;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, watch};

use crate::launch::{Exit, Host, Launched, Launcher};
use crate::output::{Follower, Output, Stream};

/// How long a command gets after SIGTERM before it is killed.
pub const KILL_AFTER: Duration = Duration::from_secs(2);
/// How long after a command exited its output streams may stay open (something it started in
/// the background still holds them) before the exec ends without the rest.
const DRAIN_FOR: Duration = Duration::from_millis(500);
/// Each exec's output kept, at most (DESIGN 8.1).
pub const DEFAULT_OUTPUT_CAP: usize = 8 << 20;
/// How many execs' output a run keeps on disk at most.
const LOGGED_EXECS: usize = 1_000;
const READ_BUFFER: usize = 64 << 10;

/// How an exec ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signalled(i32),
    TimedOut,
    Cancelled,
    /// An earlier run of this generation started it (the run was restarted out of band since):
    /// this one never runs it.
    Lost,
}

/// The exec ids a generation's runs started, kept where a run restarted out of band (a
/// container's `docker restart`) finds them: an id started by an earlier run of the generation
/// is never run again (E1).
pub trait StartedLog: Send + Sync + 'static {
    fn started(&self, generation: u64, id: &str) -> bool;
    /// Recorded before the command runs; an exec that cannot be recorded does not run.
    fn record(&self, generation: u64, id: &str) -> std::io::Result<()>;
}

/// A log kept only by this process: a restarted run forgets (for a supervisor given nowhere to
/// keep it).
#[derive(Default)]
pub struct InMemory(Mutex<std::collections::BTreeSet<(u64, String)>>);

impl StartedLog for InMemory {
    fn started(&self, generation: u64, id: &str) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).contains(&(generation, id.to_string()))
    }
    fn record(&self, generation: u64, id: &str) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert((generation, id.to_string()));
        Ok(())
    }
}

/// A log in a directory that outlives the run's process: one file per generation, a line per id
/// (ids are never blank and hold no newline), synced before the command runs.
pub struct InDirectory(pub std::path::PathBuf);

impl InDirectory {
    fn file(&self, generation: u64) -> std::path::PathBuf {
        self.0.join(format!("execs-{generation}"))
    }
}

impl StartedLog for InDirectory {
    fn started(&self, generation: u64, id: &str) -> bool {
        std::fs::read_to_string(self.file(generation)).is_ok_and(|ids| ids.lines().any(|line| line == id))
    }
    fn record(&self, generation: u64, id: &str) -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(&self.0)?;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(self.file(generation))?;
        file.write_all(format!("{id}\n").as_bytes())?;
        file.sync_data()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Running,
    /// `out_of_memory`: it failed while the kernel killed something in the sandbox for memory.
    Ended {
        end: End,
        message: String,
        output_bytes: u64,
        out_of_memory: bool,
    },
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
    launcher: Arc<dyn Launcher>,
    started: Arc<dyn StartedLog>,
    /// Where each exec's output is also kept (berth-logs), if anywhere.
    logs: Option<std::path::PathBuf>,
    /// The execs whose output is kept there, oldest first, and how many at most.
    logged: Arc<Mutex<VecDeque<(String, berth_logs::Log)>>>,
    logged_cap: usize,
}

impl std::fmt::Debug for Execs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execs").field("execs", &self.entries().len()).finish_non_exhaustive()
    }
}

impl Default for Execs {
    fn default() -> Self {
        Self::new(DEFAULT_OUTPUT_CAP, Arc::new(Host), Arc::new(InMemory::default()))
    }
}

impl Execs {
    pub fn new(cap: usize, launcher: Arc<dyn Launcher>, started: Arc<dyn StartedLog>) -> Self {
        let logged = Arc::default();
        Self {
            entries: Arc::default(),
            changed: watch::Sender::new(()),
            cap,
            launcher,
            started,
            logs: None,
            logged,
            logged_cap: LOGGED_EXECS,
        }
    }

    /// Keeps each exec's output in `dir` too, where it outlives the run.
    pub fn with_logs(self, dir: std::path::PathBuf) -> Self {
        Self { logs: Some(dir), ..self }
    }

    /// Counts `log` among those kept in `dir`; past [`LOGGED_EXECS`], the oldest of an exec that
    /// ended goes (a reader of it is told the gap). Many execs in one long run must not make
    /// every read of the directory slow, nor fill the host.
    fn keep_logged(&self, dir: &std::path::Path, id: &str, log: berth_logs::Log) {
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        logged.push_back((id.to_string(), log));
        if logged.len() <= self.logged_cap {
            return;
        }
        let ended = |id: &str| {
            self.entry(id).is_none_or(|e| e.status.lock().unwrap_or_else(PoisonError::into_inner).rank() == 2)
        };
        // The one just opened is not a candidate, though its exec is not registered yet.
        if let Some(oldest) = logged.iter().take(logged.len() - 1).position(|(id, _)| ended(id)) {
            let (_, log) = logged.remove(oldest).expect("found at that position");
            if let Err(e) = berth_logs::remove(dir, &log) {
                eprintln!("berth-supervisor: cannot remove an old exec's output: {e}");
            }
        }
    }

    /// The output of a new exec: in memory, and in its log when there is one to keep.
    fn new_output(&self, generation: u64, id: &str) -> Output {
        let output = Output::new(self.cap);
        let Some(dir) = &self.logs else { return output };
        let log = berth_logs::Log::Exec { generation, id: id.to_string() };
        match berth_logs::Writer::open(dir, &log, self.cap as u64) {
            Ok(writer) => {
                self.keep_logged(dir, id, log);
                output.with_log(writer)
            }
            Err(e) => {
                eprintln!("berth-supervisor: cannot keep exec {id}'s output on disk: {e}; it is kept in memory only");
                output
            }
        }
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

    /// Starts `run`, of this run's `generation`, unless its id ran or runs already (then nothing
    /// happens: its status says how it stands), here or in an earlier run of the generation
    /// (then it is lost). A follower from `follow_from` is in place before the command runs.
    pub fn run(&self, run: pb::RunExec, generation: u64, follow_from: Option<u64>) -> Option<Follower> {
        let (control, controls) = mpsc::unbounded_channel();
        if let Some(known) = self.entry(&run.exec_id) {
            return follow_from.map(|offset| known.output.follow(offset));
        }
        let output = Arc::new(self.new_output(generation, &run.exec_id));
        let entry = Arc::new(Entry { output, status: Mutex::new(Status::Running), control });
        {
            let mut entries = self.entries();
            if let Some(known) = entries.get(&run.exec_id) {
                return follow_from.map(|offset| known.output.follow(offset));
            }
            entries.insert(run.exec_id.clone(), entry.clone());
        }
        let follower = follow_from.map(|offset| entry.output.follow(offset));
        if run.cancelled {
            self.finish(&entry, End::Cancelled, "cancelled before it ran".into(), false);
            return follower;
        }
        if self.started.started(generation, &run.exec_id) && !berth_core::bug!(ExecRetryRunsTwice) {
            self.finish(&entry, End::Lost, "an earlier run of this generation started it and is gone".into(), false);
            return follower;
        }
        if let Err(e) = self.started.record(generation, &run.exec_id) {
            self.finish(&entry, End::Lost, format!("cannot record that it started, so it never ran: {e}"), false);
            return follower;
        }
        self.changed.send_replace(());
        tokio::spawn(drive(self.clone(), entry, run, controls));
        follower
    }

    fn finish(&self, entry: &Entry, end: End, message: String, out_of_memory: bool) {
        entry.output.complete();
        let output_bytes = entry.output.total();
        let ended = Status::Ended { end, message, output_bytes, out_of_memory };
        *entry.status.lock().unwrap_or_else(PoisonError::into_inner) = ended;
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

/// Runs one exec to its end.
async fn drive(execs: Execs, entry: Arc<Entry>, run: pb::RunExec, mut controls: mpsc::UnboundedReceiver<Control>) {
    let kills_before = execs.launcher.memory_kills();
    let Launched { outputs, mut input, exit, signal } = match execs.launcher.launch(&run.exec_id, &run) {
        Ok(launched) => launched,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            execs.finish(&entry, End::Exited(code), format!("cannot run {:?}: {e}", run.argv[0]), false);
            return;
        }
    };
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
    tokio::pin!(exit);
    let status = loop {
        tokio::select! {
            biased;
            status = &mut exit => break status,
            () = &mut timeout, if killing.is_none() => {
                killing = Some(End::TimedOut);
                signal(Signal::SIGTERM);
                kill.as_mut().reset(tokio::time::Instant::now() + KILL_AFTER);
            }
            () = &mut kill => signal(Signal::SIGKILL),
            control = controls.recv() => match control {
                Some(Control::Stdin(data)) => input.write(&data).await,
                Some(Control::CloseStdin) => input.close().await,
                Some(Control::Resize(window)) => input.resize(&window),
                Some(Control::Signal(n)) => {
                    if let Ok(n) = Signal::try_from(n) {
                        signal(n);
                    }
                }
                Some(Control::Cancel) if killing.is_none() => {
                    killing = Some(End::Cancelled);
                    signal(Signal::SIGTERM);
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
        (None, Ok(Exit::Code(code))) => (End::Exited(code), String::new()),
        (None, Ok(Exit::Signal(signal))) => (End::Signalled(signal), String::new()),
        (None, Err(e)) => (End::Exited(1), format!("cannot wait for the command: {e}")),
    };
    // The main command's rule (and Docker's): an exec that failed by itself while the kernel
    // killed something in the sandbox (it shares the supervisor's cgroup) ran out of memory.
    let failed = matches!(end, End::Signalled(_)) || matches!(end, End::Exited(code) if code != 0);
    let out_of_memory =
        failed && kills_before.zip(execs.launcher.memory_kills()).is_some_and(|(before, now)| now > before);
    execs.finish(&entry, end, message, out_of_memory);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn true_exec(id: &str) -> pb::RunExec {
        pb::RunExec { exec_id: id.into(), argv: vec!["true".into()], ..Default::default() }
    }

    async fn ended(execs: &Execs, id: &str) {
        let mut changed = execs.changed();
        while !execs.statuses().iter().any(|(i, s)| i == id && s.rank() == 2) {
            changed.changed().await.unwrap();
        }
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_ended_execs_output_goes_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let execs = Execs { logged_cap: 3, ..Execs::default().with_logs(dir.path().to_path_buf()) };
        for i in 0..5 {
            let id = format!("e{i}");
            execs.run(true_exec(&id), 1, None);
            ended(&execs, &id).await;
        }
        let read = |id: &str| {
            let log = berth_logs::Log::Exec { generation: 1, id: id.into() };
            berth_logs::read(dir.path(), &log, 0, 10, false).unwrap()
        };
        for gone in ["e0", "e1"] {
            assert_eq!(read(gone), berth_logs::Read::Wait, "{gone} is still kept");
        }
        for kept in ["e2", "e3", "e4"] {
            assert_eq!(read(kept), berth_logs::Read::End { offset: 0, exit_code: None }, "{kept}");
        }
    }
}
