//! `berth snapshot`: snapshots of sandboxes' files (DESIGN 12.2). A sandbox is made from one by
//! `berth sandbox create NEW --from-snapshot SNAP`, and forked by `berth sandbox fork`.

use berth_proto::v1 as pb;
use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Client, Failed};
use super::print::{spec_json, table};
use super::spec::{Versioned, Wait};

#[derive(Subcommand)]
pub(super) enum SnapshotCmd {
    /// Copy a Ready (frozen only for the copy), Paused or Stopped sandbox's files as snapshot
    /// NAME, and wait until the copy is made.
    Create {
        name: String,
        /// The sandbox to copy.
        #[arg(long)]
        from: String,
        /// Return once the gateway accepted it, in phase Creating.
        #[arg(long)]
        no_wait: bool,
    },
    /// Show one snapshot: its size, checksum and the sandboxes made from it.
    Get { name: String },
    /// List snapshots (every page).
    List,
    /// Delete a snapshot and everything kept of it, and wait until it is gone. Refused while a
    /// sandbox made from it has not had its files copied in yet.
    Delete {
        name: String,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
}

fn phase_name(phase: i32) -> &'static str {
    match pb::SnapshotPhase::try_from(phase) {
        Ok(pb::SnapshotPhase::Creating) => "Creating",
        Ok(pb::SnapshotPhase::Ready) => "Ready",
        Ok(pb::SnapshotPhase::Error) => "Error",
        Ok(pb::SnapshotPhase::Deleting) => "Deleting",
        Ok(pb::SnapshotPhase::Unspecified) | Err(_) => "Unknown",
    }
}

fn snapshot_json(s: &pb::Snapshot) -> serde_json::Value {
    json!({
        "name": s.name, "id": s.id, "phase": phase_name(s.phase), "error": s.error,
        "source": s.source, "source_id": s.source_id, "source_generation": s.source_generation,
        "size_bytes": s.size_bytes, "sha256": s.sha256, "image": s.image, "users": s.users,
        "fork_of": s.fork_of, "resource_version": s.resource_version,
        "spec": s.spec.as_ref().map(spec_json),
        "created_at_unix_ms": s.created_at_unix_ms, "updated_at_unix_ms": s.updated_at_unix_ms,
    })
}

impl Client {
    fn print_snapshots(&self, snapshots: &[pb::Snapshot]) {
        match self.output {
            Output::Json if snapshots.len() == 1 => say!("{:#}", snapshot_json(&snapshots[0])),
            Output::Json => say!("{:#}", json!(snapshots.iter().map(snapshot_json).collect::<Vec<_>>())),
            Output::Table => {
                let rows = snapshots
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            phase_name(s.phase).to_string(),
                            format!("{} (generation {})", s.source, s.source_generation),
                            s.size_bytes.to_string(),
                            s.sha256.get(..12).unwrap_or_default().to_string(),
                            s.users.join(","),
                            s.error.clone(),
                        ]
                    })
                    .collect();
                say!("{}", table(&["NAME", "PHASE", "SOURCE", "BYTES", "SHA256", "USERS", "ERROR"], rows));
            }
        }
    }

    pub(super) async fn snapshot(&mut self, command: SnapshotCmd) -> Result<(), Failed> {
        match command {
            SnapshotCmd::Create { name, from, no_wait } => {
                let request = pb::CreateSnapshotRequest { name, sandbox: from, no_wait };
                let reply = self.snapshots.create_snapshot(request).await?.into_inner();
                self.print_snapshots(&[reply.snapshot.unwrap_or_default()]);
            }
            SnapshotCmd::Get { name } => {
                let reply = self.snapshots.get_snapshot(pb::GetSnapshotRequest { name }).await?.into_inner();
                self.print_snapshots(&[reply.snapshot.unwrap_or_default()]);
            }
            SnapshotCmd::List => {
                let mut all = Vec::new();
                let mut page_token = String::new();
                loop {
                    let request = pb::ListSnapshotsRequest { page_size: 500, page_token };
                    let reply = self.snapshots.list_snapshots(request).await?.into_inner();
                    all.extend(reply.snapshots);
                    if reply.next_page_token.is_empty() {
                        break;
                    }
                    page_token = reply.next_page_token;
                }
                self.print_snapshots(&all);
            }
            SnapshotCmd::Delete { name, version, wait } => {
                let request = pb::DeleteSnapshotRequest {
                    name: name.clone(),
                    expected_resource_version: version.expected_version,
                };
                let reply = self.snapshots.delete_snapshot(request).await?.into_inner();
                if wait.no_wait {
                    self.print_snapshots(&[reply.snapshot.unwrap_or_default()]);
                } else {
                    let client = &self.snapshots;
                    let read = || {
                        let (mut c, request) = (client.clone(), pb::GetSnapshotRequest { name: name.clone() });
                        async move { c.get_snapshot(request).await }
                    };
                    wait.until_gone("snapshot", &name, read).await?;
                    self.print_deleted("snapshot", &name);
                }
            }
        }
        Ok(())
    }
}
