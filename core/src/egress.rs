//! Egress (DESIGN 10): which allow-list ([`crate::allowlist`]) a sandbox's run gets.
//!
//! Which providers' endpoints a run may reach is [`Sandbox::egress_providers`]: those attached
//! when its generation was committed (its create, its start, or its claim from a pool), less
//! those detached since. So a run gets at most the policy committed with its generation and at
//! most the one in force now: a detach narrows at once, an attach widens at the next start.

use std::collections::BTreeMap;

pub use crate::allowlist::{MAX_RULES, Policy, Rule, host_name};
use crate::record::{Provider, Sandbox};

/// The policy the sandbox's current run gets: its spec's, with the endpoints of the providers
/// in [`Sandbox::egress_providers`] that are still attached (`providers`: their records, as
/// read now; a provider gone has no endpoints).
pub fn run_policy(sandbox: &Sandbox, providers: &BTreeMap<String, Provider>) -> Policy {
    let mut allow = sandbox.spec.egress.allow.clone();
    for name in sandbox.egress_providers.intersection(&sandbox.providers) {
        if let Some(provider) = providers.get(name) {
            allow.extend(provider.endpoints.allow.iter().cloned());
        }
    }
    allow.sort();
    allow.dedup();
    Policy { allow }
}
