//! The snapshot workload's calls (DESIGN 12.2, 12.3): snapshots, creates from them, forks,
//! their deletes, and runs writing the files a snapshot then holds.

use berth_proto::v1 as pb;

use super::Client;
use crate::invariants::{Invariant, i10_no_panic_or_internal};
use crate::trace::Kind;

impl Client {
    /// A call of the snapshot or volume workload: its failures are checked (I10), not recorded
    /// in the history, whose register model knows the fleet's sandboxes alone.
    pub(super) async fn unrecorded_call<T>(
        &mut self,
        what: String,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Option<T> {
        self.world.event(self.actor.clone(), Kind::Call, what.clone());
        let result = self.timed(call).await;
        let detail = match &result {
            Ok(_) => format!("{what} -> ok"),
            Err(Some(status)) => {
                if let Some(problem) = i10_no_panic_or_internal::internal(&what, status) {
                    self.world.violate(Invariant::I10, problem);
                }
                format!("{what} -> {:?}: {}", status.code(), status.message())
            }
            Err(None) => format!("{what} -> no answer"),
        };
        self.world.event(self.actor.clone(), Kind::Reply, detail);
        result.ok()
    }

    /// DESIGN 12.2 and 12.3's verbs, on snapshots and sandboxes of names of their own (the
    /// fleet's names stay the fleet's): a snapshot of a fleet sandbox, a sandbox made from one,
    /// a delete of one (some right after a create from it: the race S2 is about), a fork, and
    /// deletes of what they made, so that they stay few.
    pub(super) async fn snapshot_operation(&mut self, name: &str) {
        let snapshot = format!("snap-{}", self.draw.below(3));
        let copy = format!("copy-{}", self.draw.below(4));
        match self.draw.below(12) {
            0..=2 => {
                let no_wait = self.draw.chance(0.5);
                let request = pb::CreateSnapshotRequest { name: snapshot.clone(), sandbox: name.to_string(), no_wait };
                let mut c = self.snapshots();
                self.unrecorded_call(format!("snapshot {name} as {snapshot}"), c.create_snapshot(request)).await;
            }
            3..=5 => {
                let delete_after = self.draw.chance(0.3);
                self.create_from(&copy, &snapshot).await;
                if delete_after {
                    self.delete_snapshot(&snapshot).await;
                }
            }
            6 => self.delete_snapshot(&snapshot).await,
            7..=8 => {
                let count = self.draw.below(3) as usize + 1;
                let first = self.draw.below(4) as usize;
                let names = (first..first + count).map(|i| format!("fork-{i}")).collect();
                let request = pb::ForkSandboxRequest {
                    name: name.to_string(),
                    count: count as u32,
                    names,
                    labels: Default::default(),
                };
                let mut c = self.snapshots();
                self.unrecorded_call(format!("fork {name} x{count}"), c.fork_sandbox(request)).await;
            }
            _ => {
                let victim = if self.draw.chance(0.5) { copy } else { format!("fork-{}", self.draw.below(6)) };
                let request = pb::LifecycleRequest { name: victim.clone(), expected_resource_version: None };
                let mut c = self.sandboxes();
                self.unrecorded_call(format!("delete {victim}"), c.delete_sandbox(request)).await;
            }
        }
    }

    async fn create_from(&mut self, name: &str, snapshot: &str) {
        let request = pb::CreateSandboxRequest {
            name: name.to_string(),
            spec: Some(pb::SandboxSpec::default()),
            providers: vec![],
            expected_resource_version: None,
            deadline_unix_ms: None,
            from_snapshot: snapshot.to_string(),
        };
        let mut c = self.sandboxes();
        self.unrecorded_call(format!("create {name} from {snapshot}"), c.create_sandbox(request)).await;
    }

    async fn delete_snapshot(&mut self, snapshot: &str) {
        let request = pb::DeleteSnapshotRequest { name: snapshot.to_string(), expected_resource_version: None };
        let mut c = self.snapshots();
        self.unrecorded_call(format!("delete snapshot {snapshot}"), c.delete_snapshot(request)).await;
    }

    /// What a run writes in its workspace, as its command would: the files a snapshot of it
    /// then holds.
    pub(super) async fn write_files(&mut self, name: &str) {
        let Some(s) = self.get(name).await else { return };
        let workspace = crate::snapshots::workspace(&self.world, &berth_core::SandboxId::new(s.id));
        if !workspace.is_dir() {
            return;
        }
        let file = format!("data-{}", self.draw.below(3));
        let bytes = vec![b'a' + self.draw.below(26) as u8; self.draw.below(4_000) as usize];
        self.world.event(self.actor.clone(), Kind::Call, format!("{name} writes {} bytes to {file}", bytes.len()));
        // A workspace can be removed under the write (its sandbox deleted): as for a run, the
        // write is then lost with it.
        let _ = std::fs::write(workspace.join(file), bytes);
    }
}
