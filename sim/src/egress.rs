//! Egress under the simulator (`--egress`): each run's workload keeps asking for connections
//! to its providers' endpoints through berth-supervisor's own proxy code ([`egress::serve`]),
//! which takes them to the gateway's real egress proxy over simulated TCP, while the clients
//! attach and detach those providers and start and stop the sandboxes. The upstream a gateway
//! connects to is this world's: it learns from the first bytes which run came through, and
//! G1 judges every connection it gets and every refusal the run hears against the store's
//! committed history of the sandbox.
//!
//! Provider `P`'s endpoints are a name, a suffix and a CIDR block ([`endpoints`]), and a run
//! asks for destinations drawn to sit on each rule's edges ([`destination`]): the name in
//! another case, a name that shares the suffix's text without its dot, a trailing dot, a name
//! below the suffix that resolves to loopback, a name outside every rule that resolves into the
//! block, and the addresses either side of each end of the block. G1 reads the rules itself.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::SandboxId;
use berth_gateway::egress::{Connection, Resolved, Upstream};
use berth_supervisor::egress;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::invariants::Fact;
use crate::invariants::g1_egress::Request;
use crate::scenario::{Draw, Stream};
use crate::trace::Kind;
use crate::world::World;

/// How far two hosts' clocks may disagree (a tick each way): the windows G1 judges are widened
/// by this, so it never blames the proxy for a clock.
const SKEW_US: u64 = 2 * crate::run::TICK.as_micros() as u64;
const PORT: u16 = 443;

/// A stable number for a provider's name, for its block.
fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The first address of `provider`'s block, a /30 in 10.0.0.0/8 at a 4-aligned offset.
fn block(provider: &str) -> Ipv4Addr {
    let h = hash(provider);
    Ipv4Addr::new(10, (h >> 8) as u8, (h >> 16) as u8, 4 * (1 + (h % 60) as u8))
}

/// The rules of `provider`'s endpoints, as its create asks for them.
pub fn endpoints(provider: &str) -> Vec<String> {
    vec![format!("{provider}.test"), format!("*.{provider}.test"), format!("{}/30", block(provider))]
}

/// The world's name table: `lo.` names resolve to loopback (an allowed name must not take a
/// run into the proxy's own host), `in-P.test` into P's block, and every other name under
/// `.test` to an address of its own outside 10.0.0.0/8.
pub fn resolve(name: &str) -> Option<Ipv4Addr> {
    let name = name.strip_suffix(".test")?;
    if name.starts_with("lo.") {
        return Some(Ipv4Addr::LOCALHOST);
    }
    if let Some(provider) = name.strip_prefix("in-") {
        let [a, b, c, d] = block(provider).octets();
        return Some(Ipv4Addr::new(a, b, c, d + 1));
    }
    let h = hash(name);
    Some(Ipv4Addr::new(192, 0, 2, 1 + (h % 254) as u8))
}

/// A destination for one request of a run that has `provider` to ask for: on an edge of one
/// of its rules, allowed or not.
fn destination(draw: &mut Draw, provider: &str) -> String {
    let [a, b, c, d] = block(provider).octets();
    let edge = |offset: i16| Ipv4Addr::new(a, b, c, (i16::from(d) + offset) as u8).to_string();
    match draw.below(11) {
        0 => format!("{provider}.test"),
        1 => format!("{provider}.test").to_uppercase(),
        2 => format!("api.{provider}.test"),
        3 => format!("x{provider}.test"),
        4 => format!("{provider}.test."),
        5 => format!("lo.{provider}.test"),
        6 => format!("in-{provider}.test"),
        7 => edge(-1),
        8 => edge(0),
        9 => edge(3),
        _ => edge(4),
    }
}

/// What the workload writes first through an opened connection: who it is, what it asked for
/// and when.
fn hello(sandbox: &SandboxId, generation: u64, destination: &str, asked: u64) -> String {
    format!("{sandbox} {generation} {destination} {asked}\n")
}

/// The world's side of every egress connection: a name table and an upstream that checks G1
/// on each connection it gets.
pub struct SimUpstream {
    pub world: Arc<World>,
}

impl std::fmt::Debug for SimUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimUpstream")
    }
}

