//! Between the wire and berth-core. Secrets go one way only: in.

use std::time::Duration;

use berth_core::lifetime::{Lifetime, OnExpiry};
use berth_core::limits::ResourceLimits;
use berth_core::restart::{RestartMode, RestartPolicy};
use berth_core::{Failure, Intent, Phase, Provider, Sandbox, SandboxSpec, Secret, Timestamp};
use berth_proto::v1 as pb;

/// A spec from the wire. The core checks what a spec may hold; here only what the wire's types
/// can say and the core's cannot (a negative duration).
pub fn spec_from_wire(spec: pb::SandboxSpec) -> Result<SandboxSpec, berth_core::Error> {
    let lifetime = spec.lifetime.unwrap_or_default();
    let on_expiry = on_expiry_from_wire("spec.lifetime.on_expiry", lifetime.on_expiry)?;
    let on_idle = lifetime.on_idle.map(|v| on_expiry_from_wire("spec.lifetime.on_idle", v)).transpose()?;
    let restart = spec.restart.unwrap_or_default();
    let mode = match pb::RestartMode::try_from(restart.mode) {
        Ok(pb::RestartMode::Unspecified | pb::RestartMode::Never) => RestartMode::Never,
        Ok(pb::RestartMode::OnFailure) => RestartMode::OnFailure,
        Ok(pb::RestartMode::Always) => RestartMode::Always,
        Err(_) => return Err(invalid("spec.restart.mode", format!("unknown value {}", restart.mode))),
    };
    let defaults = RestartPolicy::default();
    let limits = spec.limits.unwrap_or_default();
    let limit = |field: &str, n: Option<i64>| {
        n.map(|n| u64::try_from(n).map_err(|_| invalid(field, format!("must be positive, got {n}")))).transpose()
    };
    Ok(SandboxSpec {
        // One default for every client: what the CLI and the SDKs leave unset, the API fills.
        image: if spec.image.is_empty() { berth_core::spec::DEFAULT_IMAGE.to_string() } else { spec.image },
        command: spec.command,
        env: spec.env,
        labels: spec.labels,
        lifetime: Lifetime {
            ttl: lifetime.ttl_ms.map(|ms| millis("spec.lifetime.ttl_ms", ms)).transpose()?,
            idle_timeout: lifetime.idle_timeout_ms.map(|ms| millis("spec.lifetime.idle_timeout_ms", ms)).transpose()?,
            on_expiry,
            on_idle,
        },
        restart: RestartPolicy {
            mode,
            max_restarts: restart.max_restarts,
            backoff: restart.backoff_ms.map_or(Ok(defaults.backoff), |ms| millis("spec.restart.backoff_ms", ms))?,
            max_backoff: restart
                .max_backoff_ms
                .map_or(Ok(defaults.max_backoff), |ms| millis("spec.restart.max_backoff_ms", ms))?,
        },
        limits: ResourceLimits {
            cpu_millis: limit("spec.limits.cpu_millis", limits.cpu_millis)?,
            memory_bytes: limit("spec.limits.memory_bytes", limits.memory_bytes)?,
            pids: limit("spec.limits.pids", limits.pids)?,
        },
        egress: berth_core::egress::Policy::parse(
            "spec.egress.allow",
            spec.egress.iter().flat_map(|e| e.allow.iter().map(String::as_str)),
        )?,
        volumes: spec
            .volumes
            .into_iter()
            .map(|m| berth_core::spec::Mount { volume: m.volume, path: m.path, read_only: m.read_only })
            .collect(),
        ports: spec
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let port = u16::try_from(p.port)
                    .map_err(|_| invalid(&format!("spec.ports[{i}].port"), format!("{} is not a TCP port", p.port)))?;
                Ok(berth_core::spec::PortSpec { port, public: p.public })
            })
            .collect::<Result<_, berth_core::Error>>()?,
        node_selector: spec.node_selector.into_iter().collect(),
    })
}

