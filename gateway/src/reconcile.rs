//! Reconcile (DESIGN 3.6): what the runtime shows, merged into the records, continuously.
//!
//! A node reconciles its own runtime, under its node's lease (DESIGN 14): only the sandboxes
//! placed on it are its to drive, and a run of its runtime the store places elsewhere is removed.
//!
//! - Recovery, when the node's lease is taken, re-drives every unconfirmed transition with its
//!   committed generation.
//! - The watch loop consumes the driver's event stream, its initial sync merged like any other
//!   observation, and reconnects with jittered backoff when it ends.
//! - The poll loop sweeps on an interval: every record (paged, no cap) and everything the
//!   runtime lists (paged), re-driving transitions that waited too long.
//! - The follow loop carries out what other gateways decided, from the store's change log.
//! - Recovery and sweeps go over the snapshots and volumes too ([`snapshots`]).
//!
//! The store-wide work (timers, pools, fencing) is the reconcile lease holder's, fed by
//! [`feed_loop`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_core::snapshot::{self, SNAPSHOT_LABEL};
use berth_core::{
    Command, Observation, Request, RuntimeSource, RuntimeState, Sandbox, SandboxId, SnapshotId, VolumeId, VolumePhase,
    recovery, volume,
};
use berth_drivers::WatchEvent;
use futures_util::StreamExt;
use tracing::{debug, info, warn};

use crate::engine::Engine;
use crate::error::ApiError;
use crate::store::PageRequest;

#[derive(Clone, Debug)]
pub struct ReconcileSettings {
    /// Time between two polls of the whole runtime.
    pub poll_interval: Duration,
    /// A transition left unconfirmed this long since its last write is re-driven by a sweep.
    pub redrive_after: Duration,
    /// Records and runtime entries read per page.
    pub page_size: usize,
    /// The longest wait between two attempts to reopen the runtime's event stream.
    pub max_watch_backoff: Duration,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(10),
            redrive_after: Duration::from_secs(30),
            page_size: 500,
            max_watch_backoff: Duration::from_secs(10),
        }
    }
}

/// What one sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    pub records: usize,
    pub runtime: usize,
    pub redriven: usize,
}

/// Re-drives every unconfirmed transition of the sandboxes this node runs, once, when it takes
/// its node's lease.
pub async fn recover(engine: &Engine, page_size: usize) -> Result<usize, ApiError> {
    let mut redriven = 0;
    let mut page = PageRequest { after: None, limit: page_size };
    loop {
        let batch = engine.store().list_sandboxes(&page, &BTreeMap::new()).await?;
        for sandbox in batch.items.iter().filter(|s| engine.runs_here(s)) {
            if let Some(effect) = recovery::unfinished(sandbox) {
                info!(sandbox = %sandbox.name, id = %sandbox.id, generation = sandbox.generation, phase = %sandbox.phase, ?effect, "recovery re-drives an unfinished transition");
                engine.dispatch(&[effect]);
                redriven += 1;
            }
        }
        match batch.next {
            Some(next) => page.after = Some(next),
            None => return Ok(redriven + snapshots_or_warn(engine, None).await),
        }
    }
}

/// [`snapshots`] and [`volumes`], whose failure leaves the sandboxes' part of a sweep or
/// recovery standing: the next sweep tries again.
async fn snapshots_or_warn(engine: &Engine, min_age: Option<Duration>) -> usize {
    let snapshots = snapshots(engine, min_age).await.unwrap_or_else(|e| {
        warn!(error = %e, "cannot go over the snapshots; the next sweep tries again");
        0
    });
    let volumes = volumes(engine, min_age).await.unwrap_or_else(|e| {
        warn!(error = %e, "cannot go over the volumes; the next sweep tries again");
        0
    });
    snapshots + volumes
}

