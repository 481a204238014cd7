//! Connections into runs, the gateway's end (DESIGN 13.1). A run's supervisor answers an
//! `OpenPort` of its session with a connection to the endpoint its session came through
//! ([`berth_proto::ingress`]). Each endpoint sorts the connections it accepts by their first
//! bytes: gRPC goes on to the API; an ingress connection is authenticated by the run's token
//! and handed, as it is, to the request of that run's session that waits for it, so a
//! download's bytes cross this process once, unframed.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use berth_core::identity::verify_token;
use berth_proto::ingress::{PREAMBLE, read_open};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;
use tracing::debug;

use crate::egress::Connection;
use crate::engine::Engine;

/// How long a new connection has to say what it is: a gRPC client's preface and a supervisor's
/// opening are sent at once.
const SORTED_WITHIN: Duration = Duration::from_secs(10);

/// The gRPC connections of `incoming`, for the API's server; the ingress connections among them
/// go to the sessions of `engine` that wait for them. Each is sorted in a task of its own, so a
/// connection that says nothing holds up no other. Ends with `incoming`, or once the server
/// stops taking connections.
pub fn sort<C>(
    engine: Engine,
    incoming: impl Stream<Item = io::Result<C>> + Send + 'static,
) -> impl Stream<Item = io::Result<Prefixed<C>>> + Send + 'static
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        loop {
            // Biased: the simulator runs this, and an unbiased select draws its order from
            // tokio's own randomness.
            let next = tokio::select! {
                biased;
                () = tx.closed() => return,
                next = incoming.next() => next,
            };
            match next {
                None => return,
                Some(Err(e)) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(connection)) => {
                    tokio::spawn(sort_one(engine.clone(), connection, tx.clone()));
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

async fn sort_one<C>(engine: Engine, mut connection: C, grpc: mpsc::Sender<io::Result<Prefixed<C>>>)
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut first = vec![0; PREAMBLE.len()];
    let read = async {
        // One byte tells them apart (an HTTP/2 client's begin with `P`); the preamble's rest is
        // read only from a connection that begins as it does.
        connection.read_exact(&mut first[..1]).await?;
        if first[0] != PREAMBLE[0] {
            first.truncate(1);
            return Ok(false);
        }
        connection.read_exact(&mut first[1..]).await?;
        Ok::<_, io::Error>(first == PREAMBLE)
    };
    match tokio::time::timeout(SORTED_WITHIN, read).await {
        Ok(Ok(false)) => {
            let _ = grpc.send(Ok(Prefixed { prefix: first, read: 0, connection })).await;
        }
        Ok(Ok(true)) => take(&engine, connection).await,
        Ok(Err(e)) => debug!(error = %e, "a connection ended before it said what it is"),
        Err(_) => debug!("a connection said nothing within {SORTED_WITHIN:?}"),
    }
}

/// Hands an ingress connection to the request waiting for it, or drops it: a run answers only
/// its own session's tunnels.
async fn take<C>(engine: &Engine, mut connection: C)
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let open = match tokio::time::timeout(SORTED_WITHIN, read_open(&mut connection)).await {
        Ok(Ok(open)) => open,
        Ok(Err(e)) => return debug!(error = %e, "an ingress connection's opening is unreadable"),
        Err(_) => return debug!("an ingress connection did not open within {SORTED_WITHIN:?}"),
    };
    let identity = match verify_token(engine.key(), &open.runtime_token) {
        Ok(identity) => identity,
        Err(e) => return debug!(error = %e, "an ingress connection's token is refused"),
    };
    let Some(waiter) =
        engine.sessions().get(&identity.sandbox, identity.generation).and_then(|s| s.take_tunnel(open.tunnel))
    else {
        return debug!(sandbox = %identity.sandbox, tunnel = open.tunnel, "no request waits for this connection");
    };
    let answer =
        if open.refused.is_empty() { Ok(Box::new(connection) as Box<dyn Connection>) } else { Err(open.refused) };
    // The request may have given up meanwhile: the connection then closes.
    let _ = waiter.send(answer);
}

/// A connection whose first bytes were read to sort it, given back first to its reader.
pub struct Prefixed<C> {
    prefix: Vec<u8>,
    read: usize,
    connection: C,
}

