//! I5's history check: the CAS store as clients see it must be linearizable. A WGL search (Wing
//! & Gong, with Lowe's memoisation) over each sandbox's history, P-compositionally, one sandbox
//! name at a time.
//!
//! A history holds the clients' operations (each between its call and its return) and the
//! store's own committed writes (instantaneous). The sequential specification is a versioned
//! register: a write must take version v to v + 1 (or create at 1); a client's reply must match
//! the record at its linearization point (a returned record exactly; NOT_FOUND only while there is
//! none; ABORTED only while the version differs from the client's, and is the current one it
//! names; FAILED_PRECONDITION only in a phase that refuses the command). Operations without an
//! answer constrain nothing. I4 is part of it: a command carrying a stale version never succeeds.

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

use berth_core::{Intent, PhaseKind};

use crate::world::{Commit, Op, Outcome, Seen};

/// A sequential specification: `step` is the state after `op`, or `None` if `op` cannot happen
/// in `state`.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Op;
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
}

pub struct Entry<O> {
    pub call: u64,
    pub ret: u64,
    pub op: O,
}

/// Whether the history has a linearization; `Err(i)` names an operation that has none.
pub fn check<M: Model>(model: &M, init: M::State, history: &[Entry<M::Op>]) -> Result<(), usize> {
    // Calls before returns at equal times: operations that touch the same instant overlap.
    let mut events: Vec<(u64, bool, usize)> =
        history.iter().enumerate().flat_map(|(i, e)| [(e.call, false, i), (e.ret, true, i)]).collect();
    events.sort();
    let mut linearized = vec![false; history.len()];
    let mut done = 0;
    let mut cache: HashSet<(Vec<bool>, M::State)> = HashSet::new();
    let mut stack: Vec<(usize, M::State, usize)> = Vec::new();
    let mut state = init;
    let mut pos = 0;
    while done < history.len() {
        while pos < events.len() && linearized[events[pos].2] {
            pos += 1;
        }
        let (_, is_return, i) = events[pos];
        if !is_return {
            if let Some(next) = model.step(&state, &history[i].op) {
                linearized[i] = true;
                if cache.insert((linearized.clone(), next.clone())) {
                    stack.push((i, state, pos));
                    state = next;
                    done += 1;
                    pos = 0;
                    continue;
                }
                linearized[i] = false;
            }
            pos += 1;
        } else {
            // `i` returned without being linearized: undo the latest choice.
            let Some((j, previous, at)) = stack.pop() else { return Err(i) };
            linearized[j] = false;
            done -= 1;
            state = previous;
            pos = at + 1;
        }
    }
    Ok(())
}

