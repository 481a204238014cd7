//! What a user asks to run: a sandbox's spec and its parts, and an exec's. Plain data, fixed
//! once created; the rules that bound each part live with its concept ([`crate::validate`],
//! [`crate::lifetime`], [`crate::restart`], [`crate::limits`], [`crate::egress`], [`crate::exec`]).

use std::collections::BTreeMap;
use std::fmt;

use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::allowlist::Policy;
use crate::limits::ResourceLimits;

/// Where a sandbox's workspace is, inside it: the files its stops keep and its snapshots copy.
pub const WORKSPACE: &str = "/workspace";

/// The image of a spec that names none, whichever client sent it (the CLI, an SDK, the HTTP/JSON
/// API): the process driver runs the command on its host and ignores the image.
pub const DEFAULT_IMAGE: &str = "host";

/// What the user asked to run. Immutable after create.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// Records written before lifetimes and restart policies existed read back with none.
    #[serde(default)]
    pub lifetime: Lifetime,
    #[serde(default)]
    pub restart: RestartPolicy,
    #[serde(default)]
    pub limits: ResourceLimits,
    /// Where its runs may connect (DESIGN 10); empty: nowhere.
    #[serde(default)]
    pub egress: Policy,
    /// The volumes its runs see (DESIGN 13.2), each at its own path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Mount>,
    /// Its ports the preview proxy serves without a token (DESIGN 13.1); every other port of a
    /// run is private.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    /// Labels a node must have to run it (DESIGN 14); empty: any node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

/// A port of a sandbox's runs the spec names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    pub port: u16,
    pub public: bool,
}

/// A volume mounted into a sandbox's runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// The volume's name.
    pub volume: String,
    /// An absolute path inside the sandbox.
    pub path: String,
    pub read_only: bool,
}

/// What a sandbox's deadline does when it passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnExpiry {
    /// Stop it: the workspace is kept, and a start (which renews a TTL) runs it again.
    #[default]
    Stop,
    /// Delete it and everything made for it.
    Delete,
    /// Pause it (DESIGN 12.1): memory kept, a resume thaws it. A sandbox already paused stays
    /// so; one whose run is not Ready (still starting, or failed) is stopped instead, so that
    /// the deadline ends what runs whichever it is.
    Pause,
}

/// The lifetime part of a spec (DESIGN 9.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetime {
    /// The deadline is this long after the create, and after every renew and start that does
    /// not set one of its own.
    pub ttl: Option<Duration>,
    /// How long the sandbox may go without activity while it is meant to run.
    #[serde(default)]
    pub idle_timeout: Option<Duration>,
    /// What the deadline does, and the idle timeout unless `on_idle` says otherwise.
    pub on_expiry: OnExpiry,
    /// What the idle timeout does, if not what `on_expiry` says.
    #[serde(default)]
    pub on_idle: Option<OnExpiry>,
}

impl Lifetime {
    /// What an idle expiry does.
    pub fn idle_action(&self) -> OnExpiry {
        self.on_idle.unwrap_or(self.on_expiry)
    }
}

/// Which ends of a run its policy restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RestartMode {
    /// An ended run stays ended (Stopped or Error) until a user starts it.
    #[default]
    Never,
    /// A run that failed (a non-zero exit, a lost compute resource, a start that failed) is
    /// restarted; one that completed (exit 0) is not.
    OnFailure,
    /// Every run that ends by itself is restarted.
    Always,
}

/// The restart part of a spec (DESIGN 9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub mode: RestartMode,
    /// Restarts allowed since the last user start; then the sandbox stays in Error (or Stopped)
    /// with the count. `None`: no limit.
    pub max_restarts: Option<u32>,
    /// The wait before the first restart; each next one waits twice as long, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            mode: RestartMode::Never,
            max_restarts: None,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// What to run. Its `Debug` shows the shape, never the arguments or values: a command may carry
/// a secret, and records reach logs in errors.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// The working directory inside the sandbox; empty: the command's own.
    pub cwd: String,
    /// One stream through a terminal instead of stdout and stderr apart.
    pub tty: bool,
    /// Whether the client sends stdin; without it the command's stdin is empty.
    pub stdin: bool,
    /// Milliseconds the command may run before it is killed and ends TimedOut; `None`: no limit.
    pub timeout_ms: Option<u64>,
}

impl fmt::Debug for ExecSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecSpec")
            .field("args", &self.argv.len())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("tty", &self.tty)
            .field("stdin", &self.stdin)
            .field("timeout_ms", &self.timeout_ms)
            .finish_non_exhaustive()
    }
}
