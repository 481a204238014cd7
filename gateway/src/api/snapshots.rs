//! Snapshots and forks (DESIGN 12.2, 12.3): the `Snapshots` service.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_core::snapshot::SNAPSHOT_LABEL;
use berth_core::{Command, Outcome, Request as CoreRequest, SandboxId, Snapshot, SnapshotId, SnapshotPhase, validate};
use berth_proto::v1 as pb;
use berth_proto::v1::snapshots_server::Snapshots;
use tonic::{Request, Response, Status};

use super::convert;
use super::public::{core_invalid, invalid, page};
use crate::engine::Engine;
use crate::error::ApiError;

/// The longest a create or a fork waits for its copy.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// How often a waiting create or fork looks at its snapshot again.
const LOOK_AGAIN: Duration = Duration::from_millis(25);

pub struct SnapshotApi {
    engine: Engine,
}

impl SnapshotApi {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// The snapshot as the API shows it, with the sandboxes made from it.
    async fn shown(&self, snapshot: Snapshot) -> Result<pb::Snapshot, Status> {
        let selector = BTreeMap::from([(SNAPSHOT_LABEL.to_string(), snapshot.name.clone())]);
        let users = self.engine.store().all_sandboxes(&selector).await.map_err(ApiError::from)?;
        Ok(convert::snapshot(snapshot, users.iter().map(|s| s.name.to_string()).collect()))
    }

    async fn reply(&self, snapshot: Snapshot) -> Result<Response<pb::SnapshotReply>, Status> {
        Ok(Response::new(pb::SnapshotReply { snapshot: Some(self.shown(snapshot).await?) }))
    }

    fn new_id(&self) -> SnapshotId {
        SnapshotId::new(format!("sn-{:016x}{:016x}", self.engine.random(), self.engine.random()))
    }

