//! The timed rules (DESIGN 9.1, 9.2), carried out by the reconcile lease holder: deadlines' and
//! idle timeouts' expiries and policies' restarts, each at the time berth-core says it falls due.
//!
//! The holder keeps a schedule of every record's next timer: built afresh from every record it
//! reads each poll interval (`reconcile::feed_loop`; so what other gateways wrote is picked up within
//! a poll interval, and no record is read twice for it), and kept current in between by the
//! changes this gateway commits. At a timer's time it runs the command the timer names, decided
//! afresh on the stored record on the store's clock, so a timer gone stale (a renew, a user's
//! stop, a delete) decides nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_core::timers::{self, Timer};
use berth_core::{Outcome, Request, Sandbox, SandboxId, Timestamp};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::engine::Engine;

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
            self.by_id.insert(sandbox.id.clone(), (at, timer, sandbox.name.to_string()));
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

    /// The schedule of `records`, as of `now`.
    pub fn of(records: &[Sandbox], now: Timestamp) -> Self {
        let mut schedule = Self::default();
        for sandbox in records {
            schedule.update(sandbox, now);
        }
        schedule
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
                    let on_expiry = after.spec.lifetime.on_expiry;
                    match timer {
                        Timer::Expire { .. } if after.expired_at.is_some() => {
                            info!(sandbox = %name, id = %id, ?on_expiry, "the sandbox's deadline passed: expired");
                        }
                        Timer::Idle { .. } if after.idle_expired_at.is_some() => {
                            info!(sandbox = %name, id = %id, ?on_expiry, "the sandbox was idle for its idle timeout: expired");
                        }
                        _ => {}
                    }
                    let now = engine.now();
                    match timers::next(&after, now) {
                        // Decided nothing and due again at once: an idle expiry held off by an
                        // open exec (whose end, written here, reschedules it), or a rule and its
                        // timer disagreeing. Either way left to the next sweep, not spun on.
                        Some((at, again)) if again == timer && at <= now => match timer {
                            Timer::Idle { .. } => {
                                debug!(sandbox = %name, "idle past its timeout with an exec open; looked at again by the next sweep")
                            }
                            _ => warn!(sandbox = %name, ?timer, "a due timer decided nothing; left to the next sweep"),
                        },
                        _ => self.update(&after, now),
                    }
                }
                // Gone, or the name is another sandbox's now: its own changes schedule it.
                Ok(_) => {}
                // The next sweep schedules it again.
                Err(e) => {
                    warn!(sandbox = %name, ?timer, error = %e, "a timed rule could not be carried out; retried after the next sweep")
                }
            }
        }
        fired
    }
}

/// How long the loop sleeps with nothing scheduled before it looks again.
const IDLE: Duration = Duration::from_secs(3600);

/// The lease holder's timer loop: schedules from every batch of `records` it reads, until its tenure ends (the task is aborted).
pub async fn timers_loop(engine: Engine, mut records: mpsc::Receiver<Vec<Sandbox>>) {
    let mut changes = engine.subscribe();
    let mut schedule = Schedule::default();
    loop {
        schedule.fire_due(&engine).await;
        // Store-clock time to wait, slept on the local one: a timer fires at most a clock
        // drift late, and its command checks the store's clock again.
        let wait = schedule.next_at().map_or(IDLE, |at| {
            let nanos = at.unix_nanos().saturating_sub(engine.now().unix_nanos());
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
        });
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        // Biased, as every select the simulator runs (DESIGN 5: no ambient randomness).
        loop {
            tokio::select! {
                biased;
                batch = records.recv() => match batch {
                    Some(batch) => {
                        schedule = Schedule::of(&batch, engine.now());
                        debug!(timers = schedule.len(), "timers scheduled from a sweep");
                        break;
                    }
                    None => return,
                },
                change = changes.recv() => match change {
                    Ok(change) => match change.sandbox {
                        Some(sandbox) => {
                            let now = engine.now();
                            let earlier = timers::next(&sandbox, now)
                                .is_some_and(|(at, _)| schedule.next_at().is_none_or(|n| at < n));
                            schedule.update(&sandbox, now);
                            if earlier {
                                break;
                            }
                        }
                        None => schedule.remove(&change.id),
                    },
                    // Missed changes: the next sweep's batch brings them.
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                },
                () = &mut sleep => break,
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

    use super::*;

    fn with_deadline(id: &str, deadline: Option<i64>) -> Sandbox {
        let spec = berth_core::SandboxSpec { image: "i".into(), command: vec!["c".into()], ..Default::default() };
        Sandbox {
            phase: berth_core::Phase::Ready,
            deadline: deadline.map(Timestamp),
            ..Sandbox::new(SandboxId::new(id), id, spec, Timestamp(0))
        }
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
