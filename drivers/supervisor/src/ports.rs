//! The sandbox's side of reaching in (DESIGN 13.1): the gateway's preview proxy and
//! port-forwards ask the run's session to open a port (`OpenPort`), and the supervisor,
//! inside the sandbox, connects to it on the run's loopback and carries the connection's bytes
//! over an `Ingress` stream of its own, opened with the run's token. A container has no
//! network but its loopback, so nothing but its supervisor can reach its ports; the process
//! driver's runs share the host's loopback.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1 as pb;
use berth_proto::v1::supervisor_client::SupervisorClient;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use berth_proto::carry::carry;

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

/// Opens `port` for the gateway's tunnel `tunnel`, through `gateway`, and carries it until
/// both sides are done. Returns how it ended, for the supervisor's log.
pub async fn open(gateway: Channel, token: String, tunnel: u64, port: u32, dial: Arc<dyn Dial>) -> Result<(), String> {
    let dialed = match u16::try_from(port) {
        Ok(port) if port != 0 => match tokio::time::timeout(CONNECT_WITHIN, dial.dial(port)).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(format!("nothing answers on port {port}: {e}")),
            Err(_) => Err(format!("port {port} did not answer within {CONNECT_WITHIN:?}")),
        },
        _ => Err(format!("{port} is not a TCP port")),
    };
    let (tx, rx) = mpsc::channel(8);
    let refused = dialed.as_ref().err().cloned().unwrap_or_default();
    let open = pb::IngressOpen { runtime_token: token, tunnel, refused };
    let _ = tx.send(pb::IngressUp { message: Some(pb::ingress_up::Message::Open(open)) }).await;
    let connection = match dialed {
        Ok(connection) => connection,
        Err(refused) => {
            // The refusal is the whole stream: it ends with the sender.
            drop(tx);
            let _ = SupervisorClient::new(gateway).ingress(ReceiverStream::new(rx)).await;
            return Err(refused);
        }
    };
    let down = SupervisorClient::new(gateway)
        .ingress(ReceiverStream::new(rx))
        .await
        .map_err(|status| format!("port {port}: the gateway refused the tunnel: {}", status.message()))?
        .into_inner();
    let up = |data| pb::IngressUp { message: Some(pb::ingress_up::Message::Data(data)) };
    carry(connection, tx, up, down.map_while(|m| m.ok().map(|m| m.data))).await;
    Ok(())
}
