//! The supervisor API: one long-lived session per run.
//!
//! The first message is a hello with the run's token. Its MAC is verified here; whether its
//! generation is the current one is decided by the merge (only the current generation
//! authenticates, DESIGN 3.4). A stale one gets PERMISSION_DENIED and its supervisor exits. While
//! the session lasts, every heartbeat re-checks the generation, so a run replaced by a newer
//! start loses its session; its exit report, if any, is the merge's to ignore.

use std::pin::Pin;
use std::time::Duration;

use berth_core::exec::{ExecEnd, ExecId, Report};
use berth_core::identity::{RuntimeIdentity, verify_token};
use berth_core::{MainProcess, Observation};
use berth_proto::v1 as pb;
use berth_proto::v1::gateway_message::Message as ToSupervisor;
use berth_proto::v1::supervisor_message::Message as FromSupervisor;
use berth_proto::v1::supervisor_server::Supervisor;
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::egress::Egress;
use crate::engine::Engine;
use crate::engine::execs::Execs;
use crate::engine::shutdown::Shutdown;
use crate::error::ApiError;
use crate::sessions::OutputEvent;

/// How many heartbeat intervals without a word from a supervisor end its session.
const SILENT_HEARTBEATS: u32 = 4;
/// How long a new session may take to say hello.
const HELLO_WITHIN: Duration = Duration::from_secs(10);
/// The most of a supervisor's account of a failed command start kept in the record.
const MAX_CAUSE: usize = 512;

/// `cause`, cut to [`MAX_CAUSE`] bytes on a character boundary.
fn bounded(mut cause: String) -> String {
    if cause.len() > MAX_CAUSE {
        let mut end = MAX_CAUSE;
        while !cause.is_char_boundary(end) {
            end -= 1;
        }
        cause.truncate(end);
        cause.push('…');
    }
    cause
}

/// A run's channel to its gateway: what it observes goes to the engine, its execs' reports to
/// the exec service, its connections out to egress.
pub struct SupervisorApi {
    engine: Engine,
    execs: Execs,
    egress: Egress,
    heartbeat: Duration,
}

impl SupervisorApi {
    pub fn new(engine: Engine, execs: Execs, egress: Egress, heartbeat: Duration) -> Self {
        Self { engine, execs, egress, heartbeat }
    }
}

fn message(m: ToSupervisor) -> pb::GatewayMessage {
    pb::GatewayMessage { message: Some(m) }
}

/// Whether the run is still its sandbox's current generation (core's one authentication
/// decision, asked again at every heartbeat).
async fn current(engine: &Engine, identity: &RuntimeIdentity) -> Result<(), Status> {
    let record = engine.store().sandbox(&identity.sandbox).await.map_err(ApiError::from)?;
    berth_core::observation::authenticate(record.as_ref(), &identity.sandbox, identity.generation)
        .map_err(|e| ApiError::from(e).into())
}

