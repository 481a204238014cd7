//! Lifetime policy (DESIGN 9.1): a sandbox's deadline, how renews and starts move it, its idle
//! timeout and the activity that holds that off, and the expiries the reconcile lease holder
//! commits once either passes.
//!
//! The deadline is on the store's clock, and so is every `now` these rules are given: the one
//! clock every gateway sharing the store agrees on. An expiry names the deadline it is for and
//! is decided again on the record as the store holds it (DESIGN 3.3), so a renew that committed
//! first leaves nothing to expire: a renewed sandbox is never reaped by the deadline it
//! replaced (T1).
//!
//! The idle clock runs while the sandbox is meant to run (intent Running) and counts from its
//! last activity, `active_at`: the create or start, a claim, an exec's admission and its end,
//! and the touches of an attach or logs-follow stream. An idle expiry names the `active_at` it
//! is for, and is also refused while any exec of the sandbox is open: an exec is activity from
//! its admission to its end, however long it runs. Every activity is a conditional write of the
//! record, so an activity and an idle expiry racing are linearized by the store like a renew and
//! a deadline's expiry.

use core::time::Duration;

use crate::error::Error;
use crate::phase::PhaseKind;
use crate::record::{Intent, Sandbox};
pub use crate::request::Renewal;
pub use crate::spec::{Lifetime, OnExpiry};
use crate::time::Timestamp;
use crate::validate::Limits;

/// The shortest idle timeout: a stream that holds it off touches the record four times a
/// timeout, so a shorter one would be a stream of writes rather than a policy.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// A TTL is positive and at most the configured maximum.
fn validate_ttl(field: &str, ttl: Duration, limits: &Limits) -> Result<(), Error> {
    if ttl.is_zero() {
        return Err(Error::Invalid { field: field.to_string(), reason: "must be positive".to_string() });
    }
    if ttl > limits.max_ttl {
        return Err(Error::Invalid {
            field: field.to_string(),
            reason: format!("must be at most {}s (the gateway's --max-ttl)", limits.max_ttl.as_secs()),
        });
    }
    Ok(())
}

/// A spec's lifetime, each field within its bounds.
pub fn validate(lifetime: &Lifetime, limits: &Limits) -> Result<(), Error> {
    if let Some(ttl) = lifetime.ttl {
        validate_ttl("spec.lifetime.ttl_ms", ttl, limits)?;
    }
    if let Some(idle) = lifetime.idle_timeout {
        let field = "spec.lifetime.idle_timeout_ms";
        validate_ttl(field, idle, limits)?;
        if idle < MIN_IDLE_TIMEOUT {
            return Err(Error::invalid(field, format!("must be at least {} ms", MIN_IDLE_TIMEOUT.as_millis())));
        }
    }
    Ok(())
}

/// The deadline `renewal` sets at `now` for a sandbox whose spec says `lifetime`: `None` when
/// there is none to set (no TTL anywhere). `field` names what the caller gave.
pub fn deadline(
    renewal: Renewal,
    lifetime: &Lifetime,
    now: Timestamp,
    limits: &Limits,
    field: &str,
) -> Result<Option<Timestamp>, Error> {
    let ttl = match renewal {
        Renewal::Deadline(at) => {
            if at <= now {
                return Err(Error::Invalid {
                    field: field.to_string(),
                    reason: "must be in the future (by the store's clock)".to_string(),
                });
            }
            if at > now.plus(limits.max_ttl) {
                return Err(Error::Invalid {
                    field: field.to_string(),
                    reason: format!("must be at most {}s ahead (the gateway's --max-ttl)", limits.max_ttl.as_secs()),
                });
            }
            return Ok(Some(at));
        }
        Renewal::Ttl(ttl) => ttl,
        Renewal::SpecTtl => match lifetime.ttl {
            Some(ttl) => ttl,
            None => return Ok(None),
        },
    };
    validate_ttl(field, ttl, limits)?;
    Ok(Some(now.plus(ttl)))
}

/// Whether an expiry of `deadline` is due for `sandbox` at `now`: the record still has that
/// deadline, unexpired, it has passed, and the sandbox is not already going away.
pub fn due(sandbox: &Sandbox, deadline: Timestamp, now: Timestamp) -> bool {
    let renewed = !crate::bug!(ExpiryIgnoresRenew) && sandbox.deadline != Some(deadline);
    !renewed
        && sandbox.deadline.is_some()
        && sandbox.expired_at.is_none()
        && deadline <= now
        && sandbox.intent != Intent::Deleted
        && !sandbox.is(PhaseKind::Deleting)
}

/// The deadline an expiry would next be for, if any.
pub fn pending(sandbox: &Sandbox) -> Option<Timestamp> {
    if sandbox.expired_at.is_some() || sandbox.intent == Intent::Deleted {
        return None;
    }
    sandbox.deadline
}

