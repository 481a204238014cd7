//! The effects a committed decision leaves to the runtime (DESIGN 3.3). Each sandbox, and each
//! snapshot, has a queue drained by one task, so a sandbox's stop never overtakes its start and
//! a snapshot's removal never runs under its copy; each effect is checked against the record
//! just before it runs (a later decision may have superseded it), and the driver's reply is
//! merged like any other observation (a snapshot's, as the server-owned command that records
//! it).

use std::collections::{BTreeMap, VecDeque};

use berth_core::decision::Subject;
use berth_core::identity::{RuntimeIdentity, derive_token};
use berth_core::{
    Command, Decision, Effect, Observation, Outcome, Request, RuntimeSource, Sandbox, SandboxId, SnapshotPhase,
    recovery, snapshot, volume,
};
use berth_drivers::{DriverError, Fence, Launch};
use tracing::{debug, info, warn};

use super::{Engine, lock};
use crate::error::ApiError;

/// A sandbox's effects waiting for its worker, and the one it is carrying out.
#[derive(Default)]
pub(super) struct Queue {
    pending: VecDeque<Effect>,
    running: Option<Effect>,
}

impl Engine {
    /// Queues effects behind those of the same sandbox; an identical one already queued, or
    /// being carried out, is not queued again (the change log brings this gateway's own
    /// decisions back to it).
    pub fn dispatch(&self, effects: &[Effect]) {
        for effect in effects {
            let id = effect.subject();
            let spawn = {
                let mut queues = lock(&self.inner.queues);
                let idle = !queues.contains_key(&id);
                let queue = queues.entry(id.clone()).or_default();
                if !queue.pending.contains(effect) && queue.running.as_ref() != Some(effect) {
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

    async fn drain(self, id: Subject) {
        loop {
            let effect = {
                let mut queues = lock(&self.inner.queues);
                let Some(queue) = queues.get_mut(&id) else { return };
                queue.running = queue.pending.pop_front();
                match queue.running.clone() {
                    Some(effect) => effect,
                    None => {
                        queues.remove(&id);
                        return;
                    }
                }
            };
            match &id {
                Subject::Sandbox(sandbox) => self.perform(sandbox, &effect).await,
                Subject::Snapshot(_) | Subject::Volume(_) => self.perform_answered(&effect).await,
            }
        }
    }

    /// Once a deleted sandbox's record is gone, asks for the removal of each volume it mounted
    /// that is being deleted and that nothing else mounts, rather than leaving it to the next
    /// sweep.
    async fn release_volumes(&self, deleted: &Sandbox) {
        for (id, mount) in volume::mounts(&deleted.spec) {
            let released = async {
                let Some(record) = self.inner.store.volume(&mount.volume).await?.filter(|v| v.id == id) else {
                    return Ok(None);
                };
                let users = self.inner.store.sandboxes_mounting(&record).await?;
                Ok::<_, ApiError>(volume::unfinished(&record, &users))
            };
            match released.await {
                Ok(Some(effect)) => self.dispatch(&[effect]),
                Ok(None) => {}
                Err(e) => debug!(volume = %mount.volume, error = %e, "a released volume is left to the sweep"),
            }
        }
    }

    /// Whether a snapshot's or volume's effect is still wanted by its record as stored now.
    async fn still_wanted(&self, effect: &Effect) -> Result<bool, ApiError> {
        Ok(match effect {
            Effect::Snapshot { name, .. } | Effect::RemoveSnapshot { name, .. } => {
                snapshot::still_wanted(self.inner.store.snapshot(name).await?.as_ref(), effect)
            }
            Effect::RemoveVolume { name, .. } => {
                volume::still_wanted(self.inner.store.volume(name).await?.as_ref(), effect)
            }
            _ => false,
        })
    }

    /// Runs a snapshot's or volume's effect if it is still wanted, retrying a runtime that does
    /// not answer, and records the driver's answer as the server-owned command it is.
    async fn perform_answered(&self, effect: &Effect) {
        let mut waits = self.inner.settings.effect_retries.iter();
        loop {
            match self.still_wanted(effect).await {
                Ok(true) => {}
                Ok(false) => {
                    debug!(?effect, "effect superseded");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, ?effect, "cannot read the effect's record; recovery will re-drive the effect");
                    return;
                }
            }
            let answer = match self.answer_call(effect).await {
                Ok(answer) => answer,
                Err(e) => match waits.next() {
                    Some(wait) => {
                        debug!(error = %e, ?effect, "the runtime did not answer; retrying");
                        tokio::time::sleep(*wait).await;
                        continue;
                    }
                    None => {
                        warn!(error = %e, ?effect, "the runtime did not answer; the reconcile sweep will re-drive the effect");
                        return;
                    }
                },
            };
            match self.decide(&Request::new(answer, None)).await {
                // Counted by the write that settled it: an answer re-driven after another
                // gateway's (or its own, before a crash) changes nothing and counts nothing.
                Ok(Decision { outcome: Outcome::Snapshot(s), writes, .. })
                    if matches!(effect, Effect::Snapshot { .. }) && !writes.is_empty() =>
                {
                    let took = self.now().since(s.created_at);
                    let ready = s.phase == SnapshotPhase::Ready;
                    self.inner.metrics.snapshot_settled(s.fork.is_some(), ready, took);
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e, ?effect, "cannot record the runtime's answer; recovery will re-drive it");
                }
            }
            return;
        }
    }

    /// The driver's answer to a snapshot's or volume's effect, as the command that records it. A
    /// copy the runtime refused is an answer (the snapshot fails); one it did not answer is
    /// retried.
    async fn answer_call(&self, effect: &Effect) -> Result<Command, DriverError> {
        let driver = &self.inner.driver;
        let began = tokio::time::Instant::now();
        let (op, answer) = match effect {
            Effect::Snapshot { snapshot, name, sandbox } => {
                let result = match driver.snapshot(sandbox, snapshot).await {
                    Ok(content) => Ok(Ok(content)),
                    Err(DriverError::Failed(message)) => Ok(Err(message)),
                    Err(e) => Err(e),
                };
                (
                    "snapshot",
                    result.map(|result| Command::SnapshotTaken { name: name.clone(), id: snapshot.clone(), result }),
                )
            }
            Effect::RemoveSnapshot { snapshot, name } => {
                let result = driver.remove_snapshot(snapshot).await;
                (
                    "remove_snapshot",
                    result.map(|()| Command::SnapshotRemoved { name: name.clone(), id: snapshot.clone() }),
                )
            }
            Effect::RemoveVolume { volume, name } => {
                let result = driver.remove_volume(volume).await;
                ("remove_volume", result.map(|()| Command::VolumeRemoved { name: name.clone(), id: volume.clone() }))
            }
            other => return Err(DriverError::Failed(format!("not a snapshot's or volume's effect: {other:?}"))),
        };
        self.inner.metrics.driver_call(op, began.elapsed(), answer.is_err());
        answer
    }

    /// Runs one effect if it is still wanted, retrying a runtime that does not answer, and
    /// merges the driver's reply.
    async fn perform(&self, id: &SandboxId, effect: &Effect) {
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
            // Decided here for a sandbox another node runs: that node follows the store's
            // changes and carries it out (`reconcile::follow_loop`).
            if let Some(elsewhere) = record.as_ref().filter(|r| !self.runs_here(r)) {
                debug!(sandbox = %id, ?effect, node = ?elsewhere.placement, "effect left to the sandbox's node");
                return;
            }
            // A run made under a lease that lapsed, or for a placement newer than this view,
            // could overlap one the store places elsewhere: left until the lease is held again
            // (recovery then re-drives it) or to the node the store fences it onto.
            if let Some(record) = record.as_ref().filter(|r| effect.makes_a_run() && !self.may_run(r)) {
                info!(sandbox = %id, ?effect, placement = ?record.placement, "refused: not under this node's lease");
                return;
            }
            match self.call_driver(effect, record.as_ref()).await {
                Ok(observation) => {
                    let released = matches!(effect, Effect::Delete { .. }).then(|| record.clone()).flatten();
                    // The record read before the call names the lock; it is read again under it.
                    if let Err(e) = self.observe_under_lock(id, &observation, record, true).await {
                        warn!(sandbox = %id, error = %e, "cannot record the driver's reply; recovery will re-drive it");
                    } else if let Some(deleted) = released {
                        self.release_volumes(&deleted).await;
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
            Effect::Snapshot { .. } | Effect::RemoveSnapshot { .. } | Effect::RemoveVolume { .. } => {
                return Err(DriverError::Failed(format!("not a sandbox's effect: {effect:?}")));
            }
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
            (Effect::Pause { sandbox, hold, .. }, _) => {
                let state = driver.pause(sandbox, *hold).await?;
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
            (Effect::Snapshot { .. } | Effect::RemoveSnapshot { .. } | Effect::RemoveVolume { .. }, _) => {
                Err(DriverError::Failed(format!("not a sandbox's effect: {effect:?}")))
            }
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
            seed: sandbox.seed.clone(),
            fence: {
                let (engine, record) = (self.clone(), sandbox.clone());
                Fence::new(move || engine.may_run(&record))
            },
        })
    }
}
