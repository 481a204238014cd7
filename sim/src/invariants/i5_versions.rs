//! I5 (DESIGN 4): versions strictly increase and no acknowledged write is lost. Checked at each
//! commit (a write adds exactly one to the version) and, once the run is over, on the whole
//! history: the CAS store as the clients saw it must be linearizable ([`linear`]).

pub mod linear;

use super::{Checker, Fact, Found, Invariant};
use crate::world::{Commit, Op};

/// I5 at each commit: a write adds exactly one to its record's version.
#[derive(Default)]
pub struct Versions;

impl Checker for Versions {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        if let Fact::Sandbox { before, after: Some(after), .. } = fact
            && let Some(problem) =
                write_problem(&after.name, before.map(|b| b.resource_version), after.resource_version)
        {
            found.push((Invariant::I5, problem));
        }
    }
}

/// Whether a write may take a record at version `before` (`None`: there was none) to `after`.
pub fn next_version(before: Option<u64>, after: u64) -> bool {
    after == before.map_or(1, |b| b + 1)
}

/// The problem with a write that took `name` from version `before` to `after`, if any.
pub fn write_problem(name: &str, before: Option<u64>, after: u64) -> Option<String> {
    if next_version(before, after) {
        return None;
    }
    Some(match before {
        None => format!("{name} was created at version {after}"),
        Some(before) => format!("{name} went from version {before} to {after}"),
    })
}

/// One problem for each sandbox whose history has no linearization.
pub fn not_linearizable(ops: &[Op], commits: &[Commit]) -> Vec<String> {
    linear::check_histories(ops, commits).into_iter().map(|failure| format!("not linearizable: {failure}")).collect()
}

#[cfg(test)]
mod tests {
    use berth_core::{Intent, PhaseKind};

    use super::*;
    use crate::world::{Outcome, Seen};

    #[test]
    fn a_write_must_add_one() {
        assert_eq!(write_problem("sb1", None, 1), None);
        assert_eq!(write_problem("sb1", Some(4), 5), None);
        assert_eq!(write_problem("sb1", None, 2).as_deref(), Some("sb1 was created at version 2"));
        assert_eq!(write_problem("sb1", Some(4), 4).as_deref(), Some("sb1 went from version 4 to 4"));
        assert_eq!(write_problem("sb1", Some(4), 6).as_deref(), Some("sb1 went from version 4 to 6"));
    }

    #[test]
    fn a_read_of_a_version_not_yet_written_is_not_linearizable() {
        let seen = |version| Some(Seen { version, generation: 1, intent: Intent::Running, phase: PhaseKind::Ready });
        let commits = vec![
            Commit { t: 10, sandbox: "sb1".into(), after: seen(1) },
            Commit { t: 20, sandbox: "sb1".into(), after: seen(2) },
        ];
        let get = |returned, version| Op {
            client: 0,
            sandbox: "sb1".into(),
            kind: "get",
            expected_version: None,
            called: 12,
            returned,
            outcome: Outcome::Ok(seen(version)),
        };
        assert_eq!(not_linearizable(&[get(25, 2)], &commits), Vec::<String>::new());
        // No order of the read and the writes fits: the search backtracks to the first write and
        // names it.
        let problem = format!(
            "not linearizable: sb1: no linearization places the store's write {:?} between 10 and 10 us",
            seen(1)
        );
        assert_eq!(not_linearizable(&[get(18, 2)], &commits), [problem]);
    }
}
