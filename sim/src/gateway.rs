//! The gateway's host: the real berth-gateway (engine, reconcile loop, recovery, gRPC services)
//! over turmoil TCP, with the shared in-memory store that keeps acknowledged writes across
//! crashes, the simulated runtime's driver, and time and randomness from the simulation.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_core::identity::IdentityKey;
use berth_core::{NodeId, Timestamp};
use berth_drivers::Driver;
use berth_drivers::container::{ContainerConfig, ContainerDriver};
use berth_drivers::process::{ProcessConfig, ProcessDriver};
use berth_gateway::clock::Clock;
use berth_gateway::engine::execs::Execs;
use berth_gateway::engine::{Engine, EngineSettings};
use berth_gateway::lease::{self, LeaseSettings};
use berth_gateway::node::NodeSettings;
use berth_gateway::ports::{Preview, Proxy};
use berth_gateway::reconcile::ReconcileSettings;
use berth_gateway::store::{NodeOffer, Store};
use tokio::sync::mpsc;

use crate::checker::TracingStore;
use crate::driver::SimDriver;
use crate::engine::SimEngine;
use crate::kernel::KernelCall;
use crate::net;
use crate::os::SimOs;
use crate::runtime::Request;
use crate::scenario::DriverKind;
use crate::trace::Kind;
use crate::world::{EPOCH_SECS, World};

/// How a gateway reaches the runtime's host: the engine's API and the kernel's calls.
#[derive(Clone)]
pub struct RuntimeLinks {
    pub calls: mpsc::UnboundedSender<Request>,
    pub kernel: mpsc::UnboundedSender<KernelCall>,
}

/// The simulation's wall clock: the pinned epoch plus simulated time.
pub struct SimClock;

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        let since_epoch = Duration::from_secs(EPOCH_SECS) + crate::world::now();
        Timestamp::from_unix_nanos(i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX))
    }
}

pub const IDENTITY_KEY: [u8; 32] = [0x5a; 32];
pub const HEARTBEAT: Duration = Duration::from_secs(1);
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// The node every simulated gateway is, on the runtime's one host, unless each is a node of its
/// own (`Scenario::nodes`).
pub const NODE: &str = "sim-host";

/// One boot of gateway `index`; its host runs it again after every crash. Its host name is
/// its name in the reconcile lease, so a restarted gateway renews its own lease.
pub async fn gateway(world: Arc<World>, links: RuntimeLinks, index: usize) -> turmoil::Result {
    let name = net::gateway_host(index);
    let boot = world.boots.fetch_add(1, Ordering::Relaxed);
    world.event(name.clone(), Kind::Boot, format!("boot {boot}"));
    let scenario = &world.scenario;
    let store = Arc::new(TracingStore::new(world.clone(), index));
    let settings = EngineSettings {
        stop_grace: Duration::from_secs(2),
        effect_retries: vec![Duration::from_millis(200), Duration::from_millis(800)],
        egress: Arc::new(crate::egress::SimUpstream { world: world.clone() }),
        // Few enough that the snapshot workload meets the store's quota.
        limits: berth_core::validate::Limits { max_snapshots: 4, ..Default::default() },
        node_wait: berth_gateway::node::takeover_within(LEASE_TTL),
        preview: scenario.ports.then(|| Preview {
            scheme: "http",
            authority: format!("{name}:{}", net::PROXY_PORT),
            domain: None,
        }),
        node: NodeId::new(scenario.node_of(index)),
        ..EngineSettings::default()
    };
    let seed = scenario.seed ^ boot.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // Gateways of one node share the host's driver state, as gateways sharing a data directory
    // do; a node of its own keeps its own, as a node on another host (or in another data
    // directory of the machine) does.
    let root = world.root_of(index);
    let supervisor = PathBuf::from("/run/berth/bin/berth-supervisor");
    let driver: Box<dyn Driver> = match scenario.driver {
        DriverKind::Container => {
            let containers = ContainerConfig { root, supervisor, socket_dir: PathBuf::from("/run/berth/sockets") };
            let engine = SimEngine::new(links.calls, index, store.identity().to_string());
            Box::new(ContainerDriver::over(engine, containers)?)
        }
        DriverKind::Process => {
            let os = SimOs::new(world.clone(), links.kernel, index, root.clone());
            let processes = ProcessConfig { root, supervisor, gateway: "unix:/run/berth/sockets".to_string() };
            Box::new(ProcessDriver::over(os, processes)?)
        }
    };
    let engine = Engine::new(
        store,
        SimDriver::new(world.clone(), name.clone(), (scenario.nodes > 1).then(|| world.root_of(index)), driver),
        IdentityKey::from_bytes(IDENTITY_KEY),
        settings,
        seed,
    );
    let reconcile_settings = ReconcileSettings {
        poll_interval: scenario.poll_interval,
        redrive_after: scenario.redrive_after,
        page_size: scenario.page_size,
        max_watch_backoff: Duration::from_secs(2),
    };
    // The same lease a production gateway keeps. A crash tears the host down with its lease
    // loop (the lease is left to lapse, as a crash leaves it); a scripted shutdown turns `stop`.
    let (running, stop) = tokio::sync::watch::channel(false);
    crate::world::lock(&world.shutdowns).insert(index, running);
    // Gateways sharing the runtime's one host are one node, whose lease one of them keeps at a
    // time, as gateways sharing a data directory do.
    let node = NodeSettings {
        id: NodeId::new(scenario.node_of(index)),
        holder: name.clone(),
        offer: NodeOffer {
            address: format!("http://{name}:{}", net::GATEWAY_PORT),
            labels: Default::default(),
            capacity: berth_core::placement::Capacity { cpu_millis: 0, memory_bytes: 0, sandboxes: 10_000 },
            stops_when_lapsed: false,
            e2b_address: None,
        },
        ttl: LEASE_TTL,
        company: Some(world.root_of(index).join(".company")),
    };
    tokio::spawn(berth_gateway::node::keep(engine.clone(), node, reconcile_settings.clone(), stop.clone()));
    let lease = LeaseSettings { holder: name, ttl: LEASE_TTL };
    tokio::spawn(lease::lead(engine.clone(), lease, reconcile_settings, stop));
    tokio::spawn(Execs::new(engine.clone()).settle_forever());
    // Health is left as it is: a simulated gateway is never shut down through the server's
    // path, only its lease loop is stopped.
    if scenario.ports {
        let proxy = Proxy::new(engine.clone(), net::API_TOKEN, None);
        tokio::spawn(berth_gateway::ports::serve(proxy, net::incoming(net::PROXY_PORT).await?, std::future::pending()));
    }
    let (routes, _health) = berth_gateway::api::routes(&engine, net::API_TOKEN, HEARTBEAT).await;
    tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(net::fixed_date))
        .add_routes(routes)
        .serve_with_incoming(berth_gateway::ingress::sort(engine.clone(), net::incoming(net::GATEWAY_PORT).await?))
        .await?;
    Ok(())
}
