//! Templates and warm pools (DESIGN 9.4).
//!
//! A template is a named spec; its pool keeps `min_ready` sandboxes of it made ahead of need.
//! A pool member is an ordinary sandbox whose labels carry [`POOL_LABEL`] = the template's name
//! until it is claimed: a claim takes one Ready member in one conditional write (two claims
//! racing for one member conflict, and the loser re-decides on the members that are left),
//! drops that label, adds the claimer's labels and providers, and starts its deadline.
//!
//! Refills are decided here too: a fill makes one member only while the members not yet
//! claimed, in any phase (including those being deleted), are fewer than `min_ready`, and every
//! fill writes the template as well, so two fills decided on the same count conflict. Failed
//! members are deleted by the refill loop and counted until they are gone: a pool whose members
//! keep failing never grows past its size.

use std::collections::{BTreeMap, BTreeSet};

use crate::decision::{Decision, Effect, Outcome, Write, touch_provider, update_sandbox};
use crate::error::{Error, Kind};
use crate::id::SandboxId;
use crate::lifetime::{self, Renewal};
use crate::phase::PhaseKind;
use crate::provider::{check_credentials, resolve};
pub use crate::record::Template;
use crate::record::{Intent, Sandbox};
use crate::request::{Reads, Request};
use crate::spec::SandboxSpec;
use crate::time::Timestamp;
use crate::{restart, validate};

/// The label that marks a sandbox as a member of a template's pool not yet claimed; its value is
/// the template's name. Labels starting with `berth.` are Berth's: a spec or a claim cannot set them.
pub const POOL_LABEL: &str = "berth.pool";

/// Whether `sandbox` is a member of `template`'s pool, not yet claimed.
pub fn is_member(sandbox: &Sandbox, template: &str) -> bool {
    sandbox.spec.labels.get(POOL_LABEL).is_some_and(|t| t == template)
}

/// Whether a member can be handed out: Ready, wanted running, not on its way out.
fn claimable(sandbox: &Sandbox) -> bool {
    if crate::bug!(ClaimUnready) {
        return sandbox.intent == Intent::Running && !sandbox.is(PhaseKind::Deleting);
    }
    sandbox.is(PhaseKind::Ready) && sandbox.intent == Intent::Running
}

/// Whether a member will not become claimable by itself and is to be replaced: it failed, or
/// its command ended, and no restart of its policy is coming.
pub fn spent(sandbox: &Sandbox) -> bool {
    let ended = sandbox.is(PhaseKind::Error) || sandbox.is(PhaseKind::Stopped) || sandbox.intent != Intent::Running;
    ended && !sandbox.is(PhaseKind::Deleting) && restart::scheduled(sandbox).is_none()
}

fn validate_pool(min_ready: u32, limits: &validate::Limits) -> Result<(), Error> {
    if min_ready > limits.max_pool {
        return Err(Error::Invalid {
            field: "min_ready".to_string(),
            reason: format!("must be at most {} (the gateway's --max-pool)", limits.max_pool),
        });
    }
    Ok(())
}

fn existing<'a>(reads: &'a Reads, name: &str) -> Result<&'a Template, Error> {
    reads.template.as_ref().ok_or_else(|| Error::NotFound { kind: Kind::Template, name: name.to_string() })
}

/// The template a command with a client's version is about, that version checked first.
fn versioned<'a>(request: &Request, reads: &'a Reads, name: &str) -> Result<&'a Template, Error> {
    let template = existing(reads, name)?;
    request.check_version(template.resource_version)?;
    Ok(template)
}

pub(crate) fn create(
    reads: &Reads,
    name: &str,
    spec: &SandboxSpec,
    min_ready: u32,
    now: Timestamp,
) -> Result<Decision, Error> {
    validate::template_name("name", name)?;
    validate::spec(spec)?;
    // A pool's members are made ahead of any claimant: a volume is mounted by a create that
    // names it, for the sandbox that asks.
    if !spec.volumes.is_empty() {
        return Err(Error::invalid("spec.volumes", "a template's sandboxes cannot mount volumes"));
    }
    lifetime::validate(&spec.lifetime, &reads.limits)?;
    restart::validate(&spec.restart)?;
    validate_pool(min_ready, &reads.limits)?;
    if reads.template.is_some() {
        return Err(Error::AlreadyExists { kind: Kind::Template, name: name.to_string() });
    }
    let record = Template {
        name: name.to_string(),
        spec: spec.clone(),
        min_ready,
        made: 0,
        resource_version: 1,
        created_at: now,
        updated_at: now,
    };
    Ok(Decision {
        writes: vec![Write::CreateTemplate(record.clone())],
        effects: vec![],
        outcome: Outcome::Template(record.into()),
    })
}

