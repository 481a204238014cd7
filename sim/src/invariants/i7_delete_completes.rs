//! I7 (DESIGN 4): delete always completes. Checked once the quiet phase is over (no deleted
//! record left, nothing left on the runtime host without a record) and in R2's shape: a
//! provider can be deleted as soon as the sandbox using it is Deleting.

use std::collections::BTreeMap;

use berth_core::{Intent, Sandbox, SandboxId};
use berth_drivers::container::{user_volume_of, volume_name};
use tonic::{Code, Status};

use crate::runtime::RuntimeModel;

/// The problem with a record still there after the quiet phase, if it was deleted.
pub fn deleted_still_there(s: &Sandbox) -> Option<String> {
    (s.intent == Intent::Deleted).then(|| format!("{} is still {} after the quiet phase", s.name, s.phase))
}

/// The problems with what the runtime host still `held` (what it is, per sandbox) and its
/// workspace volumes, once the quiet phase is over: one for each whose record is gone. Users'
/// volumes outlive their sandboxes: they are S2's.
pub fn left_behind(records: &[Sandbox], held: &BTreeMap<SandboxId, &str>, runtime: &RuntimeModel) -> Vec<String> {
    let mut problems = Vec::new();
    for (id, what) in held {
        if !records.iter().any(|s| s.id == *id) {
            problems.push(format!("the runtime still has {what} of {id}, whose record is gone"));
        }
    }
    for volume in runtime.volumes.iter().filter(|v| user_volume_of(v).is_none()) {
        if !records.iter().any(|s| volume_name(&s.id) == *volume) {
            let owner = runtime.sandboxes().find(|id| volume_name(id) == *volume).map(|id| runtime.name(id));
            problems
                .push(format!("the runtime still has the volume {volume} ({owner:?}), whose sandbox's record is gone"));
        }
    }
    problems
}

/// The problem with `reply`, a delete of `provider` right after `sandbox`, its user, became
/// Deleting: a refusal because it is still in use.
pub fn provider_kept(provider: &str, sandbox: &str, reply: &Result<(), Option<Status>>) -> Option<String> {
    match reply {
        Err(Some(status)) if status.code() == Code::FailedPrecondition => {
            Some(format!("{provider} could not be deleted right after {sandbox} became Deleting: {}", status.message()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use berth_core::Phase;

    use super::*;
    use crate::invariants::sandbox;

    #[test]
    fn a_deleted_record_left_fires() {
        assert_eq!(
            deleted_still_there(&sandbox("sb1", Intent::Deleted, Phase::Deleting, 1)).as_deref(),
            Some("sb1 is still Deleting after the quiet phase")
        );
        assert_eq!(deleted_still_there(&sandbox("sb1", Intent::Stopped, Phase::Stopped, 1)), None);
    }

    #[test]
    fn what_the_runtime_holds_without_a_record_fires() {
        let kept = sandbox("sb1", Intent::Running, Phase::Ready, 1);
        let gone = sandbox("sb2", Intent::Deleted, Phase::Deleting, 1);
        let mut runtime = RuntimeModel::default();
        runtime.name_sandbox(&gone.id, &gone.name);
        runtime.volumes.extend([volume_name(&kept.id), volume_name(&gone.id)]);
        let held = BTreeMap::from([(kept.id.clone(), "a container"), (gone.id.clone(), "a folder")]);
        assert_eq!(
            left_behind(std::slice::from_ref(&kept), &BTreeMap::new(), &RuntimeModel::default()),
            Vec::<String>::new()
        );
        assert_eq!(left_behind(&[kept.clone(), gone.clone()], &held, &runtime), Vec::<String>::new());
        assert_eq!(
            left_behind(&[kept], &held, &runtime),
            [
                "the runtime still has a folder of id-sb2, whose record is gone".to_string(),
                format!(
                    "the runtime still has the volume {} (Some(\"sb2\")), whose sandbox's record is gone",
                    volume_name(&gone.id)
                ),
            ]
        );
    }

    #[test]
    fn a_provider_delete_refused_while_its_sandbox_is_deleting_fires() {
        let refused = Err(Some(Status::failed_precondition("p1 is attached to sb1")));
        assert_eq!(
            provider_kept("p1", "sb1", &refused).as_deref(),
            Some("p1 could not be deleted right after sb1 became Deleting: p1 is attached to sb1")
        );
        assert_eq!(provider_kept("p1", "sb1", &Ok(())), None);
        assert_eq!(provider_kept("p1", "sb1", &Err(None)), None);
    }
}
