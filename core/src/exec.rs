//! Execs: commands run inside a sandbox's current run (DESIGN 8.1).
//!
//! An exec is a record keyed by `(sandbox, exec id)`, admitted for one generation and committed
//! conditionally on the sandbox record it was admitted against, so a stop committed first always
//! wins. Its state only moves forward: Admitted → Running → one terminal state, and the first
//! terminal state committed is final. Three things end one: its run's report (through the
//! supervisor session of the generation it was admitted for, E2), [`settle`] once that run is
//! over (stopped, deleted, replaced or lost, E3), and a cancel, which is a committed intent that
//! the supervisor carries out.
//!
//! An exec is activity for its sandbox's idle timeout (DESIGN 9.1) from its admission to its
//! end: both are written with the sandbox's idle clock restarted, in the same transaction.

use crate::branch::{self, Branch};
use crate::decision::{Decision, Outcome, Write, update_sandbox};
use crate::error::{Error, Kind};
pub use crate::id::{ExecId, MAX_EXEC_ID_BYTES};
use crate::phase::PhaseKind;
pub use crate::record::{Exec, ExecEnd, ExecState};
use crate::record::{Intent, Run, Sandbox};
pub use crate::spec::ExecSpec;
use crate::time::Timestamp;
use crate::{lifetime, validate};

/// Most arguments of one exec.
pub const MAX_EXEC_ARGS: usize = 1024;
/// Largest exec command and environment together, in bytes.
pub const MAX_EXEC_BYTES: usize = 256 * 1024;
/// Longest timeout an exec may ask for: a day. Longer work belongs in the sandbox's command.
pub const MAX_EXEC_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

impl ExecSpec {
    /// The limits every entry point applies, naming the offending field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(Error::invalid("argv", "must name a program to run"));
        }
        if self.argv.len() > MAX_EXEC_ARGS {
            return Err(Error::invalid("argv", format!("at most {MAX_EXEC_ARGS} arguments, got {}", self.argv.len())));
        }
        for (i, arg) in self.argv.iter().enumerate() {
            let field = format!("argv[{i}]");
            validate::no_nul(&field, arg)?;
            if arg.len() > validate::MAX_ARG_BYTES {
                return Err(Error::invalid(field, format!("must be at most {} bytes", validate::MAX_ARG_BYTES)));
            }
        }
        for (name, value) in &self.env {
            validate::env_name("env", name)?;
            let field = format!("env[{name}]");
            validate::no_nul(&field, value)?;
            if value.len() > validate::MAX_VALUE_BYTES {
                return Err(Error::invalid(field, format!("must be at most {} bytes", validate::MAX_VALUE_BYTES)));
            }
        }
        validate::no_nul("cwd", &self.cwd)?;
        if !self.cwd.is_empty() && !self.cwd.starts_with('/') {
            return Err(Error::invalid("cwd", "must be an absolute path inside the sandbox, or empty"));
        }
        if self.cwd.len() > validate::MAX_ARG_BYTES {
            return Err(Error::invalid("cwd", format!("must be at most {} bytes", validate::MAX_ARG_BYTES)));
        }
        match self.timeout_ms {
            Some(0) => return Err(Error::invalid("timeout", "must be positive, or unset for no limit")),
            Some(ms) if ms > MAX_EXEC_TIMEOUT_MS => {
                return Err(Error::invalid("timeout", format!("must be at most {MAX_EXEC_TIMEOUT_MS} ms (a day)")));
            }
            _ => {}
        }
        let size = self.argv.iter().map(String::len).sum::<usize>()
            + self.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + self.cwd.len();
        if size > MAX_EXEC_BYTES {
            return Err(Error::invalid("argv", format!("command and env are {size} bytes; at most {MAX_EXEC_BYTES}")));
        }
        Ok(())
    }
}

impl Exec {
    /// The next version of this record, as a conditional write; an end restarts `sandbox`'s
    /// idle clock with it. The decision's outcome is the exec as it then stands.
    fn update(&self, next: Exec, sandbox: Option<&Sandbox>, now: Timestamp) -> Decision {
        let mut next = next;
        next.resource_version = self.resource_version + 1;
        next.updated_at = now;
        let mut writes = vec![Write::UpdateExec { record: next.clone(), expected: self.resource_version }];
        if next.state.is_terminal() && !self.state.is_terminal() {
            writes.extend(activity(sandbox, now));
        }
        Decision { writes, effects: Vec::new(), outcome: Outcome::Exec(Box::new(next)) }
    }