/// Whether `sandbox`'s idle clock runs: it has an idle timeout, is meant to run, and counts
/// from an activity (a pool member waiting to be claimed has none yet).
fn idle_clock_runs(sandbox: &Sandbox) -> bool {
    sandbox.spec.lifetime.idle_timeout.is_some()
        && sandbox.active_at.is_some()
        && sandbox.intent == Intent::Running
        && sandbox.idle_expired_at.is_none()
}

/// Where the idle clock of a sandbox that starts running at `now` (a create, a start, a claim)
/// counts from: `now` if it has an idle timeout.
pub fn clock_from(lifetime: &Lifetime, now: Timestamp) -> Option<Timestamp> {
    lifetime.idle_timeout.map(|_| now)
}

/// A merge that ended a pause with its run (`before` paused, `next` not): the idle clock, held
/// while paused, counts again from `now`, as after a resume.
pub fn unheld(before: &Sandbox, next: &mut Sandbox, now: Timestamp) {
    if before.intent == Intent::Paused && next.intent != Intent::Paused && next.active_at.is_some() {
        next.active_at = Some(now);
    }
}

/// An activity at `now`: the record with its idle clock restarted, if the clock runs (the
/// record is then written with it, conditional on its version); `None` when there is nothing
/// to write.
pub fn touch(sandbox: &Sandbox, now: Timestamp) -> Option<Sandbox> {
    if !idle_clock_runs(sandbox) || sandbox.is(PhaseKind::Deleting) || sandbox.active_at >= Some(now) {
        return None;
    }
    Some(Sandbox { active_at: Some(now), ..sandbox.clone() })
}

/// Whether an idle expiry counting from `since` is due for `sandbox` at `now`, with
/// `open_execs` of its execs not yet ended: the record's clock still counts from `since`, the
/// timeout has passed, and no exec is open.
pub fn idle_due(sandbox: &Sandbox, since: Timestamp, open_execs: usize, now: Timestamp) -> bool {
    let open_execs = if crate::bug!(IdleIgnoresExecs) { 0 } else { open_execs };
    let Some(timeout) = sandbox.spec.lifetime.idle_timeout else { return false };
    idle_clock_runs(sandbox)
        && sandbox.active_at == Some(since)
        && since.plus(timeout) <= now
        && open_execs == 0
        && !sandbox.is(PhaseKind::Deleting)
}

/// The activity an idle expiry would next count from, and when it would fall due, if any.
pub fn idle_pending(sandbox: &Sandbox) -> Option<(Timestamp, Timestamp)> {
    let timeout = sandbox.spec.lifetime.idle_timeout?;
    let since = sandbox.active_at?;
    (idle_clock_runs(sandbox) && !sandbox.is(PhaseKind::Deleting)).then(|| (since, since.plus(timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_unix_millis(1_000_000);

    fn ttl(secs: u64) -> Lifetime {
        Lifetime { ttl: Some(Duration::from_secs(secs)), ..Lifetime::default() }
    }

    #[test]
    fn a_renewal_sets_the_deadline_from_now_and_the_ttl_it_names() {
        let limits = Limits::default();
        assert_eq!(
            deadline(Renewal::SpecTtl, &ttl(60), NOW, &limits, "ttl").unwrap(),
            Some(Timestamp::from_unix_millis(1_060_000))
        );
        assert_eq!(
            deadline(Renewal::Ttl(Duration::from_secs(5)), &ttl(60), NOW, &limits, "ttl").unwrap(),
            Some(Timestamp::from_unix_millis(1_005_000))
        );
        let at = Timestamp::from_unix_millis(2_000_000);
        assert_eq!(deadline(Renewal::Deadline(at), &Lifetime::default(), NOW, &limits, "d").unwrap(), Some(at));
        assert_eq!(deadline(Renewal::SpecTtl, &Lifetime::default(), NOW, &limits, "ttl").unwrap(), None);
    }

    #[test]
    fn a_ttl_or_deadline_out_of_bounds_names_its_field() {
        let limits = Limits { max_ttl: Duration::from_secs(100), ..Limits::default() };
        let zero = deadline(Renewal::Ttl(Duration::ZERO), &Lifetime::default(), NOW, &limits, "ttl_ms").unwrap_err();
        assert_eq!(zero.to_string(), "invalid ttl_ms: must be positive");
        let long = deadline(Renewal::Ttl(Duration::from_secs(101)), &Lifetime::default(), NOW, &limits, "ttl_ms");
        assert_eq!(long.unwrap_err().to_string(), "invalid ttl_ms: must be at most 100s (the gateway's --max-ttl)");
        let past = deadline(Renewal::Deadline(NOW), &Lifetime::default(), NOW, &limits, "deadline_unix_ms");
        assert_eq!(
            past.unwrap_err().to_string(),
            "invalid deadline_unix_ms: must be in the future (by the store's clock)"
        );
        let far = Timestamp::from_unix_millis(1_000_000 + 100_001);
        let far = deadline(Renewal::Deadline(far), &Lifetime::default(), NOW, &limits, "deadline_unix_ms");
        assert_eq!(
            far.unwrap_err().to_string(),
            "invalid deadline_unix_ms: must be at most 100s ahead (the gateway's --max-ttl)"
        );
    }
}
