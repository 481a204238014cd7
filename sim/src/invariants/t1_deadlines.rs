//! T1 (DESIGN 11): after faults stop, a sandbox past its deadline is Stopped or gone within a
//! bound; a sandbox renewed before its deadline is never expired by that deadline.
//!
//! The second half is checked on every expiry the store commits: the record it replaces must
//! still have a deadline, already passed by the store's clock. A renew that committed first
//! moved the deadline, so an expiry of the deadline it replaced shows as one whose record's
//! deadline is still ahead.

use berth_core::{Intent, Sandbox, Timestamp};

use super::{Checker, Fact, Found, Invariant};

/// T1 for deadlines: each expiry as it commits, and every record once the quiet phase is over.
#[derive(Default)]
pub struct Deadlines;

impl Checker for Deadlines {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match fact {
            Fact::Sandbox { now, before: Some(b), after: Some(a), .. } => {
                found.extend(expired_early(b, a, *now).map(|p| (Invariant::T1, p)));
            }
            Fact::Converged { records, now, expiry_bound, .. } => {
                found.extend(
                    records.iter().filter_map(|s| still_alive(s, *now, *expiry_bound)).map(|p| (Invariant::T1, p)),
                );
            }
            _ => {}
        }
    }
}

/// The problem with a write from `before` to `after` committed at `now`, if it is an expiry
/// the record's deadline does not justify.
pub fn expired_early(before: &Sandbox, after: &Sandbox, now: Timestamp) -> Option<String> {
    if before.expired_at.is_some() || after.expired_at.is_none() {
        return None;
    }
    match before.deadline {
        Some(deadline) if deadline <= now => None,
        Some(deadline) => Some(format!(
            "{} was expired at {} ms though its deadline is {} ms: a renew that committed first did not save it, or the store's clock had not reached it",
            before.name,
            now.unix_millis(),
            deadline.unix_millis()
        )),
        None => Some(format!("{} was expired at {} ms with no deadline", before.name, now.unix_millis())),
    }
}

/// The problem with `s` at `now`, after the quiet phase, if its deadline passed more than
/// `bound` ago and it still runs (or is meant to).
pub fn still_alive(s: &Sandbox, now: Timestamp, bound: core::time::Duration) -> Option<String> {
    let deadline = s.deadline?;
    let overdue = deadline.plus(bound) <= now;
    (overdue && s.intent == Intent::Running).then(|| {
        format!(
            "{} is {} with intent Running {} ms after its deadline",
            s.name,
            s.phase,
            now.unix_millis() - deadline.unix_millis()
        )
    })
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use berth_core::Phase;

    use super::*;
    use crate::invariants::sandbox;

    fn with_deadline(deadline: Option<i64>, expired_at: Option<i64>) -> Sandbox {
        let mut s = sandbox("sb1", Intent::Running, Phase::Ready, 1);
        s.deadline = deadline.map(Timestamp::from_unix_millis);
        s.expired_at = expired_at.map(Timestamp::from_unix_millis);
        s
    }

    #[test]
    fn an_expiry_is_justified_only_by_a_passed_deadline_of_the_record_it_replaces() {
        let now = Timestamp::from_unix_millis(100);
        let expired = with_deadline(Some(50), Some(100));
        assert_eq!(expired_early(&with_deadline(Some(100), None), &expired, now), None);
        assert_eq!(
            expired_early(&with_deadline(Some(160), None), &expired, now).as_deref(),
            Some(
                "sb1 was expired at 100 ms though its deadline is 160 ms: a renew that committed first did not save it, or the store's clock had not reached it"
            )
        );
        assert_eq!(
            expired_early(&with_deadline(None, None), &expired, now).as_deref(),
            Some("sb1 was expired at 100 ms with no deadline")
        );
        // Not an expiry: nothing to justify.
        assert_eq!(expired_early(&expired, &expired, now), None);
    }

    #[test]
    fn a_sandbox_running_past_its_deadline_and_the_bound_fires() {
        let now = Timestamp::from_unix_millis(10_000);
        let bound = Duration::from_secs(5);
        assert_eq!(still_alive(&with_deadline(Some(6_000), None), now, bound), None, "within the bound");
        assert_eq!(
            still_alive(&with_deadline(Some(4_000), None), now, bound).as_deref(),
            Some("sb1 is Ready with intent Running 6000 ms after its deadline")
        );
        let stopped = sandbox("sb1", Intent::Stopped, Phase::Stopped, 1);
        assert_eq!(still_alive(&Sandbox { deadline: Some(Timestamp(0)), ..stopped }, now, bound), None);
    }
}
