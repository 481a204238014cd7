//! C1 (DESIGN 3.1, 3.2, 3.5): what every sandbox write the store commits must keep, whoever
//! made it, and what a create's reply must say.
//!
//! - An id is never reused; a name is unique among live records and never changes; a record
//!   has at most 32 providers (3.1).
//! - A create writes generation 1, intent Running, Provisioning (3.2); its reply is the record
//!   it committed, id and all.
//! - A generation moves only by one, in a write that leaves the record Starting with intent
//!   Running, as Start (and a policy's restart, 9.2) writes it (3.2).
//! - Deleting is left only by the record's removal, and only a Deleting record is removed
//!   (3.2, 3.5 rule 1).
//! - Within one generation the phase never goes back from Error or Stopped to Ready (3.5 rule 7).
//! - After the quiet phase no record that is not Deleting names a provider the store no longer
//!   has (3.2: a provider delete and an attach never both commit).

use std::collections::{BTreeMap, BTreeSet};

use berth_core::{Intent, Phase, PhaseKind, Sandbox, SandboxId};

use super::{Checker, Fact, Found, Invariant};
use crate::world::{Outcome, Seen};

/// A sandbox's providers, at most (DESIGN 3.1).
const MAX_PROVIDERS: usize = 32;

/// C1's evidence: every id ever created, the live records' names, and each create's commit.
#[derive(Default)]
pub struct Records {
    ids: BTreeSet<SandboxId>,
    names: BTreeMap<String, SandboxId>,
    /// Per id: its name, when its create committed (µs) and the record it wrote.
    created: BTreeMap<String, (String, u64, Seen)>,
}

impl Checker for Records {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        let mut problems = Vec::new();
        match fact {
            Fact::Sandbox { t, before: None, after: Some(a), .. } => problems.extend(self.create(*t, a)),
            Fact::Sandbox { before: Some(b), after: Some(a), .. } => problems.extend(update(b, a)),
            Fact::Sandbox { before: Some(b), after: None, .. } => {
                self.names.remove(&*b.name);
                if b.phase.kind() != PhaseKind::Deleting {
                    problems.push(format!("{} was removed in {}", b.name, b.phase));
                }
            }
            Fact::Reply { op, id } => problems.extend(self.reply(op, *id)),
            Fact::Converged { records, providers, .. } => {
                let names: BTreeSet<&str> = providers.iter().map(|p| p.name.as_str()).collect();
                for s in records.iter().filter(|s| s.phase.kind() != PhaseKind::Deleting) {
                    let gone: Vec<&String> = s.providers.iter().filter(|p| !names.contains(p.as_str())).collect();
                    if !gone.is_empty() {
                        problems.push(format!("{} in {} is attached to deleted provider(s) {gone:?}", s.name, s.phase));
                    }
                }
            }
            _ => {}
        }
        found.extend(problems.into_iter().map(|p| (Invariant::C1, p)));
    }
}

impl Records {
    fn create(&mut self, t: u64, a: &Sandbox) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.ids.insert(a.id.clone()) {
            problems.push(format!("{} was created with id {}, used before", a.name, a.id));
        }
        if let Some(holder) = self.names.insert(a.name.to_string(), a.id.clone()) {
            problems.push(format!("{} was created as {} while {holder} holds that name", a.name, a.id));
        }
        if (a.generation, a.intent, a.phase.kind()) != (1, Intent::Running, PhaseKind::Provisioning) {
            problems.push(format!(
                "{} was created at generation {} with intent {:?} in {}, not generation 1, Running, Provisioning",
                a.name, a.generation, a.intent, a.phase
            ));
        }
        problems.extend(too_many_providers(a));
        self.created.insert(a.id.to_string(), (a.name.to_string(), t, crate::checker::seen(a)));
        problems
    }

    /// A create's reply must be the record its create committed, after the call was made.
    fn reply(&self, op: &crate::world::Op, id: Option<&str>) -> Option<String> {
        let (Outcome::Ok(Some(seen)), "create", Some(id)) = (&op.outcome, op.kind, id) else { return None };
        let name = &op.sandbox;
        match self.created.get(id) {
            None => Some(format!("a create of {name} answered {id}, which no create committed")),
            Some((made, t, _)) if made != name || *t < op.called => Some(format!(
                "a create of {name} answered {id}, which is {made}'s, created at {t} µs (the call was at {} µs)",
                op.called
            )),
            Some((_, _, written)) if written != seen => {
                Some(format!("a create of {name} answered {seen:?}, but it committed {written:?}"))
            }
            Some(_) => None,
        }
    }
}

fn too_many_providers(s: &Sandbox) -> Option<String> {
    (s.providers.len() > MAX_PROVIDERS).then(|| format!("{} has {} providers", s.name, s.providers.len()))
}