/// The volumes' part of recovery (`min_age` none) and of every sweep: asks for the removal of
/// each volume being deleted that no sandbox record mounts any more, and removes what the
/// runtime keeps of a volume without a record. The runtime is listed before the records: a
/// volume's files are only made for a record committed before them.
pub async fn volumes(engine: &Engine, min_age: Option<Duration>) -> Result<usize, ApiError> {
    // A runtime that cannot list them leaves the removals owed still to be asked for.
    let kept = engine.driver().volumes().await.inspect_err(|e| warn!(error = %e, "cannot list the runtime's volumes"));
    let records = engine.store().all_volumes().await?;
    let now = engine.now();
    let mut redriven = 0;
    for record in records.iter().filter(|v| v.phase == VolumePhase::Deleting) {
        let users = engine.store().sandboxes_mounting(record).await?;
        let effect = match min_age {
            Some(min_age) => volume::due(record, &users, now, min_age),
            None => volume::unfinished(record, &users),
        };
        if let Some(effect) = effect {
            info!(volume = %record.name, id = %record.id, ?effect, "the removal of a deleted volume is driven");
            engine.dispatch(&[effect]);
            redriven += 1;
        }
    }
    let known: BTreeSet<&VolumeId> = records.iter().map(|v| &v.id).collect();
    for id in kept.iter().flatten().filter(|id| !known.contains(id)) {
        info!(volume = %id, "removing what the runtime keeps of a volume without a record");
        engine.driver().remove_volume(id).await?;
    }
    Ok(redriven)
}

/// The snapshots' part of recovery (`min_age` none: every unconfirmed step) and of every sweep
/// (steps unconfirmed for `min_age`): re-drives their copies and removals, deletes the
/// snapshots of forks that are done with them, and removes what the runtime keeps of a
/// snapshot that has no record (a removal that raced a copy through another gateway). The
/// runtime is listed before the records: a copy is only ever made for a record committed
/// before it, so no copy being made is taken for one without a record.
pub async fn snapshots(engine: &Engine, min_age: Option<Duration>) -> Result<usize, ApiError> {
    let kept = engine.driver().snapshots().await?;
    let records = engine.store().all_snapshots().await?;
    let now = engine.now();
    let mut redriven = 0;
    for record in &records {
        let effect = match min_age {
            Some(min_age) => snapshot::due(record, now, min_age),
            None => snapshot::unfinished(record),
        };
        if let Some(effect) = effect {
            info!(snapshot = %record.name, id = %record.id, phase = record.phase.name(), ?effect, "recovery re-drives an unfinished snapshot step");
            engine.dispatch(&[effect]);
            redriven += 1;
        }
        if record.fork.is_some() {
            let users = engine
                .store()
                .all_sandboxes(&BTreeMap::from([(SNAPSHOT_LABEL.to_string(), record.name.clone())]))
                .await?;
            if snapshot::spent_fork(record, &users) {
                let delete = Request::new(Command::DeleteSnapshot { name: record.name.clone() }, None);
                if let Err(e) = engine.execute(&delete).await {
                    debug!(snapshot = %record.name, error = %e, "a fork's spent snapshot is not deleted yet");
                }
            }
        }
    }
    let known: BTreeSet<&SnapshotId> = records.iter().map(|s| &s.id).collect();
    for id in kept.iter().filter(|id| !known.contains(id)) {
        info!(snapshot = %id, "removing what the runtime keeps of a snapshot without a record");
        engine.driver().remove_snapshot(id).await?;
    }
    Ok(redriven)
}

/// Consumes the runtime's event stream forever, reconnecting with backoff.
pub async fn watch_loop(engine: Engine, settings: ReconcileSettings) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match engine.driver().watch().await {
            Ok(mut stream) => {
                while let Some(item) = stream.next().await {
                    let (sandbox, state, source) = match item {
                        Ok(WatchEvent::Sync { sandbox, state }) => (sandbox, state, RuntimeSource::InitialSync),
                        Ok(WatchEvent::Changed { sandbox, state }) => (sandbox, state, RuntimeSource::WatchEvent),
                        Ok(WatchEvent::Synced) => {
                            backoff = Duration::from_millis(100);
                            continue;
                        }
                        Err(e) => {
                            warn!(error = %e, "the runtime's event stream failed");
                            break;
                        }
                    };
                    let observation = Observation::Runtime { source, state, as_of_version: None };
                    match engine.store().sandbox(&sandbox).await {
                        Ok(record) => report(&engine, &sandbox, &observation, record).await,
                        Err(e) => warn!(sandbox = %sandbox, error = %e, "cannot read the record of a watch event"),
                    }
                }
                debug!("the runtime's event stream ended; reopening");
            }
            Err(e) => warn!(error = %e, "cannot open the runtime's event stream"),
        }
        // Full jitter: reconnecting gateways do not stampede the runtime.
        let wait = backoff.mul_f64((engine.random() % 1000) as f64 / 1000.0);
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(settings.max_watch_backoff);
    }
}

