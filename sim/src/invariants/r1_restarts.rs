//! R1 (DESIGN 9.2): a restart policy restarts only what it covers (`on-failure` a failure,
//! `always` any end, `never` nothing), only while the intent is Running, one restart at a
//! time and never past its maximum, and never before its backoff, which doubles with each
//! restart since the last create or user start.
//!
//! A restart is a write that adds to the record's restart count; the backoff is counted from
//! when the run's end was decided (the ending write's `updated_at`, on the store's clock, the
//! time core schedules the restart from), to the restart's commit. The first end seen in a
//! generation counts: later writes of the ended run (a newer exit marker) do not move it.

use std::collections::BTreeMap;

use berth_core::restart::{RestartMode, backoff};
use berth_core::{Intent, PhaseKind, Sandbox, SandboxId, Timestamp};

use super::{Checker, Fact, Found, Invariant};

/// R1's evidence: when each generation's run ended, per sandbox.
#[derive(Default)]
pub struct Restarts {
    ended: BTreeMap<(SandboxId, u64), Timestamp>,
}

impl Checker for Restarts {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match fact {
            Fact::Sandbox { now, before: Some(b), after: Some(a), .. } => {
                if ended(a) && !ended(b) {
                    self.ended.entry((a.id.clone(), a.generation)).or_insert(a.updated_at);
                }
                if a.restarts.count > b.restarts.count {
                    let ended_at = self.ended.get(&(b.id.clone(), b.generation)).copied();
                    found.extend(restart_problems(b, a, *now, ended_at).into_iter().map(|p| (Invariant::R1, p)));
                }
            }
            Fact::Sandbox { before: Some(b), after: None, .. } => self.ended.retain(|(id, _), _| *id != b.id),
            _ => {}
        }
    }
}

/// Whether the record's run has ended: failed, or stopped (completed or stopped by a user).
fn ended(s: &Sandbox) -> bool {
    s.phase.kind() == PhaseKind::Error || s.phase.kind() == PhaseKind::Stopped
}

/// The problems with the restart written from `b` to `a` at `now`, its run having ended at
/// `ended_at` (if the checker saw it end).
fn restart_problems(b: &Sandbox, a: &Sandbox, now: Timestamp, ended_at: Option<Timestamp>) -> Vec<String> {
    let policy = &b.spec.restart;
    let (name, count) = (&b.name, a.restarts.count);
    let mut problems = Vec::new();
    let covered = match policy.mode {
        RestartMode::Never => false,
        RestartMode::OnFailure => b.phase.kind() == PhaseKind::Error,
        RestartMode::Always => ended(b),
    };
    if !covered || b.intent != Intent::Running {
        problems.push(format!(
            "{name} was restarted from {} with intent {:?} under policy {:?}",
            b.phase, b.intent, policy.mode
        ));
    }
    if count != b.restarts.count + 1 || a.generation != b.generation + 1 {
        problems.push(format!(
            "{name}'s restart took its count from {} to {count} and its generation from {} to {}",
            b.restarts.count, b.generation, a.generation
        ));
    }
    if let Some(max) = policy.max_restarts
        && count > max
    {
        problems.push(format!("{name} was restarted {count} times; its policy allows {max}"));
    }
    let wait = backoff(policy, b.restarts.count);
    if let Some(ended_at) = ended_at
        && now < ended_at.plus(wait)
    {
        problems.push(format!(
            "{name}'s restart {count} committed {} ms after its run ended; its backoff is {} ms",
            (now.unix_nanos() - ended_at.unix_nanos()) / 1_000_000,
            wait.as_millis()
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use berth_core::restart::RestartPolicy;
    use berth_core::{Failure, FailureReason, Phase};

    use super::*;
    use crate::invariants::{at, feed, sandbox, write};

    fn with_policy(mode: RestartMode, max_restarts: Option<u32>, phase: Phase, generation: u64, count: u32) -> Sandbox {
        let mut s = sandbox("a", Intent::Running, phase, generation);
        std::sync::Arc::make_mut(&mut s.spec).restart =
            RestartPolicy { mode, max_restarts, backoff: Duration::from_secs(1), max_backoff: Duration::from_secs(8) };
        s.restarts.count = count;
        s
    }

    fn failed() -> Phase {
        Phase::Error(Failure { reason: FailureReason::ContainerExited, exit_code: Some(3), message: String::new() })
    }

    /// A run of generation `generation` (restart count `count`) ends at `end` s; the policy
    /// restarts it at `restart` s.
    fn history(mode: RestartMode, max: Option<u32>, count: u32, end: u64, restart: u64, ended: Phase) -> Vec<String> {
        let ready = with_policy(mode, max, Phase::Ready, count as u64 + 1, count);
        let mut over = with_policy(mode, max, ended, count as u64 + 1, count);
        over.updated_at = at(end);
        let again = with_policy(mode, max, Phase::Starting, count as u64 + 2, count + 1);
        feed(
            &mut Restarts::default(),
            &[write(end, Some(&ready), Some(&over)), write(restart, Some(&over), Some(&again))],
        )
    }

    #[test]
    fn a_restart_after_its_backoff_within_its_maximum_is_quiet() {
        assert!(history(RestartMode::OnFailure, Some(3), 0, 10, 11, failed()).is_empty());
        assert!(history(RestartMode::Always, None, 2, 10, 14, Phase::Stopped).is_empty(), "4 s after the third end");
    }

    #[test]
    fn a_restart_past_the_maximum_fires() {
        assert_eq!(
            history(RestartMode::OnFailure, Some(2), 2, 10, 20, failed()),
            ["R1: a was restarted 3 times; its policy allows 2"]
        );
    }

    #[test]
    fn a_restart_before_its_backoff_fires() {
        assert_eq!(
            history(RestartMode::Always, None, 1, 10, 11, failed()),
            ["R1: a's restart 2 committed 1000 ms after its run ended; its backoff is 2000 ms"]
        );
    }

    #[test]
    fn a_restart_the_policy_does_not_cover_fires() {
        assert_eq!(
            history(RestartMode::OnFailure, None, 0, 10, 12, Phase::Stopped),
            ["R1: a was restarted from Stopped with intent Running under policy OnFailure"]
        );
        assert_eq!(history(RestartMode::Never, None, 0, 10, 12, failed()).len(), 1);
    }
}
