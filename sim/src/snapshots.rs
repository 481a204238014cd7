//! What the simulated host keeps of snapshots (DESIGN 12.2), as ground truth for S1 and S2:
//! the drivers' copies under the shared state directory, the workspaces they seeded, and the
//! images the simulated runtime names.

use std::collections::BTreeMap;
use std::path::PathBuf;

use berth_core::{Sandbox, SandboxId, SnapshotId};
use berth_drivers::container::volume_name;
use berth_drivers::snapshot::{self, Copying, Snapshots};

use crate::runtime::RuntimeModel;
use crate::scenario::DriverKind;
use crate::world::World;

/// Where sandbox `id`'s workspace is on the host: the process driver's folder, or the
/// simulated runtime's volume.
pub fn workspace(world: &World, id: &SandboxId) -> PathBuf {
    match world.scenario.driver {
        DriverKind::Process => world.state_dir.join(id.as_str()).join("workspace"),
        DriverKind::Container => world.state_dir.join(".volumes").join(volume_name(id)),
    }
}

/// Each snapshot the drivers keep anything of, with the sum of its whole copy, if it has one.
pub fn copies(world: &World) -> BTreeMap<SnapshotId, Option<String>> {
    let kept = Snapshots::under(&world.state_dir, Copying::Inline);
    let ids = kept.list().unwrap_or_default();
    ids.into_iter().map(|id| (id.clone(), kept.existing(&id).ok().flatten().map(|k| k.sha256))).collect()
}

/// The sum of the workspace of each sandbox of `records` its driver seeded from a snapshot.
pub fn seeded(world: &World, records: &[Sandbox]) -> BTreeMap<SandboxId, String> {
    records
        .iter()
        .filter(|s| s.seed.is_some() && Snapshots::seeded(&world.state_dir.join(s.id.as_str())))
        .filter_map(|s| Some((s.id.clone(), snapshot::sum(&workspace(world, &s.id)).ok()?.sha256)))
        .collect()
}

/// Every image the runtime names.
pub fn images(runtime: &RuntimeModel) -> Vec<String> {
    runtime.images.keys().cloned().collect()
}
