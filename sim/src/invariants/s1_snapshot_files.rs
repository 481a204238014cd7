//! S1 (DESIGN 16): a Ready snapshot never changes, and a sandbox made from it starts with
//! exactly its files.
//!
//! The store's writes are fed as facts: a Ready snapshot written again with other content, or
//! out of Ready other than by its delete, fires. At the end of the quiet phase the host's ground
//! truth is judged: each Ready snapshot's copy sums as its record says, and each sandbox its
//! driver seeded has, in its workspace, exactly the files of the snapshot it was made from
//! (nothing in the simulation writes in a sandbox made from a snapshot).

use std::collections::BTreeMap;

use berth_core::{SnapshotId, SnapshotPhase};

use super::{Checker, Fact, Found, Invariant};

/// The sum each snapshot had when it became Ready: a sandbox made from it is judged against it
/// even once the snapshot is gone.
#[derive(Default)]
pub struct Files {
    sums: BTreeMap<SnapshotId, String>,
}

impl Checker for Files {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        match *fact {
            Fact::Snapshot { before, after: Some(after), .. } => {
                if let Some(content) = after.content.as_ref().filter(|_| after.phase == SnapshotPhase::Ready) {
                    match self.sums.get(&after.id) {
                        Some(sum) if *sum != content.sha256 => found.push((
                            Invariant::S1,
                            format!(
                                "Ready snapshot {} changed its content from {sum} to {}",
                                after.name, content.sha256
                            ),
                        )),
                        _ => {
                            self.sums.insert(after.id.clone(), content.sha256.clone());
                        }
                    }
                }
                let left_ready = before.is_some_and(|b| b.phase == SnapshotPhase::Ready)
                    && !matches!(after.phase, SnapshotPhase::Ready | SnapshotPhase::Deleting);
                if left_ready {
                    found.push((Invariant::S1, format!("Ready snapshot {} became {}", after.name, after.phase.name())));
                }
            }
            Fact::Kept { snapshots, records, copies, seeded, .. } => {
                for s in snapshots.iter().filter(|s| s.phase == SnapshotPhase::Ready) {
                    let recorded = s.content.as_ref().map(|c| c.sha256.as_str());
                    match copies.get(&s.id) {
                        Some(Some(sum)) if Some(sum.as_str()) == recorded => {}
                        kept => found.push((
                            Invariant::S1,
                            format!("Ready snapshot {} sums {recorded:?}, but its copy is {kept:?}", s.name),
                        )),
                    }
                }
                for (id, sum) in seeded {
                    let Some(s) = records.iter().find(|s| s.id == *id) else { continue };
                    let Some(seed) = &s.seed else { continue };
                    match self.sums.get(&seed.id) {
                        Some(want) if want == sum => {}
                        want => found.push((
                            Invariant::S1,
                            format!(
                                "{} was made from snapshot {} ({want:?}) but its files sum {sum}",
                                s.name, seed.snapshot
                            ),
                        )),
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::feed;
    use crate::invariants::snapshot::{kept, made_from, ready, taken};

    #[test]
    fn a_ready_snapshot_that_changes_fires() {
        let first = ready("s1", "aa");
        let other = ready("s1", "bb");
        let error = taken("s1", SnapshotPhase::Error("lost".into()));
        let write = |before, after| Fact::Snapshot { before, after: Some(after), made: &[] };
        assert!(feed(&mut Files::default(), &[write(None, &first), write(Some(&first), &first)]).is_empty());
        assert_eq!(
            feed(
                &mut Files::default(),
                &[write(None, &first), write(Some(&first), &other), write(Some(&first), &error)]
            ),
            ["S1: Ready snapshot s1 changed its content from aa to bb", "S1: Ready snapshot s1 became Error"]
        );
    }

    #[test]
    fn a_copy_or_a_seeded_workspace_that_does_not_sum_as_recorded_fires() {
        let snapshot = ready("s1", "aa");
        let copy = made_from("copy", &snapshot);
        let facts = |copy_sum: &str, workspace: &str| {
            let copies = BTreeMap::from([(snapshot.id.clone(), Some(copy_sum.to_string()))]);
            let seeded = BTreeMap::from([(copy.id.clone(), workspace.to_string())]);
            let mut checker = Files::default();
            let mut found = feed(&mut checker, &[Fact::Snapshot { before: None, after: Some(&snapshot), made: &[] }]);
            let (snapshots, records) = (vec![snapshot.clone()], vec![copy.clone()]);
            found.extend(feed(&mut checker, &[kept(&snapshots, &records, &copies, &seeded, &[])]));
            found
        };
        assert!(facts("aa", "aa").is_empty());
        assert_eq!(
            facts("zz", "bb"),
            [
                "S1: Ready snapshot s1 sums Some(\"aa\"), but its copy is Some(Some(\"zz\"))",
                "S1: copy was made from snapshot s1 (Some(\"aa\")) but its files sum bb",
            ]
        );
    }
}
