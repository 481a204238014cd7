//! berth-sim: the real Berth gateway and drivers (container or process, as the seed draws)
//! inside turmoil, with a simulated runtime host, the real supervisor session, clients,
//! injected races, and the invariant checkers of DESIGN 4. One seed derives everything; the
//! same seed and build give a byte-identical trace.

pub mod checker;
pub mod client;
pub mod driver;
pub mod egress;
pub mod engine;
pub mod execs;
pub mod faults;
pub mod gateway;
pub mod invariants;
pub mod kernel;
pub mod net;
pub mod os;
pub mod run;
pub mod runtime;
pub mod scenario;
pub mod snapshots;
pub mod supervisor;
pub mod timeline;
pub mod trace;
pub mod world;
