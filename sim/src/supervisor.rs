//! The runs' supervisors: berth-supervisor's own session (the `berth-supervisor` library) over
//! simulated TCP with the run's token, one per run, and stale ones reconnecting with old tokens.
//! Each acceptance and rejection is checked against the committed generations (I6).

use std::sync::Arc;

use berth_core::SandboxId;
use berth_proto::v1::Accepted;
use berth_supervisor::exec::{DEFAULT_OUTPUT_CAP, Execs};
use berth_supervisor::ports::{Dial, Dialing};
use berth_supervisor::session::{self, MainExit, Observer, Run, SessionEnd};
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::execs::{SimLauncher, SimLog};
use crate::invariants::Invariant;
use crate::invariants::i6_one_generation::{self, Session};
use crate::net;
use crate::runtime::{Call, EndCause, Request, RunSignal, Spawn};
use crate::trace::Kind;
use crate::world::{World, lock};

pub async fn supervisors(
    world: Arc<World>,
    mut spawns: mpsc::UnboundedReceiver<Spawn>,
    runtime: mpsc::UnboundedSender<Request>,
) -> turmoil::Result {
    while let Some(spawn) = spawns.recv().await {
        tokio::spawn(supervise(world.clone(), spawn, runtime.clone()));
    }
    Ok(())
}

/// What the simulator hears of a session: each hello's time, and each answer checked (I6).
struct Checks {
    world: Arc<World>,
    sandbox: SandboxId,
    generation: u64,
    actor: &'static str,
    sent: u64,
    /// A stale supervisor makes one attempt: told when it got its answer, or none.
    done: Option<watch::Sender<bool>>,
}

impl Checks {
    fn name(&self) -> String {
        lock(&self.world.runtime).name(&self.sandbox)
    }

    /// I6 on the answer to this session just given: `judge`'s problem with it, if any.
    fn check(&self, judge: impl FnOnce(&Session) -> Option<String>) {
        let generations = self.world.generations_of(&self.sandbox);
        let session = Session {
            sandbox: &self.sandbox,
            generation: self.generation,
            sent: self.sent,
            answered: World::micros(),
            generations: &generations,
        };
        if let Some(problem) = judge(&session) {
            self.world.violate(Invariant::I6, problem);
        }
    }

    fn finish(&self) {
        if let Some(done) = &self.done {
            done.send_replace(true);
        }
    }
}

impl Observer for Checks {
    fn hello_sent(&mut self) {
        self.sent = World::micros();
    }

    fn accepted(&mut self, _accepted: &Accepted) {
        let world = &self.world;
        world.event(self.actor, Kind::Accepted, format!("{} generation {}", self.name(), self.generation));
        self.check(i6_one_generation::accepted);
        self.finish();
    }

    fn exit_reported(&mut self, code: i32) {
        let detail = format!("{} generation {} code {code}", self.name(), self.generation);
        self.world.event(self.actor, Kind::ExitReport, detail);
    }

    /// A refusal: PERMISSION_DENIED is right only if a newer generation was committed.
    fn rejected(&mut self, status: &Status) {
        let world = &self.world;
        let detail = format!("{} generation {}: {:?}", self.name(), self.generation, status.code());
        world.event(self.actor, Kind::Rejected, detail);
        self.check(|session| i6_one_generation::rejected(session, status.code()));
        self.finish();
    }

