//! The invariants of DESIGN 4 and 11, and the promises of DESIGN 3 and 8-10 that have no
//! number there, one module each: what counts as a violation and what it says, as functions of
//! plain data (records, the runtime's ground truth, histories).
//!
//! A rule that needs only what the store committed and what clients were told is a [`Checker`]:
//! it is fed [`Fact`]s and keeps its own evidence (the claims made, the last exec activity, when
//! each run ended), so adding one is one module and one line in [`checkers`], and the world
//! never learns what it keeps. The rules that need the runtime's ground truth (I1, I2, I6, I7,
//! I8, D1, E2, E3) are still called where that truth is at hand (the store wrapper, the
//! supervisors, the runtime, the run) and report with [`crate::world::World::violate`].
//!
//! I4 has no module of its own: a stale version's ABORTED is part of I5's register model, and
//! its violations are reported as I5's. I9 is checked by running a seed twice
//! (`tests/determinism.rs`), not inside a run.

use std::fmt;

use serde::Serialize;

pub mod c1_records;
pub mod d1_one_run;
pub mod e_execs;
pub mod g1_egress;
pub mod i10_no_panic_or_internal;
pub mod i1_stale_exit;
pub mod i2_exits_reported;
pub mod i3_server_owned;
pub mod i5_versions;
pub mod i6_one_generation;
pub mod i7_delete_completes;
pub mod i8_liveness;
pub mod l1_one_holder;
pub mod m1_main_exit;
pub mod n1_one_run_across_nodes;
pub mod n2_placed_live;
pub mod p1_pools;
pub mod r1_restarts;
pub mod s1_snapshot_files;
pub mod s2_snapshots_kept;
pub mod s2_volumes_kept;
pub mod s3_pause;
pub mod s4_forks;
pub mod t1_deadlines;
pub mod t1_idle;
pub mod u1_port_tokens;
pub mod x1_admission;

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
    /// detaches since (`g1_egress`).
    G1,
    /// DESIGN 16: at most one run of a sandbox across nodes, and only on the node the store
    /// places it on (`n1_one_run_across_nodes`).
    N1,
    /// DESIGN 16: after faults stop, nothing waits on a node whose lease is not live
    /// (`n2_placed_live`).
    N2,
    /// DESIGN 3.1, 3.2 and 3.5's rule 7, as the store's writes show them: ids never reused,
    /// live names unique and immutable, a create's first record, a new generation written as a
    /// Start writes one, Deleting final, no Ready again within a generation, no reference to a
    /// deleted provider; and a create's reply is the record it made (`c1_records`).
    C1,
    /// DESIGN 8.1's admission: an exec is admitted only to a Ready sandbox, for its current
    /// generation, and an exec's terminal state is final (`x1_admission`).
    X1,
    /// DESIGN 9.2: a restart only where the policy asks for one, never past its maximum, never
    /// before its backoff (`r1_restarts`).
    R1,
    /// DESIGN 9.3: a completion is an exit 0, an exit failure a non-zero code (`m1_main_exit`).
    M1,
    /// DESIGN 12.2: a Ready snapshot never changes, and a sandbox made from it starts with
    /// exactly its files (`s1_snapshot_files`).
    S1,
    /// DESIGN 12.2: a snapshot is never removed while a sandbox made from it needs it, and an
    /// acknowledged delete of one completes, leaving nothing behind (`s2_snapshots_kept`).
    S2,
    /// DESIGN 12.1: pause and resume keep the generation; a paused sandbox admits no exec;
    /// intent Paused converges to Paused over a frozen run (`s3_pause`).
    S3,
    /// DESIGN 12.3: a fork makes all its sandboxes or none (`s4_forks`).
    S4,
    /// DESIGN 13.1: a port's access token reaches only the run it was issued for
    /// (`u1_port_tokens`).
    U1,
}