    /// What a rule that changes nothing answers: the exec as it is.
    fn as_is(&self) -> Decision {
        Decision { writes: Vec::new(), effects: Vec::new(), outcome: Outcome::Exec(Box::new(self.clone())) }
    }
}

/// What an exec's admission or end writes of `sandbox` at `now`: its idle clock restarted, if it
/// runs. Of a sandbox with an idle timeout whose clock does not run, a condition on the record
/// read all the same: a write decided on a record from before a start or a claim started the
/// clock conflicts, and is decided again on the one that counts it.
fn activity(sandbox: Option<&Sandbox>, now: Timestamp) -> Option<Write> {
    let before = sandbox?;
    match lifetime::touch(before, now) {
        Some(next) => Some(update_sandbox(before, next, now).0),
        None if before.spec.lifetime.idle_timeout.is_some() => {
            Some(Write::CheckSandbox { id: before.id.clone(), expected: before.resource_version })
        }
        None => None,
    }
}

/// Admits `spec` as exec `id` of the sandbox named `name`, against what was read: the sandbox
/// and the exec of that id, if any. A retry of an existing exec returns it unchanged whatever
/// the sandbox is doing now; the same id with another command is ALREADY_EXISTS. A new exec
/// needs the sandbox Ready, and is conditional on the very sandbox version read (and restarts
/// its idle clock, if it has one). The decision's outcome is the exec; it writes nothing for an
/// exec that already existed, so a retry runs nothing again.
pub fn admit(
    name: &str,
    id: &ExecId,
    spec: &ExecSpec,
    sandbox: Option<&Sandbox>,
    existing: Option<&Exec>,
    now: Timestamp,
) -> Result<Decision, Error> {
    validate::dns_label("sandbox", name)?;
    spec.validate()?;
    let sandbox = sandbox.ok_or_else(|| Error::NotFound { kind: Kind::Sandbox, name: name.to_string() })?;
    if let Some(exec) = existing {
        if exec.spec != *spec {
            branch::hit(Branch::AdmitIdConflict);
            return Err(Error::AlreadyExists { kind: Kind::Exec, name: id.to_string() });
        }
        branch::hit(Branch::AdmitRetry);
        return Ok(exec.as_is());
    }
    // A pause committed but not yet seen to freeze the run leaves it Ready: the intent says
    // it is on its way to Paused, and an exec admitted now would freeze with it.
    if sandbox.intent == Intent::Paused && !crate::bug!(ExecWhilePausing) {
        branch::hit(Branch::AdmitPaused);
        return Err(Error::WrongPhase {
            sandbox: sandbox.name.to_string(),
            action: "exec in",
            phase: PhaseKind::Paused,
        });
    }
    let starting_too = crate::bug!(ExecWhileStarting) && sandbox.is(PhaseKind::Starting);
    if sandbox.phase.kind() != PhaseKind::Ready && !starting_too {
        branch::hit(Branch::AdmitNotReady);
        return Err(Error::WrongPhase {
            sandbox: sandbox.name.to_string(),
            action: "exec in",
            phase: sandbox.phase.kind(),
        });
    }
    branch::hit(Branch::Admit);
    let exec = Exec {
        sandbox: sandbox.id.clone(),
        id: id.clone(),
        spec: spec.clone(),
        generation: sandbox.generation,
        state: ExecState::Admitted,
        cancel_requested: false,
        output_bytes: None,
        resource_version: 1,
        admitted_at: now,
        updated_at: now,
    };
    let condition = activity(Some(sandbox), now)
        .unwrap_or_else(|| Write::CheckSandbox { id: sandbox.id.clone(), expected: sandbox.resource_version });
    let writes = vec![condition, Write::CreateExec(exec.clone())];
    Ok(Decision { writes, effects: Vec::new(), outcome: Outcome::Exec(Box::new(exec)) })
}

/// What an exec's run reports of it over its supervisor session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Started,
    Ended {
        end: ExecEnd,
        message: String,
        output_bytes: u64,
        /// It failed by itself while the kernel killed something in the sandbox for memory.
        out_of_memory: bool,
    },
    /// A run of its generation started it, and that run is gone (restarted out of band): the
    /// run reporting never ran it, and never will.
    Lost {
        message: String,
    },
}

