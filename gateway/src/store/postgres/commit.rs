//! How a commit runs on PostgreSQL: a lone write as its statement alone, otherwise the whole
//! plan as one transaction whose conditions come first; a transaction PostgreSQL aborted (a
//! deadlock, a name taken in between) is run again, a few times at most.

use berth_core::Write;
use deadpool_postgres::{GenericClient, Object};

use super::connection::retryable;
use super::statement::{Role, apply, conflict_in, lean_update, plan, refs};
use super::{ATTEMPTS, PostgresStore};
use crate::store::{CommitError, StoreError};

impl PostgresStore {
    /// A commit's attempts: PostgreSQL may abort a transaction for a reason that passes. A lone
    /// write is first tried as its statement alone, atomic as it stands: one round trip, no
    /// transaction around it (and, for an update that leaves its providers and labels alone, no
    /// index table touched). Should it change nothing, the attempts after it run the whole plan,
    /// whose conditions say why.
    pub(super) async fn run_commit(&self, client: &Object, writes: &[Write]) -> Result<(), CommitError> {
        if let [write] = writes
            && let Some(()) = self.try_alone(client, write).await?
        {
            return Ok(());
        }
        for _ in 1..ATTEMPTS {
            if let Some(()) = self.try_commit(client, writes).await? {
                return Ok(());
            }
        }
        match self.try_commit(client, writes).await? {
            Some(()) => Ok(()),
            None => Err(StoreError::Unavailable(format!(
                "postgres {}: the transaction was aborted {ATTEMPTS} times by concurrent ones",
                self.target
            ))
            .into()),
        }
    }

    /// One attempt at a lone write, outside a transaction; `Ok(None)` when it changed nothing or
    /// was aborted.
    async fn try_alone(&self, client: &Object, write: &Write) -> Result<Option<()>, CommitError> {
        let statement = match write {
            Write::UpdateSandbox { record, expected } => lean_update(record, *expected)?,
            write => apply(write)?,
        };
        let prepared = client.prepare_cached(&statement.sql).await.map_err(|e| self.error(&e))?;
        match client.query(&prepared, &refs(&statement.args)).await {
            Ok(_) => Ok(Some(())),
            Err(e) if retryable(&e) => Ok(None),
            // Without a code, the connection failed: the write may have landed, as after any
            // timeout.
            Err(e) => Err(self.error(&e).into()),
        }
    }

    /// One attempt at a transaction; `Ok(None)` when PostgreSQL aborted it and it may be run again.
    async fn try_commit(&self, client: &Object, writes: &[Write]) -> Result<Option<()>, CommitError> {
        let plan = plan(writes)?;
        let e = |e: tokio_postgres::Error| CommitError::from(self.error(&e));
        // Prepared first (from the connection's cache but for the first use of each), outside the
        // transaction: a statement still being prepared would be sent after the ones behind it.
        let mut prepared = Vec::with_capacity(plan.len());
        for statement in &plan {
            prepared.push(client.prepare_cached(&statement.sql).await.map_err(e)?);
        }
        // BEGIN on its own: were it sent with the rest and failed, the rest would each commit.
        client.batch_execute("BEGIN").await.map_err(e)?;
        // `join_all` polls its futures first in order, and each sends its query on its first poll.
        let args: Vec<_> = plan.iter().map(|statement| refs(&statement.args)).collect();
        let answers = futures_util::future::join_all(prepared.iter().zip(&args).map(|(p, args)| client.query(p, args)));
        // Every answer is read before any is looked at: the connection is then idle again.
        let answers = answers.await;
        let Some((statement, first)) =
            plan.iter().zip(&answers).find_map(|(statement, answer)| Some((statement, answer.as_ref().err()?)))
        else {
            // The COMMIT, last, succeeded with nothing before it failed: the transaction landed.
            return Ok(Some(()));
        };
        if first.code().is_none() {
            // The connection failed, perhaps after the COMMIT was sent: the transaction may have
            // landed, as after any timeout.
            return Err(self.error(first).into());
        }
        // A statement failed, so the COMMIT rolled back, and every one after it failed unrun. The
        // conditions come first, in the order of the writes: the first to fail is the conflict.
        if let Some(conflict) = conflict_in(statement.role, first, writes)? {
            return Err(CommitError::Conflict(conflict));
        }
        // Every condition held, and a write still changed nothing or found its name taken: by
        // the commit itself (a create's `ON CONFLICT DO NOTHING` answers `UNCHANGED`, an update
        // a unique violation), which every attempt would find again,
        if matches!(statement.role, Role::Apply)
            && let Some(conflict) = crate::store::one_name_twice(writes)
        {
            return Err(CommitError::Conflict(conflict));
        }
        // or by another transaction that committed in between (or a write found its record
        // changed), which the next attempt's conditions see.
        if retryable(first) { Ok(None) } else { Err(self.error(first).into()) }
    }
}
