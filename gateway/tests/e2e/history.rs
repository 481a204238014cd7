//! Client histories and their linearizability, for the tests with several gateways. Each call
//! is recorded with its call and return instants and what it saw. A sandbox is a versioned
//! register whose writes are mostly hidden (the reconcile loop's), so the check is the one such
//! a register allows: a linearization exists iff every version has one record, generations only
//! grow with versions, no call sees an older version (or the sandbox back) after another call
//! that returned before it began saw a newer one, a sandbox is only gone after a delete was
//! asked for, and every acknowledged command's intent stands until a later command.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use berth_proto::v1 as pb;
use tonic::{Code, Status};

use crate::harness::{Sandboxes, lifecycle};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Record {
        version: u64,
        generation: u64,
        phase: i32,
        intent: i32,
    },
    NotFound,
    /// An error that says nothing of the record, or no answer: constrains nothing.
    Nothing,
}

impl Seen {
    /// Where the register was when the call saw it: its version, or past every version once gone.
    fn rank(&self) -> Option<u64> {
        match self {
            Seen::Record { version, .. } => Some(*version),
            Seen::NotFound => Some(u64::MAX),
            Seen::Nothing => None,
        }
    }
}

#[derive(Debug)]
struct Op {
    sandbox: String,
    kind: &'static str,
    call: Instant,
    ret: Instant,
    seen: Seen,
}

impl Op {
    fn is_command(&self) -> bool {
        self.kind != "get"
    }
}

#[derive(Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
}

impl History {
    fn record(&self, sandbox: &str, kind: &'static str, call: Instant, result: &Result<pb::Sandbox, Status>) {
        let seen = match result {
            Ok(s) => {
                Seen::Record { version: s.resource_version, generation: s.generation, phase: s.phase, intent: s.intent }
            }
            Err(status) if status.code() == Code::NotFound => Seen::NotFound,
            Err(_) => Seen::Nothing,
        };
        let op = Op { sandbox: sandbox.to_string(), kind, call, ret: Instant::now(), seen };
        self.ops.lock().unwrap().push(op);
    }

    pub async fn get(&self, sandboxes: &mut Sandboxes, name: &str) -> Result<pb::Sandbox, Status> {
        let call = Instant::now();
        let result = crate::harness::get(sandboxes, name).await;
        self.record(name, "get", call, &result);
        result
    }

    pub async fn lifecycle(
        &self,
        sandboxes: &mut Sandboxes,
        verb: &'static str,
        name: &str,
    ) -> Result<pb::Sandbox, Status> {
        let call = Instant::now();
        let result = lifecycle(sandboxes, verb, name).await;
        self.record(name, verb, call, &result);
        result
    }

    pub async fn create(&self, sandboxes: &mut Sandboxes, name: &str, spec: pb::SandboxSpec) -> pb::Sandbox {
        let request = pb::CreateSandboxRequest { name: name.into(), spec: Some(spec), ..Default::default() };
        let call = Instant::now();
        let result = sandboxes.create_sandbox(request).await.map(|r| r.into_inner().sandbox.unwrap_or_default());
        self.record(name, "create", call, &result);
        result.unwrap_or_else(|status| panic!("create {name}: {status:?}"))
    }

    pub fn len(&self) -> usize {
        self.ops.lock().unwrap().len()
    }

    /// Every way the recorded history fails to be linearizable, described.
    pub fn violations(&self) -> Vec<String> {
        let ops = self.ops.lock().unwrap();
        let mut by_sandbox: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
        for op in ops.iter() {
            by_sandbox.entry(&op.sandbox).or_default().push(op);
        }
        by_sandbox.into_iter().flat_map(|(name, ops)| sandbox_violations(name, &ops)).collect()
    }
}

fn sandbox_violations(name: &str, ops: &[&Op]) -> Vec<String> {
    let mut out = Vec::new();
    let mut versions: BTreeMap<u64, Seen> = BTreeMap::new();
    for op in ops {
        if let Seen::Record { version, .. } = op.seen
            && let Some(other) = versions.insert(version, op.seen)
            && other != op.seen
        {
            out.push(format!("{name}: version {version} was seen as {other:?} and as {:?}", op.seen));
        }
    }
    let mut generation = 0;
    for (version, seen) in &versions {
        if let Seen::Record { generation: g, .. } = seen {
            if *g < generation {
                out.push(format!("{name}: generation went back to {g} at version {version}"));
            }
            generation = generation.max(*g);
        }
    }
    for b in ops {
        let Some(rank) = b.seen.rank() else { continue };
        if let Some(a) = ops.iter().find(|a| a.ret < b.call && a.seen.rank().is_some_and(|r| r > rank)) {
            out.push(format!(
                "{name}: {} saw {:?} after {} (which returned before it began) saw {:?}",
                b.kind, b.seen, a.kind, a.seen
            ));
        }
        if b.seen == Seen::NotFound && !ops.iter().any(|d| d.kind == "delete" && d.call < b.ret) {
            out.push(format!("{name}: {} found it gone, but no delete had been asked for", b.kind));
        }
    }
    // An acknowledged command's intent stands in every later version until another command.
    for seen_op in ops {
        let Seen::Record { version, intent, .. } = seen_op.seen else { continue };
        let latest = ops
            .iter()
            .filter(|c| c.is_command())
            .filter_map(|c| match c.seen {
                Seen::Record { version: v, intent, .. } if v <= version => Some((v, intent, c.kind)),
                _ => None,
            })
            .max_by_key(|(v, ..)| *v);
        let unacknowledged = ops.iter().any(|c| c.is_command() && c.seen.rank().is_none() && c.call < seen_op.ret);
        if let Some((v, commanded, kind)) = latest
            && commanded != intent
            && !unacknowledged
        {
            out.push(format!(
                "{name}: {kind} acknowledged at version {v} was lost: version {version} has intent {intent}"
            ));
        }
    }
    out
}

