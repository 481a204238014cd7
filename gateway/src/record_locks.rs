//! One writer per record inside a gateway.
//!
//! Every write is conditional (DESIGN 3.3), so two writers racing on one record are safe: the
//! loser re-reads and re-decides. But writers inside one gateway racing each other is
//! self-inflicted contention: sixteen clients attaching providers to one sandbox beside a
//! stop/start cycler exhausted the retry budget of a server-owned command (I3). So each
//! read-decide-commit holds the locks of the records it may write, and conflicts can only come
//! from other gateways sharing the store.
//!
//! Sandboxes are locked by name: a command knows the name before it reads anything, and an
//! observation learns it from the record it read (a name is immutable, and coarser than the id
//! only across a delete and a re-create, where serializing is harmless).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use berth_core::plan::Lock;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub struct RecordLocks {
    locks: Mutex<BTreeMap<Lock, Arc<AsyncMutex<()>>>>,
}

/// Held while one read-decide-commit runs; releasing it forgets locks nobody else wants.
pub struct Held<'a> {
    owner: &'a RecordLocks,
    guards: Vec<(Lock, OwnedMutexGuard<()>)>,
}

impl RecordLocks {
    /// Waits for every lock of `keys`. A set is ordered, and every writer takes its locks in
    /// that order, so two writers never wait on each other in a cycle.
    pub async fn hold(&self, keys: BTreeSet<Lock>) -> Held<'_> {
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let lock = {
                let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                Arc::clone(locks.entry(key.clone()).or_default())
            };
            guards.push((key, lock.lock_owned().await));
        }
        Held { owner: self, guards }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap().len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut locks = self.owner.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, guard) in self.guards.drain(..) {
            drop(guard);
            // Only the map holds it now: nobody waits, so the entry can go.
            if locks.get(&key).is_some_and(|lock| Arc::strong_count(lock) == 1) {
                locks.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn keys(names: &[&str]) -> BTreeSet<Lock> {
        names.iter().map(|n| Lock::Sandbox((*n).to_string())).collect()
    }

    #[tokio::test]
    async fn a_second_writer_of_a_record_waits_for_the_first() {
        let locks = Arc::new(RecordLocks::default());
        let first = locks.hold(keys(&["a", "b"])).await;
        let waiting = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move {
                let _held = locks.hold(keys(&["b"])).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "two writers held one record");
        // Another record is not held up.
        drop(locks.hold(keys(&["c"])).await);
        drop(first);
        waiting.await.unwrap();
        assert_eq!(locks.len(), 0, "released locks are forgotten");
    }

    #[tokio::test]
    async fn writers_taking_overlapping_sets_in_any_order_never_deadlock() {
        let locks = Arc::new(RecordLocks::default());
        let mut tasks = Vec::new();
        for i in 0..32 {
            let locks = Arc::clone(&locks);
            let set = if i % 2 == 0 { keys(&["x", "y", "z"]) } else { keys(&["z", "x"]) };
            tasks.push(tokio::spawn(async move {
                let _held = locks.hold(set).await;
                tokio::task::yield_now().await;
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(5), t).await.expect("a deadlock").unwrap();
        }
        assert_eq!(locks.len(), 0);
    }
}
