//! The public files API (DESIGN 8.3): tar streams into and out of a sandbox's workspace, on
//! the host that keeps it (`berth_drivers::files` does the confined work).

use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::pin::Pin;

use berth_drivers::files::{self, FileSum, FilesError, Kind};
use berth_proto::v1 as pb;
use berth_proto::v1::files_client::FilesClient;
use berth_proto::v1::files_server;
use berth_proto::v1::upload_input::Input;
use futures_util::Stream;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::engine::Engine;
use crate::engine::files::Files;
use crate::routing::{self, Route};

/// Carries an upload to the gateway of the node that runs its sandbox. A client's
/// stream that breaks off must not reach the node as one that ended: the carried call is then
/// dropped, which resets it, and the node writes nothing, as it would for its own client.
async fn carry_upload(
    engine: &Engine,
    node: &routing::Carrier,
    start: pb::UploadStart,
    inputs: Streaming<pb::UploadInput>,
) -> Result<Response<pb::UploadReply>, Status> {
    let (broken, broke) = tokio::sync::oneshot::channel();
    let rest = futures_util::stream::unfold((inputs, Some(broken)), |(mut inputs, mut broken)| async move {
        match inputs.message().await {
            Ok(Some(input)) => Some((input, (inputs, broken))),
            Ok(None) => None,
            Err(status) => {
                if let Some(broken) = broken.take() {
                    let _ = broken.send(status);
                }
                futures_util::future::pending().await
            }
        }
    });
    let first = tokio_stream::iter([pb::UploadInput { input: Some(Input::Start(start)) }]);
    let outbound = tokio_stream::StreamExt::chain(first, rest);
    let mut client = FilesClient::new(node.channel.clone());
    let carried = client.upload(routing::carried(engine, outbound));
    tokio::select! {
        reply = carried => reply,
        Ok(status) = broke => Err(status),
    }
}

/// How much of a download one message carries.
const CHUNK: usize = 256 * 1024;

type DownloadStream = Pin<Box<dyn Stream<Item = Result<pb::DownloadOutput, Status>> + Send>>;

pub struct FilesApi {
    files: Files,
}

impl FilesApi {
    pub fn new(files: Files) -> Self {
        Self { files }
    }
}

fn status(e: FilesError) -> Status {
    let message = e.to_string();
    match e {
        FilesError::Invalid { .. } => Status::invalid_argument(message),
        FilesError::NotFound(_) => Status::not_found(message),
        FilesError::TooLarge(_) => Status::resource_exhausted(message),
        FilesError::Io(_) => Status::unavailable(message),
    }
}

fn sum(s: FileSum) -> pb::FileSum {
    let kind = match s.kind {
        Kind::File => pb::FileKind::File,
        Kind::Directory => pb::FileKind::Directory,
        Kind::Symlink => pb::FileKind::Symlink,
    };
    pb::FileSum { path: s.path, kind: kind.into(), size: s.size, sha256: s.sha256 }
}

fn path(field: &str, path: &str) -> Result<PathBuf, Status> {
    files::workspace_path(field, path).map_err(status)
}

fn spooled(e: std::io::Error) -> Status {
    Status::unavailable(format!("the gateway cannot hold the upload: {e}"))
}

/// The tar stream as it is written, in messages of [`CHUNK`] bytes, hashed.
struct Sender {
    tx: mpsc::Sender<Result<pb::DownloadOutput, Status>>,
    buf: Vec<u8>,
    hasher: Sha256,
    bytes: u64,
}

impl Sender {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        let message = pb::DownloadOutput { output: Some(pb::download_output::Output::Data(data)) };
        self.tx
            .blocking_send(Ok(message))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for Sender {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(data);
        self.bytes += data.len() as u64;
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[tonic::async_trait]
impl files_server::Files for FilesApi {
    type DownloadStream = DownloadStream;

    async fn upload(&self, request: Request<Streaming<pb::UploadInput>>) -> Result<Response<pb::UploadReply>, Status> {
        let (metadata, _, mut inputs) = request.into_parts();
        let Some(pb::UploadInput { input: Some(Input::Start(start)) }) = inputs.message().await? else {
            return Err(Status::invalid_argument("the first message of an upload must be `start`"));
        };
        let engine = self.files.engine();
        if let Route::Node(node) = routing::route(engine, &metadata, &start.sandbox).await? {
            return carry_upload(engine, &node, start, inputs).await.map_err(|s| node.unreached(s));
        }
        let into = path("path", &start.path)?;
        let workspace = self.files.workspace(&start.sandbox).await?;
        let limits = self.files.limits();
        // Held whole before a byte is written, so a bad entry anywhere writes nothing.
        let mut spool = tempfile::tempfile().map_err(spooled)?;
        let mut held = 0u64;
        while let Some(input) = inputs.message().await? {
            match input.input {
                Some(Input::Data(data)) => {
                    held += data.len() as u64;
                    if held > limits.max_bytes {
                        return Err(Status::resource_exhausted(format!(
                            "the upload is over the gateway's cap of {} bytes (max_upload_bytes)",
                            limits.max_bytes
                        )));
                    }
                    spool.write_all(&data).map_err(spooled)?;
                }
                Some(Input::Start(_)) => return Err(Status::invalid_argument("an upload has one `start`")),
                None => {}
            }
        }
        spool.seek(SeekFrom::Start(0)).map_err(spooled)?;
        let written = tokio::task::spawn_blocking(move || files::unpack(&workspace, &into, &mut spool, limits))
            .await
            .map_err(|e| Status::internal(format!("the upload's task failed: {e}")))?
            .map_err(status)?;
        Ok(Response::new(pb::UploadReply { files: written.into_iter().map(sum).collect() }))
    }

    async fn download(&self, request: Request<pb::DownloadRequest>) -> Result<Response<DownloadStream>, Status> {
        let engine = self.files.engine();
        if let Route::Node(node) = routing::route(engine, request.metadata(), &request.get_ref().sandbox).await? {
            let carried = routing::carried(engine, request.into_inner());
            let reply =
                FilesClient::new(node.channel.clone()).download(carried).await.map_err(|s| node.unreached(s))?;
            return Ok(Response::new(Box::pin(reply.into_inner())));
        }
        let request = request.into_inner();
        let from = path("path", &request.path)?;
        let workspace = self.files.workspace(&request.sandbox).await?;
        let limits = self.files.limits();
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let mut out = Sender { tx: tx.clone(), buf: Vec::with_capacity(CHUNK), hasher: Sha256::new(), bytes: 0 };
            let end = match files::pack(&workspace, &from, &mut out, limits) {
                Ok(sums) => Ok(pb::DownloadEnd {
                    files: sums.into_iter().map(sum).collect(),
                    bytes: out.bytes,
                    sha256: hex::encode(out.hasher.finalize()),
                }),
                Err(e) => Err(status(e)),
            };
            let _ = tx.blocking_send(
                end.map(|end| pb::DownloadOutput { output: Some(pb::download_output::Output::End(end)) }),
            );
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