/// What a [`Checker`] is fed: what the store committed and what clients were told, with the
/// times the checker needs. Borrowed: a fact lives for one dispatch, and a checker copies what
/// it keeps.
#[derive(Debug)]
pub enum Fact<'a> {
    /// One sandbox write the store committed at simulated time `t` (µs) and store time `now`:
    /// `before` absent for a create, `after` absent for a removal. `open_execs`: for an idle
    /// expiry, the sandbox's execs open as it committed (0 otherwise).
    Sandbox {
        t: u64,
        now: berth_core::Timestamp,
        before: Option<&'a berth_core::Sandbox>,
        after: Option<&'a berth_core::Sandbox>,
        open_execs: usize,
    },
    /// One exec write the store committed: `before` absent for an admission; `sandbox` the
    /// record it was admitted against (or whose run it belongs to) as the commit found it.
    Exec {
        before: Option<&'a berth_core::exec::Exec>,
        after: &'a berth_core::exec::Exec,
        sandbox: Option<&'a berth_core::Sandbox>,
    },
    /// What the egress proxy did with a run's request: opened a connection (as the upstream saw
    /// it arrive) or refused it (as the run heard).
    Egress { opened: bool, request: &'a g1_egress::Request<'a> },
    /// The store granted `lease` (the reconcile lease, or a node's) to `holder` in `term` at
    /// `t` (a take-over or a renewal), or released it (`released`).
    Lease { t: u64, lease: &'a str, holder: &'a str, term: u64, released: bool },
    /// Gateway `gateway` ran reconcile of node `node`'s runtime at `t` (`what`: a poll or a
    /// watch of the runtime).
    Reconciling { t: u64, gateway: &'a str, node: &'a str, what: &'a str },
    /// A run launched exec `exec` of `sandbox` (as the supervisor's launcher did it).
    Launched { sandbox: &'a str, exec: &'a str },
    /// A reader of exec `exec` of `sandbox` (admitted at `admitted`, ms) saw it end as `state`.
    ExecEnded { sandbox: &'a str, exec: &'a str, admitted: i64, state: &'a berth_core::exec::ExecState },
    /// A template created or changed.
    Template(&'a berth_core::template::Template),
    /// A client's sandbox operation, as it was recorded for the linearizability check, with
    /// the id of the sandbox its reply returned.
    Reply { op: &'a crate::world::Op, id: Option<&'a str> },
    /// One snapshot write the store committed: `before` absent for a create, `after` absent for
    /// a removal; `made`, the sandboxes made from it in the same commit.
    Snapshot {
        before: Option<&'a berth_core::Snapshot>,
        after: Option<&'a berth_core::Snapshot>,
        made: &'a [&'a berth_core::Sandbox],
    },
    /// The quiet phase is over, and this is what the host keeps of snapshots: every snapshot
    /// record, every sandbox record, the sum of each copy the drivers keep (`None`: no whole
    /// archive), the sum of the workspace of each sandbox its driver seeded, and the images the
    /// runtime names in Berth's repositories.
    Kept {
        snapshots: &'a [berth_core::Snapshot],
        records: &'a [berth_core::Sandbox],
        copies: &'a std::collections::BTreeMap<berth_core::SnapshotId, Option<String>>,
        seeded: &'a std::collections::BTreeMap<berth_core::SandboxId, String>,
        images: &'a [String],
    },
    /// A claim's reply: `claimer` got sandbox `id`, as `seen`.
    Claimed { id: &'a str, name: &'a str, claimer: &'a str, seen: &'a crate::world::Seen },
    /// The quiet phase is over: every record, template and provider the store holds, at store
    /// time `now`; `expiry_bound` is how late an expiry may be once faults stopped.
    Converged {
        records: &'a [berth_core::Sandbox],
        templates: &'a [berth_core::template::Template],
        providers: &'a [berth_core::Provider],
        now: berth_core::Timestamp,
        expiry_bound: core::time::Duration,
    },
}

/// A violation a checker found: which invariant, and what happened.
pub type Found = Vec<(Invariant, String)>;

/// One invariant's rule over [`Fact`]s, with the evidence it keeps (TigerBeetle's
/// `state_checker.zig` shape): it reports each violation into `found` as it sees it.
pub trait Checker: Send {
    fn on(&mut self, fact: &Fact<'_>, found: &mut Found);
}

/// Every checker fed facts, in the order they are fed each one.
pub fn checkers() -> Vec<Box<dyn Checker>> {
    vec![
        Box::<i5_versions::Versions>::default(),
        Box::<c1_records::Records>::default(),
        Box::<x1_admission::Admission>::default(),
        Box::<s3_pause::Pause>::default(),
        Box::<s1_snapshot_files::Files>::default(),
        Box::<s2_snapshots_kept::Kept>::default(),
        Box::<s4_forks::Forks>::default(),
        Box::<t1_deadlines::Deadlines>::default(),
        Box::<t1_idle::Idle>::default(),
        Box::<r1_restarts::Restarts>::default(),
        Box::<m1_main_exit::MainExit>::default(),
        Box::<p1_pools::Pools>::default(),
        Box::new(g1_egress::Egress::new(crate::egress::endpoints)),
        Box::<l1_one_holder::Lease>::default(),
        Box::<e_execs::Execs>::default(),
    ]
}

/// Feeds `facts` to `checker` and returns what it found: the unit tests' way to show a rule
/// fires on a violating history.
#[cfg(test)]
pub(crate) fn feed(checker: &mut dyn Checker, facts: &[Fact<'_>]) -> Vec<String> {
    let mut found = Found::new();
    for fact in facts {
        checker.on(fact, &mut found);
    }
    found.into_iter().map(|(invariant, problem)| format!("{invariant}: {problem}")).collect()
}

/// A sandbox write at `t` seconds (store time as simulated time), for the unit tests.
#[cfg(test)]
pub(crate) fn write<'a>(
    t: u64,
    before: Option<&'a berth_core::Sandbox>,
    after: Option<&'a berth_core::Sandbox>,
) -> Fact<'a> {
    Fact::Sandbox { t: t * 1_000_000, now: at(t), before, after, open_execs: 0 }
}

/// The end of a quiet phase at store time 100 s, with no providers, for the unit tests.
#[cfg(test)]
pub(crate) fn converged<'a>(
    records: &'a [berth_core::Sandbox],
    templates: &'a [berth_core::template::Template],
) -> Fact<'a> {
    Fact::Converged {
        records,
        templates,
        providers: &[],
        now: at(100),
        expiry_bound: core::time::Duration::from_secs(5),
    }
}

