//! P1 (DESIGN 11): no pool member is claimed twice; after faults stop each pool has
//! `min_ready` Ready members.

use std::collections::BTreeMap;

use berth_core::template::{Template, is_member};
use berth_core::{PhaseKind, Sandbox};

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
    use berth_core::template::POOL_LABEL;
    use berth_core::{Intent, Phase};

    use super::*;
    use crate::invariants::sandbox;

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
