//! The public logs API (DESIGN 8.2): a generation's main-process output from an offset, read
//! through the driver, which keeps it on the sandbox's host while the run goes on and after.
//! A follow ends with UNAVAILABLE when the gateway shuts down, once it has sent all there was:
//! the client reads on from its offset, elsewhere or after the restart.

use std::pin::Pin;
use std::time::Duration;

use berth_drivers::logs::{self, Read};
use berth_proto::v1 as pb;
use berth_proto::v1::logs_client::LogsClient;
use berth_proto::v1::logs_output::Output;
use berth_proto::v1::logs_server;
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::engine::activity::Activity;
use crate::engine::logs::{Logs, LogsOf};
use crate::engine::shutdown::Shutdown;
use crate::error::ApiError;
use crate::routing::{self, Route};

/// How often a follower looks for more output while the run goes on.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// The most one read takes from the logs.
const READ_MAX: usize = 256 * 1024;

type LogsStream = Pin<Box<dyn Stream<Item = Result<pb::LogsOutput, Status>> + Send>>;

pub struct LogsApi {
    logs: Logs,
    /// A follow holds the sandbox's idle timeout off.
    activity: Activity,
    shutdown: Shutdown,
}

impl LogsApi {
    pub fn new(logs: Logs, activity: Activity, shutdown: Shutdown) -> Self {
        Self { logs, activity, shutdown }
    }
}

fn output(o: Output) -> Result<pb::LogsOutput, Status> {
    Ok(pb::LogsOutput { output: Some(o) })
}

/// A chunk of output on disk, as the API sends one.
pub(crate) fn chunk(c: logs::Chunk) -> pb::OutputChunk {
    let stream = match c.stream {
        logs::Stream::Stdout => pb::OutputStream::Stdout,
        logs::Stream::Stderr => pb::OutputStream::Stderr,
        logs::Stream::Tty => pb::OutputStream::Tty,
    };
    pb::OutputChunk { stream: stream.into(), offset: c.offset, data: c.data }
}

/// Whether a stream following output ends after sending a read of `read` bytes (of at most
/// `max`): the gateway is shutting down and the read was short, so the stream caught up with
/// what was written. Waiting for a read that finds nothing would let a run that writes without
/// pause keep the stream, and the shutdown, going until the bound.
pub(crate) fn caught_up_at_shutdown(shutdown: &Shutdown, read: usize, max: usize) -> bool {
    read < max && shutdown.is_begun()
}

/// Streams `of`'s output from `offset` to `tx`, then its end.
async fn stream(
    logs: Logs,
    shutdown: Shutdown,
    name: String,
    mut of: LogsOf,
    mut offset: u64,
    follow: bool,
    tx: mpsc::Sender<Result<pb::LogsOutput, Status>>,
) {
    let end = loop {
        let sent = match logs.read(&of, offset, READ_MAX).await {
            Err(e) => break Err(e.into()),
            Ok(Read::Data(chunks)) => {
                let read = chunks.iter().map(|c| c.data.len()).sum();
                let mut sent = Ok(());
                for c in chunks {
                    offset = c.offset + c.data.len() as u64;
                    sent = tx.send(output(Output::Chunk(chunk(c)))).await;
                    if sent.is_err() {
                        break;
                    }
                }
                if sent.is_ok() && caught_up_at_shutdown(&shutdown, read, READ_MAX) {
                    break Err(ApiError::ShuttingDown.into());
                }
                sent
            }
            Ok(Read::Gap { from, to }) => {
                offset = to;
                tx.send(output(Output::Gap(pb::OutputGap { from, to }))).await
            }
            Ok(Read::End { offset, exit_code }) => {
                break Ok(pb::LogsEnd { generation: of.generation, offset, complete: true, exit_code });
            }
            Ok(Read::Wait) if !follow => {
                break Ok(pb::LogsEnd { generation: of.generation, offset, complete: false, exit_code: None });
            }
            Ok(Read::Wait) => {
                tokio::select! {
                    () = shutdown.begun() => break Err(ApiError::ShuttingDown.into()),
                    () = tokio::time::sleep(FOLLOW_EVERY) => {}
                    () = tx.closed() => return,
                }
                // Whether the run is over now: then what it wrote is all there is.
                match logs.of(&name, of.generation).await {
                    Ok(now) if now.sandbox == of.sandbox => of = now,
                    // Deleted (or replaced by another of its name): its logs went with it.
                    Ok(_) | Err(ApiError::Core(berth_core::Error::NotFound { .. })) => {
                        break Ok(pb::LogsEnd { generation: of.generation, offset, complete: true, exit_code: None });
                    }
                    Err(e) => break Err(e.into()),
                }
                Ok(())
            }
        };
        if sent.is_err() {
            return;
        }
    };
    let _ = tx.send(end.map(|end| pb::LogsOutput { output: Some(Output::End(end)) })).await;
}

#[tonic::async_trait]
impl logs_server::Logs for LogsApi {
    type ReadLogsStream = LogsStream;

    async fn read_logs(&self, request: Request<pb::ReadLogsRequest>) -> Result<Response<LogsStream>, Status> {
        let engine = self.logs.engine();
        if let Route::Node(node) = routing::route(engine, request.metadata(), &request.get_ref().sandbox).await? {
            let carried = routing::carried(engine, request.into_inner());
            let reply =
                LogsClient::new(node.channel.clone()).read_logs(carried).await.map_err(|s| node.unreached(s))?;
            return Ok(Response::new(Box::pin(reply.into_inner())));
        }
        let request = request.into_inner();
        let of = self.logs.of(&request.sandbox, request.generation).await?;
        // A follow is activity for the idle timeout; a one-off read is not.
        let active = match request.follow {
            true => Some(self.activity.keep_active(&request.sandbox).await?),
            false => None,
        };
        let (tx, rx) = mpsc::channel(8);
        let (logs, shutdown) = (self.logs.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            let _active = active;
            stream(logs, shutdown, request.sandbox, of, request.offset, request.follow, tx).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
