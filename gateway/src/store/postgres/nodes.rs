//! Nodes and their leases in PostgreSQL (DESIGN 14): one row a node, its lease beside its offer,
//! every lease decided by the database's clock.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_core::NodeId;
use berth_core::placement::Capacity;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{ATTEMPTS, PostgresStore};
use crate::store::codec;
use crate::store::{Lease, Node, NodeOffer, NodeRemoval, StoreError};

/// What `decode` reads, `live` by the database's clock.
const COLUMNS: &str = "id, holder, epoch, holder IS NOT NULL AND expires_at > now(), draining, offer";

impl PostgresStore {
    pub(super) async fn acquire_node(
        &self,
        node: &NodeId,
        holder: &str,
        offer: &NodeOffer,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let client = self.client().await?;
        // As the reconcile lease's statement, except that a lapsed lease is granted in a new
        // epoch even to the process that held it: the gateways may have fenced it meanwhile. A
        // deleted node (never held when deleted) comes back undrained, in its next epoch.
        let statement = client
            .prepare_cached(
                "WITH taken AS ( \
                     INSERT INTO nodes AS n (id, holder, epoch, expires_at, draining, offer) \
                     VALUES ($1, $2, 1, now() + $3::bigint * interval '1 millisecond', FALSE, $4) \
                     ON CONFLICT (id) DO UPDATE SET \
                         epoch = CASE WHEN n.holder = $2 AND n.expires_at > now() THEN n.epoch ELSE n.epoch + 1 END, \
                         draining = n.draining AND NOT n.removed, removed = FALSE, \
                         holder = $2, expires_at = EXCLUDED.expires_at, offer = EXCLUDED.offer \
                     WHERE n.holder IS NULL OR n.holder = $2 OR n.expires_at <= now() \
                     RETURNING holder, epoch) \
                 SELECT holder, epoch FROM taken \
                 UNION ALL \
                 SELECT holder, epoch FROM nodes WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM taken)",
            )
            .await
            .map_err(|e| self.error(&e))?;
        let offer = codec::offer_json(offer);
        let args: [&(dyn ToSql + Sync); 4] = [&node.as_str(), &holder, &ttl_ms, &offer];
        // The outer SELECT's snapshot predates a first row another process inserted meanwhile:
        // then it finds nothing, and the next attempt sees that row.
        let mut row = None;
        for _ in 0..ATTEMPTS {
            row = client.query_opt(&statement, &args).await.map_err(|e| self.error(&e))?;
            if row.is_some() {
                break;
            }
        }
        let row = row.ok_or_else(|| {
            StoreError::Unavailable(format!("postgres {}: node {node}'s lease row stays unseen", self.target))
        })?;
        let holder: Option<String> = row.try_get(0).map_err(|e| self.error(&e))?;
        let epoch: i64 = row.try_get(1).map_err(|e| self.error(&e))?;
        let term = u64::try_from(epoch)
            .map_err(|_| StoreError::Corrupt(format!("nodes {node:?}: a negative epoch {epoch}")))?;
        self.measure_clock(&client).await?;
        Ok(Lease { holder, term })
    }

    pub(super) async fn release_node(&self, node: &NodeId, holder: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute("UPDATE nodes SET holder = NULL WHERE id = $1 AND holder = $2", &[&node.as_str(), &holder])
            .await
            .map_err(|e| self.error(&e))?;
        Ok(())
    }

    pub(super) async fn delete(&self, node: &NodeId) -> Result<NodeRemoval, StoreError> {
        let client = self.client().await?;
        // One statement: the row goes only if its lease is not held by the database's clock and
        // no sandbox that counts is placed on it.
        let removed = client
            .execute(
                "UPDATE nodes SET removed = TRUE, holder = NULL \
                 WHERE id = $1 AND NOT removed AND (holder IS NULL OR expires_at <= now()) \
                 AND NOT EXISTS (SELECT 1 FROM sandbox_placements WHERE node = $1)",
                &[&node.as_str()],
            )
            .await
            .map_err(|e| self.error(&e))?;
        drop(client);
        if removed > 0 {
            return Ok(NodeRemoval::Removed);
        }
        Ok(match self.read_nodes(Some(node)).await?.pop() {
            Some(found) if found.live => NodeRemoval::Live(found.lease),
            Some(_) => NodeRemoval::Holding(self.read_loads().await?.get(node).map_or(0, |load| load.sandboxes)),
            None => NodeRemoval::NotFound,
        })
    }

    pub(super) async fn drain(&self, node: &NodeId, draining: bool) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let changed = client
            .execute("UPDATE nodes SET draining = $2 WHERE id = $1 AND NOT removed", &[&node.as_str(), &draining])
            .await
            .map_err(|e| self.error(&e))?;
        Ok(changed > 0)
    }

    pub(super) async fn read_nodes(&self, node: Option<&NodeId>) -> Result<Vec<Node>, StoreError> {
        let client = self.client().await?;
        let rows = match node {
            Some(node) => {
                let sql = format!("SELECT {COLUMNS} FROM nodes WHERE id = $1 AND NOT removed");
                client.query(&sql, &[&node.as_str()]).await
            }
            None => client.query(&format!("SELECT {COLUMNS} FROM nodes WHERE NOT removed ORDER BY id"), &[]).await,
        }
        .map_err(|e| self.error(&e))?;
        rows.iter().map(|row| self.decode_node(row)).collect()
    }

    /// What the sandboxes placed on each node reserve there.
    pub(super) async fn read_loads(&self) -> Result<BTreeMap<NodeId, Capacity>, StoreError> {
        let client = self.client().await?;
        let sql = "SELECT node, COUNT(*), SUM(cpu_millis)::BIGINT, SUM(memory_bytes)::BIGINT \
                   FROM sandbox_placements GROUP BY node";
        let rows = client.query(sql, &[]).await.map_err(|e| self.error(&e))?;
        let get = |e: tokio_postgres::Error| self.error(&e);
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        rows.iter()
            .map(|row| {
                let node: String = row.try_get(0).map_err(get)?;
                let (sandboxes, cpu, memory): (i64, i64, i64) =
                    (row.try_get(1).map_err(get)?, row.try_get(2).map_err(get)?, row.try_get(3).map_err(get)?);
                let load =
                    Capacity { cpu_millis: count(cpu), memory_bytes: count(memory), sandboxes: count(sandboxes) };
                Ok((NodeId::new(node), load))
            })
            .collect()
    }

    fn decode_node(&self, row: &Row) -> Result<Node, StoreError> {
        let get = |e: tokio_postgres::Error| self.error(&e);
        let offer: String = row.try_get(5).map_err(get)?;
        codec::node(
            row.try_get(0).map_err(get)?,
            row.try_get(1).map_err(get)?,
            row.try_get(2).map_err(get)?,
            row.try_get(3).map_err(get)?,
            row.try_get(4).map_err(get)?,
            &offer,
        )
    }
}
