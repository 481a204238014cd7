//! Nodes and their leases (DESIGN 14): one process holds a node at a time, renewals keep its
//! epoch, every grant after a release or a lapse is a new one, and what the node offers and
//! whether it drains read back as written.

use std::time::Duration;

use berth_core::NodeId;
use berth_core::placement::Capacity;
use berth_gateway::store::{NodeOffer, NodeRemoval};

use super::*;

fn offer(address: &str, sandboxes: u64) -> NodeOffer {
    NodeOffer {
        address: address.to_string(),
        labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        capacity: Capacity { cpu_millis: 2_000, memory_bytes: 4 << 30, sandboxes },
        stops_when_lapsed: true,
        // Kept as written, as every field of the offer is.
        e2b_address: Some(format!("{address}/e2b")),
    }
}

pub(crate) async fn a_node_lease_keeps_its_epoch_while_renewed_and_gets_a_new_one_after_a_lapse(store: Shared) {
    let n1 = NodeId::new("n1");
    let long = Duration::from_secs(60);
    assert_eq!(store.node(&n1).await.unwrap(), None);
    assert_eq!(store.acquire_node_lease(&n1, "p1", &offer("10.0.0.1:7422", 8), long).await.unwrap(), held("p1", 1));
    let node = store.node(&n1).await.unwrap().unwrap();
    assert_eq!((node.lease.clone(), node.live, node.draining), (held("p1", 1), true, false));
    assert_eq!(node.offer, offer("10.0.0.1:7422", 8));
    // Another process claiming the node changes nothing, its offer included.
    assert_eq!(store.acquire_node_lease(&n1, "p2", &offer("10.0.0.2:7422", 1), long).await.unwrap(), held("p1", 1));
    // The holder's renewal keeps the epoch and takes its new offer.
    assert_eq!(store.acquire_node_lease(&n1, "p1", &offer("10.0.0.1:7422", 16), long).await.unwrap(), held("p1", 1));
    assert_eq!(store.node(&n1).await.unwrap().unwrap().offer, offer("10.0.0.1:7422", 16));
    // Only the holder releases it; released, it is not live, and the next grant is a new epoch.
    store.release_node_lease(&n1, "p2").await.unwrap();
    assert!(store.node(&n1).await.unwrap().unwrap().live);
    store.release_node_lease(&n1, "p1").await.unwrap();
    let released = store.node(&n1).await.unwrap().unwrap();
    assert_eq!((released.lease.holder, released.live), (None, false));
    let short = Duration::from_millis(200);
    assert_eq!(store.acquire_node_lease(&n1, "p1", &offer("10.0.0.1:7422", 16), short).await.unwrap(), held("p1", 2));
    // Lapsed: fenced, and granted again in a new epoch even to the process that held it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lapsed = store.node(&n1).await.unwrap().unwrap();
    assert_eq!((lapsed.lease.clone(), lapsed.live), (held("p1", 2), false));
    assert_eq!(store.acquire_node_lease(&n1, "p1", &offer("10.0.0.1:7422", 16), long).await.unwrap(), held("p1", 3));
    // Lapsed again, another process takes it over, in the next epoch.
    assert_eq!(store.acquire_node_lease(&n1, "p1", &offer("10.0.0.1:7422", 16), short).await.unwrap(), held("p1", 3));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(store.acquire_node_lease(&n1, "p2", &offer("10.0.0.2:7422", 4), long).await.unwrap(), held("p2", 4));
    assert_eq!(store.node(&n1).await.unwrap().unwrap().offer, offer("10.0.0.2:7422", 4));
}

pub(crate) async fn nodes_are_listed_in_id_order_and_drain_across_renewals(store: Shared) {
    let long = Duration::from_secs(60);
    for id in ["n3", "n1", "n2"] {
        store.acquire_node_lease(&NodeId::new(id), id, &offer(id, 4), long).await.unwrap();
    }
    let ids: Vec<String> = store.nodes().await.unwrap().into_iter().map(|n| n.id.to_string()).collect();
    assert_eq!(ids, ["n1", "n2", "n3"]);
    assert!(store.drain_node(&NodeId::new("n2"), true).await.unwrap());
    assert!(!store.drain_node(&NodeId::new("n9"), true).await.unwrap(), "no such node");
    assert_eq!(store.node(&NodeId::new("n9")).await.unwrap(), None);
    store.acquire_node_lease(&NodeId::new("n2"), "n2", &offer("n2", 4), long).await.unwrap();
    let draining: Vec<bool> = store.nodes().await.unwrap().into_iter().map(|n| n.draining).collect();
    assert_eq!(draining, [false, true, false], "a renewal keeps the drain");
    assert!(store.drain_node(&NodeId::new("n2"), false).await.unwrap());
    assert!(!store.node(&NodeId::new("n2")).await.unwrap().unwrap().draining);
}

pub(crate) async fn processes_racing_for_a_node_agree_on_one_holder(store: Shared) {
    const PROCESSES: usize = 8;
    let n1 = NodeId::new("n1");
    let tasks: Vec<_> = (0..PROCESSES)
        .map(|p| {
            let (store, n1) = (Arc::clone(&store), n1.clone());
            tokio::spawn(async move {
                let me = format!("p{p}");
                let lease = store.acquire_node_lease(&n1, &me, &offer(&me, 4), Duration::from_secs(60)).await;
                (me, lease.unwrap())
            })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.unwrap());
    }
    let holders: Vec<_> = seen.iter().filter(|(me, lease)| lease.held_by(me)).collect();
    assert_eq!(holders.len(), 1, "{seen:?}");
    let (winner, lease) = holders[0].clone();
    assert_eq!(lease.term, 1, "one grant, one epoch: {seen:?}");
    assert!(seen.iter().all(|(_, l)| *l == lease), "every process sees the one holder: {seen:?}");
    assert_eq!(store.node(&n1).await.unwrap().unwrap().offer, offer(&winner, 4), "the offer is the holder's");
}