/// The problems with a write from `b` to `a`.
fn update(b: &Sandbox, a: &Sandbox) -> Vec<String> {
    let mut problems = Vec::new();
    let name = &b.name;
    if a.name != b.name {
        problems.push(format!("{name} was renamed {}", a.name));
    }
    problems.extend(too_many_providers(a));
    if a.generation == b.generation + 1 {
        if (a.intent, a.phase.kind()) != (Intent::Running, PhaseKind::Starting) {
            problems.push(format!(
                "{name} went to generation {} with intent {:?} in {}, not Running and Starting",
                a.generation, a.intent, a.phase
            ));
        }
    } else if a.generation != b.generation {
        problems.push(format!("{name} went from generation {} to {}", b.generation, a.generation));
    }
    if b.phase.kind() == PhaseKind::Deleting && a.phase.kind() != PhaseKind::Deleting {
        problems.push(format!("{name} left Deleting for {}", a.phase));
    }
    let ended = matches!(b.phase, Phase::Error(_) | Phase::Stopped);
    if ended && a.generation == b.generation && a.phase.kind() == PhaseKind::Ready {
        problems.push(format!("{name} went from {} back to Ready within generation {}", b.phase, a.generation));
    }
    problems
}

#[cfg(test)]
mod tests {
    use berth_core::{Failure, FailureReason};

    use super::*;
    use crate::invariants::{converged, feed, sandbox, write};
    use crate::world::Op;

    fn records(facts: &[Fact<'_>]) -> Vec<String> {
        feed(&mut Records::default(), facts)
    }

    #[test]
    fn a_reused_id_a_taken_name_or_a_wrong_first_record_fires() {
        let a = sandbox("a", Intent::Running, Phase::Provisioning, 1);
        let deleting = Sandbox { phase: Phase::Deleting, intent: Intent::Deleted, ..a.clone() };
        let twin = Sandbox { id: SandboxId::new("id-twin"), ..a.clone() };
        assert!(
            records(&[write(1, None, Some(&a)), write(2, Some(&a), Some(&deleting)), write(3, Some(&deleting), None)])
                .is_empty()
        );
        assert_eq!(
            records(&[write(1, None, Some(&a)), write(2, Some(&a), None), write(3, None, Some(&a))]),
            ["C1: a was removed in Provisioning", "C1: a was created with id id-a, used before"]
        );
        assert_eq!(
            records(&[write(1, None, Some(&a)), write(2, None, Some(&twin))]),
            ["C1: a was created as id-twin while id-a holds that name"]
        );
        let ready = sandbox("b", Intent::Running, Phase::Ready, 2);
        assert_eq!(
            records(&[write(1, None, Some(&ready))]),
            ["C1: b was created at generation 2 with intent Running in Ready, not generation 1, Running, Provisioning"]
        );
    }

    #[test]
    fn a_generation_skipped_or_not_started_a_deleting_record_revived_or_a_ready_after_an_end_fires() {
        let error = Phase::Error(Failure {
            reason: FailureReason::ContainerExited,
            exit_code: Some(1),
            message: String::new(),
        });
        let failed = sandbox("a", Intent::Running, error, 1);
        let started = sandbox("a", Intent::Running, Phase::Starting, 2);
        assert!(records(&[write(1, Some(&failed), Some(&started))]).is_empty(), "a Start");
        let skipped = sandbox("a", Intent::Running, Phase::Starting, 3);
        let stopped_next = sandbox("a", Intent::Stopped, Phase::Stopped, 2);
        let ready_again = sandbox("a", Intent::Running, Phase::Ready, 1);
        let deleting = sandbox("a", Intent::Deleted, Phase::Deleting, 1);
        assert_eq!(
            records(&[
                write(1, Some(&failed), Some(&skipped)),
                write(2, Some(&failed), Some(&stopped_next)),
                write(3, Some(&failed), Some(&ready_again)),
                write(4, Some(&deleting), Some(&ready_again)),
            ]),
            [
                "C1: a went from generation 1 to 3",
                "C1: a went to generation 2 with intent Stopped in Stopped, not Running and Starting",
                "C1: a went from Error (ContainerExited) back to Ready within generation 1",
                "C1: a left Deleting for Ready",
            ]
        );
    }

    #[test]
    fn a_create_reply_must_be_what_its_create_committed() {
        let a = sandbox("a", Intent::Running, Phase::Provisioning, 1);
        let seen = crate::checker::seen(&a);
        let op = |outcome| Op {
            client: 0,
            sandbox: "a".into(),
            kind: "create",
            expected_version: None,
            called: 1_000_000,
            returned: 2_000_000,
            outcome,
        };
        let right = op(Outcome::Ok(Some(seen.clone())));
        let wrong = op(Outcome::Ok(Some(Seen { phase: PhaseKind::Ready, ..seen })));
        assert!(records(&[write(1, None, Some(&a)), Fact::Reply { op: &right, id: Some("id-a") }]).is_empty());
        assert_eq!(
            records(&[Fact::Reply { op: &right, id: Some("id-a") }]),
            ["C1: a create of a answered id-a, which no create committed"]
        );
        assert_eq!(records(&[write(1, None, Some(&a)), Fact::Reply { op: &wrong, id: Some("id-a") }]).len(), 1);
    }

    #[test]
    fn a_record_attached_to_a_deleted_provider_fires_after_the_quiet_phase() {
        let mut a = sandbox("a", Intent::Running, Phase::Ready, 1);
        std::sync::Arc::make_mut(&mut a.providers).insert("p1".into());
        let deleting = Sandbox { phase: Phase::Deleting, ..a.clone() };
        assert_eq!(
            records(&[converged(&[a.clone(), deleting], &[])]),
            ["C1: a in Ready is attached to deleted provider(s) [\"p1\"]"]
        );
    }
}