    fn lost(&mut self, _error: &str, _retry_in: std::time::Duration) {
        self.finish();
    }
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn supervise(world: Arc<World>, mut spawn: Spawn, runtime: mpsc::UnboundedSender<Request>) {
    if !spawn.ghost && *spawn.signal.borrow() == RunSignal::Ended {
        return;
    }
    let gateways = world.scenario.gateways;
    // Like berth-supervisor given several gateways: each attempt goes to the next one; a run of
    // a node of its own reaches only its node's gateway.
    let first = spawn.generation as usize + 1;
    let home = spawn.home;
    let connect = move |attempt: usize| async move {
        let i = home.unwrap_or((first + attempt) % gateways);
        Ok(session::Gateway { channel: net::channel(i), wire: net::wire(i) })
    };
    // A command that could not be started has its exit recorded before the hello, as
    // berth-supervisor does, and nothing else runs: no execs, no egress.
    let status = crate::runtime::EndCause::Unstartable.supervisor_status();
    let never_ran = spawn.failed_to_start.as_ref().map(|_| MainExit { code: status, out_of_memory: false });
    let (exit, exit_rx) = watch::channel(never_ran);
    let launcher = SimLauncher { world: world.clone(), sandbox: spawn.sandbox.clone(), generation: spawn.generation };
    let log = SimLog { world: world.clone(), sandbox: spawn.sandbox.clone() };
    let execs = Execs::new(DEFAULT_OUTPUT_CAP, Arc::new(launcher), Arc::new(log));
    let failed_to_start = spawn.failed_to_start.clone();
    let run = || Run {
        token: spawn.token.clone(),
        exit: exit_rx.clone(),
        failed_to_start: failed_to_start.clone(),
        execs: execs.clone(),
        ports: Arc::new(SimPorts { sandbox: spawn.sandbox.clone(), generation: spawn.generation }),
    };
    let (done, mut answered) = watch::channel(false);
    let mut checks = Checks {
        world: world.clone(),
        sandbox: spawn.sandbox.clone(),
        generation: spawn.generation,
        actor: if spawn.ghost { "stale supervisor" } else { "supervisor" },
        sent: 0,
        done: spawn.ghost.then_some(done),
    };
    // The run's egress requests, for as long as its supervisor lives (G1).
    let _egress = (world.scenario.egress && !spawn.ghost && spawn.failed_to_start.is_none()).then(|| {
        let workload = crate::egress::workload(
            world.clone(),
            spawn.token.clone(),
            spawn.sandbox.clone(),
            spawn.generation,
            connect,
        );
        AbortOnDrop(tokio::spawn(workload))
    });
    // Each pass is one life of the supervisor's process: a checkpoint ends it (its connection
    // with it), and a restore brings it back, connecting again with the same token.
    loop {
        let session = session::keep_session(connect, run(), &mut checks);
        tokio::pin!(session);
        loop {
            // Biased: an unbiased select polls its branches from a start tokio draws from an
            // OS-seeded generator (turmoil seeds it only under `--cfg tokio_unstable`), and
            // whether the session is polled before or after the signal (or the answer) changes
            // what it sends and when, so the same seed would not give the same trace (I9).
            tokio::select! {
                biased;
                end = &mut session => {
                    // A rejected supervisor stops its workload and exits, and one whose command
                    // never started exits once its session ends: its run ends.
                    let cause = match end {
                        _ if spawn.ghost => None,
                        _ if spawn.failed_to_start.is_some() => Some(EndCause::Unstartable),
                        SessionEnd::Rejected(_) => Some(EndCause::SupervisorExit),
                        _ => None,
                    };
                    if let Some(cause) = cause {
                        let (reply, _) = tokio::sync::oneshot::channel();
                        let call = Call::SupervisorExited(spawn.sandbox.clone(), spawn.generation, cause);
                        // Not a gateway's call: nothing crashes after it.
                        let _ = runtime.send(Request { gateway: usize::MAX, call, reply });
                    }
                    return;
                }
                _ = answered.changed(), if spawn.ghost => return,
                changed = spawn.signal.changed(), if !spawn.ghost => {
                    match *spawn.signal.borrow_and_update() {
                        _ if changed.is_err() => return,
                        RunSignal::MainExited { code, out_of_memory } => {
                            exit.send_replace(Some(MainExit { code, out_of_memory }));
                        }
                        // Killed with its run: the connection goes with it, and its execs.
                        RunSignal::Ended => {
                            tokio::spawn(async move { execs.stop_all().await });
                            return;
                        }
                        RunSignal::Checkpointed => break,
                        RunSignal::Running => {}
                    }
                }
            }
        }
        // In the checkpoint: nothing runs until the restore, or the end.
        loop {
            if spawn.signal.changed().await.is_err() {
                return;
            }
            match *spawn.signal.borrow_and_update() {
                RunSignal::Running => break,
                RunSignal::Ended => {
                    tokio::spawn(async move { execs.stop_all().await });
                    return;
                }
                RunSignal::Checkpointed | RunSignal::MainExited { .. } => {}
            }
        }
    }
}

/// What a simulated run serves on its ports: on [`SERVED_PORT`], an HTTP server that answers
/// every request with the run it is (`<sandbox> <generation>`), so that a client can tell which
/// run a URL reached (U1); on any other port nothing, refused as a closed port is.
#[derive(Debug)]
struct SimPorts {
    sandbox: SandboxId,
    generation: u64,
}

/// The port a simulated run's server listens on.
pub const SERVED_PORT: u16 = 8080;

impl Dial for SimPorts {
    fn dial(&self, port: u16) -> Dialing {
        let answer = format!("{} {}", self.sandbox, self.generation);
        Box::pin(async move {
            if port != SERVED_PORT {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("nothing listens on {port}"),
                ));
            }
            let (ours, theirs) = tokio::io::duplex(4096);
            tokio::spawn(serve_one(ours, answer));
            Ok(Box::new(theirs) as Box<dyn berth_supervisor::ports::Connection>)
        })
    }
}

/// Answers one request on `connection` with `answer`, and closes it.
async fn serve_one(mut connection: tokio::io::DuplexStream, answer: String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match connection.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len());
    let _ = connection.write_all(reply.as_bytes()).await;
    let _ = connection.shutdown().await;
}
