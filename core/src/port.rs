//! Ports of a sandbox's runs and who the preview proxy lets through to them (DESIGN 13.1).
//!
//! A port's access token is a keyed MAC over (sandbox id, generation, port) under the runtime
//! identities' key, in a domain of its own so that neither kind of token passes for the other.
//! Like a runtime token it is derived again whenever it is needed, never stored. It names the
//! generation it was issued for and works for that generation only (U1): once a start makes a
//! new one, the old token gets Gone, never the new run. A pause keeps the generation, so a
//! resume keeps the token.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::id::SandboxId;
use crate::identity::IdentityKey;
use crate::phase::PhaseKind;
use crate::record::{Intent, Sandbox};

const TOKEN_PREFIX: &str = "berthp1";
const MAC_DOMAIN: &[u8] = b"berth port access v1\0";
const API_MAC_DOMAIN: &[u8] = b"berth sandbox api access v1\0";

/// What an access token opens: a port through the preview proxy, or the in-sandbox API (E2B's
/// envd, DESIGN 15). Each has its own MAC domain: a preview URL's token, made to be shared,
/// never runs a command, and no public port opens the in-sandbox API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Door {
    Port(u16),
    SandboxApi,
}

/// A port's access token. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct PortToken(String);

impl PortToken {
    /// The token itself, for the one who asked for the port's URL. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PortToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PortToken(<redacted>)")
    }
}

impl fmt::Display for PortToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

fn mac(key: &IdentityKey, sandbox: &SandboxId, generation: u64, door: Door) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(match door {
        Door::Port(_) => MAC_DOMAIN,
        Door::SandboxApi => API_MAC_DOMAIN,
    });
    mac.update(sandbox.as_str().as_bytes());
    mac.update(b"\0");
    mac.update(&generation.to_be_bytes());
    if let Door::Port(port) = door {
        mac.update(&port.to_be_bytes());
    }
    mac
}

fn token(key: &IdentityKey, sandbox: &SandboxId, generation: u64, door: Door) -> PortToken {
    let tag = hex::encode(mac(key, sandbox, generation, door).finalize().into_bytes());
    PortToken(format!("{TOKEN_PREFIX}.{generation}.{tag}"))
}

/// The access token of `port` of `sandbox`'s run `generation`. The request names the sandbox
/// and the port; the token names only the generation, so a stale one can be told from a wrong
/// one.
pub fn derive_token(key: &IdentityKey, sandbox: &SandboxId, generation: u64, port: u16) -> PortToken {
    token(key, sandbox, generation, Door::Port(port))
}

/// The access token of `sandbox`'s in-sandbox API for its run `generation`.
pub fn derive_api_token(key: &IdentityKey, sandbox: &SandboxId, generation: u64) -> PortToken {
    token(key, sandbox, generation, Door::SandboxApi)
}

/// How a request to a port says who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    None,
    /// The API token, which the caller checked: it opens every port.
    ApiToken,
    /// A port access token, unchecked.
    PortToken(&'a str),
}

/// Why a request does not reach the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such sandbox, or one being deleted.
    NotFound,
    /// No credential for a private port, or one that is not this port's.
    Unauthorized(&'static str),
    /// The token is this port's, but for another run than the current one.
    Gone { issued: u64, current: u64 },
    /// The sandbox has no run to serve it: the phase it is in (or going to).
    NotRunning(PhaseKind),
}

impl Refusal {
    /// The HTTP status the proxy answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Refusal::NotFound => 404,
            Refusal::Unauthorized(_) => 401,
            Refusal::Gone { .. } => 410,
            Refusal::NotRunning(_) => 409,
        }
    }
}

/// Whether `port` of `sandbox` is served without a token.
pub fn is_public(sandbox: &Sandbox, port: u16) -> bool {
    sandbox.spec.ports.iter().any(|p| p.port == port && p.public)
}

/// Which generation's run a request with `credential` reaches on `port`, or why none. The
/// credential is judged before the phase: a stale token learns it is stale whatever the
/// sandbox does now.
pub fn admit(key: &IdentityKey, sandbox: Option<&Sandbox>, port: u16, credential: Credential) -> Result<u64, Refusal> {
    admit_through(key, sandbox, Door::Port(port), credential)
}

/// Which generation's run a call to the in-sandbox API carrying `token` reaches, or why none:
/// as for a private port, with the in-sandbox API's own token.
pub fn admit_api(key: &IdentityKey, sandbox: Option<&Sandbox>, token: Option<&str>) -> Result<u64, Refusal> {
    admit_through(key, sandbox, Door::SandboxApi, token.map_or(Credential::None, Credential::PortToken))
}

