//! Simulated clients: the real generated gRPC client over simulated TCP, issuing random
//! operations (with and without expected versions) and the shapes of the motivating reports.
//! Every sandbox operation goes into the history for the linearizability check; replies a
//! correct gateway never gives are violations on the spot (I3, I7, I10).

use std::sync::Arc;
use std::time::Duration;

use berth_core::{Intent, PhaseKind};
use berth_proto::v1 as pb;
use berth_proto::v1::providers_client::ProvidersClient;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use berth_proto::v1::snapshots_client::SnapshotsClient;
use berth_proto::v1::templates_client::TemplatesClient;
use berth_proto::v1::volumes_client::VolumesClient;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

mod ports;
mod snapshots;
mod volumes;

use crate::invariants::{Fact, Invariant, i3_server_owned, i7_delete_completes, i10_no_panic_or_internal};
use crate::net;
use crate::scenario::{Draw, Stream};
use crate::trace::Kind;
use crate::world::{Op, Outcome, Seen, World, lock, now};
use berth_gateway::clock::Clock;

/// How long a client waits for any reply.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub struct Bearer;

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let value = MetadataValue::try_from(format!("Bearer {}", net::API_TOKEN)).expect("an ASCII token");
        r.metadata_mut().insert("authorization", value);
        Ok(r)
    }
}

type Sandboxes = SandboxesClient<InterceptedService<Channel, Bearer>>;
type Providers = ProvidersClient<InterceptedService<Channel, Bearer>>;
type Templates = TemplatesClient<InterceptedService<Channel, Bearer>>;
type Snapshots = SnapshotsClient<InterceptedService<Channel, Bearer>>;
type Volumes = VolumesClient<InterceptedService<Channel, Bearer>>;

/// The template of the lifetime workload's warm pool.
pub const POOL: &str = "pool";

pub fn sandbox_name(i: usize) -> String {
    format!("sb{i}")
}

pub fn provider_name(i: usize) -> String {
    format!("p{i}")
}

fn seen(s: &pb::Sandbox) -> Seen {
    let intent = match pb::Intent::try_from(s.intent) {
        Ok(pb::Intent::Stopped) => Intent::Stopped,
        Ok(pb::Intent::Deleted) => Intent::Deleted,
        Ok(pb::Intent::Paused) => Intent::Paused,
        _ => Intent::Running,
    };
    let phase = match pb::Phase::try_from(s.phase) {
        Ok(pb::Phase::Provisioning) => PhaseKind::Provisioning,
        Ok(pb::Phase::Starting) => PhaseKind::Starting,
        Ok(pb::Phase::Ready) => PhaseKind::Ready,
        Ok(pb::Phase::Paused) => PhaseKind::Paused,
        Ok(pb::Phase::Stopping) => PhaseKind::Stopping,
        Ok(pb::Phase::Stopped) => PhaseKind::Stopped,
        Ok(pb::Phase::Deleting) => PhaseKind::Deleting,
        _ => PhaseKind::Error,
    };
    Seen { version: s.resource_version, generation: s.generation, intent, phase }
}

struct Client {
    world: Arc<World>,
    index: usize,
    actor: String,
    draw: Draw,
    /// A connection to each gateway; the client talks to one and moves to the next when it
    /// stops answering.
    gateways: Vec<(Sandboxes, Providers, Templates, Snapshots, Volumes)>,
    at: usize,
    r2_runs: usize,
}

/// The clients of gateway `g`, over a new channel.
fn connect(g: usize) -> (Sandboxes, Providers, Templates, Snapshots, Volumes) {
    let channel = net::channel(g);
    (
        SandboxesClient::with_interceptor(channel.clone(), Bearer),
        ProvidersClient::with_interceptor(channel.clone(), Bearer),
        TemplatesClient::with_interceptor(channel.clone(), Bearer),
        SnapshotsClient::with_interceptor(channel.clone(), Bearer),
        VolumesClient::with_interceptor(channel, Bearer),
    )
}