#[cfg(test)]
mod checks {
    use std::time::Duration;

    use super::*;

    /// A call on "s" from `from` to `to` milliseconds that saw `seen`.
    fn op(kind: &'static str, from: u64, to: u64, seen: Seen) -> Op {
        let zero = Instant::now();
        let at = |ms| zero + Duration::from_millis(ms);
        Op { sandbox: "s".into(), kind, call: at(from), ret: at(to), seen }
    }

    fn record(version: u64, generation: u64, intent: pb::Intent) -> Seen {
        Seen::Record { version, generation, phase: pb::Phase::Ready as i32, intent: intent as i32 }
    }

    fn violations(ops: Vec<Op>) -> Vec<String> {
        let history = History { ops: Mutex::new(ops) };
        history.violations()
    }

    const RUNNING: pb::Intent = pb::Intent::Running;
    const STOPPED: pb::Intent = pb::Intent::Stopped;

    #[test]
    fn a_history_a_register_could_give_passes() {
        let ops = vec![
            op("create", 0, 10, record(1, 1, RUNNING)),
            // Overlapping reads may see the versions in either order.
            op("get", 11, 50, record(3, 1, RUNNING)),
            op("get", 12, 40, record(2, 1, RUNNING)),
            op("stop", 60, 70, record(4, 1, STOPPED)),
            op("get", 71, 80, record(5, 1, STOPPED)),
            op("delete", 90, 95, record(6, 1, pb::Intent::Deleted)),
            op("get", 96, 99, Seen::NotFound),
            op("get", 100, 101, Seen::Nothing),
        ];
        assert_eq!(violations(ops), Vec::<String>::new());
    }

    #[test]
    fn an_older_version_after_a_newer_one_fails() {
        let ops = vec![op("get", 0, 10, record(3, 1, RUNNING)), op("get", 11, 20, record(2, 1, RUNNING))];
        assert_eq!(violations(ops).len(), 1);
    }

    #[test]
    fn one_version_with_two_records_fails() {
        let ops = vec![op("get", 0, 10, record(3, 1, RUNNING)), op("get", 0, 10, record(3, 2, RUNNING))];
        assert!(violations(ops).iter().any(|v| v.contains("version 3 was seen as")));
    }

    #[test]
    fn a_sandbox_gone_without_a_delete_or_back_after_one_fails() {
        let gone = vec![op("get", 0, 10, record(1, 1, RUNNING)), op("get", 11, 20, Seen::NotFound)];
        assert!(violations(gone).iter().any(|v| v.contains("no delete")));
        let back = vec![
            op("delete", 0, 10, record(2, 1, pb::Intent::Deleted)),
            op("get", 11, 20, Seen::NotFound),
            op("get", 21, 30, record(2, 1, pb::Intent::Deleted)),
        ];
        assert!(violations(back).iter().any(|v| v.contains("saw")));
    }

    #[test]
    fn a_lost_command_fails() {
        let ops = vec![op("stop", 0, 10, record(2, 1, STOPPED)), op("get", 11, 20, record(3, 1, RUNNING))];
        assert!(violations(ops).iter().any(|v| v.contains("was lost")));
        // Unless another command that did not answer could have written it.
        let ops = vec![
            op("stop", 0, 10, record(2, 1, STOPPED)),
            op("start", 5, 30, Seen::Nothing),
            op("get", 11, 20, record(3, 1, RUNNING)),
        ];
        assert_eq!(violations(ops), Vec::<String>::new());
    }

    #[test]
    fn a_generation_going_back_fails() {
        let ops = vec![op("get", 0, 10, record(2, 2, RUNNING)), op("get", 0, 10, record(3, 1, RUNNING))];
        assert!(violations(ops).iter().any(|v| v.contains("generation went back")));
    }
}
