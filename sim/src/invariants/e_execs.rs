//! E1-E4 (DESIGN 11): an exec id runs at most once, only in the run of the generation it was
//! admitted for, every exec ends within a bound of its run's end, and every reader sees the
//! same bytes at the same offsets and the same end.

use std::collections::BTreeMap;

use berth_core::exec::{Exec, ExecState};

use super::{Checker, Fact, Found, Invariant};

/// E1's and E4's evidence: how often each exec id was launched in each sandbox, and the first
/// end any reader saw of each exec (by its sandbox, its id and when it was admitted: an id may
/// be used again once its exec is gone with its sandbox).
#[derive(Default)]
pub struct Execs {
    launches: BTreeMap<(String, String), u32>,
    ends: BTreeMap<(String, String, i64), ExecState>,
}

impl Checker for Execs {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match *fact {
            Fact::Launched { sandbox, exec } => {
                let n = self.launches.entry((sandbox.to_string(), exec.to_string())).or_insert(0);
                *n += 1;
                found.extend(launched_again(sandbox, exec, *n).map(|p| (Invariant::E1, p)));
            }
            Fact::ExecEnded { sandbox, exec, admitted, state } => {
                let key = (sandbox.to_string(), exec.to_string(), admitted);
                let first = self.ends.entry(key).or_insert_with(|| state.clone());
                found.extend(other_end(exec, first, state).map(|p| (Invariant::E4, p)));
            }
            _ => {}
        }
    }
}

/// E1, when `exec` of `sandbox` is launched for the `launches`th time.
pub fn launched_again(sandbox: &str, exec: &str, launches: u32) -> Option<String> {
    (launches > 1).then(|| format!("exec {exec} of {sandbox} was launched {launches} times"))
}

/// E2: a run of `run_generation` launched an exec admitted for `admitted` (or one the store has
/// no record of: `None`).
pub fn launched_elsewhere(sandbox: &str, exec: &str, run_generation: u64, admitted: Option<u64>) -> Option<String> {
    match admitted {
        Some(g) if g == run_generation => None,
        Some(g) => Some(format!(
            "exec {exec} of {sandbox} admitted for generation {g} ran in generation {run_generation}'s run"
        )),
        None => {
            Some(format!("generation {run_generation}'s run of {sandbox} launched exec {exec}, which has no record"))
        }
    }
}

/// E3 at the end of the quiet phase: every exec has ended (the workload's commands are short,
/// and a run that is over ends its execs), but for those of a run held paused: the freezer
/// holds them with it (`frozen`), and they go on when it is resumed.
pub fn still_open(exec: &Exec, frozen: bool) -> Option<String> {
    (!exec.state.is_terminal() && !frozen)
        .then(|| format!("exec {} of {} is still {:?} after the quiet phase", exec.id, exec.sandbox, exec.state))
}

/// E4 on a chunk a reader got: its bytes must be the command's bytes at that offset.
pub fn wrong_bytes(exec: &str, offset: u64, data: &[u8], expected: impl Fn(u64) -> u8) -> Option<String> {
    let bad = data.iter().enumerate().find(|(i, b)| **b != expected(offset + *i as u64))?;
    Some(format!(
        "a reader of exec {exec} got byte {} at offset {}, not {}",
        bad.1,
        offset + bad.0 as u64,
        expected(offset + bad.0 as u64)
    ))
}

/// E4 on the end a reader got, against the first end any reader got of the same exec.
pub fn other_end(exec: &str, first: &ExecState, this: &ExecState) -> Option<String> {
    (first != this).then(|| format!("readers of exec {exec} saw it end as {first:?} and as {this:?}"))
}

#[cfg(test)]
mod tests {
    use berth_core::exec::ExecEnd;

    use super::*;

    #[test]
    fn the_checker_counts_launches_and_keeps_each_execs_first_end() {
        let exited = |code| ExecState::Ended { end: ExecEnd::Exited(code), message: String::new() };
        let (zero, one) = (exited(0), exited(1));
        let found = crate::invariants::feed(
            &mut Execs::default(),
            &[
                Fact::Launched { sandbox: "sb1", exec: "e1" },
                Fact::Launched { sandbox: "sb2", exec: "e1" },
                Fact::ExecEnded { sandbox: "sb1", exec: "e1", admitted: 5, state: &zero },
                Fact::ExecEnded { sandbox: "sb1", exec: "e1", admitted: 5, state: &zero },
                Fact::ExecEnded { sandbox: "sb1", exec: "e1", admitted: 9, state: &one },
                Fact::Launched { sandbox: "sb1", exec: "e1" },
                Fact::ExecEnded { sandbox: "sb1", exec: "e1", admitted: 5, state: &one },
            ],
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0], "E1: exec e1 of sb1 was launched 2 times");
        assert!(found[1].starts_with("E4: readers of exec e1 saw it end as"), "{found:?}");
    }

    #[test]
    fn each_rule_names_what_broke_it() {
        assert_eq!(launched_again("sb1", "e1", 1), None);
        assert_eq!(launched_again("sb1", "e1", 2).unwrap(), "exec e1 of sb1 was launched 2 times");
        assert_eq!(launched_elsewhere("sb1", "e1", 3, Some(3)), None);
        assert!(
            launched_elsewhere("sb1", "e1", 4, Some(3))
                .unwrap()
                .contains("admitted for generation 3 ran in generation 4")
        );
        assert!(launched_elsewhere("sb1", "e1", 4, None).unwrap().contains("no record"));
        let pattern = |offset: u64| (offset % 7) as u8;
        assert_eq!(wrong_bytes("e1", 7, &[0, 1, 2], pattern), None);
        assert!(wrong_bytes("e1", 7, &[0, 9, 2], pattern).unwrap().contains("byte 9 at offset 8, not 1"));
        let exited = ExecState::Ended { end: ExecEnd::Exited(0), message: String::new() };
        let lost = ExecState::Lost { message: "x".into() };
        assert_eq!(other_end("e1", &exited, &exited), None);
        assert!(other_end("e1", &exited, &lost).is_some());
    }
}
