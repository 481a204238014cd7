//! Prometheus metrics (`--metrics-listen`, off by default): what an operator watches. Labels
//! carry phases, transition kinds, driver operations and exec states only: never a sandbox's
//! name, a provider's or a credential's.
//!
//! Times are taken on tokio's clock, which the simulator drives: metrics are observed there too
//! and decide nothing.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use berth_core::{Intent, PhaseKind, SandboxId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapacityLabel {
    node: String,
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabel {
    from: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SnapshotLabel {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

fn latency() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The transition a phase begins, and the phase that ends it.
fn begun(phase: PhaseKind, before: Option<PhaseKind>) -> Option<(&'static str, PhaseKind)> {
    match (phase, before) {
        (PhaseKind::Provisioning, None) => Some(("create_to_ready", PhaseKind::Ready)),
        (PhaseKind::Starting, _) => Some(("start_to_ready", PhaseKind::Ready)),
        (PhaseKind::Stopping, _) => Some(("stop_to_stopped", PhaseKind::Stopped)),
        _ => None,
    }
}

pub struct Metrics {
    registry: Registry,
    sandboxes: Family<PhaseLabel, Gauge>,
    transitions: Family<TransitionLabel, Counter>,
    transition_seconds: Family<KindLabel, Histogram, fn() -> Histogram>,
    conflicts: Family<KindLabel, Counter>,
    gave_up: Family<KindLabel, Counter>,
    sweep_seconds: Histogram,
    driver_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    driver_errors: Family<OpLabel, Counter>,
    lease_held: Gauge,
    lease_term: Gauge,
    node_lease_held: Gauge,
    node_epoch: Gauge,
    nodes_live: Family<NodeLabel, Gauge>,
    nodes_draining: Family<NodeLabel, Gauge>,
    nodes_capacity: Family<CapacityLabel, Gauge>,
    nodes_placed: Family<CapacityLabel, Gauge>,
    nodes_free: Family<CapacityLabel, Gauge>,
    execs_admitted: Counter,
    execs_ended: Family<StateLabel, Counter>,
    execs_open: Gauge,
    egress: Family<VerdictLabel, Counter>,
    proxied: Family<CodeLabel, Counter>,
    proxied_bytes: Counter,
    proxy_upstream_errors: Family<KindLabel, Counter>,
    volumes: Family<PhaseLabel, Gauge>,
    volume_bytes: Gauge,
    snapshots: Family<SnapshotLabel, Counter>,
    snapshot_seconds: Family<KindLabel, Histogram, fn() -> Histogram>,
    /// Transitions under way: which, since when, and the phase that ends them.
    pending: Mutex<BTreeMap<SandboxId, (&'static str, Instant, PhaseKind)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("berth");
        let m = Self {
            sandboxes: Family::default(),
            transitions: Family::default(),
            transition_seconds: Family::new_with_constructor(latency),
            conflicts: Family::default(),
            gave_up: Family::default(),
            sweep_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            driver_seconds: Family::new_with_constructor(latency),
            driver_errors: Family::default(),
            lease_held: Gauge::default(),
            lease_term: Gauge::default(),
            node_lease_held: Gauge::default(),
            node_epoch: Gauge::default(),
            nodes_live: Family::default(),
            nodes_draining: Family::default(),
            nodes_capacity: Family::default(),
            nodes_placed: Family::default(),
            nodes_free: Family::default(),
            execs_admitted: Counter::default(),
            execs_ended: Family::default(),
            execs_open: Gauge::default(),
            egress: Family::default(),
            proxied: Family::default(),
            proxied_bytes: Counter::default(),
            proxy_upstream_errors: Family::default(),
            volumes: Family::default(),
            volume_bytes: Gauge::default(),
            snapshots: Family::default(),
            snapshot_seconds: Family::new_with_constructor(latency),
            pending: Mutex::default(),
            registry: Registry::default(),
        };
        registry.register("sandboxes", "Sandboxes in the store, by phase (read at each scrape)", m.sandboxes.clone());
        registry.register("phase_transitions", "Phase changes this gateway committed", m.transitions.clone());
        registry.register(
            "transition_seconds",
            "From a create, start, stop, pause or resume committed here to its phase (Ready, Stopped, Paused) committed here",
            m.transition_seconds.clone(),
        );
        registry.register(
            "write_conflicts",
            "Conditional writes that met a newer record, by what wrote",
            m.conflicts.clone(),
        );
        registry.register(
            "write_gave_up",
            "Writes given up after conflicting too often, by what wrote",
            m.gave_up.clone(),
        );
        registry.register(
            "reconcile_sweep_seconds",
            "One reconcile sweep of the store and the runtime",
            m.sweep_seconds.clone(),
        );
        registry.register("driver_call_seconds", "Runtime driver calls, by operation", m.driver_seconds.clone());
        registry.register("driver_errors", "Runtime driver calls that failed, by operation", m.driver_errors.clone());
        registry.register("lease_held", "1 while this gateway holds the reconcile lease", m.lease_held.clone());
        registry.register("node_lease_held", "1 while this gateway holds its node's lease", m.node_lease_held.clone());
        registry.register(
            "node_epoch",
            "The epoch of its node's lease this gateway holds (0 while it holds none)",
            m.node_epoch.clone(),
        );
        registry.register(
            "node_live",
            "1 while the node's lease is held by the store's clock, by node (read at each scrape)",
            m.nodes_live.clone(),
        );
        registry.register(
            "node_draining",
            "1 while the node is drained, by node (read at each scrape)",
            m.nodes_draining.clone(),
        );
        registry.register(
            "node_capacity",
            "What the node offers, by node and resource: cpu_millis, memory_bytes, sandboxes (read at each scrape)",
            m.nodes_capacity.clone(),
        );
        registry.register(
            "node_placed",
            "What the sandboxes placed on the node and not stopped reserve, by node and resource (read at each scrape)",
            m.nodes_placed.clone(),
        );
        registry.register(
            "node_free",
            "What placement may still give the node, by node and resource it counts (read at each scrape)",
            m.nodes_free.clone(),
        );
        registry.register(
            "lease_term",
            "The term of the reconcile lease this gateway holds (0 while it holds none)",
            m.lease_term.clone(),
        );
        registry.register("execs_admitted", "Execs admitted here", m.execs_admitted.clone());
        registry.register("execs_ended", "Execs this gateway ended, by how", m.execs_ended.clone());
        registry.register(
            "execs_open",
            "Execs not yet ended, in the store (read at each scrape)",
            m.execs_open.clone(),
        );
        registry.register(
            "egress_connections",
            "Connections sandboxes asked the egress proxy here for, by verdict (allowed, denied)",
            m.egress.clone(),
        );
        registry.register(
            "proxied_requests",
            "Requests the preview proxy here answered, by HTTP status (the run's, or the proxy's own refusal)",
            m.proxied.clone(),
        );
        registry.register(
            "proxied_bytes",
            "Bytes the preview proxy here carried from runs to clients (response bodies and upgraded streams)",
            m.proxied_bytes.clone(),
        );
        registry.register(
            "proxy_upstream_errors",
            "Requests the preview proxy here could not carry to the run, by kind: refused (nothing listens on the port, or the run did not answer), unconnected (no gateway holds the run's session), broken (the run's answer was not HTTP)",
            m.proxy_upstream_errors.clone(),
        );
        registry.register("volumes", "Volumes in the store, by phase (read at each scrape)", m.volumes.clone());
        registry.register(
            "volume_bytes",
            "Bytes the files of the store's Ready volumes hold, measured on the runtime at each scrape",
            m.volume_bytes.clone(),
        );
        registry.register(
            "snapshots",
            "Snapshots and forks whose copy this gateway recorded, by kind (snapshot, fork) and outcome (ready, error)",
            m.snapshots.clone(),
        );
        registry.register(
            "snapshot_seconds",
            "From a snapshot or fork asked for to its copy made (a fork's sandboxes then made), on the store's clock",
            m.snapshot_seconds.clone(),
        );
        Self { registry, ..m }
    }
}

/// Serves `GET /metrics` on `listener` (with the public API's bearer token) until `stop`.
pub async fn serve(
    engine: crate::engine::Engine,
    listener: crate::tcp::Listener,
    auth: crate::api::auth::BearerAuth,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::{HeaderMap, StatusCode, header};
    let scrape = move |headers: HeaderMap| async move {
        let authorized = headers.get(header::AUTHORIZATION).is_some_and(|v| auth.accepts(v.as_bytes()));
        if !authorized {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::CONTENT_TYPE, "text/plain")],
                "a bearer token is required\n".to_string(),
            );
        }
        match engine.scrape().await {
            Ok(text) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                text,
            ),
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "text/plain")], format!("{e}\n")),
        }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(scrape));
    axum::serve(listener, app).with_graceful_shutdown(stop).await
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    /// A phase change of `id` committed here.
    pub fn phase_changed(&self, id: &SandboxId, old: Option<PhaseKind>, new: Option<PhaseKind>) {
        let name = |p: Option<PhaseKind>| p.map_or_else(|| "Gone".to_string(), |p| p.to_string());
        self.transitions.get_or_create(&TransitionLabel { from: name(old), to: name(new) }).inc();
        let mut pending = lock(&self.pending);
        let Some(new) = new else {
            pending.remove(id);
            return;
        };
        if let Some((kind, since, until)) = pending.get(id).copied()
            && until == new
        {
            self.transition_seconds
                .get_or_create(&KindLabel { kind: kind.to_string() })
                .observe(since.elapsed().as_secs_f64());
            pending.remove(id);
        }
        match begun(new, old) {
            Some((kind, until)) => {
                pending.insert(id.clone(), (kind, Instant::now(), until));
            }
            None if matches!(new, PhaseKind::Error | PhaseKind::Deleting) => {
                pending.remove(id);
            }
            None => {}
        }
    }

    /// An intent change of `id` committed here: a pause (a resume) is timed from its commit to
    /// the phase that confirms it, Paused (Ready), committed here.
    pub fn intent_changed(&self, id: &SandboxId, old: Intent, new: Intent) {
        let timed = match (old, new) {
            (Intent::Running, Intent::Paused) => ("pause_to_paused", PhaseKind::Paused),
            (Intent::Paused, Intent::Running) => ("resume_to_ready", PhaseKind::Ready),
            _ => return,
        };
        lock(&self.pending).insert(id.clone(), (timed.0, Instant::now(), timed.1));
    }

    /// An egress connection decided here (`allowed`: by the run's policy).
    pub fn egress(&self, allowed: bool) {
        self.egress.get_or_create(&VerdictLabel { verdict: if allowed { "allowed" } else { "denied" } }).inc();
    }

    /// A request the preview proxy answered with `code`.
    pub fn proxied(&self, code: u16) {
        self.proxied.get_or_create(&CodeLabel { code }).inc();
    }

    pub fn proxied_bytes(&self, bytes: u64) {
        self.proxied_bytes.inc_by(bytes);
    }

    /// A request the proxy could not carry to the run: `kind` says why (see the metric's help).
    pub fn proxy_upstream_error(&self, kind: &str) {
        self.proxy_upstream_errors.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
    }

    pub fn conflict(&self, what: &str) {
        self.conflicts.get_or_create(&KindLabel { kind: what.to_string() }).inc();
    }

    pub fn gave_up(&self, what: &str) {
        self.gave_up.get_or_create(&KindLabel { kind: what.to_string() }).inc();
    }

    pub fn swept(&self, took: Duration) {
        self.sweep_seconds.observe(took.as_secs_f64());
    }

    /// A snapshot's copy recorded here, `took` after it was asked for.
    pub fn snapshot_settled(&self, fork: bool, ready: bool, took: Duration) {
        let kind = if fork { "fork" } else { "snapshot" };
        let outcome = if ready { "ready" } else { "error" };
        self.snapshots.get_or_create(&SnapshotLabel { kind, outcome }).inc();
        if ready {
            self.snapshot_seconds.get_or_create(&KindLabel { kind: kind.to_string() }).observe(took.as_secs_f64());
        }
    }

    pub fn driver_call(&self, op: &str, took: Duration, failed: bool) {
        let label = OpLabel { op: op.to_string() };
        self.driver_seconds.get_or_create(&label).observe(took.as_secs_f64());
        if failed {
            self.driver_errors.get_or_create(&label).inc();
        }
    }

    pub fn lease(&self, held: bool, term: u64) {
        self.lease_held.set(i64::from(held));
        self.lease_term.set(i64::try_from(term).unwrap_or(i64::MAX));
    }

    /// The node's lease this gateway holds, in which epoch (`None`: not held).
    pub fn node_lease(&self, epoch: Option<u64>) {
        self.node_lease_held.set(i64::from(epoch.is_some()));
        self.node_epoch.set(epoch.map_or(0, |e| i64::try_from(e).unwrap_or(i64::MAX)));
    }

    pub fn exec_admitted(&self) {
        self.execs_admitted.inc();
    }

    pub fn exec_ended(&self, state: &str) {
        self.execs_ended.get_or_create(&StateLabel { state: state.to_string() }).inc();
    }

    /// The text exposition, with the store's counts as `phases`, `open_execs`, `volumes` and
    /// `nodes` say now, and `volume_bytes` as the runtime measured them.
    pub fn render(
        &self,
        phases: &BTreeMap<PhaseKind, i64>,
        open_execs: usize,
        volumes: &[berth_core::Volume],
        volume_bytes: u64,
        nodes: &[berth_core::placement::Node],
    ) -> String {
        // A node no longer registered drops out of the exposition.
        self.nodes_live.clear();
        self.nodes_draining.clear();
        self.nodes_capacity.clear();
        self.nodes_placed.clear();
        self.nodes_free.clear();
        for node in nodes {
            let label = NodeLabel { node: node.id.to_string() };
            self.nodes_live.get_or_create(&label).set(i64::from(node.live));
            self.nodes_draining.get_or_create(&label).set(i64::from(node.draining));
            let (capacity, placed) = (node.capacity, node.placed);
            for (resource, offered, reserved) in [
                ("cpu_millis", capacity.cpu_millis, placed.cpu_millis),
                ("memory_bytes", capacity.memory_bytes, placed.memory_bytes),
                ("sandboxes", capacity.sandboxes, placed.sandboxes),
            ] {
                let label = CapacityLabel { node: node.id.to_string(), resource };
                let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                self.nodes_capacity.get_or_create(&label).set(gauge(offered));
                self.nodes_placed.get_or_create(&label).set(gauge(reserved));
                // A resource the node does not count (offered as 0) has nothing to run out of.
                if offered > 0 || resource == "sandboxes" {
                    self.nodes_free.get_or_create(&label).set(gauge(offered.saturating_sub(reserved)));
                }
            }
        }
        self.volume_bytes.set(i64::try_from(volume_bytes).unwrap_or(i64::MAX));
        for phase in PhaseKind::ALL {
            let n = phases.get(&phase).copied().unwrap_or(0);
            self.sandboxes.get_or_create(&PhaseLabel { phase: phase.to_string() }).set(n);
        }
        for phase in [berth_core::VolumePhase::Ready, berth_core::VolumePhase::Deleting] {
            let n = volumes.iter().filter(|v| v.phase == phase).count();
            self.volumes
                .get_or_create(&PhaseLabel { phase: format!("{phase:?}") })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.execs_open.set(i64::try_from(open_execs).unwrap_or(i64::MAX));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_start_is_timed_from_starting_to_ready_and_nothing_names_a_sandbox() {
        let m = Metrics::default();
        let id = SandboxId::new("sb-secret-name");
        m.phase_changed(&id, Some(PhaseKind::Stopped), Some(PhaseKind::Starting));
        tokio::time::sleep(Duration::from_millis(30)).await;
        m.phase_changed(&id, Some(PhaseKind::Starting), Some(PhaseKind::Ready));
        m.phase_changed(&id, Some(PhaseKind::Ready), Some(PhaseKind::Stopping));
        m.phase_changed(&id, Some(PhaseKind::Stopping), Some(PhaseKind::Error));
        let text = m.render(&BTreeMap::from([(PhaseKind::Ready, 2)]), 1, &[], 0, &[]);
        assert!(text.contains("berth_transition_seconds_count{kind=\"start_to_ready\"} 1"), "{text}");
        let sum = text
            .lines()
            .find_map(|l| l.strip_prefix("berth_transition_seconds_sum{kind=\"start_to_ready\"} "))
            .and_then(|v| v.parse::<f64>().ok());
        assert!(sum.is_some_and(|s| (0.03..1.0).contains(&s)), "{text}");
        assert!(!text.contains("stop_to_stopped\"} 1"), "a stop that ended in Error is no stop_to_stopped: {text}");
        assert!(
            text.contains("berth_sandboxes{phase=\"Ready\"} 2") && text.contains("berth_sandboxes{phase=\"Error\"} 0")
        );
        assert!(text.contains("berth_execs_open 1"));
        // A pause is timed from its commit (no phase change) to Paused, a resume to Ready.
        let other = SandboxId::new("sb-other");
        m.intent_changed(&other, Intent::Running, Intent::Paused);
        m.phase_changed(&other, Some(PhaseKind::Ready), Some(PhaseKind::Paused));
        m.intent_changed(&other, Intent::Paused, Intent::Running);
        m.phase_changed(&other, Some(PhaseKind::Paused), Some(PhaseKind::Ready));
        let text = m.render(&BTreeMap::new(), 0, &[], 0, &[]);
        assert!(text.contains("berth_transition_seconds_count{kind=\"pause_to_paused\"} 1"), "{text}");
        assert!(text.contains("berth_transition_seconds_count{kind=\"resume_to_ready\"} 1"), "{text}");
        assert!(!text.contains("sb-secret-name"));
    }

    #[test]
    fn the_proxys_answers_bytes_and_failures_and_the_volumes_are_counted() {
        let m = Metrics::default();
        for code in [200, 502, 502, 410] {
            m.proxied(code);
        }
        m.proxied_bytes(1024);
        m.proxied_bytes(1);
        m.proxy_upstream_error("refused");
        let volume = |name: &str, phase| berth_core::Volume {
            name: name.into(),
            id: berth_core::VolumeId::new(format!("vol-{name}")),
            phase,
            resource_version: 1,
            created_at: berth_core::Timestamp::from_unix_millis(0),
            updated_at: berth_core::Timestamp::from_unix_millis(0),
        };
        let volumes = [
            volume("a", berth_core::VolumePhase::Ready),
            volume("b", berth_core::VolumePhase::Ready),
            volume("c", berth_core::VolumePhase::Deleting),
        ];
        let node = |id: &str, live: bool, draining: bool| berth_core::placement::Node {
            id: berth_core::NodeId::new(id),
            epoch: 3,
            live,
            draining,
            labels: BTreeMap::new(),
            capacity: berth_core::placement::Capacity { cpu_millis: 2000, memory_bytes: 0, sandboxes: 40 },
            placed: berth_core::placement::Capacity { cpu_millis: 500, memory_bytes: 1 << 20, sandboxes: 3 },
        };
        // A node registered at one scrape and gone at the next drops out.
        let text = m.render(&BTreeMap::new(), 0, &[], 0, &[node("gone", true, false)]);
        assert!(text.contains("berth_node_live{node=\"gone\"} 1"), "{text}");
        let nodes = [node("n1", true, false), node("n2", false, true)];
        let text = m.render(&BTreeMap::new(), 0, &volumes, 4096, &nodes);
        assert!(!text.contains("gone"), "{text}");
        // Memory is not counted on these nodes: nothing is free of it to say.
        assert!(!text.contains("berth_node_free{node=\"n1\",resource=\"memory_bytes\"}"), "{text}");
        for line in [
            "berth_node_live{node=\"n1\"} 1",
            "berth_node_live{node=\"n2\"} 0",
            "berth_node_draining{node=\"n2\"} 1",
            "berth_node_capacity{node=\"n1\",resource=\"sandboxes\"} 40",
            "berth_node_capacity{node=\"n1\",resource=\"cpu_millis\"} 2000",
            "berth_node_placed{node=\"n1\",resource=\"sandboxes\"} 3",
            "berth_node_placed{node=\"n1\",resource=\"memory_bytes\"} 1048576",
            "berth_node_free{node=\"n1\",resource=\"sandboxes\"} 37",
            "berth_node_free{node=\"n1\",resource=\"cpu_millis\"} 1500",
            "berth_proxied_requests_total{code=\"502\"} 2",
            "berth_proxied_requests_total{code=\"410\"} 1",
            "berth_proxied_bytes_total 1025",
            "berth_proxy_upstream_errors_total{kind=\"refused\"} 1",
            "berth_volumes{phase=\"Ready\"} 2",
            "berth_volumes{phase=\"Deleting\"} 1",
            "berth_volume_bytes 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }
}