enum Versioned {
    None,
    Current,
    Stale,
}

impl Client {
    fn new(world: Arc<World>, index: usize) -> Self {
        let draw = Draw::new(world.scenario.seed, Stream::Client(index));
        let gateways = (0..world.scenario.gateways).map(connect).collect::<Vec<_>>();
        Self { at: index % gateways.len(), world, index, actor: format!("client {index}"), draw, gateways, r2_runs: 0 }
    }

    fn sandboxes(&self) -> Sandboxes {
        self.gateways[self.at].0.clone()
    }

    fn providers(&self) -> Providers {
        self.gateways[self.at].1.clone()
    }

    fn snapshots(&self) -> Snapshots {
        self.gateways[self.at].3.clone()
    }

    fn volumes(&self) -> Volumes {
        self.gateways[self.at].4.clone()
    }

    /// I10 and I3 on a failed reply to `what` (`conflicted`, as I3 words it), sent with `expected`.
    fn check_reply(&self, what: &str, conflicted: &str, expected: Option<u64>, status: &tonic::Status) {
        if let Some(problem) = i10_no_panic_or_internal::internal(what, status) {
            self.world.violate(Invariant::I10, problem);
        }
        if let Some(problem) = i3_server_owned::failed_on_conflict(conflicted, expected, status) {
            self.world.violate(Invariant::I3, problem);
        }
    }

    /// Checks a reply any correct gateway could give, and records the operation.
    fn record(
        &self,
        sandbox: &str,
        kind: &'static str,
        expected: Option<u64>,
        called: u64,
        result: &Result<Option<pb::Sandbox>, Option<tonic::Status>>,
    ) {
        let outcome = match result {
            Ok(s) => Outcome::Ok(s.as_ref().map(seen)),
            Err(None) => Outcome::Unknown,
            Err(Some(status)) => {
                self.check_reply(&format!("{kind} {sandbox}"), &format!("{kind} of {sandbox}"), expected, status);
                Outcome::Failed { code: format!("{:?}", status.code()), message: status.message().to_string() }
            }
        };
        let detail = match &outcome {
            Outcome::Ok(Some(s)) => format!("{kind} {sandbox} -> {:?} v{} g{}", s.phase, s.version, s.generation),
            Outcome::Ok(None) => format!("{kind} {sandbox} -> ok"),
            Outcome::Failed { code, .. } => format!("{kind} {sandbox} -> {code}"),
            Outcome::Unknown => format!("{kind} {sandbox} -> no answer"),
        };
        self.world.event(self.actor.clone(), Kind::Reply, detail);
        let op = Op {
            client: self.index,
            sandbox: sandbox.to_string(),
            kind,
            expected_version: expected,
            called,
            returned: World::micros(),
            outcome,
        };
        let id = result.as_ref().ok().and_then(|s| s.as_ref()).map(|s| s.id.as_str());
        self.world.fact(&Fact::Reply { op: &op, id });
        lock(&self.world.history).push(op);
    }

    /// A call with the client's timeout; a gateway that does not answer is left for the next.
    async fn timed<T>(
        &mut self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, Option<tonic::Status>> {
        let result = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(Some(status)),
            Err(_) => Err(None),
        };
        let unreachable = match &result {
            Err(None) => true,
            Err(Some(status)) => status.code() == Code::Unavailable,
            Ok(_) => false,
        };
        // The connection may have gone silent (a partition, a crashed host): the next call to
        // this gateway goes over a new one.
        if matches!(result, Err(None)) {
            self.gateways[self.at] = connect(self.at);
        }
        if unreachable && self.gateways.len() > 1 {
            self.at = (self.at + 1) % self.gateways.len();
            self.world.event(self.actor.clone(), Kind::Moves, format!("to {}", net::gateway_host(self.at)));
        }
        result
    }

