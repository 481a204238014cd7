//! When a record's timed rules next fall due: its deadline's expiry and its idle expiry
//! (DESIGN 9.1), and its scheduled restart (9.2). The reconcile lease holder keeps every record's next time, and at
//! that time runs the command this names; the command is decided again on the record as the
//! store then holds it, so a timer that went stale (a renew, a user's start or stop, a delete)
//! decides nothing.

use crate::record::Sandbox;
use crate::request::Command;
use crate::time::Timestamp;
use crate::{lifetime, restart};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// The deadline passes: expire the sandbox as its spec says.
    Expire { deadline: Timestamp },
    /// The idle timeout counted from the activity at `since` passes: expire the sandbox as its
    /// spec says, unless an exec is still open.
    Idle { since: Timestamp },
    /// The restart the policy scheduled is due.
    Restart,
}

/// The next timed rule of `sandbox` as of `now`, and when it falls due. An expiry comes first
/// once it is due: a sandbox past its deadline or idle timeout is not restarted. Of the two
/// expiries the earlier is next (the deadline's when they fall together).
pub fn next(sandbox: &Sandbox, now: Timestamp) -> Option<(Timestamp, Timer)> {
    let deadline = lifetime::pending(sandbox).map(|deadline| (deadline, Timer::Expire { deadline }));
    let idle = lifetime::idle_pending(sandbox).map(|(since, at)| (at, Timer::Idle { since }));
    let expiry = match (deadline, idle) {
        (Some(d), Some(i)) => Some(if i.0 < d.0 { i } else { d }),
        (d, i) => d.or(i),
    };
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
        Timer::Idle { since } => Command::ExpireIdle { name: name.to_string(), since },
        Timer::Restart => Command::RestartSandbox { name: name.to_string() },
    }
}
