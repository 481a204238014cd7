//! The faults a run's driver loop injects between simulation steps: gateway crashes, network
//! partitions between a gateway and the clients or supervisors, (with several gateways) stalls
//! of a gateway's store connection, and (with several nodes) nodes lost with their runs, some
//! for good. Random faults come from the seed at the scenario's
//! rates; with several gateways most are aimed at the lease holder, since its failure is the one
//! that matters. A scenario may also script faults at fixed times, to pin an interleaving.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_gateway::store::Store;
use futures_util::FutureExt;
use serde::Serialize;

use crate::gateway::{LEASE_TTL, NODE};
use crate::invariants::l1_one_holder::{RECONCILE_LEASE, node_lease};
use crate::net::gateway_host;
use crate::run::client_host;
use crate::scenario::{Draw, Faults, Stream};
use crate::trace::Kind;
use crate::world::World;

/// A fault at a fixed time, whatever the seed draws.
#[derive(Clone, Debug, Serialize)]
pub enum Scripted {
    /// Gateway `gateway` crashes, and restarts after `down`.
    Crash { gateway: usize, down: Duration },
    /// Gateway `gateway`'s store calls and replies (only the lease's, with `lease_only`, as
    /// when one pooled connection hangs) are held for `stall`.
    Stall { gateway: usize, stall: Duration, lease_only: bool },
    /// Gateway `gateway` begins a graceful shutdown: its lease loop stops reconciling and gives
    /// the lease up (its APIs keep serving).
    Shutdown { gateway: usize },
}

pub struct Injector {
    draw: Draw,
    gateways: usize,
    clients: usize,
    rates: Faults,
    /// Scripted faults not yet injected, latest first.
    script: Vec<(Duration, Scripted)>,
    /// Crashed gateways and when they restart.
    crashed: BTreeMap<usize, Duration>,
    /// Nodes lost for good: their gateways never restart.
    gone: Vec<usize>,
    nodes: usize,
    /// The hosts cut off from each crashed gateway when it went down.
    lost: BTreeMap<usize, Vec<String>>,
    /// Partitioned (host, gateway) pairs and when they heal.
    partitioned: Vec<(String, usize, Duration)>,
    next_roll: Duration,
}

impl Injector {
    pub fn new(world: &World) -> Self {
        let scenario = &world.scenario;
        let mut script = scenario.script.clone();
        script.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        Self {
            draw: Draw::new(scenario.seed, Stream::Injector),
            gateways: scenario.gateways,
            clients: scenario.clients,
            rates: scenario.faults.clone(),
            script,
            crashed: BTreeMap::new(),
            gone: Vec::new(),
            nodes: scenario.nodes,
            lost: BTreeMap::new(),
            partitioned: Vec::new(),
            next_roll: Duration::ZERO,
        }
    }

    /// Restarts the crashed gateways and repairs the partitions that are due (all of them when
    /// `now` is `None`).
    pub fn heal(&mut self, sim: &mut turmoil::Sim<'_>, world: &World, now: Option<Duration>) {
        let due = |until: Duration| now.is_none_or(|now| now >= until);
        let gone = &self.gone;
        for (g, _) in self.crashed.extract_if(.., |g, until| !gone.contains(g) && due(*until)) {
            world.event("sim", Kind::GatewayRestarts, gateway_host(g));
            sim.bounce(gateway_host(g));
            for host in self.lost.remove(&g).unwrap_or_default() {
                if !self.partitioned.iter().any(|(p, pg, _)| *p == host && *pg == g) {
                    sim.repair(host.as_str(), gateway_host(g));
                }
            }
        }
        for (host, g, _) in self.partitioned.extract_if(.., |(_, _, until)| due(*until)) {
            // A link to a crashed gateway stays cut until it restarts.
            if !self.lost.get(&g).is_some_and(|hosts| hosts.contains(&host)) {
                world.event("sim", Kind::Repair, format!("{host} <-> {}", gateway_host(g)));
                sim.repair(host.as_str(), gateway_host(g));
            }
        }
    }