    async fn get(&mut self, name: &str) -> Option<pb::Sandbox> {
        let called = World::micros();
        let mut c = self.sandboxes();
        let result =
            self.timed(c.get_sandbox(pb::GetSandboxRequest { name: name.to_string() })).await.map(|r| r.sandbox);
        self.record(name, "get", None, called, &result);
        result.ok().flatten()
    }

    async fn version(&mut self, name: &str, mode: Versioned) -> Option<u64> {
        match mode {
            Versioned::None => None,
            Versioned::Current => Some(self.get(name).await.map_or(1, |s| s.resource_version)),
            Versioned::Stale => Some(self.get(name).await.map_or(1, |s| s.resource_version.saturating_sub(1))),
        }
    }

    fn versioned(&mut self) -> Versioned {
        match self.draw.below(6) {
            0 => Versioned::Current,
            1 => Versioned::Stale,
            _ => Versioned::None,
        }
    }

    async fn lifecycle(&mut self, verb: &'static str, name: &str, expected: Option<u64>) -> Option<pb::Sandbox> {
        self.world.event(
            self.actor.clone(),
            Kind::Call,
            format!("{verb} {name}{}", expected.map(|v| format!(" @v{v}")).unwrap_or_default()),
        );
        let called = World::micros();
        let request = pb::LifecycleRequest { name: name.to_string(), expected_resource_version: expected };
        let mut c = self.sandboxes();
        let result = match verb {
            "stop" => self.timed(c.stop_sandbox(request)).await,
            "start" => self.timed(c.start_sandbox(request)).await,
            "pause" | "checkpoint" => {
                let checkpoint = verb == "checkpoint";
                let request = pb::PauseRequest { name: request.name, expected_resource_version: expected, checkpoint };
                self.timed(c.pause_sandbox(request)).await
            }
            "resume" => self.timed(c.resume_sandbox(request)).await,
            _ => self.timed(c.delete_sandbox(request)).await,
        }
        .map(|r| r.sandbox);
        self.record(name, verb, expected, called, &result);
        result.ok().flatten()
    }

    async fn create(&mut self, name: &str, providers: Vec<String>) -> Option<pb::Sandbox> {
        self.world.event(self.actor.clone(), Kind::Call, format!("create {name} {providers:?}"));
        let called = World::micros();
        let (lifetime, restart, crashes) = self.policies(name);
        let command = if crashes { crate::runtime::CRASH } else { "work" };
        let request = pb::CreateSandboxRequest {
            name: name.to_string(),
            spec: Some(pb::SandboxSpec {
                image: "sim".into(),
                command: vec![command.into()],
                lifetime,
                restart,
                ..Default::default()
            }),
            providers,
            expected_resource_version: None,
            deadline_unix_ms: None,
            from_snapshot: String::new(),
        };
        let mut c = self.sandboxes();
        let result = self.timed(c.create_sandbox(request)).await.map(|r| r.sandbox);
        self.record(name, "create", None, called, &result);
        result.ok().flatten()
    }

