//! The embedded store: one SQLite file in WAL mode, owned by one gateway process.
//!
//! Records are kept whole as JSON next to the columns the store queries by (id, name, version),
//! plus two index tables kept in step with every write: which sandboxes reference which
//! provider, and which labels each sandbox carries, so that `sandboxes_using` and label
//! selectors are indexed lookups and a selector page is always full.
//!
//! A transaction checks every condition against the state before it, exactly like
//! [`super::memory::MemoryStore`], then applies the writes as conditional statements, all inside
//! one `BEGIN IMMEDIATE` transaction: the write lock is held from the first check, so nothing can
//! change between checking and applying.
//!
//! **Group commit.** One writer thread owns the write connection. Commits that arrive while it
//! is busy wait for it, and it takes them all into one transaction: each in a savepoint of its
//! own, checked against the state the commits before it in the group left, rolled back alone if
//! a condition fails, and told its own outcome; then one COMMIT, one fsync (`synchronous=FULL`)
//! for the whole group. Nothing is acknowledged before that COMMIT returns, so a write is
//! durable when its caller hears of it, exactly as when each had a transaction of its own; a
//! group is simply the serial order of its commits, each applied or not.
//!
//! **Reads never wait for the writer.** They run on a few read-only connections of their own
//! (WAL lets readers go on beside the writer), each read a snapshot of the last COMMIT: a read
//! made after a commit was acknowledged sees it.
//!
//! rusqlite blocks, so reads run on tokio's blocking pool. A caller that drops a `commit` future
//! before it resolves does not cancel it: the write may still land, as it may on any remote
//! store after a timeout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::exec::{Exec, ExecId};
use berth_core::template::Template;
use berth_core::{NodeId, Provider, Sandbox, SandboxId, Snapshot, Timestamp, Volume, Write};
use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OpenFlags, Row, TransactionBehavior, params};
use tokio::sync::oneshot;

use super::codec::{self, Decoded, Record, corrupt};
use super::{
    CHANGES_KEPT, Changes, CommitError, Lease, Listing, Logged, Node, NodeOffer, NodeRemoval, Page, PageRequest, Store,
    StoreError,
};
use crate::clock::Clock;

mod nodes;
mod schema;
mod write;

use schema::{create_private, identify, migrate, restrict};
use write::{commit_group, sql_position, to_sql_position, trimmed_through};

/// The lease of the reconcile loop, the one row of `leases` Berth uses.
const RECONCILE_LEASE: &str = "reconcile";
/// Now, in milliseconds since the Unix epoch, by SQLite's clock (the host's): every statement
/// sees one value of it.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// How long a statement waits for another process's lock (a backup, an operator's `sqlite3`)
/// before the operation fails as unavailable.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Read connections: enough that a read rarely waits for another on the two cores a gateway
/// host is assumed to have, few enough that each keeps a warm page cache.
const READERS: usize = 4;
/// The most commits one group takes: a bound on how long the first waits for the last.
const MAX_GROUP: usize = 512;

/// The longest page of sandboxes read where it is asked for (see `read_here`): the API's
/// default page, a hundred records of a few kilobytes each, is a few hundred microseconds of
/// work, most of it decoding the records, which the reply's encoding would follow anyway.
const SHORT_PAGE: usize = 100;

/// The change log's newest position: the last seq handed out, even if trimmed since.
const HEAD: &str = "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'sandbox_changes'), 0)";

pub struct SqliteStore {
    readers: Arc<Readers>,
    writer: mpsc::Sender<Job>,
    identity: String,
}

struct Readers {
    conns: Vec<Mutex<Connection>>,
    next: AtomicUsize,
    decoded: Decoded,
}

/// What the writer thread is given to do.
enum Job {
    /// A commit, grouped with whatever others are waiting.
    Commit { writes: Vec<Write>, reply: oneshot::Sender<Result<(), CommitError>> },
    /// Work with a transaction of its own (the lease's).
    Alone(Box<dyn FnOnce(&mut Connection) + Send>),
}

