//! Executing berth-core's exec rules (DESIGN 8.1): admission, reports, cancels and settling,
//! each a conditional write re-decided after a conflict, and carrying execs to the supervisor
//! session of the run they were admitted for.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_core::cas::Retry;
use berth_core::exec::{self, Exec, ExecId, ExecSpec, Report};
use berth_core::identity::RuntimeIdentity;
use berth_core::{Decision, Kind, PhaseKind, Sandbox, SandboxId, Timestamp};
use berth_drivers::env::{self, RunEnv};
use berth_drivers::logs::{Log, Read};
use berth_proto::v1 as pb;
use berth_proto::v1::gateway_message::Message as ToSupervisor;
use tracing::warn;

use super::Engine;
use super::transact::{Run, Transaction};
use crate::error::ApiError;
use crate::sessions::{Session, Sessions};
use crate::store::{Page, PageRequest};

/// How often every open exec is looked at, for runs that ended through another gateway.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// How often a waiter for an exec's end reads it afresh: its end may be committed by another
/// gateway, whose writes this one is not told of.
const REREAD: Duration = Duration::from_millis(500);

/// The message that has a supervisor run `exec` (or, cancelled first, only report it so), with
/// `env` (berth-drivers' `env::exec`).
fn run_message(exec: &Exec, env: RunEnv) -> pb::RunExec {
    pb::RunExec {
        exec_id: exec.id.to_string(),
        argv: exec.spec.argv.clone(),
        env: env.expose(),
        cwd: exec.spec.cwd.clone(),
        tty: exec.spec.tty,
        stdin: exec.spec.stdin,
        timeout_ms: exec.spec.timeout_ms,
        window: None,
        cancelled: exec.cancel_requested,
        read: None,
    }
}

/// What the exec API and the supervisor sessions ask of execs, and the sweep that keeps E3.
#[derive(Clone)]
pub struct Execs {
    engine: Engine,
}

impl Execs {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// What a supervisor is told to run `exec` with: its environment by the drivers' rule, from
    /// the sandbox as stored now and the providers attached now.
    pub async fn exec_run(&self, exec: &Exec) -> Result<pb::RunExec, ApiError> {
        let mut spec = BTreeMap::new();
        let mut credentials = BTreeMap::new();
        if let Some(sandbox) = self.engine.inner.store.sandbox(&exec.sandbox).await? {
            spec.clone_from(&sandbox.spec.env);
            for name in sandbox.providers.iter() {
                if let Some(p) = self.engine.inner.store.provider(name).await? {
                    credentials.extend(p.credentials);
                }
            }
        }
        Ok(run_message(exec, env::exec(&spec, &credentials, &exec.spec.env)))
    }

    pub fn sessions(&self) -> &Sessions {
        self.engine.sessions()
    }

    /// How often a session hands its run the execs still open for it: ones admitted through
    /// another gateway sharing the store, and ones whose hand-over went to a session that had
    /// already broken (the admission found it open, the message went nowhere). Even one
    /// gateway needs this: the simulator found an exec left Admitted for good that way
    /// (seeds 559 and 657 with `--execs`).
    pub fn resume_every(&self) -> Duration {
        SWEEP_EVERY
    }

    /// Up to about `max` bytes of `exec`'s output from `from`, as its supervisor kept it on the
    /// sandbox's host. `over`: the exec has ended.
    pub async fn read_output(&self, exec: &Exec, from: u64, max: usize, over: bool) -> Result<Read, ApiError> {
        let log = Log::Exec { generation: exec.generation, id: exec.id.to_string() };
        Ok(self.engine.inner.driver.logs(&exec.sandbox, &log, from, max, over).await?)
    }

    /// A fresh exec id: 64 random bits.
    pub fn new_id(&self) -> ExecId {
        ExecId::parse("exec_id", &format!("ex-{:016x}", self.engine.random())).expect("a generated id is well formed")
    }

    /// Admits exec `id` in the sandbox named `name`, or finds it (a retry). Its run is handed
    /// it by whoever reads its output first, or by the next session of that run to open.
    pub async fn admit(&self, name: &str, id: &ExecId, spec: &ExecSpec) -> Result<Exec, ApiError> {
        let retry = Retry::new(self.engine.inner.settings.retry, Kind::Exec, id.as_str());
        let decision =
            self.engine.transact(&Admit { name, id, spec }, Run { locks: BTreeSet::new(), retry, read: None }).await?;
        Ok(decision.exec().expect("an admission decides on an exec").clone())
    }

