//! The main process's output, kept in its generation's logs (`berth-logs`, DESIGN 8.2) as it is
//! written, and passed on to the supervisor's own stdout and stderr when asked (a container's
//! runtime keeps those: `docker logs` shows them as before).

use std::time::Duration;

use berth_logs::{Stream, Writer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long the pipes are read after the command exited: a process it left behind may hold
/// them open for good.
const DRAIN: Duration = Duration::from_secs(1);

/// The generation's output, while the command runs.
pub struct Capture {
    exited: oneshot::Sender<()>,
    task: JoinHandle<Option<Writer>>,
}

fn warn(e: &std::io::Error) {
    eprintln!("berth-supervisor: cannot keep the command's output: {e}; it goes on unlogged");
}

/// Writes what `stream` gave to the logs (dropped from then on once a write failed) and echoes it.
async fn keep(
    writer: &mut Option<Writer>,
    stream: Stream,
    data: &[u8],
    echo: Option<&mut (dyn AsyncWrite + Unpin + Send)>,
) {
    if let Some(w) = writer.as_mut()
        && let Err(e) = w.append(stream, data)
    {
        warn(&e);
        *writer = None;
    }
    if let Some(echo) = echo {
        // The supervisor's own output going nowhere must not stop the command's.
        let _ = echo.write_all(data).await;
    }
}

async fn read_some(pipe: &mut Option<impl AsyncRead + Unpin>, buf: &mut [u8]) -> usize {
    match pipe {
        Some(pipe) => pipe.read(buf).await.unwrap_or(0),
        None => std::future::pending().await,
    }
}

/// Reads the command's pipes into `writer` until both close, or [`DRAIN`] after [`Capture::finish`].
pub fn capture(writer: Writer, stdout: ChildStdout, stderr: ChildStderr, echo: bool) -> Capture {
    let (exited, mut on_exit) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut writer = Some(writer);
        let (mut out, mut err) = (Some(stdout), Some(stderr));
        let (mut out_buf, mut err_buf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
        let (mut own_out, mut own_err) = (tokio::io::stdout(), tokio::io::stderr());
        let mut drain = std::pin::pin!(async {
            let _ = (&mut on_exit).await;
            tokio::time::sleep(DRAIN).await;
        });
        while out.is_some() || err.is_some() {
            tokio::select! {
                n = read_some(&mut out, &mut out_buf) => match n {
                    0 => out = None,
                    n => keep(&mut writer, Stream::Stdout, &out_buf[..n], echo.then_some(&mut own_out as _)).await,
                },
                n = read_some(&mut err, &mut err_buf) => match n {
                    0 => err = None,
                    n => keep(&mut writer, Stream::Stderr, &err_buf[..n], echo.then_some(&mut own_err as _)).await,
                },
                () = &mut drain => break,
            }
        }
        writer
    });
    Capture { exited, task }
}

impl Capture {
    /// The command exited with `code`: the rest of its output is read, then the generation's
    /// output is marked complete. Done before the exit is recorded or reported, so whoever
    /// learns of the exit finds the output whole.
    pub async fn finish(self, code: i32) {
        let _ = self.exited.send(());
        if let Ok(Some(writer)) = self.task.await {
            complete(writer, code);
        }
    }
}

/// Marks the generation's output complete.
pub fn complete(writer: Writer, code: i32) {
    if let Err(e) = writer.finish(Some(code)) {
        warn(&e);
    }
}

/// Keeps why the command never ran as its output: what a user reading the logs needs to see.
pub fn never_ran(mut writer: Writer, cause: &str, code: i32) {
    match writer.append(Stream::Stderr, format!("{cause}\n").as_bytes()) {
        Ok(()) => complete(writer, code),
        Err(e) => warn(&e),
    }
}
