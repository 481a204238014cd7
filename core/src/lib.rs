//! berth-core: Berth's lifecycle contract as pure, deterministic code.
//!
//! Inputs are commands, observations, what the store read, and `now`; outputs are decisions:
//! the conditional writes to commit, then the driver effects to run. Nothing here does I/O,
//! reads a clock or draws a random number: anything timed or random is an argument.
//!
//! - [`record`]: sandboxes and providers (DESIGN 3.1)
//! - [`command`]: API commands decided against a read (3.2)
//! - [`plan`]: what each command reads, holds and is called
//! - [`cas`]: what to do after a conflicting write (3.3)
//! - [`identity`]: runtime identity tokens (3.4)
//! - [`observation`]: the one merge of everything the runtime and supervisors report (3.5)
//! - [`recovery`]: which unconfirmed transitions to re-drive (3.6)
//! - [`start_gate`]: the rule every driver keeps about starting runs (D1)
//! - [`exec`]: execs, their admission, reports and end (8.1)
//! - [`lifetime`]: deadlines, renews and expiry (9.1)
//! - [`restart`]: restart policies and their backoff (9.2)
//! - [`limits`]: CPU, memory and process limits (10)
//! - [`egress`]: where a sandbox's runs may connect (10)
//! - [`template`]: templates, warm pools and claims (9.4)
//! - [`timers`]: when each timed rule of a record next falls due
//! - [`lease`]: how long a reconcile lease holder may rely on its grant
//! - [`error`]: typed errors with their status class (3.7)
//! - [`branch`]: which branches of the decisions ran (counted only for the simulator)

pub mod branch;
#[cfg(feature = "bugs")]
pub mod bugs;
pub mod cas;
pub mod command;
pub mod decision;
pub mod egress;
pub mod error;
pub mod exec;
pub mod identity;
pub mod lease;
pub mod lifetime;
pub mod limits;
pub mod observation;
pub mod plan;
pub mod record;
pub mod recovery;
pub mod restart;
pub mod start_gate;
pub mod template;
pub mod timers;
pub mod validate;

pub use command::{Command, Reads, Request, decide};
pub use decision::{Conflict, Decision, Effect, Key, Outcome, Write};
pub use error::{Code, Error, Kind};
pub use observation::{MainProcess, Observation, RuntimeSource, RuntimeState, StartReply, merge};
pub use record::{
    ExitFence, ExitMarker, Failure, FailureReason, Intent, Phase, PhaseKind, Provider, Run, Sandbox, SandboxId,
    SandboxSpec, Secret, Timestamp,
};
