//! P1 (DESIGN 11): no pool member is claimed twice; after faults stop each pool has
//! `min_ready` Ready members. With it, the rest of DESIGN 9.4's pool promises: a claim hands
//! out a Ready member (its commit takes a Ready one, its reply says Ready), and a fill never
//! makes a pool larger than its size, members on their way out included (refills never run
//! ahead of deletions).

use std::collections::{BTreeMap, BTreeSet};

use berth_core::template::{POOL_LABEL, Template, is_member};
use berth_core::{Intent, PhaseKind, Sandbox, SandboxId};

use super::{Checker, Fact, Found, Invariant};

/// P1's evidence: the claims' replies, each template's size, and each pool's members as the
/// store's commits made them.
#[derive(Default)]
pub struct Pools {
    claims: Claims,
    sizes: BTreeMap<String, u32>,
    members: BTreeMap<String, BTreeSet<SandboxId>>,
}

impl Checker for Pools {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match fact {
            Fact::Template(t) => {
                self.sizes.insert(t.name.clone(), t.min_ready);
            }
            Fact::Claimed { id, name, claimer, seen } => {
                found.extend(self.claims.claimed(id, name, claimer).map(|p| (Invariant::P1, p)));
                if (seen.phase, seen.intent) != (PhaseKind::Ready, Intent::Running) {
                    let (phase, intent) = (seen.phase, seen.intent);
                    found.push((
                        Invariant::P1,
                        format!("{claimer} was handed {name} in {phase:?} with intent {intent:?}"),
                    ));
                }
            }
            Fact::Sandbox { before, after, .. } => {
                found.extend(self.commit(*before, *after).map(|p| (Invariant::P1, p)))
            }
            Fact::Converged { records, templates, .. } => {
                found.extend(templates.iter().filter_map(|t| not_refilled(t, records)).map(|p| (Invariant::P1, p)));
            }
            _ => {}
        }
    }
}

impl Pools {
    /// Follows a pool's members through one sandbox write; the problem if it is a claim of a
    /// member not claimable, or a fill past the pool's size.
    fn commit(&mut self, before: Option<&Sandbox>, after: Option<&Sandbox>) -> Option<String> {
        let mut problem = before.zip(after).and_then(|(b, a)| claimed_unready(b, a));
        if let Some(b) = before
            && let Some(template) = b.spec.labels.get(POOL_LABEL)
        {
            self.members.entry(template.clone()).or_default().remove(&b.id);
        }
        if let Some(a) = after
            && let Some(template) = a.spec.labels.get(POOL_LABEL)
        {
            let size = self.sizes.get(template).copied().unwrap_or(0) as usize;
            let members = self.members.entry(template.clone()).or_default();
            if before.is_none() && members.len() >= size {
                let had = members.len();
                problem = problem.or(Some(format!(
                    "{} was made for pool {template} of size {size}, which already had {had} members",
                    a.name
                )));
            }
            members.insert(a.id.clone());
        }
        problem
    }
}

/// The problem with a write that took a member out of its pool, if the member was not Ready
/// and wanted running: a claim hands out only a Ready member.
pub fn claimed_unready(before: &Sandbox, after: &Sandbox) -> Option<String> {
    let template = before.spec.labels.get(POOL_LABEL)?;
    let claimed = !is_member(after, template);
    let ready = before.phase.kind() == PhaseKind::Ready && before.intent == Intent::Running;
    (claimed && !ready).then(|| {
        format!("{} was claimed from pool {template} in {} with intent {:?}", before.name, before.phase, before.intent)
    })
}

/// Who claimed each sandbox, as the claims' replies said.
#[derive(Debug, Default)]
pub struct Claims {
    by_id: BTreeMap<String, String>,
}

impl Claims {
    /// Records that `claimer` got sandbox `id` (named `name`); the problem if another claim
    /// got it already.
    pub fn claimed(&mut self, id: &str, name: &str, claimer: &str) -> Option<String> {
        let first = self.by_id.insert(id.to_string(), claimer.to_string());
        first.map(|first| format!("{name} ({id}) was claimed by {first} and again by {claimer}"))
    }
}