pub enum SandboxOp {
    Commit(Option<Seen>),
    Client { kind: &'static str, expected: Option<u64>, outcome: Outcome },
}

/// Whether `s` has a live run that a pause or a resume acts on.
fn live(s: &Seen) -> bool {
    matches!(s.phase, PhaseKind::Ready | PhaseKind::Paused)
}

/// The versioned register one sandbox name is.
pub struct Register;

fn current_named(message: &str) -> Option<u64> {
    message.rsplit("current ").next()?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

impl Model for Register {
    type State = Option<Seen>;
    type Op = SandboxOp;

    fn step(&self, state: &Option<Seen>, op: &SandboxOp) -> Option<Option<Seen>> {
        match op {
            SandboxOp::Commit(after) => {
                let valid = match (state, after) {
                    (_, Some(a)) => super::next_version(state.as_ref().map(|s| s.version), a.version),
                    (Some(_), None) => true,
                    (None, None) => false,
                };
                valid.then(|| after.clone())
            }
            SandboxOp::Client { kind, expected, outcome } => {
                let holds = match outcome {
                    // I4: a command carrying a version succeeds only from that version: it wrote
                    // the next one, or was a no-op and returns it unchanged.
                    Outcome::Ok(Some(seen)) if expected.is_some_and(|e| seen.version != e && seen.version != e + 1) => {
                        false
                    }
                    Outcome::Ok(Some(seen)) => state.as_ref() == Some(seen),
                    Outcome::Ok(None) | Outcome::Unknown => true,
                    Outcome::Failed { code, message } => match code.as_str() {
                        "NotFound" => state.is_none(),
                        "AlreadyExists" => state.is_some(),
                        "Aborted" => state.as_ref().is_some_and(|s| {
                            Some(s.version) != *expected && current_named(message).is_none_or(|c| c == s.version)
                        }),
                        "FailedPrecondition" => match *kind {
                            "stop" => state.as_ref().is_some_and(|s| s.phase == PhaseKind::Deleting),
                            // Busy stopping or deleting; or ended (Stopped, or Error) past an
                            // absolute deadline, which the register does not hold: the reply
                            // names it (DESIGN 9.1).
                            "start" => state.as_ref().is_some_and(|s| match s.phase {
                                PhaseKind::Stopping | PhaseKind::Deleting | PhaseKind::Paused => true,
                                _ if s.intent == Intent::Paused => true,
                                PhaseKind::Stopped | PhaseKind::Error => message.contains("past its deadline"),
                                _ => false,
                            }),
                            // Only a live run (Ready, or paused) is paused or resumed, and a
                            // paused one only as it is paused already; a paused one past its
                            // deadline is renewed before it is resumed. A driver that cannot
                            // checkpoint refuses every checkpoint, whatever the record says.
                            "checkpoint" if message.contains("cannot checkpoint here") => true,
                            "pause" | "checkpoint" => state.as_ref().is_some_and(|s| match s.intent {
                                Intent::Paused => message.contains("already: resume it before pausing it"),
                                _ => !live(s),
                            }),
                            "resume" => state.as_ref().is_some_and(|s| match s.intent {
                                Intent::Paused => message.contains("past its deadline"),
                                _ => !live(s),
                            }),
                            _ => true,
                        },
                        _ => true,
                    },
                };
                holds.then(|| state.clone())
            }
        }
    }
}

/// Checks every sandbox's history; returns a description of each one that is not linearizable.
pub fn check_histories(ops: &[Op], commits: &[Commit]) -> Vec<String> {
    let mut histories: BTreeMap<&str, Vec<Entry<SandboxOp>>> = BTreeMap::new();
    for c in commits {
        histories.entry(&c.sandbox).or_default().push(Entry {
            call: c.t,
            ret: c.t,
            op: SandboxOp::Commit(c.after.clone()),
        });
    }
    for op in ops.iter().filter(|o| o.outcome != Outcome::Unknown) {
        histories.entry(&op.sandbox).or_default().push(Entry {
            call: op.called,
            ret: op.returned,
            op: SandboxOp::Client { kind: op.kind, expected: op.expected_version, outcome: op.outcome.clone() },
        });
    }
    let mut failures = Vec::new();
    for (name, history) in histories {
        if let Err(i) = check(&Register, None, &history) {
            let what = match &history[i].op {
                SandboxOp::Commit(after) => format!("the store's write {after:?}"),
                SandboxOp::Client { kind, expected, outcome } => {
                    format!("{kind} (expected {expected:?}) -> {outcome:?}")
                }
            };
            failures.push(format!(
                "{name}: no linearization places {what} between {} and {} us",
                history[i].call, history[i].ret
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(version: u64, phase: PhaseKind) -> Seen {
        Seen { version, generation: 1, intent: Intent::Running, phase }
    }

    fn commit(t: u64, after: Option<Seen>) -> Entry<SandboxOp> {
        Entry { call: t, ret: t, op: SandboxOp::Commit(after) }
    }

    fn client(call: u64, ret: u64, kind: &'static str, expected: Option<u64>, outcome: Outcome) -> Entry<SandboxOp> {
        Entry { call, ret, op: SandboxOp::Client { kind, expected, outcome } }
    }

    fn failed(code: &str, message: &str) -> Outcome {
        Outcome::Failed { code: code.into(), message: message.into() }
    }

    #[test]
    fn replies_must_match_a_state_inside_their_window() {
        let base =
            || vec![commit(10, Some(seen(1, PhaseKind::Provisioning))), commit(20, Some(seen(2, PhaseKind::Ready)))];
        let mut ok = base();
        ok.push(client(5, 15, "get", None, Outcome::Ok(Some(seen(1, PhaseKind::Provisioning)))));
        ok.push(client(15, 25, "get", None, Outcome::Ok(Some(seen(2, PhaseKind::Ready)))));
        ok.push(client(0, 5, "get", None, failed("NotFound", "")));
        assert_eq!(check(&Register, None, &ok), Ok(()));
        // Version 2 was not committed before this read returned.
        let mut stale_future = base();
        stale_future.push(client(12, 18, "get", None, Outcome::Ok(Some(seen(2, PhaseKind::Ready)))));
        assert!(check(&Register, None, &stale_future).is_err());
        // A read after version 2 cannot see version 1 again.
        let mut went_back = base();
        went_back.push(client(21, 30, "get", None, Outcome::Ok(Some(seen(1, PhaseKind::Provisioning)))));
        assert!(check(&Register, None, &went_back).is_err());
    }

    #[test]
    fn aborted_only_with_a_stale_version_and_writes_must_add_one() {
        let mut history =
            vec![commit(10, Some(seen(1, PhaseKind::Ready))), commit(20, Some(seen(2, PhaseKind::Ready)))];
        history.push(client(21, 30, "stop", Some(1), failed("Aborted", "expected resource_version 1, current 2")));
        assert_eq!(check(&Register, None, &history), Ok(()));
        history.push(client(11, 15, "stop", Some(1), failed("Aborted", "expected resource_version 1, current 1")));
        assert!(check(&Register, None, &history).is_err(), "ABORTED while the client's version was current");
        let skipped = vec![commit(10, Some(seen(1, PhaseKind::Ready))), commit(20, Some(seen(3, PhaseKind::Ready)))];
        assert!(check(&Register, None, &skipped).is_err(), "a lost write");
    }

    #[test]
    fn a_start_is_refused_only_while_busy_or_once_ended_past_its_deadline() {
        let past = || failed("FailedPrecondition", "sandbox 'a' is past its deadline: renew it before starting it");
        for (phase, refusal, holds) in [
            (PhaseKind::Stopping, failed("FailedPrecondition", "cannot start sandbox 'a' while it is Stopping"), true),
            (PhaseKind::Stopped, past(), true),
            (PhaseKind::Error, past(), true),
            (PhaseKind::Ready, past(), false),
            (PhaseKind::Stopped, failed("FailedPrecondition", "cannot start sandbox 'a' while it is Stopped"), false),
        ] {
            let history = vec![commit(10, Some(seen(1, phase))), client(20, 30, "start", None, refusal)];
            assert_eq!(check(&Register, None, &history).is_ok(), holds, "{phase:?}");
        }
    }

    #[test]
    fn a_stale_version_never_succeeds() {
        let mut history =
            vec![commit(10, Some(seen(1, PhaseKind::Ready))), commit(20, Some(seen(2, PhaseKind::Stopping)))];
        history.push(client(15, 25, "stop", Some(1), Outcome::Ok(Some(seen(2, PhaseKind::Stopping)))));
        assert_eq!(check(&Register, None, &history), Ok(()));
        history.push(client(21, 30, "stop", Some(0), Outcome::Ok(Some(seen(2, PhaseKind::Stopping)))));
        assert!(check(&Register, None, &history).is_err());
    }

    #[test]
    fn the_search_backtracks_over_overlapping_operations() {
        // Two overlapping reads that must be ordered against the commits differently than
        // their call order suggests.
        let history = vec![
            client(0, 100, "get", None, Outcome::Ok(Some(seen(2, PhaseKind::Ready)))),
            client(1, 100, "get", None, Outcome::Ok(Some(seen(1, PhaseKind::Starting)))),
            commit(10, Some(seen(1, PhaseKind::Starting))),
            commit(20, Some(seen(2, PhaseKind::Ready))),
        ];
        assert_eq!(check(&Register, None, &history), Ok(()));
        let impossible = vec![
            client(0, 15, "get", None, Outcome::Ok(Some(seen(2, PhaseKind::Ready)))),
            commit(10, Some(seen(1, PhaseKind::Starting))),
            commit(20, Some(seen(2, PhaseKind::Ready))),
        ];
        assert!(check(&Register, None, &impossible).is_err());
    }
}