impl SqliteStore {
    /// Opens the database at `path`, creating it if missing, and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::keeping_changes(path, CHANGES_KEPT)
    }

    /// [`SqliteStore::open`], keeping only the newest `keep` change log entries.
    pub fn keeping_changes(path: &Path, keep: u64) -> Result<Self, StoreError> {
        let keep = keep.max(1);
        let in_file = |e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{}: {m}", path.display())),
            StoreError::Corrupt(m) => StoreError::Corrupt(format!("{}: {m}", path.display())),
        };
        let mut conn = connect(path).map_err(in_file)?;
        let identity = identify(&mut conn).map_err(in_file)?;
        let conns = (0..READERS).map(|_| reader(path).map(Mutex::new)).collect::<Result<_, _>>().map_err(in_file)?;
        let (writer, jobs) = mpsc::channel();
        std::thread::Builder::new()
            .name("berth-sqlite-writer".into())
            .spawn(move || write_loop(conn, &jobs, keep))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the store's writer thread: {e}")))?;
        let readers = Readers { conns, next: AtomicUsize::new(0), decoded: Decoded::default() };
        Ok(Self { readers: Arc::new(readers), writer, identity })
    }

    /// Runs the read `f` on a read connection on tokio's blocking pool: a free one if any.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Decoded) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = Arc::clone(&self.readers);
        tokio::task::spawn_blocking(move || {
            let start = readers.next.fetch_add(1, Ordering::Relaxed);
            let n = readers.conns.len();
            let free = (0..n).find_map(|i| readers.conns[(start + i) % n].try_lock().ok());
            let conn = match free {
                Some(conn) => conn,
                None => readers.conns[start % n].lock().unwrap_or_else(PoisonError::into_inner),
            };
            f(&conn, &readers.decoded)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("store read did not complete: {e}")))?
    }

    /// Runs the read `f` where it is called when a read connection is free, else as `read` does.
    /// Only for reads whose work is small and bounded (one record, a short page in name order):
    /// from a warm page cache that is a few microseconds, less than handing it to the blocking
    /// pool and back costs, and every Get, every decision's read and most List calls are one.
    /// WAL readers never wait for the writer, and while the gateway holds the database open no
    /// other process can take the exclusive lock that would hold them up (an operator's `PRAGMA
    /// locking_mode=EXCLUSIVE` is refused as busy).
    async fn read_here<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Decoded) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        if let Some(conn) = self.readers.conns.iter().find_map(|c| c.try_lock().ok()) {
            return f(&conn, &self.readers.decoded);
        }
        self.read(f).await
    }

    /// The record `sql` selects by `key`.
    async fn record<T: Record + Send + 'static>(
        &self,
        sql: &'static str,
        key: String,
    ) -> Result<Option<T>, StoreError> {
        self.read_here(move |conn, decoded| read_one(conn, decoded, sql, &key)).await
    }

    /// Runs `f` on the writer thread, in a transaction of its own.
    async fn alone<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Alone(Box::new(move |conn| {
            let _ = reply.send(f(conn));
        }));
        self.writer.send(job).map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }
}

fn writer_gone() -> StoreError {
    StoreError::Unavailable("the store's writer thread has stopped".into())
}

/// The writer thread: takes every job waiting, commits the commits among them as one group,
/// then runs the others. It ends once the store is dropped and the last job done.
fn write_loop(mut conn: Connection, jobs: &mpsc::Receiver<Job>, keep: u64) {
    while let Ok(first) = jobs.recv() {
        let mut group = Vec::new();
        let mut alone = Vec::new();
        let mut next = Some(first);
        while let Some(job) = next {
            match job {
                Job::Commit { writes, reply } => group.push((writes, reply)),
                Job::Alone(f) => alone.push(f),
            }
            next = if group.len() < MAX_GROUP { jobs.try_recv().ok() } else { None };
        }
        if !group.is_empty() {
            let (writes, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
            let outcomes = match commit_group(&mut conn, &writes, keep) {
                Ok(outcomes) => outcomes,
                Err(e) => vec![Err(CommitError::Store(e)); writes.len()],
            };
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(outcome);
            }
        }
        for f in alone {
            f(&mut conn);
        }
    }
}

/// A read connection: it cannot write, and sees the last COMMIT at each read.
fn reader(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

fn connect(path: &Path) -> Result<Connection, StoreError> {
    create_private(path)?;
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL lets an operator's reader (a backup) run without blocking the gateway's writes.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable(format!("cannot use write-ahead logging (journal mode stays {mode:?})")));
    }
    // FULL, not NORMAL: in WAL mode NORMAL may lose the last commits on power loss. The
    // gateway runs a decision's effects (creating or deleting compute) only after its commit
    // returns, so a lost commit would leave an effect with no record of it.
    conn.pragma_update(None, "synchronous", "FULL")?;
    // The index tables cascade off `sandboxes`; the pragma is per connection and off by default.
    conn.pragma_update(None, "foreign_keys", true)?;
    migrate(&mut conn)?;
    // SQLite creates these with the database file's mode; tightened again in case an older
    // build or an operator left them more open than the database.
    for suffix in ["-wal", "-shm"] {
        let mut sidecar = path.as_os_str().to_owned();
        sidecar.push(suffix);
        restrict(&PathBuf::from(sidecar), false)?;
    }
    Ok(conn)
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::Error as E;
        match &e {
            E::SqliteFailure(f, _) if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                StoreError::Corrupt(e.to_string())
            }
            E::FromSqlConversionFailure(..)
            | E::IntegralValueOutOfRange(..)
            | E::Utf8Error(..)
            | E::InvalidColumnType(..) => StoreError::Corrupt(e.to_string()),
            // Busy, locked, I/O, full disk, and anything else SQLite refuses.
            _ => StoreError::Unavailable(e.to_string()),
        }
    }
}

