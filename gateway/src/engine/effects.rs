//! The effects a committed decision leaves to the runtime (DESIGN 3.3). Each sandbox has a
//! queue drained by one task, so a sandbox's stop never overtakes its start; each effect is
//! checked against the record just before it runs (a later decision may have superseded it),
//! and the driver's reply is merged like any other observation.

use std::collections::{BTreeMap, VecDeque};

use berth_core::identity::{RuntimeIdentity, derive_token};
use berth_core::{Effect, Observation, RuntimeSource, Sandbox, SandboxId, recovery};
use berth_drivers::{DriverError, Launch};
use tracing::{debug, warn};

use super::{Engine, lock};

/// A sandbox's effects waiting for its worker.
#[derive(Default)]
pub(super) struct Queue {
    pending: VecDeque<Effect>,
}

impl Engine {
    /// Queues effects behind those of the same sandbox; an identical one already queued is
    /// not queued twice.
    pub fn dispatch(&self, effects: &[Effect]) {
        for effect in effects {
            let id = effect.sandbox().clone();
            let spawn = {
                let mut queues = lock(&self.inner.queues);
                let idle = !queues.contains_key(&id);
                let queue = queues.entry(id.clone()).or_default();
                if !queue.pending.contains(effect) {
                    queue.pending.push_back(effect.clone());
                }
                idle
            };
            if spawn {
                tokio::spawn(self.clone().drain(id));
            }
        }
    }

    /// Whether any effect is queued or running.
    pub fn busy(&self) -> bool {
        !lock(&self.inner.queues).is_empty()
    }

    async fn drain(self, id: SandboxId) {
        loop {
            let effect = {
                let mut queues = lock(&self.inner.queues);
                let Some(queue) = queues.get_mut(&id) else { return };
                match queue.pending.pop_front() {
                    Some(effect) => effect,
                    None => {
                        queues.remove(&id);
                        return;
                    }
                }
            };
            self.perform(&effect).await;
        }
    }

    /// Runs one effect if it is still wanted, retrying a runtime that does not answer, and
    /// merges the driver's reply.
    async fn perform(&self, effect: &Effect) {
        let id = effect.sandbox();
        let mut waits = self.inner.settings.effect_retries.iter();
        loop {
            let record = match self.inner.store.sandbox(id).await {
                Ok(record) => record,
                Err(e) => {
                    warn!(sandbox = %id, error = %e, ?effect, "cannot read the sandbox; recovery will re-drive the effect");
                    return;
                }
            };
            if !recovery::still_wanted(record.as_ref(), effect) {
                debug!(sandbox = %id, ?effect, "effect superseded");
                return;
            }
            match self.call_driver(effect, record.as_ref()).await {
                Ok(observation) => {
                    // The record read before the call names the lock; it is read again under it.
                    if let Err(e) = self.observe_under_lock(id, &observation, record, true).await {
                        warn!(sandbox = %id, error = %e, "cannot record the driver's reply; recovery will re-drive it");
                    }
                    return;
                }
                Err(e) => match waits.next() {
                    Some(wait) => {
                        debug!(sandbox = %id, error = %e, ?effect, "the runtime did not answer; retrying");
                        tokio::time::sleep(*wait).await;
                    }
                    None => {
                        warn!(sandbox = %id, error = %e, ?effect, "the runtime did not answer; the reconcile sweep will re-drive the effect");
                        return;
                    }
                },
            }
        }
    }

    async fn call_driver(&self, effect: &Effect, record: Option<&Sandbox>) -> Result<Observation, DriverError> {
        let op = match effect {
            Effect::Start { .. } => "start",
            Effect::Stop { .. } => "stop",
            Effect::Pause { .. } => "pause",
            Effect::Resume { .. } => "resume",
            Effect::Delete { .. } => "delete",
        };
        let began = tokio::time::Instant::now();
        let result = self.drive(effect, record).await;
        self.inner.metrics.driver_call(op, began.elapsed(), result.is_err());
        result
    }

    async fn drive(&self, effect: &Effect, record: Option<&Sandbox>) -> Result<Observation, DriverError> {
        let driver = &self.inner.driver;
        match (effect, record) {
            (Effect::Start { generation, .. }, Some(sandbox)) => {
                let launch = self.launch(sandbox).await?;
                let reply = driver.start(launch).await?;
                Ok(Observation::Started { generation: *generation, reply })
            }
            (Effect::Stop { sandbox, generation }, _) => {
                let state = driver.stop(sandbox, *generation, self.inner.settings.stop_grace).await?;
                Ok(Observation::Stopped { generation: *generation, state })
            }
            // The state a pause or resume left is a runtime report like a poll's, its absence
            // fenced by the record read before the call.
            (Effect::Pause { sandbox, .. }, _) => {
                let state = driver.pause(sandbox).await?;
                let as_of_version = record.map(|r| r.resource_version);
                Ok(Observation::Runtime { source: RuntimeSource::PauseReply, state, as_of_version })
            }
            (Effect::Resume { sandbox, .. }, _) => {
                let state = driver.resume(sandbox).await?;
                let as_of_version = record.map(|r| r.resource_version);
                Ok(Observation::Runtime { source: RuntimeSource::ResumeReply, state, as_of_version })
            }
            (Effect::Delete { sandbox }, _) => {
                driver.delete(sandbox, self.inner.settings.stop_grace).await?;
                Ok(Observation::Deleted)
            }
            (Effect::Start { .. }, None) => Err(DriverError::Failed("the sandbox is gone".to_string())),
        }
    }

    /// Everything the driver needs to start the record's current generation.
    async fn launch(&self, sandbox: &Sandbox) -> Result<Launch, DriverError> {
        let mut credentials = BTreeMap::new();
        for name in sandbox.providers.iter() {
            match self.inner.store.provider(name).await {
                Ok(Some(p)) => credentials.extend(p.credentials),
                Ok(None) => warn!(sandbox = %sandbox.name, provider = %name, "an attached provider is gone"),
                Err(e) => return Err(DriverError::Unavailable(format!("reading provider {name}: {e}"))),
            }
        }
        let identity = RuntimeIdentity { sandbox: sandbox.id.clone(), generation: sandbox.generation };
        Ok(Launch {
            sandbox: sandbox.id.clone(),
            name: sandbox.name.to_string(),
            generation: sandbox.generation,
            spec: berth_core::SandboxSpec::clone(&sandbox.spec),
            credentials,
            token: derive_token(&self.inner.key, &identity),
        })
    }
}