async fn serve_session(
    engine: Engine,
    execs: Execs,
    heartbeat: Duration,
    identity: RuntimeIdentity,
    mut inbound: Streaming<pb::SupervisorMessage>,
    tx: mpsc::Sender<Result<pb::GatewayMessage, Status>>,
) {
    let session = execs.sessions().open(identity.sandbox.clone(), identity.generation, tx.clone());
    if let Err(e) = execs.resume(&session).await {
        // The next connection tries again.
        let _ = tx.send(Err(e.into())).await;
        execs.sessions().close(&session);
        return;
    }
    let mut resume = tokio::time::interval(execs.resume_every());
    // Its first tick would be now, and the execs were just resumed.
    resume.reset();
    loop {
        let received = tokio::select! {
            biased;
            () = engine.shutdown().begun() => {
                let _ = tx.send(Err(ApiError::ShuttingDown.into())).await;
                break;
            }
            // A supervisor sends a heartbeat every interval: this long without a word, the
            // connection is taken for gone (cut off one way, or a host that died), and its run
            // goes on through another session.
            received = tokio::time::timeout(heartbeat.max(Duration::from_millis(100)) * SILENT_HEARTBEATS, inbound.message()) => match received {
                Ok(received) => received,
                Err(_) => {
                    debug!(sandbox = %identity.sandbox, "supervisor session silent; ending it");
                    break;
                }
            },
            _ = resume.tick() => {
                if let Err(e) = execs.resume(&session).await {
                    debug!(sandbox = %identity.sandbox, error = %e, "cannot read the open execs; the next tick will");
                }
                continue;
            }
        };
        let next = match received {
            Ok(Some(m)) => m.message,
            Ok(None) => break,
            Err(status) => {
                debug!(sandbox = %identity.sandbox, %status, "supervisor session broke");
                break;
            }
        };
        let reply = match next {
            Some(FromSupervisor::Heartbeat(_)) => match current(&engine, &identity).await {
                Ok(()) => Some(Ok(message(ToSupervisor::HeartbeatAck(pb::HeartbeatAck {})))),
                Err(status) => Some(Err(status)),
            },
            Some(FromSupervisor::Exit(exit)) => {
                let observation = Observation::MainProcessExited {
                    generation: identity.generation,
                    exit_code: exit.exit_code,
                    out_of_memory: exit.out_of_memory,
                };
                match engine.observe(&identity.sandbox, &observation, None).await {
                    Ok(_) => Some(Ok(message(ToSupervisor::ExitAck(pb::ExitAck {})))),
                    Err(e) => Some(Err(e.into())),
                }
            }
            Some(FromSupervisor::ExecStarted(started)) => {
                exec_report(&execs, &identity, &started.exec_id, &Report::Started).await
            }
            Some(FromSupervisor::ExecEnded(ended)) => match ended_report(&ended) {
                Some(report) => exec_report(&execs, &identity, &ended.exec_id, &report).await,
                None => Some(Err(Status::invalid_argument("an exec end report must say how it ended"))),
            },
            Some(FromSupervisor::Output(data)) => {
                let chunk = pb::OutputChunk { stream: data.stream, offset: data.offset, data: data.data };
                session.deliver(data.subscription, OutputEvent::Data(chunk));
                None
            }
            Some(FromSupervisor::OutputGap(gap)) => {
                session.deliver(gap.subscription, OutputEvent::Gap { from: gap.from, to: gap.to });
                None
            }
            Some(FromSupervisor::OutputEnd(end)) => {
                let event = OutputEvent::End { offset: end.offset, unknown: end.unknown };
                session.deliver(end.subscription, event);
                None
            }
            Some(FromSupervisor::Hello(_)) | None => {
                Some(Err(Status::invalid_argument("expected a heartbeat, an exit or an exec report")))
            }
        };
        let Some(reply) = reply else { continue };
        let stop = reply.is_err();
        if tx.send(reply).await.is_err() || stop {
            break;
        }
    }
    execs.sessions().close(&session);
    debug!(sandbox = %identity.sandbox, generation = identity.generation, "supervisor session ended");
}

/// How the supervisor says an exec ended, as core reads it.
fn ended_report(ended: &pb::ExecEnded) -> Option<Report> {
    use pb::exec_ended::End as Wire;
    let end = match ended.end? {
        Wire::ExitCode(code) => ExecEnd::Exited(code),
        Wire::Signal(signal) => ExecEnd::Signalled(signal),
        Wire::TimedOut(_) => ExecEnd::TimedOut,
        Wire::Cancelled(_) => ExecEnd::Cancelled,
        Wire::Lost(_) => return Some(Report::Lost { message: bounded(ended.message.clone()) }),
    };
    Some(Report::Ended {
        end,
        message: bounded(ended.message.clone()),
        output_bytes: ended.output_bytes,
        out_of_memory: ended.out_of_memory,
    })
}

