//! The shared store: PostgreSQL, so that several gateways can serve one fleet. The database
//! does every check: nothing is replicated by Berth itself.
//!
//! The schema is SQLite's (see `codec`): each record whole, as JSON, beside the columns queried
//! by, and the two index tables (provider references, labels) kept in step by the record's own
//! write statement. Names are compared in the "C" collation, so pages come in the same byte order
//! as from the other stores whatever the database's locale.
//!
//! A transaction first checks every condition against the state before it (reporting the
//! first that fails, as the other stores do), then applies the writes as conditional
//! statements; a statement that changes no row means another transaction got there first, and
//! the whole transaction rolls back. A lone write skips the checks and runs as its statement
//! alone, which is atomic by itself; should it change nothing, it runs again as a transaction
//! whose checks say why. Two transactions that lock the same records in different orders may
//! deadlock, and a rename may meet a name taken in between: PostgreSQL aborts one of them, which
//! is then run again from its checks (nothing of it applied), a few times at most.
//!
//! When the database cannot be reached, every operation fails as unavailable after the pool's
//! timeouts; the pool reconnects by itself once the database is back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::exec::{Exec, ExecId};
use berth_core::template::Template;
use berth_core::{NodeId, Provider, Sandbox, SandboxId, Snapshot, Timestamp, Volume, Write};
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime, Transaction};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::codec::{self, Decoded, Record, corrupt};
use super::{
    Changes, CommitError, Lease, Listing, Logged, Node, NodeOffer, NodeRemoval, Page, PageRequest, Store, StoreError,
};
use crate::clock::{Clock, SystemClock};

mod commit;
mod connection;
mod nodes;
mod schema;
mod statement;

use connection::{Lent, describe, target, unlent};
use schema::MIGRATIONS;

/// The SQLSTATEs of a condition that did not hold: `berth_expect_version`'s (its detail the
/// version found, empty for none), `berth_expect_name_free`'s (its detail the holder's version and
/// id), and `berth_expect_rows`'s.
const VERSION_DIFFERS: &str = "BR001";
const NAME_TAKEN: &str = "BR002";
const UNCHANGED: &str = "BR003";

/// Gives every committed, unsequenced change log entry the next positions, in the order they
/// were written, and moves the head past them; trims the log to the newest `$1` entries in steps
/// of an eighth. Run only under `LOCK_LOG`.
///
/// Why a sequencer: positions handed out as entries are written (a sequence) are not in commit
/// order, so a reader of `seq > cursor` could pass a position whose transaction commits later
/// and never see it. Positions given after the commit, by one sequencer at a time (the lock),
/// each run above every position before it and all committed together, are: what a reader sees
/// is always every position up to the head it reads. Writers never wait for the sequencer (they
/// only insert), so gateways sharing the store do not serialize their commits on the log.
const SEQUENCE: &str = "
WITH batch AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM sandbox_changes WHERE seq IS NULL
), assigned AS (
    UPDATE sandbox_changes c SET seq = (SELECT head FROM change_log) + batch.n
    FROM batch WHERE c.id = batch.id RETURNING 1
)
UPDATE change_log SET head = head + (SELECT count(*) FROM assigned)
RETURNING head";
const TRIM: &str = "
WITH bound AS (
    SELECT head - $1 AS through FROM change_log WHERE head - trimmed_through > $1 + $1 / 8
), gone AS (
    DELETE FROM sandbox_changes WHERE seq <= (SELECT through FROM bound) RETURNING 1
)
UPDATE change_log SET trimmed_through = (SELECT through FROM bound) WHERE EXISTS (SELECT 1 FROM bound)";
/// Taken before a transaction's first statement, so that a REPEATABLE READ snapshot is taken
/// after it: the sequencer's exclusion. Plain reads of the log (ACCESS SHARE) go on beside it.
const LOCK_LOG: &str = "LOCK TABLE change_log IN EXCLUSIVE MODE";
const UNSEQUENCED: &str = "SELECT EXISTS (SELECT 1 FROM sandbox_changes WHERE seq IS NULL)";

/// The lease of the reconcile loop, the one row of `leases` Berth uses.
const RECONCILE_LEASE: &str = "reconcile";