    /// The scripted faults that are due, then (every 100 ms) the random ones.
    pub fn inject(&mut self, sim: &mut turmoil::Sim<'_>, world: &World, now: Duration) {
        while self.script.last().is_some_and(|(at, _)| *at <= now) {
            match self.script.pop().map(|(_, fault)| fault) {
                Some(Scripted::Crash { gateway, down }) if !self.crashed.contains_key(&gateway) => {
                    self.crash(sim, world, gateway, now + down);
                }
                Some(Scripted::Stall { gateway, stall, lease_only }) => {
                    stall_store(world, gateway, now, stall, lease_only);
                }
                Some(Scripted::Shutdown { gateway }) => {
                    world.event("sim", Kind::GatewayShutsDown, gateway_host(gateway));
                    if let Some(stop) = crate::world::lock(&world.shutdowns).get(&gateway) {
                        let _ = stop.send(true);
                    }
                }
                _ => {}
            }
        }
        for gateway in world.take_crash_requests() {
            if !self.crashed.contains_key(&gateway) {
                let until = now + self.draw.millis(100, 3_000);
                self.crash(sim, world, gateway, until);
            }
        }
        if now < self.next_roll {
            return;
        }
        self.next_roll = now + Duration::from_millis(100);
        let per_roll = |per_minute: f64| per_minute / 600.0;
        let up: Vec<usize> = (0..self.gateways).filter(|g| !self.crashed.contains_key(g)).collect();
        if !up.is_empty()
            && self.draw.chance(per_roll(self.rates.gateway_crashes))
            && let Some(g) = self.target(world, &up)
        {
            let until = now + self.draw.millis(100, 3_000);
            self.crash(sim, world, g, until);
        }
        if self.draw.chance(per_roll(self.rates.partitions)) {
            self.partition(sim, world, now);
        }
        if self.rates.node_losses > 0.0 && self.draw.chance(per_roll(self.rates.node_losses)) {
            self.lose_node(sim, world, now);
        }
        if self.rates.store_stalls > 0.0 && self.draw.chance(per_roll(self.rates.store_stalls)) {
            let calm: Vec<usize> = (0..self.gateways).filter(|&g| world.stalled(g).until(true) <= now).collect();
            if let Some(g) = self.target(world, &calm) {
                // A node cut off from the store for long enough is fenced: its lease lapses, and
                // twice its time-to-live later the store places its sandboxes elsewhere.
                let ttls = if self.nodes > 1 { 6 } else { 3 };
                let mut stall = self.draw.millis(1_000, ttls * LEASE_TTL.as_millis() as u64);
                if self.nodes > 1 {
                    // Stalls that long end with the fault phase, not a whole liveness bound into
                    // the quiet one.
                    stall = stall.min(world.scenario.fault_phase.saturating_sub(now));
                }
                let lease_only = self.draw.chance(0.5);
                stall_store(world, g, now, stall, lease_only);
            }
        }
    }

    /// A node's host is lost, its runs with it, for longer than its lease and its fencing take,
    /// or (one at most, while two nodes are left) for good.
    fn lose_node(&mut self, sim: &mut turmoil::Sim<'_>, world: &World, now: Duration) {
        let up: Vec<usize> = (0..self.gateways).filter(|g| !self.crashed.contains_key(g)).collect();
        if up.len() < 2 {
            return;
        }
        let g = up[self.draw.below(up.len() as u64) as usize];
        // A node whose last renewal saw no other node live keeps its runs through a lapse and
        // is never fenced: lost for good, its sandboxes would wait for an operator. Only one
        // that renewed in company is lost so.
        let in_company = {
            let nodes = world.store.nodes().now_or_never().and_then(Result::ok).unwrap_or_default();
            let node = world.scenario.node_of(g);
            nodes.iter().any(|n| n.id.as_str() == node && n.offer.stops_when_lapsed)
        };
        let for_good = self.draw.chance(0.3) && self.gone.is_empty() && self.nodes > 2 && in_company;
        let until =
            if for_good { Duration::MAX } else { now + self.draw.millis(4_000, 8 * LEASE_TTL.as_millis() as u64) };
        let how = if for_good { "for good".to_string() } else { format!("for {} ms", (until - now).as_millis()) };
        world.event("sim", Kind::NodeLost, format!("{} {how}", world.scenario.node_of(g)));
        if for_good {
            self.gone.push(g);
        }
        self.crash(sim, world, g, until);
        crate::kernel::lose_node(world, &world.root_of(g));
        if for_good {
            // Its disk with it: nothing there is anyone's to remove any more.
            let _ = std::fs::remove_dir_all(world.root_of(g));
        }
    }

