//! The public exec API (DESIGN 8.1): run a command in a Ready sandbox, attach to its output
//! from any offset, read, list and cancel execs.
//!
//! A stream's output comes from the supervisor session of the exec's run. When that session
//! goes (its gateway died, the connection broke) the stream waits for the next and reads on
//! from the offset it got to, so a reader sees every kept byte once, in order, at its offset;
//! it ends with the exec's final state, which the run's report or the sweep always brings (E3).
//! A gateway shutting down ends it with UNAVAILABLE once what was kept on disk up to then is
//! sent: the client attaches again from its offset, elsewhere or after the restart.

use std::pin::Pin;
use std::time::Duration;

use berth_core::exec::{Exec, ExecId};
use berth_drivers::logs::Read;
use berth_proto::v1 as pb;
use berth_proto::v1::exec_input::Input;
use berth_proto::v1::exec_output::Output;
use berth_proto::v1::execs_client::ExecsClient;
use berth_proto::v1::execs_server;
use berth_proto::v1::gateway_message::Message as ToSupervisor;
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use crate::engine::activity::Activity;
use crate::engine::execs::Execs;
use crate::engine::shutdown::Shutdown;
use crate::error::ApiError;
use crate::routing::{self, Route};
use crate::sessions::{OutputEvent, READ_WINDOW};

/// The most one read of an exec's output on disk takes.
const READ_MAX: usize = 256 * 1024;

/// How long a stream waits for its exec's session before it looks at the exec again.
const SESSION_WAIT: Duration = Duration::from_millis(500);

pub(crate) type OutputStream = Pin<Box<dyn Stream<Item = Result<pb::ExecOutput, Status>> + Send>>;

#[derive(Clone)]
pub struct ExecApi {
    execs: Execs,
    /// An attach holds the sandbox's idle timeout off.
    activity: Activity,
    shutdown: Shutdown,
}

impl ExecApi {
    pub fn new(execs: Execs, activity: Activity, shutdown: Shutdown) -> Self {
        Self { execs, activity, shutdown }
    }

    pub(crate) fn execs(&self) -> &Execs {
        &self.execs
    }
}

fn exec_id(id: &str) -> Result<ExecId, Status> {
    ExecId::parse("exec_id", id).map_err(|e| ApiError::from(e).into())
}

fn output(o: Output) -> Result<pb::ExecOutput, Status> {
    Ok(pb::ExecOutput { output: Some(o) })
}

/// Streams `exec`'s output from `offset` to `tx` until its end, then its final state. A run
/// that does not know the exec yet runs it (on a terminal of `window`'s size, for a tty).
async fn follow(
    api: ExecApi,
    exec: Exec,
    name: String,
    mut offset: u64,
    window: Option<pb::WindowSize>,
    tx: mpsc::Sender<Result<pb::ExecOutput, Status>>,
) {
    let ExecApi { execs, shutdown, .. } = api;
    let mut sessions = execs.sessions().changed();
    let end = loop {
        sessions.borrow_and_update();
        // A gateway shutting down loses its sessions: the stream reads on from disk to its end.
        let session =
            execs.sessions().get(&exec.sandbox, exec.generation).filter(|s| !s.closed() && !shutdown.is_begun());
        let Some(session) = session else {
            // No session here: its run is served through another gateway, reconnecting, or over.
            // What its supervisor kept on disk is read meanwhile (any gateway on the sandbox's
            // host can), at the same offsets as the session's.
            let current = match execs.get(&exec.sandbox, &exec.id).await {
                Ok(Some(current)) => current,
                Ok(None) => break execs.final_state(&exec).await.map_err(Status::from),
                Err(e) => break Err(e.into()),
            };
            let over = current.state.is_terminal();
            let sent = match execs.read_output(&exec, offset, READ_MAX, over).await {
                Ok(Read::Data(chunks)) => {
                    let read = chunks.iter().map(|c| c.data.len()).sum();
                    let mut sent = Ok(());
                    for c in chunks {
                        offset = c.offset + c.data.len() as u64;
                        sent = tx.send(output(Output::Chunk(super::logs::chunk(c)))).await;
                        if sent.is_err() {
                            break;
                        }
                    }
                    // An exec that ended reads on to its end, which is all there is to send.
                    if sent.is_ok() && !over && super::logs::caught_up_at_shutdown(&shutdown, read, READ_MAX) {
                        break Err(ApiError::ShuttingDown.into());
                    }
                    Some(sent)
                }
                Ok(Read::Gap { from, to }) => {
                    offset = to;
                    Some(tx.send(output(Output::Gap(pb::OutputGap { from, to }))).await)
                }
                // Nothing more to read of an exec that ended: what was not kept anywhere this
                // gateway can read is told as a gap, never left out quietly.
                _ if over => {
                    if let Some(total) = current.output_bytes.filter(|total| *total > offset) {
                        let _ = tx.send(output(Output::Gap(pb::OutputGap { from: offset, to: total }))).await;
                    }
                    break Ok(current);
                }
                _ => None,
            };
            match sent {
                Some(Ok(())) => continue,
                Some(Err(_)) => return,
                None => {}
            }
            // All that was on disk is sent: a gateway shutting down ends the stream here, since
            // nothing more reaches it (no session, no exec report).
            tokio::select! {
                () = shutdown.begun() => break Err(ApiError::ShuttingDown.into()),
                _ = sessions.changed() => {}
                () = tokio::time::sleep(SESSION_WAIT) => {}
                () = tx.closed() => return,
            }
            continue;
        };
        // The run learns of the exec as its output is asked for (a no-op if it knows it).
        let run = match execs.exec_run(&exec).await {
            Ok(run) => pb::RunExec { window, ..run },
            Err(e) => break Err(e.into()),
        };
        let Some((subscription, mut events)) = session.run_and_read(run, offset).await else {
            // The connection went as it was asked: the next session is waited for above.
            continue;
        };
        let mut consumed = 0;
        let ended = loop {
            // At a shutdown what the session brought and was not sent yet is read from disk
            // above, from `offset`, like all the run kept.
            let event = tokio::select! {
                event = events.recv() => event,
                () = tx.closed() => {
                    session.stop_reading(subscription);
                    return;
                }
                () = shutdown.begun() => {
                    session.stop_reading(subscription);
                    break false;
                }
            };
            let sent = match event {
                Some(OutputEvent::Data(chunk)) => {
                    let len = chunk.data.len() as u64;
                    offset = chunk.offset + len;
                    let sent = tx.send(output(Output::Chunk(chunk))).await;
                    // Credit back once the client took it: a slow client slows the command.
                    consumed += len;
                    if consumed >= READ_WINDOW / 4 {
                        session.grant(subscription, consumed).await;
                        consumed = 0;
                    }
                    sent
                }
                Some(OutputEvent::Gap { from, to }) => {
                    offset = to;
                    tx.send(output(Output::Gap(pb::OutputGap { from, to }))).await
                }
                Some(OutputEvent::End { .. }) => break true,
                // The connection went: read on from `offset` through the next session.
                None => break false,
            };
            if sent.is_err() {
                session.stop_reading(subscription);
                return;
            }
        };
        if ended {
            break execs.final_state(&exec).await.map_err(Status::from);
        }
    };
    let _ = tx.send(end.map(|e| pb::ExecOutput { output: Some(Output::End(convert::exec(&e, &name))) })).await;
}

