//! One run's session with the gateway: hello with the run's token, heartbeats, the exit report
//! once the command has exited, and reconnecting, each attempt to the next gateway, until the
//! exit is acknowledged or the gateway rejects the run for good.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1::gateway_message::Message as FromGateway;
use berth_proto::v1::hello::MainProcess;
use berth_proto::v1::supervisor_client::SupervisorClient;
use berth_proto::v1::supervisor_message::Message as ToGateway;
use berth_proto::v1::{self as pb, Accepted, Heartbeat, Hello, MainProcessExit, SupervisorMessage};
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::exec::{End, Execs, Status as ExecStatus};
use crate::output::{Follower, Output, Read, Stream};
use crate::ports::{self, Dial};

/// How long the supervisor keeps trying to report the command's exit before giving up.
pub const REPORT_FOR: Duration = Duration::from_secs(15);
/// How long a gateway gets to answer a hello: one that never does (partitioned, hung) is
/// left for the next.
pub const ACCEPT_WITHIN: Duration = Duration::from_secs(3);
/// How many heartbeat intervals without a word from the gateway end the connection.
const SILENT_HEARTBEATS: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MainExit {
    pub code: i32,
    /// The kernel killed it for memory.
    pub out_of_memory: bool,
}

/// What the run is, as the hello tells it.
#[derive(Clone, Debug)]
pub struct Run {
    pub token: String,
    /// How the command ended, once it did.
    pub exit: watch::Receiver<Option<MainExit>>,
    /// Why the command could not be started, if it could not.
    pub failed_to_start: Option<String>,
    /// This run's execs: what the gateway asks to run, and how each stands.
    pub execs: Execs,
    /// How the run's ports are reached when the gateway asks for one.
    pub ports: Arc<dyn Dial>,
}

#[derive(Debug)]
pub enum SessionEnd {
    /// The gateway acknowledged the command's exit, or it could not be reported in
    /// [`REPORT_FOR`] (the driver's record of it remains).
    Reported,
    /// The gateway will never accept this run: the caller stops the command.
    Rejected(Status),
}

/// What a session's owner hears of it: the binary logs it, the simulator checks it.
pub trait Observer: Send {
    fn hello_sent(&mut self) {}
    fn accepted(&mut self, _accepted: &Accepted) {}
    fn exit_reported(&mut self, _code: i32) {}
    fn rejected(&mut self, _status: &Status) {}
    fn lost(&mut self, _error: &str, _retry_in: Duration) {}
    fn gave_up(&mut self) {}
}

/// Whether a refusal is final: this run's identity is stale, invalid, or its sandbox is gone.
pub fn is_final(code: Code) -> bool {
    matches!(code, Code::PermissionDenied | Code::Unauthenticated | Code::NotFound)
}

enum Attempt {
    Ended(SessionEnd),
    Lost(String),
}

/// A gateway as one attempt of a session reaches it: the session's channel, and the connections
/// into the run opened to the same endpoint.
pub struct Gateway {
    pub channel: Channel,
    pub wire: ports::Wire,
}

