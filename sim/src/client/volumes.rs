//! The volume workload's calls (DESIGN 13.2): volumes made and deleted, sandboxes of names of
//! their own that mount them, and a sandbox's delete followed at once by its volume's (the race
//! S2 is about).

use berth_proto::v1 as pb;

use super::Client;

impl Client {
    pub(super) async fn volume_operation(&mut self) {
        let volume = format!("vol-{}", self.draw.below(3));
        let user = format!("user-{}", self.draw.below(4));
        match self.draw.below(8) {
            0..=1 => {
                let mut c = self.volumes();
                let request = pb::CreateVolumeRequest { name: volume.clone() };
                self.unrecorded_call(format!("create volume {volume}"), c.create_volume(request)).await;
            }
            2..=4 => {
                let mut volumes =
                    vec![pb::VolumeMount { volume: volume.clone(), path: "/data".into(), read_only: false }];
                if self.draw.chance(0.3) {
                    let other = format!("vol-{}", self.draw.below(3));
                    volumes.push(pb::VolumeMount { volume: other, path: "/other".into(), read_only: true });
                }
                let spec = pb::SandboxSpec {
                    image: "sim".into(),
                    command: vec!["work".into()],
                    volumes,
                    ..Default::default()
                };
                let request = pb::CreateSandboxRequest { name: user.clone(), spec: Some(spec), ..Default::default() };
                let mut c = self.sandboxes();
                self.unrecorded_call(format!("create {user} mounting {volume}"), c.create_sandbox(request)).await;
            }
            5..=6 => {
                let request = pb::LifecycleRequest { name: user.clone(), expected_resource_version: None };
                let mut c = self.sandboxes();
                self.unrecorded_call(format!("delete {user}"), c.delete_sandbox(request)).await;
                if self.draw.chance(0.6) {
                    self.delete_volume(&volume).await;
                }
            }
            _ => self.delete_volume(&volume).await,
        }
    }

    async fn delete_volume(&mut self, volume: &str) {
        let request = pb::DeleteVolumeRequest { name: volume.to_string(), expected_resource_version: None };
        let mut c = self.volumes();
        self.unrecorded_call(format!("delete volume {volume}"), c.delete_volume(request)).await;
    }
}