/// Passes the client's stdin, window sizes and signals to the exec's run until the client's
/// side closes, or the gateway shuts down: a request side held open would keep the call, and
/// with it the shutdown, waiting after the output's stream ended.
async fn forward_input(
    api: ExecApi,
    exec: Exec,
    mut inbound: impl Stream<Item = Result<pb::ExecInput, Status>> + Send + Unpin,
) {
    let mut told = None;
    loop {
        let message = tokio::select! {
            biased;
            () = api.shutdown.begun() => return,
            message = futures_util::StreamExt::next(&mut inbound) => message,
        };
        let Some(Ok(message)) = message else { return };
        let Some(input) = message.input else { continue };
        deliver(&api, &exec, input, &mut told).await;
    }
}

/// Hands one input of a client's to `exec`'s run. A session not `told` of the exec yet is told
/// first, so input never reaches a run before the exec does. False when no session of the run
/// is here (its run is served through another gateway, reconnecting, or over).
pub(crate) async fn deliver(
    api: &ExecApi,
    exec: &Exec,
    input: Input,
    told: &mut Option<std::sync::Arc<crate::sessions::Session>>,
) -> bool {
    let exec_id = exec.id.to_string();
    let m = match input {
        Input::Stdin(data) => ToSupervisor::ExecStdin(pb::ExecStdin { exec_id, data, close: false }),
        Input::CloseStdin(_) => ToSupervisor::ExecStdin(pb::ExecStdin { exec_id, data: Vec::new(), close: true }),
        Input::Resize(window) => ToSupervisor::ExecResize(pb::ExecResize { exec_id, window: Some(window) }),
        Input::Signal(signal) => ToSupervisor::ExecSignal(pb::ExecSignal { exec_id, signal }),
        // A second start is a client bug; the exec it named runs already.
        Input::Start(_) => return true,
    };
    let Some(session) = api.execs.sessions().get(&exec.sandbox, exec.generation) else { return false };
    if told.as_ref().is_none_or(|t| !std::sync::Arc::ptr_eq(t, &session)) {
        // Unreadable now: the run is told with the next input (or knows it already).
        if let Ok(run) = api.execs.exec_run(exec).await {
            session.send(ToSupervisor::RunExec(run)).await;
            *told = Some(session.clone());
        }
    }
    session.send(m).await;
    true
}

