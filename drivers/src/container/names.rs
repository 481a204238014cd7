//! What Berth names and labels in a runtime: a sandbox's container and volume, user volumes, and the labels
//! that tell whose they are.

use berth_core::{SandboxId, SnapshotId, VolumeId};

/// Labels on everything Berth makes in a runtime. The owner is the gateway instance (gateways
/// sharing one runtime each see only their own).
pub const LABEL_OWNER: &str = "dev.berth.owner";
pub const LABEL_SANDBOX: &str = "dev.berth.sandbox";
pub const LABEL_NAME: &str = "dev.berth.name";
/// The identity of the store holding the sandbox's record: an engine bound to a store sees only
/// that store's containers and volumes, so a gateway on another store never takes them for
/// leftovers of its own and reaps them.
pub const LABEL_STORE: &str = "dev.berth.store";

/// Whether a container or volume whose store label is `label` is one an engine bound to `store`
/// sees. One made before resources carried the label is its owner's, as it was then: hiding it
/// would report its sandbox's container missing.
pub fn of_store(label: Option<&str>, store: Option<&str>) -> bool {
    match (label, store) {
        (Some(label), Some(store)) => label == store,
        _ => true,
    }
}

pub fn container_name(sandbox: &SandboxId) -> String {
    format!("{CONTAINER_PREFIX}{sandbox}")
}

/// The sandbox whose container [`container_name`] called `name`.
pub fn sandbox_of_container(name: &str) -> Option<SandboxId> {
    name.strip_prefix(CONTAINER_PREFIX).filter(|id| !id.is_empty()).map(SandboxId::new)
}

const CONTAINER_PREFIX: &str = "berth-";

/// The repository of the images Berth commits of snapshots, each tagged with its snapshot's id.
pub const SNAPSHOT_REPOSITORY: &str = "berth-snapshot";
/// The repository of the names sandboxes made from snapshots give their snapshot's image, each
/// tagged with its sandbox's id.
pub const SEED_REPOSITORY: &str = "berth-seed";

/// The image committed of a snapshot's source (DESIGN 12.2).
pub fn snapshot_image(snapshot: &SnapshotId) -> String {
    format!("{SNAPSHOT_REPOSITORY}:{snapshot}")
}

/// A sandbox made from a snapshot runs its own name of the snapshot's image: the image stays
/// while the sandbox does, and goes with the last of its names.
pub fn seed_image(sandbox: &SandboxId) -> String {
    format!("{SEED_REPOSITORY}:{sandbox}")
}

pub fn volume_name(sandbox: &SandboxId) -> String {
    format!("berth-{sandbox}-workspace")
}

/// What every user volume's name starts with: never a workspace's, which starts `berth-`.
const USER_VOLUME_PREFIX: &str = "berth.volume.";

/// The runtime's volume of user volume `volume` (DESIGN 13.2).
pub fn user_volume_name(volume: &VolumeId) -> String {
    format!("{USER_VOLUME_PREFIX}{volume}")
}

/// The user volume whose runtime volume [`user_volume_name`] called `name`.
pub fn user_volume_of(name: &str) -> Option<VolumeId> {
    name.strip_prefix(USER_VOLUME_PREFIX).filter(|id| !id.is_empty()).map(VolumeId::new)
}
