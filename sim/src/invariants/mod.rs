//! The invariants of DESIGN 4 and 11, one module each: what counts as a violation and what it
//! says, as functions of plain data (records, the runtime's ground truth, histories). Where and
//! when each is checked is the callers' business ([`crate::checker`], the clients, the
//! supervisors, the runtime, the world, the run); they report a problem with
//! [`crate::world::World::violate`].
//!
//! I4 has no module of its own: a stale version's ABORTED is part of I5's register model, and
//! its violations are reported as I5's. I9 is checked by running a seed twice
//! (`tests/determinism.rs`), not inside a run.

use std::fmt;

use serde::Serialize;

pub mod d1_one_run;
pub mod e_execs;
pub mod i10_no_panic_or_internal;
pub mod i1_stale_exit;
pub mod i2_exits_reported;
pub mod i3_server_owned;
pub mod i5_versions;
pub mod i6_one_generation;
pub mod i7_delete_completes;
pub mod i8_liveness;
pub mod l1_one_holder;
pub mod n1_egress;
pub mod p1_pools;
pub mod t1_deadlines;
pub mod t1_idle;

/// An invariant's id, as DESIGN names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Invariant {
    I1,
    I2,
    I3,
    I4,
    I5,
    I6,
    I7,
    I8,
    I9,
    I10,
    D1,
    L1,
    E1,
    E2,
    E3,
    E4,
    T1,
    P1,
    /// Issue 18's: a run's egress is the policy committed with its generation, narrowed by
    /// detaches since (`n1_egress`).
    N1,
}

/// DESIGN's name, exactly: the trace and the CLI print it.
impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A record as the tests' checks see it: named `name`, at `generation`, with its intent and phase.
#[cfg(test)]
pub(crate) fn sandbox(
    name: &str,
    intent: berth_core::Intent,
    phase: berth_core::Phase,
    generation: u64,
) -> berth_core::Sandbox {
    let id = berth_core::SandboxId::new(format!("id-{name}"));
    berth_core::Sandbox {
        intent,
        phase,
        generation,
        exit_fence: berth_core::ExitFence::default(),
        ..berth_core::Sandbox::new(id, name, Default::default(), berth_core::Timestamp::default())
    }
}

#[cfg(test)]
mod tests {
    use super::Invariant;

    #[test]
    fn ids_print_as_design_names_them() {
        let all = [
            Invariant::I1,
            Invariant::I2,
            Invariant::I3,
            Invariant::I4,
            Invariant::I5,
            Invariant::I6,
            Invariant::I7,
            Invariant::I8,
            Invariant::I9,
            Invariant::I10,
            Invariant::D1,
            Invariant::L1,
            Invariant::T1,
            Invariant::P1,
        ];
        let names: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9", "I10", "D1", "L1", "T1", "P1"]);
        assert_eq!(serde_json::to_string(&Invariant::I10).unwrap(), "\"I10\"");
    }
}
