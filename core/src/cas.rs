//! The CAS retry rule (DESIGN 3.3).
//!
//! Every write is conditional on the version read. After a conflict the executor re-reads and
//! re-decides (so a command that is now a no-op or now invalid says so), waiting a jittered,
//! bounded time first. A client-supplied version fails fast in that re-decision: the record it
//! named has changed, and the command returns ABORTED with both versions, writing nothing.
//! Server-owned work (commands without a version, merges, recovery) simply tries again.

use core::time::Duration;

use crate::decision::Conflict;
use crate::error::{Error, Kind};
use crate::request::Request;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Conflicting writes tolerated before giving up.
    pub max_conflicts: u32,
    /// The wait bound after the first conflict; it doubles after each one, up to `cap`.
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_conflicts: 32, base: Duration::from_millis(1), cap: Duration::from_millis(64) }
    }
}

/// The retry state of one operation on one record.
#[derive(Clone, Debug)]
pub struct Retry {
    policy: RetryPolicy,
    conflicts: u32,
    kind: Kind,
    name: String,
    /// Give up at the first conflict (only a known-bug switch sets it).
    fail_fast: bool,
}

impl Retry {
    pub fn new(policy: RetryPolicy, kind: Kind, name: impl Into<String>) -> Self {
        Self { policy, conflicts: 0, kind, name: name.into(), fail_fast: false }
    }

    /// The retry state of an API command.
    pub fn for_request(policy: RetryPolicy, request: &Request) -> Self {
        let plan = request.plan();
        let (kind, name) = plan.subject();
        Self { fail_fast: crate::bugs::fails_fast(&request.command), ..Self::new(policy, kind, name) }
    }

    /// A write conflicted. Returns how long to wait before re-reading, or the error once the
    /// bound is reached. `random` is any uniformly random number (the randomness is an input,
    /// so a seeded run waits the same every time): the wait is uniform in `[0, bound]`.
    pub fn after_conflict(&mut self, conflict: &Conflict, random: u64) -> Result<Duration, Error> {
        self.conflicts += 1;
        if self.fail_fast {
            return Err(Error::StaleVersion {
                kind: self.kind,
                name: self.name.clone(),
                expected: conflict.expected.unwrap_or_default(),
                current: conflict.current,
            });
        }
        if self.conflicts > self.policy.max_conflicts {
            return Err(Error::Contention { kind: self.kind, name: self.name.clone(), attempts: self.conflicts });
        }
        let doubling = 1u32 << (self.conflicts - 1).min(20);
        let bound = self.policy.base.saturating_mul(doubling).min(self.policy.cap);
        let nanos = (bound.as_nanos() * u128::from(random)) / u128::from(u64::MAX);
        Ok(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> Conflict {
        Conflict { key: crate::decision::Key::Provider("p".into()), expected: Some(1), current: Some(2) }
    }

    #[test]
    fn waits_are_jittered_bounded_and_exhaust() {
        let policy = RetryPolicy { max_conflicts: 4, base: Duration::from_millis(2), cap: Duration::from_millis(5) };
        let mut r = Retry::new(policy, Kind::Sandbox, "a");
        assert_eq!(r.after_conflict(&conflict(), u64::MAX).unwrap(), Duration::from_millis(2));
        assert_eq!(r.after_conflict(&conflict(), u64::MAX).unwrap(), Duration::from_millis(4));
        assert_eq!(r.after_conflict(&conflict(), 0).unwrap(), Duration::ZERO);
        assert_eq!(r.after_conflict(&conflict(), u64::MAX / 2).unwrap(), Duration::from_nanos(2_499_999));
        let err = r.after_conflict(&conflict(), 1).unwrap_err();
        assert_eq!(err, Error::Contention { kind: Kind::Sandbox, name: "a".into(), attempts: 5 });
        assert_eq!(err.code(), crate::error::Code::Unavailable);
    }

    #[test]
    fn the_same_randomness_gives_the_same_schedule() {
        let run = |seed: u64| {
            let mut r = Retry::new(RetryPolicy::default(), Kind::Provider, "p");
            (0..10)
                .map(|i| {
                    r.after_conflict(&conflict(), seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_mul(i + 7)).unwrap()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
    }
}
