//! One seed derives everything about a run: sizes, timings, and which faults it injects and how
//! often (swarm testing: each seed turns a random subset of faults on, so rare combinations
//! get seeds of their own).

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use serde::Serialize;

/// Every consumer of a seed's randomness, each with a stream of its own: two consumers drawing
/// from one stream would move in lockstep (the same draws deciding both), which narrows what
/// the seeds explore, and a change to one would shift the other. A consumer added later gets a
/// new stream, so the draws of the others stay what they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    /// The first fault rates.
    Faults,
    /// Timings: starts, stops, event delays, polls, store latency, re-drives.
    Timings,
    /// The runtime model: the engine's and the kernel's answers, faults on calls, workloads.
    Runtime,
    /// The fault injector's schedule.
    Injector,
    /// The store's latencies.
    Store,
    /// The faults aimed at the lease holder, with several gateways.
    LeaseFaults,
    /// Fault rates added later (restarts, failed calls, lingering volumes, the page size, late
    /// store replies).
    LaterFaults,
    /// The driver.
    Driver,
    /// The rate of gateway crashes right after a driver's effect.
    EffectCrashes,
    /// The rate of out-of-band restarts with the exec workload.
    ExecRestarts,
    /// The rate of commands that cannot be started.
    Unstartable,
    /// Whether the seed is focused, and on what.
    Focus,
    /// The state workload's fault rates.
    State,
    /// The faults of the many-hosts mode: node losses.
    Nodes,
    /// How far each gateway's reading of the store's clock is off.
    ClockSkew,
    /// Client `i`'s operations (`i < 100`).
    Client(usize),
    /// The exec client's operations.
    ExecClient,
    /// The lifetime and restart policy of the fleet's sandbox `i` (`i < 100`).
    Policy(u64),
    /// The egress workload of one run, named by a hash of its sandbox and generation.
    Egress(u64),
}

impl Stream {
    /// The ChaCha stream: the numbers each stream had before they were named, so every seed
    /// draws as it did, and disjoint ranges for the indexed families.
    pub fn number(self) -> u64 {
        match self {
            Stream::Faults => 0,
            Stream::Timings => 1,
            Stream::Runtime => 2,
            Stream::Injector => 3,
            Stream::Store => 4,
            Stream::LeaseFaults => 5,
            Stream::LaterFaults => 6,
            Stream::Driver => 7,
            Stream::EffectCrashes => 8,
            Stream::ExecRestarts => 9,
            Stream::Unstartable => 10,
            Stream::Focus => 11,
            Stream::State => 12,
            Stream::Nodes => 13,
            Stream::ClockSkew => 14,
            Stream::Client(i) => {
                assert!(i < 100, "client {i} would share the exec client's stream");
                100 + i as u64
            }
            Stream::ExecClient => 200,
            Stream::Policy(i) => {
                assert!(i < 100, "sandbox {i}'s policy would share another stream");
                300 + i
            }
            // The top bit set: above every other stream, whatever the hash.
            Stream::Egress(run) => (1 << 63) | run,
        }
    }
}

/// Deterministic draws from the seed.
pub struct Draw(ChaCha8Rng);

