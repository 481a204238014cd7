//! The reconcile lease: several gateways may serve one store, and every one of them serves both
//! APIs, but only the lease's holder runs the store-wide loops, the timers, pools and fencing
//! (DESIGN 3.6, 9, 14); each node's runtime is reconciled by its node lease's holder ([`crate::node`]). The lease lives in the store, with a time-to-live on the store's clock; its
//! holder renews it, another gateway takes it over once it lapses, and a gateway shutting down
//! gives it up.
//!
//! A deposed holder that has not noticed yet is harmless: every decision is committed before
//! its effects run, so all it can still do is repeat an idempotent effect of a committed intent
//! (a start of the committed generation, a stop, a delete), and every report it merges goes
//! through the same conditional write as anyone else's. It also stops on its own, whether or
//! not the store answers, once nine tenths of the lease's time-to-live have passed since it last
//! asked for it, on its own clock: before the store would let another gateway in. Those rules
//! are berth-core's ([`berth_core::lease`]); this is the tokio code that keeps them, for the
//! reconcile lease and for a node's ([`crate::node`]) alike.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use berth_core::lease::{next_ask, reliable, relied_until};

use crate::engine::Engine;
use crate::reconcile::{self, ReconcileSettings};
use crate::store::{Lease, StoreError};
use crate::{fencing, pools, timers};

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// This gateway's name in the lease: unique among the gateways sharing a store.
    pub holder: String,
    /// How long the lease lasts without a renewal; renewed every third of it.
    pub ttl: Duration,
}

/// The reconcile loops this gateway runs while it holds the lease.
/// What a holder of a lease runs while it holds it: stopped when the lease ends.
pub(crate) struct Tenure {
    term: u64,
    tasks: Vec<JoinHandle<()>>,
}

impl Tenure {
    pub(crate) fn new(term: u64, tasks: Vec<JoinHandle<()>>) -> Self {
        Self { term, tasks }
    }

    /// The reconcile lease's: the timers, pools and fencing, fed every record by one reader.
    fn store_wide(engine: &Engine, settings: &ReconcileSettings, term: u64) -> Self {
        let (timers_feed, timers_records) = tokio::sync::mpsc::channel(1);
        let (pools_feed, pools_records) = tokio::sync::mpsc::channel(1);
        let (fencing_feed, fencing_records) = tokio::sync::mpsc::channel(1);
        let feeds = vec![timers_feed, pools_feed, fencing_feed];
        let feed = tokio::spawn(reconcile::feed_loop(engine.clone(), settings.clone(), feeds));
        let timers = tokio::spawn(timers::timers_loop(engine.clone(), timers_records));
        let pools = tokio::spawn(pools::pools_loop(engine.clone(), pools_records));
        let grace = engine.settings().node_wait;
        let fencing = tokio::spawn(fencing::fencing_loop(engine.clone(), fencing_records, grace));
        Self::new(term, vec![feed, timers, pools, fencing])
    }

