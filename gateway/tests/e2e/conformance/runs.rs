//! Looks at runs from outside the gateway: live runs and supervisors by a sandbox's identity,
//! and what a driver gets to start one.

use super::*;

/// How many live processes carry the sandbox's identity (the process driver's runs), or
/// whether its container runs (1 or 0).
pub(crate) fn live_runs(target: &Target, id: &str) -> usize {
    match target.runtime {
        Runtime::Process => supervisor_pids(id).len(),
        _ => {
            let running = target.cli(&[
                "inspect",
                "--format",
                "{{.State.Running}}",
                &container_name(&berth_core::SandboxId::new(id)),
            ]);
            usize::from(running == "true")
        }
    }
}

/// Waits (up to 5 s) until a run cut short right after its spawn shows to an outside look, as it
/// has long before a restarted gateway looks: under load a just-spawned supervisor was seen
/// missing from `/proc` by its identity (and its `began` file not yet written) for a moment.
pub(crate) async fn until_visible(target: &Target, id: &str) {
    for _ in 0..250 {
        if live_runs(target, id) > 0 {
            // Its first act, the `began` record, follows at once.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the run of {id} cut short after its start never showed");
}

/// The live supervisors carrying sandbox `id`'s identity, each leading its own group.
pub(crate) fn supervisor_pids(id: &str) -> Vec<i32> {
    run_processes(id).into_iter().filter(|&(pid, group)| pid == group).map(|(pid, _)| pid).collect()
}

/// Every live process of sandbox `id`'s runs, whatever its role.
pub(crate) fn run_members(id: &str) -> Vec<i32> {
    run_processes(id).into_iter().map(|(pid, _)| pid).collect()
}

/// The live processes whose environment names a run of sandbox `id` (an exec leads its own
/// group too, but carries no generation): each pid and its process group, in pid order.
fn run_processes(id: &str) -> Vec<(i32, i32)> {
    let tag = format!("BERTH_SANDBOX_ID={id}");
    let mut found: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            let tagged = vars.contains(&tag.as_bytes()) && vars.iter().any(|v| v.starts_with(b"BERTH_GENERATION="));
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let alive = !matches!(stat[stat.rfind(')')? + 2..].chars().next(), Some('Z' | 'X'));
            let group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).ok()?.as_raw();
            (tagged && alive).then_some((pid, group))
        })
        .collect();
    found.sort_unstable();
    found
}

/// What a driver gets to start `generation` of sandbox `id`, whose command sleeps.
pub(crate) fn sleeping(target: &Target, data: &DataDir, id: &str, generation: u64) -> Launch {
    Launch {
        sandbox: SandboxId::new(id),
        name: id.into(),
        generation,
        spec: SandboxSpec {
            image: image_for(target).into(),
            command: vec!["sleep".into(), "3600".into()],
            ..SandboxSpec::default()
        },
        credentials: Default::default(),
        token: data.runtime_token(id, generation),
        seed: None,
        fence: berth_drivers::Fence::open(),
    }
}