/// Commits an exec report. Nothing is answered; a report that cannot be committed ends the
/// session, and the next connection reports again.
async fn exec_report(
    execs: &Execs,
    identity: &RuntimeIdentity,
    exec_id: &str,
    report: &Report,
) -> Option<Result<pb::GatewayMessage, Status>> {
    let Ok(id) = ExecId::parse("exec_id", exec_id) else {
        return Some(Err(Status::invalid_argument("an exec report named a malformed exec id")));
    };
    match execs.report(identity, &id, report).await {
        Ok(()) => None,
        Err(e) => Some(Err(e.into())),
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::GatewayMessage, Status>> + Send>>;
type EgressStream = Pin<Box<dyn Stream<Item = Result<pb::EgressDown, Status>> + Send>>;

/// Carries an opened connection's bytes both ways until each side has ended (an egress
/// connection out of the sandbox, or one into it for a port-forward): the sandbox's end of
/// stream shuts the connection's write side, the connection's end of file ends the reply
/// stream. A gateway shutting down cuts both at once (the connection cannot outlive it, and
/// waiting would hold the shutdown up to its bound), the reply with UNAVAILABLE.
pub(super) async fn splice<U, D>(
    shutdown: Shutdown,
    connection: impl tokio::io::AsyncRead + tokio::io::AsyncWrite,
    mut inbound: Streaming<U>,
    data_of: fn(U) -> Option<Vec<u8>>,
    tx: mpsc::Sender<Result<D, Status>>,
    down_of: fn(Vec<u8>) -> D,
) {
    use tokio::io::AsyncWriteExt;
    let (mut read, mut write) = tokio::io::split(connection);
    let shutdown = &shutdown;
    let up = async move {
        loop {
            let message = tokio::select! {
                biased;
                () = shutdown.begun() => break,
                message = inbound.message() => message,
            };
            let Ok(Some(message)) = message else { break };
            // A second open is a client's mistake; the connection it has stays as it is.
            if let Some(data) = data_of(message)
                && write.write_all(&data).await.is_err()
            {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    let down = async move {
        loop {
            // A sandbox gone away is noticed even while the connection is silent: it is not
            // held open for good.
            // Biased, so that which branch wins two ready at once is not a coin flip (the
            // simulator's runs must be the same every time).
            let read = tokio::select! {
                biased;
                () = shutdown.begun() => {
                    let _ = tx.send(Err(ApiError::ShuttingDown.into())).await;
                    break;
                }
                // Cancel-safe: bytes are taken from the connection only by the poll that ends it.
                read = berth_proto::carry::next_chunk(&mut read) => read,
                () = tx.closed() => break,
            };
            let Ok(Some(chunk)) = read else { break };
            if tx.send(Ok(down_of(chunk))).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(up, down);
}

#[tonic::async_trait]
impl Supervisor for SupervisorApi {
    type SessionStream = SessionStream;
    type EgressStream = EgressStream;

    async fn egress(&self, request: Request<Streaming<pb::EgressUp>>) -> Result<Response<Self::EgressStream>, Status> {
        let mut inbound = request.into_inner();
        let open = match tokio::time::timeout(HELLO_WITHIN, inbound.message()).await {
            Ok(Ok(Some(pb::EgressUp { message: Some(pb::egress_up::Message::Open(open)) }))) => open,
            Ok(Ok(_)) => return Err(Status::invalid_argument("the first message of an egress stream must open it")),
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("no open within 10 s")),
        };
        let (connection, addr) = self.egress.open(&open).await?;
        let (tx, rx) = mpsc::channel(8);
        let connected = pb::EgressDown { message: Some(pb::egress_down::Message::Connected(addr.to_string())) };
        let _ = tx.send(Ok(connected)).await;
        let data_of = |m: pb::EgressUp| match m.message {
            Some(pb::egress_up::Message::Data(data)) => Some(data),
            _ => None,
        };
        let down_of = |data| pb::EgressDown { message: Some(pb::egress_down::Message::Data(data)) };
        tokio::spawn(splice(self.engine.shutdown().clone(), connection, inbound, data_of, tx, down_of));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn session(
        &self,
        request: Request<Streaming<pb::SupervisorMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(HELLO_WITHIN, inbound.message()).await {
            Ok(Ok(Some(pb::SupervisorMessage { message: Some(FromSupervisor::Hello(hello)) }))) => hello,
            Ok(Ok(_)) => return Err(Status::invalid_argument("the first message of a session must be a hello")),
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("no hello within 10 s")),
        };
        let identity = verify_token(self.engine.key(), &hello.runtime_token).map_err(ApiError::from)?;
        let main = match hello.main_process {
            None => MainProcess::Running,
            Some(pb::hello::MainProcess::Exited(code)) => {
                MainProcess::Exited { code, out_of_memory: hello.out_of_memory }
            }
            Some(pb::hello::MainProcess::FailedToStart(cause)) => MainProcess::Unstartable(bounded(cause)),
        };
        let connected = Observation::SupervisorConnected { generation: identity.generation, main };
        if let Err(e) = self.engine.observe(&identity.sandbox, &connected, None).await {
            warn!(sandbox = %identity.sandbox, generation = identity.generation, error = %e, "supervisor rejected");
            return Err(e.into());
        }
        info!(sandbox = %identity.sandbox, generation = identity.generation, "supervisor connected");
        let (tx, rx) = mpsc::channel(8);
        let accepted = pb::Accepted {
            sandbox_id: identity.sandbox.to_string(),
            generation: identity.generation,
            heartbeat_interval_ms: u32::try_from(self.heartbeat.as_millis()).unwrap_or(u32::MAX),
        };
        let _ = tx.send(Ok(message(ToSupervisor::Accepted(accepted)))).await;
        tokio::spawn(serve_session(self.engine.clone(), self.execs.clone(), self.heartbeat, identity, inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_cause_is_kept_whole_up_to_its_cap_and_cut_on_a_character_boundary() {
        assert_eq!(bounded("cannot run \"x\": No such file".into()), "cannot run \"x\": No such file");
        let long = "é".repeat(MAX_CAUSE);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_CAUSE + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…') && cut.starts_with("éé"));
    }
}
