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
