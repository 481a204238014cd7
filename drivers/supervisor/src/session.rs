//! One run's session with the gateway: hello with the run's token, heartbeats, the exit report
//! once the command has exited, and reconnecting, each attempt to the next gateway, until the
//! exit is acknowledged or the gateway rejects the run for good.

use std::future::Future;
use std::time::Duration;

use berth_proto::v1::gateway_message::Message as FromGateway;
use berth_proto::v1::hello::MainProcess;
use berth_proto::v1::supervisor_client::SupervisorClient;
use berth_proto::v1::supervisor_message::Message as ToGateway;
use berth_proto::v1::{Accepted, Heartbeat, Hello, MainProcessExit, SupervisorMessage};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// How long the supervisor keeps trying to report the command's exit before giving up.
pub const REPORT_FOR: Duration = Duration::from_secs(15);
/// How long a gateway gets to answer a hello: one that never does (partitioned, hung) is
/// left for the next.
pub const ACCEPT_WITHIN: Duration = Duration::from_secs(3);
/// How many heartbeat intervals without a word from the gateway end the connection.
const SILENT_HEARTBEATS: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What the run is, as the hello tells it.
#[derive(Clone, Debug)]
pub struct Run {
    pub token: String,
    /// The command's exit code once it exited.
    pub exit: watch::Receiver<Option<i32>>,
    /// Why the command could not be started, if it could not.
    pub failed_to_start: Option<String>,
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

/// Keeps a session up until the exit is reported or the gateway rejects the run. `connect`
/// gives the channel for each attempt (numbered from 0), so that a gateway that went away is
/// not tried twice running.
pub async fn keep_session<C, F>(mut connect: C, mut run: Run, observer: &mut impl Observer) -> SessionEnd
where
    C: FnMut(usize) -> F + Send,
    F: Future<Output = Result<Channel, String>> + Send,
{
    let mut backoff = FIRST_BACKOFF;
    let mut reporting_since = None;
    for attempt in 0usize.. {
        let lost = match connect(attempt).await {
            Err(e) => e,
            Ok(channel) => match session(channel, &mut run, observer).await {
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
async fn session(channel: Channel, run: &mut Run, observer: &mut impl Observer) -> Attempt {
    let (tx, rx) = mpsc::channel(4);
    let main_process = match (&run.failed_to_start, *run.exit.borrow()) {
        (Some(cause), _) => Some(MainProcess::FailedToStart(cause.clone())),
        (None, Some(code)) => Some(MainProcess::Exited(code)),
        (None, None) => None,
    };
    let hello = Hello { runtime_token: run.token.clone(), main_process };
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
        let mut inbound = SupervisorClient::new(channel).session(ReceiverStream::new(rx)).await?.into_inner();
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
    loop {
        let exited = if reported { None } else { *run.exit.borrow_and_update() };
        if let Some(code) = exited {
            if tx.send(message(ToGateway::Exit(MainProcessExit { exit_code: code }))).await.is_err() {
                return Attempt::Lost("the session closed".into());
            }
            observer.exit_reported(code);
            reported = true;
        }
        tokio::select! {
            biased;
            received = inbound.message() => match received {
                Ok(Some(m)) => {
                    heard = tokio::time::Instant::now();
                    if let Some(FromGateway::ExitAck(_)) = m.message {
                        return Attempt::Ended(SessionEnd::Reported);
                    }
                }
                Ok(None) => return Attempt::Lost("the gateway closed the session".into()),
                Err(status) => return refused(status, observer),
            },
            // Once the command's side is gone, nothing more will change.
            _ = run.exit.changed(), if !reported && run.exit.has_changed().is_ok() => {}
            _ = heartbeat.tick() => {
                if heard.elapsed() > silence {
                    return Attempt::Lost(format!("the gateway answered no heartbeat for {silence:?}"));
                }
                if tx.send(message(ToGateway::Heartbeat(Heartbeat {}))).await.is_err() {
                    return Attempt::Lost("the session closed".into());
                }
            }
        }
    }
}

fn message(m: ToGateway) -> SupervisorMessage {
    SupervisorMessage { message: Some(m) }
}
