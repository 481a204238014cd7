//! The ids records are keyed by.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// An id shared, not copied: every write, effect and reply about its record carries it.
macro_rules! shared_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into().into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

shared_id! {
    /// A sandbox's id: assigned by the gateway at create, never reused.
    SandboxId
}

shared_id! {
    /// A snapshot's id (DESIGN 12.2): assigned by the gateway when the snapshot is asked for,
    /// never reused. What the runtime keeps of a snapshot (its copy, its image) is named by it,
    /// so a snapshot deleted and another taken under the same name never share anything.
    SnapshotId
}

shared_id! {
    /// A volume's id (DESIGN 13.2): assigned by the gateway at its create, never reused. The
    /// runtime's volume is named by it, so a volume deleted and another made under the same
    /// name never share a file, and two stores on one runtime never share a volume.
    VolumeId
}

shared_id! {
    /// A node's id (DESIGN 14): the name it registers under, kept across its restarts (each
    /// restart takes a new lease epoch, not a new id).
    NodeId
}

/// Longest exec id.
pub const MAX_EXEC_ID_BYTES: usize = 128;

/// An exec's id: chosen by the client (its idempotency key) or by the gateway.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecId(String);

impl ExecId {
    /// `id` if it is 1 to 128 letters, digits, '-', '_' and '.', starting with a letter or digit.
    pub fn parse(field: &str, id: &str) -> Result<Self, Error> {
        let ok = !id.is_empty()
            && id.len() <= MAX_EXEC_ID_BYTES
            && id.starts_with(|c: char| c.is_ascii_alphanumeric())
            && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return Err(Error::invalid(
                field,
                format!(
                    "must be 1 to {MAX_EXEC_ID_BYTES} letters, digits, '-', '_' and '.', starting with a letter or digit"
                ),
            ));
        }
        Ok(Self(id.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ExecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
