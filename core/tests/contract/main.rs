//! berth-core's contract tests: one binary, so the world helper is shared without duplication.

mod commands;
mod egress;
mod execs;
mod idle;
mod merge_rules;
mod model;
mod placement;
mod plan;
mod pools;
mod reports;
mod snapshots;
mod timed_rules;
mod volumes;
mod world;