/// Store time `secs` seconds after the simulated epoch, for the unit tests.
#[cfg(test)]
pub(crate) fn at(secs: u64) -> berth_core::Timestamp {
    berth_core::Timestamp::from_unix_millis(((crate::world::EPOCH_SECS + secs) * 1_000) as i64)
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

/// Exec `x1` of sandbox `a`'s record (see [`sandbox`]), admitted for `generation`, for the unit
/// tests.
#[cfg(test)]
pub(crate) fn exec(generation: u64, state: berth_core::exec::ExecState) -> berth_core::exec::Exec {
    berth_core::exec::Exec {
        sandbox: berth_core::SandboxId::new("id-a"),
        id: berth_core::exec::ExecId::parse("id", "x1").unwrap(),
        spec: Default::default(),
        generation,
        state,
        cancel_requested: false,
        output_bytes: None,
        resource_version: 1,
        admitted_at: Default::default(),
        updated_at: Default::default(),
    }
}

/// Snapshots and what is kept of them, for the unit tests of S1, S2 and S4.
#[cfg(test)]
pub(crate) mod snapshot {
    use std::collections::BTreeMap;

    use berth_core::record::{Content, Seed, SnapshotSource};
    use berth_core::{Intent, Phase, Sandbox, SandboxId, Snapshot, SnapshotId, SnapshotPhase};

    use super::Fact;

    /// Snapshot `name` (id `sn-<name>`) of sandbox `src`, in `phase`, holding nothing yet.
    pub fn taken(name: &str, phase: SnapshotPhase) -> Snapshot {
        Snapshot {
            name: name.into(),
            id: SnapshotId::new(format!("sn-{name}")),
            source: SnapshotSource { id: SandboxId::new("id-src"), name: "src".into(), generation: 1 },
            spec: Default::default(),
            phase,
            content: None,
            fork: None,
            resource_version: 1,
            created_at: Default::default(),
            updated_at: Default::default(),
        }
    }

    /// [`taken`], Ready, its copy summing `sum`.
    pub fn ready(name: &str, sum: &str) -> Snapshot {
        let content = Content { size_bytes: 1, sha256: sum.into(), image: None };
        Snapshot { content: Some(content), ..taken(name, SnapshotPhase::Ready) }
    }

    /// Sandbox `name`, Ready, made from `snapshot` and seeded.
    pub fn made_from(name: &str, snapshot: &Snapshot) -> Sandbox {
        let mut s = super::sandbox(name, Intent::Running, Phase::Ready, 1);
        std::sync::Arc::make_mut(&mut s.spec)
            .labels
            .insert(berth_core::snapshot::SNAPSHOT_LABEL.into(), snapshot.name.clone());
        s.seed = Some(Seed { snapshot: snapshot.name.clone(), id: snapshot.id.clone(), seeded: true });
        s
    }

    pub fn kept<'a>(
        snapshots: &'a [Snapshot],
        records: &'a [Sandbox],
        copies: &'a BTreeMap<SnapshotId, Option<String>>,
        seeded: &'a BTreeMap<SandboxId, String>,
        images: &'a [String],
    ) -> Fact<'a> {
        Fact::Kept { snapshots, records, copies, seeded, images }
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
            Invariant::C1,
            Invariant::X1,
            Invariant::R1,
            Invariant::M1,
        ];
        let names: Vec<String> = all.iter().map(ToString::to_string).collect();
        let want = [
            "I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9", "I10", "D1", "L1", "T1", "P1", "C1", "X1", "R1", "M1",
        ];
        assert_eq!(names, want);
        assert_eq!(serde_json::to_string(&Invariant::I10).unwrap(), "\"I10\"");
    }
}
