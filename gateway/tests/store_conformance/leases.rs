//! The gateways' lease (one holder at a time) and the store's identity.

use super::*;

pub(crate) fn held(holder: &str, term: u64) -> Lease {
    Lease { holder: Some(holder.to_string()), term }
}

pub(crate) async fn the_lease_has_one_holder_at_a_time(store: Shared) {
    let long = std::time::Duration::from_secs(60);
    let first = store.acquire_lease("a", long).await.unwrap();
    assert!(first.held_by("a"), "{first:?}");
    let term = first.term;
    // Held and not lapsed: another gateway cannot take it; its holder renews it in the same term.
    assert_eq!(store.acquire_lease("b", long).await.unwrap(), held("a", term));
    assert_eq!(store.acquire_lease("a", long).await.unwrap(), held("a", term));
    // Only the holder releases it.
    store.release_lease("b").await.unwrap();
    assert_eq!(store.acquire_lease("b", long).await.unwrap(), held("a", term));
    store.release_lease("a").await.unwrap();
    // Released: taken at once, in a new term.
    let short = std::time::Duration::from_millis(200);
    assert_eq!(store.acquire_lease("b", short).await.unwrap(), held("b", term + 1));
    // Lapsed without a renewal: taken over.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(store.acquire_lease("a", long).await.unwrap(), held("a", term + 2));
    assert_eq!(store.acquire_lease("b", long).await.unwrap(), held("a", term + 2));
}

pub(crate) async fn gateways_racing_for_the_lease_agree_on_one_holder(store: Shared) {
    const GATEWAYS: usize = 8;
    let long = std::time::Duration::from_secs(60);
    let tasks: Vec<_> = (0..GATEWAYS)
        .map(|g| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { (format!("g{g}"), store.acquire_lease(&format!("g{g}"), long).await.unwrap()) })
        })
        .collect();
    let mut seen = Vec::new();
    let mut holders = 0;
    for task in tasks {
        let (gateway, lease) = task.await.unwrap();
        holders += usize::from(lease.held_by(&gateway));
        seen.push(lease);
    }
    assert_eq!(holders, 1, "{seen:?}");
    assert!(seen.iter().all(|l| *l == seen[0]), "every gateway sees the one holder: {seen:?}");
}

pub(crate) async fn the_identity_is_stable(store: Shared) {
    let identity = store.identity().to_string();
    assert!(!identity.is_empty());
    store.commit(&[Write::CreateSandbox(sandbox("sb-a", "alpha"))]).await.unwrap();
    store.acquire_lease("g1", std::time::Duration::from_secs(5)).await.unwrap();
    assert_eq!(store.identity(), identity);
}
