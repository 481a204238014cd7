//! Nodes and their leases in SQLite (DESIGN 14): one row a node, its lease beside its offer.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_core::NodeId;
use berth_core::placement::Capacity;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::NOW_MS;
use crate::store::codec;
use crate::store::{Lease, Node, NodeOffer, NodeRemoval, StoreError};

pub(super) fn acquire(
    conn: &mut Connection,
    node: &NodeId,
    holder: &str,
    offer: &NodeOffer,
    ttl: Duration,
) -> Result<Lease, StoreError> {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // In the update, bare column names are the row as it was. A lapsed lease is granted in a
    // new epoch even to the process that held it: the gateways may have fenced it meanwhile.
    // A deleted node (never held when deleted) comes back undrained, in its next epoch.
    tx.execute(
        &format!(
            "INSERT INTO nodes (id, holder, epoch, expires_at, draining, offer) \
             VALUES (?1, ?2, 1, {NOW_MS} + ?3, 0, ?4) \
             ON CONFLICT (id) DO UPDATE SET \
                 epoch = CASE WHEN holder IS ?2 AND expires_at > {NOW_MS} THEN epoch ELSE epoch + 1 END, \
                 draining = draining AND NOT removed, removed = 0, \
                 holder = ?2, expires_at = excluded.expires_at, offer = excluded.offer \
             WHERE holder IS NULL OR holder = ?2 OR expires_at <= {NOW_MS}"
        ),
        params![node.as_str(), holder, ttl_ms, codec::offer_json(offer)],
    )?;
    let (holder, epoch): (Option<String>, i64) =
        tx.query_row("SELECT holder, epoch FROM nodes WHERE id = ?1", params![node.as_str()], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    let term = u64::try_from(epoch)
        .map_err(|_| StoreError::Corrupt(format!("nodes {:?}: a negative epoch {epoch}", node.as_str())))?;
    tx.commit()?;
    Ok(Lease { holder, term })
}

pub(super) fn release(conn: &mut Connection, node: &NodeId, holder: &str) -> Result<(), StoreError> {
    conn.execute("UPDATE nodes SET holder = NULL WHERE id = ?1 AND holder = ?2", params![node.as_str(), holder])?;
    Ok(())
}

pub(super) fn delete(conn: &mut Connection, node: &NodeId) -> Result<NodeRemoval, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let removed = tx.execute(
        &format!(
            "UPDATE nodes SET removed = 1, holder = NULL \
             WHERE id = ?1 AND NOT removed AND (holder IS NULL OR expires_at <= {NOW_MS}) \
             AND NOT EXISTS (SELECT 1 FROM sandbox_placements WHERE node = ?1)"
        ),
        params![node.as_str()],
    )?;
    let removal = if removed > 0 {
        NodeRemoval::Removed
    } else {
        match one(&tx, node)? {
            Some(found) if found.live => NodeRemoval::Live(found.lease),
            Some(_) => {
                let holding: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM sandbox_placements WHERE node = ?1",
                    params![node.as_str()],
                    |row| row.get(0),
                )?;
                NodeRemoval::Holding(u64::try_from(holding).unwrap_or(0))
            }
            None => NodeRemoval::NotFound,
        }
    };
    tx.commit()?;
    Ok(removal)
}

pub(super) fn drain(conn: &mut Connection, node: &NodeId, draining: bool) -> Result<bool, StoreError> {
    let sql = "UPDATE nodes SET draining = ?2 WHERE id = ?1 AND NOT removed";
    Ok(conn.execute(sql, params![node.as_str(), draining])? > 0)
}

/// The columns `node_of` reads, `live` by SQLite's clock.
fn columns() -> String {
    format!("id, holder, epoch, holder IS NOT NULL AND expires_at > {NOW_MS}, draining, offer")
}

fn node_of(row: &Row<'_>) -> rusqlite::Result<(String, Option<String>, i64, bool, bool, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?))
}

fn decode(
    (id, holder, epoch, live, draining, offer): (String, Option<String>, i64, bool, bool, String),
) -> Result<Node, StoreError> {
    codec::node(id, holder, epoch, live, draining, &offer)
}

pub(super) fn one(conn: &Connection, node: &NodeId) -> Result<Option<Node>, StoreError> {
    let sql = format!("SELECT {} FROM nodes WHERE id = ?1 AND NOT removed", columns());
    conn.query_row(&sql, params![node.as_str()], node_of).optional()?.map(decode).transpose()
}

pub(super) fn all(conn: &Connection) -> Result<Vec<Node>, StoreError> {
    let sql = format!("SELECT {} FROM nodes WHERE NOT removed ORDER BY id", columns());
    let mut statement = conn.prepare(&sql)?;
    let rows = statement.query_map([], node_of)?.collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(decode).collect()
}

/// What the sandboxes placed on each node reserve there.
pub(super) fn loads(conn: &Connection) -> Result<BTreeMap<NodeId, Capacity>, StoreError> {
    let mut select = conn.prepare_cached(
        "SELECT node, COUNT(*), SUM(cpu_millis), SUM(memory_bytes) FROM sandbox_placements GROUP BY node",
    )?;
    let rows = select.query_map([], |row| {
        let (node, sandboxes, cpu, memory): (String, i64, i64, i64) =
            (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok((
            NodeId::new(node),
            Capacity { cpu_millis: count(cpu), memory_bytes: count(memory), sandboxes: count(sandboxes) },
        ))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
