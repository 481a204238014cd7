//! `berth volume`: volumes with a lifecycle of their own (DESIGN 13.2), mounted by
//! `berth sandbox create NAME --volume VOLUME:/path[:ro]`.

use berth_proto::v1 as pb;
use clap::Subcommand;
use serde_json::json;

use super::Output;
use super::client::{Client, Failed};
use super::print::table;
use super::spec::{Versioned, Wait};

#[derive(Subcommand)]
pub(super) enum VolumeCmd {
    /// Make volume NAME (a DNS label of at most 50 characters). Its files are made by the first
    /// start of a sandbox that mounts it.
    Create { name: String },
    /// Show one volume and the sandboxes that mount it.
    Get { name: String },
    /// List volumes (every page).
    List,
    /// Delete a volume and its files, and wait until they are gone. Refused while a sandbox
    /// that is not being deleted mounts it; a sandbox being deleted never blocks it.
    Delete {
        name: String,
        #[command(flatten)]
        version: Versioned,
        #[command(flatten)]
        wait: Wait,
    },
}

fn phase_name(phase: i32) -> &'static str {
    match pb::VolumePhase::try_from(phase) {
        Ok(pb::VolumePhase::Ready) => "Ready",
        Ok(pb::VolumePhase::Deleting) => "Deleting",
        Ok(pb::VolumePhase::Unspecified) | Err(_) => "Unknown",
    }
}

fn volume_json(v: &pb::Volume) -> serde_json::Value {
    json!({
        "name": v.name, "id": v.id, "phase": phase_name(v.phase), "users": v.users,
        "resource_version": v.resource_version,
        "created_at_unix_ms": v.created_at_unix_ms, "updated_at_unix_ms": v.updated_at_unix_ms,
    })
}

impl Client {
    fn print_volumes(&self, volumes: &[pb::Volume]) {
        match self.output {
            Output::Json if volumes.len() == 1 => say!("{:#}", volume_json(&volumes[0])),
            Output::Json => say!("{:#}", json!(volumes.iter().map(volume_json).collect::<Vec<_>>())),
            Output::Table => {
                let rows = volumes
                    .iter()
                    .map(|v| vec![v.name.clone(), phase_name(v.phase).to_string(), v.id.clone(), v.users.join(",")])
                    .collect();
                say!("{}", table(&["NAME", "PHASE", "ID", "USERS"], rows));
            }
        }
    }

    pub(super) async fn volume(&mut self, command: VolumeCmd) -> Result<(), Failed> {
        match command {
            VolumeCmd::Create { name } => {
                let reply = self.volumes.create_volume(pb::CreateVolumeRequest { name }).await?.into_inner();
                self.print_volumes(&[reply.volume.unwrap_or_default()]);
            }
            VolumeCmd::Get { name } => {
                let reply = self.volumes.get_volume(pb::GetVolumeRequest { name }).await?.into_inner();
                self.print_volumes(&[reply.volume.unwrap_or_default()]);
            }
            VolumeCmd::List => {
                let mut all = Vec::new();
                let mut page_token = String::new();
                loop {
                    let request = pb::ListVolumesRequest { page_size: 500, page_token };
                    let reply = self.volumes.list_volumes(request).await?.into_inner();
                    all.extend(reply.volumes);
                    if reply.next_page_token.is_empty() {
                        break;
                    }
                    page_token = reply.next_page_token;
                }
                self.print_volumes(&all);
            }
            VolumeCmd::Delete { name, version, wait } => {
                let request =
                    pb::DeleteVolumeRequest { name: name.clone(), expected_resource_version: version.expected_version };
                let reply = self.volumes.delete_volume(request).await?.into_inner();
                if wait.no_wait {
                    self.print_volumes(&[reply.volume.unwrap_or_default()]);
                } else {
                    let client = &self.volumes;
                    let read = || {
                        let (mut c, request) = (client.clone(), pb::GetVolumeRequest { name: name.clone() });
                        async move { c.get_volume(request).await }
                    };
                    wait.until_gone("volume", &name, read).await?;
                    self.print_deleted("volume", &name);
                }
            }
        }
        Ok(())
    }
}
