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
//!
//! A listener given a [`TlsAcceptor`] (`--tls-cert`) takes TLS alone: its handshakes run side by
//! side, each within [`HANDSHAKE_WITHIN`], so that a client that connects and says nothing holds
//! up no other; a connection whose handshake fails is closed and never served.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
use tracing::debug;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How many handshakes a listener runs at once.
const HANDSHAKES: usize = 64;

/// One accepted TCP connection; see the module's documentation.
pub struct Socket(TcpStream);

impl Socket {
    fn acknowledge_at_once(&self) {
        // Only a slower reply is at stake: a socket that refuses the option is served as it is.
        let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
    }
}

/// An accepted connection, as its server reads it: the socket's bytes, or what TLS carries
/// over them.
pub struct Connection(Either<Socket, Box<TlsStream<Socket>>>);

impl Connection {
    fn socket(&self) -> &Socket {
        match &self.0 {
            Either::Left(socket) => socket,
            Either::Right(tls) => tls.get_ref().0,
        }
    }
}

/// The connections `listener` accepts, each set up as the module's documentation says.
pub fn incoming(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
) -> impl Stream<Item = io::Result<Connection>> + Send + 'static {
    let accepted = TcpIncoming::from(listener).with_nodelay(Some(true)).map(|accepted| {
        let socket = Socket(accepted?);
        socket.acknowledge_at_once();
        Ok(socket)
    });
    match tls {
        None => accepted.map(|socket| socket.map(|s| Connection(Either::Left(s)))).left_stream(),
        Some(acceptor) => accepted
            .map(move |socket: io::Result<Socket>| {
                let acceptor = acceptor.clone();
                async move {
                    let socket = match socket {
                        Ok(socket) => socket,
                        Err(e) => return Some(Err(e)),
                    };
                    let peer = socket.0.peer_addr().ok();
                    match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(socket)).await {
                        Ok(Ok(tls)) => Some(Ok(Connection(Either::Right(Box::new(tls))))),
                        Ok(Err(e)) => {
                            debug!(?peer, error = %e, "a TLS handshake failed");
                            None
                        }
                        Err(_) => {
                            debug!(?peer, "a TLS handshake did not finish in time");
                            None
                        }
                    }
                }
            })
            .buffer_unordered(HANDSHAKES)
            .filter_map(std::future::ready)
            .right_stream(),
    }
}

/// A listener for axum's `serve` (the HTTP/JSON API, the metrics): [`incoming`]'s connections.
pub struct Listener {
    incoming: Pin<Box<dyn Stream<Item = io::Result<Connection>> + Send>>,
    local: SocketAddr,
}

impl Listener {
    pub fn new(listener: TcpListener, tls: Option<TlsAcceptor>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(Self { incoming: Box::pin(incoming(listener, tls)), local })
    }
}

impl axum::serve::Listener for Listener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(connection)) => {
                    if let Ok(peer) = connection.socket().0.peer_addr() {
                        return (connection, peer);
                    }
                }
                // Out of descriptors, say: wait for some to be given back rather than spin.
                Some(Err(e)) => {
                    debug!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // A TCP listener's stream never ends.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.socket().0.connect_info()
    }
}

/// `AsyncWrite` for a wrapper, passed through to what it wraps (its field `0`).
macro_rules! writes_through {
    ($wrapper:ty) => {
        impl AsyncWrite for $wrapper {
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
    };
}

impl AsyncRead for Socket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.acknowledge_at_once();
        }
        polled
    }
}

writes_through!(Socket);

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

writes_through!(Connection);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_neither_hold_segments_nor_delay_acks() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut incoming = Box::pin(incoming(listener, None));
        for _ in 0..2 {
            let mut client = TcpStream::connect(address).await.unwrap();
            let mut accepted = incoming.next().await.unwrap().unwrap();
            let socket = &accepted.socket().0;
            assert!(socket.nodelay().unwrap());
            // The kernel leaves quick-ACK mode as it pleases (as here); a read puts it back.
            socket2::SockRef::from(socket).set_tcp_quickack(false).unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut client, b"x").await.unwrap();
            let mut byte = [0u8; 1];
            tokio::io::AsyncReadExt::read_exact(&mut accepted, &mut byte).await.unwrap();
            assert!(socket2::SockRef::from(&accepted.socket().0).tcp_quickack().unwrap());
        }
    }
}
