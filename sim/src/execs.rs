//! Execs in the simulator (`--execs`): the runs' commands, and a client that runs, retries,
//! attaches to, cancels and walks away from them under every fault.
//!
//! The commands come from [`SimLauncher`], the supervisor's [`Launcher`] here: `emit BYTES
//! PACE_MS CODE` writes BYTES of a pattern known from the exec's id alone ([`byte_at`]), 1 KiB
//! at a time PACE_MS apart, then exits CODE; TERM or KILL ends it at once. Everything above the
//! launcher is production's: the supervisor's exec registry and output, its session, the
//! gateway's exec API, sessions and sweep. Each launch is checked (E1, E2), each byte and end a
//! reader gets (E4), and every exec once the quiet phase is over (E3).

use std::sync::Arc;
use std::time::Duration;

use berth_core::SandboxId;
use berth_core::exec::{ExecEnd, ExecId, ExecState};
use berth_gateway::store::Store;
use berth_proto::v1 as pb;
use berth_proto::v1::exec_output::Output;
use berth_proto::v1::execs_client::ExecsClient;
use berth_supervisor::exec::StartedLog;
use berth_supervisor::launch::{Exit, Input, Launched, Launcher};
use berth_supervisor::output::Stream;
use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::sync::{oneshot, watch};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::client::{Bearer, sandbox_name};
use crate::invariants::{Fact, Invariant, e_execs, i10_no_panic_or_internal};
use crate::net;
use crate::scenario::Draw;
use crate::trace::Kind;
use crate::world::{World, lock, now};

/// The byte at `offset` of exec `id`'s output.
pub fn byte_at(id: &str, offset: u64) -> u8 {
    let seed = id.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (seed.wrapping_add(offset.wrapping_mul(7)) % 251) as u8
}

/// What the runs' started-logs hold, `(sandbox, generation, exec id)`: it outlives a run, as
/// production's file does.
pub type StartedLogs = std::collections::BTreeSet<(SandboxId, u64, String)>;

/// A run's log of the execs its generation started, in the world.
pub struct SimLog {
    pub world: Arc<World>,
    pub sandbox: SandboxId,
}

impl StartedLog for SimLog {
    fn started(&self, generation: u64, id: &str) -> bool {
        lock(&self.world.started_execs).contains(&(self.sandbox.clone(), generation, id.to_string()))
    }
    fn record(&self, generation: u64, id: &str) -> std::io::Result<()> {
        lock(&self.world.started_execs).insert((self.sandbox.clone(), generation, id.to_string()));
        Ok(())
    }
}

/// How often a frozen exec looks whether its run was thawed.
const FROZEN_LOOK: Duration = Duration::from_millis(50);

/// The commands of one run.
pub struct SimLauncher {
    pub world: Arc<World>,
    pub sandbox: SandboxId,
    pub generation: u64,
}

fn emit_args(argv: &[String]) -> Option<(u64, Duration, i32)> {
    match argv {
        [emit, bytes, pace, code] if emit == "emit" => {
            Some((bytes.parse().ok()?, Duration::from_millis(pace.parse().ok()?), code.parse().ok()?))
        }
        _ => None,
    }
}

impl Launcher for SimLauncher {
    /// The simulated kernel has no cgroups and kills nothing for memory.
    fn memory_kills(&self) -> Option<u64> {
        None
    }

