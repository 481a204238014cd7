//! How the CLI prints: lines that end it quietly once its reader went, tables, JSON, and the
//! sandbox's shape shared by the commands that show one.

use std::time::Duration;

use berth_proto::v1 as pb;
use serde_json::json;

use super::Output;
use super::client::Client;

/// One line to stdout, for [`say!`].
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        ended_output(&e);
    }
}

/// The end of the CLI once its output cannot be written: quietly if its reader went, else
/// saying why.
pub(super) fn ended_output(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write the output: {e}");
    std::process::exit(1);
}

pub(super) fn phase_name(phase: i32) -> &'static str {
    pb::Phase::try_from(phase).map_or("Unknown", |p| match p {
        pb::Phase::Unspecified => "Unknown",
        pb::Phase::Provisioning => "Provisioning",
        pb::Phase::Starting => "Starting",
        pb::Phase::Ready => "Ready",
        pb::Phase::Paused => "Paused",
        pb::Phase::Stopping => "Stopping",
        pb::Phase::Stopped => "Stopped",
        pb::Phase::Deleting => "Deleting",
        pb::Phase::Error => "Error",
    })
}

fn intent_name(intent: i32) -> &'static str {
    pb::Intent::try_from(intent).map_or("Unknown", |i| match i {
        pb::Intent::Unspecified => "Unknown",
        pb::Intent::Running => "Running",
        pb::Intent::Stopped => "Stopped",
        pb::Intent::Deleted => "Deleted",
        pb::Intent::Paused => "Paused",
    })
}

fn on_expiry_name(action: i32) -> &'static str {
    match pb::OnExpiry::try_from(action) {
        Ok(pb::OnExpiry::Delete) => "delete",
        Ok(pb::OnExpiry::Pause) => "pause",
        _ => "stop",
    }
}