    /// Applies `rule` (one of core's exec rules) to the exec as stored, with its sandbox as
    /// stored, until it commits or has nothing to change. The exec as it then stands, if it
    /// exists.
    async fn change_exec<F>(
        &self,
        sandbox: &SandboxId,
        id: &ExecId,
        what: &'static str,
        rule: F,
    ) -> Result<Option<Exec>, ApiError>
    where
        F: Fn(&Exec, Option<&Sandbox>, Timestamp) -> Decision + Sync,
    {
        let retry = Retry::new(self.engine.inner.settings.retry, Kind::Exec, id.as_str());
        let change = ChangeExec { sandbox, id, what, rule };
        let decision = self.engine.transact(&change, Run { locks: BTreeSet::new(), retry, read: None }).await?;
        Ok(decision.exec().cloned())
    }

    /// What the run `identity` reports of one of its execs.
    pub async fn report(&self, identity: &RuntimeIdentity, id: &ExecId, report: &Report) -> Result<(), ApiError> {
        let generation = identity.generation;
        self.change_exec(&identity.sandbox, id, "ExecReport", |e, s, now| exec::report(e, s, generation, report, now))
            .await?;
        Ok(())
    }

    /// The exec `id` of the sandbox named `name`.
    pub async fn find(&self, name: &str, id: &ExecId) -> Result<(Sandbox, Exec), ApiError> {
        berth_core::validate::dns_label("sandbox", name)?;
        let sandbox = self.engine.sandbox_named(name).await?;
        let exec = self.get(&sandbox.id, id).await?.ok_or_else(|| not_found(id))?;
        Ok((sandbox, exec))
    }

    /// The exec `id` of sandbox `sandbox` as stored now.
    pub async fn get(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, ApiError> {
        Ok(self.engine.inner.store.exec(sandbox, id).await?)
    }

    /// A page of the execs of the sandbox named `name`.
    pub async fn list(&self, name: &str, page: &PageRequest) -> Result<Page<Exec>, ApiError> {
        let sandbox = self.engine.sandbox_named(name).await?;
        Ok(self.engine.inner.store.list_execs(&sandbox.id, page).await?)
    }

    /// Commits a cancel and has the run carry it out.
    pub async fn cancel(&self, name: &str, id: &ExecId) -> Result<Exec, ApiError> {
        let (sandbox, _) = self.find(name, id).await?;
        let exec = self
            .change_exec(&sandbox.id, id, "CancelExec", |e, _, now| exec::cancel(e, now))
            .await?
            .ok_or_else(|| not_found(id))?;
        if !exec.state.is_terminal()
            && let Some(session) = self.sessions().get(&exec.sandbox, exec.generation)
        {
            session.send(ToSupervisor::CancelExec(pb::CancelExec { exec_id: id.to_string() })).await;
        }
        Ok(exec)
    }

    /// Ends every open exec whose run is over (E3): of one sandbox, or of all.
    async fn settle(&self, only: Option<&SandboxId>) -> Result<(), ApiError> {
        for open in self.engine.inner.store.open_execs(only).await? {
            if let Err(e) = self.change_exec(&open.sandbox, &open.id, "SettleExec", exec::settle).await {
                warn!(sandbox = %open.sandbox, exec = %open.id, error = %e, "cannot settle an exec; the next sweep will");
            }
        }
        Ok(())
    }

    /// A new session: every open exec of its run is handed to it again, cancelled ones with
    /// their cancel, so that nothing admitted while no session was here, or whose report was
    /// lost with a connection, is left waiting.
    pub async fn resume(&self, session: &Session) -> Result<(), ApiError> {
        for open in self.engine.inner.store.open_execs(Some(&session.sandbox)).await? {
            if open.generation != session.generation {
                continue;
            }
            if !session.send(ToSupervisor::RunExec(self.exec_run(&open).await?)).await {
                break;
            }
            if open.cancel_requested {
                session.send(ToSupervisor::CancelExec(pb::CancelExec { exec_id: open.id.to_string() })).await;
            }
        }
        Ok(())
    }

    /// The exec as it finally stands. An exec removed with its sandbox ended as the sweep would
    /// have ended it.
    pub async fn final_state(&self, last: &Exec) -> Result<Exec, ApiError> {
        match self.exec_ended(&last.sandbox, &last.id).await {
            Err(ApiError::Core(berth_core::Error::NotFound { .. })) => {
                Ok(exec::settle(last, None, self.engine.now()).exec().map_or_else(|| last.clone(), Exec::clone))
            }
            ended => ended,
        }
    }

    /// The exec once it is terminal: it always becomes so (E3), by its run's report or by the
    /// sweep once the run is over. Neither comes to a gateway shutting down (its sessions and
    /// its sweep end), so then it is [`ApiError::ShuttingDown`], unless it is terminal already.
    async fn exec_ended(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Exec, ApiError> {
        let mut changes = self.engine.inner.exec_changes.subscribe();
        loop {
            changes.borrow_and_update();
            let exec = self.get(sandbox, id).await?.ok_or_else(|| not_found(id))?;
            if exec.state.is_terminal() {
                return Ok(exec);
            }
            tokio::select! {
                biased;
                () = self.engine.shutdown().begun() => return Err(ApiError::ShuttingDown),
                _ = tokio::time::timeout(REREAD, changes.changed()) => {}
            }
        }
    }

    /// Keeps E3 for as long as the gateway runs: the execs of a run that is over are ended at
    /// once for a change made here, and within [`SWEEP_EVERY`] for one made elsewhere.
    pub async fn settle_forever(self) {
        let mut changes = self.engine.subscribe();
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            let only = tokio::select! {
                biased;
                () = self.engine.shutdown().begun() => return,
                change = changes.recv() => match change {
                    Ok(change) if change.sandbox.as_ref().is_some_and(|s| s.phase.kind() == PhaseKind::Ready) => continue,
                    Ok(change) => Some(change.id),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                _ = sweep.tick() => None,
            };
            if let Err(e) = self.settle(only.as_ref()).await {
                warn!(error = %e, "cannot read the open execs; the next sweep will");
            }
        }
    }
}

fn not_found(id: &ExecId) -> berth_core::Error {
    berth_core::Error::NotFound { kind: Kind::Exec, name: id.to_string() }
}

/// An exec's admission: decided on the sandbox it names and the exec of that id, if any.
struct Admit<'a> {
    name: &'a str,
    id: &'a ExecId,
    spec: &'a ExecSpec,
}

impl Transaction for Admit<'_> {
    type Read = (Option<Sandbox>, Option<Exec>);

