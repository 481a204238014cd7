//! Runtime identities (DESIGN 3.4).
//!
//! Each run of a sandbox is `(sandbox id, generation)`. Its token is a keyed MAC over that pair,
//! so the gateway re-derives it for every retry and restart instead of storing it. Whether the
//! generation is still the current one is decided by the observation merge against the record.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::Error;
use crate::id::SandboxId;

const TOKEN_PREFIX: &str = "berth1";
const MAC_DOMAIN: &[u8] = b"berth runtime identity v1\0";

/// The secret that derives runtime tokens. Its `Debug` never shows it.
#[derive(Clone)]
pub struct IdentityKey([u8; 32]);

impl IdentityKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdentityKey(<redacted>)")
    }
}

/// One run's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuntimeIdentity {
    pub sandbox: SandboxId,
    pub generation: u64,
}

/// A runtime token as handed to a sandbox. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct RuntimeToken(String);

impl RuntimeToken {
    /// The token itself, for installing into a sandbox. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RuntimeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RuntimeToken(<redacted>)")
    }
}

impl fmt::Display for RuntimeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

fn mac(key: &IdentityKey, identity: &RuntimeIdentity) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(MAC_DOMAIN);
    mac.update(identity.sandbox.as_str().as_bytes());
    mac.update(b"\0");
    mac.update(&identity.generation.to_be_bytes());
    mac
}

/// The token of one run. The same key and identity always give the same token.
pub fn derive_token(key: &IdentityKey, identity: &RuntimeIdentity) -> RuntimeToken {
    let tag = hex::encode(mac(key, identity).finalize().into_bytes());
    RuntimeToken(format!("{TOKEN_PREFIX}.{}.{}.{tag}", identity.sandbox, identity.generation))
}

/// The identity `token` claims and its MAC, unchecked.
fn parse(token: &str) -> Result<(RuntimeIdentity, Vec<u8>), Error> {
    // Parse from the right: the sandbox id is the only part that may contain dots.
    let mut parts = token.rsplitn(3, '.');
    let (Some(tag), Some(generation), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(Error::MalformedToken);
    };
    let Some(sandbox) = rest.strip_prefix(TOKEN_PREFIX).and_then(|s| s.strip_prefix('.')) else {
        return Err(Error::MalformedToken);
    };
    let generation: u64 = generation.parse().map_err(|_| Error::MalformedToken)?;
    let tag = hex::decode(tag).map_err(|_| Error::MalformedToken)?;
    if sandbox.is_empty() || generation == 0 {
        return Err(Error::MalformedToken);
    }
    Ok((RuntimeIdentity { sandbox: SandboxId::new(sandbox), generation }, tag))
}

/// Checks that `token` was derived with `key` and says whose it is. The comparison of the MAC is
/// constant-time. It does not say whether the generation is current: the merge decides that.
pub fn verify_token(key: &IdentityKey, token: &str) -> Result<RuntimeIdentity, Error> {
    let (identity, tag) = parse(token)?;
    mac(key, &identity).verify_slice(&tag).map_err(|_| Error::BadToken)?;
    Ok(identity)
}

/// Whose run `token` says it is, unverified: what a supervisor, which holds no key, knows of its
/// own run from the token it was given (the gateway verifies it).
pub fn claimed(token: &str) -> Option<RuntimeIdentity> {
    parse(token).ok().map(|(identity, _)| identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_claims_its_identity_whoever_made_it() {
        let identity = RuntimeIdentity { sandbox: SandboxId::new("sb.with.dots"), generation: 7 };
        let token = derive_token(&key(1), &identity);
        assert_eq!(claimed(token.expose()), Some(identity.clone()));
        assert_eq!(claimed("berth1.x.0.00"), None, "generation 0 is no run's");
        assert_eq!(claimed("not a token"), None);
    }

    fn key(b: u8) -> IdentityKey {
        IdentityKey::from_bytes([b; 32])
    }

    fn id(generation: u64) -> RuntimeIdentity {
        RuntimeIdentity { sandbox: SandboxId::new("sb-1.a"), generation }
    }

    #[test]
    fn tokens_round_trip_and_are_stable() {
        let t = derive_token(&key(1), &id(3));
        assert_eq!(t, derive_token(&key(1), &id(3)));
        assert_eq!(verify_token(&key(1), t.expose()).unwrap(), id(3));
    }

    #[test]
    fn tokens_are_bound_to_key_sandbox_and_generation() {
        let t = derive_token(&key(1), &id(3));
        assert_eq!(verify_token(&key(2), t.expose()), Err(Error::BadToken));
        let forged = t.expose().replacen(".3.", ".4.", 1);
        assert_eq!(verify_token(&key(1), &forged), Err(Error::BadToken));
        let other = t.expose().replacen("sb-1.a", "sb-2.a", 1);
        assert_eq!(verify_token(&key(1), &other), Err(Error::BadToken));
        assert_ne!(derive_token(&key(1), &id(4)), t);
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        for bad in ["", "berth1", "berth1..1.00", "x.sb.1.00", "berth1.sb.zero.00", "berth1.sb.0.00", "berth1.sb.1.zz"]
        {
            assert_eq!(verify_token(&key(1), bad), Err(Error::MalformedToken), "{bad:?}");
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let t = derive_token(&key(1), &id(3));
        // A placeholder, so a log reader sees that something was there and was withheld.
        assert_eq!(format!("{t:?} {t} {:?}", key(7)), "RuntimeToken(<redacted>) <redacted> IdentityKey(<redacted>)");
    }
}
