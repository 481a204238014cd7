//! I8 (DESIGN 4): after faults stop, every sandbox converges to its intent and none stays in a
//! transitional phase. Checked once the quiet phase is over, each record against what the
//! runtime runs for it.

use berth_core::{Intent, PhaseKind, Run, Sandbox};

/// The problems with `s` after the quiet phase, given the generation the runtime runs for it
/// (`alive`). A deleted record is I7's.
pub fn not_converged(s: &Sandbox, alive: Option<u64>) -> Vec<String> {
    let expected = match s.intent {
        Intent::Running => PhaseKind::Ready,
        Intent::Paused => PhaseKind::Paused,
        Intent::Stopped => PhaseKind::Stopped,
        Intent::Deleted => return Vec::new(),
    };
    if s.phase.kind() != expected {
        return vec![format!("{} has intent {:?} but is {} after the quiet phase", s.name, s.intent, s.phase)];
    }
    let mut problems = Vec::new();
    let consistent = match expected {
        PhaseKind::Ready | PhaseKind::Paused => alive == Some(s.generation),
        _ => alive.is_none(),
    };
    if !consistent {
        problems
            .push(format!("{} is {} at generation {} but the runtime runs {alive:?}", s.name, s.phase, s.generation));
    }
    if let (PhaseKind::Ready, Run::Pending) = (s.phase.kind(), s.run) {
        problems.push(format!("{} is Ready with no run known to have started", s.name));
    }
    problems
}

#[cfg(test)]
mod tests {
    use berth_core::Phase;

    use super::*;
    use crate::invariants::sandbox;

    fn started(mut s: Sandbox) -> Sandbox {
        s.run = Run::Started { at: None };
        s
    }

    #[test]
    fn a_sandbox_at_its_intent_with_the_runtime_agreeing_is_quiet() {
        assert_eq!(
            not_converged(&started(sandbox("sb1", Intent::Running, Phase::Ready, 2)), Some(2)),
            Vec::<String>::new()
        );
        assert_eq!(not_converged(&sandbox("sb1", Intent::Stopped, Phase::Stopped, 2), None), Vec::<String>::new());
        assert_eq!(not_converged(&sandbox("sb1", Intent::Deleted, Phase::Deleting, 2), Some(2)), Vec::<String>::new());
    }

    #[test]
    fn a_sandbox_short_of_its_intent_fires() {
        assert_eq!(
            not_converged(&sandbox("sb1", Intent::Running, Phase::Starting, 2), Some(2)),
            ["sb1 has intent Running but is Starting after the quiet phase"]
        );
        assert_eq!(
            not_converged(&sandbox("sb1", Intent::Stopped, Phase::Stopped, 2), Some(2)),
            ["sb1 is Stopped at generation 2 but the runtime runs Some(2)"]
        );
        assert_eq!(
            not_converged(&sandbox("sb1", Intent::Running, Phase::Ready, 2), Some(1)),
            [
                "sb1 is Ready at generation 2 but the runtime runs Some(1)",
                "sb1 is Ready with no run known to have started"
            ]
        );
    }
}