/// Keeps a session up until the exit is reported or the gateway rejects the run. `connect`
/// gives the gateway for each attempt (numbered from 0), so that a gateway that went away is
/// not tried twice running.
pub async fn keep_session<C, F>(mut connect: C, mut run: Run, observer: &mut impl Observer) -> SessionEnd
where
    C: FnMut(usize) -> F + Send,
    F: Future<Output = Result<Gateway, String>> + Send,
{
    let mut backoff = FIRST_BACKOFF;
    let mut reporting_since = None;
    for attempt in 0usize.. {
        let lost = match connect(attempt).await {
            Err(e) => e,
            Ok(gateway) => match session(gateway, &mut run, observer).await {
                Attempt::Ended(end) => return end,
                Attempt::Lost(e) => e,
            },
        };
        observer.lost(&lost, backoff);
        if run.exit.borrow().is_some() {
            let since = *reporting_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > REPORT_FOR {
                observer.gave_up();
                return SessionEnd::Reported;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    unreachable!("attempts are numbered without end")
}

/// One connection. The hello says whether the command already ended (or never started), so
/// that such a run is never taken for Ready.
async fn session(Gateway { channel, wire }: Gateway, run: &mut Run, observer: &mut impl Observer) -> Attempt {
    // Room for output in flight; a full channel holds readers back, never the commands.
    let (tx, rx) = mpsc::channel(64);
    let exit = *run.exit.borrow();
    let main_process = match (&run.failed_to_start, exit) {
        (Some(cause), _) => Some(MainProcess::FailedToStart(cause.clone())),
        (None, Some(exit)) => Some(MainProcess::Exited(exit.code)),
        (None, None) => None,
    };
    let out_of_memory = exit.is_some_and(|e| e.out_of_memory);
    let hello = Hello { runtime_token: run.token.clone(), main_process, out_of_memory };
    if tx.send(message(ToGateway::Hello(hello))).await.is_err() {
        return Attempt::Lost("the session closed".into());
    }
    observer.hello_sent();
    let refused = |status: Status, observer: &mut dyn Observer| {
        if is_final(status.code()) {
            observer.rejected(&status);
            Attempt::Ended(SessionEnd::Rejected(status))
        } else {
            Attempt::Lost(status.to_string())
        }
    };
    let accept = async {
        let mut inbound = SupervisorClient::new(channel.clone()).session(ReceiverStream::new(rx)).await?.into_inner();
        let first = inbound.message().await?;
        Ok::<_, Status>((inbound, first))
    };
    let (mut inbound, accepted) = match tokio::time::timeout(ACCEPT_WITHIN, accept).await {
        Err(_) => return Attempt::Lost(format!("no answer to the hello in {ACCEPT_WITHIN:?}")),
        Ok(Err(status)) => return refused(status, observer),
        Ok(Ok((inbound, Some(m)))) => match m.message {
            Some(FromGateway::Accepted(accepted)) => (inbound, accepted),
            other => return Attempt::Lost(format!("expected Accepted, got {other:?}")),
        },
        Ok(Ok((_, None))) => return Attempt::Lost("the gateway closed the session".into()),
    };
    observer.accepted(&accepted);
    let interval = Duration::from_millis(u64::from(accepted.heartbeat_interval_ms.max(100)));
    let mut heartbeat = tokio::time::interval(interval);
    // The gateway answers every heartbeat: silence for this long means the connection is gone
    // (a partition, a host that died without closing it), whatever the transport noticed.
    let silence = interval * SILENT_HEARTBEATS;
    let mut heard = tokio::time::Instant::now();
    let mut reported = false;
    // What this connection told the gateway of each exec: a new connection tells all again,
    // so that a report lost with the last one is made.
    let mut told: BTreeMap<String, u8> = BTreeMap::new();
    let mut exec_changes = run.execs.changed();
    let mut readers = Readers::default();
    // What this loop has to say, sent as the connection takes it: the loop never waits on a
    // full connection (output fills it too), so it always reads the gateway's messages and
    // notices its silence. A gateway waiting to send to a supervisor that waits to send to it
    // would otherwise hold both up for good.
    let mut pending: VecDeque<SupervisorMessage> = VecDeque::new();
    tell_execs(&run.execs, &mut told, &mut pending);
    loop {
        let exited = if reported { None } else { *run.exit.borrow_and_update() };
        if let Some(MainExit { code, out_of_memory }) = exited {
            pending.push_back(message(ToGateway::Exit(MainProcessExit { exit_code: code, out_of_memory })));
            observer.exit_reported(code);
            reported = true;
        }
        tokio::select! {
            biased;
            permit = tx.reserve(), if !pending.is_empty() => match (permit, pending.pop_front()) {
                (Ok(permit), Some(next)) => permit.send(next),
                _ => return Attempt::Lost("the session closed".into()),
            },
            received = inbound.message() => match received {
                Ok(Some(m)) => match m.message {
                    Some(FromGateway::ExitAck(_)) => return Attempt::Ended(SessionEnd::Reported),
                    // Only an answer proves the gateway hears this side: a gateway that still
                    // sends (execs, output credit) may be cut off from what this side sends.
                    Some(FromGateway::HeartbeatAck(_)) => heard = tokio::time::Instant::now(),
                    Some(FromGateway::OpenPort(open)) => {
                        let (wire, token, dial) = (wire.clone(), run.token.clone(), run.ports.clone());
                        // Each connection is one of its own: a slow one never holds up the session.
                        tokio::spawn(async move {
                            if let Err(e) = ports::open(&wire, token, open.tunnel, open.port, dial).await {
                                eprintln!("berth-supervisor: {e}");
                            }
                        });
                    }
                    Some(other) => exec_message(&run.execs, accepted.generation, other, &mut readers, &tx),
                    None => {}
                },
                Ok(None) => return Attempt::Lost("the gateway closed the session".into()),
                Err(status) => return refused(status, observer),
            },
            // Once the command's side is gone, nothing more will change.
            _ = run.exit.changed(), if !reported && run.exit.has_changed().is_ok() => {}
            _ = exec_changes.changed() => tell_execs(&run.execs, &mut told, &mut pending),
            _ = heartbeat.tick() => {
                if heard.elapsed() > silence {
                    return Attempt::Lost(format!("the gateway answered no heartbeat for {silence:?}"));
                }
                // One waiting is enough: the gateway answers the one it gets.
                let waiting = pending.iter().any(|m| matches!(m.message, Some(ToGateway::Heartbeat(_))));
                if !waiting {
                    pending.push_back(message(ToGateway::Heartbeat(Heartbeat {})));
                }
            }
        }
    }
}

fn message(m: ToGateway) -> SupervisorMessage {
    SupervisorMessage { message: Some(m) }
}

/// Queues for the gateway every exec status it has not heard on this connection.
fn tell_execs(execs: &Execs, told: &mut BTreeMap<String, u8>, pending: &mut VecDeque<SupervisorMessage>) {
    for (exec_id, status) in execs.statuses() {
        let heard = told.get(&exec_id).copied().unwrap_or(0);
        if status.rank() <= heard {
            continue;
        }
        told.insert(exec_id.clone(), status.rank());
        let report = match status {
            ExecStatus::Running => ToGateway::ExecStarted(pb::ExecStarted { exec_id }),
            ExecStatus::Ended { end, message, output_bytes, out_of_memory } => {
                use pb::exec_ended::End as Wire;
                let end = match end {
                    End::Exited(code) => Wire::ExitCode(code),
                    End::Signalled(signal) => Wire::Signal(signal),
                    End::TimedOut => Wire::TimedOut(true),
                    End::Cancelled => Wire::Cancelled(true),
                    End::Lost => Wire::Lost(true),
                };
                ToGateway::ExecEnded(pb::ExecEnded { exec_id, end: Some(end), message, output_bytes, out_of_memory })
            }
        };
        pending.push_back(message(report));
    }
}

/// The output readers of one connection, by subscription; they end with it.
#[derive(Default)]
struct Readers {
    tasks: JoinSet<()>,
    by_subscription: BTreeMap<u64, (AbortHandle, watch::Sender<u64>)>,
}

impl Readers {
    /// Sends `output` from `read.offset` for `read.subscription`, within the credit granted.
    fn start(
        &mut self,
        read: &pb::ReadOutput,
        output: Option<Arc<Output>>,
        follower: Option<Follower>,
        tx: &mpsc::Sender<SupervisorMessage>,
    ) {
        let (credit, granted) = watch::channel(read.credit);
        let reader = follow(output.zip(follower), read.subscription, read.offset, granted, tx.clone());
        let task = self.tasks.spawn(reader);
        if let Some((old, _)) = self.by_subscription.insert(read.subscription, (task, credit)) {
            old.abort();
        }
    }
}

/// Carries out an exec message from the gateway.
fn exec_message(
    execs: &Execs,
    generation: u64,
    m: FromGateway,
    readers: &mut Readers,
    tx: &mpsc::Sender<SupervisorMessage>,
) {
    match m {
        FromGateway::RunExec(mut run) => {
            let read = run.read.take();
            let exec_id = run.exec_id.clone();
            let follower = execs.run(run, generation, read.as_ref().map(|r| r.offset));
            if let Some(read) = read {
                readers.start(&read, execs.output(&exec_id), follower, tx);
            }
        }
        FromGateway::ExecStdin(input) => execs.stdin(&input.exec_id, input.data, input.close),
        FromGateway::ExecSignal(signal) => execs.signal(&signal.exec_id, signal.signal),
        FromGateway::CancelExec(cancel) => execs.cancel(&cancel.exec_id),
        FromGateway::ExecResize(resize) => {
            if let Some(window) = resize.window {
                execs.resize(&resize.exec_id, window);
            }
        }
        FromGateway::ReadOutput(read) => {
            let output = execs.output(&read.exec_id);
            let follower = output.as_ref().map(|o| o.follow(read.offset));
            readers.start(&read, output, follower, tx);
        }
        FromGateway::MoreOutput(more) => {
            if let Some((_, credit)) = readers.by_subscription.get(&more.subscription) {
                credit.send_modify(|c| *c = c.saturating_add(more.credit));
            }
        }
        FromGateway::StopReading(stop) => {
            if let Some((task, _)) = readers.by_subscription.remove(&stop.subscription) {
                task.abort();
            }
        }
        FromGateway::Accepted(_)
        | FromGateway::HeartbeatAck(_)
        | FromGateway::ExitAck(_)
        | FromGateway::OpenPort(_) => {}
    }
    // Finished readers are dropped as others come and go.
    while readers.tasks.try_join_next().is_some() {}
}

/// The most output in one message.
const OUTPUT_MESSAGE: usize = 256 << 10;

fn wire_stream(stream: Stream) -> pb::OutputStream {
    match stream {
        Stream::Stdout => pb::OutputStream::Stdout,
        Stream::Stderr => pb::OutputStream::Stderr,
        Stream::Tty => pb::OutputStream::Tty,
    }
}

/// Sends one exec's output from `offset` until its end, for one subscription, never more than
/// the gateway granted (`granted`, in bytes since the start of the subscription).
async fn follow(
    output: Option<(Arc<Output>, Follower)>,
    subscription: u64,
    mut offset: u64,
    mut granted: watch::Receiver<u64>,
    tx: mpsc::Sender<SupervisorMessage>,
) {
    let Some((output, follower)) = output else {
        let end = pb::OutputEnd { subscription, offset, unknown: true };
        let _ = tx.send(message(ToGateway::OutputEnd(end))).await;
        return;
    };
    let mut changed = output.changed();
    let mut sent: u64 = 0;
    loop {
        changed.borrow_and_update();
        let allowed = granted.borrow_and_update().saturating_sub(sent);
        if allowed == 0 {
            if granted.changed().await.is_err() {
                return;
            }
            continue;
        }
        let max = usize::try_from(allowed).unwrap_or(usize::MAX).min(OUTPUT_MESSAGE);
        let sent_ok = match output.read(offset, max) {
            Read::Data(chunks) => {
                let mut sent_ok = Ok(());
                for chunk in chunks {
                    let len = chunk.data.len() as u64;
                    let data = pb::OutputData {
                        subscription,
                        stream: wire_stream(chunk.stream).into(),
                        offset: chunk.offset,
                        data: chunk.data,
                    };
                    sent_ok = tx.send(message(ToGateway::Output(data))).await;
                    if sent_ok.is_err() {
                        break;
                    }
                    offset = chunk.offset + len;
                    sent += len;
                }
                follower.advance(offset);
                sent_ok
            }
            Read::Gap { from, to } => {
                offset = to;
                follower.advance(offset);
                tx.send(message(ToGateway::OutputGap(pb::OutputGapData { subscription, from, to }))).await
            }
            Read::End { offset } => {
                let end = pb::OutputEnd { subscription, offset, unknown: false };
                let _ = tx.send(message(ToGateway::OutputEnd(end))).await;
                return;
            }
            Read::Wait => {
                if changed.changed().await.is_err() {
                    return;
                }
                Ok(())
            }
        };
        if sent_ok.is_err() {
            return;
        }
    }
}