pub(crate) fn set_pool(
    request: &Request,
    reads: &Reads,
    name: &str,
    min_ready: u32,
    now: Timestamp,
) -> Result<Decision, Error> {
    validate_pool(min_ready, &reads.limits)?;
    let template = versioned(request, reads, name)?;
    if template.min_ready == min_ready {
        return Ok(Decision::template_as_is(template));
    }
    let next = Template { min_ready, ..template.clone() };
    let (write, next) = update_template(template, next, now);
    Ok(Decision { writes: vec![write], effects: vec![], outcome: Outcome::Template(next.into()) })
}

/// Removes the template. Its members not yet claimed go with it (the refill loop deletes
/// members whose template is gone); claimed sandboxes are their claimers' and stay.
pub(crate) fn delete(request: &Request, reads: &Reads, name: &str) -> Result<Decision, Error> {
    let template = versioned(request, reads, name)?;
    Ok(Decision {
        writes: vec![Write::RemoveTemplate { name: name.to_string(), expected: template.resource_version }],
        effects: vec![],
        outcome: Outcome::Removed,
    })
}

/// One refill: a new member named `name` with id `id`, if the pool is short.
pub(crate) fn fill(reads: &Reads, id: &SandboxId, name: &str, now: Timestamp) -> Result<Decision, Error> {
    let Some(template) = &reads.template else { return Ok(Decision::gone()) };
    let members = reads.members.iter().filter(|s| is_member(s, &template.name)).count();
    if members >= template.min_ready as usize {
        return Ok(Decision::template_as_is(template));
    }
    let mut spec = template.spec.clone();
    spec.labels.insert(POOL_LABEL.to_string(), template.name.clone());
    // The deadline and the idle clock start at the claim: a member waiting in the pool does
    // not age.
    let placement =
        crate::placement::place(&reads.nodes, &spec.limits, &spec.node_selector, id).map_err(|why| why.error(name))?;
    let member = Sandbox {
        template: Some(template.name.clone()),
        placement: Some(placement),
        ..Sandbox::new(id.clone(), name, spec, now)
    };
    let (bump, _) = update_template(template, Template { made: template.made + 1, ..template.clone() }, now);
    Ok(Decision {
        writes: vec![Write::CreateSandbox(member.clone()), bump],
        effects: vec![Effect::Start { sandbox: id.clone(), generation: 1 }],
        outcome: Outcome::Sandbox(member.into()),
    })
}

/// A claim of one Ready member of `template`'s pool, adding `labels` and `providers`.
pub(crate) fn claim(
    reads: &Reads,
    template: &str,
    labels: &BTreeMap<String, String>,
    providers: &BTreeSet<String>,
    now: Timestamp,
) -> Result<Decision, Error> {
    validate::template_name("template", template)?;
    for (key, value) in labels {
        validate::user_label("labels", key, value)?;
    }
    validate::provider_names("providers", providers)?;
    let template = existing(reads, template)?;
    let attached = resolve(providers, reads, "providers")?;
    let member = reads
        .members
        .iter()
        .filter(|s| is_member(s, &template.name) && claimable(s))
        .min_by(|a, b| a.name.cmp(&b.name))
        .ok_or_else(|| Error::PoolEmpty { template: template.name.clone() })?;
    check_credentials(&member.spec, &attached)?;
    let mut next = member.clone();
    let spec = std::sync::Arc::make_mut(&mut next.spec);
    spec.labels.remove(POOL_LABEL);
    spec.labels.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    std::sync::Arc::make_mut(&mut next.providers).extend(providers.iter().cloned());
    // A claim hands the run to its claimer: the providers it attaches are the run's from here.
    std::sync::Arc::make_mut(&mut next.egress_providers).extend(providers.iter().cloned());
    if next.providers.len() > validate::MAX_PROVIDERS {
        return Err(Error::Invalid {
            field: "providers".to_string(),
            reason: format!("a sandbox has at most {} providers", validate::MAX_PROVIDERS),
        });
    }
    next.deadline =
        lifetime::deadline(Renewal::SpecTtl, &member.spec.lifetime, now, &reads.limits, "spec.lifetime.ttl_ms")?;
    next.active_at = lifetime::clock_from(&member.spec.lifetime, now);
    let (write, next) = update_sandbox(member, next, now);
    let mut writes = vec![write];
    writes.extend(attached.iter().map(|p| touch_provider(p, now)));
    Ok(Decision { writes, effects: vec![], outcome: Outcome::Sandbox(next.into()) })
}

fn update_template(before: &Template, mut next: Template, now: Timestamp) -> (Write, Template) {
    next.resource_version = before.resource_version + 1;
    next.updated_at = now;
    (Write::UpdateTemplate { record: next.clone(), expected: before.resource_version }, next)
}