    fn launch(&self, exec_id: &str, run: &pb::RunExec) -> std::io::Result<Launched> {
        let world = self.world.clone();
        world.fact(&Fact::Launched { sandbox: self.sandbox.as_str(), exec: exec_id });
        world.event(
            "supervisor",
            Kind::Exec,
            format!("{} generation {} runs {exec_id}", self.sandbox, self.generation),
        );
        let Some((bytes, pace, code)) = emit_args(&run.argv) else {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "only emit runs here"));
        };
        let (mut writer, reader) = tokio::io::duplex(64 << 10);
        let (signal, mut signalled) = watch::channel(None::<Signal>);
        let (exited, exit) = oneshot::channel();
        let (sandbox, generation, id) = (self.sandbox.clone(), self.generation, exec_id.to_string());
        tokio::spawn(async move {
            // E2: the record says which generation this exec was admitted for (the memory
            // store's reads never wait).
            let admitted = match ExecId::parse("exec_id", &id) {
                Ok(parsed) => world.store.exec(&sandbox, &parsed).await.ok().flatten().map(|e| e.generation),
                Err(_) => None,
            };
            if let Some(problem) = e_execs::launched_elsewhere(sandbox.as_str(), &id, generation, admitted) {
                world.violate(Invariant::E2, problem);
            }
            let mut offset = 0;
            let end = loop {
                if let Some(signal) = *signalled.borrow_and_update() {
                    break Exit::Signal(signal as i32);
                }
                // A pause holds the exec with its run: no byte, no end, until the thaw (or the
                // restore).
                if lock(&world.runtime).held(&sandbox, Some(generation)).is_some() {
                    tokio::select! {
                        biased;
                        _ = signalled.changed() => {}
                        () = tokio::time::sleep(FROZEN_LOOK) => {}
                    }
                    continue;
                }
                if offset >= bytes {
                    break Exit::Code(code);
                }
                let n = (bytes - offset).min(1024);
                let chunk: Vec<u8> = (offset..offset + n).map(|o| byte_at(&id, o)).collect();
                tokio::select! {
                    biased;
                    _ = signalled.changed() => continue,
                    written = writer.write_all(&chunk) => if written.is_err() {
                        break Exit::Signal(Signal::SIGPIPE as i32);
                    },
                }
                offset += n;
                tokio::select! {
                    biased;
                    _ = signalled.changed() => {}
                    () = tokio::time::sleep(pace) => {}
                }
            };
            drop(writer);
            let _ = exited.send(end);
        });
        Ok(Launched {
            outputs: vec![(Box::new(reader), Stream::Stdout)],
            input: Input::Closed,
            exit: Box::pin(async move { Ok(exit.await.unwrap_or(Exit::Signal(Signal::SIGKILL as i32))) }),
            signal: Box::new(move |s| {
                if matches!(s, Signal::SIGTERM | Signal::SIGKILL) {
                    signal.send_replace(Some(s));
                }
            }),
        })
    }
}

type Execs = ExecsClient<InterceptedService<Channel, Bearer>>;

/// An exec this client made: where, under which id, what it runs.
#[derive(Clone)]
struct Made {
    sandbox: String,
    id: String,
    argv: Vec<String>,
    bytes: u64,
}

/// How long a reader follows a stream before it walks away.
const READ_FOR: Duration = Duration::from_secs(20);

struct ExecClient {
    world: Arc<World>,
    draw: Draw,
    at: usize,
    made: Vec<Made>,
}

impl ExecClient {
    fn execs(&self) -> Execs {
        ExecsClient::with_interceptor(net::channel(self.at), Bearer)
    }

    fn failed(&mut self, what: &str, status: &tonic::Status) {
        if let Some(problem) = i10_no_panic_or_internal::internal(what, status) {
            self.world.violate(Invariant::I10, problem);
        }
        if status.code() == Code::Unavailable {
            self.at = (self.at + 1) % self.world.scenario.gateways;
        }
    }