pub(super) fn spec_json(spec: &pb::SandboxSpec) -> serde_json::Value {
    json!({
        "image": spec.image, "command": spec.command, "env": spec.env, "labels": spec.labels,
        "lifetime": spec.lifetime.map(|l| json!({
            "ttl_ms": l.ttl_ms, "idle_timeout_ms": l.idle_timeout_ms,
            "on_expiry": on_expiry_name(l.on_expiry),
            "on_idle": l.on_idle.map(on_expiry_name),
        })),
        "restart": spec.restart.map(|r| json!({
            "mode": pb::RestartMode::try_from(r.mode).map_or("never", |m| match m {
                pb::RestartMode::OnFailure => "on-failure",
                pb::RestartMode::Always => "always",
                pb::RestartMode::Never | pb::RestartMode::Unspecified => "never",
            }),
            "max_restarts": r.max_restarts, "backoff_ms": r.backoff_ms, "max_backoff_ms": r.max_backoff_ms,
        })),
        "limits": spec.limits.map(|l| json!({
            "cpu_millis": l.cpu_millis, "memory_bytes": l.memory_bytes, "pids": l.pids,
        })),
        "egress": spec.egress.as_ref().map(|e| &e.allow),
        "volumes": spec.volumes.iter().map(|m| json!({
            "volume": m.volume, "path": m.path, "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "node_selector": spec.node_selector,
    })
}

pub(super) fn sandbox_json(s: &pb::Sandbox) -> serde_json::Value {
    let spec = s.spec.clone().unwrap_or_default();
    json!({
        "id": s.id, "name": s.name, "phase": phase_name(s.phase), "intent": intent_name(s.intent),
        "failure": s.failure.as_ref().map(|f| json!({"reason": f.reason, "exit_code": f.exit_code, "message": f.message})),
        "completed": s.completed,
        "resource_version": s.resource_version, "generation": s.generation, "providers": s.providers,
        "egress_providers": s.egress_providers,
        "deadline_unix_ms": s.deadline_unix_ms, "expired_at_unix_ms": s.expired_at_unix_ms,
        "active_at_unix_ms": s.active_at_unix_ms, "idle_expired_at_unix_ms": s.idle_expired_at_unix_ms,
        "restart_count": s.restart_count, "next_restart_unix_ms": s.next_restart_unix_ms,
        "template": (!s.template.is_empty()).then_some(&s.template), "pool_member": s.pool_member,
        "from_snapshot": (!s.from_snapshot.is_empty()).then_some(&s.from_snapshot), "checkpoint": s.checkpoint,
        "node": (!s.node.is_empty()).then_some(&s.node), "node_epoch": s.node_epoch,
        "spec": spec_json(&spec),
        "created_at_unix_ms": s.created_at_unix_ms, "updated_at_unix_ms": s.updated_at_unix_ms,
    })
}

/// Columns padded to their widest cell.
pub(super) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = vec![aligned(header.iter().map(|h| h.to_string()), &widths)];
    out.extend(rows.into_iter().map(|row| aligned(row, &widths)));
    out.join("\n")
}

/// `cells`, each padded to its column's width (a longer one pushes the rest along).
fn aligned(cells: impl IntoIterator<Item = String>, widths: &[usize]) -> String {
    cells.into_iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
}

/// A watch's columns, fixed since its rows come one at a time: wide enough for every phase,
/// an RFC 3339 deadline, and most names.
const WATCH_WIDTHS: [usize; 10] = [16, 12, 8, 10, 12, 7, 10, 20, 8, 0];

fn sandbox_row(s: &pb::Sandbox) -> Vec<String> {
    let reason = match &s.failure {
        Some(f) => match f.exit_code {
            Some(code) => format!("{} (exit {code})", f.reason),
            None => f.reason.clone(),
        },
        None if s.completed => "Completed (exit 0)".to_string(),
        None if s.expired_at_unix_ms.is_some() => "Expired".to_string(),
        None if s.idle_expired_at_unix_ms.is_some() => "Expired (idle)".to_string(),
        None if s.checkpoint => "Checkpoint".to_string(),
        None => String::new(),
    };
    vec![
        s.name.clone(),
        phase_name(s.phase).to_string(),
        intent_name(s.intent).to_string(),
        s.generation.to_string(),
        s.node.clone(),
        s.resource_version.to_string(),
        s.providers.join(","),
        show_time(s.deadline_unix_ms),
        s.restart_count.to_string(),
        reason,
    ]
}

const SANDBOX_HEADER: [&str; 10] =
    ["NAME", "PHASE", "INTENT", "GENERATION", "NODE", "VERSION", "PROVIDERS", "DEADLINE", "RESTARTS", "REASON"];

pub(super) fn show_time(unix_ms: Option<i64>) -> String {
    let Some(ms) = unix_ms.and_then(|ms| u64::try_from(ms).ok()) else { return String::new() };
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

impl Client {
    /// The header of a watch's lines, in a table (JSON lines need none).
    pub(super) fn print_watch_header(&self) {
        if let Output::Table = self.output {
            say!("{}", aligned(SANDBOX_HEADER.map(String::from), &WATCH_WIDTHS));
        }
    }

    /// One line for a change a watch saw: the sandbox after it, or its removal.
    pub(super) fn print_change(&self, name: &str, sandbox: Option<&pb::Sandbox>) {
        match (sandbox, self.output) {
            (Some(s), Output::Json) => say!("{}", sandbox_json(s)),
            (Some(s), Output::Table) => say!("{}", aligned(sandbox_row(s), &WATCH_WIDTHS)),
            (None, Output::Json) => say!("{}", json!({"name": name, "removed": true})),
            (None, Output::Table) => say!("{}", aligned([name.to_string(), "(removed)".to_string()], &WATCH_WIDTHS)),
        }
    }

    /// The line for a `kind` record `name` that a delete removed.
    pub(super) fn print_deleted(&self, kind: &str, name: &str) {
        match self.output {
            Output::Json => say!("{}", json!({"name": name, "deleted": true})),
            Output::Table => say!("{kind} '{name}' deleted"),
        }
    }

    pub(super) fn print_sandboxes(&self, sandboxes: &[pb::Sandbox]) {
        match self.output {
            Output::Json if sandboxes.len() == 1 => say!("{:#}", sandbox_json(&sandboxes[0])),
            Output::Json => say!("{:#}", json!(sandboxes.iter().map(sandbox_json).collect::<Vec<_>>())),
            Output::Table => say!("{}", table(&SANDBOX_HEADER, sandboxes.iter().map(sandbox_row).collect())),
        }
    }
}
