//! S3 (DESIGN 16): pause and resume never change the generation or the identity; a paused
//! sandbox runs no exec; after faults stop, intent Paused converges to Paused over a run held
//! as the pause asked (frozen, or in a checkpoint), or, once its run is gone, to what its
//! restart policy says: the pause ends with the run.
//!
//! The store's writes are fed as facts (an admission against a paused record, a generation
//! moved out of a pause); convergence is judged at the end against the runtime's runs.

use berth_core::{Hold, Intent, PhaseKind, Sandbox};

use super::{Checker, Fact, Found, Invariant};

/// S3 keeps no evidence: each write comes with the record it was decided against.
#[derive(Default)]
pub struct Pause;

impl Checker for Pause {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        let problem = match *fact {
            Fact::Exec { before: None, after, sandbox: Some(s) } if paused(s) => Some(format!(
                "exec {} was admitted to {} while its intent is {:?} and it is {}",
                after.id, s.name, s.intent, s.phase
            )),
            Fact::Sandbox { before: Some(b), after: Some(a), .. } => rotated_out_of_a_pause(b, a),
            _ => None,
        };
        found.extend(problem.map(|p| (Invariant::S3, p)));
    }
}

/// Whether `s` is paused or on its way there: no exec may be admitted to it.
fn paused(s: &Sandbox) -> bool {
    s.intent == Intent::Paused || s.phase.kind() == PhaseKind::Paused
}

/// A write that moved a paused (or pausing) sandbox to another generation: only a start or a
/// restart does that, and neither may start from a pause.
fn rotated_out_of_a_pause(before: &Sandbox, after: &Sandbox) -> Option<String> {
    (paused(before) && after.generation != before.generation).then(|| {
        format!(
            "{} went from {} (intent {:?}) at generation {} to generation {}",
            before.name, before.phase, before.intent, before.generation, after.generation
        )
    })
}

/// After the quiet phase: a sandbox that says it is paused, or that it runs, is so in the
/// runtime (`held`: how a pause holds its current generation's run, if one does).
pub fn hold_not_as_recorded(s: &Sandbox, held: Option<Hold>) -> Option<String> {
    match (s.intent, s.phase.kind(), held) {
        (Intent::Paused, PhaseKind::Paused, held) if held != Some(s.hold) => Some(format!(
            "{} is Paused {} at generation {} but its run is {}",
            s.name,
            s.hold,
            s.generation,
            held.map_or("not paused".to_string(), |h| format!("paused {h}"))
        )),
        (Intent::Running, PhaseKind::Ready, Some(held)) => {
            Some(format!("{} is Ready at generation {} but its run is paused {held}", s.name, s.generation))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use berth_core::Phase;
    use berth_core::exec::ExecState;

    use super::*;
    use crate::invariants::{exec, feed, sandbox, write};

    #[test]
    fn an_exec_admitted_to_a_pausing_or_paused_sandbox_fires() {
        let ready = sandbox("a", Intent::Running, Phase::Ready, 2);
        let pausing = sandbox("a", Intent::Paused, Phase::Ready, 2);
        let resuming = sandbox("a", Intent::Running, Phase::Paused, 2);
        let e = exec(2, ExecState::Admitted);
        let admit = |s| Fact::Exec { before: None, after: &e, sandbox: Some(s) };
        assert!(feed(&mut Pause, &[admit(&ready)]).is_empty());
        assert_eq!(
            feed(&mut Pause, &[admit(&pausing), admit(&resuming)]),
            [
                "S3: exec x1 was admitted to a while its intent is Paused and it is Ready",
                "S3: exec x1 was admitted to a while its intent is Running and it is Paused",
            ]
        );
    }

    #[test]
    fn a_generation_moved_out_of_a_pause_fires() {
        let paused = sandbox("a", Intent::Paused, Phase::Paused, 2);
        let resumed = sandbox("a", Intent::Running, Phase::Ready, 2);
        let restarted = sandbox("a", Intent::Running, Phase::Starting, 3);
        assert!(feed(&mut Pause, &[write(1, Some(&paused), Some(&resumed))]).is_empty());
        assert_eq!(
            feed(&mut Pause, &[write(1, Some(&paused), Some(&restarted))]),
            ["S3: a went from Paused (intent Paused) at generation 2 to generation 3"]
        );
    }

    #[test]
    fn a_record_the_runtime_does_not_bear_out_fires() {
        let paused = sandbox("a", Intent::Paused, Phase::Paused, 2);
        let checkpointed = Sandbox { hold: Hold::Checkpoint, ..paused.clone() };
        let ready = sandbox("a", Intent::Running, Phase::Ready, 2);
        let (freezer, checkpoint) = (Some(Hold::Freezer), Some(Hold::Checkpoint));
        assert_eq!(hold_not_as_recorded(&paused, freezer), None);
        assert_eq!(hold_not_as_recorded(&checkpointed, checkpoint), None);
        assert_eq!(hold_not_as_recorded(&ready, None), None);
        assert_eq!(
            hold_not_as_recorded(&paused, None).as_deref(),
            Some("a is Paused in the freezer at generation 2 but its run is not paused")
        );
        assert_eq!(
            hold_not_as_recorded(&checkpointed, freezer).as_deref(),
            Some("a is Paused to a checkpoint at generation 2 but its run is paused in the freezer")
        );
        assert_eq!(
            hold_not_as_recorded(&ready, checkpoint).as_deref(),
            Some("a is Ready at generation 2 but its run is paused to a checkpoint")
        );
    }
}