#[async_trait]
impl Upstream for SimUpstream {
    async fn resolve(&self, name: &str, _port: u16) -> io::Result<Resolved> {
        let addr =
            resolve(name).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such host {name}")))?;
        Ok(Resolved { addrs: vec![IpAddr::V4(addr)], pinned: false })
    }

    async fn connect(&self, addr: SocketAddr) -> io::Result<Box<dyn Connection>> {
        let (ours, theirs) = tokio::io::duplex(4096);
        tokio::spawn(serve_upstream(self.world.clone(), theirs, addr.ip()));
        Ok(Box::new(ours))
    }
}

async fn serve_upstream(world: Arc<World>, stream: tokio::io::DuplexStream, addr: IpAddr) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    if stream.read_line(&mut line).await.is_err() {
        return;
    }
    let answered = World::micros();
    let mut parts = line.split_whitespace();
    let (Some(sandbox), Some(Ok(generation)), Some(destination), Some(Ok(asked))) =
        (parts.next(), parts.next().map(str::parse), parts.next(), parts.next().map(str::parse))
    else {
        return;
    };
    let request = Request {
        sandbox,
        generation,
        destination,
        addr: Some(addr),
        asked: u64::saturating_sub(asked, SKEW_US),
        answered: answered + SKEW_US,
    };
    world.event("upstream", Kind::Egress, format!("{sandbox} generation {generation} reached {destination} at {addr}"));
    world.fact(&Fact::Egress { opened: true, request: &request });
    let _ = stream.get_mut().write_all(b"ok\n").await;
}

/// One request of a run's workload for `host`, through the supervisor's proxy code over a
/// channel to a gateway: a connection G1 judges at the upstream, or a refusal (403, or 400 for
/// what is not a host name) G1 judges here.
async fn ask(
    world: &World,
    channel: tonic::transport::Channel,
    token: &str,
    sandbox: &SandboxId,
    generation: u64,
    host: &str,
) {
    let (mut client, proxy) = tokio::io::duplex(4096);
    let token = token.to_string();
    tokio::spawn(async move {
        let _ = egress::serve(proxy, &token, channel).await;
    });
    let asked = World::micros();
    let connect = format!("CONNECT {host}:{PORT} HTTP/1.1\r\nHost: {host}:{PORT}\r\n\r\n");
    if client.write_all(connect.as_bytes()).await.is_err() {
        return;
    }
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    if head.starts_with(b"HTTP/1.1 200") {
        let _ = client.write_all(hello(sandbox, generation, host, asked).as_bytes()).await;
        let mut reply = Vec::new();
        let _ = client.read_to_end(&mut reply).await;
    } else if head.starts_with(b"HTTP/1.1 403") || head.starts_with(b"HTTP/1.1 400") {
        world.event("supervisor", Kind::EgressRefused, format!("{sandbox} generation {generation}: {host}"));
        let request = Request {
            sandbox: sandbox.as_str(),
            generation,
            destination: host,
            addr: host.parse().ok().or_else(|| resolve(&host.to_ascii_lowercase()).map(IpAddr::V4)),
            asked: asked.saturating_sub(SKEW_US),
            answered: World::micros() + SKEW_US,
        };
        world.fact(&Fact::Egress { opened: false, request: &request });
    }
}

/// A run's workload, for as long as its supervisor lives: a request every so often for a
/// destination on the edge of a provider's rules, drawn from the seed and the run.
pub async fn workload<C, F>(world: Arc<World>, token: String, sandbox: SandboxId, generation: u64, connect: C)
where
    C: Fn(usize) -> F,
    F: std::future::Future<Output = Result<berth_supervisor::session::Gateway, String>>,
{
    let run = sandbox.as_str().bytes().fold(generation, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut draw = Draw::new(world.scenario.seed, Stream::Egress(run));
    let providers: Vec<String> = (0..world.scenario.providers).map(crate::client::provider_name).collect();
    for attempt in 0.. {
        tokio::time::sleep(draw.millis(100, 1_500)).await;
        let provider = &providers[draw.below(providers.len() as u64) as usize];
        let host = destination(&mut draw, provider);
        let Ok(gateway) = connect(attempt).await else { continue };
        let within = Duration::from_secs(5);
        let _ = tokio::time::timeout(within, ask(&world, gateway.channel, &token, &sandbox, generation, &host)).await;
    }
}
