//! The timed rules (DESIGN 9.1, 9.2), carried out by the reconcile lease holder: deadlines'
//! expiries and policies' restarts, each at the time berth-core says it falls due.
//!
//! The holder keeps a schedule of every record's next timer: built by a scan of all records
//! (at the start of its tenure and every poll interval after, which picks up what other
//! gateways wrote), and kept current between scans by the changes this gateway commits. At a
//! timer's time it runs the command the timer names, decided afresh on the stored record on the
//! store's clock, so a timer gone stale (a renew, a user's stop, a delete) decides nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_core::timers::{self, Timer};
use berth_core::{Outcome, Request, Sandbox, SandboxId, Timestamp};
use tokio::sync::broadcast::error::RecvError;
use tracing::{debug, info, warn};

use crate::engine::Engine;
use crate::error::ApiError;
use crate::reconcile::ReconcileSettings;
use crate::store::PageRequest;

/// Every record's next timer, in time order.
#[derive(Default)]
pub struct Schedule {
    by_id: BTreeMap<SandboxId, (Timestamp, Timer, String)>,
    by_time: BTreeSet<(Timestamp, SandboxId)>,
}

impl Schedule {
    /// Puts `sandbox`'s next timer as of `now` in place of what was kept for it.
    pub fn update(&mut self, sandbox: &Sandbox, now: Timestamp) {
        self.remove(&sandbox.id);
        if let Some((at, timer)) = timers::next(sandbox, now) {
            self.by_time.insert((at, sandbox.id.clone()));
            self.by_id.insert(sandbox.id.clone(), (at, timer, sandbox.name.clone()));
        }
    }

    pub fn remove(&mut self, id: &SandboxId) {
        if let Some((at, _, _)) = self.by_id.remove(id) {
            self.by_time.remove(&(at, id.clone()));
        }
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// When the earliest timer falls due.
    pub fn next_at(&self) -> Option<Timestamp> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Takes the earliest timer if it is due at `now`: the sandbox's id and name, and the timer.
    pub fn pop_due(&mut self, now: Timestamp) -> Option<(SandboxId, String, Timer)> {
        let (at, id) = self.by_time.first().cloned()?;
        if at > now {
            return None;
        }
        self.by_time.remove(&(at, id.clone()));
        let (_, timer, name) = self.by_id.remove(&id)?;
        Some((id, name, timer))
    }

    /// Builds the schedule afresh from every record (paged).
    pub async fn scan(engine: &Engine, page_size: usize) -> Result<Self, ApiError> {
        let mut schedule = Self::default();
        let mut page = PageRequest { after: None, limit: page_size };
        loop {
            let batch = engine.store().list_sandboxes(&page, &BTreeMap::new()).await?;
            let now = engine.now();
            for sandbox in &batch.items {
                schedule.update(sandbox, now);
            }
            match batch.next {
                Some(next) => page.after = Some(next),
                None => return Ok(schedule),
            }
        }
    }

    /// Runs every timer due at the store's `now`, rescheduling each sandbox from what its
    /// command left. Returns how many ran.
    pub async fn fire_due(&mut self, engine: &Engine) -> usize {
        let mut fired = 0;
        while let Some((id, name, timer)) = self.pop_due(engine.now()) {
            fired += 1;
            let request = Request::new(timers::command(&name, timer), None);
            match engine.execute(&request).await {
                Ok(Outcome::Sandbox(after)) if after.id == id => {
                    if after.expired_at.is_some() && matches!(timer, Timer::Expire { .. }) {
                        info!(sandbox = %name, id = %id, on_expiry = ?after.spec.lifetime.on_expiry, "the sandbox's deadline passed: expired");
                    }
                    let now = engine.now();
                    match timers::next(&after, now) {
                        // Decided nothing and due again at once: a rule and its timer disagree.
                        // Left to the next scan rather than spun on.
                        Some((at, again)) if again == timer && at <= now => {
                            warn!(sandbox = %name, ?timer, "a due timer decided nothing; left to the next scan");
                        }
                        _ => self.update(&after, now),
                    }
                }
                // Gone, or the name is another sandbox's now: its own changes schedule it.
                Ok(_) => {}
                // The next scan schedules it again.
                Err(e) => {
                    warn!(sandbox = %name, ?timer, error = %e, "a timed rule could not be carried out; retried after the next scan")
                }
            }
        }
        fired
    }
}

/// The lease holder's timer loop: runs until its tenure ends (the task is aborted).
pub async fn timers_loop(engine: Engine, settings: ReconcileSettings) {
    let mut changes = engine.subscribe();
    let mut schedule = Schedule::default();
    // Kept across wake-ups: timers firing often must not put the next scan off for ever.
    let mut next_scan = tokio::time::Instant::now();
    loop {
        if tokio::time::Instant::now() >= next_scan {
            next_scan = tokio::time::Instant::now() + settings.poll_interval;
            match Schedule::scan(&engine, settings.page_size).await {
                Ok(fresh) => {
                    debug!(timers = fresh.len(), "timers scanned");
                    schedule = fresh;
                }
                Err(e) => warn!(error = %e, "cannot scan the records for their timers; retrying"),
            }
        }
        schedule.fire_due(&engine).await;
        // Store-clock time to wait, slept on the local one: a timer fires at most a clock
        // drift late, and its command checks the store's clock again.
        let wait = schedule.next_at().map_or(settings.poll_interval, |at| {
            let nanos = at.unix_nanos().saturating_sub(engine.now().unix_nanos());
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)).min(settings.poll_interval)
        });
        let rescan = tokio::time::sleep_until(next_scan);
        tokio::pin!(rescan);
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        // Biased, as every select the simulator runs (DESIGN 5: no ambient randomness).
        loop {
            tokio::select! {
                biased;
                change = changes.recv() => match change {
                    Ok(change) => match change.sandbox {
                        Some(sandbox) => {
                            let now = engine.now();
                            let earlier = timers::next(&sandbox, now).is_some_and(|(at, _)| schedule.next_at().is_none_or(|n| at < n));
                            schedule.update(&sandbox, now);
                            if earlier {
                                break;
                            }
                        }
                        None => schedule.remove(&change.id),
                    },
                    Err(RecvError::Lagged(_)) => {
                        next_scan = tokio::time::Instant::now();
                        break;
                    }
                    Err(RecvError::Closed) => return,
                },
                () = &mut sleep => break,
                () = &mut rescan => break,
            }
        }
    }
}