    pub(crate) fn end(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

pub(crate) type Asking = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Lease, StoreError>> + Send>>;

/// What a lease is kept for: how it is asked for and given up, and what runs while it is held.
/// The reconcile lease's tenant runs recovery and the reconcile loops; a node's
/// (`crate::node`) says which epoch the node holds.
#[async_trait]
pub(crate) trait Tenant: Send {
    /// The lease, for the log: "the reconcile lease", "node n1's lease".
    fn lease(&self) -> String;
    /// Takes or renews the lease for its holder. The request owns what it needs: the tenure
    /// may end while it waits for the store.
    fn ask(&self) -> Asking;
    async fn release(&self) -> Result<(), StoreError>;
    /// A tenure begins: the lease is this holder's in `term`.
    fn begin(&mut self, term: u64);
    /// The tenure ends: `lapsed` when the lease ran out unrenewed (the store may be out of reach
    /// and the lease may soon be granted to another), not when it went to another holder, was
    /// granted too late to rely on, or is given up.
    fn end(&mut self, lapsed: bool);
}

/// The reconcile lease's tenant: recovery and the reconcile loops, while it is held.
struct Reconciler {
    engine: Engine,
    holder: String,
    ttl: Duration,
    settings: ReconcileSettings,
    tenure: Option<Tenure>,
}

#[async_trait]
impl Tenant for Reconciler {
    fn lease(&self) -> String {
        "the reconcile lease".into()
    }
    fn ask(&self) -> Asking {
        let (store, holder, ttl) = (self.engine.store().clone(), self.holder.clone(), self.ttl);
        Box::pin(async move { store.acquire_lease(&holder, ttl).await })
    }
    async fn release(&self) -> Result<(), StoreError> {
        self.engine.store().release_lease(&self.holder).await
    }
    fn begin(&mut self, term: u64) {
        info!(holder = self.holder, term, "the timers and pools start");
        self.tenure = Some(Tenure::store_wide(&self.engine, &self.settings, term));
        self.engine.metrics().lease(true, term);
    }
    fn end(&mut self, _lapsed: bool) {
        if let Some(t) = self.tenure.take() {
            info!(holder = self.holder, term = t.term, "the timers and pools stop here");
            t.end();
        }
        self.engine.metrics().lease(false, 0);
    }
}

/// Holds the reconcile lease whenever it can and runs reconcile while it does, until
/// `shutdown` turns true; then stops reconciling and gives the lease up.
pub async fn lead(engine: Engine, lease: LeaseSettings, settings: ReconcileSettings, shutdown: watch::Receiver<bool>) {
    let LeaseSettings { holder, ttl } = lease;
    let reconciler = Reconciler { engine, holder: holder.clone(), ttl, settings, tenure: None };
    keep(reconciler, &holder, ttl, shutdown).await;
}

/// Keeps `tenant`'s lease for `holder` whenever it can, renewed every third of `ttl`, and
/// begins and ends its tenures, until `shutdown` turns true; then ends the tenure and gives the
/// lease up. A tenure is relied on only until nine tenths of `ttl` after the renewal that
/// extended it was asked for ([`berth_core::lease`]): it ends then, whether the store answers
/// or not.
pub(crate) async fn keep(mut tenant: impl Tenant, holder: &str, ttl: Duration, mut shutdown: watch::Receiver<bool>) {
    let what = tenant.lease();
    // The core's rules take times as offsets on this process's monotonic clock.
    let origin = Instant::now();
    // The tenure held: its term, and until when it is surely ours.
    let mut tenure: Option<(u64, Instant)> = None;
    let mut last_seen: Option<String> = None;
    while !*shutdown.borrow() {
        let asked = Instant::now();
        let reply = {
            let acquire = tenant.ask();
            tokio::pin!(acquire);
            // The store may take its time to answer (a hung connection, a failover): the
            // tenure ends when its time is up, and a shutdown does not wait, answer or not.
            loop {
                let until = tenure.map(|(_, until)| until);
                tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|stop| *stop) => break None,
                    _ = tokio::time::sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => {
                        if let Some((term, _)) = tenure.take() {
                            warn!(holder, term, "{what} lapsed unrenewed");
                            tenant.end(true);
                        }
                    }
                    reply = &mut acquire => break Some(reply),
                }
            }
        };
        let Some(reply) = reply else { break };
        let (asked_at, answered_at) = (asked - origin, Instant::now() - origin);
        let until = origin + relied_until(asked_at, answered_at, ttl);
        match reply {
            Ok(lease) if lease.held_by(holder) && reliable(asked_at, answered_at, ttl) => match &mut tenure {
                Some((term, held_until)) if *term == lease.term => *held_until = until,
                _ => {
                    if tenure.take().is_some() {
                        tenant.end(false);
                    }
                    info!(holder, term = lease.term, "took {what}");
                    tenure = Some((lease.term, until));
                    tenant.begin(lease.term);
                }
            },
            Ok(lease) if lease.held_by(holder) => {
                // Granted, but the answer came too late to rely on: ask again.
                if tenure.take().is_some() {
                    tenant.end(false);
                }
                warn!(holder, term = lease.term, "the store granted {what} too late to rely on");
            }
            Ok(lease) => {
                if let Some((term, _)) = tenure.take() {
                    warn!(holder, term, now_held_by = ?lease.holder, "lost {what}");
                    tenant.end(false);
                } else if last_seen != lease.holder {
                    info!(holder, held_by = ?lease.holder, term = lease.term, "another process holds {what}");
                }
                last_seen = lease.holder;
            }
            Err(e) => warn!(holder, error = %e, "cannot renew {what}"),
        }
        let next = origin + next_ask(Instant::now() - origin, ttl, tenure.map(|(_, until)| until - origin));
        // Biased, as every select the simulator runs: an unbiased one starts from a branch
        // tokio draws from an OS-seeded generator (DESIGN 5: no ambient randomness).
        tokio::select! {
            biased;
            changed = shutdown.changed() => {
                // No one left to say when to stop: stop now.
                if changed.is_err() {
                    break;
                }
            }
            _ = tokio::time::sleep_until(next) => {}
        }
    }
    if tenure.take().is_some() {
        tenant.end(false);
        match tenant.release().await {
            Ok(()) => info!(holder, "released {what}"),
            Err(e) => warn!(holder, error = %e, "cannot release {what}; it lapses by itself"),
        }
    }
}