/// Applies a report from the supervisor session of `generation`, the exec's sandbox being
/// `sandbox`. A session of another generation is never this exec's run (E2), and a terminal
/// state is final: both change nothing.
pub fn report(exec: &Exec, sandbox: Option<&Sandbox>, generation: u64, report: &Report, now: Timestamp) -> Decision {
    if generation != exec.generation || exec.state.is_terminal() {
        branch::hit(Branch::ReportIgnored);
        return exec.as_is();
    }
    let mut next = exec.clone();
    match report {
        Report::Started if exec.state == ExecState::Admitted => {
            branch::hit(Branch::ReportStarted);
            next.state = ExecState::Running;
        }
        Report::Started => {
            branch::hit(Branch::ReportStartedAgain);
            return exec.as_is();
        }
        Report::Ended { end, message, output_bytes, out_of_memory } => {
            branch::hit(Branch::ReportEnded);
            // DESIGN 10: killed for memory, as a main process is, naming the sandbox's limit.
            let message = match (*out_of_memory, sandbox) {
                (true, Some(s)) => {
                    format!("killed for memory: the sandbox used more than {}", s.spec.limits.memory_bound())
                }
                (true, None) => "killed for memory".to_string(),
                (false, _) => message.clone(),
            };
            next.state = ExecState::Ended { end: *end, message };
            next.output_bytes = Some(*output_bytes);
        }
        Report::Lost { message } => {
            branch::hit(Branch::ReportLost);
            next.state = ExecState::Lost { message: message.clone() };
        }
    }
    exec.update(next, sandbox, now)
}

/// Commits a cancel: the run kills the exec (or never starts it) and reports it Cancelled. An
/// exec that already ended stays as it ended.
pub fn cancel(exec: &Exec, now: Timestamp) -> Decision {
    if exec.state.is_terminal() || exec.cancel_requested {
        branch::hit(Branch::CancelNothing);
        return exec.as_is();
    }
    branch::hit(Branch::Cancel);
    let mut next = exec.clone();
    next.cancel_requested = true;
    exec.update(next, None, now)
}

/// Ends an exec whose run is over (E3): its sandbox was deleted, stopped, started again, or its
/// run ended or failed. A stop or delete cancels it; anything else lost it. An exec whose run
/// may still be alive and serving it is left to that run.
pub fn settle(exec: &Exec, sandbox: Option<&Sandbox>, now: Timestamp) -> Decision {
    if exec.state.is_terminal() {
        branch::hit(Branch::SettleEnded);
        return exec.as_is();
    }
    let state = match sandbox {
        None => {
            branch::hit(Branch::SettleDeleted);
            ExecState::Ended { end: ExecEnd::Cancelled, message: "the sandbox was deleted".into() }
        }
        Some(s) => {
            let replaced = s.generation != exec.generation;
            let ended = matches!(s.run, Run::Ended(_));
            // A paused run keeps its execs: they go on when it is resumed.
            let live = matches!(s.phase.kind(), PhaseKind::Ready | PhaseKind::Paused);
            if !replaced && !ended && live {
                branch::hit(Branch::SettleLive);
                return exec.as_is();
            }
            match s.intent {
                Intent::Stopped => {
                    branch::hit(Branch::SettleStopped);
                    ExecState::Ended { end: ExecEnd::Cancelled, message: "the sandbox was stopped".into() }
                }
                Intent::Deleted => {
                    branch::hit(Branch::SettleDeleting);
                    ExecState::Ended { end: ExecEnd::Cancelled, message: "the sandbox is being deleted".into() }
                }
                Intent::Running | Intent::Paused if replaced => {
                    branch::hit(Branch::SettleReplaced);
                    ExecState::Lost {
                        message: format!("generation {} was replaced by generation {}", exec.generation, s.generation),
                    }
                }
                Intent::Running | Intent::Paused => {
                    branch::hit(Branch::SettleRunEnded);
                    ExecState::Lost { message: format!("the sandbox's run ended (the sandbox is {})", s.phase) }
                }
            }
        }
    };
    let mut next = exec.clone();
    next.state = state;
    exec.update(next, sandbox, now)
}