/// Where the lease holder's record reads go: its timers, pools and fencing, which work from them
/// rather than reading every record again.
pub type RecordFeed = tokio::sync::mpsc::Sender<Vec<berth_core::Sandbox>>;

/// Under the reconcile lease: reads every record at once, then every `poll_interval`, and
/// hands them to `feeds` (a loop still busy with the last read gets the next one).
pub async fn feed_loop(engine: Engine, settings: ReconcileSettings, feeds: Vec<RecordFeed>) {
    loop {
        match engine.store().all_sandboxes(&BTreeMap::new()).await {
            Ok(records) => {
                for feed in &feeds {
                    let _ = feed.try_send(records.clone());
                }
            }
            Err(e) => warn!(error = %e, "cannot read the records for the timers and pools; the next read retries"),
        }
        tokio::time::sleep(settings.poll_interval).await;
    }
}

/// Under the node's lease, sweeps this node's runtime forever, every `poll_interval`.
pub async fn poll_loop(engine: Engine, settings: ReconcileSettings) {
    loop {
        tokio::time::sleep(settings.poll_interval).await;
        let began = tokio::time::Instant::now();
        match sweep(&engine, &settings).await {
            Ok(stats) => {
                engine.metrics().swept(began.elapsed());
                debug!(?stats, "reconcile sweep");
            }
            Err(e) => warn!(error = %e, "reconcile sweep failed; the next one retries"),
        }
    }
}

/// How often a node reads the store's change log for what other gateways decided about the
/// sandboxes it runs.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);
/// Change log entries read at a time.
const FOLLOW_BATCH: usize = 256;

