//! S4 (DESIGN 16): a fork gives N sandboxes with distinct ids and identities, or none; nothing
//! half-made is left.
//!
//! A fork's sandboxes are made in the one write that confirms its copy: judged on that write,
//! which must make every one the fork names, each with its own id.

use std::collections::BTreeSet;

use berth_core::SnapshotPhase;

use super::{Checker, Fact, Found, Invariant};

/// S4 keeps no evidence: each write says it all.
#[derive(Default)]
pub struct Forks;

impl Checker for Forks {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        let Fact::Snapshot { before: Some(before), after: Some(after), made } = *fact else { return };
        let Some(fork) = &after.fork else { return };
        let confirmed = before.phase == SnapshotPhase::Creating && after.phase == SnapshotPhase::Ready;
        if !confirmed && made.is_empty() {
            return;
        }
        let ids: BTreeSet<_> = made.iter().map(|s| &s.id).collect();
        let wanted: BTreeSet<_> = fork.sandboxes.iter().map(|(id, _)| id).collect();
        if !confirmed || ids != wanted || ids.len() != made.len() {
            found.push((
                Invariant::S4,
                format!(
                    "the fork of {} as {} made {} of its {} sandboxes in the write that {} its copy",
                    after.source.name,
                    after.name,
                    made.len(),
                    fork.sandboxes.len(),
                    if confirmed { "confirmed" } else { "did not confirm" }
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use berth_core::record::Fork;
    use berth_core::{Intent, Phase, SandboxId};

    use super::*;
    use crate::invariants::snapshot::{ready, taken};
    use crate::invariants::{feed, sandbox};

    #[test]
    fn a_fork_confirmed_with_some_of_its_sandboxes_fires() {
        let fork = Fork {
            sandboxes: vec![(SandboxId::new("id-f1"), "f1".into()), (SandboxId::new("id-f2"), "f2".into())],
            labels: Default::default(),
        };
        let creating = berth_core::Snapshot { fork: Some(fork.clone()), ..taken("fork-1", SnapshotPhase::Creating) };
        let confirmed = berth_core::Snapshot { fork: Some(fork), ..ready("fork-1", "aa") };
        let f1 = sandbox("f1", Intent::Running, Phase::Provisioning, 1);
        let f2 = sandbox("f2", Intent::Running, Phase::Provisioning, 1);
        let (both, one) = ([&f1, &f2], [&f1]);
        let write = |made| Fact::Snapshot { before: Some(&creating), after: Some(&confirmed), made };
        assert!(feed(&mut Forks, &[write(&both)]).is_empty());
        assert_eq!(
            feed(&mut Forks, &[write(&one)]),
            ["S4: the fork of src as fork-1 made 1 of its 2 sandboxes in the write that confirmed its copy"]
        );
    }
}