    /// The lifetime and restart policy the sandbox `name` of the fleet is created with in the
    /// lifetime workload: drawn from the seed and the name, so every create of it asks the same.
    /// Backoffs are short: each policy must have brought its sandbox back within the quiet phase.
    /// Some sandboxes with a policy crash-loop (their command fails soon after every start while
    /// faults are on), so that a policy's maximum and its doubling backoff are reached (R1).
    fn policies(&self, name: &str) -> (Option<pb::Lifetime>, Option<pb::RestartPolicy>, bool) {
        let index = name.strip_prefix("sb").and_then(|i| i.parse::<u64>().ok());
        let (true, Some(index)) = (self.world.scenario.lifetimes, index) else { return (None, None, false) };
        let mut d = Draw::new(self.world.scenario.seed, Stream::Policy(index));
        let millis = |d: Duration| d.as_millis() as i64;
        let mut lifetime = d.chance(0.6).then(|| pb::Lifetime {
            ttl_ms: Some(millis(d.millis(3_000, 25_000))),
            idle_timeout_ms: None,
            on_expiry: if d.chance(0.5) { pb::OnExpiry::Stop } else { pb::OnExpiry::Delete } as i32,
            on_idle: None,
        });
        let mode = d.pick(&[pb::RestartMode::Never, pb::RestartMode::OnFailure, pb::RestartMode::Always]);
        let restart = (mode != pb::RestartMode::Never).then(|| pb::RestartPolicy {
            mode: mode as i32,
            max_restarts: d.chance(0.3).then(|| 1 + d.below(5) as u32),
            backoff_ms: Some(millis(d.millis(100, 800))),
            max_backoff_ms: Some(millis(d.millis(1_000, 3_000))),
        });
        // Drawn last, so the draws above are what they were before idle timeouts: short enough
        // that the execs of `--execs` often outlast one.
        if d.chance(0.35) {
            let idle = Some(millis(d.millis(2_000, 6_000)));
            let on_expiry = if d.chance(0.5) { pb::OnExpiry::Stop } else { pb::OnExpiry::Delete } as i32;
            let l =
                lifetime.get_or_insert(pb::Lifetime { ttl_ms: None, idle_timeout_ms: None, on_expiry, on_idle: None });
            l.idle_timeout_ms = idle;
        }
        let crashes = restart.is_some() && d.chance(0.3);
        // With the state workload, some deadlines and idle timeouts pause (drawn after the rest,
        // so the draws above are what they were).
        if self.world.scenario.state
            && let Some(l) = lifetime.as_mut()
        {
            if d.chance(0.3) {
                l.on_expiry = pb::OnExpiry::Pause as i32;
            }
            if l.idle_timeout_ms.is_some() && d.chance(0.5) {
                l.on_idle = Some(pb::OnExpiry::Pause as i32);
            }
        }
        (lifetime, restart, crashes)
    }

    /// The warm pool of the lifetime workload: its size drawn from the seed.
    async fn make_pool(&mut self) {
        let min_ready = 1 + self.draw.below(3) as u32;
        self.world.event(self.actor.clone(), Kind::Call, format!("create template {POOL} with a pool of {min_ready}"));
        let spec = pb::SandboxSpec { image: "sim".into(), command: vec!["work".into()], ..Default::default() };
        let request = pb::CreateTemplateRequest {
            name: POOL.into(),
            spec: Some(spec),
            min_ready,
            expected_resource_version: None,
        };
        let mut c = self.gateways[self.at].2.clone();
        let reply = self.timed(c.create_template(request)).await;
        if let Err(Some(status)) = &reply {
            self.check_reply("create template", "create template", None, status);
        }
    }

    /// One claim through gateway `g`: what it got, checked against every claim before (P1).
    async fn claim_via(&self, g: usize, wait_ms: Option<u32>) -> Option<pb::Sandbox> {
        let mut c = self.gateways[g].2.clone();
        let request = pb::ClaimSandboxRequest {
            template: POOL.into(),
            labels: [("claimer".to_string(), format!("c{}", self.index))].into(),
            providers: vec![],
            wait_ms,
        };
        let result = match tokio::time::timeout(CALL_TIMEOUT, c.claim_sandbox(request)).await {
            Ok(Ok(r)) => Ok(r.into_inner().sandbox),
            Ok(Err(status)) => Err(Some(status)),
            Err(_) => Err(None),
        };
        let detail = match &result {
            Ok(Some(s)) => format!("claim via {} -> {} v{}", net::gateway_host(g), s.name, s.resource_version),
            Ok(None) => "claim -> nothing".to_string(),
            Err(Some(status)) => format!("claim via {} -> {:?}", net::gateway_host(g), status.code()),
            Err(None) => format!("claim via {} -> no answer", net::gateway_host(g)),
        };
        self.world.event(self.actor.clone(), Kind::Reply, detail);
        match result {
            Ok(Some(s)) => {
                let claimer = format!("{} via {}", self.actor, net::gateway_host(g));
                let seen = seen(&s);
                self.world.fact(&Fact::Claimed { id: &s.id, name: &s.name, claimer: &claimer, seen: &seen });
                Some(s)
            }
            // An empty pool is UNAVAILABLE, as an unreachable gateway is: neither is a bug.
            Err(Some(status)) => {
                self.check_reply("claim", "claim", None, &status);
                None
            }
            _ => None,
        }
    }

