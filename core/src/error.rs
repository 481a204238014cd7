//! Typed errors. Each one knows its gRPC status class and says which field, record or versions
//! are involved, so the gateway maps it without guessing (DESIGN 3.7).

use std::fmt;

use crate::phase::Hold;
use crate::phase::PhaseKind;

/// The status classes of DESIGN 3.7, named as gRPC names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    Aborted,
    Unauthenticated,
    PermissionDenied,
    Unavailable,
    DeadlineExceeded,
    Internal,
    ResourceExhausted,
}

/// Which kind of record an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Sandbox,
    Provider,
    Exec,
    Template,
    Snapshot,
    Volume,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Sandbox => "sandbox",
            Kind::Provider => "provider",
            Kind::Exec => "exec",
            Kind::Template => "template",
            Kind::Snapshot => "snapshot",
            Kind::Volume => "volume",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },

    #[error("{kind} '{name}' not found")]
    NotFound { kind: Kind, name: String },

    #[error("{kind} '{name}' already exists")]
    AlreadyExists { kind: Kind, name: String },

    #[error("cannot {action} sandbox '{sandbox}' while it is {phase}")]
    WrongPhase { sandbox: String, action: &'static str, phase: PhaseKind },

    #[error("sandbox '{sandbox}' is past its deadline: renew it before {action} it")]
    Expired { sandbox: String, action: &'static str },

    #[error(
        "the pool of template '{template}' has no Ready sandbox to claim now; retry shortly (it refills), or ask to wait"
    )]
    PoolEmpty { template: String },

    #[error("provider '{provider}' does not exist (field {field})")]
    UnknownProvider { provider: String, field: &'static str },

    #[error("provider '{provider}' is attached to sandbox(es): {}", sandboxes.join(", "))]
    ProviderAttached { provider: String, sandboxes: Vec<String> },

    #[error("credential '{key}' of provider '{provider}' collides with {other}")]
    CredentialCollision { provider: String, key: String, other: String },

    #[error(
        "{kind} '{name}': expected resource_version {expected}, current {}",
        current.map_or_else(|| "absent".to_string(), |v| v.to_string())
    )]
    StaleVersion { kind: Kind, name: String, expected: u64, current: Option<u64> },

    #[error("stale runtime identity: sandbox '{sandbox}' presented generation {presented}, current is {current}")]
    StaleIdentity { sandbox: String, presented: u64, current: u64 },

    #[error("runtime token is missing or malformed")]
    MalformedToken,

    #[error("runtime token is not valid")]
    BadToken,

    #[error("invalid {field}: the {driver} driver cannot enforce it here: {reason}")]
    Unenforceable { field: String, driver: &'static str, reason: String },

    /// What this host's runtime cannot do at all (a pause without a freezer, DESIGN 12.1).
    #[error("the {driver} driver cannot {action} here: {reason}")]
    Unsupported { action: &'static str, driver: &'static str, reason: String },

    /// A pause of a sandbox paused the other way: a run in the freezer is not checkpointed
    /// in place, nor a checkpoint frozen.
    #[error("sandbox '{sandbox}' is paused {held} already: resume it before pausing it {asked}")]
    OtherHold { sandbox: String, held: Hold, asked: Hold },

    /// A snapshot's delete while sandboxes being made from it still need its files (S2).
    #[error("snapshot '{snapshot}' is still needed by sandbox(es) being made from it: {}", sandboxes.join(", "))]
    SnapshotInUse { snapshot: String, sandboxes: Vec<String> },

    #[error("cannot {action} snapshot '{snapshot}' while it is {phase}")]
    SnapshotPhase { snapshot: String, action: &'static str, phase: &'static str },

    #[error("volume '{volume}' does not exist (field {field})")]
    UnknownVolume { volume: String, field: String },

    #[error("volume '{volume}' is being deleted (field {field})")]
    VolumeDeleting { volume: String, field: String },

    /// A volume's delete while sandboxes not being deleted mount it (S2).
    #[error("volume '{volume}' is mounted by sandbox(es): {}; delete them first", sandboxes.join(", "))]
    VolumeInUse { volume: String, sandboxes: Vec<String> },

    /// A configured bound of the store's (its snapshots' count or bytes) is reached.
    #[error("{what}: at most {limit} (the gateway's {flag}); delete some first")]
    Quota { what: &'static str, limit: u64, flag: &'static str },

    /// No node can run a new generation of it (DESIGN 14): each node's reason, and the class
    /// those reasons make ([`crate::placement::Unplaced::code`]).
    #[error("cannot place sandbox '{sandbox}': {why}")]
    Unplaced { sandbox: String, why: String, code: Code },

    #[error("{kind} '{name}' is under contention: {attempts} conditional writes conflicted")]
    Contention { kind: Kind, name: String, attempts: u32 },
}

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::Invalid { .. } => Code::InvalidArgument,
            Error::NotFound { .. } => Code::NotFound,
            Error::AlreadyExists { .. } => Code::AlreadyExists,
            Error::WrongPhase { .. }
            | Error::OtherHold { .. }
            | Error::Expired { .. }
            | Error::UnknownProvider { .. }
            | Error::ProviderAttached { .. }
            | Error::CredentialCollision { .. }
            | Error::Unenforceable { .. }
            | Error::Unsupported { .. }
            | Error::SnapshotInUse { .. }
            | Error::SnapshotPhase { .. }
            | Error::UnknownVolume { .. }
            | Error::VolumeDeleting { .. }
            | Error::VolumeInUse { .. } => Code::FailedPrecondition,
            Error::Quota { .. } => Code::ResourceExhausted,
            Error::StaleVersion { .. } => Code::Aborted,
            Error::StaleIdentity { .. } => Code::PermissionDenied,
            Error::MalformedToken | Error::BadToken => Code::Unauthenticated,
            // Exhausting the server-owned retry is transient for the caller; the simulator treats
            // any occurrence as a bug (I3).
            Error::Contention { .. } => Code::Unavailable,
            // Transient: the pool refills.
            Error::PoolEmpty { .. } => Code::Unavailable,
            Error::Unplaced { code, .. } => *code,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid { field: field.into(), reason: reason.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_record_and_the_versions() {
        let missing = Error::NotFound { kind: Kind::Sandbox, name: "box".into() };
        assert_eq!(missing.to_string(), "sandbox 'box' not found");
        let stale = Error::StaleVersion { kind: Kind::Provider, name: "p".into(), expected: 3, current: Some(5) };
        assert_eq!(stale.to_string(), "provider 'p': expected resource_version 3, current 5");
        let gone = Error::StaleVersion { kind: Kind::Sandbox, name: "b".into(), expected: 3, current: None };
        assert_eq!(gone.to_string(), "sandbox 'b': expected resource_version 3, current absent");
        let attached = Error::ProviderAttached { provider: "p".into(), sandboxes: vec!["a".into(), "b".into()] };
        assert_eq!(attached.to_string(), "provider 'p' is attached to sandbox(es): a, b");
        let invalid = Error::invalid("spec.image", "must not be empty");
        assert_eq!(
            (invalid.code(), invalid.to_string().as_str()),
            (Code::InvalidArgument, "invalid spec.image: must not be empty")
        );
    }
}