/// Under the node's lease: carries out what any gateway decided about the sandboxes this node
/// runs, as the store's change log shows it (a decision made here was dispatched already, and
/// is not queued twice). A stretch of the log trimmed before it was read is left to the sweep.
pub async fn follow_loop(engine: Engine) {
    let mut at = loop {
        match engine.store().changes(0, 0).await {
            Ok(log) => break log.head,
            Err(e) => debug!(error = %e, "cannot read the change log; reading it again"),
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    };
    loop {
        let full = match engine.store().changes(at, FOLLOW_BATCH).await {
            Ok(log) if at < log.trimmed_through => {
                at = log.head;
                false
            }
            Ok(log) => {
                let full = log.entries.len() == FOLLOW_BATCH;
                for entry in log.entries {
                    at = entry.seq;
                    if !entry.removed
                        && engine.runs_here(&entry.sandbox)
                        && let Some(effect) = recovery::unfinished(&entry.sandbox)
                    {
                        engine.dispatch(&[effect]);
                    }
                }
                full
            }
            Err(e) => {
                debug!(error = %e, "cannot read the change log; reading it again");
                false
            }
        };
        if !full {
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    }
}

/// Merges what this node's runtime reports of sandbox `id` (its record `record` as read, `None`
/// to read it under the lock), unless the store places the sandbox on another node: the run
/// here is then one the store no longer places here (its node fenced and the sandbox placed
/// anew), and it is removed, not merged (DESIGN 14, N1). A run of a sandbox placed nowhere, or
/// here under an earlier epoch, is adopted first ([`berth_core::fencing::adopted`]).
async fn report(engine: &Engine, id: &SandboxId, observation: &Observation, mut record: Option<Sandbox>) {
    // A sweep reads its records before the runtime: one read then may predate the sandbox's
    // placement here and the run that followed it. Nothing is removed on such a read.
    if record.as_ref().is_some_and(|r| !engine.runs_here(r)) {
        record = match engine.store().sandbox(id).await {
            Ok(fresh) => fresh,
            Err(e) => {
                return warn!(sandbox = %id, error = %e, "cannot read a sandbox placed elsewhere; the next sweep looks again");
            }
        };
    }
    if let Some(elsewhere) = record.as_ref().filter(|r| !engine.runs_here(r)) {
        // Stopped, not deleted: a delete would leave the sandbox's tombstone here, and the store
        // may place it here again. What is left (its workspace) goes with its delete.
        let runs = matches!(observation, Observation::Runtime { state: RuntimeState::Running { .. }, .. });
        if runs {
            info!(sandbox = %elsewhere.name, id = %id, node = ?elsewhere.placement, "stopping a run the store places on another node");
            if let Err(e) = engine.driver().stop(id, u64::MAX, engine.settings().stop_grace).await {
                warn!(sandbox = %id, error = %e, "cannot stop a run placed elsewhere; the next sweep tries again");
            }
        }
        return;
    }
    let me = &engine.settings().node;
    let adopt = engine
        .node_epoch()
        .zip(record.as_ref())
        .and_then(|(epoch, r)| berth_core::fencing::adopted(r.placement.as_ref(), me, epoch).map(|_| epoch));
    if let Some(epoch) = adopt {
        let held = Observation::Held { node: me.clone(), epoch };
        match engine.observe(id, &held, record.clone()).await {
            // The record read again below: the adoption wrote a newer version.
            Ok(_) => record = None,
            Err(e) => warn!(sandbox = %id, error = %e, "cannot adopt a run; the next sweep tries again"),
        }
    }
    if let Err(e) = engine.observe(id, observation, record).await {
        warn!(sandbox = %id, error = %e, "cannot merge what the runtime reports");
    }
}

/// One sweep of this node's runtime: the records of the sandboxes it runs first (their
/// versions fence what the runtime then says of absence), then everything the runtime lists,
/// then absence for what it did not list.
pub async fn sweep(engine: &Engine, settings: &ReconcileSettings) -> Result<SweepStats, ApiError> {
    let mut stats = SweepStats::default();
    let now = engine.now();
    let mut records = BTreeMap::new();
    let mut elsewhere = BTreeMap::new();
    let mut page = PageRequest { after: None, limit: settings.page_size };
    loop {
        let batch = engine.store().list_sandboxes(&page, &BTreeMap::new()).await?;
        for sandbox in batch.items {
            if !engine.runs_here(&sandbox) {
                elsewhere.insert(sandbox.id.clone(), sandbox);
                continue;
            }
            if let Some(effect) = recovery::due(&sandbox, now, settings.redrive_after) {
                engine.dispatch(&[effect]);
                stats.redriven += 1;
            }
            records.insert(sandbox.id.clone(), sandbox);
        }
        match batch.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    stats.records = records.len();

    let mut listed = BTreeSet::new();
    let mut after: Option<SandboxId> = None;
    loop {
        let batch = engine.driver().list(after.as_ref(), settings.page_size).await?;
        if berth_core::bug!(SweepSkipsLastPage) && batch.next.is_none() && after.is_some() {
            break;
        }
        for (id, state) in batch.items {
            let observation = Observation::Runtime { source: RuntimeSource::PollList, state, as_of_version: None };
            let known = records.get(&id).or_else(|| elsewhere.get(&id)).cloned();
            report(engine, &id, &observation, known).await;
            listed.insert(id);
            stats.runtime += 1;
        }
        match batch.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }

    for (id, sandbox) in records {
        if listed.contains(&id) {
            continue;
        }
        let observation = Observation::Runtime {
            source: RuntimeSource::PollList,
            state: RuntimeState::Absent { at: None },
            as_of_version: Some(sandbox.resource_version),
        };
        if let Err(e) = engine.observe(&id, &observation, Some(sandbox)).await {
            warn!(sandbox = %id, error = %e, "cannot merge an absence");
        }
    }
    stats.redriven += snapshots_or_warn(engine, Some(settings.redrive_after)).await;
    Ok(stats)
}
