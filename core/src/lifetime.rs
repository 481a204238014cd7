//! Lifetime policy (DESIGN 9.1): a sandbox's deadline, how renews and starts move it, and the
//! expiry the reconcile lease holder commits once it passes.
//!
//! The deadline is on the store's clock, and so is every `now` these rules are given: the one
//! clock every gateway sharing the store agrees on. An expiry names the deadline it is for and
//! is decided again on the record as the store holds it (DESIGN 3.3), so a renew that committed
//! first leaves nothing to expire: a renewed sandbox is never reaped by the deadline it
//! replaced (T1).

use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::record::{Intent, PhaseKind, Sandbox, Timestamp};
use crate::validate::Limits;

/// What a sandbox's deadline does when it passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnExpiry {
    /// Stop it: the workspace is kept, and a start (which renews a TTL) runs it again.
    #[default]
    Stop,
    /// Delete it and everything made for it.
    Delete,
}

/// The lifetime part of a spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetime {
    /// The deadline is this long after the create, and after every renew and start that does
    /// not set one of its own.
    pub ttl: Option<Duration>,
    pub on_expiry: OnExpiry,
}

/// How a renew sets the deadline: to a time, or to `now` plus a TTL (the spec's if none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Renewal {
    #[default]
    SpecTtl,
    Ttl(Duration),
    Deadline(Timestamp),
}

/// A TTL is positive and at most the configured maximum.
pub fn validate_ttl(field: &str, ttl: Duration, limits: &Limits) -> Result<(), Error> {
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
    #[cfg(feature = "bugs")]
    let renewed = !crate::bugs::on(crate::bugs::Bug::ExpiryIgnoresRenew) && sandbox.deadline != Some(deadline);
    #[cfg(not(feature = "bugs"))]
    let renewed = sandbox.deadline != Some(deadline);
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_unix_millis(1_000_000);

    fn ttl(secs: u64) -> Lifetime {
        Lifetime { ttl: Some(Duration::from_secs(secs)), on_expiry: OnExpiry::Stop }
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