// A handful of steps: the cast cannot truncate.
const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Serializes schema migrations between gateways starting together (an advisory lock's key).
const MIGRATION_LOCK: i64 = 0x6265_7274_685f_6462; // "berth_db"

/// Connections each gateway keeps at most, unless told otherwise.
pub const CONNECTIONS: usize = 8;

/// How one gateway uses a PostgreSQL store.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How many of the newest change log entries are kept.
    pub changes_kept: u64,
    /// How many connections the gateway keeps at most (each a server process): gateways sharing
    /// a server share its `max_connections`, and on a small server fewer connections are faster.
    pub connections: usize,
    /// The CA file the server's certificate is checked against when the URL says
    /// `sslmode=require`; the system's roots when not given.
    pub ca: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self { changes_kept: super::CHANGES_KEPT, connections: CONNECTIONS, ca: None }
    }
}

/// How long an operation waits for a connection, to connect, or for the server to answer the
/// pool's health check, before it fails as unavailable.
const TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a transaction PostgreSQL aborted (deadlock, a name taken meanwhile) is run
/// again before the commit fails as unavailable.
const ATTEMPTS: usize = 5;

pub struct PostgresStore {
    pool: Pool,
    /// `user@host:port/database`, for messages: never the password.
    target: String,
    identity: String,
    /// The database's clock minus the local one, in nanoseconds: measured at connect and at
    /// every lease renewal, to within half a round trip.
    clock_offset: AtomicI64,
    /// How many change log entries are kept.
    keep: i64,
    decoded: Decoded,
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user[:password]@host[:port]/database`, or
    /// any form libpq accepts) and brings its schema up to date. `sslmode=require` in the URL
    /// speaks TLS, never plaintext, and checks the server's certificate and name (libpq's
    /// `verify-full`, where libpq's `require` checks neither); otherwise the store is spoken to in
    /// plaintext, which is fit for a store on the gateway's own host or a private link alone.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, Settings::default()).await
    }

    /// [`PostgresStore::connect`], with `settings`.
    pub async fn connect_with(url: &str, settings: Settings) -> Result<Self, StoreError> {
        let keep = i64::try_from(settings.changes_kept.max(1)).unwrap_or(i64::MAX);
        // The parser's message never quotes the URL, so never its password.
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
            let hint = if url.contains("sslmode=verify") { connection::VERIFY_HINT } else { "" };
            StoreError::Unavailable(format!("the store URL is not a PostgreSQL URL: {e}{hint}"))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("berth-gateway");
        }
        let target = target(&config);
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = if config.get_ssl_mode() == SslMode::Require {
            let tls = crate::tls::client_config(settings.ca.as_deref(), "store_ca")
                .map_err(|e| StoreError::Unavailable(format!("store_ca: {e}")))?;
            Manager::from_config(config, MakeRustlsConnect::new(tls), recycling)
        } else if settings.ca.is_some() {
            return Err(StoreError::Unavailable(
                "store_ca: a CA for the store's certificate needs TLS: add sslmode=require to the store URL".into(),
            ));
        } else {
            if !connection::local(&config) {
                tracing::warn!(store = %target, "the store is spoken to in plaintext across the network; add sslmode=require to its URL");
            }
            Manager::from_config(config, NoTls, recycling)
        };
        let pool = Pool::builder(manager)
            .max_size(settings.connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(TIMEOUT))
            .create_timeout(Some(TIMEOUT))
            .recycle_timeout(Some(TIMEOUT))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("postgres {target}: {e}")))?;
        let mut store = Self {
            pool,
            target,
            identity: String::new(),
            clock_offset: AtomicI64::new(0),
            keep,
            decoded: Decoded::default(),
        };
        store.migrate().await?;
        store.identity = store.identify().await?;
        store.measure_clock(&store.client().await?).await?;
        Ok(store)
    }

    /// The store's identity, made by whichever gateway connects first. Gateways connecting
    /// together agree: a second insert waits for the first to commit and then inserts nothing,
    /// and the read after it sees the first one's row.
    async fn identify(&self) -> Result<String, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO store_identity (singleton, id) VALUES (TRUE, $1) ON CONFLICT DO NOTHING",
                &[&super::new_identity()?],
            )
            .await
            .map_err(|e| self.error(&e))?;
        let row = client.query_one("SELECT id FROM store_identity", &[]).await.map_err(|e| self.error(&e))?;
        row.try_get(0).map_err(|e| self.error(&e))
    }

    /// Sets `clock_offset` from one reading of the database's clock, taken as the midpoint of
    /// the round trip.
    async fn measure_clock(&self, client: &Object) -> Result<(), StoreError> {
        let asked = SystemClock.now().unix_nanos();
        let row = client
            .query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint", &[])
            .await
            .map_err(|e| self.error(&e))?;
        let answered = SystemClock.now().unix_nanos();
        let micros: i64 = row.try_get(0).map_err(|e| self.error(&e))?;
        let local = asked + (answered - asked) / 2;
        self.clock_offset.store(micros.saturating_mul(1000).saturating_sub(local), Ordering::Relaxed);
        Ok(())
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| StoreError::Unavailable(format!("postgres {}: {}", self.target, unlent(&e))))
    }

    fn error(&self, e: &tokio_postgres::Error) -> StoreError {
        match e.code() {
            Some(c) if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
                StoreError::Corrupt(format!("postgres {}: {e}", self.target))
            }
            _ => StoreError::Unavailable(format!("postgres {}: {}", self.target, describe(e))),
        }
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(&e))?;
        // DDL is transactional in PostgreSQL: the steps and the version move together or not at all.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(|e| self.error(&e))?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS berth_schema (version BIGINT NOT NULL)")
            .await
            .map_err(|e| self.error(&e))?;
        let found: i64 =
            match tx.query_opt("SELECT version FROM berth_schema", &[]).await.map_err(|e| self.error(&e))? {
                Some(row) => row.try_get(0).map_err(|e| self.error(&e))?,
                None => {
                    tx.execute("INSERT INTO berth_schema (version) VALUES (0)", &[])
                        .await
                        .map_err(|e| self.error(&e))?;
                    0
                }
            };
        if found > SCHEMA_VERSION {
            return Err(StoreError::Unavailable(format!(
                "postgres {}: schema version {found} is newer than this build supports ({SCHEMA_VERSION}); \
                 refusing to use it rather than misread it: run a newer berth-gateway",
                self.target
            )));
        }
        for (to, sql) in (1..).zip(MIGRATIONS).skip_while(|(to, _)| *to <= found) {
            tx.batch_execute(sql).await.map_err(|e| {
                StoreError::Unavailable(format!("postgres {}: schema migration {to} failed: {e}", self.target))
            })?;
            tx.execute("UPDATE berth_schema SET version = $1", &[&to]).await.map_err(|e| self.error(&e))?;
        }
        tx.commit().await.map_err(|e| self.error(&e))
    }

    /// Decodes a `(key, version, record)` row.
    fn decode<T: Record>(&self, row: &Row) -> Result<T, StoreError> {
        let key: String =
            row.try_get(0).map_err(|e| StoreError::Corrupt(format!("{}: unreadable key: {e}", T::TABLE)))?;
        let version: i64 = row.try_get(1).map_err(|e| corrupt::<T>(&key, format!("unreadable version: {e}")))?;
        let json: &str = row.try_get(2).map_err(|e| corrupt::<T>(&key, format!("unreadable record: {e}")))?;
        self.decoded.decode(&key, version, json)
    }

    async fn read_one<T: Record>(&self, sql: &str, key: &str) -> Result<Option<T>, StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(|e| self.error(&e))?;
        let row = client.query_opt(&statement, &[&key]).await.map_err(|e| self.error(&e))?;
        row.map(|r| self.decode(&r)).transpose()
    }

    async fn read_all<T: Record>(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<T>, StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(|e| self.error(&e))?;
        let rows = client.query(&statement, args).await.map_err(|e| self.error(&e))?;
        rows.iter().map(|r| self.decode(r)).collect()
    }

    /// A page from a query selecting `(key, version, record)` ordered by name whose last
    /// parameter is the row limit.
    async fn read_page<T: Record>(
        &self,
        sql: &str,
        args: &[&(dyn ToSql + Sync)],
        limit: usize,
    ) -> Result<Page<T>, StoreError> {
        let rows = codec::row_limit(limit);
        let mut args = args.to_vec();
        args.push(&rows);
        Ok(codec::page(self.read_all(sql, &args).await?, limit))
    }

    async fn read_named<T: Record>(&self, name: &str) -> Result<Option<T>, StoreError> {
        self.read_one(&format!("SELECT name, version, record FROM {} WHERE name = $1", T::TABLE), name).await
    }

    async fn page_named<T: Record>(&self, request: &PageRequest) -> Result<Page<T>, StoreError> {
        match &request.after {
            Some(after) => {
                let sql =
                    format!("SELECT name, version, record FROM {} WHERE name > $1 ORDER BY name LIMIT $2", T::TABLE);
                self.read_page(&sql, &[after], request.limit).await
            }
            None => {
                let sql = format!("SELECT name, version, record FROM {} ORDER BY name LIMIT $1", T::TABLE);
                self.read_page(&sql, &[], request.limit).await
            }
        }
    }

    /// Sequences the change log's committed entries (and trims it) in `tx`, which holds
    /// `LOCK_LOG`; the head after.
    async fn sequence(&self, tx: &Transaction<'_>) -> Result<u64, StoreError> {
        let row = tx.query_one(SEQUENCE, &[]).await.map_err(|e| self.error(&e))?;
        let head = position(row.try_get(0).map_err(|e| self.error(&e))?)?;
        tx.execute(TRIM, &[&self.keep]).await.map_err(|e| self.error(&e))?;
        Ok(head)
    }

    /// A sandbox page and the change log's head in one snapshot, with every entry that snapshot
    /// holds sequenced: a position at or before the head for each change the page shows, one
    /// after it for every other.
    async fn list_at(&self, sql: &str, args: &[&(dyn ToSql + Sync)], limit: usize) -> Result<Listing, StoreError> {
        let rows = codec::row_limit(limit);
        let mut args = args.to_vec();
        args.push(&rows);
        let mut client = self.client().await?;
        let e = |e: tokio_postgres::Error| self.error(&e);
        // Without the lock first: when the snapshot holds no unsequenced entry (no sandbox write
        // since the last sequencing), its head is exact as it stands.
        let tx = client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).start().await.map_err(e)?;
        let row = tx.query_one(&format!("SELECT head, ({UNSEQUENCED}) FROM change_log"), &[]).await.map_err(e)?;
        let (mut cursor, unsequenced): (i64, bool) = (row.try_get(0).map_err(e)?, row.try_get(1).map_err(e)?);
        let tx = if unsequenced {
            tx.rollback().await.map_err(e)?;
            let tx =
                client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).start().await.map_err(e)?;
            tx.batch_execute(LOCK_LOG).await.map_err(e)?;
            cursor = i64::try_from(self.sequence(&tx).await?).unwrap_or(i64::MAX);
            tx
        } else {
            tx
        };
        let statement = tx.prepare_cached(sql).await.map_err(e)?;
        let found = tx.query(&statement, &args).await.map_err(e)?;
        let items = found.iter().map(|r| self.decode(r)).collect::<Result<Vec<_>, _>>()?;
        tx.commit().await.map_err(e)?;
        Ok(Listing { page: codec::page(items, limit), cursor: position(cursor)? })
    }
}

fn position(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("the change log holds a negative position {n}")))
}

#[async_trait]
impl Store for PostgresStore {
    fn identity(&self) -> &str {
        &self.identity
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn now(&self) -> Timestamp {
        let offset = self.clock_offset.load(Ordering::Relaxed);
        Timestamp::from_unix_nanos(SystemClock.now().unix_nanos().saturating_add(offset))
    }

    async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        self.read_one("SELECT id, version, record FROM sandboxes WHERE id = $1", id.as_str()).await
    }

    async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError> {
        self.read_one("SELECT id, version, record FROM sandboxes WHERE name = $1", name).await
    }

    async fn list_sandboxes_at(
        &self,
        request: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Listing, StoreError> {
        let mut sql = String::from("SELECT s.id, s.version, s.record FROM sandboxes s WHERE TRUE");
        let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
        if let Some(after) = &request.after {
            args.push(after);
            sql.push_str(&format!(" AND s.name > ${}", args.len()));
        }
        // Filtered here rather than after reading, so that a page holds `limit` matches.
        for (key, value) in selector {
            args.push(key);
            args.push(value);
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM sandbox_labels l WHERE l.sandbox_id = s.id AND l.key = ${} AND l.value = ${})",
                args.len() - 1,
                args.len()
            ));
        }
        sql.push_str(&format!(" ORDER BY s.name LIMIT ${}", args.len() + 1));
        self.list_at(&sql, &args, request.limit).await
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError> {
        let mut client = self.client().await?;
        let e = |e: tokio_postgres::Error| self.error(&e);
        if client.query_one(UNSEQUENCED, &[]).await.map_err(e)?.try_get::<_, bool>(0).map_err(e)? {
            let tx = client.transaction().await.map_err(e)?;
            tx.batch_execute(LOCK_LOG).await.map_err(e)?;
            self.sequence(&tx).await?;
            tx.commit().await.map_err(e)?;
        }
        // Every position up to the head is visible once the sequencing that gave it committed,
        // so one statement's snapshot reads a whole prefix of the log.
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT l.head, l.trimmed_through, c.seq, c.sandbox_id, c.version, c.removed, c.record \
                 FROM change_log l LEFT JOIN LATERAL ( \
                     SELECT * FROM sandbox_changes WHERE seq > $1 ORDER BY seq LIMIT $2 \
                 ) c ON TRUE ORDER BY c.seq",
                &[&after, &limit],
            )
            .await
            .map_err(e)?;
        let mut changes = Changes::default();
        for row in &rows {
            changes.head = position(row.try_get(0).map_err(e)?)?;
            changes.trimmed_through = position(row.try_get(1).map_err(e)?)?;
            let Some(seq) = row.try_get::<_, Option<i64>>(2).map_err(e)? else { continue };
            let id: String = row.try_get(3).map_err(e)?;
            let version: i64 = row.try_get(4).map_err(e)?;
            let json: &str = row.try_get(6).map_err(|e| corrupt::<Sandbox>(&id, format!("unreadable change: {e}")))?;
            let sandbox = self.decoded.decode(&id, version, json)?;
            changes.entries.push(Logged { seq: position(seq)?, sandbox, removed: row.try_get(5).map_err(e)? });
        }
        Ok(changes)
    }

    async fn sandboxes_using(&self, provider: &str) -> Result<Vec<Sandbox>, StoreError> {
        self.read_all(
            "SELECT s.id, s.version, s.record FROM sandbox_providers p JOIN sandboxes s ON s.id = p.sandbox_id \
             WHERE p.provider = $1 ORDER BY s.name",
            &[&provider],
        )
        .await
    }

    async fn provider(&self, name: &str) -> Result<Option<Provider>, StoreError> {
        self.read_named(name).await
    }

    async fn list_providers(&self, request: &PageRequest) -> Result<Page<Provider>, StoreError> {
        self.page_named(request).await
    }

    async fn template(&self, name: &str) -> Result<Option<Template>, StoreError> {
        self.read_named(name).await
    }

    async fn list_templates(&self, request: &PageRequest) -> Result<Page<Template>, StoreError> {
        self.page_named(request).await
    }

    async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, StoreError> {
        self.read_named(name).await
    }

    async fn list_snapshots(&self, request: &PageRequest) -> Result<Page<Snapshot>, StoreError> {
        self.page_named(request).await
    }

    async fn volume(&self, name: &str) -> Result<Option<Volume>, StoreError> {
        self.read_named(name).await
    }

    async fn list_volumes(&self, request: &PageRequest) -> Result<Page<Volume>, StoreError> {
        self.page_named(request).await
    }

    async fn exec(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, StoreError> {
        let sql = "SELECT id, version, record FROM execs WHERE sandbox_id = $1 AND id = $2";
        Ok(self.read_all(sql, &[&sandbox.as_str(), &id.as_str()]).await?.into_iter().next())
    }

    async fn list_execs(&self, sandbox: &SandboxId, request: &PageRequest) -> Result<Page<Exec>, StoreError> {
        match &request.after {
            Some(after) => {
                let sql =
                    "SELECT id, version, record FROM execs WHERE sandbox_id = $1 AND id > $2 ORDER BY id LIMIT $3";
                self.read_page(sql, &[&sandbox.as_str(), after], request.limit).await
            }
            None => {
                let sql = "SELECT id, version, record FROM execs WHERE sandbox_id = $1 ORDER BY id LIMIT $2";
                self.read_page(sql, &[&sandbox.as_str()], request.limit).await
            }
        }
    }

    async fn open_execs(&self, sandbox: Option<&SandboxId>) -> Result<Vec<Exec>, StoreError> {
        match sandbox {
            Some(id) => {
                let sql = "SELECT id, version, record FROM execs WHERE open AND sandbox_id = $1 ORDER BY id";
                self.read_all(sql, &[&id.as_str()]).await
            }
            None => {
                self.read_all("SELECT id, version, record FROM execs WHERE open ORDER BY sandbox_id, id", &[]).await
            }
        }
    }

    async fn commit(&self, writes: &[Write]) -> Result<(), CommitError> {
        let lent = Lent(Some(self.client().await?));
        let outcome = self.run_commit(&lent, writes).await;
        lent.give_back();
        outcome
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let client = self.client().await?;
        // The database's clock decides, so gateways' clocks never need to agree. The outer
        // SELECT reads the row as it was before the statement: the holder who kept it.
        let statement = client
            .prepare_cached(
                "WITH taken AS ( \
                     INSERT INTO leases AS l (name, holder, term, expires_at) \
                     VALUES ($1, $2, 1, now() + $3::bigint * interval '1 millisecond') \
                     ON CONFLICT (name) DO UPDATE SET \
                         term = CASE WHEN l.holder = $2 THEN l.term ELSE l.term + 1 END, \
                         holder = $2, expires_at = EXCLUDED.expires_at \
                     WHERE l.holder IS NULL OR l.holder = $2 OR l.expires_at <= now() \
                     RETURNING holder, term) \
                 SELECT holder, term FROM taken \
                 UNION ALL \
                 SELECT holder, term FROM leases WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM taken)",
            )
            .await
            .map_err(|e| self.error(&e))?;
        let args: [&(dyn ToSql + Sync); 3] = [&RECONCILE_LEASE, &holder, &ttl_ms];
        // The outer SELECT's snapshot predates a first row another gateway inserted meanwhile:
        // then it finds nothing, and the next attempt sees that row.
        let mut row = None;
        for _ in 0..ATTEMPTS {
            row = client.query_opt(&statement, &args).await.map_err(|e| self.error(&e))?;
            if row.is_some() {
                break;
            }
        }
        let row = row
            .ok_or_else(|| StoreError::Unavailable(format!("postgres {}: the lease row stays unseen", self.target)))?;
        let holder: Option<String> = row.try_get(0).map_err(|e| self.error(&e))?;
        let term: i64 = row.try_get(1).map_err(|e| self.error(&e))?;
        let term =
            u64::try_from(term).map_err(|_| StoreError::Corrupt(format!("the lease has a negative term {term}")))?;
        // The clocks drift apart slowly; every renewal measures again.
        self.measure_clock(&client).await?;
        Ok(Lease { holder, term })
    }

    async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute("UPDATE leases SET holder = NULL WHERE name = $1 AND holder = $2", &[&RECONCILE_LEASE, &holder])
            .await
            .map_err(|e| self.error(&e))?;
        Ok(())
    }

    async fn acquire_node_lease(
        &self,
        node: &NodeId,
        holder: &str,
        offer: &NodeOffer,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        self.acquire_node(node, holder, offer, ttl).await
    }

    async fn release_node_lease(&self, node: &NodeId, holder: &str) -> Result<(), StoreError> {
        self.release_node(node, holder).await
    }

    async fn node(&self, id: &NodeId) -> Result<Option<Node>, StoreError> {
        Ok(self.read_nodes(Some(id)).await?.pop())
    }

    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        self.read_nodes(None).await
    }

    async fn node_loads(&self) -> Result<BTreeMap<NodeId, berth_core::placement::Capacity>, StoreError> {
        self.read_loads().await
    }

    async fn drain_node(&self, id: &NodeId, draining: bool) -> Result<bool, StoreError> {
        self.drain(id, draining).await
    }

    async fn delete_node(&self, id: &NodeId) -> Result<NodeRemoval, StoreError> {
        self.delete(id).await
    }
}