impl Draw {
    pub fn new(seed: u64, stream: Stream) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream.number());
        Self(rng)
    }

    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, n)`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.u64() % n }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }

    /// A fault's rate: with probability `on`, uniform in `[low, high]`; otherwise 0 (off).
    pub fn rate(&mut self, on: f64, low: f64, high: f64) -> f64 {
        if self.chance(on) { low + (high - low) * (self.below(1000) as f64 / 1000.0) } else { 0.0 }
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The faults one run injects, each with its rate (0 = off).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Faults {
    /// Gateway crashes (then restarts) per minute.
    pub gateway_crashes: f64,
    /// Client–gateway and supervisor–gateway partitions per minute.
    pub partitions: f64,
    /// Probability that a driver call's effect happens but its reply is lost.
    pub lost_replies: f64,
    /// Probability that a driver call answers too late (the driver times out; the effect happened).
    pub slow_replies: f64,
    /// Probability that a watch event is delivered late (and so maybe out of order).
    pub late_events: f64,
    pub duplicate_events: f64,
    pub dropped_events: f64,
    /// Watch stream disconnects per minute.
    pub watch_disconnects: f64,
    /// Out-of-band container removals per minute.
    pub removals: f64,
    /// Out-of-band kills of a running sandbox per minute.
    pub kills: f64,
    /// Workloads exiting by themselves per minute.
    pub workload_exits: f64,
    /// Supervisors of ended runs reconnecting with their old tokens, per minute.
    pub stale_supervisors: f64,
    /// Out-of-band restarts of a container per minute (`docker restart`): its run ends and a
    /// new one starts with the token its state directory holds then.
    pub restarts: f64,
    /// Probability that a runtime call fails before its effect.
    pub failed_calls: f64,
    /// Probability that a run's command cannot be started (a missing or unexecutable program,
    /// as `exec` finds it): its supervisor says so in its hello, records exit 127 and exits.
    pub unstartable_commands: f64,
    /// Probability that a removed volume stays listed a moment longer.
    pub lingering_volumes: f64,
    /// Probability that the store holds a reply back (up to half a lease time-to-live) after
    /// it did what was asked.
    pub late_store_replies: f64,
    /// Probability that a gateway dies right after a runtime call of its driver took effect,
    /// before it hears back: a spawn, or an engine's create, start, stop or remove. Its driver's
    /// bookkeeping is then left between two steps.
    pub crashes_after_effects: f64,
    /// With several gateways: stalls of one gateway's store connection per minute (its calls
    /// and replies held for up to a few lease time-to-lives, as a hung database connection holds
    /// them), aimed at the lease holder.
    pub store_stalls: f64,
    /// With the state workload: paused runs lost per minute, every process killed as a host
    /// reboot kills them (a freezer does not survive its host, DESIGN 12.1).
    pub paused_runs_lost: f64,
    /// With several nodes: nodes lost per minute, their gateway and every run they hold gone
    /// at once, for longer than their lease and its fencing take (a host lost); some never
    /// come back.
    pub node_losses: f64,
}

/// What a focused seed raises together: fault combinations that reach core's rarest decisions
/// (those `explore` lists as never reached), which independent draws give too few seeds. A
/// quarter of the seeds are focused, half on each, so the swarm leans towards them and still
/// explores everywhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Focus {
    /// Starts cut short by a gateway's crash, their runs removed or restarted out of band and
    /// their replies lost or late, then re-driven: a start gate's report of a run gone, a start
    /// reply gone, a start that failed after its run began.
    Redrive,
    /// Runs that end by themselves while their supervisors are cut off: the runtime's exit, and
    /// its memory verdict, arriving before the supervisor's report or instead of it.
    Exits,
}

impl Focus {
    /// Raises `faults`' rates for this focus (never lowers one the seed drew higher).
    fn raise(self, faults: &mut Faults, d: &mut Draw) {
        let mut at_least = |rate: &mut f64, low: f64, high: f64| *rate = rate.max(d.rate(1.0, low, high));
        match self {
            Focus::Redrive => {
                at_least(&mut faults.crashes_after_effects, 0.15, 0.3);
                at_least(&mut faults.removals, 2.0, 4.0);
                at_least(&mut faults.restarts, 1.0, 3.0);
                at_least(&mut faults.lost_replies, 0.1, 0.2);
                at_least(&mut faults.late_store_replies, 0.05, 0.1);
            }
            Focus::Exits => {
                at_least(&mut faults.workload_exits, 4.0, 8.0);
                at_least(&mut faults.partitions, 4.0, 8.0);
                at_least(&mut faults.kills, 1.0, 3.0);
            }
        }
    }
}

/// Which real driver the gateways run over the simulated runtime host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DriverKind {
    /// The container driver over the simulated engine.
    Container,
    /// The process driver over the simulated kernel.
    Process,
}

#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub seed: u64,
    pub driver: DriverKind,
    pub sandboxes: usize,
    pub providers: usize,
    pub clients: usize,
    pub fault_phase: Duration,
    pub quiet_phase: Duration,
    /// How long the runtime's multi-step start takes; polls inside it still see the old exit.
    pub start_duration: (Duration, Duration),
    pub stop_duration: (Duration, Duration),
    /// How late a late watch event can be.
    pub event_delay: Duration,
    pub poll_interval: Duration,
    /// The longest a store read or commit takes: the window in which writers race.
    pub store_latency: Duration,
    pub redrive_after: Duration,
    /// How many sandboxes a reconcile sweep asks the driver for at once: a sweep spans pages.
    pub page_size: usize,
    /// Gateways sharing the store (the multi-gateway mode when more than one).
    pub gateways: usize,
    /// Nodes: with one, every gateway is the one node of the runtime's host; with more (the
    /// many-hosts mode, DESIGN 14), each gateway is a node of its own, with a process driver
    /// keeping its sandboxes in a directory of its own on the simulated kernel, as two nodes on
    /// one machine are.
    pub nodes: usize,
    pub faults: Faults,
    /// What the seed's fault mix leans towards, if it is focused.
    pub focus: Option<Focus>,
    /// Faults at fixed times, on top of the random ones: `(when, what)`.
    pub script: Vec<(Duration, crate::faults::Scripted)>,
    /// The exec workload runs too (`--execs`): a client running, retrying, attaching to and
    /// cancelling execs, checked by E1-E4.
    pub execs: bool,
    /// The lifetime workload runs too (`--lifetimes`): sandboxes with deadlines and restart
    /// policies, renews racing expiries, checked by T1 and by I8 under each policy.
    pub lifetimes: bool,
    /// The egress workload runs too (`--egress`): every run asks for its providers' endpoints
    /// through the egress proxy while they are attached and detached, checked by G1.
    pub egress: bool,
    /// The state workload runs too (`--state`): clients pause and resume sandboxes (DESIGN
    /// 12.1) among every other call, and idle timeouts may pause; checked by S3.
    pub state: bool,
    /// The snapshot workload runs too (`--snapshots`): clients take, delete and make sandboxes
    /// from snapshots, and fork sandboxes (DESIGN 12.2, 12.3), while runs write files; checked
    /// by S1, S2 and S4.
    pub snapshots: bool,
    /// The volume workload runs too (`--volumes`): clients make and delete volumes and
    /// sandboxes that mount them, deleting a sandbox and then its volume without waiting
    /// (DESIGN 13.2); checked by S2.
    pub volumes: bool,
    /// The port workload runs too (`--ports`): clients ask for a port's URL and use its token
    /// through the gateway's preview proxy while others stop and start the sandbox (DESIGN
    /// 13.1); checked by U1.
    pub ports: bool,
    /// How far off, either way, each gateway's reading of the store's clock may be (`--clock-skew`):
    /// a gateway decides on its own reading, as a gateway whose host's clock stepped since it
    /// measured the database's does; the store keeps its own.
    pub clock_skew: Duration,
}

impl Scenario {
    /// DESIGN 7's standard scenario, with this seed's timings and fault mix.
    pub fn standard(seed: u64) -> Self {
        Self::with_phases(seed, Duration::from_secs(60), Duration::from_secs(30))
    }

    pub fn with_phases(seed: u64, fault_phase: Duration, quiet_phase: Duration) -> Self {
        let mut d = Draw::new(seed, Stream::Faults);
        let mut rate = |on, low, high| d.rate(on, low, high);
        let faults = Faults {
            gateway_crashes: rate(0.4, 0.5, 3.0),
            partitions: rate(0.4, 0.5, 3.0),
            lost_replies: rate(0.5, 0.02, 0.15),
            slow_replies: rate(0.3, 0.02, 0.1),
            late_events: rate(0.6, 0.05, 0.4),
            duplicate_events: rate(0.5, 0.05, 0.3),
            dropped_events: rate(0.4, 0.05, 0.3),
            watch_disconnects: rate(0.5, 1.0, 6.0),
            removals: rate(0.3, 0.5, 2.0),
            kills: rate(0.4, 0.5, 3.0),
            workload_exits: rate(0.4, 0.5, 3.0),
            stale_supervisors: rate(0.5, 1.0, 6.0),
            store_stalls: 0.0,
            ..Faults::default()
        };
        // Faults added later draw from a stream of their own, so the earlier draws of a seed
        // stay what they were.
        let mut later = Draw::new(seed, Stream::LaterFaults);
        let faults = Faults {
            restarts: later.rate(0.3, 0.5, 2.0),
            failed_calls: later.rate(0.4, 0.02, 0.1),
            lingering_volumes: later.rate(0.4, 0.1, 0.5),
            ..faults
        };
        let page_size = later.pick(&[1, 2, 3, 4, 8, 16]);
        let faults = Faults { late_store_replies: later.rate(0.5, 0.02, 0.1), ..faults };
        let faults =
            Faults { crashes_after_effects: Draw::new(seed, Stream::EffectCrashes).rate(0.4, 0.02, 0.15), ..faults };
        let mut faults =
            Faults { unstartable_commands: Draw::new(seed, Stream::Unstartable).rate(0.3, 0.02, 0.1), ..faults };
        let mut f = Draw::new(seed, Stream::Focus);
        let focus = f.chance(0.25).then(|| f.pick(&[Focus::Redrive, Focus::Exits]));
        if let Some(focus) = focus {
            focus.raise(&mut faults, &mut f);
        }
        let driver = Draw::new(seed, Stream::Driver).pick(&[DriverKind::Container, DriverKind::Process]);
        let mut d = Draw::new(seed, Stream::Timings);
        let start_max = d.millis(50, 2_000);
        Self {
            seed,
            driver,
            sandboxes: 8,
            providers: 2,
            clients: 4,
            fault_phase,
            quiet_phase,
            start_duration: (start_max / 4, start_max),
            stop_duration: (Duration::from_millis(10), d.millis(20, 800)),
            event_delay: d.millis(50, 3_000),
            poll_interval: Duration::from_millis(d.pick(&[50, 100, 250, 500, 1_000, 2_000])),
            store_latency: d.millis(1, 8),
            redrive_after: d.millis(1_000, 4_000),
            gateways: 1,
            nodes: 1,
            page_size,
            faults,
            focus,
            script: Vec::new(),
            execs: false,
            lifetimes: false,
            egress: false,
            state: false,
            snapshots: false,
            volumes: false,
            ports: false,
            clock_skew: Duration::ZERO,
        }
    }

    /// The state workload, with losses of paused runs drawn from a stream of their own (the
    /// other draws of a seed stay what they were).
    pub fn with_state(mut self, state: bool) -> Self {
        self.state = state;
        if state {
            self.faults.paused_runs_lost = Draw::new(self.seed, Stream::State).rate(0.7, 1.0, 4.0);
        }
        self
    }

    pub fn with_snapshots(mut self, snapshots: bool) -> Self {
        self.snapshots = snapshots;
        self
    }

    pub fn with_volumes(mut self, volumes: bool) -> Self {
        self.volumes = volumes;
        self
    }

    pub fn with_ports(mut self, ports: bool) -> Self {
        self.ports = ports;
        self
    }

    pub fn with_egress(mut self, egress: bool) -> Self {
        self.egress = egress;
        self
    }

    pub fn with_lifetimes(mut self, lifetimes: bool) -> Self {
        self.lifetimes = lifetimes;
        self
    }

    /// The exec workload. An exec open across an out-of-band restart of its run is where an
    /// exec can run twice (E1), so with execs the restarts are on in most seeds, drawn from a
    /// stream of their own (the other draws of a seed stay what they were).
    pub fn with_execs(mut self, execs: bool) -> Self {
        self.execs = execs;
        if execs {
            let restarts = Draw::new(self.seed, Stream::ExecRestarts).rate(0.7, 0.5, 2.0);
            self.faults.restarts = self.faults.restarts.max(restarts);
        }
        self
    }

    /// The multi-gateway mode: `gateways` gateways on the shared store, with the faults aimed at
    /// the lease holder drawn from a stream of their own (so the one-gateway draws of a seed
    /// stay what they were).
    pub fn with_gateways(mut self, gateways: usize) -> Self {
        self.gateways = gateways.max(1);
        if self.gateways > 1 {
            let mut d = Draw::new(self.seed, Stream::LeaseFaults);
            self.faults.gateway_crashes = d.rate(0.7, 0.5, 4.0);
            self.faults.partitions = d.rate(0.6, 0.5, 4.0);
            self.faults.store_stalls = d.rate(0.6, 0.5, 3.0);
        }
        self
    }

    /// The many-hosts mode (DESIGN 14): `nodes` gateways, each a node of its own on the
    /// process driver, with the several-gateway faults and node losses, drawn from streams of
    /// their own. The container driver is not run so: two nodes never share a container engine.
    pub fn with_nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes.max(1);
        if self.nodes > 1 {
            let nodes = self.nodes;
            self = self.with_gateways(nodes);
            self.driver = DriverKind::Process;
            self.faults.node_losses = Draw::new(self.seed, Stream::Nodes).rate(0.8, 0.5, 2.0);
        }
        self
    }

    pub fn with_clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// How far gateway `gateway`'s reading of the store's clock is off, in milliseconds: drawn
    /// from the seed within `clock_skew`, either way, and the same across its restarts (its
    /// host's clock, not its process's).
    pub fn skew_of(&self, gateway: usize) -> i64 {
        let max = self.clock_skew.as_millis() as u64;
        if max == 0 {
            return 0;
        }
        let mut d = Draw::new(self.seed, Stream::ClockSkew);
        let drawn = (0..=gateway).map(|_| d.below(2 * max + 1)).last().unwrap_or(max);
        drawn as i64 - max as i64
    }

    /// The node gateway `gateway` runs as.
    pub fn node_of(&self, gateway: usize) -> String {
        if self.nodes > 1 { format!("node-{gateway}") } else { crate::gateway::NODE.to_string() }
    }

    pub fn total(&self) -> Duration {
        self.fault_phase + self.quiet_phase
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// No two consumers share a stream: every stream a run can name (each client and each
    /// fleet sandbox's policy up to its family's bound, and runs' egress streams at the hash's
    /// extremes) has a number of its own, and draws differently from every other.
    #[test]
    fn every_consumer_draws_from_a_stream_of_its_own() {
        let mut streams = vec![
            Stream::Faults,
            Stream::Timings,
            Stream::Runtime,
            Stream::Injector,
            Stream::Store,
            Stream::LeaseFaults,
            Stream::LaterFaults,
            Stream::Driver,
            Stream::EffectCrashes,
            Stream::ExecRestarts,
            Stream::Unstartable,
            Stream::Focus,
            Stream::State,
            Stream::Nodes,
            Stream::ExecClient,
        ];
        streams.extend((0..100).map(Stream::Client));
        streams.extend((0..100).map(Stream::Policy));
        streams.extend([0, 1, 300, u64::MAX >> 1].map(Stream::Egress));
        let mut numbers = BTreeMap::new();
        for stream in &streams {
            if let Some(other) = numbers.insert(stream.number(), *stream) {
                panic!("{stream:?} and {other:?} share stream {}", stream.number());
            }
        }
        let first: BTreeMap<u64, Stream> = streams.iter().map(|s| (Draw::new(42, *s).u64(), *s)).collect();
        assert_eq!(first.len(), streams.len(), "two streams drew the same first number");
    }

    /// The collision this naming removed: the exec client drew from sandbox sb0's policy stream.
    #[test]
    fn the_exec_client_and_the_first_policy_are_apart() {
        assert_ne!(Stream::ExecClient.number(), Stream::Policy(0).number());
    }
}
