//! N1 (DESIGN 16, many hosts): at most one run of a sandbox across all nodes, through
//! partitions and node losses; a node starts a run only of a sandbox the store places on it.
//! Checked by the kernel as each run is spawned (several nodes share the simulated kernel, as
//! nodes with data directories of their own share a machine): against the live runs of the
//! sandbox on the other nodes, and against the store's placement as committed then. D1 judges
//! the runs of one node's driver.

use crate::runtime::Run;

/// The problems with node `node` spawning `name`'s run of `generation`, given the runs of the
/// sandbox the other nodes' drivers started (`(node, pid, run)`) and the node the store's last
/// commit placed the sandbox on (`None`: placed nowhere, or no record).
pub fn spawned<'a>(
    name: &str,
    node: &str,
    generation: Option<u64>,
    elsewhere: impl IntoIterator<Item = (String, i32, &'a Run)>,
    placed: Option<&str>,
) -> Vec<String> {
    let generation = generation.unwrap_or(0);
    let mut problems: Vec<String> = elsewhere
        .into_iter()
        .filter(|(_, _, run)| run.live())
        .map(|(other, pid, run)| {
            format!(
                "{node} spawned {name} generation {generation} while {other} still runs its generation {} (pid {pid})",
                run.generation
            )
        })
        .collect();
    if let Some(placed) = placed.filter(|placed| *placed != node) {
        problems.push(format!("{node} spawned {name} generation {generation}, which the store places on {placed}"));
    }
    problems
}

#[cfg(test)]
mod tests {
    use berth_core::Timestamp;
    use tokio::sync::watch;

    use super::*;
    use crate::runtime::RunSignal;

    fn run(generation: u64, live: bool) -> Run {
        let mut run =
            Run::new(generation, Timestamp::from_unix_nanos(1), String::new(), watch::channel(RunSignal::Running).0);
        if !live {
            run.finished = Some((Timestamp::from_unix_nanos(2), 0, crate::runtime::EndCause::Stopped));
        }
        run
    }

    #[test]
    fn a_run_spawned_on_the_node_placed_with_none_elsewhere_is_fine() {
        let ended = run(3, false);
        let found = spawned("s1", "node-1", Some(4), [("node-0".to_string(), 7, &ended)], Some("node-1"));
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_run_beside_another_nodes_live_one_or_off_its_placement_fires() {
        let live = run(3, true);
        let found = spawned("s1", "node-1", Some(4), [("node-0".to_string(), 7, &live)], Some("node-0"));
        assert_eq!(
            found,
            [
                "node-1 spawned s1 generation 4 while node-0 still runs its generation 3 (pid 7)",
                "node-1 spawned s1 generation 4, which the store places on node-0",
            ]
        );
    }
}