/// Which run a call to the in-sandbox API carried from another gateway reaches, or why none.
/// That gateway opened it with the sandbox's access token for run `generation` (the token is
/// of its key, which this gateway may not share) and carries it on the API token: it reaches
/// that run only, while it runs.
pub fn admit_api_carried(key: &IdentityKey, sandbox: Option<&Sandbox>, generation: u64) -> Result<u64, Refusal> {
    let current = admit_through(key, sandbox, Door::SandboxApi, Credential::ApiToken)?;
    match current == generation {
        true => Ok(current),
        false => Err(Refusal::Gone { issued: generation, current }),
    }
}

fn admit_through(
    key: &IdentityKey,
    sandbox: Option<&Sandbox>,
    door: Door,
    credential: Credential,
) -> Result<u64, Refusal> {
    let Some(sandbox) = sandbox.filter(|s| s.intent != Intent::Deleted) else { return Err(Refusal::NotFound) };
    if !matches!(door, Door::Port(port) if is_public(sandbox, port)) {
        match credential {
            Credential::ApiToken => {}
            Credential::None => {
                return Err(Refusal::Unauthorized("a private port needs its access token or the API token"));
            }
            Credential::PortToken(token) => {
                let (issued, tag) = parse(token).ok_or(Refusal::Unauthorized("the access token is malformed"))?;
                mac(key, &sandbox.id, issued, door)
                    .verify_slice(&tag)
                    .map_err(|_| Refusal::Unauthorized("the access token is not this port's"))?;
                if issued != sandbox.generation && !crate::bug!(PortTokenOutlivesRun) {
                    return Err(Refusal::Gone { issued, current: sandbox.generation });
                }
            }
        }
    }
    // A pause or a stop on its way: the run is about to be frozen or ended, as for an exec.
    let kind = match (sandbox.intent, sandbox.phase.kind()) {
        (Intent::Paused, _) => PhaseKind::Paused,
        (Intent::Stopped, PhaseKind::Ready | PhaseKind::Paused) => PhaseKind::Stopping,
        (_, kind) => kind,
    };
    match kind {
        PhaseKind::Ready => Ok(sandbox.generation),
        other => Err(Refusal::NotRunning(other)),
    }
}

