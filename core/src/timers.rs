//! When a record's timed rules next fall due: its deadline's expiry (DESIGN 9.1) and its
//! scheduled restart (9.2). The reconcile lease holder keeps every record's next time, and at
//! that time runs the command this names; the command is decided again on the record as the
//! store then holds it, so a timer that went stale (a renew, a user's start or stop, a delete)
//! decides nothing.

use crate::command::Command;
use crate::record::{Sandbox, Timestamp};
use crate::{lifetime, restart};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// The deadline passes: expire the sandbox as its spec says.
    Expire { deadline: Timestamp },
    /// The restart the policy scheduled is due.
    Restart,
}

/// The next timed rule of `sandbox` as of `now`, and when it falls due. An expiry comes first
/// once both are due: a sandbox past its deadline is not restarted.
pub fn next(sandbox: &Sandbox, now: Timestamp) -> Option<(Timestamp, Timer)> {
    let expiry = lifetime::pending(sandbox).map(|deadline| (deadline, Timer::Expire { deadline }));
    let restart = restart::scheduled(sandbox).map(|at| (at, Timer::Restart));
    match (expiry, restart) {
        (Some(e), Some(r)) if r.0 < e.0 && now < e.0 => Some(r),
        (Some(e), _) => Some(e),
        (None, r) => r,
    }
}

/// The command that carries `timer` out on the sandbox named `name`.
pub fn command(name: &str, timer: Timer) -> Command {
    match timer {
        Timer::Expire { deadline } => Command::ExpireSandbox { name: name.to_string(), deadline },
        Timer::Restart => Command::RestartSandbox { name: name.to_string() },
    }
}