/// The problem with `template`'s pool after the quiet phase, given every record.
pub fn not_refilled(template: &Template, records: &[Sandbox]) -> Option<String> {
    let members: Vec<&Sandbox> = records.iter().filter(|s| is_member(s, &template.name)).collect();
    let ready = members.iter().filter(|s| s.phase.kind() == PhaseKind::Ready).count();
    let wanted = template.min_ready as usize;
    (ready != wanted || members.len() != wanted).then(|| {
        let phases: Vec<String> = members.iter().map(|s| format!("{} {}", s.name, s.phase)).collect();
        format!(
            "pool {} keeps {wanted} Ready, but after the quiet phase has {ready} Ready of {} members: {phases:?}",
            template.name,
            members.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use berth_core::Phase;

    use super::*;
    use crate::invariants::{feed, sandbox, write};

    #[test]
    fn a_second_claim_of_one_sandbox_fires() {
        let mut claims = Claims::default();
        assert_eq!(claims.claimed("id-1", "web-1", "client 0"), None);
        assert_eq!(claims.claimed("id-2", "web-2", "client 1"), None);
        assert_eq!(
            claims.claimed("id-1", "web-1", "client 2").as_deref(),
            Some("web-1 (id-1) was claimed by client 0 and again by client 2")
        );
    }

    fn template(min_ready: u32) -> Template {
        Template {
            name: "web".into(),
            spec: Default::default(),
            min_ready,
            made: 0,
            resource_version: 1,
            created_at: Default::default(),
            updated_at: Default::default(),
        }
    }

    fn member(name: &str, phase: Phase) -> Sandbox {
        let mut s = sandbox(name, Intent::Running, phase, 1);
        std::sync::Arc::make_mut(&mut s.spec).labels.insert(POOL_LABEL.into(), "web".into());
        s
    }

    fn claimed(member: &Sandbox) -> Sandbox {
        let mut s = member.clone();
        std::sync::Arc::make_mut(&mut s.spec).labels.remove(POOL_LABEL);
        s
    }

    #[test]
    fn a_claim_of_a_member_not_ready_fires_at_its_commit_and_its_reply() {
        let ready = member("a", Phase::Ready);
        let starting = member("b", Phase::Starting);
        let (t, took_ready, took_starting) = (template(2), claimed(&ready), claimed(&starting));
        let mut pools = Pools::default();
        let seen = |phase| crate::world::Seen { version: 2, generation: 1, intent: Intent::Running, phase };
        let (ready_seen, starting_seen) = (seen(PhaseKind::Ready), seen(PhaseKind::Starting));
        let facts = [
            Fact::Template(&t),
            write(1, None, Some(&ready)),
            write(1, None, Some(&starting)),
            write(2, Some(&ready), Some(&took_ready)),
            Fact::Claimed { id: "id-a", name: "a", claimer: "client 0", seen: &ready_seen },
            write(3, Some(&starting), Some(&took_starting)),
            Fact::Claimed { id: "id-b", name: "b", claimer: "client 1", seen: &starting_seen },
        ];
        assert_eq!(
            feed(&mut pools, &facts),
            [
                "P1: b was claimed from pool web in Starting with intent Running",
                "P1: client 1 was handed b in Starting with intent Running",
            ]
        );
    }

    #[test]
    fn a_fill_past_the_pool_size_fires_counting_members_on_their_way_out() {
        let t = template(1);
        let a = member("a", Phase::Ready);
        let deleting = Sandbox { phase: Phase::Deleting, intent: Intent::Deleted, ..a.clone() };
        let b = member("b", Phase::Provisioning);
        let mut pools = Pools::default();
        let facts = [
            Fact::Template(&t),
            write(1, None, Some(&a)),
            write(2, Some(&a), Some(&deleting)),
            write(3, None, Some(&b)),
        ];
        assert_eq!(feed(&mut pools, &facts), ["P1: b was made for pool web of size 1, which already had 1 members"]);
        let mut pools = Pools::default();
        let after_removal =
            [Fact::Template(&t), write(1, None, Some(&a)), write(2, Some(&a), None), write(3, None, Some(&b))];
        assert!(feed(&mut pools, &after_removal).is_empty(), "a removal makes room");
    }

    #[test]
    fn a_pool_short_of_ready_members_or_over_its_size_fires() {
        let template = Template {
            name: "web".into(),
            spec: Default::default(),
            min_ready: 2,
            made: 0,
            resource_version: 1,
            created_at: Default::default(),
            updated_at: Default::default(),
        };
        let member = |name: &str, phase: Phase| {
            let mut s = sandbox(name, Intent::Running, phase, 1);
            std::sync::Arc::make_mut(&mut s.spec).labels.insert(POOL_LABEL.into(), "web".into());
            s
        };
        let claimed = sandbox("claimed", Intent::Running, Phase::Ready, 1);
        let full = [member("a", Phase::Ready), member("b", Phase::Ready), claimed.clone()];
        assert_eq!(not_refilled(&template, &full), None);
        assert_eq!(
            not_refilled(&template, &[member("a", Phase::Ready), member("b", Phase::Starting)]).as_deref(),
            Some(
                "pool web keeps 2 Ready, but after the quiet phase has 1 Ready of 2 members: [\"a Ready\", \"b Starting\"]"
            )
        );
        let over = [member("a", Phase::Ready), member("b", Phase::Ready), member("c", Phase::Ready)];
        assert!(not_refilled(&template, &over).is_some());
    }
}
