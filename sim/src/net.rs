//! tonic over turmoil's simulated TCP: the server's accept stream, the clients' connector, and
//! the fixed `date` header that keeps the bytes of a seeded run identical.

use std::io;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint, Uri};

pub const GATEWAY_PORT: u16 = 7420;
/// Where a gateway's preview proxy listens (the port workload's).
pub const PROXY_PORT: u16 = 7422;
pub const API_TOKEN: &str = "simulated-api-token";

/// Gateway `i`'s host, which is also its name in the reconcile lease.
pub fn gateway_host(i: usize) -> String {
    format!("gateway{i}")
}

/// turmoil's TCP stream, as tonic's server wants it.
pub struct SimConn(turmoil::net::TcpStream);

impl Connected for SimConn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo { local_addr: self.0.local_addr().ok(), remote_addr: self.0.peer_addr().ok() }
    }
}

impl AsyncRead for SimConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// The gateway's accepted connections.
pub async fn incoming(port: u16) -> io::Result<impl futures_util::Stream<Item = io::Result<SimConn>>> {
    let listener = turmoil::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).await?;
    Ok(futures_util::stream::unfold(listener, |listener| async move {
        let next = listener.accept().await.map(|(stream, _)| SimConn(stream));
        Some((next, listener))
    }))
}

/// hyper stamps responses with the wall clock; a fixed `date` keeps a seeded run's bytes identical.
pub fn fixed_date(mut response: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    response.headers_mut().insert(http::header::DATE, http::HeaderValue::from_static("Tue, 14 Nov 2023 22:13:20 GMT"));
    response
}

/// A channel to gateway `i` that connects on first use and reconnects by itself when its
/// connection fails. It has no HTTP/2 keepalive: hyper times its pings by the host's real clock,
/// which would make a run depend on how busy the machine is. A connection a partition or a
/// crash left silent is noticed by the callers' own timeouts instead (clients open a new channel
/// after a call times out; supervisors after their heartbeats go unanswered).
pub fn channel(i: usize) -> Channel {
    let connector = tower::service_fn(move |_: Uri| async move {
        let stream = turmoil::net::TcpStream::connect((gateway_host(i).as_str(), GATEWAY_PORT)).await?;
        Ok::<_, io::Error>(TokioIo::new(stream))
    });
    Endpoint::from_shared(format!("http://{}:{GATEWAY_PORT}", gateway_host(i)))
        .expect("a valid URI")
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector_lazy(connector)
}

/// New connections to gateway `i`'s API port, as a supervisor opens them beside its channel for
/// each connection into its run.
pub fn wire(i: usize) -> berth_supervisor::ports::Wire {
    std::sync::Arc::new(move || {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((gateway_host(i).as_str(), GATEWAY_PORT)).await?;
            Ok(Box::new(stream) as Box<dyn berth_supervisor::ports::Connection>)
        })
    })
}
