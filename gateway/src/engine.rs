//! The engine executes what berth-core decides.
//!
//! Commands and observations run the same loop: read, decide (or merge), commit the decision's
//! conditional writes, and on a conflict re-read and re-decide after the jittered wait core
//! chose (DESIGN 3.3). Once a decision commits, its driver effects go to a per-sandbox queue
//! and run one at a time, so a sandbox's stop never overtakes its start; each effect is checked
//! against the record just before it runs (a later decision may have superseded it), and the
//! driver's reply is merged like any other observation.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::cas::{Retry, RetryPolicy};
use berth_core::identity::{IdentityKey, RuntimeIdentity, derive_token};
use berth_core::{
    Decision, Effect, Kind, Observation, Outcome, Reads, Request, Sandbox, SandboxId, Write, decide, merge, recovery,
};
use berth_drivers::{Driver, DriverError, Launch};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use tokio::sync::broadcast;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::error::ApiError;
use crate::store::{CommitError, Store};

#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub retry: RetryPolicy,
    /// How long a stop waits for a graceful exit before it forces one.
    pub stop_grace: Duration,
    /// Waits between the attempts of an effect the runtime did not answer; after the last one
    /// the reconcile sweep takes over.
    pub effect_retries: Vec<Duration>,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            stop_grace: Duration::from_secs(10),
            effect_retries: vec![Duration::from_millis(200), Duration::from_secs(1), Duration::from_secs(5)],
        }
    }
}

/// A committed change to a sandbox, for watchers.
#[derive(Clone, Debug)]
pub struct Change {
    pub id: SandboxId,
    /// The record after the change; `None` once it is removed.
    pub sandbox: Option<Sandbox>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Effect>,
}

