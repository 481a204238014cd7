//! The gateway's TCP connections, made so that no reply and no request waits for a delayed
//! ACK.
//!
//! Two timers meet on a request-reply connection: Nagle's algorithm holds a small segment while
//! an earlier one is unacknowledged, and the peer's kernel delays its ACK, about 40 ms, hoping
//! to piggyback it on a reply. HTTP/2 writes a message in more than one segment (headers, then
//! data and trailers), so either side's Nagle meets the other side's delayed ACK:
//!
//! - the server's own replies: Nagle's algorithm is off on every accepted connection
//!   (`TCP_NODELAY`), so a reply never waits for the client's ACK;
//! - a client that leaves Nagle's algorithm on (many HTTP/2 stacks do) writes a request's data
//!   after its headers and waits for the server's ACK of the headers: the server acknowledges
//!   at once whatever it has read (`TCP_QUICKACK`, set again after every read, since the kernel
//!   leaves quick-ACK mode by itself).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// One accepted connection; see the module's documentation.
pub struct Connection(TcpStream);

impl Connection {
    fn acknowledge_at_once(&self) {
        // Only a slower reply is at stake: a socket that refuses the option is served as it is.
        let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
    }
}

/// The connections `listener` accepts, each set up as the module's documentation says.
pub fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<Connection>> + Send + 'static {
    TcpIncoming::from(listener).with_nodelay(Some(true)).map(|accepted| {
        let connection = Connection(accepted?);
        connection.acknowledge_at_once();
        Ok(connection)
    })
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.connect_info()
    }
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.acknowledge_at_once();
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_neither_hold_segments_nor_delay_acks() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut incoming = Box::pin(incoming(listener));
        for _ in 0..2 {
            let mut client = TcpStream::connect(address).await.unwrap();
            let mut accepted = incoming.next().await.unwrap().unwrap();
            assert!(accepted.0.nodelay().unwrap());
            // The kernel leaves quick-ACK mode as it pleases (as here); a read puts it back.
            socket2::SockRef::from(&accepted.0).set_tcp_quickack(false).unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut client, b"x").await.unwrap();
            let mut byte = [0u8; 1];
            tokio::io::AsyncReadExt::read_exact(&mut accepted, &mut byte).await.unwrap();
            assert!(socket2::SockRef::from(&accepted.0).tcp_quickack().unwrap());
        }
    }
}
