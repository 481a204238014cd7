//! berth-supervisor's session with the gateway, as a library: the binary runs it over real
//! sockets, the simulator over simulated ones, so the simulator tests the protocol production
//! speaks rather than a copy of it. The session carries the run's execs ([`exec`], started by a
//! [`launch::Launcher`]) and their output ([`output`]); the main process's output goes to its generation's logs ([`logs`]);
//! [`cgroup`] holds the run to its limits and tells a kill for memory; [`egress`] carries the
//! run's connections out through the gateway's egress proxy, and [`ports`] the gateway's
//! connections in to the run's ports.

pub mod cgroup;
pub mod egress;
pub mod exec;
pub mod launch;
pub mod logs;
pub mod output;
pub mod ports;
pub mod session;