pub fn rules_to_wire(policy: &berth_core::egress::Policy) -> Vec<String> {
    policy.allow.iter().map(ToString::to_string).collect()
}

fn invalid(field: &str, reason: impl Into<String>) -> berth_core::Error {
    berth_core::Error::Invalid { field: field.to_string(), reason: reason.into() }
}

/// A duration in milliseconds from the wire: negative is refused here, zero and too long by
/// the core's rules.
pub fn millis(field: &str, ms: i64) -> Result<Duration, berth_core::Error> {
    u64::try_from(ms).map(Duration::from_millis).map_err(|_| invalid(field, "must be positive"))
}

/// A point in time in Unix milliseconds from the wire.
pub fn unix_millis(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms)
}

/// A spec as the wire shows it, taking its strings (a record just read owns its spec alone).
pub fn spec_to_wire(spec: SandboxSpec) -> pb::SandboxSpec {
    let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    pb::SandboxSpec {
        image: spec.image,
        command: spec.command,
        env: spec.env,
        labels: spec.labels,
        lifetime: Some(pb::Lifetime {
            ttl_ms: spec.lifetime.ttl.map(millis),
            idle_timeout_ms: spec.lifetime.idle_timeout.map(millis),
            on_expiry: on_expiry_to_wire(spec.lifetime.on_expiry) as i32,
            on_idle: spec.lifetime.on_idle.map(|a| on_expiry_to_wire(a) as i32),
        }),
        restart: Some(pb::RestartPolicy {
            mode: match spec.restart.mode {
                RestartMode::Never => pb::RestartMode::Never,
                RestartMode::OnFailure => pb::RestartMode::OnFailure,
                RestartMode::Always => pb::RestartMode::Always,
            } as i32,
            max_restarts: spec.restart.max_restarts,
            backoff_ms: Some(millis(spec.restart.backoff)),
            max_backoff_ms: Some(millis(spec.restart.max_backoff)),
        }),
        limits: (!spec.limits.is_unlimited()).then(|| {
            let wire = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            pb::ResourceLimits {
                cpu_millis: spec.limits.cpu_millis.map(wire),
                memory_bytes: spec.limits.memory_bytes.map(wire),
                pids: spec.limits.pids.map(wire),
            }
        }),
        egress: (!spec.egress.is_none()).then(|| pb::EgressPolicy { allow: rules_to_wire(&spec.egress) }),
        volumes: spec
            .volumes
            .into_iter()
            .map(|m| pb::VolumeMount { volume: m.volume, path: m.path, read_only: m.read_only })
            .collect(),
        ports: spec.ports.iter().map(|p| pb::PortSpec { port: p.port.into(), public: p.public }).collect(),
        node_selector: spec.node_selector.into_iter().collect(),
    }
}

fn on_expiry_from_wire(field: &str, value: i32) -> Result<OnExpiry, berth_core::Error> {
    match pb::OnExpiry::try_from(value) {
        Ok(pb::OnExpiry::Unspecified | pb::OnExpiry::Stop) => Ok(OnExpiry::Stop),
        Ok(pb::OnExpiry::Delete) => Ok(OnExpiry::Delete),
        Ok(pb::OnExpiry::Pause) => Ok(OnExpiry::Pause),
        Err(_) => Err(invalid(field, format!("unknown value {value}"))),
    }
}

fn on_expiry_to_wire(action: OnExpiry) -> pb::OnExpiry {
    match action {
        OnExpiry::Stop => pb::OnExpiry::Stop,
        OnExpiry::Delete => pb::OnExpiry::Delete,
        OnExpiry::Pause => pb::OnExpiry::Pause,
    }
}

