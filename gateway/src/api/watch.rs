//! Watching sandboxes: one by name (`WatchSandbox`), or the whole fleet from a cursor
//! (`WatchSandboxes`), read from the store's change log so that a watch through any gateway
//! sees every gateway's writes, in commit order.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use berth_core::{Sandbox, validate};
use berth_proto::v1 as pb;
use futures_util::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert;
use super::public::{core_invalid, invalid};
use crate::engine::Engine;
use crate::error::ApiError;
use crate::store::{PageRequest, Store, selects};

pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SandboxEvent, Status>> + Send>>;

/// How long a watch waits for a change before it reads the store afresh (changes made
/// through another gateway reach it this way), and how often a fleet watch whose selector left
/// changes out sends a bookmark past them.
const RESYNC: Duration = Duration::from_secs(1);
/// Change log entries read at a time.
const BATCH: usize = 256;

fn event(sandbox: Sandbox, removed: bool, cursor: String) -> pb::SandboxEvent {
    pb::SandboxEvent {
        name: sandbox.name.to_string(),
        sandbox: (!removed).then(|| convert::sandbox(sandbox)),
        removed,
        cursor,
    }
}

fn bookmark(cursor: String) -> pb::SandboxEvent {
    pb::SandboxEvent { cursor, ..Default::default() }
}

/// A cursor as clients hold it: the position, and the store it is a position of (a cursor
/// carried to a gateway on another store must not be read as a position there).
pub fn cursor(store: &dyn Store, position: u64) -> String {
    format!("{position}.{}", store.identity())
}

fn position(store: &dyn Store, cursor: &str) -> Result<u64, Status> {
    let (position, identity) = cursor
        .split_once('.')
        .ok_or_else(|| invalid("cursor", "is not a cursor this API gave out (POSITION.STORE)"))?;
    let position = position.parse().map_err(|_| invalid("cursor", &format!("{position:?} is not a position")))?;
    if identity != store.identity() {
        return Err(Status::failed_precondition(
            "cursor is from another store: list the sandboxes again and watch from the list's cursor",
        ));
    }
    Ok(position)
}

fn left_behind() -> Status {
    Status::failed_precondition(
        "cursor is older than the store's change log reaches back (it keeps the newest changes, as many as \
         the gateway's --changes-kept): list the sandboxes again and watch from the list's cursor",
    )
}

pub fn validate_selector(selector: &BTreeMap<String, String>) -> Result<(), Status> {
    for (k, v) in selector {
        validate::label(k, v).map_err(|_| invalid("label_selector", &format!("{k:?}={v:?} is not a valid label")))?;
    }
    Ok(())
}

/// Waits for the next thing to look at: a change committed here, or `RESYNC`. `false` once the
/// gateway shuts down (the watcher was told).
async fn next_wake(
    engine: &Engine,
    changes: &mut broadcast::Receiver<crate::engine::Change>,
    tx: &mpsc::Sender<Result<pb::SandboxEvent, Status>>,
) -> Option<Result<crate::engine::Change, ()>> {
    tokio::select! {
        biased;
        () = engine.shutdown().begun() => {
            let _ = tx.send(Err(ApiError::ShuttingDown.into())).await;
            None
        }
        () = tx.closed() => None,
        received = tokio::time::timeout(RESYNC, changes.recv()) => match received {
            Ok(Ok(change)) => Some(Ok(change)),
            Ok(Err(broadcast::error::RecvError::Closed)) => None,
            // Fell behind, or quiet for a while: read afresh.
            Ok(Err(broadcast::error::RecvError::Lagged(_))) | Err(_) => Some(Err(())),
        },
    }
}

/// `WatchSandbox`: the sandbox now, then every change, until it is gone.
pub async fn one(engine: Engine, name: String) -> Result<EventStream, Status> {
    validate::dns_label("name", &name).map_err(core_invalid)?;
    // Subscribe first: no change between the read and the subscription is missed.
    let mut changes = engine.subscribe();
    let store = engine.store().clone();
    let record = store
        .sandbox_by_name(&name)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| Status::not_found(format!("sandbox '{name}' not found")))?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let id = record.id.clone();
        let mut last = record.resource_version;
        if tx.send(Ok(event(record, false, String::new()))).await.is_err() {
            return;
        }
        while let Some(woken) = next_wake(&engine, &mut changes, &tx).await {
            let current = match woken {
                Ok(change) if change.id == id => change.sandbox,
                Ok(_) => continue,
                Err(()) => match store.sandbox(&id).await {
                    Ok(current) => current,
                    Err(e) => {
                        let _ = tx.send(Err(ApiError::from(e).into())).await;
                        return;
                    }
                },
            };
            let sent = match current {
                Some(s) if s.resource_version > last => {
                    last = s.resource_version;
                    tx.send(Ok(event(s, false, String::new()))).await
                }
                Some(_) => Ok(()),
                None => {
                    let _ = tx.send(Ok(pb::SandboxEvent { name, removed: true, ..Default::default() })).await;
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// `WatchSandboxes`: a bookmark at the start, then every change after `cursor` the selector
/// matches, each with the cursor just after it.
pub async fn fleet(engine: Engine, selector: BTreeMap<String, String>, cursor: String) -> Result<EventStream, Status> {
    validate_selector(&selector)?;
    let store = engine.store().clone();
    let mut changes = engine.subscribe();
    let mut at = if cursor.is_empty() {
        let first = PageRequest { after: None, limit: 1 };
        store.list_sandboxes_at(&first, &selector).await.map_err(ApiError::from)?.cursor
    } else {
        let at = position(store.as_ref(), &cursor)?;
        let log = store.changes(at, 0).await.map_err(ApiError::from)?;
        if at < log.trimmed_through {
            return Err(left_behind());
        }
        if at > log.head {
            return Err(Status::failed_precondition(format!(
                "cursor is ahead of the store's change log (at {}): the store was restored from an older copy; \
                 list the sandboxes again and watch from the list's cursor",
                log.head
            )));
        }
        at
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        if tx.send(Ok(bookmark(self::cursor(store.as_ref(), at)))).await.is_err() {
            return;
        }
        // The last position the client was told of.
        let mut told = at;
        loop {
            let log = match store.changes(at, BATCH).await {
                Ok(log) if at < log.trimmed_through => Err(left_behind()),
                Ok(log) => Ok(log),
                Err(e) => Err(ApiError::from(e).into()),
            };
            let log = match log {
                Ok(log) => log,
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let full = log.entries.len() == BATCH;
            for entry in log.entries {
                at = entry.seq;
                if selects(&selector, &entry.sandbox) {
                    told = at;
                    let sent = tx.send(Ok(event(entry.sandbox, entry.removed, self::cursor(store.as_ref(), at))));
                    if sent.await.is_err() {
                        return;
                    }
                }
            }
            if full {
                continue;
            }
            let Some(woken) = next_wake(&engine, &mut changes, &tx).await else { return };
            // Move a client whose selector left changes out past them, when things are quiet or
            // once they add up, so that its cursor does not fall behind the log's retention.
            if told < at && (woken.is_err() || at - told >= BATCH as u64) {
                told = at;
                if tx.send(Ok(bookmark(self::cursor(store.as_ref(), at)))).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}