    /// Reads a stream of exec `id` from `from`, checking every byte and the end (E4), until its
    /// end, an error, or `walk_away`.
    async fn read(
        &mut self,
        sandbox: &str,
        id: &str,
        from: u64,
        mut stream: tonic::Streaming<pb::ExecOutput>,
        walk_away: Duration,
    ) {
        let mut next = from;
        let mut admitted = None;
        let deadline = tokio::time::sleep(walk_away);
        tokio::pin!(deadline);
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = &mut deadline => return,
            };
            let output = match message {
                Ok(Some(m)) => m.output,
                Ok(None) => return,
                Err(status) => return self.failed(&format!("reading exec {id}"), &status),
            };
            match output {
                Some(Output::Admitted(exec)) => admitted = Some(exec.admitted_at_unix_ms),
                Some(Output::Chunk(chunk)) => {
                    let problem = if chunk.offset != next {
                        Some(format!("a reader of exec {id} expected offset {next}, got a chunk at {}", chunk.offset))
                    } else {
                        e_execs::wrong_bytes(id, chunk.offset, &chunk.data, |o| byte_at(id, o))
                    };
                    if let Some(problem) = problem {
                        return self.world.violate(Invariant::E4, problem);
                    }
                    next += chunk.data.len() as u64;
                }
                Some(Output::Gap(gap)) => next = gap.to,
                Some(Output::End(exec)) => {
                    let state = state_of(&exec);
                    self.world.event("exec client", Kind::End, format!("{sandbox} {id}: {state:?}"));
                    let admitted = admitted.unwrap_or(exec.admitted_at_unix_ms);
                    let end = Fact::ExecEnded { sandbox, exec: id, admitted, state: &state };
                    return self.world.fact(&end);
                }
                None => {}
            }
        }
    }

    /// Runs (or, with a known id, runs again) `made`, reading its output.
    async fn exec(&mut self, made: &Made, timeout: Option<u64>) {
        let start = pb::ExecStart {
            sandbox: made.sandbox.clone(),
            argv: made.argv.clone(),
            exec_id: made.id.clone(),
            timeout_ms: timeout,
            ..Default::default()
        };
        self.world.event("exec client", Kind::Exec, format!("{} {}", made.sandbox, made.id));
        let first = pb::ExecInput { input: Some(pb::exec_input::Input::Start(start)) };
        let opened = tokio::time::timeout(Duration::from_secs(3), self.execs().exec(tokio_stream::iter([first]))).await;
        match opened {
            Ok(Ok(stream)) => {
                let walk_away = if self.draw.chance(0.2) { self.draw.millis(0, 2_000) } else { READ_FOR };
                self.read(&made.sandbox, &made.id, 0, stream.into_inner(), walk_away).await;
            }
            Ok(Err(status)) => self.failed(&format!("exec {}", made.id), &status),
            Err(_) => self.at = (self.at + 1) % self.world.scenario.gateways,
        }
    }

    async fn attach(&mut self, made: &Made) {
        let offset = self.draw.below(made.bytes + 1);
        let request = pb::AttachExecRequest { sandbox: made.sandbox.clone(), exec_id: made.id.clone(), offset };
        self.world.event("exec client", Kind::Attach, format!("{} {} from {offset}", made.sandbox, made.id));
        match tokio::time::timeout(Duration::from_secs(3), self.execs().attach_exec(request)).await {
            Ok(Ok(stream)) => self.read(&made.sandbox, &made.id, offset, stream.into_inner(), READ_FOR).await,
            Ok(Err(status)) => self.failed(&format!("attach {}", made.id), &status),
            Err(_) => self.at = (self.at + 1) % self.world.scenario.gateways,
        }
    }

    async fn cancel(&mut self, made: &Made) {
        let request = pb::ExecRequest { sandbox: made.sandbox.clone(), exec_id: made.id.clone() };
        self.world.event("exec client", Kind::Cancel, format!("{} {}", made.sandbox, made.id));
        if let Ok(Err(status)) = tokio::time::timeout(Duration::from_secs(3), self.execs().cancel_exec(request)).await {
            self.failed(&format!("cancel {}", made.id), &status);
        }
    }

    async fn random_operation(&mut self) {
        let known = self.made.len() as u64;
        match self.draw.below(100) {
            n if n < 50 || known == 0 => {
                let bytes = self.draw.below(48 << 10);
                let pace = self.draw.below(200);
                let code = self.draw.below(3);
                let made = Made {
                    sandbox: sandbox_name(self.draw.below(self.world.scenario.sandboxes as u64) as usize),
                    id: format!("x{}", self.made.len()),
                    argv: vec!["emit".into(), bytes.to_string(), pace.to_string(), code.to_string()],
                    bytes,
                };
                self.made.push(made.clone());
                let timeout = self.draw.chance(0.15).then(|| 100 + self.draw.below(2_000));
                self.exec(&made, timeout).await;
            }
            50..=69 => {
                let made = self.made[self.draw.below(known) as usize].clone();
                self.exec(&made, None).await;
            }
            70..=87 => {
                let made = self.made[self.draw.below(known) as usize].clone();
                self.attach(&made).await;
            }
            _ => {
                let made = self.made[self.draw.below(known) as usize].clone();
                self.cancel(&made).await;
            }
        }
    }
}

fn state_of(exec: &pb::Exec) -> ExecState {
    let message = exec.message.clone();
    match pb::ExecState::try_from(exec.state).unwrap_or_default() {
        pb::ExecState::Exited => ExecState::Ended { end: ExecEnd::Exited(exec.exit_code.unwrap_or(-1)), message },
        pb::ExecState::Signalled => ExecState::Ended { end: ExecEnd::Signalled(exec.signal.unwrap_or(-1)), message },
        pb::ExecState::TimedOut => ExecState::Ended { end: ExecEnd::TimedOut, message },
        pb::ExecState::Cancelled => ExecState::Ended { end: ExecEnd::Cancelled, message },
        pb::ExecState::Lost => ExecState::Lost { message },
        pb::ExecState::Admitted => ExecState::Admitted,
        pb::ExecState::Running | pb::ExecState::Unspecified => ExecState::Running,
    }
}

/// The exec client's host, through the fault phase.
pub async fn exec_client(world: Arc<World>) -> turmoil::Result {
    let draw = Draw::new(world.scenario.seed, crate::scenario::Stream::ExecClient);
    let mut client = ExecClient { world: world.clone(), draw, at: 0, made: Vec::new() };
    tokio::time::sleep(Duration::from_secs(2)).await;
    while now() < world.scenario.fault_phase {
        client.random_operation().await;
        let pause = client.draw.millis(0, 300);
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// E3, once the quiet phase is over: every exec has ended, but for a paused run's.
pub async fn check_ended(world: &World) {
    let open = world.store.open_execs(None).await.unwrap_or_default();
    for exec in &open {
        let held = lock(&world.runtime).held(&exec.sandbox, Some(exec.generation)).is_some();
        if let Some(problem) = e_execs::still_open(exec, held) {
            world.violate(Invariant::E3, problem);
        }
    }
}