    /// P1's races: claims racing claims (two at one instant, through two gateways when there
    /// are several) and deletes of the members they race for; each claimed sandbox is deleted
    /// again a moment later, as a finished agent's is.
    async fn claims(&mut self) {
        self.world.event(self.actor.clone(), Kind::Call, format!("claim from {POOL}"));
        let other = (self.at + 1) % self.gateways.len();
        let wait_ms = self.draw.chance(0.5).then(|| self.draw.below(2_000) as u32);
        let got = match self.draw.below(3) {
            0 => {
                let (a, b) = tokio::join!(self.claim_via(self.at, wait_ms), self.claim_via(other, wait_ms));
                vec![a, b]
            }
            1 => {
                // A delete of a member racing the claim that may take it.
                let mut t = self.gateways[other].2.clone();
                let members =
                    tokio::time::timeout(CALL_TIMEOUT, t.get_template(pb::GetTemplateRequest { name: POOL.into() }))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .and_then(|r| r.into_inner().template)
                        .and_then(|t| t.pool)
                        .map(|p| p.member_names)
                        .unwrap_or_default();
                let victim = members.first().cloned();
                let mut s = self.gateways[other].0.clone();
                let delete = async {
                    if let Some(name) = victim {
                        let request = pb::LifecycleRequest { name, expected_resource_version: None };
                        let _ = tokio::time::timeout(CALL_TIMEOUT, s.delete_sandbox(request)).await;
                    }
                };
                let (claimed, ()) = tokio::join!(self.claim_via(self.at, wait_ms), delete);
                vec![claimed]
            }
            _ => vec![self.claim_via(self.at, wait_ms).await],
        };
        tokio::time::sleep(self.draw.millis(0, 2_000)).await;
        for s in got.into_iter().flatten() {
            if self.draw.chance(0.8) {
                self.lifecycle("delete", &s.name, None).await;
            }
        }
    }