pub fn phase(phase: &Phase) -> pb::Phase {
    match phase {
        Phase::Provisioning => pb::Phase::Provisioning,
        Phase::Starting => pb::Phase::Starting,
        Phase::Ready => pb::Phase::Ready,
        Phase::Paused => pb::Phase::Paused,
        Phase::Stopping => pb::Phase::Stopping,
        Phase::Stopped => pb::Phase::Stopped,
        Phase::Deleting => pb::Phase::Deleting,
        Phase::Error(_) => pb::Phase::Error,
    }
}

fn intent(intent: Intent) -> pb::Intent {
    match intent {
        Intent::Running => pb::Intent::Running,
        Intent::Stopped => pb::Intent::Stopped,
        Intent::Deleted => pb::Intent::Deleted,
        Intent::Paused => pb::Intent::Paused,
    }
}

fn failure(f: Failure) -> pb::Failure {
    pb::Failure { reason: f.reason.to_string(), exit_code: f.exit_code, message: f.message }
}

/// A sandbox as every read API shows it, taking the record's strings where it holds them alone.
pub fn sandbox(s: Sandbox) -> pb::Sandbox {
    let egress_providers = s.egress_providers.intersection(&s.providers).cloned().collect();
    let derived = (
        s.completed(),
        berth_core::restart::scheduled(&s).map(Timestamp::unix_millis),
        s.template.as_deref().is_some_and(|t| berth_core::template::is_member(&s, t)),
        berth_core::lifetime::idle_pending(&s).map(|(since, _)| since.unix_millis()),
    );
    let (completed, next_restart_unix_ms, pool_member, active_at_unix_ms) = derived;
    pb::Sandbox {
        id: s.id.to_string(),
        name: s.name.to_string(),
        spec: Some(spec_to_wire(std::sync::Arc::unwrap_or_clone(s.spec))),
        providers: std::sync::Arc::unwrap_or_clone(s.providers).into_iter().collect(),
        intent: intent(s.intent) as i32,
        phase: phase(&s.phase) as i32,
        failure: match s.phase {
            Phase::Error(f) => Some(failure(f)),
            _ => None,
        },
        resource_version: s.resource_version,
        generation: s.generation,
        created_at_unix_ms: s.created_at.unix_millis(),
        updated_at_unix_ms: s.updated_at.unix_millis(),
        completed,
        deadline_unix_ms: s.deadline.map(Timestamp::unix_millis),
        expired_at_unix_ms: s.expired_at.map(Timestamp::unix_millis),
        restart_count: s.restarts.count,
        next_restart_unix_ms,
        template: s.template.unwrap_or_default(),
        pool_member,
        active_at_unix_ms,
        idle_expired_at_unix_ms: s.idle_expired_at.map(Timestamp::unix_millis),
        egress_providers,
        checkpoint: s.intent == berth_core::Intent::Paused && s.hold == berth_core::Hold::Checkpoint,
        from_snapshot: s.seed.map(|seed| seed.snapshot).unwrap_or_default(),
        node: s.placement.as_ref().map(|p| p.node.to_string()).unwrap_or_default(),
        node_epoch: s.placement.map_or(0, |p| p.epoch),
    }
}

/// A snapshot as every read API shows it, with the names of the sandboxes made from it.
pub fn snapshot(s: berth_core::Snapshot, users: Vec<String>) -> pb::Snapshot {
    use berth_core::SnapshotPhase;
    let (phase, error) = match s.phase {
        SnapshotPhase::Creating => (pb::SnapshotPhase::Creating, String::new()),
        SnapshotPhase::Ready => (pb::SnapshotPhase::Ready, String::new()),
        SnapshotPhase::Error(reason) => (pb::SnapshotPhase::Error, reason),
        SnapshotPhase::Deleting => (pb::SnapshotPhase::Deleting, String::new()),
    };
    let content =
        s.content.unwrap_or(berth_core::record::Content { size_bytes: 0, sha256: String::new(), image: None });
    pb::Snapshot {
        name: s.name,
        id: s.id.to_string(),
        source: s.source.name.clone(),
        source_id: s.source.id.to_string(),
        source_generation: s.source.generation,
        phase: phase as i32,
        error,
        size_bytes: content.size_bytes,
        sha256: content.sha256,
        image: content.image.unwrap_or_default(),
        resource_version: s.resource_version,
        created_at_unix_ms: s.created_at.unix_millis(),
        updated_at_unix_ms: s.updated_at.unix_millis(),
        users,
        fork_of: if s.fork.is_some() { s.source.name } else { String::new() },
        spec: Some(spec_to_wire(s.spec)),
    }
}

