//! Bytes between a connection and a gRPC stream, both ways: what a sandbox's connections out
//! through its supervisor (egress) and port-forwards (a client's, and a gateway's through the
//! gateway holding a run's session) have in common once they are open.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};

/// The most bytes one message carries.
pub const CHUNK: usize = 256 * 1024;
/// The HTTP/2 flow-control window each stream of Berth's own connections offers (a gateway's
/// server, a supervisor's and a gateway's channels): a bulk stream is not held to HTTP/2's
/// default 64 KiB in flight, a round trip per window.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// The same for a whole connection, which many streams share.
pub const CONNECTION_WINDOW: u32 = 16 << 20;
/// The largest HTTP/2 frame Berth's own connections take: a message of `CHUNK` bytes crosses
/// as one frame, not as sixteen of HTTP/2's default 16 KiB, each a wake-up on both sides.
pub const MAX_FRAME: u32 = 1 << 20;

/// A channel to a gateway that carries bulk streams (a supervisor's, a peer gateway's, the
/// CLI's) with the windows and frame size above.
pub fn wide(endpoint: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    endpoint
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
}

/// The next bytes `read` has, at most `CHUNK` of them; `None` at its end. Read straight into
/// the message's own buffer, not copied out of a reused one; a small read gives back the room
/// it did not use, as the message may wait in a channel.
pub async fn next_chunk(read: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let mut chunk = Vec::with_capacity(CHUNK);
    if read.read_buf(&mut chunk).await? == 0 {
        return Ok(None);
    }
    if chunk.len() < CHUNK / 4 {
        chunk.shrink_to_fit();
    }
    Ok(Some(chunk))
}

/// Sends what `connection` reads as messages `up` makes, and writes what `down` yields to it,
/// until both sides are done. The end of the connection's reading ends the stream up (the
/// sender is dropped: the far side's write half is shut); the end of the stream down shuts
/// the connection's write half.
pub async fn carry<C, U>(
    connection: C,
    tx: mpsc::Sender<U>,
    up: fn(Vec<u8>) -> U,
    down: impl Stream<Item = Vec<u8>> + Send,
) where
    C: AsyncRead + AsyncWrite + Send,
{
    let (mut read, mut write) = tokio::io::split(connection);
    let sending = async move {
        while let Ok(Some(chunk)) = next_chunk(&mut read).await {
            if tx.send(up(chunk)).await.is_err() {
                break;
            }
        }
    };
    let receiving = async move {
        let mut down = std::pin::pin!(down);
        while let Some(data) = down.next().await {
            if write.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    tokio::join!(sending, receiving);
}
