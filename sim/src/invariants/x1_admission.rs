//! X1 (DESIGN 8.1): an exec is admitted only while its sandbox is Ready, for the sandbox's
//! current generation, and an exec's terminal state is final. E1-E4 check what runs and what
//! readers see; this checks the records the store commits, which are what every gateway and
//! supervisor acts on.

use berth_core::PhaseKind;
use berth_core::exec::Exec;

use super::{Checker, Fact, Found, Invariant};

/// X1 needs no evidence of its own: each exec write comes with the record it was judged against.
#[derive(Default)]
pub struct Admission;

impl Checker for Admission {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        let Fact::Exec { before, after, sandbox } = fact else { return };
        let problem = match before {
            None => admitted_wrongly(after, *sandbox),
            Some(b) if b.state.is_terminal() && b.state != after.state => {
                Some(format!("exec {} of {} went from {:?} to {:?}", after.id, after.sandbox, b.state, after.state))
            }
            Some(_) => None,
        };
        found.extend(problem.map(|p| (Invariant::X1, p)));
    }
}

/// The problem with admitting `exec` against `sandbox` (as the commit found it), if any.
fn admitted_wrongly(exec: &Exec, sandbox: Option<&berth_core::Sandbox>) -> Option<String> {
    let Some(s) = sandbox else {
        return Some(format!("exec {} was admitted to {}, which has no record", exec.id, exec.sandbox));
    };
    (s.phase.kind() != PhaseKind::Ready || s.generation != exec.generation).then(|| {
        format!(
            "exec {} was admitted to {} for generation {} while it is {} at generation {}",
            exec.id, s.name, exec.generation, s.phase, s.generation
        )
    })
}

#[cfg(test)]
mod tests {
    use berth_core::exec::{ExecEnd, ExecState};
    use berth_core::{Intent, Phase};

    use super::*;
    use crate::invariants::{exec, feed, sandbox};

    #[test]
    fn an_exec_admitted_to_a_sandbox_not_ready_or_of_another_generation_fires() {
        let ready = sandbox("a", Intent::Running, Phase::Ready, 2);
        let starting = sandbox("a", Intent::Running, Phase::Starting, 2);
        let (now, old) = (exec(2, ExecState::Admitted), exec(1, ExecState::Admitted));
        let admit = |e, s| Fact::Exec { before: None, after: e, sandbox: Some(s) };
        assert!(feed(&mut Admission, &[admit(&now, &ready)]).is_empty());
        assert_eq!(
            feed(&mut Admission, &[admit(&now, &starting), admit(&old, &ready)]),
            [
                "X1: exec x1 was admitted to a for generation 2 while it is Starting at generation 2",
                "X1: exec x1 was admitted to a for generation 1 while it is Ready at generation 2",
            ]
        );
    }

    #[test]
    fn a_terminal_exec_changing_state_fires() {
        let ended = exec(1, ExecState::Ended { end: ExecEnd::Exited(0), message: String::new() });
        let counted = Exec { output_bytes: Some(10), ..ended.clone() };
        let lost = exec(1, ExecState::Lost { message: "run ended".into() });
        let update = |b, a| Fact::Exec { before: Some(b), after: a, sandbox: None };
        assert!(feed(&mut Admission, &[update(&ended, &counted)]).is_empty(), "the state is kept");
        assert_eq!(feed(&mut Admission, &[update(&ended, &lost)]).len(), 1);
    }
}
