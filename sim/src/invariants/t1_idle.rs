//! T1 for the idle timeout (DESIGN 9.1, 11): a sandbox is expired as idle only once nothing has
//! been active on it for its timeout, never while an exec of it is open; after faults stop,
//! every sandbox idle for longer than its timeout and a bound is stopped or gone.
//!
//! The check at each idle expiry's commit keeps its own account of the sandbox's exec activity
//! (every exec admission and end the store committed, and the execs open as it commits) rather
//! than trusting the record's clock, which is what a bug would have got wrong. An activity's
//! time is its decision's, as the exec record carries it: a store round trip before its commit.

use std::collections::BTreeMap;

use berth_core::{Intent, Sandbox, SandboxId, Timestamp};

use super::{Checker, Fact, Found, Invariant};

/// T1 for idle timeouts, with its own account of each sandbox's exec activity: the last exec
/// admission or end the store committed, as of when its gateway decided it.
#[derive(Default)]
pub struct Idle {
    last_exec: BTreeMap<SandboxId, Timestamp>,
}

impl Checker for Idle {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match fact {
            // An activity counts from when its gateway decided it (the exec record says when),
            // not from its commit a store round trip later: so does the idle timeout.
            Fact::Exec { before, after, .. } => {
                let at = match before {
                    None => after.admitted_at,
                    Some(b) if after.state.is_terminal() && !b.state.is_terminal() => after.updated_at,
                    Some(_) => return,
                };
                let last = self.last_exec.entry(after.sandbox.clone()).or_insert(at);
                *last = (*last).max(at);
            }
            Fact::Sandbox { now, before: Some(b), after: Some(a), open_execs, .. } => {
                let activity = Activity { open_execs: *open_execs, last_exec: self.last_exec.get(&b.id).copied() };
                found.extend(idled_early(b, a, *now, &activity).map(|p| (Invariant::T1, p)));
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

/// What the checker knows of one sandbox's execs when an idle expiry of it commits.
pub struct Activity {
    /// Execs of the sandbox not ended, as the store holds them at the commit.
    pub open_execs: usize,
    /// The last exec admission or end the store committed for it, as of when its gateway
    /// decided it (on the store's clock).
    pub last_exec: Option<Timestamp>,
}

/// The problem with a write from `before` to `after` committed at `now`, if it is an idle
/// expiry that the sandbox's activity does not justify.
pub fn idled_early(before: &Sandbox, after: &Sandbox, now: Timestamp, activity: &Activity) -> Option<String> {
    if before.idle_expired_at.is_some() || after.idle_expired_at.is_none() {
        return None;
    }
    let name = &before.name;
    let Some(timeout) = before.spec.lifetime.idle_timeout else {
        return Some(format!("{name} was expired as idle with no idle timeout"));
    };
    if activity.open_execs > 0 {
        return Some(format!(
            "{name} was expired as idle at {} ms with {} exec(s) open",
            now.unix_millis(),
            activity.open_execs
        ));
    }
    let last = [before.active_at, activity.last_exec].into_iter().flatten().max();
    match last {
        Some(last) if last.plus(timeout) <= now => None,
        Some(last) => Some(format!(
            "{name} was expired as idle at {} ms, {} ms after its last activity; its timeout is {} ms",
            now.unix_millis(),
            now.unix_millis() - last.unix_millis(),
            timeout.as_millis()
        )),
        None => Some(format!("{name} was expired as idle with no activity to count from")),
    }
}

/// The problem with `s` at `now`, after the quiet phase, if it has been idle for more than its
/// timeout and `bound` and still runs (or is meant to).
pub fn still_alive(s: &Sandbox, now: Timestamp, bound: core::time::Duration) -> Option<String> {
    let (since, due) = berth_core::lifetime::idle_pending(s)?;
    (due.plus(bound) <= now && s.intent == Intent::Running).then(|| {
        format!(
            "{} is {} with intent Running, idle since {} ms: {} ms past its idle timeout",
            s.name,
            s.phase,
            since.unix_millis(),
            now.unix_millis() - due.unix_millis()
        )
    })
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use berth_core::Phase;

    use super::*;
    use crate::invariants::sandbox;

    fn idle(active_at: i64, idle_expired_at: Option<i64>) -> Sandbox {
        let mut s = sandbox("sb1", Intent::Running, Phase::Ready, 1);
        std::sync::Arc::make_mut(&mut s.spec).lifetime.idle_timeout = Some(Duration::from_millis(1_000));
        s.active_at = Some(Timestamp::from_unix_millis(active_at));
        s.idle_expired_at = idle_expired_at.map(Timestamp::from_unix_millis);
        s
    }

    #[test]
    fn an_idle_expiry_is_justified_only_by_a_timeout_of_no_activity_and_no_open_exec() {
        let now = Timestamp::from_unix_millis(5_000);
        let expired = idle(4_000, Some(5_000));
        let quiet = Activity { open_execs: 0, last_exec: Some(Timestamp::from_unix_millis(3_000)) };
        assert_eq!(idled_early(&idle(4_000, None), &expired, now, &quiet), None);
        assert_eq!(
            idled_early(&idle(4_500, None), &expired, now, &quiet).as_deref(),
            Some("sb1 was expired as idle at 5000 ms, 500 ms after its last activity; its timeout is 1000 ms")
        );
        let exec_ended_late = Activity { open_execs: 0, last_exec: Some(Timestamp::from_unix_millis(4_200)) };
        assert!(
            idled_early(&idle(1_000, None), &expired, now, &exec_ended_late).is_some(),
            "the record's clock lagging"
        );
        let open = Activity { open_execs: 2, last_exec: None };
        assert_eq!(
            idled_early(&idle(1_000, None), &expired, now, &open).as_deref(),
            Some("sb1 was expired as idle at 5000 ms with 2 exec(s) open")
        );
        // Not an idle expiry: nothing to justify.
        assert_eq!(idled_early(&expired, &expired, now, &open), None);
    }

    #[test]
    fn a_sandbox_running_past_its_idle_timeout_and_the_bound_fires() {
        let now = Timestamp::from_unix_millis(10_000);
        let bound = Duration::from_secs(5);
        assert_eq!(still_alive(&idle(5_000, None), now, bound), None, "within the bound");
        assert_eq!(
            still_alive(&idle(3_000, None), now, bound).as_deref(),
            Some("sb1 is Ready with intent Running, idle since 3000 ms: 6000 ms past its idle timeout")
        );
        assert_eq!(still_alive(&idle(3_000, Some(4_000)), now, bound), None, "expired already");
    }
}
