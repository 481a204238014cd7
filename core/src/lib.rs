//! berth-core: Berth's lifecycle contract as pure, deterministic code.
//!
//! Inputs are commands, observations, what the store read, and `now`; outputs are decisions:
//! the conditional writes to commit, then the driver effects to run. Nothing here does I/O,
//! reads a clock or draws a random number: anything timed or random is an argument.
//!
//! The modules read bottom-up: plain data first, then the rules over it (a test keeps the
//! module graph acyclic).
//!
//! Data:
//! - [`time`], [`id`], [`phase`]: timestamps, ids, lifecycle phases
//! - [`error`]: typed errors with their status class (3.7)
//! - [`limits`], [`allowlist`]: CPU, memory and process limits, and egress allow-lists (10)
//! - [`spec`]: what a user asks to run
//! - [`record`]: sandboxes, providers, templates, snapshots and execs (3.1)
//! - [`decision`]: the conditional writes and driver effects a rule decides
//! - [`request`]: a command, its expected version, and what was read for it (3.2)
//! - [`report`]: what the runtime, drivers and supervisors report
//! - [`branch`]: the named branches of the decisions (counted only for the simulator)
//!
//! Rules:
//! - [`validate`]: the input limits every entry point applies
//! - [`plan`]: what each command reads, holds and is called
//! - [`lifetime`]: deadlines, renews and expiry (9.1)
//! - [`restart`]: restart policies and their backoff (9.2)
//! - [`egress`]: where a sandbox's runs may connect (10)
//! - [`provider`]: making and removing providers
//! - [`template`]: templates, warm pools and claims (9.4)
//! - [`snapshot`]: snapshots, creates from them, and forks (12.2, 12.3)
//! - [`volume`]: volumes, their mounts and their delete (13.2)
//! - [`command`]: API commands decided against a read (3.2)
//! - [`cas`]: what to do after a conflicting write (3.3)
//! - [`identity`]: runtime identity tokens (3.4)
//! - [`port`]: ports' access tokens and who reaches a port of a run (13.1)
//! - [`placement`]: which node runs a sandbox's next run (14)
//! - [`fencing`]: what a node may keep running, and which effects it carries out (14, N1)
//! - [`observation`]: the one merge of everything the runtime and supervisors report (3.5)
//! - [`recovery`]: which unconfirmed transitions to re-drive (3.6)
//! - [`start_gate`]: the rule every driver keeps about starting runs (D1)
//! - [`exec`]: execs, their admission, reports and end (8.1)
//! - [`timers`]: when each timed rule of a record next falls due
//! - [`lease`]: how long a reconcile lease holder may rely on its grant

pub mod allowlist;
pub mod branch;
pub mod bugs;
pub mod cas;
pub mod command;
pub mod decision;
pub mod egress;
pub mod error;
pub mod exec;
pub mod fencing;
pub mod id;
pub mod identity;
pub mod lease;
pub mod lifetime;
pub mod limits;
pub mod observation;
pub mod phase;
pub mod placement;
pub mod plan;
pub mod port;
pub mod provider;
pub mod record;
pub mod recovery;
pub mod report;
pub mod request;
pub mod restart;
pub mod snapshot;
pub mod spec;
pub mod start_gate;
pub mod template;
pub mod time;
pub mod timers;
pub mod validate;
pub mod volume;

pub use command::decide;
pub use decision::{Conflict, Decision, Effect, Key, Outcome, Write};
pub use error::{Code, Error, Kind};
pub use id::{NodeId, SandboxId, SnapshotId, VolumeId};
pub use observation::merge;
pub use phase::{Failure, FailureReason, Hold, Phase, PhaseKind};
pub use record::{
    ExitFence, ExitMarker, Intent, Placement, Provider, Run, Sandbox, Secret, Snapshot, SnapshotPhase, Volume,
    VolumePhase,
};
pub use report::{MainProcess, Observation, RuntimeSource, RuntimeState, StartReply};
pub use request::{Command, Reads, Request};
pub use spec::SandboxSpec;
pub use time::Timestamp;
