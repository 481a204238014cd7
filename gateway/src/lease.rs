//! The reconcile lease: several gateways may serve one store, and every one of them serves both
//! APIs, but only the lease's holder runs start-up recovery, the watch loop and the poll sweep
//! (DESIGN 3.6). The lease lives in the store, with a time-to-live on the store's clock; its
//! holder renews it, another gateway takes it over once it lapses, and a gateway shutting down
//! gives it up.
//!
//! A deposed holder that has not noticed yet is harmless: every decision is committed before
//! its effects run, so all it can still do is repeat an idempotent effect of a committed intent
//! (a start of the committed generation, a stop, a delete), and every report it merges goes
//! through the same conditional write as anyone else's. It also stops on its own, whether or
//! not the store answers, once nine tenths of the lease's time-to-live have passed since it last
//! asked for it, on its own clock: before the store would let another gateway in. Those rules
//! are berth-core's ([`berth_core::lease`]); this is the tokio code that keeps them.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use berth_core::lease::{next_ask, reliable, relied_until};

use crate::engine::Engine;
use crate::reconcile::{self, ReconcileSettings};
use crate::{pools, timers};

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// This gateway's name in the lease: unique among the gateways sharing a store.
    pub holder: String,
    /// How long the lease lasts without a renewal; renewed every third of it.
    pub ttl: Duration,
}

/// The reconcile loops this gateway runs while it holds the lease.
struct Tenure {
    term: u64,
    /// The lease is surely ours until then: nine tenths of a time-to-live after the last
    /// renewal was asked for.
    until: Instant,
    tasks: Vec<JoinHandle<()>>,
}

impl Tenure {
    fn begin(engine: &Engine, settings: &ReconcileSettings, term: u64, until: Instant) -> Self {
        let (timers_feed, timers_records) = tokio::sync::mpsc::channel(1);
        let (pools_feed, pools_records) = tokio::sync::mpsc::channel(1);
        let feeds = vec![timers_feed, pools_feed];
        let recovery = {
            let engine = engine.clone();
            let page_size = settings.page_size;
            let feeds = feeds.clone();
            tokio::spawn(async move {
                match reconcile::recover(&engine, page_size, &feeds).await {
                    Ok(redriven) => info!(redriven, "recovery re-drove the unfinished transitions"),
                    Err(e) => warn!(error = %e, "recovery could not read the records; the poll sweep re-drives them"),
                }
            })
        };
        let watch = tokio::spawn(reconcile::watch_loop(engine.clone(), settings.clone()));
        let poll = tokio::spawn(reconcile::poll_loop(engine.clone(), settings.clone(), feeds));
        let timers = tokio::spawn(timers::timers_loop(engine.clone(), timers_records));
        let pools = tokio::spawn(pools::pools_loop(engine.clone(), pools_records));
        Self { term, until, tasks: vec![recovery, watch, poll, timers, pools] }
    }

    fn end(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

/// Holds the lease whenever it can and runs reconcile while it does, until `shutdown` turns
/// true; then stops reconciling and gives the lease up.
pub async fn lead(
    engine: Engine,
    lease: LeaseSettings,
    settings: ReconcileSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let LeaseSettings { holder, ttl } = lease;
    // The core's rules take times as offsets on this gateway's monotonic clock.
    let origin = Instant::now();
    let mut tenure: Option<Tenure> = None;
    let mut last_seen: Option<String> = None;
    while !*shutdown.borrow() {
        let asked = Instant::now();
        let acquire = engine.store().acquire_lease(&holder, ttl);
        tokio::pin!(acquire);
        // The store may take its time to answer (a hung connection, a failover): the tenure
        // ends when its time is up, and a shutdown does not wait, answer or not.
        let reply = loop {
            let until = tenure.as_ref().map(|t| t.until);
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break None,
                _ = tokio::time::sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => {
                    if let Some(t) = tenure.take() {
                        warn!(holder, term = t.term, "the reconcile lease lapsed unrenewed: reconcile stops here");
                        t.end();
                    }
                }
                reply = &mut acquire => break Some(reply),
            }
        };
        let Some(reply) = reply else { break };
        let (asked_at, answered_at) = (asked - origin, Instant::now() - origin);
        let until = origin + relied_until(asked_at, answered_at, ttl);
        match reply {
            Ok(lease) if lease.held_by(&holder) && reliable(asked_at, answered_at, ttl) => match &mut tenure {
                Some(t) if t.term == lease.term => t.until = until,
                _ => {
                    if let Some(t) = tenure.take() {
                        t.end();
                    }
                    info!(
                        holder,
                        term = lease.term,
                        "took the reconcile lease: recovery and the reconcile loops start"
                    );
                    tenure = Some(Tenure::begin(&engine, &settings, lease.term, until));
                }
            },
            Ok(lease) if lease.held_by(&holder) => {
                // Granted, but the answer came too late to rely on: ask again.
                if let Some(t) = tenure.take() {
                    t.end();
                }
                warn!(holder, term = lease.term, "the store granted the reconcile lease too late to rely on");
            }
            Ok(lease) => {
                if let Some(t) = tenure.take() {
                    warn!(holder, term = t.term, now_held_by = ?lease.holder, "lost the reconcile lease: reconcile stops here");
                    t.end();
                } else if last_seen != lease.holder {
                    info!(holder, held_by = ?lease.holder, term = lease.term, "another gateway holds the reconcile lease");
                }
                last_seen = lease.holder;
            }
            Err(e) => warn!(holder, error = %e, "cannot renew the reconcile lease"),
        }
        engine.metrics().lease(tenure.is_some(), tenure.as_ref().map_or(0, |t| t.term));
        let next = origin + next_ask(Instant::now() - origin, ttl, tenure.as_ref().map(|t| t.until - origin));
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
    if let Some(t) = tenure.take() {
        t.end();
        match engine.store().release_lease(&holder).await {
            Ok(()) => info!(holder, "released the reconcile lease"),
            Err(e) => warn!(holder, error = %e, "cannot release the reconcile lease; it lapses by itself"),
        }
    }
}