pub(crate) async fn a_node_is_deleted_only_while_its_lease_is_not_held(store: Shared) {
    let (n1, n2) = (NodeId::new("n1"), NodeId::new("n2"));
    let short = Duration::from_millis(200);
    store.acquire_node_lease(&n1, "p1", &offer("n1", 4), short).await.unwrap();
    assert_eq!(store.delete_node(&n1).await.unwrap(), NodeRemoval::Live(held("p1", 1)));
    assert!(store.node(&n1).await.unwrap().is_some());
    // Released, or lapsed: removed at once, and gone from the listing.
    assert!(store.drain_node(&n1, true).await.unwrap());
    store.release_node_lease(&n1, "p1").await.unwrap();
    assert_eq!(store.delete_node(&n1).await.unwrap(), NodeRemoval::Removed);
    assert_eq!(store.node(&n1).await.unwrap(), None);
    assert_eq!(store.delete_node(&n1).await.unwrap(), NodeRemoval::NotFound);
    assert!(!store.drain_node(&n1, true).await.unwrap(), "a deleted node is not there to drain");
    store.acquire_node_lease(&n2, "p2", &offer("n2", 4), short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(store.delete_node(&n2).await.unwrap(), NodeRemoval::Removed);
    assert!(store.nodes().await.unwrap().is_empty());
    // Registered again, a deleted node goes on from its last epoch, undrained: an effect sent
    // under an epoch from before the delete never matches one granted after it.
    let back = store.acquire_node_lease(&n1, "p3", &offer("n1", 8), short).await.unwrap();
    assert_eq!(back, held("p3", 2));
    let node = store.node(&n1).await.unwrap().unwrap();
    assert_eq!((node.lease, node.draining, node.offer), (held("p3", 2), false, offer("n1", 8)));
    assert_eq!(store.nodes().await.unwrap().len(), 1);
}

pub(crate) async fn what_a_node_holds_follows_every_sandbox_write_and_keeps_it_from_deletion(store: Shared) {
    let placed = |id: &str, node: &str, cpu: Option<u64>| {
        let mut s = sandbox(id, id);
        let spec = SandboxSpec {
            limits: berth_core::limits::ResourceLimits { cpu_millis: cpu, memory_bytes: Some(1 << 20), pids: None },
            ..(*s.spec).clone()
        };
        s.spec = spec.into();
        s.placement = Some(berth_core::Placement { node: NodeId::new(node), epoch: 2 });
        s
    };
    let (a, b, c) = (placed("sb-a", "n1", Some(500)), placed("sb-b", "n1", None), placed("sb-c", "n2", Some(250)));
    let unplaced = sandbox("sb-d", "sb-d");
    let writes = [&a, &b, &c, &unplaced].map(|s| Write::CreateSandbox(s.clone()));
    store.commit(&writes).await.unwrap();
    let load = |cpu_millis, sandboxes| Capacity { cpu_millis, memory_bytes: sandboxes << 20, sandboxes };
    let loads = |pairs: &[(&str, Capacity)]| -> BTreeMap<NodeId, Capacity> {
        pairs.iter().map(|(n, c)| (NodeId::new(*n), *c)).collect()
    };
    assert_eq!(store.node_loads().await.unwrap(), loads(&[("n1", load(500, 2)), ("n2", load(250, 1))]));
    // Stopped, it holds nothing; started again elsewhere, it holds there.
    let (write, stopped) = update(&a);
    let write = match write {
        Write::UpdateSandbox { mut record, expected } => {
            record.intent = berth_core::Intent::Stopped;
            Write::UpdateSandbox { record, expected }
        }
        other => other,
    };
    store.commit(&[write]).await.unwrap();
    assert_eq!(store.node_loads().await.unwrap(), loads(&[("n1", load(0, 1)), ("n2", load(250, 1))]));
    let mut moved = bumped(&stopped);
    moved.placement = Some(berth_core::Placement { node: NodeId::new("n2"), epoch: 5 });
    store.commit(&[Write::UpdateSandbox { record: moved.clone(), expected: stopped.resource_version }]).await.unwrap();
    assert_eq!(store.node_loads().await.unwrap(), loads(&[("n1", load(0, 1)), ("n2", load(750, 2))]));
    // Removed, its share goes with it.
    store.commit(&[Write::RemoveSandbox { id: c.id.clone(), expected: c.resource_version }]).await.unwrap();
    store.commit(&[Write::RemoveSandbox { id: b.id.clone(), expected: b.resource_version }]).await.unwrap();
    assert_eq!(store.node_loads().await.unwrap(), loads(&[("n2", load(500, 1))]));
    // A node holding a sandbox that is not stopped stays, its lease given up or not, until the
    // sandbox goes; a stopped one (b, removed, was) does not hold it.
    let n2 = NodeId::new("n2");
    store.acquire_node_lease(&n2, "p2", &offer("n2", 4), Duration::from_secs(60)).await.unwrap();
    store.release_node_lease(&n2, "p2").await.unwrap();
    assert_eq!(store.delete_node(&n2).await.unwrap(), NodeRemoval::Holding(1));
    store.commit(&[Write::RemoveSandbox { id: moved.id.clone(), expected: moved.resource_version }]).await.unwrap();
    assert_eq!(store.delete_node(&n2).await.unwrap(), NodeRemoval::Removed);
}