/// Starts the exec `start` asks for where its sandbox runs, with `input` (stdin, window sizes,
/// signals) after it: carried, whole, to the gateway of the node that runs it when that is
/// another node (unless `metadata` says the call was carried here already), else admitted here
/// (or found, for a retry of its id). Its output from the start to its end, the admitted exec
/// first: every way in (gRPC, HTTP, E2B's API) reaches a sandbox on any node alike.
pub(crate) async fn open_exec<S>(
    api: &ExecApi,
    metadata: &tonic::metadata::MetadataMap,
    start: pb::ExecStart,
    input: S,
) -> Result<OutputStream, Status>
where
    S: Stream<Item = Result<pb::ExecInput, Status>> + Send + Unpin + 'static,
{
    let engine = api.execs.engine();
    if let Route::Node(node) = routing::route(engine, metadata, &start.sandbox).await? {
        let first = pb::ExecInput { input: Some(Input::Start(start)) };
        let rest = tokio_stream::StreamExt::map_while(input, Result::ok);
        let outbound = tokio_stream::StreamExt::chain(tokio_stream::iter([first]), rest);
        let carried = routing::carried(engine, outbound);
        let reply = ExecsClient::new(node.channel.clone()).exec(carried).await.map_err(|s| node.unreached(s))?;
        return Ok(Box::pin(reply.into_inner()));
    }
    let id = if start.exec_id.is_empty() { api.execs.new_id() } else { exec_id(&start.exec_id)? };
    let spec = convert::exec_spec(&start);
    let admitted = api.execs.admit(&start.sandbox, &id, &spec).await?;
    let (tx, rx) = mpsc::channel(16);
    let _ = tx.send(output(Output::Admitted(convert::exec(&admitted, &start.sandbox)))).await;
    tokio::spawn(follow(api.clone(), admitted.clone(), start.sandbox, 0, start.window, tx));
    tokio::spawn(forward_input(api.clone(), admitted, input));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

#[tonic::async_trait]
impl execs_server::Execs for ExecApi {
    type ExecStream = OutputStream;
    type AttachExecStream = OutputStream;

    async fn exec(&self, request: Request<Streaming<pb::ExecInput>>) -> Result<Response<Self::ExecStream>, Status> {
        let (metadata, _, mut inbound) = request.into_parts();
        let start = match inbound.message().await? {
            Some(pb::ExecInput { input: Some(Input::Start(start)) }) => start,
            _ => return Err(Status::invalid_argument("invalid start: the first message of an exec must be its start")),
        };
        Ok(Response::new(open_exec(self, &metadata, start, inbound).await?))
    }

    async fn get_exec(&self, request: Request<pb::ExecRequest>) -> Result<Response<pb::ExecReply>, Status> {
        let request = request.into_inner();
        let (_, exec) = self.execs.find(&request.sandbox, &exec_id(&request.exec_id)?).await?;
        Ok(Response::new(pb::ExecReply { exec: Some(convert::exec(&exec, &request.sandbox)) }))
    }

    async fn list_execs(&self, request: Request<pb::ListExecsRequest>) -> Result<Response<pb::ListExecsReply>, Status> {
        let request = request.into_inner();
        berth_core::validate::dns_label("sandbox", &request.sandbox).map_err(ApiError::from)?;
        let page = super::public::page_of(request.page_size, request.page_token, |field, token| {
            ExecId::parse(field, token).map(|_| ())
        })?;
        let page = self.execs.list(&request.sandbox, &page).await?;
        Ok(Response::new(pb::ListExecsReply {
            execs: page.items.iter().map(|e| convert::exec(e, &request.sandbox)).collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn attach_exec(
        &self,
        request: Request<pb::AttachExecRequest>,
    ) -> Result<Response<Self::AttachExecStream>, Status> {
        let engine = self.execs.engine();
        if let Route::Node(node) = routing::route(engine, request.metadata(), &request.get_ref().sandbox).await? {
            let carried = routing::carried(engine, request.into_inner());
            let reply =
                ExecsClient::new(node.channel.clone()).attach_exec(carried).await.map_err(|s| node.unreached(s))?;
            return Ok(Response::new(Box::pin(reply.into_inner())));
        }
        let request = request.into_inner();
        let (_, exec) = self.execs.find(&request.sandbox, &exec_id(&request.exec_id)?).await?;
        let active = self.activity.keep_active(&request.sandbox).await?;
        let (tx, rx) = mpsc::channel(16);
        let _ = tx.send(output(Output::Admitted(convert::exec(&exec, &request.sandbox)))).await;
        let api = self.clone();
        tokio::spawn(async move {
            let _active = active;
            follow(api, exec, request.sandbox, request.offset, None, tx).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// Carried to the node that runs the sandbox, whose session tells the run at once (the
    /// store's word alone would reach the run only with its next session).
    async fn cancel_exec(&self, request: Request<pb::ExecRequest>) -> Result<Response<pb::ExecReply>, Status> {
        let engine = self.execs.engine();
        if let Route::Node(node) = routing::route(engine, request.metadata(), &request.get_ref().sandbox).await? {
            let carried = routing::carried(engine, request.into_inner());
            return ExecsClient::new(node.channel.clone()).cancel_exec(carried).await.map_err(|s| node.unreached(s));
        }
        let request = request.into_inner();
        let exec = self.execs.cancel(&request.sandbox, &exec_id(&request.exec_id)?).await?;
        Ok(Response::new(pb::ExecReply { exec: Some(convert::exec(&exec, &request.sandbox)) }))
    }
}
