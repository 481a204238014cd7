//! End-to-end tests: the real gateway binary over real TCP, a real SQLite file (or PostgreSQL),
//! real sandbox processes. One binary, so the harness is shared.

mod bad_input;
mod cli;
mod cluster;
mod conformance;
mod contention;
mod crash;
mod egress;
mod exec;
mod files;
mod fleet_watch;
mod harness;
mod history;
mod http;
mod identity;
mod lifecycle;
mod lifetimes;
mod limits;
mod logs;
mod main_process;
mod metrics;
mod nodes;
mod pause;
#[path = "../support/postgres.rs"]
mod pg;
mod pools;
mod ports;
mod postgres;
mod providers;
mod several;
mod shutdown;
mod snapshots;
mod store_binding;
mod store_labels;
mod tls;
mod volumes;
