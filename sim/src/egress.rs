//! Egress under the simulator (`--egress`): each run's workload keeps asking for connections
//! to its providers' endpoints through berth-supervisor's own proxy code ([`egress::serve`]),
//! which takes them to the gateway's real egress proxy over simulated TCP, while the clients
//! attach and detach those providers and start and stop the sandboxes. The upstream a gateway
//! connects to is this world's: it learns from the first bytes which run came through, and
//! N1 judges every connection it gets and every refusal the run hears against the store's
//! committed history of the sandbox.
//!
//! Provider `pK` names the endpoint `pK.test`, which resolves to 10.0.0.(K+1).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::{Intent, Sandbox, SandboxId};
use berth_gateway::egress::{Connection, Resolved, Upstream};
use berth_supervisor::egress;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::invariants::Invariant;
use crate::invariants::n1_egress::{self, Request, Version};
use crate::scenario::{Draw, Stream};
use crate::trace::Kind;
use crate::world::{World, lock};

/// How far two hosts' clocks may disagree (a tick each way): the windows N1 judges are widened
/// by this, so it never blames the proxy for a clock.
const SKEW_US: u64 = 2 * crate::run::TICK.as_micros() as u64;
const PORT: u16 = 443;

pub fn endpoint(provider: &str) -> String {
    format!("{provider}.test")
}

/// The store's committed history of each sandbox, as N1 reads it.
#[derive(Default)]
pub struct Ledger {
    versions: BTreeMap<SandboxId, Vec<Version>>,
    pub opened: u64,
    pub refused: u64,
}

impl Ledger {
    /// A write the store committed at `t`; kept only when what N1 looks at changed.
    pub fn commit(&mut self, t: u64, id: &SandboxId, after: Option<&Sandbox>) {
        let version = Version {
            t,
            generation: after.map(|s| s.generation),
            providers: after.map(|s| BTreeSet::clone(&s.providers)).unwrap_or_default(),
            deleting: after.is_none_or(|s| s.intent == Intent::Deleted),
        };
        let history = self.versions.entry(id.clone()).or_default();
        let same = |last: &Version| {
            (&last.generation, &last.providers, last.deleting)
                == (&version.generation, &version.providers, version.deleting)
        };
        if !history.last().is_some_and(same) {
            history.push(version);
        }
    }

    fn history(&self, id: &SandboxId) -> &[Version] {
        self.versions.get(id).map_or(&[], Vec::as_slice)
    }
}

/// What the workload writes first through an opened connection: who it is and when it asked.
fn hello(sandbox: &SandboxId, generation: u64, provider: &str, asked: u64) -> String {
    format!("{sandbox} {generation} {provider} {asked}\n")
}

/// The world's side of every egress connection: a name table and an upstream that checks N1
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
        let index = name
            .strip_suffix(".test")
            .and_then(|p| p.strip_prefix('p'))
            .and_then(|k| k.parse::<u8>().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such host {name}")))?;
        Ok(Resolved { addrs: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, index + 1))], pinned: false })
    }

    async fn connect(&self, _addr: SocketAddr) -> io::Result<Box<dyn Connection>> {
        let (ours, theirs) = tokio::io::duplex(4096);
        tokio::spawn(serve_upstream(self.world.clone(), theirs));
        Ok(Box::new(ours))
    }
}

async fn serve_upstream(world: Arc<World>, stream: tokio::io::DuplexStream) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    if stream.read_line(&mut line).await.is_err() {
        return;
    }
    let answered = World::micros();
    let mut parts = line.split_whitespace();
    let (Some(sandbox), Some(Ok(generation)), Some(provider), Some(Ok(asked))) =
        (parts.next(), parts.next().map(str::parse), parts.next(), parts.next().map(str::parse))
    else {
        return;
    };
    let id = SandboxId::new(sandbox);
    let request = Request {
        sandbox,
        generation,
        provider,
        asked: u64::saturating_sub(asked, SKEW_US),
        answered: answered + SKEW_US,
    };
    let problem = {
        let mut ledger = lock(&world.egress);
        ledger.opened += 1;
        n1_egress::opened_outside_policy(ledger.history(&id), &request)
    };
    world.event("upstream", Kind::Egress, format!("{sandbox} generation {generation} reached {}", endpoint(provider)));
    if let Some(problem) = problem {
        world.violate(Invariant::N1, problem);
    }
    let _ = stream.get_mut().write_all(b"ok\n").await;
}

/// One request of a run's workload for `provider`'s endpoint, through the supervisor's proxy
/// code over a channel to a gateway: whether the proxy refused it (403).
async fn ask(
    world: &World,
    channel: tonic::transport::Channel,
    token: &str,
    sandbox: &SandboxId,
    generation: u64,
    provider: &str,
) {
    let (mut client, proxy) = tokio::io::duplex(4096);
    let token = token.to_string();
    tokio::spawn(async move {
        let _ = egress::serve(proxy, &token, channel).await;
    });
    let asked = World::micros();
    let host = endpoint(provider);
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
        let _ = client.write_all(hello(sandbox, generation, provider, asked).as_bytes()).await;
        let mut reply = Vec::new();
        let _ = client.read_to_end(&mut reply).await;
    } else if head.starts_with(b"HTTP/1.1 403") {
        world.event("supervisor", Kind::EgressRefused, format!("{sandbox} generation {generation}: {host}"));
        let request = Request {
            sandbox: sandbox.as_str(),
            generation,
            provider,
            asked: asked.saturating_sub(SKEW_US),
            answered: World::micros() + SKEW_US,
        };
        let problem = {
            let mut ledger = lock(&world.egress);
            ledger.refused += 1;
            n1_egress::refused_within_policy(ledger.history(sandbox), &request)
        };
        if let Some(problem) = problem {
            world.violate(Invariant::N1, problem);
        }
    }
}

/// A run's workload, for as long as its supervisor lives: a request every so often for a
/// provider's endpoint, drawn from the seed and the run.
pub async fn workload<C, F>(world: Arc<World>, token: String, sandbox: SandboxId, generation: u64, connect: C)
where
    C: Fn(usize) -> F,
    F: std::future::Future<Output = Result<tonic::transport::Channel, String>>,
{
    let run = sandbox.as_str().bytes().fold(generation, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut draw = Draw::new(world.scenario.seed, Stream::Egress(run));
    let providers: Vec<String> = (0..world.scenario.providers).map(crate::client::provider_name).collect();
    for attempt in 0.. {
        tokio::time::sleep(draw.millis(100, 1_500)).await;
        let provider = &providers[draw.below(providers.len() as u64) as usize];
        let Ok(channel) = connect(attempt).await else { continue };
        let within = Duration::from_secs(5);
        let _ = tokio::time::timeout(within, ask(&world, channel, &token, &sandbox, generation, provider)).await;
    }
}
