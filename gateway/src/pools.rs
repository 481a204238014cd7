//! Warm pools (DESIGN 9.4), kept by the reconcile lease holder.
//!
//! After every read of the records (`reconcile::feed_loop`), and at once when a claim through this gateway
//! took a member or found none, each template's pool is brought back to its size: members that
//! failed with no restart coming, and members of templates that are gone, are deleted (each
//! delete conditional on the member's version, so one claimed or restarted meanwhile is left
//! alone), and members are made one fill at a time, each decided by berth-core on the members
//! the store holds then. A fill never makes a pool larger than its size, and a failing member
//! counts until its delete completes: refills never run ahead of deletions.

use std::collections::BTreeMap;

use berth_core::template::{POOL_LABEL, Template, is_member, spent};
use berth_core::{Command, Outcome, PhaseKind, Request, Sandbox};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::engine::Engine;
use crate::error::ApiError;
use crate::store::PageRequest;

/// What one refill did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refill {
    pub made: usize,
    pub deleted: usize,
}

/// The lease holder's pool loop: refills after every batch of `records` it reads, and
/// whenever a claim here asks, until its tenure ends (the task is aborted).
pub async fn pools_loop(engine: Engine, mut records: mpsc::Receiver<Vec<Sandbox>>) {
    let mut last: Vec<Sandbox> = Vec::new();
    loop {
        // Biased, as every select the simulator runs (DESIGN 5: no ambient randomness).
        tokio::select! {
            biased;
            batch = records.recv() => match batch {
                Some(batch) => last = batch,
                None => return,
            },
            () = engine.refill_wanted() => {}
        }
        match refill(&engine, &last).await {
            Ok(done) if done != Refill::default() => debug!(?done, "pools refilled"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot refill the pools; the next sweep retries"),
        }
    }
}

/// Brings every template's pool back to its size. `records` are the sandboxes the holder read
/// (perhaps a while ago): they say which members to replace; what to make is decided afresh.
pub async fn refill(engine: &Engine, records: &[Sandbox]) -> Result<Refill, ApiError> {
    let templates = all_templates(engine).await?;
    let mut done = Refill::default();
    let mut live: BTreeMap<&str, Vec<&Sandbox>> = BTreeMap::new();
    for member in records.iter().filter(|s| s.spec.labels.contains_key(POOL_LABEL)) {
        let template = member.spec.labels.get(POOL_LABEL).and_then(|t| templates.get(t));
        let why = match template {
            None => Some(Gone::Orphan),
            Some(_) if spent(member) => Some(Gone::Spent),
            Some(t) => {
                if member.phase.kind() != PhaseKind::Deleting {
                    live.entry(t.name.as_str()).or_default().push(member);
                }
                None
            }
        };
        if let Some(why) = why
            && delete_member(engine, member, why).await
        {
            done.deleted += 1;
        }
    }
    // A pool made smaller: the members past its size go, those not Ready first.
    for (name, mut members) in live {
        let size = templates.get(name).map_or(0, |t| t.min_ready as usize);
        members.sort_by_key(|s| (s.phase.kind() == PhaseKind::Ready, std::cmp::Reverse(s.name.clone())));
        for member in members.iter().take(members.len().saturating_sub(size)) {
            if delete_member(engine, member, Gone::Excess).await {
                done.deleted += 1;
            }
        }
    }
    for template in templates.values() {
        done.made += fill(engine, template).await?;
    }
    Ok(done)
}

/// Why a pool member is deleted.
#[derive(Clone, Copy, Debug)]
enum Gone {
    Orphan,
    Spent,
    Excess,
}

/// Deletes a member if it is still as it was read; whether it did.
async fn delete_member(engine: &Engine, member: &Sandbox, why: Gone) -> bool {
    let delete = Request::new(Command::DeleteSandbox { name: member.name.to_string() }, Some(member.resource_version));
    match engine.execute(&delete).await {
        Ok(_) => {
            let why = match why {
                Gone::Orphan => "its template is gone",
                Gone::Spent => "it failed and no restart is coming",
                Gone::Excess => "the pool was made smaller",
            };
            info!(sandbox = %member.name, id = %member.id, why, "deleting a pool member");
            true
        }
        // Changed since the sweep read it (claimed, restarted, deleted): left alone.
        Err(e) => {
            debug!(sandbox = %member.name, error = %e, "a pool member changed since it was read; left as it is");
            false
        }
    }
}

/// Fills `template`'s pool up to its size; how many members it made.
async fn fill(engine: &Engine, template: &Template) -> Result<usize, ApiError> {
    let mut made = 0;
    // Each fill makes one member or decides the pool is full; the bound only guards a store
    // that keeps failing to show what was made.
    for _ in 0..=template.min_ready {
        let command = Command::FillPool {
            template: template.name.clone(),
            id: engine.new_sandbox_id(),
            name: format!("{}-{:08x}", template.name, engine.random() as u32),
        };
        match engine.execute(&Request::new(command, None)).await? {
            Outcome::Sandbox(member) if is_member(&member, &template.name) => {
                info!(template = %template.name, sandbox = %member.name, id = %member.id, "made a pool member");
                made += 1;
            }
            _ => break,
        }
    }
    Ok(made)
}

async fn all_templates(engine: &Engine) -> Result<BTreeMap<String, Template>, ApiError> {
    let mut templates = BTreeMap::new();
    let mut page = PageRequest { after: None, limit: 500 };
    loop {
        let batch = engine.store().list_templates(&page).await?;
        templates.extend(batch.items.into_iter().map(|t| (t.name.clone(), t)));
        match batch.next {
            Some(next) => page.after = Some(next),
            None => return Ok(templates),
        }
    }
}