struct Inner {
    store: Arc<dyn Store>,
    driver: Arc<dyn Driver>,
    clock: Arc<dyn Clock>,
    key: IdentityKey,
    settings: EngineSettings,
    rng: Mutex<ChaCha8Rng>,
    /// Sandboxes with effects queued or running; a worker task drains each.
    queues: Mutex<BTreeMap<SandboxId, Queue>>,
    changes: broadcast::Sender<Change>,
    /// Set once the gateway shuts down: long-lived streams end.
    shutdown: tokio::sync::watch::Sender<bool>,
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Engine {
    /// `seed` drives every random choice the engine makes (ids, retry jitter).
    pub fn new(
        store: Arc<dyn Store>,
        driver: Arc<dyn Driver>,
        clock: Arc<dyn Clock>,
        key: IdentityKey,
        settings: EngineSettings,
        seed: u64,
    ) -> Self {
        let (changes, _) = broadcast::channel(4096);
        Self {
            inner: Arc::new(Inner {
                store,
                driver,
                clock,
                key,
                settings,
                rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
                queues: Mutex::default(),
                changes,
                shutdown: tokio::sync::watch::channel(false).0,
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.inner.driver
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    pub fn key(&self) -> &IdentityKey {
        &self.inner.key
    }

    pub fn random(&self) -> u64 {
        lock(&self.inner.rng).next_u64()
    }

    /// A fresh sandbox id: 128 random bits, never reused.
    pub fn new_sandbox_id(&self) -> SandboxId {
        SandboxId::new(format!("sb-{:016x}{:016x}", self.random(), self.random()))
    }

    /// Every committed change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }

    /// Runs an API command: decide, commit (re-deciding after conflicts), then run its effects.
    pub async fn execute(&self, request: &Request) -> Result<Outcome, ApiError> {
        let mut retry = Retry::for_request(self.inner.settings.retry, request);
        loop {
            let reads = self.read(request).await?;
            let decision = decide(request, &reads, self.inner.clock.now())?;
            match self.commit(&decision, reads.sandbox.as_ref(), command_name(request)).await {
                Ok(()) => return Ok(decision.outcome),
                Err(CommitError::Conflict(c)) => tokio::time::sleep(retry.after_conflict(&c, self.random())?).await,
                Err(CommitError::Store(e)) => return Err(e.into()),
            }
        }
    }

    /// Merges one observation about sandbox `id`. `read` is the record if the caller has just
    /// read it (a sweep does); it is re-read after a conflict.
    pub async fn observe(
        &self,
        id: &SandboxId,
        observation: &Observation,
        mut read: Option<Sandbox>,
    ) -> Result<Decision, ApiError> {
        let mut retry = Retry::new(self.inner.settings.retry, Kind::Sandbox, id.as_str());
        loop {
            let current = match read.take() {
                Some(record) => Some(record),
                None => self.inner.store.sandbox(id).await?,
            };
            let decision = merge(current.as_ref(), id, observation, self.inner.clock.now())?;
            match self.commit(&decision, current.as_ref(), observation.source_name()).await {
                Ok(()) => return Ok(decision),
                Err(CommitError::Conflict(c)) => tokio::time::sleep(retry.after_conflict(&c, self.random())?).await,
                Err(CommitError::Store(e)) => return Err(e.into()),
            }
        }
    }

    async fn read(&self, request: &Request) -> Result<Reads, ApiError> {
        let store = &self.inner.store;
        let sandbox = match request.sandbox_name() {
            Some(name) => store.sandbox_by_name(name).await?,
            None => None,
        };
        let mut providers = BTreeMap::new();
        for name in request.providers_to_read(sandbox.as_ref()) {
            if let Some(p) = store.provider(&name).await? {
                providers.insert(name, p);
            }
        }
        let users = match request.provider_users() {
            Some(p) => store.sandboxes_using(p).await?,
            None => Vec::new(),
        };
        Ok(Reads { sandbox, providers, users })
    }

    /// Commits a decision, logs its phase change, tells watchers, and queues its effects.
    async fn commit(&self, decision: &Decision, before: Option<&Sandbox>, cause: &str) -> Result<(), CommitError> {
        if !decision.writes.is_empty() {
            self.inner.store.commit(&decision.writes).await?;
            if let Some((old, new)) = decision.phase_change(before) {
                let after = match &decision.outcome {
                    Outcome::Sandbox(s) => Some(s),
                    _ => None,
                };
                let record = after.or(before);
                info!(
                    sandbox = record.map(|s| s.name.as_str()).unwrap_or_default(),
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
            for write in &decision.writes {
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
        self.dispatch(&decision.effects);
        Ok(())
    }

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

    /// Asks every long-lived stream (supervisor sessions, watches) to end.
    pub fn shut_down(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Resolves once the gateway is shutting down.
    pub async fn shutting_down(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        let _ = rx.wait_for(|down| *down).await;
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
                    if let Err(e) = self.observe(id, &observation, None).await {
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
        let driver = &self.inner.driver;
        match (effect, record) {
            (Effect::Start { generation, .. }, Some(sandbox)) => {
                let launch = self.launch(sandbox).await?;
                let reply = driver.start(launch).await?;
                Ok(Observation::Started { generation: *generation, reply })
            }
            (Effect::Stop { sandbox, generation }, _) => {
                let state = driver.stop(sandbox, self.inner.settings.stop_grace).await?;
                Ok(Observation::Stopped { generation: *generation, state })
            }
            (Effect::Delete { sandbox }, _) => {
                driver.delete(sandbox).await?;
                Ok(Observation::Deleted)
            }
            (Effect::Start { .. }, None) => Err(DriverError::Failed("the sandbox is gone".to_string())),
        }
    }

    /// Everything the driver needs to start the record's current generation.
    async fn launch(&self, sandbox: &Sandbox) -> Result<Launch, DriverError> {
        let mut credentials = BTreeMap::new();
        for name in &sandbox.providers {
            match self.inner.store.provider(name).await {
                Ok(Some(p)) => credentials.extend(p.credentials),
                Ok(None) => warn!(sandbox = %sandbox.name, provider = %name, "an attached provider is gone"),
                Err(e) => return Err(DriverError::Unavailable(format!("reading provider {name}: {e}"))),
            }
        }
        let identity = RuntimeIdentity { sandbox: sandbox.id.clone(), generation: sandbox.generation };
        Ok(Launch {
            sandbox: sandbox.id.clone(),
            name: sandbox.name.clone(),
            generation: sandbox.generation,
            spec: sandbox.spec.clone(),
            credentials,
            token: derive_token(&self.inner.key, &identity),
        })
    }
}

fn command_name(request: &Request) -> &'static str {
    use berth_core::Command;
    match request.command {
        Command::CreateSandbox { .. } => "CreateSandbox",
        Command::StopSandbox { .. } => "StopSandbox",
        Command::StartSandbox { .. } => "StartSandbox",
        Command::DeleteSandbox { .. } => "DeleteSandbox",
        Command::AttachProvider { .. } => "AttachProvider",
        Command::DetachProvider { .. } => "DetachProvider",
        Command::CreateProvider { .. } => "CreateProvider",
        Command::DeleteProvider { .. } => "DeleteProvider",
    }
}