impl<C: Connected> Connected for Prefixed<C> {
    type ConnectInfo = C::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.connection.connect_info()
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for Prefixed<C> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.read);
            buf.put_slice(&this.prefix[this.read..this.read + n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.connection).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Prefixed<C> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().connection).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().connection).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.connection.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use berth_core::SandboxId;
    use berth_core::identity::{IdentityKey, RuntimeIdentity, derive_token};
    use berth_proto::ingress::write_open;
    use berth_proto::v1::IngressOpen;
    use tokio::io::{AsyncWriteExt, DuplexStream};

    use super::*;
    use crate::engine::EngineSettings;
    use crate::engine::tests::NoRuntime;
    use crate::sessions::PortError;
    use crate::store::memory::MemoryStore;

    fn token(engine: &Engine, sandbox: &str, generation: u64) -> String {
        let identity = RuntimeIdentity { sandbox: SandboxId::new(sandbox), generation };
        derive_token(engine.key(), &identity).expose().to_string()
    }

    /// A supervisor's connection opening tunnel `tunnel` with `token`, accepted by the endpoint.
    async fn ingress(
        accept: &mpsc::Sender<io::Result<DuplexStream>>,
        token: String,
        tunnel: u64,
        refused: &str,
    ) -> DuplexStream {
        let (mut ours, theirs) = tokio::io::duplex(1 << 16);
        accept.send(Ok(theirs)).await.unwrap();
        let open = IngressOpen { runtime_token: token, tunnel, refused: refused.to_string() };
        write_open(&mut ours, &open).await.unwrap();
        ours
    }

    /// Whether the endpoint dropped `connection` (it reads its end).
    async fn dropped(connection: &mut DuplexStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(connection.read(&mut byte).await, Ok(0) | Err(_))
    }

    /// An engine's endpoint, fed by `accept` (its gRPC connections come out of `grpc`), where
    /// sandbox sb-a's run 2 holds a session that asks for port 8080 (`asking`).
    struct Endpoint {
        engine: Engine,
        accept: mpsc::Sender<io::Result<DuplexStream>>,
        grpc: Pin<Box<dyn Stream<Item = io::Result<Prefixed<DuplexStream>>> + Send>>,
        asking: tokio::task::JoinHandle<Result<Box<dyn Connection>, PortError>>,
        /// What the session sends its supervisor, kept so that it can send.
        _told: mpsc::Receiver<Result<berth_proto::v1::GatewayMessage, tonic::Status>>,
    }

    async fn endpoint() -> Endpoint {
        let key = IdentityKey::from_bytes([3; 32]);
        let engine = Engine::new(Arc::new(MemoryStore::new()), Arc::new(NoRuntime), key, EngineSettings::default(), 1);
        let (accept, incoming) = mpsc::channel(8);
        let grpc = Box::pin(sort(engine.clone(), ReceiverStream::new(incoming)));
        let (tx, _told) = mpsc::channel(8);
        let session = engine.sessions().open(SandboxId::new("sb-a"), 2, tx);
        let asking = tokio::spawn(async move { session.open_port(8080).await });
        tokio::task::yield_now().await;
        Endpoint { engine, accept, grpc, asking, _told }
    }

    #[tokio::test]
    async fn a_run_answers_only_the_tunnels_its_own_session_asked_for() {
        let Endpoint { engine, accept, grpc: _grpc, asking, _told } = endpoint().await;
        // Another generation's run, another sandbox's, a forged token, a tunnel nobody asked
        // for: each dropped, the request still waiting.
        for (token, tunnel) in [
            (token(&engine, "sb-a", 1), 0),
            (token(&engine, "sb-b", 2), 0),
            ("not-a-token".to_string(), 0),
            (token(&engine, "sb-a", 2), 7),
        ] {
            let mut connection = ingress(&accept, token, tunnel, "").await;
            assert!(dropped(&mut connection).await);
        }
        assert!(!asking.is_finished());
        // The run's own answer is the request's connection, both ways.
        let mut run = ingress(&accept, token(&engine, "sb-a", 2), 0, "").await;
        let mut connection = asking.await.unwrap().unwrap();
        run.write_all(b"from the run").await.unwrap();
        let mut got = [0u8; 12];
        connection.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"from the run");
        connection.write_all(b"to").await.unwrap();
        let mut got = [0u8; 2];
        run.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"to");
        // Answered once: the same tunnel again is dropped.
        let mut again = ingress(&accept, token(&engine, "sb-a", 2), 0, "").await;
        assert!(dropped(&mut again).await);
    }

    #[tokio::test]
    async fn a_refusal_is_the_requests_answer_and_grpc_passes_on_whole() {
        let Endpoint { engine, accept, mut grpc, asking, _told } = endpoint().await;
        let _run = ingress(&accept, token(&engine, "sb-a", 2), 0, "nothing answers on port 8080").await;
        match asking.await.unwrap() {
            Err(PortError::Refused(why)) => assert_eq!(why, "nothing answers on port 8080"),
            other => panic!("expected the run's refusal, got {:?}", other.map(|_| ())),
        }
        // An HTTP/2 client's connection reaches the server with its first bytes intact, and so
        // does one that begins as an ingress connection but is not one.
        for first in [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], b"BERTH-INGRESS/2\nmore"] {
            let (mut client, server) = tokio::io::duplex(1024);
            accept.send(Ok(server)).await.unwrap();
            client.write_all(first).await.unwrap();
            drop(client);
            let mut passed = grpc.next().await.unwrap().unwrap();
            let mut all = Vec::new();
            passed.read_to_end(&mut all).await.unwrap();
            assert_eq!(all, first);
        }
    }
}