/// Decodes a `(key, version, record)` row.
fn decode<T: Record>(decoded: &Decoded, row: &Row<'_>) -> Result<T, StoreError> {
    let key: String = row.get(0).map_err(|e| StoreError::Corrupt(format!("{}: unreadable key: {e}", T::TABLE)))?;
    let version: i64 = row.get(1).map_err(|e| corrupt::<T>(&key, format!("unreadable version: {e}")))?;
    let json = row
        .get_ref(2)
        .and_then(|v| Ok(v.as_str()?))
        .map_err(|e| corrupt::<T>(&key, format!("unreadable record: {e}")))?;
    decoded.decode(&key, version, json)
}

/// One record at most, from a query selecting `(key, version, record)`.
fn read_one<T: Record>(conn: &Connection, decoded: &Decoded, sql: &str, key: &str) -> Result<Option<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query([key])?;
    rows.next()?.map(|row| decode(decoded, row)).transpose()
}

/// Every record a query selecting `(key, version, record)` returns.
fn read_all<T: Record>(
    conn: &Connection,
    decoded: &Decoded,
    sql: &str,
    args: Vec<Value>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(decoded, row)?);
    }
    Ok(out)
}

/// A page from a query selecting `(key, version, record)` ordered by name, whose last parameter
/// is the row limit.
fn read_page<T: Record>(
    conn: &Connection,
    decoded: &Decoded,
    sql: &str,
    mut args: Vec<Value>,
    limit: usize,
) -> Result<Page<T>, StoreError> {
    args.push(Value::Integer(codec::row_limit(limit)));
    Ok(codec::page(read_all(conn, decoded, sql, args)?, limit))
}

