//! Providers (DESIGN 3.1): named credentials that attached sandboxes receive in their
//! environment. Made and removed here; attached and detached by the sandbox commands
//! ([`crate::command`]), and to pool members by a claim ([`crate::template`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::allowlist::Policy;
use crate::decision::{Decision, Outcome, Write};
use crate::error::{Error, Kind};
use crate::phase::PhaseKind;
use crate::record::{Provider, Secret};
use crate::request::{Reads, Request};
use crate::spec::SandboxSpec;
use crate::time::Timestamp;
use crate::validate;

pub(crate) fn create(
    request: &Request,
    reads: &Reads,
    name: &str,
    kind: &str,
    credentials: &BTreeMap<String, Secret>,
    endpoints: &Policy,
    now: Timestamp,
) -> Result<Decision, Error> {
    validate::provider(kind, credentials)?;
    endpoints.validate("endpoints")?;
    request.check_create_version()?;
    if reads.providers.contains_key(name) {
        return Err(Error::AlreadyExists { kind: Kind::Provider, name: name.to_string() });
    }
    let record = Provider {
        name: name.to_string(),
        kind: kind.to_string(),
        credentials: credentials.clone(),
        endpoints: endpoints.clone(),
        resource_version: 1,
        created_at: now,
        updated_at: now,
    };
    Ok(Decision {
        writes: vec![Write::CreateProvider(record.clone())],
        effects: vec![],
        outcome: Outcome::Provider(record.into()),
    })
}

pub(crate) fn delete(request: &Request, reads: &Reads, name: &str) -> Result<Decision, Error> {
    let provider =
        reads.providers.get(name).ok_or_else(|| Error::NotFound { kind: Kind::Provider, name: name.to_string() })?;
    request.check_version(provider.resource_version)?;
    // A Deleting sandbox's references are released: they never block (R2).
    let mut blocking: Vec<String> = reads
        .users
        .iter()
        .filter(|s| s.providers.contains(name) && !s.is(PhaseKind::Deleting))
        .map(|s| s.name.to_string())
        .collect();
    if !blocking.is_empty() {
        blocking.sort();
        return Err(Error::ProviderAttached { provider: name.to_string(), sandboxes: blocking });
    }
    Ok(Decision {
        writes: vec![Write::RemoveProvider { name: name.to_string(), expected: provider.resource_version }],
        effects: vec![],
        outcome: Outcome::Removed,
    })
}

pub(crate) fn resolve<'a>(
    names: &BTreeSet<String>,
    reads: &'a Reads,
    field: &'static str,
) -> Result<Vec<&'a Provider>, Error> {
    names
        .iter()
        .map(|name| reads.providers.get(name).ok_or_else(|| Error::UnknownProvider { provider: name.clone(), field }))
        .collect()
}

/// Every credential becomes an environment variable, so no two sources may name the same one.
pub(crate) fn check_credentials(spec: &SandboxSpec, providers: &[&Provider]) -> Result<(), Error> {
    let mut owners: BTreeMap<&str, String> = spec.env.keys().map(|k| (k.as_str(), "spec.env".to_string())).collect();
    for provider in providers {
        for key in provider.credentials.keys() {
            if let Some(other) = owners.insert(key, format!("provider '{}'", provider.name)) {
                return Err(Error::CredentialCollision { provider: provider.name.clone(), key: key.clone(), other });
            }
        }
    }
    Ok(())
}