/// The generation a token names and its MAC, unchecked.
fn parse(token: &str) -> Option<(u64, Vec<u8>)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?.strip_prefix('.')?;
    let (generation, tag) = rest.split_once('.')?;
    let generation = generation.parse().ok().filter(|g| *g != 0)?;
    Some((generation, hex::decode(tag).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::Phase;
    use crate::spec::{PortSpec, SandboxSpec};
    use crate::time::Timestamp;

    fn key(b: u8) -> IdentityKey {
        IdentityKey::from_bytes([b; 32])
    }

    fn sandbox(generation: u64, intent: Intent, phase: Phase) -> Sandbox {
        let spec = SandboxSpec {
            image: "busybox".into(),
            command: vec!["true".into()],
            ports: vec![PortSpec { port: 80, public: true }, PortSpec { port: 81, public: false }],
            ..Default::default()
        };
        let mut s = Sandbox::new(SandboxId::new("sb-1"), "web", spec, Timestamp::from_unix_millis(0));
        s.generation = generation;
        s.intent = intent;
        s.phase = phase;
        s
    }

    fn token(generation: u64, port: u16) -> PortToken {
        derive_token(&key(1), &SandboxId::new("sb-1"), generation, port)
    }

    #[test]
    fn a_token_opens_its_port_of_its_generation_only() {
        let ready = sandbox(3, Intent::Running, Phase::Ready);
        let t = token(3, 8080);
        assert_eq!(admit(&key(1), Some(&ready), 8080, Credential::PortToken(t.expose())), Ok(3));
        let other_port = Credential::PortToken(t.expose());
        assert_eq!(
            admit(&key(1), Some(&ready), 8081, other_port),
            Err(Refusal::Unauthorized("the access token is not this port's"))
        );
        assert_eq!(admit(&key(2), Some(&ready), 8080, other_port).unwrap_err().http_status(), 401, "another key");
        let mut elsewhere = ready.clone();
        elsewhere.id = SandboxId::new("sb-2");
        assert_eq!(admit(&key(1), Some(&elsewhere), 8080, other_port).unwrap_err().http_status(), 401);
        // U1: after a start (a new generation) the old token is Gone, never the new run's.
        let restarted = sandbox(4, Intent::Running, Phase::Ready);
        assert_eq!(
            admit(&key(1), Some(&restarted), 8080, Credential::PortToken(t.expose())),
            Err(Refusal::Gone { issued: 3, current: 4 })
        );
        let forged = t.expose().replacen(".3.", ".4.", 1);
        assert_eq!(
            admit(&key(1), Some(&restarted), 8080, Credential::PortToken(&forged)).unwrap_err().http_status(),
            401
        );
    }

    #[test]
    fn public_ports_need_nothing_and_private_ones_a_credential() {
        let ready = sandbox(1, Intent::Running, Phase::Ready);
        assert_eq!(admit(&key(1), Some(&ready), 80, Credential::None), Ok(1));
        assert_eq!(admit(&key(1), Some(&ready), 81, Credential::None).unwrap_err().http_status(), 401);
        assert_eq!(admit(&key(1), Some(&ready), 9000, Credential::None).unwrap_err().http_status(), 401);
        assert_eq!(admit(&key(1), Some(&ready), 9000, Credential::ApiToken), Ok(1));
        for bad in ["", "berthp1", "berthp1.0.00", "berthp1.x.00", "berthp1.1.zz", "berth1.sb-1.1.00"] {
            assert_eq!(
                admit(&key(1), Some(&ready), 81, Credential::PortToken(bad)),
                Err(Refusal::Unauthorized("the access token is malformed")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn only_a_ready_run_is_reached_and_the_refusal_names_the_phase() {
        let t = token(2, 80);
        let with = Credential::PortToken(t.expose());
        for (intent, phase, kind) in [
            (Intent::Paused, Phase::Paused, PhaseKind::Paused),
            (Intent::Paused, Phase::Ready, PhaseKind::Paused),
            (Intent::Stopped, Phase::Ready, PhaseKind::Stopping),
            (Intent::Stopped, Phase::Stopped, PhaseKind::Stopped),
            (Intent::Running, Phase::Starting, PhaseKind::Starting),
        ] {
            let s = sandbox(2, intent, phase);
            assert_eq!(admit(&key(1), Some(&s), 80, with), Err(Refusal::NotRunning(kind)));
            assert_eq!(admit(&key(1), Some(&s), 80, with).unwrap_err().http_status(), 409);
        }
        // Resumed: the same generation, so the same token.
        assert_eq!(
            admit(
                &key(1),
                Some(&sandbox(2, Intent::Running, Phase::Ready)),
                81,
                Credential::PortToken(token(2, 81).expose())
            ),
            Ok(2)
        );
        let deleting = sandbox(2, Intent::Deleted, Phase::Deleting);
        assert_eq!(admit(&key(1), Some(&deleting), 80, with), Err(Refusal::NotFound));
        assert_eq!(admit(&key(1), None, 80, with).unwrap_err().http_status(), 404);
    }

    #[test]
    fn tokens_stay_out_of_debug_output() {
        let t = token(1, 80);
        assert_eq!(format!("{t:?} {t}"), "PortToken(<redacted>) <redacted>");
        assert!(t.expose().starts_with("berthp1.1."));
    }

    #[test]
    fn the_in_sandbox_api_takes_its_own_token_and_no_port_opens_it() {
        let mut ready = sandbox(3, Intent::Running, Phase::Ready);
        // Even a public port of E2B's envd number opens nothing of the in-sandbox API.
        ready.spec = std::sync::Arc::new(SandboxSpec {
            ports: vec![PortSpec { port: 49983, public: true }],
            ..(*ready.spec).clone()
        });
        let api = derive_api_token(&key(1), &ready.id, 3);
        assert_eq!(admit_api(&key(1), Some(&ready), Some(api.expose())), Ok(3));
        let port = token(3, 49983);
        assert_eq!(
            admit_api(&key(1), Some(&ready), Some(port.expose())),
            Err(Refusal::Unauthorized("the access token is not this port's")),
            "a preview URL's token runs no command"
        );
        assert!(matches!(admit_api(&key(1), Some(&ready), None), Err(Refusal::Unauthorized(_))));
        let private = sandbox(3, Intent::Running, Phase::Ready);
        let as_port = Credential::PortToken(api.expose());
        assert_eq!(admit(&key(1), Some(&private), 81, as_port).unwrap_err().http_status(), 401, "no port takes it");
        // Its generation's only, as a port's.
        let restarted = sandbox(4, Intent::Running, Phase::Ready);
        assert_eq!(
            admit_api(&key(1), Some(&restarted), Some(api.expose())),
            Err(Refusal::Gone { issued: 3, current: 4 })
        );
    }
}
