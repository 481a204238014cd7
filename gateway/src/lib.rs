//! berth-gateway: executes what berth-core decides, against a store and a runtime driver.

pub mod api;
pub mod cli;
pub mod clock;
pub mod config;
pub mod data_dir;
pub mod egress;
pub mod engine;
pub mod error;
pub mod fencing;
pub mod ingress;
pub mod lease;
pub mod metrics;
pub mod node;
pub mod pools;
pub mod ports;
pub mod reconcile;
mod record_locks;
pub mod routing;
pub mod server;
pub mod sessions;
pub mod store;
pub mod tcp;
pub mod timers;
pub mod tls;