fn acquire_lease(conn: &mut Connection, holder: &str, ttl: Duration) -> Result<Lease, StoreError> {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // In the update, bare column names are the row as it was.
    tx.execute(
        &format!(
            "INSERT INTO leases (name, holder, term, expires_at) VALUES (?1, ?2, 1, {NOW_MS} + ?3) \
             ON CONFLICT (name) DO UPDATE SET \
                 term = CASE WHEN holder IS ?2 THEN term ELSE term + 1 END, \
                 holder = ?2, expires_at = excluded.expires_at \
             WHERE holder IS NULL OR holder = ?2 OR expires_at <= {NOW_MS}"
        ),
        params![RECONCILE_LEASE, holder, ttl_ms],
    )?;
    let (holder, term): (Option<String>, i64) =
        tx.query_row("SELECT holder, term FROM leases WHERE name = ?1", params![RECONCILE_LEASE], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    let term = u64::try_from(term).map_err(|_| StoreError::Corrupt(format!("the lease has a negative term {term}")))?;
    let lease = Lease { holder, term };
    tx.commit()?;
    Ok(lease)
}

/// The change log after `after`, read in one snapshot.
fn changes(conn: &Connection, decoded: &Decoded, after: u64, limit: usize) -> Result<Changes, StoreError> {
    let tx = conn.unchecked_transaction()?;
    let head = sql_position(tx.query_row(HEAD, [], |row| row.get(0))?)?;
    let trimmed_through = trimmed_through(&tx)?;
    let mut stmt = tx.prepare_cached(
        "SELECT seq, sandbox_id, version, removed, record FROM sandbox_changes WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let mut rows = stmt.query(params![to_sql_position(after)?, i64::try_from(limit).unwrap_or(i64::MAX)])?;
    let mut entries = Vec::new();
    while let Some(row) = rows.next()? {
        let seq = sql_position(row.get(0)?)?;
        let id: String = row.get(1)?;
        let version: i64 = row.get(2)?;
        let json = row.get_ref(4)?.as_str().map_err(|e| corrupt::<Sandbox>(&id, format!("unreadable change: {e}")))?;
        let sandbox = decoded.decode(&id, version, json)?;
        entries.push(Logged { seq, sandbox, removed: row.get(3)? });
    }
    drop(rows);
    drop(stmt);
    tx.commit()?;
    Ok(Changes { entries, trimmed_through, head })
}

fn read_named<T: Record>(conn: &Connection, decoded: &Decoded, name: &str) -> Result<Option<T>, StoreError> {
    read_one(conn, decoded, &format!("SELECT name, version, record FROM {} WHERE name = ?1", T::TABLE), name)
}

fn page_named<T: Record>(conn: &Connection, decoded: &Decoded, request: &PageRequest) -> Result<Page<T>, StoreError> {
    match &request.after {
        Some(after) => read_page(
            conn,
            decoded,
            &format!("SELECT name, version, record FROM {} WHERE name > ? ORDER BY name LIMIT ?", T::TABLE),
            vec![Value::Text(after.clone())],
            request.limit,
        ),
        None => read_page(
            conn,
            decoded,
            &format!("SELECT name, version, record FROM {} ORDER BY name LIMIT ?", T::TABLE),
            Vec::new(),
            request.limit,
        ),
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn identity(&self) -> &str {
        &self.identity
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }

    /// The host's clock, which SQLite's `now` reads too.
    fn now(&self) -> Timestamp {
        crate::clock::SystemClock.now()
    }

    async fn sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        self.record("SELECT id, version, record FROM sandboxes WHERE id = ?1", id.to_string()).await
    }

    async fn sandbox_by_name(&self, name: &str) -> Result<Option<Sandbox>, StoreError> {
        self.record("SELECT id, version, record FROM sandboxes WHERE name = ?1", name.to_owned()).await
    }

    async fn list_sandboxes_at(
        &self,
        request: &PageRequest,
        selector: &BTreeMap<String, String>,
    ) -> Result<Listing, StoreError> {
        let mut sql = String::from("SELECT s.id, s.version, s.record FROM sandboxes s WHERE 1");
        let mut args = Vec::new();
        if let Some(after) = &request.after {
            sql.push_str(" AND s.name > ?");
            args.push(Value::Text(after.clone()));
        }
        // Filtered here rather than after reading, so that a page holds `limit` matches.
        for (key, value) in selector {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM sandbox_labels l WHERE l.sandbox_id = s.id AND l.key = ? AND l.value = ?)",
            );
            args.push(Value::Text(key.clone()));
            args.push(Value::Text(value.clone()));
        }
        sql.push_str(" ORDER BY s.name LIMIT ?");
        let limit = request.limit;
        let listing = move |conn: &Connection, decoded: &Decoded| {
            // One snapshot for both: the position then the page.
            let tx = conn.unchecked_transaction()?;
            let cursor = sql_position(tx.query_row(HEAD, [], |row| row.get(0))?)?;
            let page = read_page(&tx, decoded, &sql, args, limit)?;
            tx.commit()?;
            Ok(Listing { page, cursor })
        };
        // A selector may scan the whole table for a page's matches; a short page in name order
        // reads its records and stops.
        if selector.is_empty() && limit <= SHORT_PAGE {
            self.read_here(listing).await
        } else {
            self.read(listing).await
        }
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError> {
        self.read(move |conn, decoded| changes(conn, decoded, after, limit)).await
    }

    async fn sandboxes_using(&self, provider: &str) -> Result<Vec<Sandbox>, StoreError> {
        let provider = provider.to_owned();
        self.read(move |conn, decoded| {
            read_all(
                conn,
                decoded,
                "SELECT s.id, s.version, s.record FROM sandbox_providers p JOIN sandboxes s ON s.id = p.sandbox_id \
                 WHERE p.provider = ?1 ORDER BY s.name",
                vec![Value::Text(provider)],
            )
        })
        .await
    }

    async fn provider(&self, name: &str) -> Result<Option<Provider>, StoreError> {
        let name = name.to_owned();
        self.read(move |conn, decoded| read_named(conn, decoded, &name)).await
    }

    async fn list_providers(&self, request: &PageRequest) -> Result<Page<Provider>, StoreError> {
        let request = request.clone();
        self.read(move |conn, decoded| page_named(conn, decoded, &request)).await
    }

    async fn template(&self, name: &str) -> Result<Option<Template>, StoreError> {
        let name = name.to_owned();
        self.read(move |conn, decoded| read_named(conn, decoded, &name)).await
    }

    async fn list_templates(&self, request: &PageRequest) -> Result<Page<Template>, StoreError> {
        let request = request.clone();
        self.read(move |conn, decoded| page_named(conn, decoded, &request)).await
    }

    async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, StoreError> {
        let name = name.to_owned();
        self.read(move |conn, decoded| read_named(conn, decoded, &name)).await
    }

    async fn list_snapshots(&self, request: &PageRequest) -> Result<Page<Snapshot>, StoreError> {
        let request = request.clone();
        self.read(move |conn, decoded| page_named(conn, decoded, &request)).await
    }

    async fn volume(&self, name: &str) -> Result<Option<Volume>, StoreError> {
        let name = name.to_owned();
        self.read(move |conn, decoded| read_named(conn, decoded, &name)).await
    }

    async fn list_volumes(&self, request: &PageRequest) -> Result<Page<Volume>, StoreError> {
        let request = request.clone();
        self.read(move |conn, decoded| page_named(conn, decoded, &request)).await
    }

    async fn exec(&self, sandbox: &SandboxId, id: &ExecId) -> Result<Option<Exec>, StoreError> {
        let args = vec![Value::Text(sandbox.to_string()), Value::Text(id.to_string())];
        let found = self
            .read(move |conn, decoded| {
                let sql = "SELECT id, version, record FROM execs WHERE sandbox_id = ?1 AND id = ?2";
                read_all(conn, decoded, sql, args)
            })
            .await?;
        Ok(found.into_iter().next())
    }

    async fn list_execs(&self, sandbox: &SandboxId, request: &PageRequest) -> Result<Page<Exec>, StoreError> {
        let mut args = vec![Value::Text(sandbox.to_string())];
        let mut sql = String::from("SELECT id, version, record FROM execs WHERE sandbox_id = ?");
        if let Some(after) = &request.after {
            sql.push_str(" AND id > ?");
            args.push(Value::Text(after.clone()));
        }
        sql.push_str(" ORDER BY id LIMIT ?");
        let limit = request.limit;
        self.read(move |conn, decoded| read_page(conn, decoded, &sql, args, limit)).await
    }

    async fn open_execs(&self, sandbox: Option<&SandboxId>) -> Result<Vec<Exec>, StoreError> {
        let sandbox = sandbox.map(|s| s.to_string());
        self.read(move |conn, decoded| match sandbox {
            Some(id) => read_all(
                conn,
                decoded,
                "SELECT id, version, record FROM execs WHERE open = 1 AND sandbox_id = ?1 ORDER BY id",
                vec![Value::Text(id)],
            ),
            None => read_all(
                conn,
                decoded,
                "SELECT id, version, record FROM execs WHERE open = 1 ORDER BY sandbox_id, id",
                Vec::new(),
            ),
        })
        .await
    }

    async fn commit(&self, writes: &[Write]) -> Result<(), CommitError> {
        let (reply, outcome) = oneshot::channel();
        self.writer.send(Job::Commit { writes: writes.to_vec(), reply }).map_err(|_| writer_gone())?;
        outcome.await.map_err(|_| writer_gone())?
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> Result<Lease, StoreError> {
        let holder = holder.to_string();
        self.alone(move |conn| acquire_lease(conn, &holder, ttl)).await
    }

    async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        let holder = holder.to_string();
        self.alone(move |conn| {
            conn.execute(
                "UPDATE leases SET holder = NULL WHERE name = ?1 AND holder = ?2",
                params![RECONCILE_LEASE, holder],
            )?;
            Ok(())
        })
        .await
    }

    async fn acquire_node_lease(
        &self,
        node: &NodeId,
        holder: &str,
        offer: &NodeOffer,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let (node, holder, offer) = (node.clone(), holder.to_string(), offer.clone());
        self.alone(move |conn| nodes::acquire(conn, &node, &holder, &offer, ttl)).await
    }

    async fn release_node_lease(&self, node: &NodeId, holder: &str) -> Result<(), StoreError> {
        let (node, holder) = (node.clone(), holder.to_string());
        self.alone(move |conn| nodes::release(conn, &node, &holder)).await
    }

    async fn node(&self, id: &NodeId) -> Result<Option<Node>, StoreError> {
        let id = id.clone();
        self.read(move |conn, _| nodes::one(conn, &id)).await
    }

    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        self.read(|conn, _| nodes::all(conn)).await
    }

    async fn node_loads(&self) -> Result<BTreeMap<NodeId, berth_core::placement::Capacity>, StoreError> {
        self.read(|conn, _| nodes::loads(conn)).await
    }

    async fn drain_node(&self, id: &NodeId, draining: bool) -> Result<bool, StoreError> {
        let id = id.clone();
        self.alone(move |conn| nodes::drain(conn, &id, draining)).await
    }

    async fn delete_node(&self, id: &NodeId) -> Result<NodeRemoval, StoreError> {
        let id = id.clone();
        self.alone(move |conn| nodes::delete(conn, &id)).await
    }
}
