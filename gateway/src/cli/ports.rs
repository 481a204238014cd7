//! `berth sandbox port-forward`: a local TCP port whose every connection is carried to a port
//! of the sandbox's current run over a `PortForward` stream of the gateway's API, as `kubectl
//! port-forward` does for a pod.

use std::net::{IpAddr, SocketAddr};

use berth_proto::carry::carry;
use berth_proto::v1 as pb;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::client::{Client, Failed};

/// `[LOCAL:]PORT`: the local port (0: any free one) and the sandbox's.
pub(super) fn forward_ports(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?} is not [LOCAL:]PORT");
    let port = |p: &str| p.parse::<u16>().map_err(|_| bad());
    let (local, remote) = match s.split_once(':') {
        Some((local, remote)) => (port(local)?, port(remote)?),
        None => (port(s)?, port(s)?),
    };
    if remote == 0 {
        return Err(bad());
    }
    Ok((local, remote))
}

impl Client {
    /// Forwards connections to `address:local` to `port` of sandbox `name` until Ctrl-C.
    pub(super) async fn port_forward(
        &mut self,
        name: String,
        (local, port): (u16, u16),
        address: IpAddr,
    ) -> Result<(), Failed> {
        // A sandbox that is not there is said at once, not at the first connection.
        self.sandboxes.get_sandbox(pb::GetSandboxRequest { name: name.clone() }).await?;
        let listener = TcpListener::bind(SocketAddr::new(address, local))
            .await
            .map_err(|e| Failed(format!("listening on {address}:{local}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| Failed(e.to_string()))?;
        say!("Forwarding from {bound} -> {name}:{port}");
        loop {
            let (connection, from) = tokio::select! {
                accepted = listener.accept() => accepted.map_err(|e| Failed(format!("accepting on {bound}: {e}")))?,
                _ = tokio::signal::ctrl_c() => return Ok(()),
            };
            let _ = connection.set_nodelay(true);
            let mut sandboxes = self.sandboxes.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let start = pb::PortForwardStart { name: name.clone(), port: port.into(), here_only: false };
                let _ =
                    tx.send(pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Start(start)) }).await;
                match sandboxes.port_forward(ReceiverStream::new(rx)).await {
                    Ok(reply) => {
                        let up = |data| pb::PortForwardInput { input: Some(pb::port_forward_input::Input::Data(data)) };
                        let down = reply.into_inner().map_while(|m| m.ok().map(|m| m.data));
                        carry(connection, tx, up, down).await;
                    }
                    // The connection closes; the next may find the run there.
                    Err(status) => eprintln!("berth: a connection from {from}: {}", status.message()),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_local_and_remote_or_one_for_both() {
        assert_eq!(forward_ports("8080"), Ok((8080, 8080)));
        assert_eq!(forward_ports("0:5432"), Ok((0, 5432)));
        assert_eq!(forward_ports("15432:5432"), Ok((15432, 5432)));
        for bad in ["", "x", "1:0", "0", "70000", "1:2:3"] {
            assert!(forward_ports(bad).is_err(), "{bad}");
        }
    }
}