    fn what(&self) -> &'static str {
        "Exec"
    }

    async fn read(&self, engine: &Engine) -> Result<Self::Read, ApiError> {
        let store = &engine.inner.store;
        let sandbox = store.sandbox_by_name(self.name).await?;
        let existing = match &sandbox {
            Some(s) => store.exec(&s.id, self.id).await?,
            None => None,
        };
        Ok((sandbox, existing))
    }

    fn decide(&self, (sandbox, existing): &Self::Read, now: Timestamp) -> Result<Decision, berth_core::Error> {
        exec::admit(self.name, self.id, self.spec, sandbox.as_ref(), existing.as_ref(), now)
    }

    fn before<'r>(&self, (sandbox, _): &'r Self::Read) -> Option<&'r Sandbox> {
        sandbox.as_ref()
    }
}

/// One of core's exec rules applied to an exec as stored: decided on the exec and its sandbox.
struct ChangeExec<'a, F> {
    sandbox: &'a SandboxId,
    id: &'a ExecId,
    what: &'static str,
    rule: F,
}

impl<F> Transaction for ChangeExec<'_, F>
where
    F: Fn(&Exec, Option<&Sandbox>, Timestamp) -> Decision + Sync,
{
    type Read = Option<(Exec, Option<Sandbox>)>;

    fn what(&self) -> &'static str {
        self.what
    }

    async fn read(&self, engine: &Engine) -> Result<Self::Read, ApiError> {
        let store = &engine.inner.store;
        let Some(exec) = store.exec(self.sandbox, self.id).await? else { return Ok(None) };
        Ok(Some((exec, store.sandbox(self.sandbox).await?)))
    }

    fn decide(&self, read: &Self::Read, now: Timestamp) -> Result<Decision, berth_core::Error> {
        Ok(match read {
            Some((exec, sandbox)) => (self.rule)(exec, sandbox.as_ref(), now),
            None => Decision::gone(),
        })
    }

    fn before<'r>(&self, read: &'r Self::Read) -> Option<&'r Sandbox> {
        read.as_ref().and_then(|(_, sandbox)| sandbox.as_ref())
    }
}
