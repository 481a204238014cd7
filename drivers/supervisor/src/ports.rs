//! The sandbox's side of reaching in (DESIGN 13.1): the gateway's preview proxy and
//! port-forwards ask the run's session to open a port (`OpenPort`), and the supervisor,
//! inside the sandbox, connects to it on the run's loopback and carries the connection's bytes
//! over a connection of its own to the gateway, opened with the run's token. A container has no
//! network but its loopback, so nothing but its supervisor can reach its ports; the process
//! driver's runs share the host's loopback.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::carry::CHUNK;
use berth_proto::ingress::write_open;
use berth_proto::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long connecting to a port may take: a closed port answers at once, and the proxy
/// answers 502 rather than hang on a run that does not.
pub const CONNECT_WITHIN: Duration = Duration::from_millis(800);

pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Connection for T {}

pub type Dialing = Pin<Box<dyn Future<Output = io::Result<Box<dyn Connection>>> + Send>>;

/// How the run's ports are reached: the run's loopback, or the simulator's world.
pub trait Dial: fmt::Debug + Send + Sync {
    fn dial(&self, port: u16) -> Dialing;
}

/// The run's own loopback, where its servers listen.
#[derive(Debug)]
pub struct Loopback;

impl Dial for Loopback {
    fn dial(&self, port: u16) -> Dialing {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as Box<dyn Connection>)
        })
    }
}

/// A new connection to the gateway a session is connected to, at the endpoint its channel dials
/// (its socket, or its address): one for each connection into the run.
pub type Wire = Arc<dyn Fn() -> Dialing + Send + Sync>;

/// Opens `port` for the gateway's tunnel `tunnel`: a connection through `wire`, opened with the
/// run's token ([`berth_proto::ingress`]), then carries the bytes both ways until both sides
/// are done (each side's end of file shuts the other's writing). A port that cannot be reached
/// is said in the opening instead. Returns how it ended, for the supervisor's log.
pub async fn open(wire: &Wire, token: String, tunnel: u64, port: u32, dial: Arc<dyn Dial>) -> Result<(), String> {
    let dialed = match u16::try_from(port) {
        Ok(port) if port != 0 => match tokio::time::timeout(CONNECT_WITHIN, dial.dial(port)).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(format!("nothing answers on port {port}: {e}")),
            Err(_) => Err(format!("port {port} did not answer within {CONNECT_WITHIN:?}")),
        },
        _ => Err(format!("{port} is not a TCP port")),
    };
    let refused = dialed.as_ref().err().cloned().unwrap_or_default();
    let open = pb::IngressOpen { runtime_token: token, tunnel, refused };
    let unreached = |e: io::Error| format!("port {port}: no connection to the gateway: {e}");
    let mut gateway = wire().await.map_err(unreached)?;
    write_open(&mut gateway, &open).await.map_err(unreached)?;
    // A refusal is the whole connection: it ends here.
    let mut connection = dialed?;
    match tokio::io::copy_bidirectional_with_sizes(&mut connection, &mut gateway, CHUNK, CHUNK).await {
        // Either side may drop its connection rather than close it (a proxy client gone, a
        // server done): that is how such connections end, not something to log.
        Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) => Ok(()),
        Err(e) => Err(format!("port {port}: {e}")),
        Ok(_) => Ok(()),
    }
}
