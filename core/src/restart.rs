//! Restart policy (DESIGN 9.2): which ends of a run start a new generation by themselves, and
//! when.
//!
//! Merging an observation that ends the current run (Error, or a completion) schedules the
//! restart the policy asks for, at `now` plus a backoff that doubles with each restart since
//! the last start a user asked for; the reconcile lease holder commits it once due, as a new
//! generation written exactly as a Start writes one. Every command that changes the intent
//! cancels a scheduled restart: a user's word wins over the policy.

use core::time::Duration;

use crate::error::Error;
use crate::phase::PhaseKind;
pub use crate::record::Restarts;
use crate::record::{Intent, Sandbox};
pub use crate::spec::{RestartMode, RestartPolicy};
use crate::time::Timestamp;

/// The shortest first backoff: a crash loop never spins the runtime faster than this.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest backoff a policy may ask for.
pub const MAX_BACKOFF: Duration = Duration::from_secs(24 * 3600);

pub fn validate(policy: &RestartPolicy) -> Result<(), Error> {
    let invalid = |field: &str, reason: String| Error::Invalid { field: field.to_string(), reason };
    if policy.backoff < MIN_BACKOFF || policy.backoff > MAX_BACKOFF {
        return Err(invalid(
            "spec.restart.backoff_ms",
            format!("must be between {} and {} ms", MIN_BACKOFF.as_millis(), MAX_BACKOFF.as_millis()),
        ));
    }
    if policy.max_backoff < policy.backoff || policy.max_backoff > MAX_BACKOFF {
        return Err(invalid(
            "spec.restart.max_backoff_ms",
            format!("must be between backoff_ms ({}) and {} ms", policy.backoff.as_millis(), MAX_BACKOFF.as_millis()),
        ));
    }
    if policy.mode == RestartMode::Never && policy.max_restarts.is_some() {
        return Err(invalid("spec.restart.max_restarts", "needs a restart mode other than never".to_string()));
    }
    Ok(())
}

/// The wait before restart number `count + 1`.
pub fn backoff(policy: &RestartPolicy, count: u32) -> Duration {
    let factor = 1u32.checked_shl(count.min(31)).unwrap_or(u32::MAX);
    policy.backoff.saturating_mul(factor).min(policy.max_backoff)
}

/// Whether the run `next` holds ended by itself in a way its policy restarts, with restarts
/// left: a failure (Error), or for `always` a completion too.
fn wants_restart(next: &Sandbox) -> bool {
    let policy = &next.spec.restart;
    let ended = match policy.mode {
        RestartMode::Never => false,
        RestartMode::OnFailure => next.is(PhaseKind::Error),
        RestartMode::Always => next.is(PhaseKind::Error) || next.completed(),
    };
    let left = policy.max_restarts.is_none_or(|max| next.restarts.count < max) || crate::bug!(RestartPastMaximum);
    ended && next.intent == Intent::Running && left
}

/// Schedules the restart the policy asks for when a merge ended the run: `before` is the record
/// as read, `next` as the merge leaves it.
pub fn schedule(before: &Sandbox, next: &mut Sandbox, now: Timestamp) {
    let ended_now = next.phase.kind() != before.phase.kind();
    if next.restarts.next_at.is_none() && ended_now && wants_restart(next) {
        next.restarts.next_at = Some(now.plus(backoff(&next.spec.restart, next.restarts.count)));
    }
}

/// When the scheduled restart is due, if one is and the record still wants it.
pub fn scheduled(sandbox: &Sandbox) -> Option<Timestamp> {
    sandbox.restarts.next_at.filter(|_| wants_restart(sandbox))
}

/// Whether the scheduled restart is due at `now`: scheduled, still wanted, and not past the
/// sandbox's deadline (an expiry comes first).
pub fn due(sandbox: &Sandbox, now: Timestamp) -> bool {
    scheduled(sandbox).is_some_and(|at| at <= now) && sandbox.deadline.is_none_or(|d| d > now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: RestartMode) -> RestartPolicy {
        RestartPolicy { mode, ..RestartPolicy::default() }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        let p = RestartPolicy {
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(3),
            ..policy(RestartMode::Always)
        };
        let waits: Vec<u128> = (0..6).map(|n| backoff(&p, n).as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 3000, 3000, 3000]);
        assert_eq!(backoff(&p, u32::MAX), Duration::from_secs(3), "no overflow at any count");
    }

    #[test]
    fn a_policy_out_of_bounds_names_its_field() {
        let fast = RestartPolicy { backoff: Duration::from_millis(10), ..policy(RestartMode::Always) };
        assert_eq!(
            validate(&fast).unwrap_err().to_string(),
            "invalid spec.restart.backoff_ms: must be between 100 and 86400000 ms"
        );
        let inverted = RestartPolicy {
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(1),
            ..policy(RestartMode::Always)
        };
        assert_eq!(
            validate(&inverted).unwrap_err().to_string(),
            "invalid spec.restart.max_backoff_ms: must be between backoff_ms (10000) and 86400000 ms"
        );
        let pointless = RestartPolicy { max_restarts: Some(3), ..policy(RestartMode::Never) };
        assert_eq!(
            validate(&pointless).unwrap_err().to_string(),
            "invalid spec.restart.max_restarts: needs a restart mode other than never"
        );
        assert_eq!(validate(&policy(RestartMode::OnFailure)), Ok(()));
    }
}
