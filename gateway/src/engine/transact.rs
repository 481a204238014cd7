//! The one read-decide-commit loop (DESIGN 3.3). Commands, observations and the exec rules all
//! run through [`Engine::transact`], so a metric, a log line, the retry rule or an announcement
//! is written once: each caller says only what it reads and which of core's rules decides.

use std::collections::BTreeSet;
use std::future::Future;

use berth_core::cas::Retry;
use berth_core::plan::Lock;
use berth_core::{Conflict, Decision, Key, Sandbox, Timestamp, Write};
use tracing::{info, warn};

use super::{Change, Engine};
use crate::error::ApiError;
use crate::store::CommitError;

/// What one transaction reads and which rule decides on it.
pub(crate) trait Transaction: Sync {
    type Read: Send + Sync;

    /// What logs and metrics call it.
    fn what(&self) -> &'static str;

    /// Reads what [`Transaction::decide`] needs, afresh: it runs again after every conflict.
    fn read(&self, engine: &Engine) -> impl Future<Output = Result<Self::Read, ApiError>> + Send;

    fn decide(&self, read: &Self::Read, now: Timestamp) -> Result<Decision, berth_core::Error>;

    /// The sandbox as read: what a phase change in the logs is told from.
    fn before<'r>(&self, read: &'r Self::Read) -> Option<&'r Sandbox>;

    /// Known-bug switch `ClaimWithoutCas`: what is written over whatever won a conflict.
    fn over_conflict(&self, _decision: &Decision, _conflict: &Conflict) -> Option<Decision> {
        None
    }
}

/// How one transaction runs: the records this gateway's writers take turns on while it runs
/// ([`crate::record_locks`]), when it gives up, and what it read before it took them, if that
/// is to be used as it is (a stale one then costs one conflict, not more).
pub(crate) struct Run<R> {
    pub locks: BTreeSet<Lock>,
    pub retry: Retry,
    pub read: Option<R>,
}

impl Engine {
    /// Reads, decides and commits `t`, re-reading and re-deciding after each conflicting write
    /// until it commits or core's retry rule gives up; then tells watchers and queues the
    /// decision's effects.
    pub(crate) async fn transact<T: Transaction>(&self, t: &T, run: Run<T::Read>) -> Result<Decision, ApiError> {
        let Run { locks, mut retry, read } = run;
        let _held = self.inner.writers.hold(locks).await;
        let mut read = match read {
            Some(read) => read,
            None => t.read(self).await?,
        };
        // The store's clock as a refused write read it: this gateway's reading of it ran ahead.
        // Taken once; a second such refusal is a conflict like any other.
        let (mut store_clock, mut corrected) = (None, false);
        loop {
            let now = store_clock.take().unwrap_or_else(|| self.now());
            let decision = t.decide(&read, now)?;
            match self.commit(&decision, t.before(&read), t.what()).await {
                Ok(()) => return Ok(decision),
                // Decided again on the same read at the store's time, at which the rule that
                // time justified may not hold yet (then it decides nothing, and its timer runs
                // again at the next sweep).
                Err(CommitError::Conflict(Conflict { key: Key::Clock, current: Some(at), .. })) if !corrected => {
                    self.inner.metrics.conflict(t.what());
                    warn!(
                        what = t.what(),
                        store_ms = at,
                        "this gateway's clock ran ahead of the store's: decided again at the store's time"
                    );
                    store_clock = Some(Timestamp::from_unix_millis(i64::try_from(at).unwrap_or(i64::MAX)));
                    corrected = true;
                }
                Err(CommitError::Conflict(c)) => {
                    if let Some(over) = t.over_conflict(&decision, &c) {
                        return self.commit(&over, None, t.what()).await.map(|()| over).map_err(|e| match e {
                            CommitError::Conflict(c) => ApiError::from(berth_core::Error::Contention {
                                kind: berth_core::Kind::Sandbox,
                                name: format!("{:?}", c.key),
                                attempts: 2,
                            }),
                            CommitError::Store(e) => e.into(),
                        });
                    }
                    self.wait_after_conflict(&mut retry, &c, t.what()).await?;
                    read = t.read(self).await?;
                }
                Err(CommitError::Store(e)) => return Err(e.into()),
            }
        }
    }

    /// Waits as core's retry rule says after a conflicting write, or gives up. Giving up on a
    /// server-owned write breaks I3, so it is logged: it means another gateway kept winning.
    async fn wait_after_conflict(&self, retry: &mut Retry, conflict: &Conflict, what: &str) -> Result<(), ApiError> {
        self.inner.metrics.conflict(what);
        match retry.after_conflict(conflict, self.random()) {
            Ok(wait) => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
            Err(e) => {
                if matches!(e, berth_core::Error::Contention { .. }) {
                    self.inner.metrics.gave_up(what);
                    warn!(record = ?conflict.key, what, error = %e, "conditional writes kept conflicting; gave up");
                }
                Err(e.into())
            }
        }
    }

    /// Commits a decision, logs its phase change, tells watchers, and queues its effects.
    async fn commit(&self, decision: &Decision, before: Option<&Sandbox>, cause: &str) -> Result<(), CommitError> {
        if !decision.writes.is_empty() {
            self.inner.store.commit(&decision.writes).await?;
            if let (Some(b), Some(a)) = (before, decision.sandbox())
                && b.intent != a.intent
            {
                self.inner.metrics.intent_changed(&a.id, b.intent, a.intent);
            }
            if let Some((old, new)) = decision.phase_change(before) {
                let after = decision.sandbox();
                let record = after.or(before);
                if let Some(r) = record {
                    self.inner.metrics.phase_changed(&r.id, old, new);
                }
                info!(
                    sandbox = record.map(|s| &*s.name).unwrap_or_default(),
                    id = record.map(|s| s.id.as_str()).unwrap_or_default(),
                    generation = record.map(|s| s.generation).unwrap_or_default(),
                    version_before = before.map(|s| s.resource_version),
                    version_after = after.map(|s| s.resource_version),
                    old_phase = ?old,
                    new_phase = ?new,
                    reason = after.and_then(|s| match &s.phase {
                        berth_core::Phase::Error(f) => Some(f.message.as_str()),
                        _ => None,
                    }),
                    cause,
                    "phase change"
                );
            }
            self.announce(&decision.writes);
        }
        self.dispatch(&decision.effects);
        Ok(())
    }

    /// Tells watchers, this gateway's timers and exec waiters of the writes just committed.
    fn announce(&self, writes: &[Write]) {
        let mut execs = false;
        for write in writes {
            match write {
                Write::CreateExec(_) => {
                    self.inner.metrics.exec_admitted();
                    execs = true;
                }
                // Core's exec rules never change a terminal exec, so a terminal one written
                // here has just ended.
                Write::UpdateExec { record, .. } => {
                    if record.state.is_terminal() {
                        self.inner.metrics.exec_ended(record.state.name());
                    }
                    execs = true;
                }
                _ => {}
            }
        }
        if execs {
            self.inner.exec_changes.send_replace(());
        }
        for write in writes {
            let change = match write {
                Write::CreateSandbox(s) | Write::UpdateSandbox { record: s, .. } => {
                    Change { id: s.id.clone(), sandbox: Some(s.clone()) }
                }
                Write::RemoveSandbox { id, .. } => Change { id: id.clone(), sandbox: None },
                _ => continue,
            };
            let _ = self.inner.changes.send(change);
        }
    }
}