    /// T1's race: a renew sent just before the sandbox's deadline, when its expiry is about to
    /// be taken, now and then with the version the client read. Now and then a sandbox with no
    /// deadline is renewed too (with no TTL in its spec and none given, refused naming the
    /// field), and now and then a renew sets an absolute deadline, which a later start may find
    /// passed.
    async fn renew_near_deadline(&mut self, name: &str) {
        let Some(s) = self.get(name).await else { return };
        let now = || crate::gateway::SimClock.now().unix_millis();
        let Some(deadline) = s.deadline_unix_ms.or_else(|| self.draw.chance(0.3).then(now)) else { return };
        let early = self.draw.below(600) as i64;
        if let Ok(wait) = u64::try_from(deadline - now() - early)
            && wait < 6_000
        {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let expected = self.draw.chance(0.2).then_some(s.resource_version);
        let ttl_ms = self.draw.chance(0.3).then(|| self.draw.millis(2_000, 20_000).as_millis() as i64);
        let deadline = (ttl_ms.is_none() && self.draw.chance(0.25))
            .then(|| now() + self.draw.millis(2_000, 20_000).as_millis() as i64);
        self.renew(name, ttl_ms, deadline, expected).await;
    }

    async fn renew(&mut self, name: &str, ttl_ms: Option<i64>, deadline: Option<i64>, expected: Option<u64>) {
        self.world.event(self.actor.clone(), Kind::Call, format!("renew {name} ttl {ttl_ms:?} deadline {deadline:?}"));
        let called = World::micros();
        let request = pb::RenewSandboxRequest {
            name: name.to_string(),
            ttl_ms,
            deadline_unix_ms: deadline,
            expected_resource_version: expected,
        };
        let mut c = self.sandboxes();
        let result = self.timed(c.renew_sandbox(request)).await.map(|r| r.sandbox);
        self.record(name, "renew", expected, called, &result);
    }

    async fn attach(&mut self, attach: bool, name: &str, provider: &str, expected: Option<u64>) {
        let kind = if attach { "attach" } else { "detach" };
        self.world.event(self.actor.clone(), Kind::Call, format!("{kind} {provider} to {name}"));
        let called = World::micros();
        let request = pb::AttachRequest {
            sandbox: name.to_string(),
            provider: provider.to_string(),
            expected_resource_version: expected,
        };
        let mut c = self.providers();
        let result = if attach {
            self.timed(c.attach_provider(request)).await
        } else {
            self.timed(c.detach_provider(request)).await
        }
        .map(|r| r.sandbox);
        self.record(name, kind, expected, called, &result);
    }

    async fn provider(&mut self, create: bool, name: &str) -> Result<(), Option<tonic::Status>> {
        let kind = if create { "create provider" } else { "delete provider" };
        self.world.event(self.actor.clone(), Kind::Call, format!("{kind} {name}"));
        let mut c = self.providers();
        let result = if create {
            let request = pb::CreateProviderRequest {
                endpoints: crate::egress::endpoints(name),
                name: name.to_string(),
                kind: "sim".into(),
                credentials: [(format!("KEY_{}", name.to_uppercase().replace('-', "_")), "secret".to_string())].into(),
                expected_resource_version: None,
            };
            self.timed(c.create_provider(request)).await.map(|_| ())
        } else {
            self.timed(
                c.delete_provider(pb::DeleteProviderRequest {
                    name: name.to_string(),
                    expected_resource_version: None,
                }),
            )
            .await
            .map(|_| ())
        };
        if let Err(Some(status)) = &result {
            self.check_reply(kind, kind, None, status);
        }
        let detail = match &result {
            Ok(()) => "ok".to_string(),
            Err(Some(s)) => format!("{:?}", s.code()),
            Err(None) => "no answer".to_string(),
        };
        self.world.event(self.actor.clone(), Kind::Reply, format!("{kind} {name} -> {detail}"));
        result
    }

    /// Waits up to `within` for the sandbox to be `done`, never past the fault phase: a wait is
    /// part of a fault-phase operation, and one that ran on would take the quiet phase from the
    /// heal that lets every sandbox converge (a start that failed just before the end waits for
    /// a user in Error, never reaching Ready by itself).
    async fn wait(&mut self, name: &str, within: Duration, done: impl Fn(&pb::Sandbox) -> bool) -> Option<pb::Sandbox> {
        let deadline = (now() + within).min(self.world.scenario.fault_phase);
        while now() < deadline {
            let s = self.get(name).await?;
            if done(&s) {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// R3's shape: stop, then start, then wait for Ready.
    async fn stop_start_wait(&mut self, name: &str) {
        self.lifecycle("stop", name, None).await;
        self.wait(name, Duration::from_secs(8), |s| s.phase == pb::Phase::Stopped as i32).await;
        self.lifecycle("start", name, None).await;
        self.wait(name, Duration::from_secs(8), |s| s.phase == pb::Phase::Ready as i32).await;
    }

    /// R2's shape: a provider of its own, a sandbox using it, delete the sandbox, delete the
    /// provider at once. With the sandbox Deleting, the provider delete must succeed (I7).
    async fn delete_then_delete_provider(&mut self) {
        self.r2_runs += 1;
        let provider = format!("r2-c{}-{}", self.index, self.r2_runs);
        let sandbox = format!("r2c{}n{}", self.index, self.r2_runs);
        if self.provider(true, &provider).await.is_err() {
            return;
        }
        self.create(&sandbox, vec![provider.clone()]).await;
        tokio::time::sleep(self.draw.millis(0, 1_500)).await;
        let deleting = self.lifecycle("delete", &sandbox, None).await;
        if deleting.is_some_and(|s| s.phase == pb::Phase::Deleting as i32) {
            let reply = self.provider(false, &provider).await;
            if let Some(problem) = i7_delete_completes::provider_kept(&provider, &sandbox, &reply) {
                self.world.violate(Invariant::I7, problem);
            }
        }
    }

    /// R1's shape: a writer bumping a sandbox's version while others run server-owned commands.
    async fn bump(&mut self, name: &str) {
        for i in 0..self.draw.below(8) + 2 {
            let provider = provider_name((i % self.world.scenario.providers as u64) as usize);
            self.attach(i % 2 == 0, name, &provider, None).await;
        }
    }

    /// DESIGN 12.1's verbs: a pause (in the freezer, or to a checkpoint) or a resume (some with
    /// a version), or a pause held for a while and resumed, waiting for each to land as a
    /// user's client would.
    async fn pause_or_resume(&mut self, name: &str) {
        let mode = self.versioned();
        let expected = self.version(name, mode).await;
        let pause = if self.draw.chance(0.3) { "checkpoint" } else { "pause" };
        match self.draw.below(10) {
            0..=3 => {
                self.lifecycle(pause, name, expected).await;
            }
            4..=6 => {
                self.lifecycle("resume", name, expected).await;
            }
            _ => {
                self.lifecycle(pause, name, expected).await;
                self.wait(name, Duration::from_secs(5), |s| s.phase == pb::Phase::Paused as i32).await;
                tokio::time::sleep(self.draw.millis(0, 2_000)).await;
                self.lifecycle("resume", name, None).await;
                self.wait(name, Duration::from_secs(5), |s| s.phase == pb::Phase::Ready as i32).await;
            }
        }
    }

    async fn random_operation(&mut self) {
        let scenario = &self.world.scenario;
        let name = sandbox_name(self.draw.below(scenario.sandboxes as u64) as usize);
        let provider = provider_name(self.draw.below(scenario.providers as u64) as usize);
        // Drawn only with the state workload, so the other workloads' draws stay as they were.
        if scenario.state && self.draw.chance(0.2) {
            return self.pause_or_resume(&name).await;
        }
        // The same with the snapshot workload.
        if scenario.snapshots && self.draw.chance(0.3) {
            return match self.draw.below(3) {
                0 => self.write_files(&name).await,
                _ => self.snapshot_operation(&name).await,
            };
        }
        // And with the volume workload.
        if scenario.volumes && self.draw.chance(0.3) {
            return self.volume_operation().await;
        }
        // And with the port workload.
        if scenario.ports && self.draw.chance(0.2) {
            return self.port_operation(&name).await;
        }
        match self.draw.below(100) {
            0..=14 => {
                let providers = if self.draw.chance(0.3) { vec![provider] } else { vec![] };
                self.create(&name, providers).await;
            }
            15..=29 => {
                let mode = self.versioned();
                let expected = self.version(&name, mode).await;
                self.lifecycle("stop", &name, expected).await;
            }
            30..=44 => {
                let mode = self.versioned();
                let expected = self.version(&name, mode).await;
                self.lifecycle("start", &name, expected).await;
            }
            45..=51 => {
                let mode = self.versioned();
                let expected = self.version(&name, mode).await;
                self.lifecycle("delete", &name, expected).await;
            }
            52..=59 => {
                let mode = self.versioned();
                let expected = self.version(&name, mode).await;
                let attach = self.draw.chance(0.5);
                self.attach(attach, &name, &provider, expected).await;
            }
            60..=63 => {
                let create = self.draw.chance(0.6);
                let _ = self.provider(create, &provider).await;
            }
            64..=71 => {
                if self.world.scenario.lifetimes && self.draw.chance(0.6) {
                    self.renew_near_deadline(&name).await;
                } else {
                    self.get(&name).await;
                }
            }
            72..=83 => self.stop_start_wait(&name).await,
            84..=89 => self.delete_then_delete_provider().await,
            _ => {
                if self.world.scenario.lifetimes && self.draw.chance(0.6) {
                    self.claims().await;
                } else {
                    self.bump(&name).await;
                }
            }
        }
    }

    /// The quiet phase: client 0 re-issues each sandbox's intent out of Error and out of a
    /// completion (both wait for a user, by design), so that every sandbox can converge; the others wait. It never
    /// re-issues a delete: a delete must complete by itself (I7).
    async fn heal(&mut self, until: Duration) {
        if self.index != 0 {
            return;
        }
        let mut desired = std::collections::BTreeMap::new();
        while now() < until {
            let mut c = self.sandboxes();
            let listed =
                self.timed(c.list_sandboxes(pb::ListSandboxesRequest { page_size: 1000, ..Default::default() })).await;
            for s in listed.map(|r| r.sandboxes).unwrap_or_default() {
                // Its restart policy brings it back by itself; an expired one (by its deadline or
                // as idle) stays expired (unless it failed since, as any stopped sandbox can); a
                // pool's member is its pool's to replace. Nothing keeps a sandbox active in the
                // quiet phase: one with an idle timeout that is started here expires again.
                let expired = (s.expired_at_unix_ms.is_some() || s.idle_expired_at_unix_ms.is_some())
                    && seen(&s).phase != PhaseKind::Error;
                if s.next_restart_unix_ms.is_some() || expired || s.pool_member {
                    continue;
                }

                // A deadline still ahead is moved past the end of the run, as a user keeping a
                // sandbox renews it: it is not to expire while the run checks convergence. One
                // already passed is left for T1 to see expired.
                let now_ms = crate::gateway::SimClock.now().unix_millis();
                let end_ms = now_ms + (self.world.scenario.total().saturating_sub(now())).as_millis() as i64;
                if let Some(deadline) = s.deadline_unix_ms
                    && deadline > now_ms
                    && deadline < end_ms + 10_000
                {
                    self.renew(&s.name, Some(end_ms - now_ms + 60_000), None, None).await;
                }
                // A pause that ended with its run left the sandbox as that run's end did: its
                // intent now is what to heal it to.
                let intent = match *desired.entry(s.name.clone()).or_insert(seen(&s).intent) {
                    Intent::Paused => seen(&s).intent,
                    intent => intent,
                };
                match (intent, seen(&s).phase) {
                    // Error, or a command that completed (exit 0) while its intent is Running.
                    (Intent::Running | Intent::Stopped, PhaseKind::Error) | (Intent::Running, PhaseKind::Stopped) => {
                        // An absolute deadline that passed refuses the start until it is renewed
                        // (DESIGN 9.1), as a user is told.
                        if s.deadline_unix_ms.is_some_and(|deadline| deadline <= now_ms) {
                            self.renew(&s.name, Some(end_ms - now_ms + 60_000), None, None).await;
                        }
                        self.lifecycle("start", &s.name, None).await;
                    }
                    (Intent::Stopped, PhaseKind::Ready) => {
                        self.lifecycle("stop", &s.name, None).await;
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

pub async fn client(world: Arc<World>, index: usize) -> turmoil::Result {
    let mut c = Client::new(world.clone(), index);
    // Stagger the start, and give the gateway a moment to come up.
    tokio::time::sleep(Duration::from_millis(200 + 50 * index as u64)).await;
    // The fleet: the providers, then every sandbox, each client creating its share.
    if index == 0 {
        for p in 0..world.scenario.providers {
            let _ = c.provider(true, &provider_name(p)).await;
        }
        if world.scenario.lifetimes {
            c.make_pool().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in (index..world.scenario.sandboxes).step_by(world.scenario.clients) {
        let providers = if i % 3 == 0 { vec![provider_name(i % world.scenario.providers)] } else { vec![] };
        c.create(&sandbox_name(i), providers).await;
    }
    let scenario = world.scenario.clone();
    while now() < scenario.fault_phase {
        c.random_operation().await;
        let pause = c.draw.millis(0, 400);
        tokio::time::sleep(pause).await;
    }
    c.heal(scenario.total() - Duration::from_secs(8)).await;
    Ok(())
}
