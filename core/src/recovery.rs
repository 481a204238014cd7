//! Recovery (DESIGN 3.6): which effect finishes a transition the runtime has not confirmed.
//! The effect always carries the committed generation, so a re-drive installs the same identity
//! the decision did.

use core::time::Duration;

use crate::decision::Effect;
use crate::record::{Intent, PhaseKind, Run, Sandbox, Timestamp};

/// The effect that finishes `sandbox`'s unconfirmed transition, if it has one.
pub fn unfinished(sandbox: &Sandbox) -> Option<Effect> {
    let id = sandbox.id.clone();
    let generation = sandbox.generation;
    match (sandbox.intent, sandbox.phase.kind(), sandbox.run) {
        (_, PhaseKind::Deleting, _) => Some(Effect::Delete { sandbox: id }),
        (_, PhaseKind::Stopping, _) => Some(Effect::Stop { sandbox: id, generation }),
        (Intent::Running, PhaseKind::Provisioning | PhaseKind::Starting, Run::Pending) => {
            Some(Effect::Start { sandbox: id, generation })
        }
        // Started, but with an unsettled fence only the driver's reply tells which run is this
        // generation's: ask again until it has answered.
        (
            Intent::Running,
            PhaseKind::Provisioning | PhaseKind::Starting | PhaseKind::Ready,
            Run::Started { at: None },
        ) if !sandbox.exit_fence.settled => Some(Effect::Start { sandbox: id, generation }),
        _ => None,
    }
}

/// On a reconcile sweep: [`unfinished`], for transitions whose last write is at least
/// `min_age` old, so a sweep does not pile onto an effect that is still running. At gateway
/// start-up pass `Duration::ZERO`: nothing is running yet.
pub fn due(sandbox: &Sandbox, now: Timestamp, min_age: Duration) -> Option<Effect> {
    if sandbox.updated_at.plus(min_age) > now {
        return None;
    }
    unfinished(sandbox)
}
