//! Berth's egress proxy, the gateway's half (DESIGN 10). A sandbox has no network of its own:
//! its supervisor takes the run's proxy requests on the sandbox's loopback and brings each
//! connection here as a `Supervisor.Egress` stream. Here, outside the sandbox, the connection
//! is authenticated by the run's token, decided by the run's policy ([`berth_core::egress`])
//! on the name asked for and the addresses it resolves to, and only then opened, to an address
//! the decision allowed. A run that bypasses its supervisor and talks to the socket itself gets
//! no more than its own identity's policy.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::egress::{self, host_name};
use berth_core::identity::verify_token;
use berth_proto::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::Status;
use tracing::{info, warn};

use crate::engine::Engine;
use crate::error::ApiError;

/// How long resolving a name and connecting to it may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Connection for T {}

/// What a name resolved to, and whether the operator pinned it (`--egress-resolve`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub addrs: Vec<IpAddr>,
    pub pinned: bool,
}

/// Where egress connections go: this host's resolver and sockets, or the simulator's world.
#[async_trait]
pub trait Upstream: Send + Sync + fmt::Debug {
    /// The addresses of a host name.
    async fn resolve(&self, name: &str, port: u16) -> std::io::Result<Resolved>;
    async fn connect(&self, addr: SocketAddr) -> std::io::Result<Box<dyn Connection>>;
}

/// This host's resolver and TCP, with names pinned to addresses first (`--egress-resolve`, as
/// curl's `--resolve`): for tests and for names a private resolver does not know.
#[derive(Debug, Default)]
pub struct HostUpstream {
    pub pins: BTreeMap<String, Vec<IpAddr>>,
}

#[async_trait]
impl Upstream for HostUpstream {
    async fn resolve(&self, name: &str, port: u16) -> std::io::Result<Resolved> {
        if let Some(addrs) = self.pins.get(name) {
            return Ok(Resolved { addrs: addrs.clone(), pinned: true });
        }
        let addrs = tokio::net::lookup_host((name, port)).await?.map(|a| a.ip()).collect();
        Ok(Resolved { addrs, pinned: false })
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<Box<dyn Connection>> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Box::new(stream))
    }
}

/// A `--egress-resolve` pin: `NAME=ADDRESS[,ADDRESS...]`.
pub fn pin(text: &str) -> Result<(String, Vec<IpAddr>), String> {
    let (name, addrs) = text.split_once('=').ok_or("expected NAME=ADDRESS")?;
    let name = host_name(name).map_err(|why| format!("'{name}' is not a host name: {why}"))?;
    let addrs = addrs
        .split(',')
        .map(|a| a.trim().parse::<IpAddr>().map_err(|_| format!("'{a}' is not an IP address")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name, addrs))
}

/// What a connection asked for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// Lowercased.
    Name(String),
    Addr(IpAddr),
}

fn target(host: &str) -> Result<Target, Status> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(addr) = bare.parse::<IpAddr>() {
        return Ok(Target::Addr(addr));
    }
    host_name(host)
        .map(Target::Name)
        .map_err(|why| Status::invalid_argument(format!("host: '{host}' is neither a host name nor an address: {why}")))
}

/// What the supervisor API's egress streams open: a run's connections out, as its policy allows.
#[derive(Clone)]
pub struct Egress {
    engine: Engine,
}

impl Egress {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// Opens `open`'s connection if the run's policy allows it, to an address it allows.
    pub async fn open(&self, open: &pb::EgressOpen) -> Result<(Box<dyn Connection>, SocketAddr), Status> {
        let identity = verify_token(self.engine.key(), &open.runtime_token).map_err(ApiError::from)?;
        let port = u16::try_from(open.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| Status::invalid_argument(format!("port: {} is not a TCP port", open.port)))?;
        let target = target(&open.host)?;
        let record = self.engine.store().sandbox(&identity.sandbox).await.map_err(ApiError::from)?;
        berth_core::observation::authenticate(record.as_ref(), &identity.sandbox, identity.generation)
            .map_err(ApiError::from)?;
        let Some(sandbox) = record else { return Err(Status::not_found("the sandbox is gone")) };
        let mut providers = BTreeMap::new();
        for provider in sandbox.egress_providers.intersection(&sandbox.providers) {
            if let Some(record) = self.engine.store().provider(provider).await.map_err(ApiError::from)? {
                providers.insert(provider.clone(), record);
            }
        }
        let policy = egress::run_policy(&sandbox, &providers);
        let upstream = &self.engine.settings().egress;
        let (name, resolved) = match &target {
            Target::Addr(addr) => (None, Resolved { addrs: vec![*addr], pinned: false }),
            // Nothing could allow it: no name is looked up for a refusal.
            Target::Name(name) if policy.is_none() => (Some(name.as_str()), Resolved { addrs: vec![], pinned: false }),
            Target::Name(name) => {
                let resolved = tokio::time::timeout(CONNECT_WITHIN, upstream.resolve(name, port))
                    .await
                    .map_err(|_| Status::unavailable(format!("resolving {name} took over 10 s")))?
                    .map_err(|e| Status::unavailable(format!("resolving {name}: {e}")))?;
                (Some(name.as_str()), resolved)
            }
        };
        let reachable = policy.reachable(name, &resolved.addrs, resolved.pinned);
        self.engine.metrics().egress(!reachable.is_empty());
        if reachable.is_empty() {
            warn!(sandbox = %sandbox.name, host = %open.host, port, "egress denied");
            return Err(Status::permission_denied(format!(
                "egress to {}:{port} is not allowed by sandbox '{}''s policy",
                open.host, sandbox.name
            )));
        }
        let mut last = None;
        for addr in reachable {
            let addr = SocketAddr::new(addr, port);
            match tokio::time::timeout(CONNECT_WITHIN, upstream.connect(addr)).await {
                Ok(Ok(connection)) => {
                    info!(sandbox = %sandbox.name, host = %open.host, %addr, "egress connected");
                    return Ok((connection, addr));
                }
                Ok(Err(e)) => last = Some(e.to_string()),
                Err(_) => last = Some("no answer within 10 s".to_string()),
            }
        }
        Err(Status::unavailable(format!("connecting to {}:{port}: {}", open.host, last.unwrap_or_default())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_names_a_host_and_its_addresses() {
        let (name, addrs) = pin("One.Test=127.0.0.2,::1").unwrap();
        assert_eq!(name, "one.test");
        assert_eq!(addrs, ["127.0.0.2".parse::<IpAddr>().unwrap(), "::1".parse().unwrap()]);
        assert!(pin("one.test").is_err());
        assert!(pin("one..test=127.0.0.2").is_err());
        assert!(pin("one.test=localhost").is_err());
    }

    #[test]
    fn a_target_is_a_name_or_an_address() {
        assert_eq!(target("API.example.com").unwrap(), Target::Name("api.example.com".into()));
        assert_eq!(target("127.0.0.2").unwrap(), Target::Addr("127.0.0.2".parse().unwrap()));
        assert_eq!(target("[::1]").unwrap(), Target::Addr("::1".parse().unwrap()));
        let refused = target("a b").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().starts_with("host:"), "{}", refused.message());
    }
}
