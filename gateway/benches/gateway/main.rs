//! Gateway throughput. Prints lifecycle RPCs per second with p50/p99 latency at 1, 16 and 64
//! concurrent clients (real gRPC over loopback TCP, the SQLite store on disk, a no-op driver);
//! 64 clients again on PostgreSQL, with one gateway and with three sharing the database (when
//! `BERTH_TEST_POSTGRES_URL` names one: `ci/bench` starts it); the time from killing the
//! node lease's holder (real gateway processes) to another gateway's first reconcile
//! sweep; the time of one reconcile sweep over 1,000 and 10,000 sandboxes; and reads
//! (GetSandbox, ListSandboxes of 16) whose replies the server writes in several segments, to
//! clients that delay their ACKs, as Linux does, with Nagle's algorithm off in the client and
//! on; and connections through the egress proxy (the supervisor's listener code, the gateway's
//! proxy over its Unix socket) beside direct ones to a local server: the time to a first byte,
//! a round trip on an open connection, and bulk throughput; and HTTP requests through the
//! preview proxy beside direct ones to a local server: latency and throughput; and, with
//! several nodes, creates to Ready across three beside one and a node's death to its sandboxes
//! Ready elsewhere. It asserts nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::identity::IdentityKey;
use berth_core::lifetime::Lifetime;
use berth_core::{Command, Hold, Request, RuntimeState, SandboxId, SandboxSpec, StartReply, Timestamp};
use berth_drivers::{Driver, DriverError, Launch, ListPage, WatchStream};
use berth_gateway::engine::{Engine, EngineSettings};
use berth_gateway::reconcile::{ReconcileSettings, sweep};
use berth_gateway::store::postgres::PostgresStore;
use berth_gateway::store::sqlite::SqliteStore;
use berth_gateway::store::{PageRequest, Store};
use berth_gateway::timers::Schedule;
use berth_proto::v1 as pb;
use berth_proto::v1::sandboxes_client::SandboxesClient;
use tonic::metadata::MetadataValue;

#[path = "../../tests/support/postgres.rs"]
mod pg;

mod egress;
mod harness;
mod nodes;
mod ports;
mod reads;
mod rpcs;
mod sweeps;

use egress::*;
use harness::*;
use nodes::*;
use ports::*;
use reads::*;
use rpcs::*;
use sweeps::*;

/// A machine-readable line for ci/bench's report.
fn figure(name: &str, value: f64, unit: &str) {
    println!("figure: {name} = {value:.3} {unit}");
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and runs this small, as a
    // smoke, so it cannot rot.
    let quick = !std::env::args().any(|a| a == "--bench")
        || std::env::var_os("BERTH_BENCH_QUICK").is_some_and(|v| !v.is_empty());
    // `cargo bench --bench gateway -- reads` runs only the sections named (lifecycle, postgres,
    // reads, sweeps, egress, ports, nodes); none named, all of them.
    let named: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wants = |section: &str| named.is_empty() || named.iter().any(|n| n == section);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if wants("lifecycle") {
        lifecycle(&runtime, quick);
    }
    if wants("postgres") {
        postgres(&runtime, quick);
    }
    if wants("reads") {
        reads(&runtime, quick);
    }
    if wants("sweeps") {
        sweeps(&runtime, quick);
    }
    if wants("egress") {
        egress(&runtime, quick);
    }
    if wants("ports") {
        ports(&runtime, quick);
    }
    if wants("nodes") {
        nodes(&runtime, quick);
    }
}