    /// The gateway a fault hits, among `candidates`: with one gateway, that one; with several,
    /// the holder of the node's lease (the one reconciling its runtime) three times in four,
    /// otherwise any.
    fn target(&mut self, world: &World, candidates: &[usize]) -> Option<usize> {
        if self.gateways == 1 {
            return candidates.first().copied();
        }
        // With a node per gateway, the one that matters is the reconcile lease's holder: it
        // fences the others.
        let lease = if self.nodes > 1 { RECONCILE_LEASE.to_string() } else { node_lease(NODE) };
        let holder =
            world.lease_holder(&lease).and_then(|h| candidates.iter().copied().find(|&g| gateway_host(g) == h));
        match holder {
            Some(holder) if self.draw.chance(0.75) => Some(holder),
            _ if candidates.is_empty() => None,
            _ => Some(candidates[self.draw.below(candidates.len() as u64) as usize]),
        }
    }

    /// Every host that talks to the gateways.
    fn peers(&self) -> Vec<String> {
        (0..self.clients).map(client_host).chain(["supervisors".to_string()]).collect()
    }

    /// The gateway's host is lost: its connections go silent (cut off before it goes down, so
    /// no goodbye reaches a peer) and the peers find out by their keepalives and timeouts. A
    /// crashed process would have its connections reset instead, but in an order tokio picks by
    /// task ids, which count across every run in a process: a seed would not replay.
    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, world: &World, gateway: usize, until: Duration) {
        world.event("sim", Kind::GatewayCrashes, gateway_host(gateway));
        let hosts = self.peers();
        for host in &hosts {
            sim.partition(host.as_str(), gateway_host(gateway));
        }
        sim.crash(gateway_host(gateway));
        self.lost.insert(gateway, hosts);
        self.crashed.insert(gateway, until);
    }

    /// Cuts the supervisors or a client (with several gateways, sometimes all of them) off from
    /// a gateway for a while.
    fn partition(&mut self, sim: &mut turmoil::Sim<'_>, world: &World, now: Duration) {
        let everyone = self.gateways > 1 && self.draw.chance(0.3);
        let hosts: Vec<String> = if everyone {
            self.peers()
        } else if self.draw.chance(0.5) {
            vec!["supervisors".to_string()]
        } else {
            vec![client_host(self.draw.below(self.clients as u64) as usize)]
        };
        let all: Vec<usize> = (0..self.gateways).collect();
        let Some(g) = self.target(world, &all) else { return };
        let hosts: Vec<String> =
            hosts.into_iter().filter(|h| !self.partitioned.iter().any(|(p, pg, _)| p == h && *pg == g)).collect();
        if hosts.is_empty() {
            return;
        }
        let until = now + self.draw.millis(300, 4_000);
        for host in hosts {
            world.event("sim", Kind::Partition, format!("{host} <-> {}", gateway_host(g)));
            sim.partition(host.as_str(), gateway_host(g));
            self.partitioned.push((host, g, until));
        }
    }
}

fn stall_store(world: &World, gateway: usize, now: Duration, stall: Duration, lease_only: bool) {
    let what = if lease_only { "lease calls" } else { "store calls" };
    world.event("sim", Kind::StoreStalls, format!("{}'s {what} for {} ms", gateway_host(gateway), stall.as_millis()));
    world.stall(gateway, now + stall, lease_only);
}
