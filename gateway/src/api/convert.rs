//! Between the wire and berth-core. Secrets go one way only: in.

use berth_core::{Failure, Intent, Phase, Provider, Sandbox, SandboxSpec, Secret};
use berth_proto::v1 as pb;

pub fn spec_from_wire(spec: pb::SandboxSpec) -> SandboxSpec {
    SandboxSpec { image: spec.image, command: spec.command, env: spec.env, labels: spec.labels }
}

pub fn phase(phase: &Phase) -> pb::Phase {
    match phase {
        Phase::Provisioning => pb::Phase::Provisioning,
        Phase::Starting => pb::Phase::Starting,
        Phase::Ready => pb::Phase::Ready,
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
    }
}

fn failure(f: &Failure) -> pb::Failure {
    pb::Failure { reason: f.reason.to_string(), exit_code: f.exit_code, message: f.message.clone() }
}

pub fn sandbox(s: &Sandbox) -> pb::Sandbox {
    pb::Sandbox {
        id: s.id.to_string(),
        name: s.name.clone(),
        spec: Some(pb::SandboxSpec {
            image: s.spec.image.clone(),
            command: s.spec.command.clone(),
            env: s.spec.env.clone(),
            labels: s.spec.labels.clone(),
        }),
        providers: s.providers.iter().cloned().collect(),
        intent: intent(s.intent) as i32,
        phase: phase(&s.phase) as i32,
        failure: match &s.phase {
            Phase::Error(f) => Some(failure(f)),
            _ => None,
        },
        resource_version: s.resource_version,
        generation: s.generation,
        created_at_unix_ms: s.created_at.unix_millis(),
        updated_at_unix_ms: s.updated_at.unix_millis(),
        completed: s.completed(),
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
    }
}

pub fn credentials(map: std::collections::BTreeMap<String, String>) -> std::collections::BTreeMap<String, Secret> {
    map.into_iter().map(|(k, v)| (k, Secret::new(v))).collect()
}
