//! S2 (DESIGN 16): a snapshot is never removed while a sandbox made from it needs it, and an
//! acknowledged delete of one completes and leaves nothing behind.
//!
//! Judged at the end of the quiet phase, against what the host keeps: a sandbox that could not
//! start because its snapshot's copy was gone (removed under it), a snapshot still being taken
//! or removed, a copy or an image of a snapshot whose record is gone, an image of a sandbox made
//! from a snapshot whose record is gone, and a fork's snapshot left once no fork needs it.

use berth_core::snapshot::{SNAPSHOT_LABEL, spent_fork};
use berth_core::{Intent, Phase, SnapshotPhase};
use berth_drivers::container::{SEED_REPOSITORY, SNAPSHOT_REPOSITORY};

use super::{Checker, Fact, Found, Invariant};

/// What the drivers say when a sandbox's snapshot has no copy to seed it (both drivers), or
/// no image (the container driver, which names its image first).
pub const NO_COPY: [&str; 2] = ["has no copy on this host to start from", "which this sandbox was made from, is gone"];

/// Whether a start failed for want of its snapshot.
pub fn unseedable(message: &str) -> bool {
    NO_COPY.iter().any(|m| message.contains(m))
}

/// S2 keeps no evidence: the end state says it all.
#[derive(Default)]
pub struct Kept;

impl Checker for Kept {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found) {
        let Fact::Kept { snapshots, records, copies, images, .. } = *fact else { return };
        let mut problem = |p: String| found.push((Invariant::S2, p));
        for s in records.iter().filter(|s| s.intent != Intent::Deleted) {
            if let (Phase::Error(failure), Some(seed)) = (&s.phase, &s.seed)
                && unseedable(&failure.message)
            {
                problem(format!(
                    "{} was made from snapshot {}, whose copy was removed before it had its files",
                    s.name, seed.snapshot
                ));
            }
        }
        for s in snapshots {
            if matches!(s.phase, SnapshotPhase::Creating | SnapshotPhase::Deleting) {
                problem(format!("snapshot {} is still {} after the quiet phase", s.name, s.phase.name()));
            }
            let users: Vec<_> =
                records.iter().filter(|r| r.spec.labels.get(SNAPSHOT_LABEL) == Some(&s.name)).cloned().collect();
            if spent_fork(s, &users) {
                problem(format!(
                    "the snapshot {} of a fork of {} outlived its forks' need of it",
                    s.name, s.source.name
                ));
            }
        }
        for id in copies.keys().filter(|id| !snapshots.iter().any(|s| s.id == **id)) {
            problem(format!("the host keeps a copy of snapshot {id}, whose record is gone"));
        }
        for image in images {
            let Some((repository, tag)) = image.rsplit_once(':') else { continue };
            let orphan = match repository.rsplit('/').next() {
                Some(SNAPSHOT_REPOSITORY) => !snapshots.iter().any(|s| s.id.as_str() == tag),
                Some(SEED_REPOSITORY) => !records.iter().any(|s| s.id.as_str() == tag),
                _ => false,
            };
            if orphan {
                problem(format!("the runtime keeps the image {image}, whose record is gone"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use berth_core::{Failure, FailureReason};

    use super::*;
    use crate::invariants::feed;
    use crate::invariants::snapshot::{kept, made_from, ready, taken};

    #[test]
    fn a_sandbox_whose_snapshot_went_before_its_files_fires() {
        let snapshot = ready("s1", "aa");
        let mut copy = made_from("copy", &snapshot);
        let failure = |message: &str| Failure {
            reason: FailureReason::CommandFailedToStart,
            exit_code: None,
            message: message.into(),
        };
        copy.phase = Phase::Error(failure(&format!("snapshot sn-s1 {}", NO_COPY[0])));
        let (none, no_sums) = (BTreeMap::new(), BTreeMap::new());
        let records = [copy.clone()];
        assert_eq!(
            feed(&mut Kept, &[kept(&[], &records, &none, &no_sums, &[])]),
            ["S2: copy was made from snapshot s1, whose copy was removed before it had its files"]
        );
        // One being deleted needs nothing.
        let records = [berth_core::Sandbox { intent: Intent::Deleted, ..copy }];
        assert!(feed(&mut Kept, &[kept(&[], &records, &none, &no_sums, &[])]).is_empty());
    }

    #[test]
    fn what_is_kept_of_a_snapshot_without_a_record_or_an_unsettled_one_fires() {
        let deleting = taken("s1", SnapshotPhase::Deleting);
        let copies = BTreeMap::from([(berth_core::SnapshotId::new("sn-gone"), None)]);
        let no_sums = BTreeMap::new();
        let images =
            ["localhost/berth-snapshot:sn-gone".to_string(), "berth-seed:id-nobody".into(), "busybox:1".into()];
        assert_eq!(
            feed(&mut Kept, &[kept(&[deleting], &[], &copies, &no_sums, &images)]),
            [
                "S2: snapshot s1 is still Deleting after the quiet phase",
                "S2: the host keeps a copy of snapshot sn-gone, whose record is gone",
                "S2: the runtime keeps the image localhost/berth-snapshot:sn-gone, whose record is gone",
                "S2: the runtime keeps the image berth-seed:id-nobody, whose record is gone",
            ]
        );
    }
}
