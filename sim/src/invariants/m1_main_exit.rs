//! M1 (DESIGN 9.3): a main process's exit 0 is a completion (Stopped, intent kept), any other
//! code a failure: no record fails with an exit code of 0, and no completion is written over a
//! run the record itself saw end with another code.

use berth_core::{FailureReason, Phase, Run, Sandbox};

use super::{Checker, Fact, Found, Invariant};

/// M1 needs no evidence of its own: each write carries the codes it is judged on.
#[derive(Default)]
pub struct MainExit;

impl Checker for MainExit {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        let Fact::Sandbox { before: Some(b), after: Some(a), .. } = fact else { return };
        found.extend(problem(b, a).map(|p| (Invariant::M1, p)));
    }
}

fn problem(b: &Sandbox, a: &Sandbox) -> Option<String> {
    if let Phase::Error(f) = &a.phase
        && b.phase != a.phase
        && matches!(f.reason, FailureReason::ContainerExited | FailureReason::MainProcessExited)
        && f.exit_code == Some(0)
    {
        return Some(format!("{} failed ({}) with exit code 0, which is a completion", a.name, f.reason));
    }
    match a.run {
        Run::Ended(marker) if a.completed() && !b.completed() && marker.exit_code != 0 => Some(format!(
            "{} completed (Stopped with intent Running) though its run exited with code {}",
            a.name, marker.exit_code
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use berth_core::{ExitMarker, Failure, Intent, Timestamp};

    use super::*;
    use crate::invariants::{feed, sandbox, write};

    #[test]
    fn a_failure_with_code_0_or_a_completion_of_a_failed_run_fires() {
        let ready = sandbox("a", Intent::Running, Phase::Ready, 1);
        let failure =
            |code| Failure { reason: FailureReason::MainProcessExited, exit_code: Some(code), message: String::new() };
        let failed = |code| Sandbox { phase: Phase::Error(failure(code)), ..ready.clone() };
        let marker = |code| ExitMarker {
            started_at: Timestamp(1),
            finished_at: Timestamp(2),
            exit_code: code,
            out_of_memory: false,
        };
        let completed = |code| Sandbox { phase: Phase::Stopped, run: Run::Ended(marker(code)), ..ready.clone() };
        let (failed_2, completed_0) = (failed(2), completed(0));
        assert!(
            feed(&mut MainExit, &[write(1, Some(&ready), Some(&failed_2)), write(1, Some(&ready), Some(&completed_0))])
                .is_empty()
        );
        let (failed_0, completed_2) = (failed(0), completed(2));
        assert_eq!(
            feed(&mut MainExit, &[write(1, Some(&ready), Some(&failed_0)), write(1, Some(&ready), Some(&completed_2))]),
            [
                "M1: a failed (MainProcessExited) with exit code 0, which is a completion",
                "M1: a completed (Stopped with intent Running) though its run exited with code 2",
            ]
        );
    }
}