pub fn volume(v: berth_core::Volume, users: Vec<String>) -> pb::Volume {
    let phase = match v.phase {
        berth_core::VolumePhase::Ready => pb::VolumePhase::Ready,
        berth_core::VolumePhase::Deleting => pb::VolumePhase::Deleting,
    };
    pb::Volume {
        name: v.name,
        id: v.id.to_string(),
        phase: phase as i32,
        resource_version: v.resource_version,
        created_at_unix_ms: v.created_at.unix_millis(),
        updated_at_unix_ms: v.updated_at.unix_millis(),
        users,
    }
}

/// A provider as every read API shows it: credential names, never values.
pub fn provider(p: &Provider) -> pb::Provider {
    pb::Provider {
        name: p.name.clone(),
        kind: p.kind.clone(),
        credential_names: p.credentials.keys().cloned().collect(),
        resource_version: p.resource_version,
        created_at_unix_ms: p.created_at.unix_millis(),
        updated_at_unix_ms: p.updated_at.unix_millis(),
        endpoints: rules_to_wire(&p.endpoints),
    }
}

pub fn credentials(map: std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, Secret> {
    map.into_iter().map(|(k, v)| (k, Secret::new(v))).collect()
}

/// An exec as the API shows it: its environment's names, never their values.
pub fn exec(e: &berth_core::exec::Exec, sandbox: &str) -> pb::Exec {
    use berth_core::exec::{ExecEnd, ExecState};
    let (state, exit_code, signal, message) = match &e.state {
        ExecState::Admitted => (pb::ExecState::Admitted, None, None, String::new()),
        ExecState::Running => (pb::ExecState::Running, None, None, String::new()),
        ExecState::Ended { end, message } => {
            let message = message.clone();
            match end {
                ExecEnd::Exited(code) => (pb::ExecState::Exited, Some(*code), None, message),
                ExecEnd::Signalled(signal) => (pb::ExecState::Signalled, None, Some(*signal), message),
                ExecEnd::TimedOut => (pb::ExecState::TimedOut, None, None, message),
                ExecEnd::Cancelled => (pb::ExecState::Cancelled, None, None, message),
            }
        }
        ExecState::Lost { message } => (pb::ExecState::Lost, None, None, message.clone()),
    };
    pb::Exec {
        id: e.id.to_string(),
        sandbox: sandbox.to_string(),
        argv: e.spec.argv.clone(),
        env_names: e.spec.env.keys().cloned().collect(),
        cwd: e.spec.cwd.clone(),
        tty: e.spec.tty,
        timeout_ms: e.spec.timeout_ms,
        generation: e.generation,
        state: state.into(),
        exit_code,
        signal,
        message,
        cancel_requested: e.cancel_requested,
        output_bytes: e.output_bytes,
        resource_version: e.resource_version,
        admitted_at_unix_ms: e.admitted_at.unix_millis(),
        updated_at_unix_ms: e.updated_at.unix_millis(),
    }
}

pub fn exec_spec(start: &pb::ExecStart) -> berth_core::exec::ExecSpec {
    berth_core::exec::ExecSpec {
        argv: start.argv.clone(),
        env: start.env.clone(),
        cwd: start.cwd.clone(),
        tty: start.tty,
        stdin: start.stdin,
        timeout_ms: start.timeout_ms,
    }
}