/// The scheduled ids, in time order.
#[cfg(test)]
fn ids(schedule: &Schedule) -> Vec<String> {
    schedule.by_time.iter().map(|(_, id)| id.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use berth_core::lifetime::{Lifetime, OnExpiry};

    use super::*;

    fn with_deadline(id: &str, deadline: Option<i64>) -> Sandbox {
        let mut s: Sandbox = serde_json::from_value(serde_json::json!({
            "id": id, "name": id, "spec": {"image": "i", "command": ["c"], "env": {}, "labels": {}},
            "providers": [], "intent": "Running", "phase": "Ready", "resource_version": 1, "generation": 1,
            "exit_fence": {"marker": null, "settled": true}, "run": "Pending", "last_exit": null,
            "created_at": 0, "updated_at": 0
        }))
        .unwrap();
        s.spec.lifetime = Lifetime { ttl: None, on_expiry: OnExpiry::Stop };
        s.deadline = deadline.map(Timestamp);
        s
    }

    #[test]
    fn the_schedule_keeps_one_timer_per_sandbox_in_time_order() {
        let mut schedule = Schedule::default();
        schedule.update(&with_deadline("b", Some(20)), Timestamp(0));
        schedule.update(&with_deadline("a", Some(30)), Timestamp(0));
        schedule.update(&with_deadline("c", None), Timestamp(0));
        assert_eq!(ids(&schedule), ["b", "a"]);
        // Renewed: moved, not added.
        schedule.update(&with_deadline("b", Some(40)), Timestamp(0));
        assert_eq!(ids(&schedule), ["a", "b"]);
        assert_eq!(schedule.next_at(), Some(Timestamp(30)));
        assert_eq!(schedule.pop_due(Timestamp(29)), None);
        let (id, name, timer) = schedule.pop_due(Timestamp(30)).unwrap();
        assert_eq!((id.as_str(), name.as_str(), timer), ("a", "a", Timer::Expire { deadline: Timestamp(30) }));
        schedule.remove(&SandboxId::new("b"));
        assert!(schedule.is_empty());
    }
}