    /// Waits until snapshot `name` (of id `id`) is no longer being taken: what it is then, or
    /// `None` once it is being deleted or gone (deleted meanwhile).
    async fn settled(&self, name: &str, id: &SnapshotId) -> Result<Option<Snapshot>, Status> {
        let until = tokio::time::Instant::now() + MAX_WAIT;
        loop {
            let record = self.engine.store().snapshot(name).await.map_err(ApiError::from)?;
            match record {
                Some(s) if s.id == *id && s.phase == SnapshotPhase::Creating => {}
                Some(s) if s.id == *id && s.phase != SnapshotPhase::Deleting => return Ok(Some(s)),
                _ => return Ok(None),
            }
            if tokio::time::Instant::now() >= until {
                return Err(Status::deadline_exceeded(format!(
                    "snapshot '{name}' is still being taken after {}s; it goes on (read it with GetSnapshot)",
                    MAX_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }

    /// `count` names `<source>-k` for the lowest k whose name is free.
    async fn default_names(&self, source: &str, count: u32) -> Result<Vec<String>, Status> {
        let mut names = Vec::new();
        let mut k = 1u64;
        while names.len() < count as usize {
            let name = format!("{source}-{k}");
            if self.engine.store().sandbox_by_name(&name).await.map_err(ApiError::from)?.is_none() {
                names.push(name);
            }
            k += 1;
        }
        Ok(names)
    }
}

/// Why a copy failed, as the client hears it.
fn failed(snapshot: &Snapshot) -> Option<Status> {
    match &snapshot.phase {
        SnapshotPhase::Error(reason) => {
            Some(Status::failed_precondition(format!("snapshot '{}' could not be taken: {reason}", snapshot.name)))
        }
        _ => None,
    }
}

#[tonic::async_trait]
impl Snapshots for SnapshotApi {
    async fn create_snapshot(
        &self,
        request: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::SnapshotReply>, Status> {
        let r = request.into_inner();
        let id = self.new_id();
        let command = Command::CreateSnapshot { id: id.clone(), name: r.name.clone(), sandbox: r.sandbox };
        let Outcome::Snapshot(asked) = self.engine.execute(&CoreRequest::new(command, None)).await? else {
            return Err(Status::internal("a snapshot's create answered no snapshot"));
        };
        if r.no_wait {
            return self.reply(*asked).await;
        }
        match self.settled(&r.name, &id).await? {
            Some(s) => match failed(&s) {
                Some(status) => Err(status),
                None => self.reply(s).await,
            },
            None => {
                Err(Status::failed_precondition(format!("snapshot '{}' was deleted before its copy was made", r.name)))
            }
        }
    }

    async fn get_snapshot(
        &self,
        request: Request<pb::GetSnapshotRequest>,
    ) -> Result<Response<pb::SnapshotReply>, Status> {
        let name = request.into_inner().name;
        validate::dns_label("name", &name).map_err(core_invalid)?;
        match self.engine.store().snapshot(&name).await.map_err(ApiError::from)? {
            Some(s) => self.reply(s).await,
            None => Err(Status::not_found(format!("snapshot '{name}' not found"))),
        }
    }

    async fn list_snapshots(
        &self,
        request: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsReply>, Status> {
        let r = request.into_inner();
        let batch =
            self.engine.store().list_snapshots(&page(r.page_size, r.page_token)?).await.map_err(ApiError::from)?;
        let mut snapshots = Vec::with_capacity(batch.items.len());
        for s in batch.items {
            snapshots.push(self.shown(s).await?);
        }
        Ok(Response::new(pb::ListSnapshotsReply { snapshots, next_page_token: batch.next.unwrap_or_default() }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::SnapshotReply>, Status> {
        let r = request.into_inner();
        let command = Command::DeleteSnapshot { name: r.name };
        match self.engine.execute(&CoreRequest::new(command, r.expected_resource_version)).await? {
            Outcome::Snapshot(s) => self.reply(*s).await,
            other => Err(Status::internal(format!("a snapshot's delete answered {other:?}"))),
        }
    }

    async fn fork_sandbox(
        &self,
        request: Request<pb::ForkSandboxRequest>,
    ) -> Result<Response<pb::ForkSandboxReply>, Status> {
        let r = request.into_inner();
        validate::dns_label("name", &r.name).map_err(core_invalid)?;
        let names = match (r.names.is_empty(), r.count) {
            (true, count) if count > 0 && count as usize <= berth_core::snapshot::MAX_FORKS => {
                self.default_names(&r.name, count).await?
            }
            (true, _) => r.names,
            (false, count) if count as usize == r.names.len() || count == 0 => r.names,
            (false, count) => {
                return Err(invalid("names", &format!("{} names given for a count of {count}", r.names.len())));
            }
        };
        let forks: Vec<(SandboxId, String)> = names.into_iter().map(|n| (self.engine.new_sandbox_id(), n)).collect();
        let id = self.new_id();
        let snapshot_name = format!("fork-{}", &id.as_str()[3..19]);
        let command = Command::ForkSandbox {
            name: r.name.clone(),
            snapshot: id.clone(),
            snapshot_name: snapshot_name.clone(),
            forks: forks.clone(),
            labels: r.labels,
        };
        self.engine.execute(&CoreRequest::new(command, None)).await?;
        let snapshot = self.settled(&snapshot_name, &id).await?.ok_or_else(|| {
            Status::failed_precondition(format!(
                "the fork of '{}' was cut short: its snapshot was deleted before its copy",
                r.name
            ))
        })?;
        if let Some(status) = failed(&snapshot) {
            return Err(status);
        }
        let mut sandboxes = Vec::with_capacity(forks.len());
        for (id, name) in &forks {
            // A fork deleted since it was made is left out.
            if let Some(s) = self.engine.store().sandbox(id).await.map_err(ApiError::from)? {
                sandboxes.push(convert::sandbox(s));
            } else {
                tracing::debug!(fork = %name, "a fork was deleted before the fork answered");
            }
        }
        Ok(Response::new(pb::ForkSandboxReply { sandboxes, snapshot: snapshot_name }))
    }
}
